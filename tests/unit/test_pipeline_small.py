"""makertbin end to end on small float models built in the tests (SPEC §4–§7).

Each model is written to a temp folder with random uint8 ``tofile`` calibration data
and a YAML config, converted with ``hbtools.pipeline.runner.makertbin``, and the five
artefacts are checked the way a user checks them: they load, pass ``onnx.checker``,
run in ``HB_ONNXRuntime``, agree with the source model and with each other.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from builders import (
    EXACT_MEAN,
    EXACT_SCALE,
    MODELS,
    FloatModel,
    Project,
    _Graph,
    make_project,
    random_sample,
)
from onnx import helper

import hbtools.log
from hbtools.metrics import cosine_similarity
from hbtools.ops.base import DOMAIN, attrs_of
from hbtools.pipeline.runner import makertbin
from hbtools.runtime import HB_ONNXRuntime
from hbtools.runtime.binfile import read_bin
from hbtools.runtime.lowering import lower_model
from hbtools.runtime.session import make_session

ONNX_ARTEFACTS = ("original", "optimized", "calibrated", "quantized")
QUANTIZED_HZ_OPS = {"HzSQuantizedConv", "HzSQuantizedMatMul", "HzSQuantizedEltwise", "HzLut",
                    "HzSQuantizedPool", "HzSQuantizedConcat", "HzRequantize", "HzQuantize", "HzDequantize",
                    "HzSQuantizedSoftmax", "HzSQuantizedConstantEltwise"}
# Standard ops that may run on the BPU side of a quantized model: they move integers around.
DATA_MOVEMENT = {"Reshape", "Transpose", "Flatten", "MaxPool", "GlobalMaxPool", "Resize", "Squeeze",
                 "Unsqueeze", "Slice", "Split", "Identity", "Cast"}
CAL_COS = 0.99  # calibrated vs float model
QUANT_COS = 0.999  # quantized vs calibrated model


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.getMessage()}")


@dataclass
class Converted:
    project: Project
    paths: dict[str, Path]
    log: list[str]

    @property
    def fm(self) -> FloatModel:
        return self.project.fm

    def session(self, kind: str) -> HB_ONNXRuntime:
        return HB_ONNXRuntime(model_file=str(self.paths[kind]))

    def log_text(self) -> str:
        return "\n".join(self.log)


def convert(project: Project) -> Converted:
    hbtools.log.setup(None)
    collect = _Collect()
    logger = logging.getLogger("hbtools")
    logger.addHandler(collect)
    try:
        paths = makertbin(project.config_path, "onnx")
    finally:
        logger.removeHandler(collect)
    return Converted(project, paths, collect.lines)


def heldout(fm: FloatModel, seed: int = 1234) -> dict[str, np.ndarray]:
    """One random sample not in the calibration set: uint8 images, float32 featuremaps."""
    rng = np.random.default_rng(seed)
    return {n: random_sample(fm, n, rng) for n in fm.inputs}


def source_feed(fm: FloatModel, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What the user's float model takes for the same data: (x - mean) * scale."""
    mean = np.array(EXACT_MEAN, dtype=np.float32).reshape(1, 3, 1, 1)
    scale = np.array(EXACT_SCALE, dtype=np.float32).reshape(1, 3, 1, 1)
    return {n: v if n in fm.featuremap else (v.astype(np.float32) - mean) * scale for n, v in x.items()}


def quantized_feed(sess: HB_ONNXRuntime, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Transpose NCHW image data where the quantized model takes NHWC (bernoulli2)."""
    shapes = {i.name: list(i.shape) for i in sess.get_inputs()}
    return {n: v if list(v.shape) == shapes[n] else v.transpose(0, 2, 3, 1) for n, v in x.items()}


def outputs(conv: Converted, kind: str, x: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = conv.session(kind)
    feed = quantized_feed(sess, x) if kind == "quantized" else x
    return sess.run(None, feed)


def dequantized_outputs(conv: Converted, x: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Quantized model outputs in float (int outputs times the scale the .bin records)."""
    descs = {d["name"]: d for d in read_bin(conv.paths["bin"]).models[0].outputs}
    sess = conv.session("quantized")
    out = []
    for name, v in zip(sess.output_names, sess.run(None, quantized_feed(sess, x)), strict=True):
        scale = descs[name].get("scale")
        out.append(v.astype(np.float64) * np.asarray(scale) if v.dtype != np.float32 else v)
    return out


def all_tensors(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every node output of ``model`` (Hz nodes' outputs included) for one input."""
    names = [o for n in model.graph.node for o in n.output if o]
    lowered = lower_model(model, keep=names)
    present = {o.name for o in lowered.graph.output}
    lowered.graph.output.extend(helper.make_empty_tensor_value_info(t) for t in names if t not in present)
    return dict(zip(names, make_session(lowered).run(names, feed), strict=True))


def as_fed(sess: HB_ONNXRuntime, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The feed after HB_ONNXRuntime's own conversion (uint8 - 128 for int8 inputs)."""
    types = dict(zip(sess.input_names, sess.input_types, strict=True))
    return {k: (v.astype(np.int16) - 128).astype(np.int8) if types[k] == onnx.TensorProto.INT8 else v
            for k, v in x.items()}


def shared_float_tensors(conv: Converted, x: dict[str, np.ndarray]) -> dict[str, float]:
    """Cosine between calibrated and quantized model for every float tensor both compute.

    These are the CPU-side tensors and the dequantized outputs: a quantized value that
    is off (an overflowing accumulator, a wrong scale) shows here even when a Softmax
    downstream hides it in the final output.
    """
    cal_sess, q_sess = conv.session("calibrated"), conv.session("quantized")
    cal = all_tensors(cal_sess.model, as_fed(cal_sess, x))
    quant = all_tensors(q_sess.model, as_fed(q_sess, quantized_feed(q_sess, x)))
    return {t: cosine_similarity(cal[t], v) for t, v in quant.items()
            if v.dtype == np.float32 and t in cal and cal[t].shape == v.shape}


def calibration_nodes(model: onnx.ModelProto, kind: str = "activation") -> dict[str, dict]:
    return {n.name: attrs_of(n) for n in model.graph.node
            if n.domain == DOMAIN and n.op_type == "HzCalibration" and attrs_of(n)["kind"] == kind}


def warnings(conv: Converted) -> list[str]:
    return [line for line in conv.log if line.startswith("WARNING")]


def run_model(tmp_path: Path, name: str, *, march: str = "bayes-e", calibration_type: str = "max",
              **overrides: dict) -> Converted:
    project = make_project(tmp_path / name, MODELS[name](), march=march, calibration_type=calibration_type)
    if overrides:
        project.write(**overrides)
    return convert(project)


@pytest.fixture(scope="module", params=sorted(MODELS))
def converted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Converted:
    return run_model(tmp_path_factory.mktemp(request.param), request.param)


# ---------------------------------------------------------------- every model


def test_artefacts_exist_pass_checker_and_run(converted: Converted) -> None:
    assert set(converted.paths) == {"original", "optimized", "calibrated", "quantized", "bin"}
    for kind in ("original", "optimized", "calibrated", "quantized", "bin"):
        path = converted.project.artefact(kind)
        assert path.is_file() and path.stat().st_size > 0, f"{kind} artefact missing: {path}"
        assert converted.paths[kind] == path
    leftovers = [p.name for p in converted.project.working_dir.iterdir() if p.name.endswith(".tmp")]
    assert not leftovers, f"temporary files left behind: {leftovers}"
    x = heldout(converted.fm)
    for kind in ONNX_ARTEFACTS:
        model = onnx.load(str(converted.paths[kind]))
        onnx.checker.check_model(model, full_check=True)
        outs = outputs(converted, kind, x)
        assert len(outs) == len(converted.fm.model.graph.output)
        assert all(np.isfinite(o).all() for o in outs), f"{kind} gives non-finite outputs"
    assert "Convert to runtime bin file successfully!" in converted.log_text()


def test_original_model_equals_source_model(converted: Converted) -> None:
    fm = converted.fm
    x = heldout(fm)
    original = converted.session("original")
    for name in fm.inputs:
        want = onnx.TensorProto.FLOAT if name in fm.featuremap else onnx.TensorProto.INT8
        got_type = original.input_types[original.input_names.index(name)]
        assert got_type == want, f"input {name}: {got_type}"
    # uint8 data goes in through input_offset=128, exactly as the device's int8 input.
    got = original.run(None, x, input_offset=128)
    ref = HB_ONNXRuntime(onnx_model=fm.model).run(None, source_feed(fm, x))
    for g, r in zip(got, ref, strict=True):
        assert g.dtype == r.dtype and g.shape == r.shape
        assert np.array_equal(g, r), f"original vs source: max abs diff {np.abs(g - r).max()} (must be 0)"


def test_optimized_model_matches_original(converted: Converted) -> None:
    x = heldout(converted.fm, seed=7)
    for g, r in zip(outputs(converted, "optimized", x), outputs(converted, "original", x), strict=True):
        rel = np.abs(g - r).max() / np.abs(r).max()
        assert rel <= 1e-4, f"optimized vs original: max abs diff / max abs = {rel:.3g} > 1e-4"


def test_calibrated_and_quantized_outputs_close(converted: Converted) -> None:
    x = heldout(converted.fm, seed=99)
    ref = outputs(converted, "optimized", x)
    cal = outputs(converted, "calibrated", x)
    quant = outputs(converted, "quantized", x)
    for r, c, q in zip(ref, cal, quant, strict=True):
        cos_cal = cosine_similarity(r, c)
        cos_q = cosine_similarity(c, q)
        assert cos_cal >= CAL_COS, f"calibrated vs float cosine {cos_cal:.6f} < {CAL_COS}"
        assert cos_q >= QUANT_COS, f"quantized vs calibrated cosine {cos_q:.6f} < {QUANT_COS}"
    shared = shared_float_tensors(converted, x)
    assert shared, "the quantized model shares no float tensor with the calibrated one"
    low = {t: round(c, 6) for t, c in shared.items() if c < QUANT_COS}
    assert not low, f"float tensors with quantized vs calibrated cosine < {QUANT_COS}: {low}"


def test_quantized_model_is_integer(converted: Converted) -> None:
    model = onnx.load(str(converted.paths["quantized"]))
    record = read_bin(converted.paths["bin"]).models[0].partition
    cpu_nodes = {c["name"] for c in record["cpu_nodes"]}
    hz = [n for n in model.graph.node if n.domain == DOMAIN]
    assert hz, "the quantized model has no Horizon ops"
    assert {n.op_type for n in hz} <= QUANTIZED_HZ_OPS, {n.op_type for n in hz} - QUANTIZED_HZ_OPS
    for n in model.graph.node:
        if n.domain == "":
            assert n.op_type in DATA_MOVEMENT or n.name in cpu_nodes, (
                f"float {n.op_type} node {n.name} in the quantized model but not a CPU node")
    # Run it and look at the values: every BPU-side tensor holds integers.
    x = heldout(converted.fm)
    sess = converted.session("quantized")
    feed = {k: (v.astype(np.int16) - 128).astype(np.int8) if v.dtype == np.uint8 else v
            for k, v in quantized_feed(sess, x).items()}
    values = all_tensors(model, feed)
    for n in model.graph.node:
        if n.domain == DOMAIN and n.op_type != "HzDequantize":
            v = values[n.output[0]]
            assert v.dtype in (np.int8, np.int16, np.int32), f"{n.op_type} {n.name} outputs {v.dtype}"
        elif n.domain == "" and n.name not in cpu_nodes and n.op_type != "Cast":
            v = values[n.output[0]]
            assert np.issubdtype(v.dtype, np.integer) or np.array_equal(v, np.round(v)), (
                f"{n.op_type} {n.name} on the BPU carries non-integer values")
    if any(n.op_type == "Softmax" for n in converted.fm.model.graph.node):  # bayes-e has an integer Softmax
        assert any(n.op_type == "HzSQuantizedSoftmax" for n in model.graph.node), "Softmax left the BPU"


def test_bin_reads_back(converted: Converted) -> None:
    fm = converted.fm
    binfile = read_bin(converted.paths["bin"])
    assert len(binfile.models) == 1
    m = binfile.models[0]
    assert m.name == "small"
    quantized = onnx.load(str(converted.paths["quantized"]))
    assert m.load_graph() == quantized
    assert [d["name"] for d in m.inputs] == list(fm.inputs)
    for d in m.inputs:
        featuremap = d["name"] in fm.featuremap
        assert d["input_type_rt"] == ("featuremap" if featuremap else "rgb")
        assert d["dtype"] == ("float32" if featuremap else "uint8")
        assert d["shape"] == fm.inputs[d["name"]] and d["layout"] == "NCHW"  # bayes-e keeps the train layout
        assert d["batch"] == 1
    assert [d["name"] for d in m.outputs] == [o.name for o in quantized.graph.output]
    assert all(d["dtype"] == "float32" for d in m.outputs)
    assert m.meta["march"] == "bayes-e"
    nodes = {n for s in m.partition["subgraphs"] for n in s["nodes"]} | {c["name"] for c in m.partition["cpu_nodes"]}
    optimized = onnx.load(str(converted.paths["optimized"]))
    assert nodes == {n.name for n in optimized.graph.node}
    assert m.config["model_parameters"]["march"] == "bayes-e"


# ---------------------------------------------------------------- particular behaviours


def test_batchnorm_folded(tmp_path: Path) -> None:
    conv = run_model(tmp_path, "resnet_like")
    assert any(n.op_type == "BatchNormalization" for n in onnx.load(str(conv.paths["original"])).graph.node)
    optimized = onnx.load(str(conv.paths["optimized"]))
    assert not any(n.op_type == "BatchNormalization" for n in optimized.graph.node)
    assert sum(n.op_type == "Conv" for n in optimized.graph.node) == 2


def test_node_table_and_similarity_logged(tmp_path: Path) -> None:
    conv = run_model(tmp_path, "resnet_like")
    text = conv.log_text()
    assert re.search(r"Node\s+ON\s+Subgraph\s+Type\s+Cosine Similarity\s+Threshold", text)
    for row in ("Conv_1", "Add_0", "Softmax_0"):
        assert re.search(rf"^{row}\s+(BPU|CPU)\s", text, re.M), f"no table row for {row}"
    assert re.search(r"^Softmax_0\s+BPU\s+id\(0\)\s+HzSQuantizedSoftmax", text, re.M)
    # which data the cosines come from, so that one picture's 0.999 is not read as the model's accuracy
    assert "Cosine Similarity: float against quantized output of each node on the first calibration sample" in text
    # each model output with the vendor's distances, where D-Robotics' READMEs send users for the output names
    outputs = [o.name for o in onnx.load(str(conv.paths["original"])).graph.output]
    table = re.search(r"The quantized model output:\n=+\nOutput\s+Cosine Similarity\s+L1 Distance\s+L2 Distance\s+"
                      r"Chebyshev Distance\n-+\n((?:\S+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\n)+)", text)
    assert table, text[-3000:]
    rows = [line.split() for line in table.group(1).splitlines()]
    assert [r[0] for r in rows] == outputs and all(0.9 < float(r[1]) <= 1.0 for r in rows), rows
    assert text.rstrip().endswith("End Model Convert")


@pytest.mark.parametrize(("calibration_type", "max_percentile", "selected"), [
    ("max", None, r"max"),
    ("max", 0.999, r"max-percentile 0\.999"),
    ("kl", None, r"kl"),
    ("default", None, r"(max|max-percentile [0-9.]+|kl)"),
    ("mix", None, r"(max|max-percentile [0-9.]+|kl)"),
    ("skip", None, r"max"),
])
def test_calibration_types(tmp_path: Path, calibration_type: str, max_percentile: float | None,
                           selected: str) -> None:
    cal = {"calibration_type": calibration_type}
    if max_percentile is not None:
        cal["max_percentile"] = max_percentile
    if calibration_type == "skip":
        cal["cal_data_dir"] = None  # not needed
    conv = run_model(tmp_path, "activations", calibration_parameters=cal)
    text = conv.log_text()
    assert re.search(rf"^INFO Select {selected} method$", text, re.M), "the log must name the selected method"
    # One line with the seconds of every step that ran; the searching methods run them all.
    steps = ["statistics", "quantize", "compile"]
    if calibration_type in ("default", "mix"):
        steps[1:1] = ["method search", "GPTQ", "bias correction", "int16 search"]
        steps.insert(0, "weight precision")
    timings = re.findall(r"^INFO step timings: (.*)$", text, re.M)
    assert len(timings) == 1, "one step timings line"
    named = re.findall(r"([A-Za-z0-9 ]+?) (\d+\.\d) s(?:, |$)", timings[0])
    assert [name for name, _ in named] == steps, timings[0]
    # ... and the log file says when each began (a long one is otherwise minutes without a line)
    assert set(re.findall(r"^DEBUG (.+): started$", text, re.M)) == set(steps), text
    if calibration_type == "skip":
        assert any("skip" in w and "accuracy" in w for w in warnings(conv)), warnings(conv)
    calibrated = onnx.load(str(conv.paths["calibrated"]))
    onnx.checker.check_model(calibrated, full_check=True)
    onnx.checker.check_model(onnx.load(str(conv.paths["quantized"])), full_check=True)

    # Thresholds against the real activation ranges on the calibration data.
    acts = calibration_nodes(calibrated)
    assert acts
    if calibration_type != "skip":
        optimized = onnx.load(str(conv.paths["optimized"]))
        maxima: dict[str, float] = {}
        for f in sorted((conv.project.root / "cal_data").iterdir()):
            x = np.fromfile(f, np.uint8).reshape(conv.fm.inputs["data"])
            values = all_tensors(optimized, {"data": (x.astype(np.int16) - 128).astype(np.int8)})
            for name in acts:
                t = name[: -len("_HzCalibration")]
                maxima[t] = max(maxima.get(t, 0.0), float(np.abs(values[t]).max()))
        for name, a in acts.items():
            t = name[: -len("_HzCalibration")]
            th = a["thresholds"][0]
            if calibration_type == "max" and max_percentile is None:
                assert th == pytest.approx(maxima[t], rel=1e-6), f"{t}: max threshold {th} != max |x| {maxima[t]}"
            else:
                assert 0 < th <= maxima[t] * (1 + 1e-6), f"{t}: threshold {th} outside (0, {maxima[t]}]"
        if max_percentile is not None:
            assert any(a["thresholds"][0] < maxima[n[: -len("_HzCalibration")]] * 0.999 for n, a in acts.items()), \
                f"max_percentile {max_percentile} should clip some tensor below its maximum"

    x = heldout(conv.fm, seed=5)
    ref, cal_out, q = (outputs(conv, k, x)[0] for k in ("optimized", "calibrated", "quantized"))
    assert cosine_similarity(ref, cal_out) >= CAL_COS, f"calibrated vs float cosine < {CAL_COS}"
    assert cosine_similarity(cal_out, q) >= QUANT_COS, f"quantized vs calibrated cosine < {QUANT_COS}"


@pytest.mark.parametrize("dtype", ["int8", "int16"])
@pytest.mark.parametrize("name", ["activations", "featuremap_mlp"])
def test_set_model_output_int(tmp_path: Path, name: str, dtype: str) -> None:
    """A conv output (activations) and a LUT output (featuremap_mlp) both leave as integers."""
    option = f"set_model_output_{dtype}"
    conv = run_model(tmp_path, name, calibration_parameters={"optimization": option})
    quantized = onnx.load(str(conv.paths["quantized"]))
    (out,) = quantized.graph.output
    elem = {"int8": onnx.TensorProto.INT8, "int16": onnx.TensorProto.INT16}[dtype]
    assert out.type.tensor_type.elem_type == elem, f"{option} must give an {dtype} output"
    x = heldout(conv.fm, seed=3)
    (q,) = outputs(conv, "quantized", x)
    assert q.dtype == np.dtype(dtype)
    (desc,) = read_bin(conv.paths["bin"]).models[0].outputs
    assert desc["dtype"] == dtype and len(desc["scale"]) == 1
    (c,) = outputs(conv, "calibrated", x)
    (deq,) = dequantized_outputs(conv, x)
    cos = cosine_similarity(c, deq)
    assert cos >= QUANT_COS, f"int8 output × scale vs calibrated cosine {cos:.6f} < {QUANT_COS}"


@pytest.mark.parametrize("form", ["node_info", "run_on_cpu"])
def test_node_placed_on_cpu(tmp_path: Path, form: str) -> None:
    target = "Conv_1"
    if form == "node_info":
        overrides = {"model_parameters": {"node_info": {target: {"ON": "CPU"}}}}
    else:
        overrides = {"calibration_parameters": {"run_on_cpu": target}}
    conv = run_model(tmp_path, "resnet_like", **overrides)
    partition = read_bin(conv.paths["bin"]).models[0].partition
    cpu = {c["name"]: c for c in partition["cpu_nodes"]}
    assert target in cpu and cpu[target]["type"] == "Conv"
    assert all(target not in s["nodes"] for s in partition["subgraphs"])
    quantized = onnx.load(str(conv.paths["quantized"]))
    node = next(n for n in quantized.graph.node if n.name == target)
    assert node.domain == "" and node.op_type == "Conv", "a CPU node stays a float Conv"
    assert re.search(rf"^{target}\s+CPU\s+--\s+Conv", conv.log_text(), re.M)
    x = heldout(conv.fm)
    c, q = outputs(conv, "calibrated", x)[0], outputs(conv, "quantized", x)[0]
    assert cosine_similarity(c, q) >= QUANT_COS


def test_int16_on_bernoulli2_falls_back_with_warning(tmp_path: Path) -> None:
    conv = run_model(tmp_path, "resnet_like", march="bernoulli2",
                     model_parameters={"node_info": {"Conv_1": {"InputType": "int16", "OutputType": "int16"}}})
    warned = [w for w in warnings(conv) if "Conv_1" in w and "int16" in w]
    assert warned, f"expected a WARNING naming Conv_1 and int16, got {warnings(conv)}"
    assert "Convert to runtime bin file successfully!" in conv.log_text()
    quantized = onnx.load(str(conv.paths["quantized"]))
    types = {attrs_of(n).get("out_type") for n in quantized.graph.node if n.domain == DOMAIN}
    assert "int16" not in types
    assert all(a["bits"] == 8 for a in calibration_nodes(onnx.load(str(conv.paths["calibrated"]))).values())
    # bernoulli2 takes NHWC input in the quantized model and the .bin.
    sess = conv.session("quantized")
    assert list(sess.get_inputs()[0].shape) == [1, 16, 16, 3]
    assert read_bin(conv.paths["bin"]).models[0].inputs[0]["layout"] == "NHWC"
    x = heldout(conv.fm)
    c, q = outputs(conv, "calibrated", x)[0], outputs(conv, "quantized", x)[0]
    assert cosine_similarity(c, q) >= QUANT_COS, f"quantized (NHWC) vs calibrated cosine < {QUANT_COS}"


def test_int16_node_on_bayes_e(tmp_path: Path) -> None:
    conv = run_model(tmp_path, "resnet_like",
                     model_parameters={"node_info": {"Conv_1": {"InputType": "int16", "OutputType": "int16"}}})
    assert not [w for w in warnings(conv) if "int16" in w]
    calibrated = onnx.load(str(conv.paths["calibrated"]))
    bits = {name: a["bits"] for name, a in calibration_nodes(calibrated).items()}
    assert bits["Relu_0_out_HzCalibration"] == 16, bits  # Conv_1's input
    assert bits["Conv_1_out_HzCalibration"] == 16, bits  # Conv_1's output
    quantized = onnx.load(str(conv.paths["quantized"]))
    conv1 = next(n for n in quantized.graph.node if n.name == "Conv_1")
    assert attrs_of(conv1)["x_bits"] == 16 and attrs_of(conv1)["out_type"] == "int16"


def test_int16_node_keeps_the_max_under_a_clipping_method(tmp_path: Path) -> None:
    """A node the user makes int16 keeps every value of the calibration data on its grid when the
    method clips (max_percentile): its thresholds are those of plain max, the int8 ones are clipped."""
    int16 = {"node_info": {"Conv_1": {"InputType": "int16", "OutputType": "int16"}}}
    clipped = run_model(tmp_path / "clipped", "resnet_like", model_parameters=int16,
                        calibration_parameters={"max_percentile": 0.99})
    plain = run_model(tmp_path / "plain", "resnet_like", model_parameters=int16)
    got, want = (calibration_nodes(onnx.load(str(c.paths["calibrated"]))) for c in (clipped, plain))
    for name in ("Relu_0_out_HzCalibration", "Conv_1_out_HzCalibration"):  # Conv_1's input and output
        assert got[name]["bits"] == 16 and got[name]["method"] == "max", got[name]
        assert got[name]["thresholds"] == pytest.approx(want[name]["thresholds"], rel=1e-6)
    eight = [n for n, a in got.items() if a["kind"] == "activation" and a["bits"] == 8]
    assert all(got[n]["thresholds"][0] <= want[n]["thresholds"][0] for n in eight)
    assert any(got[n]["thresholds"][0] < 0.9 * want[n]["thresholds"][0] for n in eight), "nothing was clipped"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_all_nodes_int16(tmp_path: Path, name: str) -> None:
    conv = run_model(tmp_path, name, calibration_parameters={"optimization": "set_all_nodes_int16"})
    calibrated = onnx.load(str(conv.paths["calibrated"]))
    assert all(a["bits"] == 16 for a in calibration_nodes(calibrated).values())
    x = heldout(conv.fm, seed=21)
    ref, cal, q = (outputs(conv, k, x) for k in ("optimized", "calibrated", "quantized"))
    for r, c, o in zip(ref, cal, q, strict=True):
        # Weights stay int8, so the float bound is the int8 one.
        assert cosine_similarity(r, c) >= CAL_COS, f"int16 calibrated vs float cosine < {CAL_COS}"
        assert cosine_similarity(c, o) >= QUANT_COS, (
            f"int16 quantized vs calibrated cosine {cosine_similarity(c, o):.6f} < {QUANT_COS}")
    low = {t: round(c, 6) for t, c in shared_float_tensors(conv, x).items() if c < QUANT_COS}
    assert not low, f"int16: float tensors with quantized vs calibrated cosine < {QUANT_COS}: {low}"


@pytest.mark.parametrize("name", ["resnet_like", "featuremap_mlp"])
def test_dump_calibration_data(tmp_path: Path, name: str) -> None:
    conv = run_model(tmp_path, name, model_parameters={"debug_mode": "dump_calibration_data"})
    fm = conv.fm
    (input_name,) = fm.inputs
    folder = conv.project.working_dir / "calibration_data" / input_name
    files = sorted(folder.glob("*.npy"), key=lambda p: int(p.stem))
    raw = sorted((conv.project.root / f"cal_{input_name}").iterdir())
    assert [p.name for p in files] == [f"{i}.npy" for i in range(len(raw))]
    calibrated = conv.session("calibrated")
    for f, r in zip(files, raw, strict=True):
        data = np.load(f)
        if input_name in fm.featuremap:
            assert data.dtype == np.float32
            assert np.array_equal(data, np.fromfile(r, np.float32).reshape(fm.inputs[input_name]))
        else:
            assert data.dtype == np.int8  # yuv444_128 / RGB_128: uint8 - 128
            expect = (np.fromfile(r, np.uint8).astype(np.int16) - 128).astype(np.int8)
            assert np.array_equal(data, expect.reshape(fm.inputs[input_name]))
        # Fed as loaded, no conversion: the same result as the uint8 data with offset 128.
        (direct,) = calibrated.run(None, {input_name: data})
        if input_name not in fm.featuremap:
            (via_uint8,) = calibrated.run(None, {input_name: np.fromfile(r, np.uint8).reshape(data.shape)})
            assert np.array_equal(direct, via_uint8)
        assert np.isfinite(direct).all()


def test_original_matches_source_with_inexact_mean_and_scale(tmp_path: Path) -> None:
    """With everyday values (123.675, 0.01712, ...) the folded preprocess rounds differently
    from (x - mean) * scale in the last float bit; the outputs still agree to 1e-5."""
    mean, scale = [123.675, 116.28, 103.53], [0.01712, 0.01751, 0.01743]
    conv = run_model(tmp_path, "resnet_like", input_parameters={
        "mean_value": " ".join(map(str, mean)), "scale_value": " ".join(map(str, scale))})
    x = heldout(conv.fm)
    m = np.array(mean, dtype=np.float32).reshape(1, 3, 1, 1)
    s = np.array(scale, dtype=np.float32).reshape(1, 3, 1, 1)
    (ref,) = HB_ONNXRuntime(onnx_model=conv.fm.model).run(None, {"data": (x["data"].astype(np.float32) - m) * s})
    (got,) = conv.session("original").run(None, x)
    rel = np.abs(got - ref).max() / np.abs(ref).max()
    assert rel <= 1e-5, f"original vs source: max abs diff / max abs = {rel:.3g} > 1e-5"


OLD_RESIZES = {  # name: (opset, op, mode, scales)
    "resize10_linear": (10, "Resize", "linear", [1, 1, 2, 2]),
    "resize10_nearest_up": (10, "Resize", "nearest", [1, 1, 3, 1.5]),
    "resize10_nearest_down": (10, "Resize", "nearest", [1, 1, 0.5, 0.75]),
    "upsample9_linear": (9, "Upsample", "linear", [1, 1, 2, 2]),
    "upsample9_nearest": (9, "Upsample", "nearest", [1, 1, 2, 3]),
}


@pytest.mark.parametrize("case", sorted(OLD_RESIZES))
def test_resize_of_old_opsets_keeps_its_meaning(tmp_path: Path, case: str) -> None:
    """Before opset 11 a Resize / Upsample maps output pixels to ``x / scale`` (torch's opset-10 bilinear
    export); converted to opset 11 with the new defaults it moved by half a pixel (cosine 0.87)."""
    opset, op, mode, scales = OLD_RESIZES[case]
    g = _Graph(5)
    c1 = g.op("Relu", [g.conv("data", 3, 4)])
    resized = g.op(op, [c1, g.const(np.array(scales, dtype=np.float32), "scales")], mode=mode)
    fm = g.model({"data": [1, 3, 12, 12]}, [g.conv(resized, 4, 2)], opset)
    conv = convert(make_project(tmp_path / case, fm))
    x = heldout(fm)
    (src,) = HB_ONNXRuntime(onnx_model=fm.model).run(None, source_feed(fm, x))
    (orig,) = outputs(conv, "original", x)
    assert src.shape == orig.shape
    assert np.abs(src - orig).max() <= 1e-5 * np.abs(src).max(), f"{case}: original vs source differ"
    (q,) = outputs(conv, "quantized", x)
    assert cosine_similarity(src, q) >= CAL_COS


@pytest.mark.parametrize("opset", [11, 21])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_other_opsets(tmp_path: Path, name: str, opset: int) -> None:
    fm = MODELS[name](opset=opset)
    conv = convert(make_project(tmp_path / name, fm))
    x = heldout(fm, seed=opset)
    for kind in ONNX_ARTEFACTS:
        onnx.checker.check_model(onnx.load(str(conv.paths[kind])), full_check=True)
    (src,) = HB_ONNXRuntime(onnx_model=fm.model).run(None, source_feed(fm, x))
    (orig,) = outputs(conv, "original", x)
    assert np.array_equal(src, orig), f"opset {opset}: original vs source differ by {np.abs(src - orig).max()}"
    (ref,), (cal,), (q,) = (outputs(conv, k, x) for k in ("optimized", "calibrated", "quantized"))
    assert cosine_similarity(ref, cal) >= CAL_COS, f"opset {opset}: calibrated vs float cosine < {CAL_COS}"
    assert cosine_similarity(cal, q) >= QUANT_COS, f"opset {opset}: quantized vs calibrated cosine < {QUANT_COS}"


@pytest.mark.parametrize("layout_rt", ["NCHW", "NHWC"])
def test_nhwc_trained_model_with_any_runtime_layout(tmp_path: Path, layout_rt: str) -> None:
    """A model trained on NHWC pictures (a TensorFlow export: a Transpose in front) converted for NCHW or NHWC
    data at run time; makertbin's similarity table fed the quantized model the wrong transpose and stopped with
    an internal error for NCHW."""
    g = _Graph(9)
    x = g.op("Transpose", ["data"], perm=[0, 3, 1, 2])
    fm = g.model({"data": [1, 12, 12, 3]}, [g.conv(g.op("Relu", [g.conv(x, 3, 4)]), 4, 2)])
    project = make_project(tmp_path / layout_rt, fm)
    project.write(input_parameters={"input_layout_train": "NHWC", "input_layout_rt": layout_rt,
                                    "input_shape": "1x12x12x3"})
    conv = convert(project)
    x = heldout(fm)
    (src,) = HB_ONNXRuntime(onnx_model=fm.model).run(None, {"data": (x["data"].astype(np.float32) -
                                                                      np.array(EXACT_MEAN, np.float32)) *
                                                           np.array(EXACT_SCALE, np.float32)})
    sess = conv.session("quantized")
    feed = x["data"] if layout_rt == "NHWC" else x["data"].transpose(0, 3, 1, 2)
    assert list(sess.get_inputs()[0].shape) == list(feed.shape)
    (q,) = sess.run(None, {"data": np.ascontiguousarray(feed)})
    assert cosine_similarity(src, q) >= CAL_COS


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_featuremap_input_with_a_norm_type_is_normalised(tmp_path: Path, layout: str) -> None:
    """A 4-D featuremap input may take norm_type (only other ranks are limited to no_preprocess); its mean
    and scale were dropped without a word and the converted model computed on raw data (cosine 0.96)."""
    g = _Graph(11)
    x = "feat" if layout == "NCHW" else g.op("Transpose", ["feat"], perm=[0, 3, 1, 2])
    shape = [1, 4, 8, 8] if layout == "NCHW" else [1, 8, 8, 4]
    fm = g.model({"feat": shape}, [g.conv(g.op("Relu", [g.conv(x, 4, 6)]), 6, 2)], featuremap={"feat"})
    project = make_project(tmp_path / layout, fm)
    mean, scale = [0.5, -1.0, 2.0, 0.25], [2.0, 0.5, 1.0, 4.0]
    project.write(input_parameters={"input_layout_train": layout, "input_shape": "x".join(map(str, shape)),
                                    "norm_type": "data_mean_and_scale", "mean_value": " ".join(map(str, mean)),
                                    "scale_value": " ".join(map(str, scale))})
    conv = convert(project)
    raw = heldout(fm)["feat"]
    axis = [1, -1, 1, 1] if layout == "NCHW" else [1, 1, 1, -1]
    normalised = (raw - np.array(mean, np.float32).reshape(axis)) * np.array(scale, np.float32).reshape(axis)
    (src,) = HB_ONNXRuntime(onnx_model=fm.model).run(None, {"feat": normalised.astype(np.float32)})
    (orig,) = outputs(conv, "original", {"feat": raw})
    assert np.abs(src - orig).max() <= 1e-5 * np.abs(src).max(), "original model vs source on normalised data"
    (q,) = outputs(conv, "quantized", {"feat": raw})
    assert cosine_similarity(src, q) >= CAL_COS


def test_input_batch_on_a_model_of_batch_two_stops_before_calibration(tmp_path: Path) -> None:
    """The .bin check found it only after calibration, naming a staging path and no fix."""
    from hbtools.errors import HbError

    g = _Graph(13)
    fm = g.model({"data": [2, 3, 8, 8]}, [g.conv(g.op("Relu", [g.conv("data", 3, 4)]), 4, 2)])
    project = make_project(tmp_path / "b2", fm)
    project.write(input_parameters={"input_batch": 4, "input_shape": None})  # the shape comes from the model
    with pytest.raises(HbError, match="input_batch 4 needs inputs of batch 1") as info:
        convert(project)
    assert "input_batch: 1" in info.value.hint
    assert not project.working_dir.exists() or not any(p.suffix == ".onnx" for p in project.working_dir.iterdir())
