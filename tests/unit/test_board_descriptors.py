"""What board code reads from a .bin: input/output descriptors in the board's terms, and output
Dequantize removal (hb_model_modifier -r and YAML remove_node_type) keeping names and scales."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from bin_fixtures import build_bin, invoke
from builders import BOX_CONV, held_out, make_project, rdk_yolo_head, yolo_like

from hbtools.cli import hb_mapper, hb_model_info, hb_model_modifier, hb_verifier, hrt_model_exec
from hbtools.errors import HbError
from hbtools.march.profiles import get_profile
from hbtools.runtime import HB_ONNXRuntime
from hbtools.runtime.binfile import read_bin
from hbtools.runtime.rt_input import random_rt_input
from hbtools.runtime.runtime_model import open_model
from hbtools.runtime.simulator import Simulator
from hbtools.tools import perf_model

PASSED = "Quanti onnx and Sim result Strict check PASSED"


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _model_info(path) -> str:
    result = invoke(hrt_model_exec.main, ["model_info", f"--model_file={path}"])
    assert result.exit_code == 0, result.output
    return result.output


def _block(text: str, side: str, k: int) -> dict[str, str]:
    """``key: value`` lines of ``input[k]``/``output[k]`` in a model_info listing."""
    part = text.split(f"{side}[{k}]: \n", 1)[1].split("\n\n", 1)[0]
    return dict(line.split(": ", 1) for line in part.splitlines())


# ---------------------------------------------------------------- Dequantize removal, both routes


@pytest.fixture(scope="module")
def yolo(tmp_path_factory):
    root = tmp_path_factory.mktemp("yolo")
    plain = build_bin(root / "plain", yolo_like(), prefix="yolo", input_parameters={"input_type_rt": "nv12"})
    yaml_route = build_bin(root / "yaml", yolo_like(), prefix="yolo", input_parameters={"input_type_rt": "nv12"},
                           model_parameters={"remove_node_type": "Dequantize"})
    return plain, yaml_route


def test_both_dequantize_removal_routes_describe_the_same_bin(yolo, in_tmp) -> None:
    plain, yaml_route = yolo
    deq = [n.name for n in read_bin(plain.bin).model().load_graph().graph.node if n.op_type == "HzDequantize"]
    assert len(deq) == 2
    args = [plain.bin]
    for name in deq:
        args += ["-r", name]
    result = invoke(hb_model_modifier.main, [*args, "-o", "cli.bin"])
    assert result.exit_code == 0, result.output
    cli, by_yaml = read_bin("cli.bin").model(), read_bin(yaml_route.bin).model()
    assert cli.outputs == by_yaml.outputs and cli.deleted_nodes == by_yaml.deleted_nodes
    assert [o["name"] for o in cli.outputs] == ["output0", "output1"]  # not output0_quantized / ..._int32
    assert [r["name"] for r in cli.deleted_nodes] == deq
    box, score = cli.outputs
    assert box["dtype"] == "int32" and len(box["scale"]) == 4 and box["quantize_axis"] == 1
    assert score["dtype"] in ("int8", "int16") and len(score["scale"]) == 1 and score["quantize_axis"] == 0
    assert all(r["scale"] and "quantize_axis" in r for r in cli.deleted_nodes)

    listing = _model_info("cli.bin")
    assert listing == _model_info(yaml_route.bin)
    out0 = _block(listing, "output", 0)
    assert out0["name"] == "output0" and out0["tensor type"] == "HB_DNN_TENSOR_TYPE_S32"
    assert out0["quanti type"] == "SCALE" and out0["quantizeAxis"] == "1"
    assert [float(v) for v in out0["scale data"].rstrip(",").split(",")] == pytest.approx(box["scale"], rel=1e-5)
    assert _block(listing, "output", 1)["quantizeAxis"] == "0"
    assert "scale data" not in _model_info(plain.bin)

    info = invoke(hb_model_info.main, ["cli.bin"]).output
    assert re.search(r"output\[0\] output0: S32\nscale data: [0-9.e,-]+\nquantizeAxis: 1\n", info), info
    assert "\n".join(f"deleted nodes: {n}" for n in deq) in info
    assert info.split("hb_model_info version")[1].count("quantizeAxis") == 2
    yaml_info = invoke(hb_model_info.main, [yaml_route.bin]).output
    types = "--------- input/output types"
    assert info[info.index(types):] == yaml_info[yaml_info.index(types):]


def test_integer_output_times_scale_is_the_unmodified_output(yolo, in_tmp) -> None:
    plain, yaml_route = yolo
    before, after = open_model(plain.bin), open_model(yaml_route.bin)
    feeds = {d.name: random_rt_input(d, np.random.default_rng(3)) for d in before.inputs}
    expected, got = Simulator(before).run(feeds), Simulator(after).run(feeds)
    for out in after.outputs:
        scale = np.asarray(out.scale).reshape([-1, 1, 1] if len(out.scale) > 1 else [])
        np.testing.assert_allclose(got[out.name] * scale, expected[out.name], rtol=1e-6, atol=1e-12)
    verified = invoke(hb_verifier.main, ["-m", f"{yaml_route.quantized},{yaml_route.bin}", "-s", "True"])
    assert PASSED in verified.output, verified.output


# ---------------------------------------------------------------- NHWC detector heads (D-Robotics' rdk_model_zoo)


@pytest.fixture(scope="module")
def rdk_head(tmp_path_factory):
    return build_bin(tmp_path_factory.mktemp("rdk_head"), rdk_yolo_head(), prefix="head",
                     input_parameters={"input_type_rt": "nv12"})


def _removed(bin_path, node: str, out: str) -> str:
    """``hb_model_modifier BIN -r NODE``, then hb_model_info on the result: the line deleted_nodes_info.txt has."""
    result = invoke(hb_model_modifier.main, [bin_path, "-r", node, "-o", out])
    assert result.exit_code == 0, result.output
    assert invoke(hb_model_info.main, [out]).exit_code == 0
    (line,) = open("deleted_nodes_info.txt").read().splitlines()
    return line


def test_rdk_zoo_command_leaves_the_box_convs_int32_accumulators(rdk_head, in_tmp) -> None:
    """The rdk_model_zoo removes the box outputs' Dequantize by the vendor's name, the box conv's tensor + _HzDequantize
    (the vendor folds the output permute into the conv): board code then reads the conv's int32 accumulators in
    NHWC, one scale per channel on axis 3, and the integers times those scales are the unmodified output."""
    line = _removed(rdk_head.bin, f"{BOX_CONV}_output_0_HzDequantize", "box.bin")
    box = _block(_model_info("box.bin"), "output", 0)
    assert (box["tensor type"], box["tensor layout"], box["valid shape"]) == \
        ("HB_DNN_TENSOR_TYPE_S32", "HB_DNN_LAYOUT_NHWC", "(1,8,8,16,)")
    assert box["quanti type"] == "SCALE" and box["quantizeAxis"] == "3"
    assert len(box["scale data"].rstrip(",").split(",")) == 16
    assert " axis=3 " in line
    before, after = open_model(rdk_head.bin), open_model("box.bin")
    feeds = {d.name: random_rt_input(d, np.random.default_rng(3)) for d in before.inputs}
    expected, got = Simulator(before).run(feeds), Simulator(after).run(feeds)
    name = after.outputs[0].name
    assert got[name].dtype == np.int32
    np.testing.assert_allclose(got[name] * np.asarray(after.outputs[0].scale), expected[name], rtol=1e-6, atol=1e-12)
    verified = invoke(hb_verifier.main, ["-m", f"{rdk_head.quantized},box.bin", "-s", "True"])
    assert PASSED in verified.output, verified.output


def test_the_outputs_name_reaches_the_box_dequantize_too(rdk_head, tmp_path, in_tmp) -> None:
    """``<model output>_HzDequantize`` (the box Dequantize's name in earlier hbtools, and the form the vendor's
    YOLO-seg list uses for outputs it does not fold) removes the same node, from the command line and from the
    YAML: the output is the conv's int32 accumulators."""
    result = invoke(hb_model_modifier.main, [rdk_head.bin, "-r", "Transpose_0_out_HzDequantize", "-o", "alias.bin"])
    assert result.exit_code == 0, result.output
    by_yaml = build_bin(tmp_path / "yaml", rdk_yolo_head(), prefix="head", input_parameters={"input_type_rt": "nv12"},
                        model_parameters={"remove_node_name": "Transpose_0_out_HzDequantize"})
    for path in ("alias.bin", by_yaml.bin):
        model = read_bin(path).model()
        assert [r["name"] for r in model.deleted_nodes] == [f"{BOX_CONV}_output_0_HzDequantize"]
        assert model.outputs[0]["name"] == "Transpose_0_out" and model.outputs[0]["dtype"] == "int32"


def test_a_single_scale_output_is_described_with_one_axis(rdk_head, in_tmp) -> None:
    """The class output (a Sigmoid's, one scale) after removing its Dequantize: deleted_nodes_info.txt gives the
    axis hrt_model_exec model_info does, not the Dequantize node's unused attribute."""
    line = _removed(rdk_head.bin, "Transpose_1_out_HzDequantize", "cls.bin")
    cls = _block(_model_info("cls.bin"), "output", 1)
    assert cls["tensor type"] in ("HB_DNN_TENSOR_TYPE_S8", "HB_DNN_TENSOR_TYPE_S16") and cls["quantizeAxis"] == "0"
    assert " axis=0 " in line


def test_permuted_box_output_is_not_requantized(rdk_head) -> None:
    """The box conv's output is dequantized from its accumulators, not from 256 int8 levels (calibration max),
    and the calibrated model computes exactly what the quantized one does."""
    samples = held_out(rdk_yolo_head(), count=3)
    calibrated, quantized = (HB_ONNXRuntime(model_file=str(p)) for p in
                             (rdk_head.quantized.with_name("head_calibrated_model.onnx"), rdk_head.quantized))
    for x in samples:
        # the quantized model takes the picture as an nv12 model does, in NHWC
        c, q = calibrated.run(None, {"data": x})[0], quantized.run(None, {"data": x.transpose(0, 2, 3, 1)})[0]
        assert len(np.unique(q)) > 256
        np.testing.assert_allclose(c, q, rtol=1e-6, atol=1e-9)


# ---------------------------------------------------------------- descriptors per input_type_rt

GRAY = {"input_type_rt": "gray", "input_type_train": "gray", "mean_value": "128", "scale_value": "0.0078125"}


@pytest.mark.parametrize(("type_rt", "extra", "shape", "layout", "size", "stride", "tensor"), [
    ("nv12", {}, "(1,3,16,16,)", "NCHW", 384, "(0,0,0,0,)", "HB_DNN_IMG_TYPE_NV12"),
    ("rgb", {"input_layout_rt": "NHWC"}, "(1,16,16,3,)", "NHWC", 768, "(768,48,3,1,)", "HB_DNN_IMG_TYPE_RGB"),
    ("bgr", {"input_layout_rt": "NCHW"}, "(1,3,16,16,)", "NCHW", 768, "(768,256,16,1,)", "HB_DNN_IMG_TYPE_BGR"),
    ("yuv444", {"input_layout_rt": "NHWC"}, "(1,16,16,3,)", "NHWC", 768, "(768,48,3,1,)",
     "HB_DNN_IMG_TYPE_YUV444"),
    ("gray", {**GRAY, "input_layout_rt": "NCHW"}, "(1,1,16,16,)", "NCHW", 256, "(256,256,16,1,)",
     "HB_DNN_IMG_TYPE_Y"),
])
def test_image_inputs_in_board_terms(tmp_path, type_rt, extra, shape, layout, size, stride, tensor) -> None:
    fm = yolo_like(channels=1 if type_rt == "gray" else 3)
    built = build_bin(tmp_path / type_rt, fm, prefix="m", input_parameters={"input_type_rt": type_rt, **extra})
    block = _block(_model_info(built.bin), "input", 0)
    assert (block["valid shape"], block["aligned shape"], block["tensor layout"], block["aligned byte size"],
            block["stride"], block["tensor type"], block["quanti type"]) == \
        (shape, shape, f"HB_DNN_LAYOUT_{layout}", str(size), stride, tensor, "NONE")
    # the runtime takes exactly that many bytes
    model = open_model(built.bin)
    assert random_rt_input(model.inputs[0], np.random.default_rng(0)).nbytes == size


def test_featuremap_inputs_in_board_terms(tmp_path, in_tmp) -> None:
    built = build_bin(tmp_path / "mlp", "featuremap_mlp", prefix="mlp")
    block = _block(_model_info(built.bin), "input", 0)
    assert (block["valid shape"], block["tensor layout"], block["aligned byte size"], block["stride"],
            block["tensor type"], block["quanti type"]) == \
        ("(1,5,12,)", "HB_DNN_LAYOUT_NONE", str(5 * 12 * 4), "(240,48,4,)", "HB_DNN_TENSOR_TYPE_F32", "NONE")
    assert "scale data" not in block
    result = invoke(hb_model_modifier.main, [built.bin, "-a", "Quantize"])
    assert result.exit_code == 0, result.output
    block = _block(_model_info(str(Path(built.bin).with_name("mlp_modified.bin"))), "input", 0)  # beside the model
    assert block["name"] == "feat"  # the input keeps its name
    # int16: 60 values (a tensor of at most 64 is int16 on bayes-e)
    assert (block["tensor type"], block["aligned byte size"], block["stride"], block["quanti type"],
            block["quantizeAxis"]) == ("HB_DNN_TENSOR_TYPE_S16", "120", "(120,24,2,)", "SCALE", "0")
    assert float(block["scale data"].rstrip(",")) > 0


# ---------------------------------------------------------------- input_batch


def test_input_batch_4_runs_four_pictures_like_four_single_runs(tmp_path, in_tmp) -> None:
    single = build_bin(tmp_path / "b1", yolo_like(), prefix="m", input_parameters={"input_type_rt": "nv12"})
    batched = build_bin(tmp_path / "b4", yolo_like(), prefix="m",
                        input_parameters={"input_type_rt": "nv12", "input_batch": 4})
    block = _block(_model_info(batched.bin), "input", 0)
    assert (block["valid shape"], block["aligned byte size"]) == ("(4,3,16,16,)", str(4 * 384))
    assert _block(_model_info(batched.bin), "output", 0)["valid shape"] == "(4,4,8,8,)"
    one, four = open_model(single.bin), open_model(batched.bin)
    assert four.batch == 4 and four.inputs[0].shape[0] == 4
    pictures = np.random.default_rng(9).integers(0, 256, (4, 24, 16), dtype=np.uint8)
    together = Simulator(four).run({"data": pictures})
    sim = Simulator(one)
    for name, value in together.items():
        alone = np.concatenate([sim.run({"data": pictures[i:i + 1]})[name] for i in range(4)])
        np.testing.assert_array_equal(value, alone)
    with pytest.raises(HbError, match=r"takes 1536 values"):
        Simulator(four).run({"data": pictures[:1]})
    verified = invoke(hb_verifier.main, ["-m", f"{batched.quantized},{batched.bin}", "-s", "True"])
    assert PASSED in verified.output, verified.output
    perf_one, perf_four = (perf_model.estimate(m, get_profile("bayes-e")) for m in (one, four))
    assert perf_four.subgraphs[0].ops == pytest.approx(4 * perf_one.subgraphs[0].ops)
    assert perf_one.latency_ms < perf_four.latency_ms < 4 * perf_one.latency_ms + 1e-9


def test_one_frame_for_a_batch_4_model_is_said_to_be_one_of_four(tmp_path, in_tmp) -> None:
    """hrt_model_exec --input_file and hb_verifier -i with one nv12 frame for an input_batch 4 model said only
    'holds 384 uint8 values; ... takes 1536'."""
    batched = build_bin(tmp_path / "b4", yolo_like(), prefix="m",
                        input_parameters={"input_type_rt": "nv12", "input_batch": 4})
    np.zeros((1, 24, 16), np.uint8).tofile("nv1.bin")
    said = r"holds 384 uint8 values.*takes 1536 .*the model takes 4 frames at once \(input_batch 4\), so the " \
           r"file must hold all 4, one after another \(or give a picture, used for every frame\)"
    for tool, args in ((hrt_model_exec.main, ["infer", f"--model_file={batched.bin}", "--input_file=nv1.bin"]),
                       (hb_verifier.main, ["-m", f"{batched.quantized},{batched.bin}", "-i", "nv1.bin"])):
        result = invoke(tool, args)
        assert result.exit_code == 1, result.output
        [error] = [line for line in result.output.splitlines() if " ERROR " in line and "exception in" not in line]
        assert re.search(said, error), error


def test_one_frame_array_for_a_batch_4_model_is_told_how_to_give_four(tmp_path, in_tmp) -> None:
    """A .npy (or an array given to the simulator) holding one frame of the right shape for an input_batch 4
    model got the plain shape error; a picture is used for every frame, now said in an INFO line."""
    from skimage import data as pictures
    from skimage.io import imsave

    batched = build_bin(tmp_path / "b4", yolo_like(), prefix="m",
                        input_parameters={"input_type_rt": "rgb", "input_batch": 4})
    frame = np.random.default_rng(3).integers(0, 256, (1, 3, 16, 16), dtype=np.uint8)
    np.save("one.npy", frame)
    np.save("bare.npy", frame[0])
    np.save("nhwc.npy", frame.transpose(0, 2, 3, 1))
    frames = r"the model takes 4 frames at once \(input_batch 4\): give an array of shape \(4, 3, 16, 16\) with " \
             r"the 4 frames along the first axis \("
    for name, how in (("one", r"numpy.concatenate of 4 arrays like this one, or numpy.repeat\(a, 4, axis=0\)"),
                      ("bare", r"numpy.stack of 4 such frames, or numpy.repeat\(a\[None\], 4, axis=0\)"),
                      ("nhwc", r"numpy.concatenate")):
        result = invoke(hrt_model_exec.main, ["infer", f"--model_file={batched.bin}", f"--input_file={name}.npy"])
        assert result.exit_code == 1, result.output
        [error] = [line for line in result.output.splitlines() if " ERROR " in line and "exception in" not in line]
        said = f"holds an array of shape .*takes shape \\(4, 3, 16, 16\\) NCHW.*; {frames}{how}"
        assert re.search(said, error), error
        assert ("transpose it to NCHW" in error) == (name == "nhwc"), error
    with pytest.raises(HbError, match=f"takes 3072 values .*got 768 .*; {frames}numpy.concatenate"):
        Simulator(open_model(batched.bin)).run({"data": frame})
    imsave("pic.jpg", pictures.astronaut()[:64, :64])
    result = invoke(hrt_model_exec.main, ["infer", f"--model_file={batched.bin}", "--input_file=pic.jpg"])
    assert result.exit_code == 0, result.output
    assert "input 'data' takes 4 frames at once (input_batch 4): picture pic.jpg is used for every frame; for " \
           "different frames give a .npy of shape (4, 3, 16, 16)" in result.output, result.output


def test_separate_batch_is_refused_with_the_reason(tmp_path) -> None:
    from hbtools.config.loader import load_config

    project = make_project(tmp_path, yolo_like())
    project.write(input_parameters={"input_batch": 2, "separate_batch": True})
    with pytest.raises(HbError, match="separate_batch: True .*one model input per batch item.*not supported"):
        load_config(project.config_path)
    project.write(input_parameters={"separate_batch": False})
    assert load_config(project.config_path).input_batch == 2


def test_a_per_channel_scale_along_the_last_axis_is_counted_from_the_front() -> None:
    """A Gemm's [N, C] output dequantized per channel carries axis -1; the board listing showed
    quantizeAxis: -1, which board code indexing the shape reads out of bounds."""
    from hbtools.tools.modifier import descriptor_scale

    scale = [0.5, 0.25, 0.125, 1.0, 2.0]
    assert descriptor_scale({"scale": scale, "quantize_axis": -1, "shape": [1, 5]}) == (tuple(scale), 1)
    assert descriptor_scale({"scale": scale, "quantize_axis": 1, "shape": [1, 5, 4, 4]}) == (tuple(scale), 1)
    assert descriptor_scale({"scale": [0.5], "quantize_axis": 0, "shape": [1, 5]}) == ((0.5,), 0)


def test_removing_an_output_reshape_moves_the_scale_axis_back(tmp_path) -> None:
    """A conv's int32 output permuted to NHWC and flattened ([1, 4, 4, 9] -> [1, 16, 9]): removing the Dequantize
    and then the Reshape (remove_node_type 'Dequantize;Reshape') left the scales on axis 2 of the [1, 4, 4, 9]
    output, where the channels are on axis 3: dequantized as described, errors of half the output's range (hunt 22
    D2). The axis follows the channels back through the Reshape, as through a Transpose."""
    from builders import _Graph

    g = _Graph(9)
    moved = g.op("Transpose", [g.conv("data", 3, 9, k=1)], perm=[0, 2, 3, 1])
    out = g.op("Reshape", [moved, g.const(np.array([1, 16, 9], np.int64), "rows")])
    fm = g.model({"data": [1, 3, 4, 4]}, [out], featuremap={"data"})
    built = build_bin(tmp_path / "p", fm, prefix="rows", calibration_parameters={"calibration_type": "max"},
                      model_parameters={"remove_node_type": "Dequantize;Reshape"})
    [desc] = read_bin(built.bin).model().outputs
    assert desc["shape"] == [1, 4, 4, 9] and len(desc["scale"]) == 9 and desc["quantize_axis"] == 3, desc


def test_a_linear_heads_dequantize_is_named_after_its_own_output(tmp_path) -> None:
    """A Linear over tokens (MatMul + bias Add) permuted at the output: onnxruntime makes it a Gemm between two
    Reshapes, and the Dequantize was named after the Gemm's helper tensor (gemm_output_reshape_arg_token_4), which
    a user's -r cannot know (hunt 22 D3). It is named after the Linear's own output, the Add's tensor."""
    from builders import _Graph

    g = _Graph(10)
    tokens = g.op("Transpose", [g.op("Reshape", [g.op("Relu", [g.conv("data", 3, 8)]),
                                                 g.const(np.array([1, 8, 16], np.int64), "tok")])], perm=[0, 2, 1])
    linear = g.op("Add", [g.op("MatMul", [tokens, g.const(g.rng.standard_normal((8, 6)).astype(np.float32), "w")]),
                          g.const(g.rng.standard_normal(6).astype(np.float32), "b")])
    fm = g.model({"data": [1, 3, 4, 4]}, [g.op("Transpose", [linear], perm=[0, 2, 1])], featuremap={"data"})
    built = build_bin(tmp_path / "p", fm, prefix="lin", calibration_parameters={"calibration_type": "max"})
    result = invoke(hb_model_modifier.main, [built.bin, "-r", f"{linear}_HzDequantize", "-o", str(tmp_path / "o.bin")])
    assert result.exit_code == 0, result.output
    [desc] = read_bin(str(tmp_path / "o.bin")).model().outputs
    assert desc["dtype"] == "int32" and len(desc["scale"]) == 6, desc


def test_a_dequantize_named_twice_is_said_to_be_deleted_already(rdk_head, in_tmp) -> None:
    """The box Dequantize by the vendor's name and again by its output's alias: the second said 'not in the
    model', as if the name were wrong (hunt 22 D5)."""
    result = invoke(hb_model_modifier.main, [rdk_head.bin, "-r", f"{BOX_CONV}_output_0_HzDequantize",
                                             "-r", "Transpose_0_out_HzDequantize", "-o", "twice.bin"])
    assert result.exit_code == 1 and "node 'Transpose_0_out_HzDequantize' was already deleted" in result.output, \
        result.output


def test_a_bool_input_is_described_as_bool(tmp_path, in_tmp) -> None:
    """An attention mask given as bool: hrt_model_exec described it as HB_DNN_TENSOR_TYPE_F32 with a 1-byte stride
    (its own table had no bool), so board code sizing buffers by the type would have written floats."""
    from builders import FloatModel
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32), "w")
    nodes = [helper.make_node("Cast", ["mask"], ["keep"], to=TensorProto.FLOAT, name="cast"),
             helper.make_node("Mul", ["x", "keep"], ["kept"], name="mul"),
             helper.make_node("MatMul", ["kept", "w"], ["out"], name="proj")]
    graph = helper.make_graph(nodes, "masked", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8]),
                                                helper.make_tensor_value_info("mask", TensorProto.BOOL, [1, 8])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    project = make_project(tmp_path / "p", FloatModel(model, {"x": [1, 8], "mask": [1, 8]}, {"x", "mask"}))
    for k, f in enumerate(sorted((project.root / "cal_mask").iterdir())):
        (np.arange(8) < 3 + k % 5).astype(np.uint8).reshape(1, 8).tofile(f)
    project.write(calibration_parameters={"cal_data_type": "float32;uint8"},
                  model_parameters={"output_model_file_prefix": "masked"})
    made = invoke(hb_mapper.main, ["makertbin", "--config", project.config_path, "--model-type", "onnx"])
    assert made.exit_code == 0, made.output
    block = _block(_model_info(project.artefact("bin")), "input", 1)
    assert (block["name"], block["tensor type"], block["aligned byte size"]) == \
        ("mask", "HB_DNN_TENSOR_TYPE_BOOL", "8")


def test_each_simulator_step_belongs_to_one_subgraph(tmp_path, in_tmp) -> None:
    """Two nv12 inputs each open their own BPU subgraph with a layout Transpose; the simulator ran both Transposes
    as one step labelled 'BPU_x_subgraph_0 + BPU_x_subgraph_1', a fourth row in hrt_model_exec's profile."""
    from builders import _Graph

    g = _Graph(4)
    outs = [g.op("Relu", [g.conv(name, 3, 4)]) for name in ("left", "right")]
    fm = g.model({"left": [1, 3, 16, 16], "right": [1, 3, 16, 16]}, outs)
    built = build_bin(tmp_path / "two", fm, prefix="two", input_parameters={"input_type_rt": "nv12; nv12"})
    simulator = Simulator(open_model(built.bin))
    labels = [step.label for step in simulator.steps]
    assert not any(" + " in label for label in labels), labels
    assert {label for label in labels if label.startswith("BPU_")} == {"BPU_two_subgraph_0", "BPU_two_subgraph_1"}


def test_a_zero_point_is_printed_with_the_scale(tmp_path, in_tmp) -> None:
    """An output on an asymmetric grid (a Sigmoid's, with zero points: RDK X3's default keeps them where they help)
    whose Dequantize is removed: hb_model_info and hrt_model_exec printed its scale only, and board code
    dequantizing ``q * scale`` was off by 128 levels. They print the zero point too."""
    from builders import _Graph

    g = _Graph(8)
    fm = g.model({"data": [1, 3, 8, 8]}, [g.op("Sigmoid", [g.conv("data", 3, 4)])])
    built = build_bin(tmp_path / "zp", fm, march="bernoulli2", prefix="zp",
                      calibration_parameters={"optimization": "asymmetric"},
                      model_parameters={"remove_node_type": "Dequantize"})
    block = _block(_model_info(built.bin), "output", 0)
    assert block["tensor type"] == "HB_DNN_TENSOR_TYPE_S8" and block["zero point data"] == "-128,", block
    info = invoke(hb_model_info.main, [built.bin]).output
    assert "zero point data: -128," in info.split("integer input/output scales", 1)[1], info
