"""calibration_type load: thresholds come from a QAT model's QuantizeLinear scales."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from hbtools.debug import get_sensitivity_of_nodes
from hbtools.errors import HbError
from hbtools.log import setup
from hbtools.pipeline.runner import makertbin
from hbtools.quant.qdq import strip_qdq
from hbtools.runtime import HB_ONNXRuntime
from hbtools.runtime.binfile import read_bin


def _run_qdq(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """What a QDQ model means: each pair and op as written, in float. onnxruntime's optimizations would
    fuse the pairs into its integer kernels, whose u8 x s8 sums saturate on x86 without VNNI."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]

ACT_SCALE = 0.05


def _qdq_model(output_pair: bool = False) -> onnx.ModelProto:
    """feat -> Q/DQ -> Conv (weight through a DequantizeLinear) -> y; ``output_pair``: the Conv's output passes
    a last Q/DQ pair that ends in the model output y (a QAT export with its output quantized)."""
    rng = np.random.default_rng(0)
    w_q = rng.integers(-127, 128, size=(4, 2, 3, 3)).astype(np.int8)
    w_scale = np.full(4, 0.01, dtype=np.float32)
    inits = [
        numpy_helper.from_array(np.array(ACT_SCALE, np.float32), "s"),
        numpy_helper.from_array(np.array(0, np.int8), "zp"),
        numpy_helper.from_array(w_q, "w_q"),
        numpy_helper.from_array(w_scale, "w_s"),
        numpy_helper.from_array(np.zeros(4, np.int8), "w_zp"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["feat", "s", "zp"], ["feat_q"], name="q0"),
        helper.make_node("DequantizeLinear", ["feat_q", "s", "zp"], ["feat_dq"], name="dq0"),
        helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_zp"], ["w"], name="dqw", axis=0),
        helper.make_node("Conv", ["feat_dq", "w"], ["y0" if output_pair else "y"], name="conv0", pads=[1, 1, 1, 1]),
    ]
    if output_pair:
        nodes += [helper.make_node("QuantizeLinear", ["y0", "s", "zp"], ["y_q"], name="q1"),
                  helper.make_node("DequantizeLinear", ["y_q", "s", "zp"], ["y"], name="dq1")]
    graph = helper.make_graph(nodes, "qat", [helper.make_tensor_value_info("feat", TensorProto.FLOAT, [1, 2, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _config(tmp_path: Path, calibration_type: str = "load") -> Path:
    config = {
        "model_parameters": {"onnx_model": "qat.onnx", "march": "bayes-e", "working_dir": "out",
                             "output_model_file_prefix": "qat"},
        "input_parameters": {"input_type_train": "featuremap", "input_layout_train": "NCHW",
                             "input_type_rt": "featuremap", "norm_type": "no_preprocess"},
        "calibration_parameters": {"calibration_type": calibration_type},
        "compiler_parameters": {"optimize_level": "O3"},
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    return tmp_path / "c.yaml"


def test_load_takes_thresholds_from_quantize_linear(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    setup(None)
    onnx.save(_qdq_model(), str(tmp_path / "qat.onnx"))
    paths = makertbin(_config(tmp_path), "onnx")

    calibrated = onnx.load(str(paths["calibrated"]))
    ops = {n.op_type for n in calibrated.graph.node}
    assert not ops & {"QuantizeLinear", "DequantizeLinear"}, "the QDQ pairs must be removed"
    node = next(n for n in calibrated.graph.node if n.name == "feat_HzCalibration")
    thresholds = next(helper.get_attribute_value(a) for a in node.attribute if a.name == "thresholds")
    assert np.isclose(thresholds[0], ACT_SCALE * 127), f"threshold {thresholds[0]} is not scale*127"

    x = (np.random.default_rng(1).standard_normal((1, 2, 8, 8)) * 2).astype(np.float32)
    qat = _run_qdq(_qdq_model(), {"feat": x})
    quant = HB_ONNXRuntime(model_file=paths["quantized"]).run_feature(None, {"feat": x})[0]
    # The QAT model already rounds like the quantized model does: they agree closely.
    assert np.abs(qat - quant).max() <= 0.02 * np.abs(qat).max()


def test_load_keeps_the_name_of_an_output_a_last_pair_ends_in(tmp_path: Path, monkeypatch) -> None:
    """The model output y comes out of a last Q/DQ pair: every artefact and the .bin still call it y (not the
    name of the tensor the pair quantized), and it computes what the QAT model computes before that pair."""
    monkeypatch.chdir(tmp_path)
    setup(None)
    onnx.save(_qdq_model(output_pair=True), str(tmp_path / "qat.onnx"))
    paths = makertbin(_config(tmp_path), "onnx")
    for kind in ("original", "optimized", "calibrated", "quantized"):
        assert [o.name for o in onnx.load(str(paths[kind])).graph.output] == ["y"], kind
    assert [d["name"] for d in read_bin(paths["bin"]).models[0].outputs] == ["y"]
    x = (np.random.default_rng(1).standard_normal((1, 2, 8, 8)) * 2).astype(np.float32)
    qat = _run_qdq(_qdq_model(), {"feat": x})
    quant = HB_ONNXRuntime(model_file=paths["quantized"]).run_feature(["y"], {"feat": x})[0]
    assert np.abs(qat - quant).max() <= 0.02 * np.abs(qat).max()


@pytest.mark.parametrize("scale", [-0.01, 0.0, float("nan"), float("inf")])
def test_load_refuses_an_activation_scale_that_is_no_positive_number(scale: float, tmp_path: Path, monkeypatch) -> None:
    """hunt 38 D3: a negative scale stopped with 'internal error: OverflowError'; zero, NaN and infinity converted with
    a made-up grid (SPEC §10: a zero scale is an ERROR of its own)."""
    monkeypatch.chdir(tmp_path)
    setup(None)
    model = _qdq_model()
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.array(scale, np.float32), "s"))
    onnx.save(model, str(tmp_path / "qat.onnx"))
    with pytest.raises(HbError, match=r"pair on 'feat' \(dq0\) has scale .*positive, finite number"):
        makertbin(_config(tmp_path), "onnx")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").glob("*.onnx"))


def test_a_qdq_model_converted_without_load_is_told_to_use_load(tmp_path: Path, monkeypatch, capsys) -> None:
    """Without load the Q/DQ pairs and the conv they feed run on the CPU; the run says the model is already
    quantized and that calibration_type load converts it."""
    monkeypatch.chdir(tmp_path)
    setup(None)
    onnx.save(_qdq_model(), str(tmp_path / "qat.onnx"))
    makertbin(_config(tmp_path, "skip"), "onnx")
    warnings = [line for line in capsys.readouterr().out.splitlines() if " WARNING " in line]
    assert any("already quantized" in w and "calibration_type: 'load'" in w for w in warnings), warnings


def test_a_model_quantized_by_onnxruntime_converts_on_the_cpu_and_is_told_to_start_from_float(
        tmp_path: Path, monkeypatch, capsys) -> None:
    """quantize_dynamic's integer operators (DynamicQuantizeLinear, ConvInteger) have no BPU form: the model still
    converts, computing what onnxruntime computes, and one WARNING names them and says to convert the float model."""
    from onnxruntime.quantization import quantize_dynamic

    monkeypatch.chdir(tmp_path)
    setup(None)
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((4, 2, 3, 3)) * 0.3).astype(np.float32), "w"),
             numpy_helper.from_array((rng.standard_normal((4, 4, 1, 1)) * 0.3).astype(np.float32), "w2")]
    nodes = [helper.make_node("Conv", ["feat", "w"], ["c"], name="conv0", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu0"),
             helper.make_node("Conv", ["r", "w2"], ["y"], name="conv1")]
    graph = helper.make_graph(nodes, "f", [helper.make_tensor_value_info("feat", TensorProto.FLOAT, [1, 2, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "float.onnx"))
    quantize_dynamic(str(tmp_path / "float.onnx"), str(tmp_path / "qat.onnx"), op_types_to_quantize=["Conv"])
    assert any(n.op_type == "ConvInteger" for n in onnx.load(str(tmp_path / "qat.onnx")).graph.node)

    paths = makertbin(_config(tmp_path, "skip"), "onnx")
    warnings = [line for line in capsys.readouterr().out.splitlines() if " WARNING " in line]
    assert any("already quantized by onnxruntime" in w and "ConvInteger" in w and "float model" in w
               for w in warnings), warnings
    x = (rng.standard_normal((1, 2, 8, 8)) * 2).astype(np.float32)
    source = HB_ONNXRuntime(model_file=str(tmp_path / "qat.onnx")).run_feature(None, {"feat": x})[0]
    quant = HB_ONNXRuntime(model_file=paths["quantized"]).run_feature(None, {"feat": x})[0]
    assert np.allclose(quant, source, atol=1e-5), np.abs(quant - source).max()
    # load reads QDQ pairs: it names what this model holds instead, not 'use another calibration_type for a float
    # model' (hunt 37 D2)
    with pytest.raises(HbError, match=r"integer operators instead \(.*ConvInteger") as refused:
        makertbin(_config(tmp_path, "load"), "onnx")
    assert "before quantize_dynamic" in refused.value.hint


def _uint8_qdq_model() -> onnx.ModelProto:
    """The form onnxruntime's quantize_static (QDQ) writes: uint8 activations with a zero point (the input's pair,
    range [-1, 3]), an int8 per-channel weight and an int32 bias through DequantizeLinear, and a last pair with
    no zero point at all (ONNX's default: uint8 0, range [0, 255 * scale]) where the float model had a Relu: the
    quantizer drops a Relu before such a pair, which clips at 0 in its place."""
    rng = np.random.default_rng(0)
    s_in = np.float32(4.0 / 255)
    w_s = np.full(4, 0.004, np.float32)
    inits = [
        numpy_helper.from_array(np.array(s_in, np.float32), "s_in"),
        numpy_helper.from_array(np.array(64, np.uint8), "z_in"),
        numpy_helper.from_array(rng.integers(-127, 128, size=(4, 2, 3, 3)).astype(np.int8), "w_q"),
        numpy_helper.from_array(w_s, "w_s"),
        numpy_helper.from_array(np.zeros(4, np.int8), "w_zp"),
        numpy_helper.from_array(rng.integers(-500, 500, size=4).astype(np.int32), "b_q"),
        numpy_helper.from_array(w_s * s_in, "b_s"),
        numpy_helper.from_array(np.array(0.05, np.float32), "s_out"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["feat", "s_in", "z_in"], ["feat_q"], name="q0"),
        helper.make_node("DequantizeLinear", ["feat_q", "s_in", "z_in"], ["feat_dq"], name="dq0"),
        helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_zp"], ["w"], name="dqw", axis=0),
        helper.make_node("DequantizeLinear", ["b_q", "b_s"], ["b"], name="dqb", axis=0),
        helper.make_node("Conv", ["feat_dq", "w", "b"], ["c"], name="conv0", pads=[1, 1, 1, 1]),
        helper.make_node("QuantizeLinear", ["c", "s_out"], ["r_q"], name="q1"),
        helper.make_node("DequantizeLinear", ["r_q", "s_out"], ["y"], name="dq1"),
    ]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("feat", TensorProto.FLOAT, [1, 2, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def test_load_converts_onnxruntime_uint8_pairs_without_clipping_their_range(tmp_path: Path, monkeypatch,
                                                                            capsys) -> None:
    """A pair on a uint8 grid with a zero point (or none: uint8 0) has no symmetric int8 form. load used to stop
    with an ERROR; now each such pair's threshold is the larger end of the range it clips to: 191 steps above the
    input's zero point, 255 steps of the last pair (12.75), and a Clip to the range takes its place. The quantized
    model computes what the QDQ model computes, the last pair's clipping at 0 (the dropped Relu) included."""
    monkeypatch.chdir(tmp_path)
    setup(None)
    onnx.save(_uint8_qdq_model(), str(tmp_path / "qat.onnx"))
    paths = makertbin(_config(tmp_path), "onnx")
    assert any("asymmetric or unsigned grid" in line for line in capsys.readouterr().out.splitlines())

    calibrated = onnx.load(str(paths["calibrated"]))
    assert not {n.op_type for n in calibrated.graph.node} & {"QuantizeLinear", "DequantizeLinear"}
    thresholds = {}
    for n in calibrated.graph.node:
        if n.op_type == "HzCalibration":
            thresholds[n.input[0]] = next(helper.get_attribute_value(a)[0] for a in n.attribute
                                          if a.name == "thresholds")
    assert np.isclose(thresholds["feat"], 191 * 4.0 / 255, rtol=1e-5), thresholds
    loaded = strip_qdq(_uint8_qdq_model())
    assert np.isclose(loaded["feat"], 191 * 4.0 / 255, rtol=1e-5) and np.isclose(loaded["y"], 255 * 0.05), loaded

    x = np.random.default_rng(1).uniform(-1, 3, (1, 2, 8, 8)).astype(np.float32)
    qdq = _run_qdq(_uint8_qdq_model(), {"feat": x})
    quant = HB_ONNXRuntime(model_file=paths["quantized"]).run_feature(None, {"feat": x})[0]
    assert (qdq == 0).mean() > 0.2 and quant.min() >= 0, "the last pair clips at 0"
    assert np.abs(qdq - quant).max() <= 0.03 * np.abs(qdq).max(), np.abs(qdq - quant).max() / np.abs(qdq).max()


def test_load_calibrates_the_tensors_without_a_pair_on_the_given_data(tmp_path: Path, monkeypatch) -> None:
    """A QDQ model whose float input is normalized before its first pair (the pair sits on the normalized tensor):
    the input has no QuantizeLinear, so load takes its threshold from calibration samples. With cal_data_dir
    given they are the user's (values up to 200), not N(0, 1) random data that clipped the input at about 4."""
    monkeypatch.chdir(tmp_path)
    setup(None)
    model = _qdq_model()
    model.graph.initializer.append(numpy_helper.from_array(np.array(0.01, np.float32), "norm"))
    model.graph.node.insert(0, helper.make_node("Mul", ["raw", "norm"], ["feat"], name="normalize"))
    model.graph.input[0].name = "raw"
    onnx.save(model, str(tmp_path / "qat.onnx"))
    rng = np.random.default_rng(2)
    (tmp_path / "cal").mkdir()
    for k in range(8):
        rng.uniform(0, 200, (1, 2, 8, 8)).astype(np.float32).tofile(tmp_path / "cal" / f"{k}.bin")
    config = yaml.safe_load(_config(tmp_path).read_text())
    config["calibration_parameters"].update(cal_data_dir="cal", cal_data_type="float32")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    paths = makertbin(tmp_path / "c.yaml", "onnx")

    x = rng.uniform(0, 200, (1, 2, 8, 8)).astype(np.float32)
    qat = _run_qdq(model, {"raw": x})
    quant = HB_ONNXRuntime(model_file=paths["quantized"]).run_feature(None, {"raw": x})[0]
    assert np.abs(qat - quant).max() <= 0.03 * np.abs(qat).max(), np.abs(qat - quant).max() / np.abs(qat).max()


def test_debugger_says_the_weights_of_a_loaded_qdq_model_are_already_quantized(tmp_path: Path, monkeypatch,
                                                                               capsys) -> None:
    """calibration_type load: the float reference already holds the dequantized weights, so every weight
    sensitivity is about 1 - 1e-14 and nothing said why (hunt 13 N9). A float model's weights are not named."""
    monkeypatch.chdir(tmp_path)
    setup(None)
    onnx.save(_qdq_model(), str(tmp_path / "qat.onnx"))
    paths = makertbin(_config(tmp_path), "onnx")
    rng = np.random.default_rng(2)
    samples = {"feat": [rng.standard_normal((1, 2, 8, 8)).astype(np.float32) for _ in range(2)]}
    capsys.readouterr()
    table = get_sensitivity_of_nodes(str(paths["calibrated"]), calibrated_data=samples, node_type="weight")
    out = capsys.readouterr().out
    assert all(float(v["cosine-similarity"]) > 1 - 1e-6 for v in table.values()), table
    [warning] = [line for line in out.splitlines() if " WARNING " in line]
    assert "1 of 1 weight node(s)" in warning and "already int8 values times their scales" in warning, warning
    assert "calibration_type load" in warning, warning

    floats = _qdq_model()
    strip_qdq(floats)  # the same model in float, with weights on no grid
    floats.graph.initializer[0].CopyFrom(numpy_helper.from_array(
        rng.standard_normal((4, 2, 3, 3)).astype(np.float32) * 0.3, "w"))
    onnx.save(floats, str(tmp_path / "qat.onnx"))
    paths = makertbin(_config(tmp_path, "skip"), "onnx")
    capsys.readouterr()
    get_sensitivity_of_nodes(str(paths["calibrated"]), calibrated_data=samples, node_type="weight")
    assert " WARNING " not in capsys.readouterr().out
