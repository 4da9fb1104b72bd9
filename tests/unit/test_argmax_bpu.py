"""ArgMax / ArgMin on the BPU: a segmenter's class map is computed on the integer logits (the vendor's PTQ
guide: up to 64 channels on the BPU, beyond that on the CPU), and leaves the BPU as int64 indices."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from bin_fixtures import invoke
from builders import FloatModel, held_out, make_project, without_int16
from onnx import TensorProto, helper, numpy_helper

from hbtools.cli import hb_mapper, hb_model_info, hb_model_modifier, hb_perf
from hbtools.log import setup
from hbtools.march.profiles import get_profile
from hbtools.ops.calibration import HzCalibration
from hbtools.pipeline.runner import makertbin
from hbtools.quant.units import build_partition
from hbtools.runtime import HB_ONNXRuntime
from hbtools.runtime.runtime_model import open_model
from hbtools.runtime.simulator import Simulator
from hbtools.runtime.structure import analyse, tensor_info
from hbtools.tools.verifier import verify

CAL_COUNT = 4
CAL_SEED = 10  # builders.write_calibration's: the calibration pictures themselves


def _segmenter(classes: int = 19, *, op: str = "ArgMax", axis: int = 1, keepdims: int = 1,
               select_last_index: int | None = None) -> FloatModel:
    """data -> Conv 3x3 -> Relu -> Conv 1x1 to ``classes`` logits -> ``op`` (the label map)."""
    rng = np.random.default_rng(0)
    w1 = rng.normal(0, 0.4, (8, 3, 3, 3)).astype(np.float32)
    w2 = rng.normal(0, 0.4, (classes, 8, 1, 1)).astype(np.float32)
    logits = [1, classes, 8, 8]
    out_shape = list(logits)
    out_shape[axis] = 1
    if not keepdims:
        del out_shape[axis]
    extra = {} if select_last_index is None else {"select_last_index": select_last_index}
    nodes = [helper.make_node("Conv", ["data", "w1"], ["f"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["f"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2"], ["logits"], name="head"),
             helper.make_node(op, ["logits"], ["label"], axis=axis, keepdims=keepdims, name="label", **extra)]
    graph = helper.make_graph(nodes, "segmenter", [helper.make_tensor_value_info("data", TensorProto.FLOAT,
                                                                                  [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("label", TensorProto.INT64, out_shape)],
                              [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    return FloatModel(model, {"data": [1, 3, 8, 8]}, set())


def _with_logits(path: Path, tensor: str, out: Path) -> Path:
    """A copy of the model at ``path`` that also outputs ``tensor`` (its logits)."""
    model = onnx.load(str(path))
    model.graph.output.append(helper.make_tensor_value_info(tensor, TensorProto.FLOAT, None))
    onnx.save(model, str(out))
    return out


@pytest.mark.parametrize(("march", "op", "axis", "keepdims"), [
    ("bayes-e", "ArgMax", 1, 1),
    ("bayes-e", "ArgMax", 1, 0),
    ("bayes-e", "ArgMax", -1, 0),  # along the width, counted from the end
    ("bayes-e", "ArgMin", -3, 1),
    ("bernoulli2", "ArgMax", 1, 1),  # RDK X3: int8 logits, more equal levels (run_on_bpu: see below)
])
def test_a_segmenter_label_map_is_computed_on_the_bpu(tmp_path: Path, march: str, op: str, axis: int,
                                                      keepdims: int) -> None:
    setup(None)
    fm = _segmenter(op=op, axis=axis, keepdims=keepdims)
    project = make_project(tmp_path, fm, march=march, cal_count=CAL_COUNT)
    if not get_profile(march).int16:
        project.write(calibration_parameters={"calibration_type": "max", "run_on_bpu": "label"})
    paths = makertbin(project.config_path, "onnx")
    quantized = onnx.load(str(paths["quantized"]))
    # The label map leaves the BPU as the int64 indices: no Dequantize, one BPU subgraph, no CPU node.
    assert [n.op_type for n in quantized.graph.node if n.name == "label"] == [f"HzSQuantized{op}"]
    assert not [n.name for n in quantized.graph.node if "Dequantize" in n.op_type]
    assert [o.type.tensor_type.elem_type for o in quantized.graph.output] == [TensorProto.INT64]
    rm = open_model(paths["bin"])
    structure = analyse(rm.graph, rm.bin.partition, tensor_info(rm.graph))
    assert set(structure.on) == {"BPU"} and len(structure.subgraphs) == 1
    assert all(o.passed for o in verify(paths["quantized"], paths["bin"], None, 3).outputs)

    pick = np.argmax if op == "ArgMax" else np.argmin
    original = HB_ONNXRuntime(model_file=str(_with_logits(paths["original"], "logits", tmp_path / "o.onnx")))
    calibrated = HB_ONNXRuntime(model_file=str(_with_logits(paths["calibrated"], "logits_calibrated",
                                                            tmp_path / "c.onnx")))
    integer = HB_ONNXRuntime(model_file=str(paths["quantized"]))
    simulator = Simulator(rm)
    nhwc = get_profile(march).quantized_input_layout == "NHWC"
    flips = 0
    for x in held_out(fm, CAL_COUNT, seed=CAL_SEED):
        want, float_logits = original.run(None, {"data": x})
        got, logits = calibrated.run(None, {"data": x})
        assert got.dtype == np.int64 and got.shape == want.shape
        # The integer kernel, its emulation and the .bin agree exactly, and are the ArgMax of the
        # fake-quantized logits (the first of equal ones)
        board = x.transpose(0, 2, 3, 1) if nhwc else x  # RDK X3's .bin takes NHWC pictures
        np.testing.assert_array_equal(integer.run(None, {"data": board})[0], got)
        np.testing.assert_array_equal(simulator.run({"data": board})["label"], got)
        np.testing.assert_array_equal(pick(logits, axis=axis).reshape(got.shape), got)
        # ... and pick what the float model picks but where two float logits lie closer than the
        # quantization moved them.
        best = want.reshape(np.expand_dims(pick(float_logits, axis=axis), axis).shape)
        chosen = got.reshape(best.shape)
        gap = np.abs(np.take_along_axis(float_logits, best, axis) - np.take_along_axis(float_logits, chosen, axis))
        moved = np.abs(float_logits - logits).max()
        assert (gap[best != chosen] <= 2 * moved).all()
        flips += int((best != chosen).sum())
    assert flips <= 0.05 * CAL_COUNT * got.size


def _table(output: str) -> dict[str, tuple[str, ...]]:
    """The checker's node table: name -> (ON, subgraph, type)."""
    found = {}
    for line in output.splitlines():
        m = re.match(r"^(\S+)\s+(BPU|CPU)\s+(id\(\d+\)|--)\s+(\S+)\s*$", line)
        if m:
            found[m.group(1)] = m.groups()[1:]
    return found


@pytest.mark.parametrize(("classes", "extra", "reason"), [
    (65, {}, "ArgMax over 65 channels: the BPU of bayes-e (RDK X5) takes at most 64"),
    (19, {"select_last_index": 1}, "ArgMax with select_last_index 1 has no BPU form"),
    (64, {}, None),
])
def test_the_checker_says_why_an_argmax_stays_on_the_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         classes: int, extra: dict, reason: str | None) -> None:
    monkeypatch.chdir(tmp_path)
    onnx.save(_segmenter(classes, **extra).model, "model.onnx")
    result = invoke(hb_mapper.main, ["checker", "--model-type", "onnx", "--march", "bayes-e", "--model",
                                     "model.onnx"])
    assert result.exit_code == 0, result.output
    table = _table(result.output)
    if reason is None:
        assert table["label"] == ("BPU", "id(0)", "HzSQuantizedArgMax")
        assert "1 BPU subgraph(s) and 0 CPU node(s)" in result.output
        return
    assert table["label"] == ("CPU", "--", "ArgMax")
    assert re.search(rf"^label\s+ArgMax\s+{re.escape(reason)}", result.output, re.M), result.output


def test_the_bin_tools_take_an_argmax_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """hb_model_info types the output int64, hb_perf costs the ArgMax as a BPU layer that writes the
    indices, and hb_model_modifier offers no Dequantize to delete (there is none)."""
    setup(None)
    project = make_project(tmp_path, _segmenter(), cal_count=2)
    project.write(compiler_parameters={"debug": True})  # hb_perf's Layer Details
    paths = makertbin(project.config_path, "onnx")
    monkeypatch.chdir(tmp_path)
    info = invoke(hb_model_info.main, [paths["bin"]]).output
    assert "model output types  : [<InputDataType.S64: 13>]" in info, info
    modifier = invoke(hb_model_modifier.main, [paths["bin"]])
    assert modifier.exit_code == 0 and "Nodes that can be deleted: []" in modifier.output, modifier.output
    perf = invoke(hb_perf.main, [paths["bin"]])
    assert perf.exit_code == 0, perf.output
    layers = json.loads((tmp_path / "hb_perf_result" / "small" / "small_subgraph_0.json").read_text())["layers"]
    argmax = next(layer for layer in layers if layer["name"] == "label")
    # It compares each of the 19 x 8 x 8 logits, and writes the 8 x 8 indices out as int64.
    assert argmax["op_type"] == "HzSQuantizedArgMax" and argmax["ops"] == 19 * 8 * 8
    assert argmax["stored_bytes"] == 8 * 8 * 8


def test_per_channel_steps_stop_before_the_logits_an_argmax_reads(tmp_path: Path) -> None:
    """A step per channel along the ArgMax axis would change which channel holds the largest level: with
    per_channel the convolution's input gets one step per channel, the logits keep one."""
    setup(None)
    fm = _segmenter()
    project = make_project(tmp_path, fm, cal_count=CAL_COUNT)
    project.write(calibration_parameters={"calibration_type": "max", "per_channel": True})
    paths = makertbin(project.config_path, "onnx")
    steps = {n.name: len(HzCalibration.read(n)["scales"]) for n in onnx.load(str(paths["calibrated"])).graph.node
             if n.op_type == "HzCalibration"}
    assert steps["r_HzCalibration"] == 8 and steps["logits_HzCalibration"] == 1
    assert all(o.passed for o in verify(paths["quantized"], paths["bin"], None, 3).outputs)
    calibrated, integer = (HB_ONNXRuntime(model_file=str(paths[k])) for k in ("calibrated", "quantized"))
    for x in held_out(fm, CAL_COUNT, seed=CAL_SEED):
        np.testing.assert_array_equal(integer.run(None, {"data": x})[0], calibrated.run(None, {"data": x})[0])


def test_node_info_int8_and_int16_outputs_of_an_argmax(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """node_info InputType int8 was dropped without a word (only int16 was read), so the ArgMax's own int16
    reading of its logits stayed; OutputType int16 on its int64 indices was taken without a word (hunt 14a D4, D5)."""
    import logging

    setup(None)
    fm = _segmenter()
    project = make_project(tmp_path, fm, cal_count=CAL_COUNT)
    project.write(model_parameters={"node_info": {"label": {"InputType": "int8", "OutputType": "int16"}}},
                  calibration_parameters={"calibration_type": "max"})
    logging.getLogger("hbtools").addHandler(caplog.handler)
    try:
        paths = makertbin(project.config_path, "onnx")
    finally:
        logging.getLogger("hbtools").removeHandler(caplog.handler)
    bits = {n.name: HzCalibration.read(n)["bits"] for n in onnx.load(str(paths["calibrated"])).graph.node
            if n.op_type == "HzCalibration"}
    assert bits["logits_HzCalibration"] == 8, bits
    assert "node label (ArgMax) gives int64 indices: an int16 output does not apply to it" in caplog.text


def _segmenter_between(before: str | None, after: str | None) -> onnx.ModelProto:
    """The segmenter with a CPU-only op (Hardmax over the channels) on its logits ``before`` the ArgMax, or a Cast
    of its label map
    to uint8 ``after`` it."""
    model = _segmenter().model
    graph = model.graph
    if before:
        graph.node[-1].input[0] = "sin"
        graph.node.insert(len(graph.node) - 1, helper.make_node("Hardmax", ["logits"], ["sin"], name="sin", axis=1))
    if after:
        graph.node.append(helper.make_node("Cast", ["label"], ["label_u8"], to=TensorProto.UINT8, name="cast"))
        graph.output[0].name, graph.output[0].type.tensor_type.elem_type = "label_u8", TensorProto.UINT8
    return onnx.shape_inference.infer_shapes(model)


def test_an_argmax_next_to_the_cpu() -> None:
    """An ArgMax before a CPU node stays on the BPU (it hands the CPU one index for C logits); one reading only
    CPU results is kept in float next to them (quantizing its input costs what it saves)."""
    profile = get_profile("bayes-e")
    cast = build_partition(_segmenter_between(None, "cast"), profile, {})
    assert cast.unit_of_node["label"].on == "BPU" and cast.unit_of_node["cast"].on == "CPU"
    sin = build_partition(_segmenter_between("sin", None), profile, {})
    assert sin.unit_of_node["label"].on == "CPU"
    assert sin.unit_of_node["label"].reason.startswith("reads only CPU results")


@pytest.mark.parametrize(("march", "reason"), [
    ("bayes-e", "ArgMax over 384 values along axis 2: the BPU of bayes-e (RDK X5) takes at most 64"),
    ("bernoulli2", "ArgMax on a 3-D tensor [1, 17, 384]: the BPU of bernoulli2 (RDK X3) takes 4-D tensors only"),
])
def test_a_simcc_decoder_over_384_bins_stays_on_the_cpu(march: str, reason: str) -> None:
    """A SimCC keypoint head: 17 keypoints x 384 bins, decoded by an ArgMax along the last axis (given as -1)."""
    weight = numpy_helper.from_array(np.ones((17, 3, 1, 1), np.float32), "w")
    shape = numpy_helper.from_array(np.array([1, 17, 384], np.int64), "shape")
    nodes = [helper.make_node("Conv", ["data", "w"], ["c"], name="head"),
             helper.make_node("Reshape", ["c", "shape"], ["bins"], name="bins"),
             helper.make_node("ArgMax", ["bins"], ["x"], axis=-1, keepdims=0, name="decode")]
    graph = helper.make_graph(nodes, "simcc",
                              [helper.make_tensor_value_info("data", TensorProto.FLOAT, [1, 3, 12, 32])],
                              [helper.make_tensor_value_info("x", TensorProto.INT64, [1, 17])], [weight, shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    part = build_partition(onnx.shape_inference.infer_shapes(model), get_profile(march), {})
    assert part.unit_of_node["decode"].on == "CPU" and part.unit_of_node["decode"].reason == reason


def _upsampled(head: str = "ArgMax") -> FloatModel:
    """The segmenter with its logits upsampled x4 (bilinear) before the ``head`` (ArgMax over the classes, or
    Softmax): the usual segmenter head. The optimize stage writes the Resize as a ConvTranspose (the tests below
    take its int16 form away, ``without_int16``, to stand for an op that has none)."""
    model = _segmenter(keepdims=1).model
    graph = model.graph
    graph.node[-1].op_type = head
    if head == "Softmax":
        del graph.node[-1].attribute[1:]  # axis only
    graph.node[-1].input[0] = "up"
    graph.node.insert(len(graph.node) - 1, helper.make_node("Resize", ["logits", "", "scales"], ["up"],
                                                            mode="linear", name="upsample"))
    graph.initializer.append(numpy_helper.from_array(np.array([1, 1, 4, 4], np.float32), "scales"))
    out = graph.output[0]
    out.type.tensor_type.elem_type = TensorProto.INT64 if head == "ArgMax" else TensorProto.FLOAT
    out.type.tensor_type.shape.dim[1].dim_value = 1 if head == "ArgMax" else 19
    for dim in out.type.tensor_type.shape.dim[2:]:
        dim.dim_value = 32
    return FloatModel(onnx.shape_inference.infer_shapes(model), {"data": [1, 3, 8, 8]}, set())


def _makertbin_log(config: Path, caplog: pytest.LogCaptureFixture) -> tuple[dict[str, Path], str]:
    """makertbin's result paths and what it logged."""
    import logging

    caplog.clear()
    logging.getLogger("hbtools").addHandler(caplog.handler)
    try:
        paths = makertbin(config, "onnx")
    finally:
        logging.getLogger("hbtools").removeHandler(caplog.handler)
    return paths, caplog.text


def _flipped_labels(fm: FloatModel, paths: dict[str, Path], march: str, samples: list[np.ndarray]) -> int:
    """Label pixels differing from the float model's over ``samples``; the calibrated model, the quantized
    model and the .bin give the same labels."""
    original = HB_ONNXRuntime(model_file=str(paths["original"]))
    calibrated, integer = (HB_ONNXRuntime(model_file=str(paths[k])) for k in ("calibrated", "quantized"))
    simulator = Simulator(open_model(paths["bin"]))
    nhwc = get_profile(march).quantized_input_layout == "NHWC"
    flips = 0
    for x in samples:
        got = calibrated.run(None, {"data": x})[0]
        board = x.transpose(0, 2, 3, 1) if nhwc else x
        np.testing.assert_array_equal(integer.run(None, {"data": board})[0], got)
        np.testing.assert_array_equal(simulator.run({"data": board})["label"], got)
        flips += int((original.run(None, {"data": x})[0] != got).sum())
    return flips


@pytest.mark.parametrize(("march", "fm", "why", "logits", "producer"), [
    ("bernoulli2", _segmenter(), "int16 is not available on bernoulli2 (RDK X3)", "logits", "head"),
    ("bayes-e", _upsampled(), "ConvTranspose node upsample has no int16 form on bayes-e (RDK X5)", "up",
     "upsample"),
])
def test_an_argmax_on_int8_logits_stays_on_the_float_output(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                            monkeypatch: pytest.MonkeyPatch, march: str,
                                                            fm: FloatModel, why: str, logits: str,
                                                            producer: str) -> None:
    """Where its logits could only be int8 levels on the BPU, an ArgMax ran there and lost labels the CPU keeps,
    reading the convolution's float output (held out: X3 23 against 9 of 512 labels off the float model's, X5
    after a bilinear upsampling 259 against 157 of 8192), and nothing said so (hunt 14a D3). It stays on the CPU,
    saying why; run_on_bpu puts it on the BPU for speed, with a line saying what that costs."""
    setup(None)
    if march == "bayes-e":
        without_int16(monkeypatch, "ConvTranspose")
    project = make_project(tmp_path, fm, march=march, cal_count=CAL_COUNT)
    paths, text = _makertbin_log(project.config_path, caplog)
    assert [n.op_type for n in onnx.load(str(paths["quantized"])).graph.node if n.name == "label"] == ["ArgMax"]
    assert re.search(rf"^label\s+ArgMax\s+its logits {logits} would be int8 on the BPU \({re.escape(why)}\), "
                     rf"where close logits share a level; in float it reads node {producer}'s float output "
                     r"\(run_on_bpu moves it, faster\)$", text, re.M), text
    samples = held_out(fm, 16, seed=CAL_SEED + 1)
    on_cpu = _flipped_labels(fm, paths, march, samples)

    project.write(calibration_parameters={"run_on_bpu": "label"})
    paths, text = _makertbin_log(project.config_path, caplog)
    assert [n.op_type for n in onnx.load(str(paths["quantized"])).graph.node if n.name == "label"] == \
        ["HzSQuantizedArgMax"]
    assert text.count(f"node label (ArgMax) compares int8 logits on the BPU ({why}), where close logits share a "
                      f"level: run_on_cpu: ['label'] keeps it on node {producer}'s float output") == 1, text
    assert on_cpu < _flipped_labels(fm, paths, march, samples)


def test_an_op_reading_int16_by_itself_says_where_it_cannot(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A Softmax asks for an int16 input; after a bilinear upsampling written as an op with no int16 form it reads
    int8, which was dropped without a word (hunt 14a D3)."""
    setup(None)
    without_int16(monkeypatch, "ConvTranspose")
    project = make_project(tmp_path, _upsampled("Softmax"), cal_count=2)
    paths, text = _makertbin_log(project.config_path, caplog)
    assert text.count("node label reads its input as int8, not int16: ConvTranspose node upsample, next to it, has "
                      "no int16 form on bayes-e (RDK X5)") == 1, text
    bits = {n.name: HzCalibration.read(n)["bits"] for n in onnx.load(str(paths["calibrated"])).graph.node
            if n.op_type == "HzCalibration"}
    assert bits["up_HzCalibration"] == 8, bits


def test_an_argmax_over_a_concat_reads_int16_inputs(tmp_path: Path) -> None:
    """An ArgMax of a Concat asked int16 of the Concat's output only: its inputs stayed int8, so it compared
    int8 levels at int16's cost (23 of 512 labels off the float model's, as int8 logits give; hunt 14a D7). The
    request goes through the Concat to what it joins."""
    setup(None)
    model = _segmenter().model
    graph = model.graph
    graph.node[-1].input[0] = "joined"
    graph.node.insert(len(graph.node) - 1, helper.make_node("Concat", ["logits", "r"], ["joined"], axis=1,
                                                            name="join"))
    fm = FloatModel(onnx.shape_inference.infer_shapes(model), {"data": [1, 3, 8, 8]}, set())
    project = make_project(tmp_path, fm, cal_count=CAL_COUNT)
    paths = makertbin(project.config_path, "onnx")
    bits = {n.name: HzCalibration.read(n)["bits"] for n in onnx.load(str(paths["calibrated"])).graph.node
            if n.op_type == "HzCalibration"}
    assert bits["joined_HzCalibration"] == bits["logits_HzCalibration"] == bits["r_HzCalibration"] == 16, bits
    assert [n.op_type for n in onnx.load(str(paths["quantized"])).graph.node if n.name == "label"] == \
        ["HzSQuantizedArgMax"]
    _flipped_labels(fm, paths, "bayes-e", held_out(fm, CAL_COUNT, seed=CAL_SEED))


def test_the_int16_search_leaves_a_grid_without_an_int16_form_int8(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The int16 search of calibration_type default made int16 the grids that a node without an int16 form reads
    and writes (the profile's flag was read only by the config's requests): the .bin held a node the BPU cannot
    run. The search decides only on tensors that may be int16; the others in front still may."""
    setup(None)
    without_int16(monkeypatch, "ConvTranspose")
    project = make_project(tmp_path, _upsampled("Softmax"), cal_count=CAL_COUNT)
    project.write(calibration_parameters={"calibration_type": "default"})
    paths = makertbin(project.config_path, "onnx")
    bits = {n.name: HzCalibration.read(n)["bits"] for n in onnx.load(str(paths["calibrated"])).graph.node
            if n.op_type == "HzCalibration"}
    assert bits["logits_HzCalibration"] == bits["up_HzCalibration"] == 8, bits
    assert 16 in bits.values(), bits  # the search ran and kept int16 elsewhere
