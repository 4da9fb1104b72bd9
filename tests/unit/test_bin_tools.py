"""The .bin tools on small models: hb_model_info, hb_pack, hb_model_modifier, hb_perf, hb_verifier, hrt_model_exec."""

from __future__ import annotations

import ast
import html.parser
import json
import os
import re
import shutil
import subprocess

import matplotlib.image
import numpy as np
import pytest
from bin_fixtures import build_bin, invoke
from builders import bpu_cpu_bpu

from hbtools.cli import (
    hb_model_info,
    hb_model_modifier,
    hb_pack,
    hb_perf,
    hb_verifier,
    hrt_model_exec,
)
from hbtools.ops import registry
from hbtools.runtime import HB_ONNXRuntime
from hbtools.runtime.binfile import read_bin
from hbtools.runtime.rt_input import random_rt_input
from hbtools.runtime.runtime_model import open_model
from hbtools.runtime.simulator import Simulator
from hbtools.tools import perf_model

PASSED = "Quanti onnx and Sim result Strict check PASSED"


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """Two small models (a Softmax after a Dequantize at the output; a featuremap MLP)."""
    root = tmp_path_factory.mktemp("bins")
    # the Softmax would run on the BPU of bayes-e: put it on the CPU, behind the output's Dequantize
    resnet = build_bin(root / "resnet", "resnet_like", prefix="resnet", input_parameters={"input_type_rt": "nv12"},
                       calibration_parameters={"run_on_cpu": "Softmax_0"})
    mlp = build_bin(root / "mlp", "featuremap_mlp", prefix="mlp")
    return resnet, mlp


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # tools write logs and results into the current folder
    return tmp_path


# ---------------------------------------------------------------- hb_model_info


def test_model_info_prints_the_config_used(small) -> None:
    result = invoke(hb_model_info.main, [small[0].bin])
    assert result.exit_code == 0, result.output
    out = result.output
    assert out.startswith("Start hb_model_info....\nhb_model_info version ")
    for line in ("******** resnet info *********", "BPU march           : bayes-e",
                 "input_type_rt       : nv12", "input_type_train    : rgb", "input_layout_train  : NCHW",
                 "norm_type           : data_mean_and_scale", "mean_value          : 120.0,116.0,104.0,",
                 "scale_value         : 0.015625,0.0078125,0.03125,", "input_shape         : 1x3x16x16",
                 "calibration_type    : max", "optimize_level      : O3",
                 "input-source        : {'data': 'pyramid', '_default_value': 'ddr'}",
                 "model input types   : [<InputDataType.NV12: 7>]",
                 "model output types  : [<InputDataType.F32: 5>]"):
        assert line in out, line
    assert re.search(r"onnxruntime version : \d", out)
    assert "deleted nodes" not in out


def test_model_info_says_which_layout_an_x3_bin_takes(tmp_path, in_tmp) -> None:
    """RDK X3 takes image data in NHWC whatever input_layout_rt says; the report a deployer reads later printed the
    configured NCHW alone."""
    built = build_bin(tmp_path / "x3", "resnet_like", march="bernoulli2", prefix="m",
                      input_parameters={"input_layout_rt": "NCHW"})
    info = invoke(hb_model_info.main, [built.bin]).output
    assert "input_layout_rt     : NCHW (the .bin takes NHWC)" in info, info


def test_model_info_gives_int64_tensors_their_type(tmp_path) -> None:
    """An ArgMax output and Gather indices fed as a featuremap are int64 on the board; hb_model_info listed
    them as F32 (the output's type was recorded as ONNX's number, '7'), so board code read float buffers."""
    from conformance import convert_featuremaps
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    weight = numpy_helper.from_array((rng.standard_normal((8, 4, 3, 3)) / 4).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("ArgMax", ["c"], ["cls"], axis=1, keepdims=1),
             helper.make_node("Gather", ["c", "idx"], ["picked"], axis=1)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8]),
                     helper.make_tensor_value_info("idx", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("cls", TensorProto.INT64, [1, 1, 8, 8]),
         helper.make_tensor_value_info("picked", TensorProto.FLOAT, [1, 3, 8, 8])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    samples = {"x": [rng.standard_normal((1, 4, 8, 8)).astype(np.float32) for _ in range(4)],
               "idx": [np.array([0, 3, 7], np.int64)] * 4}
    convert_featuremaps(tmp_path, model, samples, "1x4x8x8;3", "float32;int64", "m", calibration_type="max")
    out = invoke(hb_model_info.main, [str(tmp_path / "out" / "m.bin")]).output
    assert "model input types   : [<InputDataType.F32: 5>, <InputDataType.S64: 13>]" in out, out
    assert "model output types  : [<InputDataType.S64: 13>, <InputDataType.F32: 5>]" in out, out


def test_model_info_errors_are_one_line(tmp_path) -> None:
    (tmp_path / "junk.bin").write_bytes(b"\x89PNG\r\n\x1a\n....")
    result = invoke(hb_model_info.main, ["junk.bin"])
    assert result.exit_code == 1
    errors = [line for line in result.output.splitlines() if " ERROR " in line]
    assert "not an hbtools .bin model (it looks like a PNG image)" in errors[0]
    assert "Traceback" not in result.output


# ---------------------------------------------------------------- hb_pack


def test_pack_then_info_and_perf_per_member(small, in_tmp) -> None:
    result = invoke(hb_pack.main, [small[0].bin, small[1].bin, "-o", "both.bin"])
    assert result.exit_code == 0, result.output
    f = read_bin("both.bin")
    assert f.packed and f.names == ["resnet", "mlp"]
    for name in f.names:
        info = invoke(hb_model_info.main, ["both.bin", "-m", name])
        assert info.exit_code == 0 and f"******** {name} info" in info.output
        assert info.output.count(" info *********") == 1
        perf = invoke(hb_perf.main, ["-m", name, "both.bin"])
        assert perf.exit_code == 0, perf.output
        assert (in_tmp / "hb_perf_result" / name / f"{name}.html").is_file()
    unknown = invoke(hb_model_info.main, ["both.bin", "-m", "nope"])
    assert unknown.exit_code == 1 and "has no model 'nope'; it holds 'resnet', 'mlp'" in unknown.output
    again = invoke(hb_pack.main, ["both.bin", small[0].bin, "-o", "more.bin"])
    assert again.exit_code == 1
    assert "ERROR model: both.bin is a packed model, it can not be packed again!" in again.output
    assert "ERROR exception in command: pack" in again.output
    assert not (in_tmp / "more.bin").exists()


def test_pack_refuses_duplicate_names_and_single_models(small) -> None:
    result = invoke(hb_pack.main, [small[0].bin, small[0].bin, "-o", "dup.bin"])
    assert result.exit_code == 1 and "two models are both named 'resnet'" in result.output
    result = invoke(hb_pack.main, [small[0].bin, "-o", "one.bin"])
    assert result.exit_code == 1 and "needs at least two models" in result.output


def test_pack_refuses_models_of_different_boards(small, tmp_path) -> None:
    """An RDK X3 model and an X5 model went into one packed file, which no single board can load."""
    x3 = build_bin(tmp_path / "x3", "featuremap_mlp", march="bernoulli2", prefix="mlp_x3")
    result = invoke(hb_pack.main, [small[1].bin, x3.bin, "-o", "mixed.bin"])
    assert result.exit_code == 1, result.output
    assert "the models were built for different BPUs" in result.output and "bernoulli2 (RDK X3)" in result.output \
        and "bayes-e (RDK X5)" in result.output
    assert not (tmp_path / "mixed.bin").exists() and not os.path.exists("mixed.bin")


# ---------------------------------------------------------------- hb_model_modifier


def _here(path) -> str:
    """A copy of the model ``path`` in the current folder, where hb_model_modifier then writes its result."""
    name = os.path.basename(path)
    shutil.copy(path, name)
    return name


def _deletable(path) -> list[str]:
    listing = invoke(hb_model_modifier.main, [path])
    return ast.literal_eval(re.search(r"Nodes that can be deleted: (\[.*\])", listing.output).group(1))


def test_modifier_lists_and_removes_output_nodes(small, in_tmp) -> None:
    transpose, softmax = _deletable(small[0].bin)
    assert transpose == "data_nchw_Transpose"  # nv12 arrives NHWC; the graph transposes it for the convs
    result = invoke(hb_model_modifier.main, [_here(small[0].bin), "-r", softmax])
    assert result.exit_code == 0, result.output
    assert f"Node '{softmax}' found, its OP type is 'Softmax'" in result.output
    assert f"Node '{softmax}' is removed" in result.output
    assert "modified model saved as resnet_modified.bin" in result.output
    dequantize = _deletable("resnet_modified.bin")[1]
    assert dequantize.endswith("_HzDequantize")
    result = invoke(hb_model_modifier.main, ["resnet_modified.bin", "-r", dequantize, "-o", "twice.bin"])
    assert "its OP type is 'Dequantize'" in result.output and result.exit_code == 0
    info = invoke(hb_model_info.main, ["twice.bin"])
    assert f"deleted nodes: {softmax}\ndeleted nodes: {dequantize}" in info.output
    lines = (in_tmp / "deleted_nodes_info.txt").read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{dequantize} type=Dequantize") and "scales=[" in lines[0]


def test_the_modified_model_is_written_beside_the_model_given(small, in_tmp) -> None:
    """The result went to the current folder; the vendor's tool writes it beside the model, and D-Robotics'
    batch_mapper.py copies it from there (hunt 19 D2)."""
    os.mkdir("ws")
    shutil.copy(small[0].bin, "ws/resnet.bin")
    softmax = _deletable("ws/resnet.bin")[1]
    result = invoke(hb_model_modifier.main, ["ws/resnet.bin", "-r", softmax])
    assert result.exit_code == 0, result.output
    assert "modified model saved as ws/resnet_modified.bin" in result.output
    assert os.path.exists("ws/resnet_modified.bin") and not os.path.exists("resnet_modified.bin")


def test_modified_model_equals_quantized_onnx_before_the_dequantize(small, in_tmp) -> None:
    result = invoke(hb_model_modifier.main, [_here(small[0].bin), "-a", "Softmax", "-a", "Dequantize"])
    assert result.exit_code == 0, result.output
    model = open_model("resnet_modified.bin")
    record = read_bin("resnet_modified.bin").model().deleted_nodes[-1]
    assert record["type"] == "Dequantize" and record["inputs"] == ["Gemm_0_out_int32"]
    # the output keeps the model's output name (the Softmax's), as on the board
    assert [o.name for o in model.outputs] == [o.name for o in open_model(small[0].bin).outputs]
    assert model.outputs[0].dtype == np.int32 and model.outputs[0].scale
    sim = Simulator(model)
    feeds = {d.name: random_rt_input(d, np.random.default_rng(5)) for d in model.inputs}
    ours = sim.run(feeds)[model.outputs[0].name]
    # the quantized ONNX model with the Dequantize input exposed as an output
    import onnx
    from onnx import helper

    q = onnx.load(str(small[0].quantized))
    q.graph.output.append(helper.make_tensor_value_info("Gemm_0_out_int32", onnx.TensorProto.INT32, None))
    theirs = HB_ONNXRuntime(onnx_model=q).run(["Gemm_0_out_int32"], sim.prepare(feeds))[0]
    np.testing.assert_array_equal(ours, theirs)
    verified = invoke(hb_verifier.main, ["-m", f"{small[0].quantized},resnet_modified.bin", "-s", "True"])
    assert PASSED in verified.output, verified.output


def test_modifier_input_quantize_of_a_featuremap(small, in_tmp) -> None:
    result = invoke(hb_model_modifier.main, [_here(small[1].bin), "-a", "Quantize"])
    assert result.exit_code == 0, result.output
    model = open_model("mlp_modified.bin")
    # int16: the MLP's input holds 60 values (a tensor of at most 64 is int16 on bayes-e)
    assert model.inputs[0].dtype == np.int16 and model.inputs[0].raw["scale"]
    sim = Simulator(model)
    out = sim.run({model.inputs[0].name: np.zeros(model.inputs[0].shape, model.inputs[0].dtype)})
    assert all(np.isfinite(v).all() for v in out.values())
    # the quantized model is compared from the removed Quantize's output, as the .bin now takes it (refused before)
    verified = invoke(hb_verifier.main, ["-m", f"{small[1].quantized},mlp_modified.bin"])
    assert verified.exit_code == 0 and PASSED in verified.output, verified.output


def test_verifier_compares_a_bin_whose_input_transpose_was_removed(tmp_path, in_tmp) -> None:
    """Every RDK X3 image-input .bin lists its input layout Transpose as deletable; after '-a Transpose' hb_verifier
    refused the .bin, the only x86 check of the file the user deploys."""
    built = build_bin(tmp_path / "x3", "resnet_like", march="bernoulli2", prefix="m")
    [transpose] = [n for n in _deletable(built.bin) if n.endswith("_nchw_Transpose")]
    assert invoke(hb_model_modifier.main, [built.bin, "-r", transpose, "-o", "cut.bin"]).exit_code == 0
    verified = invoke(hb_verifier.main, ["-m", f"{built.quantized},cut.bin"])
    assert verified.exit_code == 0 and PASSED in verified.output, verified.output


def test_modifier_deletes_the_types_present_and_warns_of_the_others(small, in_tmp) -> None:
    """The PTQ chapter's example deletes several types at once (-a Reshape -a Cast -a Dequantize) and spells the
    model as --model_file: a type the model lacks stopped the whole command with an ERROR and nothing deleted
    (the config's remove_node_type warns and goes on), and --model_file was refused."""
    result = invoke(hb_model_modifier.main, ["--model_file", _here(small[0].bin), "-a", "Reshape", "-a", "Cast",
                                             "-a", "Softmax"])
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.output.splitlines() if " WARNING " in line]
    assert len(warnings) == 2 and "-a Reshape: no deletable node of that type" in warnings[0], warnings
    assert "its OP type is 'Softmax'" in result.output
    assert read_bin("resnet_modified.bin").model().deleted_nodes[-1]["type"] == "Softmax"


def test_modifier_with_nothing_deletable_writes_nothing(small, in_tmp) -> None:
    """'-a Reshape' on a model with no deletable Reshape wrote <model>_modified.bin, an unchanged copy that
    passes for a modified model; it is one ERROR naming what can be deleted, and no file."""
    result = invoke(hb_model_modifier.main, [_here(small[0].bin), "-a", "Reshape", "-a", "Cast"])
    assert result.exit_code == 1, result.output
    errors = [line for line in result.output.splitlines() if " ERROR " in line]
    assert "-a Reshape -a Cast: no node of these types can be deleted" in errors[0], errors
    assert "nothing was written" in errors[0] and "deletable now: [" in errors[0], errors
    assert "Traceback" not in result.output and not os.path.exists("resnet_modified.bin")


def test_modifier_deletes_the_flatten_an_x3_classifier_ends_in(tmp_path, in_tmp) -> None:
    """On RDK X3 the classifier's flatten moves after its Gemm and ends the model, a CPU node of type Flatten:
    hb_model_modifier refused it ('only ... Reshape ... can be'), so the output Dequantize stayed too (the
    vendor's ResNet50 example deletes its fc1000_reshape_0)."""
    built = build_bin(tmp_path / "x3", "resnet_like", march="bernoulli2", prefix="m")
    path = built.bin
    for k, name in enumerate(("Softmax_0", "Flatten_0", "Gemm_0_out_map_HzDequantize")):
        assert name in _deletable(path), (name, _deletable(path))
        result = invoke(hb_model_modifier.main, [path, "-r", name, "-o", f"m{k}.bin"])
        assert result.exit_code == 0, result.output
        path = f"m{k}.bin"
    assert "PASSED" in invoke(hb_verifier.main, ["-m", f"{built.quantized},{path}"]).output


def test_modifier_refusals(small, in_tmp) -> None:
    invoke(hb_pack.main, [small[0].bin, small[1].bin, "-o", "both.bin"])
    packed = invoke(hb_model_modifier.main, ["both.bin"])
    assert packed.exit_code == 1 and "ERROR pack model is not supported" in packed.output
    graph = read_bin(small[0].bin).model().load_graph()
    inner = next(n.name for n in graph.graph.node if n.op_type == "HzSQuantizedConv")
    result = invoke(hb_model_modifier.main, [small[0].bin, "-r", inner])
    assert result.exit_code == 1 and f"node '{inner}' (HzSQuantizedConv) cannot be deleted" in result.output
    result = invoke(hb_model_modifier.main, [small[0].bin, "-r", "no_such_node"])
    assert result.exit_code == 1 and "node 'no_such_node' is not in the model" in result.output
    assert not list(in_tmp.glob("*_modified.bin"))


def test_modifier_names_the_closest_node_and_takes_a_name_given_twice_once(small, in_tmp) -> None:
    """A mistyped name was 'not in the model' with no hint; the same -r twice said the node was not in the
    model (the first -r had deleted it); -r of a node deleted earlier said the same."""
    transpose = _deletable(small[0].bin)[0]
    typo = invoke(hb_model_modifier.main, [small[0].bin, "-r", transpose[:-1]])
    assert typo.exit_code == 1 and f"(closest: '{transpose}'" in typo.output
    twice = invoke(hb_model_modifier.main, [small[0].bin, "-r", transpose, "-r", transpose, "-o", "once.bin"])
    assert twice.exit_code == 0, twice.output
    assert [r["name"] for r in read_bin("once.bin").model().deleted_nodes] == [transpose]
    again = invoke(hb_model_modifier.main, ["once.bin", "-r", transpose, "-o", "again.bin"])
    assert again.exit_code == 1 and f"node '{transpose}' was already deleted" in again.output
    assert not (in_tmp / "again.bin").exists()


# ---------------------------------------------------------------- hb_perf


class _Tags(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.open: list[str] = []
        self.images: list[str] = []
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in ("meta", "img", "br"):
            self.open.append(tag)
        values = dict(attrs)
        if tag == "img":
            self.images.append(values["src"])
        if tag == "a":
            self.links.append(values["href"])

    def handle_endtag(self, tag: str) -> None:
        assert self.open and self.open.pop() == tag, f"unbalanced </{tag}>"


def _parse(path) -> _Tags:
    tags = _Tags()
    tags.feed(path.read_text())
    assert not tags.open, f"unclosed tags {tags.open}"
    return tags


def test_perf_writes_pages_picture_and_json(small, in_tmp) -> None:
    result = invoke(hb_perf.main, [small[0].bin])
    assert result.exit_code == 0, result.output
    assert "WARNING bpu model don't have per-layer perf info." in result.output
    assert ("WARNING if you need per-layer perf info, please enable [compiler_parameters.debug:True] "
            "when using makertbin.") in result.output
    folder = in_tmp / "hb_perf_result" / "resnet"
    main = _parse(folder / "resnet.html")
    assert main.images == ["resnet.png"]
    picture = matplotlib.image.imread(folder / "resnet.png")
    assert picture.shape[0] > 100 and picture.shape[1] > 100
    page = (folder / "resnet.html").read_text()
    for heading in ("Model Performance Summary", "Details", "BIN Model Structure", "Model Latency (ms)",
                    "Total DDR (loaded+stored) bytes per frame (MB per frame)", "Loaded Bytes per Frame",
                    "Stored Bytes per Frame"):
        assert heading in page
    for link in main.links:
        sub = _parse(folder / link)
        assert "<h2>Layer Details</h2>" not in (folder / link).read_text()
        data = json.loads((folder / link.replace(".html", ".json")).read_text())
        assert data["ops_per_frame"] > 0 and data["latency_ms"] > 0 and "layers" not in data
        del sub
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium:  # render it the way a user looks at it
        shot = in_tmp / "shot.png"
        subprocess.run([chromium, "--headless", "--disable-gpu", "--no-sandbox", f"--screenshot={shot}",
                        (folder / "resnet.html").as_uri()], check=True, capture_output=True, timeout=120)
        assert matplotlib.image.imread(shot).std() > 0


def test_perf_replaces_a_models_report_as_one_set(tmp_path, in_tmp, monkeypatch) -> None:
    """A model of the same name with fewer subgraphs leaves no page of the old ones behind, and a run
    interrupted half-way through its files leaves the previous report whole."""
    from hbtools import outputs

    two = build_bin(tmp_path / "two", bpu_cpu_bpu(), prefix="m").bin  # 2 BPU subgraphs around a CPU LRN
    one = build_bin(tmp_path / "one", "resnet_like", prefix="m").bin
    folder = in_tmp / "hb_perf_result" / "m"
    assert invoke(hb_perf.main, [two]).exit_code == 0
    assert {p.name for p in folder.glob("m_subgraph_*.html")} == {"m_subgraph_0.html", "m_subgraph_1.html"}
    previous = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    real, written = outputs.replace_atomically, []

    def interrupted(path, content):
        if written:
            raise KeyboardInterrupt
        written.append(path)
        return real(path, content)

    monkeypatch.setattr(outputs, "replace_atomically", interrupted)
    stopped = invoke(hb_perf.main, [one])
    assert stopped.exit_code == 130 and "interrupted" in stopped.output, stopped.output
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()} == previous
    monkeypatch.setattr(outputs, "replace_atomically", real)
    assert invoke(hb_perf.main, [one]).exit_code == 0
    assert {p.name for p in folder.glob("m_subgraph_*.html")} == {"m_subgraph_0.html"}
    assert not (folder / "m_subgraph_1.json").exists()


def test_perf_layer_details_with_debug(tmp_path, in_tmp) -> None:
    built = build_bin(tmp_path / "dbg", "resnet_like", prefix="dbg", compiler_parameters={"debug": True})
    result = invoke(hb_perf.main, [built.bin])
    assert result.exit_code == 0 and "WARNING" not in result.output
    folder = in_tmp / "hb_perf_result" / "dbg"
    sub = next(folder.glob("dbg_subgraph_*.json"))
    layers = json.loads(sub.read_text())["layers"]
    assert {"name", "op_type", "macs", "ops", "latency_ms", "bound"} <= set(layers[0])
    page = sub.with_suffix(".html").read_text()
    assert "<h2>Layer Details</h2>" in page
    # the seed's Layer Details also give each layer's output shape, as declared and as aligned, and when it is active
    for column in ("Original Output Shape", "Aligned Output Shape", "Active Time Span (ms)"):
        assert f"<th>{column}</th>" in page, column
    shapes = [(x["output_shape"], x["aligned_shape"]) for x in layers if x["output_shape"]]
    assert shapes and all(len(a) == len(o) and a[1] % 8 == 0 and a[1] >= o[1] for o, a in shapes), shapes
    ends = [x["start_ms"] + x["latency_ms"] for x in layers]
    assert all(x["start_ms"] == pytest.approx(end) for x, end in zip(layers[1:], ends, strict=False)), layers


def test_cost_model_counts_conv_macs_and_scales_with_the_march(small) -> None:
    from hbtools.march.profiles import get_profile

    rm = open_model(small[0].bin)
    slow, fast = perf_model.estimate(rm, get_profile("bernoulli2")), perf_model.estimate(rm, get_profile("bayes"))
    assert fast.latency_ms < slow.latency_ms and fast.loaded_bytes == slow.loaded_bytes
    graph = rm.graph.graph
    convs = [n for n in graph.node if n.op_type == "HzSQuantizedConv" and n.name.startswith("Conv_1")]
    layer = next(la for s in slow.subgraphs for la in s.layers if la.name == convs[0].name)
    assert layer.macs == 16 * 16 * 8 * 8 * 9  # output elements x Cin x kernel (the 8->8 3x3 conv on 16x16)
    assert slow.loaded_bytes > 0 and slow.stored_bytes > 0 and slow.cpu_nodes


def test_int16_activations_count_two_bytes_in_ddr(tmp_path) -> None:
    """8 x 288 x 288 feature maps fit on chip as int8 (648 KiB) but not as int16: the excess goes through DDR."""
    from builders import resnet_like

    from hbtools.march.profiles import get_profile

    profile = get_profile("bayes-e")
    costs = {}
    for opt in ("", "set_all_nodes_int16"):
        built = build_bin(tmp_path / (opt or "int8"), resnet_like(288),
                          calibration_parameters={"optimization": [opt] if opt else []})
        costs[opt or "int8"] = perf_model.estimate(open_model(built.bin), profile)
    int8, int16 = costs["int8"], costs["set_all_nodes_int16"]
    assert int16.loaded_bytes + int16.stored_bytes > int8.loaded_bytes + int8.stored_bytes
    assert int16.latency_ms > int8.latency_ms
    as_int8 = perf_model.estimate(open_model(tmp_path / "set_all_nodes_int16" / "model_output" / "small.bin"), profile,
                                  as_int8=True)
    # the all-int8 view of the int16 model: no spill, and the model output (int16 even in the "int8" build) one byte
    assert as_int8.loaded_bytes == int8.loaded_bytes and as_int8.stored_bytes <= int8.stored_bytes


# ---------------------------------------------------------------- hb_verifier


def test_verifier_passes_and_alias(small) -> None:
    for built in small:
        result = invoke(hb_verifier.main, ["-m", f"{built.quantized},{built.bin}", "-s", "True", "-c", "6"])
        assert result.exit_code == 0 and PASSED in result.output, result.output
    alias = invoke(hb_verifier.model_verifier, ["-q", small[0].quantized, "-b", small[0].bin, "-d", "5"])
    assert alias.exit_code == 0 and PASSED in alias.output
    # the PTQ chapter spells it with one dash
    spelled = invoke(hb_verifier.model_verifier, ["-quanti_model", small[0].quantized, "-b", small[0].bin])
    assert spelled.exit_code == 0 and PASSED in spelled.output, spelled.output


def test_verifier_dump_all_and_image_input(small, in_tmp) -> None:
    import skimage.data
    import skimage.io

    skimage.io.imsave(in_tmp / "cat.png", skimage.data.chelsea())
    result = invoke(hb_verifier.main, ["-m", f"{small[0].quantized},{small[0].bin}", "-i", "cat.png", "-r", "True"])
    assert result.exit_code == 0 and PASSED in result.output, result.output
    assert re.search(r"compared \d+ shared tensors, 0 differ", result.output)
    assert list((in_tmp / "hb_verifier_dump" / "sim").glob("*.npy"))


def test_verifier_reports_mismatch_statistics(small, monkeypatch) -> None:
    op = registry.get("HzDequantize")
    original = op.reference.__func__

    def off_by_a_bit(cls: type, node: object, inputs: list) -> list:
        return [y * np.float32(1.01) for y in original(cls, node, inputs)]  # a shift would pass the Softmax

    monkeypatch.setattr(op, "reference", classmethod(off_by_a_bit))
    result = invoke(hb_verifier.main, ["-m", f"{small[0].quantized},{small[0].bin}", "-s", "True"])
    assert result.exit_code == 1
    # hb_verifier's manual counts results, hb_model_verifier's lines
    for key in ("mismatch result num:", "mismatch.line_miss num: 0", "mismatch.line_diff num:",
                "mismatch.line_nan num: 0", "total result num: 10", "mismatch rate:", "max abs error:"):
        assert key in result.output, key
    assert "Strict check FAILED" in result.output
    older = invoke(hb_verifier.model_verifier, ["-q", small[0].quantized, "-b", small[0].bin])
    assert "mismatch line num:" in older.output and "total line num: 10" in older.output


def test_verifier_refuses_packed_and_unrelated_models(small, in_tmp) -> None:
    invoke(hb_pack.main, [small[0].bin, small[1].bin, "-o", "both.bin"])
    result = invoke(hb_verifier.main, ["-m", f"{small[0].quantized},both.bin"])
    assert result.exit_code == 1 and "ERROR pack model is not supported" in result.output
    result = invoke(hb_verifier.main, ["-m", f"{small[1].quantized},{small[0].bin}"])
    assert result.exit_code == 1 and "were the two built by the same makertbin run?" in result.output
    result = invoke(hb_verifier.main, ["-m", str(small[0].bin)])
    assert result.exit_code == 2 and "needs one quantized .onnx and one .bin" in result.output  # usage


# ---------------------------------------------------------------- hrt_model_exec


def test_hrt_model_exec_model_info_and_infer(small, in_tmp) -> None:
    info = invoke(hrt_model_exec.main, ["model_info", f"--model_file={small[0].bin}"])
    assert info.exit_code == 0
    for line in ("[model name]: resnet", "tensor type: HB_DNN_IMG_TYPE_NV12", "input source: HB_DNN_INPUT_FROM_PYRAMID",
                 "valid shape: (1,3,16,16,)", "aligned byte size: 384",
                 "tensor layout: HB_DNN_LAYOUT_NCHW\nquanti type: NONE\nstride: (0,0,0,0,)",
                 "tensor type: HB_DNN_TENSOR_TYPE_F32"):
        assert line in info.output, line
    np.zeros((24, 16), np.uint8).tofile(in_tmp / "frame.bin")
    result = invoke(hrt_model_exec.main, ["infer", "--model_file", small[0].bin, "--input_file", "frame.bin",
                                          "--enable_dump", "true", "--dump_format", "txt",
                                          "--enable_cls_post_process", "true"])
    assert result.exit_code == 0, result.output
    assert "infer success" in result.output and "top 0: id" in result.output
    dumped = next(in_tmp.glob("model_infer_output_0_*.txt"))
    assert np.loadtxt(dumped).size == 10
    wrong = np.zeros(10, np.uint8)
    wrong.tofile(in_tmp / "short.bin")
    result = invoke(hrt_model_exec.main, ["infer", "--model_file", small[0].bin, "--input_file", "short.bin"])
    assert result.exit_code == 1 and "holds 10 uint8 values; input 'data' (nv12) takes 384" in result.output
    # how to make nv12 data: a picture, or the two planes
    assert "Y plane (16x16 bytes) followed by the interleaved UV plane (8x16 bytes): give a picture" in result.output
    np.save(in_tmp / "dumped.npy", np.zeros((1, 3, 16, 16), np.int8))  # the debugger's calibration_data dump
    result = invoke(hrt_model_exec.main, ["infer", "--model_file", small[0].bin, "--input_file", "dumped.npy"])
    assert result.exit_code == 1 and "int8 data is the calibrated model's own input (pixel - 128" in result.output
    assert "give a picture file" in result.output


def test_hrt_model_exec_perf_and_profile(small, in_tmp) -> None:
    result = invoke(hrt_model_exec.main, ["perf", f"--model_file={small[0].bin}", "--frame_count=6",
                                          "--thread_num=2", "--profile_path=prof"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert re.search(r"Running condition:\n  Thread number is: 2\n  Frame count   is: 6\n  core number   is: 1\n"
                     r"  Program run time: [\d.]+ ms\nPerf result:\n  Frame totally latency is: [\d.]+ ms\n"
                     r"  Average    latency    is: [\d.]+ ms\n  Frame      rate       is: [\d.]+ FPS", out)
    doc = json.loads((in_tmp / "prof" / "profiler.log").read_text())
    assert doc["running_condition"]["frame_count"] == 6 and doc["perf_result"]["FPS"] > 0
    assert "BPU_resnet_subgraph_0" in doc["model_latency"] and "Preprocess" in doc["model_latency"]
    rows = (in_tmp / "prof" / "profiler.csv").read_text().splitlines()
    assert rows[0] == "name,avg_time(ms),max_time(ms),min_time(ms)" and len(rows) > 2


def test_hrt_model_exec_perf_unasked_runs_within_a_time_budget(small, in_tmp, monkeypatch) -> None:
    """D-Robotics' README line `hrt_model_exec perf --thread_num 2 --model_file X.bin` ran the board tool's 200
    frames in the simulator: 4 min 40 s for a 640x640 YOLO11n (hunt 19 D4). Without --frame_count the frames stop
    at a time budget (shrunk here to none: one frame per thread runs) and the log says how to run all 200."""
    monkeypatch.setattr(hrt_model_exec, "UNASKED_BUDGET_S", 0.0)
    result = invoke(hrt_model_exec.main, ["perf", f"--model_file={small[0].bin}", "--thread_num=2"])
    assert result.exit_code == 0, result.output
    frames = int(re.search(r"Frame count   is: (\d+)", result.output).group(1))
    assert 1 <= frames <= 2, result.output
    assert f"{frames} of the default 200 frames run" in result.output and "--frame_count 200" in result.output
    asked = invoke(hrt_model_exec.main, ["perf", f"--model_file={small[0].bin}", "--frame_count=3"])
    assert "Frame count   is: 3" in asked.output, asked.output


def test_hrt_model_exec_perf_stops_at_ctrl_c(small, ctrl_c) -> None:
    """Ctrl-C while the frames run: the workers take no more frames and the interrupt is raised. The pool
    used to wait for every remaining frame (minutes after the Ctrl-C, or until a second one)."""
    import os
    import signal
    import threading

    from hbtools.tools import hrt_exec

    class Counting(Simulator):
        frames = 0

        def run(self, *args, **kwargs):
            Counting.frames += 1
            if Counting.frames == 3:  # frames are running: the user presses Ctrl-C
                threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT)).start()
            return super().run(*args, **kwargs)

    sim = Counting(open_model(small[0].bin))
    feeds = {d.name: random_rt_input(d, np.random.default_rng(0)) for d in sim.model.inputs}
    with pytest.raises(KeyboardInterrupt):
        hrt_exec.perf(sim, feeds, frame_count=20000, thread_num=2)
    # Each worker finishes the frame it is in, then stops: far fewer frames than the 20000 asked (a tenth leaves
    # the signal a second or more to arrive on a loaded machine, where 100 frames were too few).
    assert Counting.frames < 2000, Counting.frames


def test_hrt_model_exec_says_which_option_to_fix(small, in_tmp) -> None:
    """A packed file without --model_name said 'name the one you want' (how: not said); a ';'-separated
    --input_file (the YAML's separator) was '1 files' with no word on the separator."""
    invoke(hb_pack.main, [small[0].bin, small[1].bin, "-o", "both.bin"])
    packed = invoke(hrt_model_exec.main, ["perf", "--model_file=both.bin", "--frame_count=1"])
    assert packed.exit_code == 1 and "choose one with --model_name (resnet, mlp)" in packed.output
    chosen = invoke(hrt_model_exec.main, ["infer", "--model_file=both.bin", "--model_name=mlp"])
    assert chosen.exit_code == 0, chosen.output


def test_hrt_model_exec_input_files_are_comma_separated(tmp_path, in_tmp) -> None:
    from debug_support import two_inputs

    built = build_bin(tmp_path / "two", two_inputs(), prefix="two",
                      input_parameters={"mean_value": "120 116 104; None", "scale_value": "0.0078125; None"})
    for d in open_model(built.bin).inputs:
        random_rt_input(d, np.random.default_rng(0)).tofile(in_tmp / f"{d.name}.bin")
    semicolon = invoke(hrt_model_exec.main, ["infer", f"--model_file={built.bin}", "--input_file=data.bin;feat.bin"])
    assert semicolon.exit_code == 1
    assert "2 inputs (data, feat) in this order; separate the files with ','" in semicolon.output
    comma = invoke(hrt_model_exec.main, ["infer", f"--model_file={built.bin}", "--input_file=data.bin,feat.bin"])
    assert comma.exit_code == 0, comma.output


def test_model_info_shows_the_input_shape_read_from_the_model(tmp_path, in_tmp) -> None:
    """A config without input_shape printed 'input_shape : None'; the shape the model was built with is known."""
    from builders import data_movement

    built = build_bin(tmp_path / "dm", data_movement(h=8), prefix="dm",
                      input_parameters={"input_shape": None, "input_layout_rt": "NHWC"})
    info = invoke(hb_model_info.main, [built.bin])
    assert info.exit_code == 0, info.output
    assert re.search(r"^input_shape\s+: 1x3x8x8$", info.output, re.M), info.output  # train layout, not NHWC


def test_model_info_shows_the_layout_a_featuremap_is_taken_in(tmp_path, in_tmp) -> None:
    """input_layout_rt NHWC for an NCHW featuremap: the .bin takes it NCHW (as hrt_model_exec model_info says),
    while hb_model_info echoed the requested NHWC and makertbin said nothing."""
    import yaml
    from conformance import convert_featuremaps
    from onnx import TensorProto, helper, numpy_helper

    from hbtools.cli import hb_mapper

    rng = np.random.default_rng(3)
    weight = numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) / 4).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    samples = {"x": [rng.standard_normal((1, 3, 8, 8)).astype(np.float32) for _ in range(2)]}
    convert_featuremaps(tmp_path, model, samples, "1x3x8x8", "float32", "m", calibration_type="max")
    config = yaml.safe_load((tmp_path / "config.yaml").read_text())
    config["input_parameters"]["input_layout_rt"] = "NHWC"
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    built = invoke(hb_mapper.main, ["makertbin", "--config", tmp_path / "config.yaml", "--model-type", "onnx"])
    assert built.exit_code == 0, built.output
    assert re.search(r"WARNING input 'x': input_layout_rt applies to picture inputs; this featuremap input is fed "
                     r"in its input_layout_train layout NCHW", built.output), built.output
    info = invoke(hb_model_info.main, [tmp_path / "out" / "m.bin"]).output
    assert re.search(r"^input_layout_rt\s+: NCHW$", info, re.M), info
    board = invoke(hrt_model_exec.main, ["model_info", f"--model_file={tmp_path / 'out' / 'm.bin'}"]).output
    assert "HB_DNN_LAYOUT_NCHW" in board, board


def test_npy_must_have_the_input_shape(tmp_path, in_tmp) -> None:
    """A .npy of NCHW pixels for an RDK X3 .bin (which takes NHWC) had only its element count checked: infer and
    hb_verifier ran on scrambled pixels and reported success. A .npy carries its shape, so it must be the
    input's; a raw file has none and keeps the size check."""
    built = build_bin(tmp_path / "x3", "resnet_like", march="bernoulli2", prefix="m",
                      input_parameters={"input_type_rt": "rgb", "input_layout_rt": "NCHW"})
    desc = open_model(built.bin).inputs[0]
    assert desc.shape == (1, 16, 16, 3) and desc.layout == "NHWC"
    nchw = np.random.default_rng(3).integers(0, 256, (1, 3, 16, 16), dtype=np.uint8)
    np.save(in_tmp / "nchw.npy", nchw)
    np.save(in_tmp / "nhwc.npy", nchw.transpose(0, 2, 3, 1))
    np.save(in_tmp / "odd.npy", nchw.transpose(0, 2, 1, 3))
    nchw.tofile(in_tmp / "raw.bin")
    for tool, args in ((hrt_model_exec.main, ["infer", f"--model_file={built.bin}", "--input_file={}"]),
                       (hb_verifier.main, ["-m", f"{built.quantized},{built.bin}", "-i", "{}"])):
        for good in ("nhwc.npy", "raw.bin"):
            ran = invoke(tool, [a.format(good) for a in args])
            assert ran.exit_code == 0, ran.output
        ran = invoke(tool, [a.format("nchw.npy") for a in args])
        assert ran.exit_code == 1
        errors = [line for line in ran.output.splitlines() if " ERROR " in line]
        assert errors[0].endswith("'nchw.npy' holds an array of shape (1, 3, 16, 16); input 'data' (rgb) takes "
                                  "shape (1, 16, 16, 3) NHWC; it looks like the same data in NCHW: transpose it "
                                  "to NHWC (np.transpose(a, (0, 2, 3, 1)))"), ran.output
        ran = invoke(tool, [a.format("odd.npy") for a in args])
        assert ran.exit_code == 1
        assert "'odd.npy' holds an array of shape (1, 16, 3, 16); input 'data' (rgb) takes shape (1, 16, 16, 3) " \
               "NHWC\n" in ran.output, ran.output


@pytest.mark.parametrize("kind", ["f64", ">f4", ">f8"])
def test_float64_npy_feeds_a_float32_featuremap(small, in_tmp, kind: str) -> None:
    """np.save of numpy's default float64 for a float32 featuremap was refused by hrt_model_exec and
    hb_verifier ('takes float32 data, got float64'); HB_ONNXRuntime converts it, so do they now. Big-endian
    files were refused too, with a message that called '>f4' data something other than float32 (hunt 43 D8)."""
    desc = open_model(small[1].bin).inputs[0]
    data = np.random.default_rng(2).standard_normal(desc.shape)
    np.save(in_tmp / "f64.npy", data.astype(">f8" if kind == ">f8" else ">f4" if kind == ">f4" else np.float64))
    np.save(in_tmp / "f32.npy", data.astype(np.float32))
    dumps = {}
    for name in ("f64", "f32"):
        ran = invoke(hrt_model_exec.main, ["infer", f"--model_file={small[1].bin}", f"--input_file={name}.npy",
                                           "--enable_dump=True", "--dump_format=npy", f"--dump_path={name}"])
        assert ran.exit_code == 0, ran.output
        [dumps[name]] = [np.load(p) for p in (in_tmp / name).glob("*.npy")]
    np.testing.assert_array_equal(dumps["f64"], dumps["f32"])
    verified = invoke(hb_verifier.main, ["-m", f"{small[1].quantized},{small[1].bin}", "-i", "f64.npy"])
    assert PASSED in verified.output, verified.output


def test_verifier_names_another_builds_bin(small, tmp_path, in_tmp) -> None:
    """The quantized ONNX of one run with the .bin of another (same model, other calibration) failed the strict
    check with no hint why; the hint now says their constants differ."""
    other = build_bin(tmp_path / "other", "resnet_like", prefix="resnet", input_parameters={"input_type_rt": "nv12"},
                      calibration_parameters={"calibration_type": "max", "max_percentile": 0.5})
    result = invoke(hb_verifier.main, ["-m", f"{small[0].quantized},{other.bin}"])
    assert result.exit_code == 1 and "Strict check FAILED" in result.output
    assert re.search(r"ERROR the \.bin holds other constants than .* were the two built by the same makertbin run",
                     result.output), result.output
    same = invoke(hb_verifier.main, ["-m", f"{other.quantized},{other.bin}"])
    assert PASSED in same.output


def test_verifier_input_named_wrong_gets_the_closest_name(small, in_tmp) -> None:
    """-i with a name the model lacks said 'more input files than model inputs' (or looked for a file
    called 'name:path'); it now names the input and the closest ones."""
    desc = open_model(small[1].bin).inputs[0]
    np.zeros(desc.shape, np.float32).tofile(in_tmp / "x.bin")
    result = invoke(hb_verifier.main, ["-m", f"{small[1].quantized},{small[1].bin}", "-i", f"{desc.name}x:x.bin"])
    assert result.exit_code == 1
    assert f"-i names input '{desc.name}x', which the model does not have (closest: '{desc.name}')" in result.output
    result = invoke(hb_verifier.main, ["-m", f"{small[1].quantized},{small[1].bin}", "-i", f"{desc.name}:x.bin"])
    assert PASSED in result.output, result.output


def test_hrt_model_exec_top5_is_only_for_class_vectors(in_tmp) -> None:
    """--enable_cls_post_process on a model whose first output is a feature map printed the top 5 of its
    flattened values as 'classes'; it now says the output is not a vector of class scores."""
    from builders import yolo_like

    from hbtools.runtime.binfile import read_bin
    from hbtools.runtime.rt_input import rt_dtype, rt_shape
    from hbtools.runtime.runtime_model import load

    built = build_bin(in_tmp / "yolo", yolo_like(), prefix="yolo")
    desc = load(read_bin(built.bin).models[0]).inputs[0]
    np.zeros(rt_shape(desc), rt_dtype(desc)).tofile(in_tmp / "frame.bin")
    result = invoke(hrt_model_exec.main, ["infer", "--model_file", built.bin, "--input_file", "frame.bin",
                                          "--enable_cls_post_process", "true"])
    assert result.exit_code == 0, result.output
    assert "top 0:" not in result.output
    assert "not one vector of class scores" in result.output


def test_hrt_model_exec_describes_a_channels_last_output_as_nhwc(tmp_path, in_tmp) -> None:
    """RDK-style YOLO exports end each head map in permute(0, 2, 3, 1); the vendor's .bin describes such an output
    as NHWC and board code checks the field. Every 4-D output was described as NCHW."""
    from conformance import convert_featuremaps
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    nodes = [helper.make_node("Conv", ["x", "w"], ["map"], pads=[1, 1, 1, 1]),
             helper.make_node("Transpose", ["map"], ["head"], perm=[0, 2, 3, 1]),
             helper.make_node("Relu", ["map"], ["plain"])]
    graph = helper.make_graph(nodes, "heads", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("head", TensorProto.FLOAT, [1, 8, 8, 6]),
                               helper.make_tensor_value_info("plain", TensorProto.FLOAT, [1, 6, 8, 8])],
                              [numpy_helper.from_array(rng.standard_normal((6, 3, 3, 3)).astype(np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    samples = [rng.standard_normal((1, 3, 8, 8)).astype(np.float32) for _ in range(4)]
    convert_featuremaps(tmp_path, model, {"x": samples}, "1x3x8x8", "float32", "m", calibration_type="max")
    info = invoke(hrt_model_exec.main, ["model_info", f"--model_file={tmp_path / 'out' / 'm.bin'}"]).output
    head, plain = info.split("name: head")[1].split("name: plain")
    assert "valid shape: (1,8,8,6,)" in head and "tensor layout: HB_DNN_LAYOUT_NHWC" in head, head
    assert "valid shape: (1,6,8,8,)" in plain and "tensor layout: HB_DNN_LAYOUT_NCHW" in plain, plain


def test_float64_npy_beyond_float32_is_refused_in_one_line(small, in_tmp) -> None:
    """Values beyond float32's range became inf with numpy warnings (hunt 44 D9); hrt_model_exec now says so."""
    desc = open_model(small[1].bin).inputs[0]
    data = np.random.default_rng(2).standard_normal(desc.shape)
    data.flat[0] = 1e40
    np.save(in_tmp / "big.npy", data)
    ran = invoke(hrt_model_exec.main, ["infer", f"--model_file={small[1].bin}", "--input_file=big.npy"])
    assert ran.exit_code != 0
    assert re.search(r"ERROR .*takes float32 data, and 1 of the float64 values given are beyond", ran.output), \
        ran.output
    assert "Warning" not in ran.output and "Traceback" not in ran.output
