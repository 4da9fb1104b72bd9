"""Forms of ONNX's own operator test cases (onnx.backend.test) that stopped the checker or makertbin with an
internal error or blamed a file hbtools wrote (hunt 11): each converts, or is one ERROR in the model's terms."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from conformance import INTERNAL, _cli, convert_featuremaps
from onnx import TensorProto, helper, numpy_helper

from hbtools.runtime import HB_ONNXRuntime
from hbtools.runtime.binfile import read_bin

F = TensorProto.FLOAT


def _model(nodes: list[onnx.NodeProto], inputs: list[tuple[str, int, list[int]]],
           outputs: list[tuple[str, int, list[int]]], initializers: list[onnx.TensorProto],
           opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "case", [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info(*o) for o in outputs], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _checker(root: Path, model: onnx.ModelProto, march: str = "bayes-e") -> tuple[int, str]:
    path = root / "checked.onnx"
    onnx.save(model, path)
    return _cli(["checker", "--model-type", "onnx", "--march", march, "--model", str(path)], root)


def _noisy(value: np.ndarray, rng: np.random.Generator, copies: int = 4) -> list[np.ndarray]:
    return [(value + 0.01 * rng.standard_normal(value.shape)).astype(value.dtype) for _ in range(copies)]


def _cpu_reasons(bin_path: Path) -> dict[str, str]:
    return {c["name"]: c["reason"] for c in read_bin(bin_path).models[0].partition["cpu_nodes"]}


def test_bidirectional_lstm_with_constant_weights_converts_for_x3(tmp_path: Path) -> None:
    """A CRNN recogniser's bidirectional LSTM on RDK X3: the two directions' input projections are small BPU
    subgraphs of equal work, one of which stays on the BPU. The quantize stage re-derives the partition on the
    calibrated model, whose nodes come in another order, and kept the other one: 'internal error: KeyError:
    LSTM_0_d0_w_3' (a weight the calibration plan never calibrated), in the checker and in makertbin."""
    steps, channels, hidden = 20, 32, 16
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)
             for name, shape, scale in (("W", (2, 4 * hidden, channels), channels ** -0.5),
                                        ("R", (2, 4 * hidden, hidden), hidden ** -0.5),
                                        ("B", (2, 8 * hidden), 0.1))]
    lstm = helper.make_node("LSTM", ["X", "W", "R", "B"], ["Y"], name="LSTM_0", hidden_size=hidden,
                            direction="bidirectional")
    model = _model([lstm], [("X", F, [steps, 1, channels])], [("Y", F, [steps, 2, 1, hidden])], inits, opset=11)
    model.ir_version = 6
    code, out = _checker(tmp_path, model, march="bernoulli2")
    assert INTERNAL not in out and code == 0, out[-3000:]
    x = rng.standard_normal((steps, 1, channels)).astype(np.float32)
    convert_featuremaps(tmp_path, model, {"X": [x, *_noisy(x, rng)]}, f"{steps}x1x{channels}", "float32", "m",
                        calibration_type="max", march="bernoulli2")
    want = HB_ONNXRuntime(onnx_model=model).run(None, {"X": x})[0]
    got = HB_ONNXRuntime(model_file=str(tmp_path / "out" / "m_quantized_model.onnx")).run(None, {"X": x})[0]
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 0.05 * np.abs(want).max()  # a few int8 steps of the state's range


def test_cpu_node_with_an_omitted_output_converts(tmp_path: Path) -> None:
    """An RNN exported without its Y (outputs ['', 'Y_h'], ONNX's test_simple_rnn_defaults) runs on the CPU. The
    node-similarity report asked onnxruntime for a tensor named '' and makertbin ended in 'internal error: ...
    GetMLDataType ... nullptr != type_proto'."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array((rng.standard_normal((1, 3, 2)) * 0.3).astype(np.float32), "W"),
             numpy_helper.from_array((rng.standard_normal((1, 3, 3)) * 0.3).astype(np.float32), "R")]
    rnn = helper.make_node("RNN", ["X", "W", "R"], ["", "Y_h"], name="rnn", hidden_size=3)
    model = _model([rnn], [("X", F, [4, 1, 2])], [("Y_h", F, [1, 1, 3])], inits)
    x = rng.standard_normal((4, 1, 2)).astype(np.float32)
    out = convert_featuremaps(tmp_path, model, {"X": [x, *_noisy(x, rng)]}, "4x1x2", "float32", "m",
                              calibration_type="max")
    assert "rnn" in out  # the node table lists it
    assert "rnn" in _cpu_reasons(tmp_path / "out" / "m.bin")
    want = HB_ONNXRuntime(onnx_model=model).run(None, {"X": x})[0]
    got = HB_ONNXRuntime(model_file=str(tmp_path / "out" / "m_quantized_model.onnx")).run(None, {"X": x})[0]
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_reduce_max_over_bool_stays_on_the_cpu(tmp_path: Path) -> None:
    """ReduceMax over a bool mask with constant axes (ONNX's test_reduce_max_bool_inputs, torch.any): it went to
    the BPU, which put a quantization (a Div) on the bool tensor: 'internal error: InvalidGraph'. It stays on the
    CPU with its reason, and the result is exact."""
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    nodes = [helper.make_node("ReduceMax", ["data", "axes"], ["r"], name="reduce", keepdims=1)]
    model = _model(nodes, [("data", TensorProto.BOOL, [4, 3])], [("r", TensorProto.BOOL, [4, 1])], [axes],
                   opset=20)
    model.ir_version = 9
    data = np.array([[1, 1, 1], [1, 0, 1], [0, 1, 0], [0, 0, 0]], bool)
    convert_featuremaps(tmp_path, model, {"data": [data, ~data]}, "4x3", "float32", "m", calibration_type="max")
    assert "bool values" in _cpu_reasons(tmp_path / "out" / "m.bin")["reduce"]
    got = HB_ONNXRuntime(model_file=str(tmp_path / "out" / "m_quantized_model.onnx")).run(None, {"data": data})[0]
    np.testing.assert_array_equal(got, data.max(axis=1, keepdims=True))


def test_model_folding_to_constants_is_refused_in_its_own_terms(tmp_path: Path) -> None:
    """A model whose only output is Shape(x) (ONNX's test_shape) folds to no node once its input shape is fixed.
    The checker passed it and makertbin said its own optimized model 'is not a readable ONNX model'; both now
    say the model computes nothing at run time."""
    model = _model([helper.make_node("Shape", ["x"], ["y"], name="shape")], [("x", F, [1, 3, 8, 8])],
                   [("y", TensorProto.INT64, [4])], [])
    code, out = _checker(tmp_path, model)
    assert code != 0 and "computes nothing at run time" in out and "'y'" in out, out[-3000:]
    onnx.save(model, tmp_path / "m.onnx")
    (tmp_path / "cal").mkdir()
    np.save(tmp_path / "cal" / "0.npy", np.zeros((1, 3, 8, 8), np.float32))
    (tmp_path / "config.yaml").write_text(
        "model_parameters: {onnx_model: m.onnx, march: bayes-e, working_dir: out, output_model_file_prefix: m}\n"
        "input_parameters: {input_type_train: featuremap, input_type_rt: featuremap, input_layout_train: NCHW, "
        "norm_type: no_preprocess}\n"
        "calibration_parameters: {cal_data_dir: cal, cal_data_type: float32, calibration_type: max}\n"
        "compiler_parameters: {optimize_level: O3}\n")
    code, out = _cli(["makertbin", "--config", "config.yaml", "--model-type", "onnx"], tmp_path)
    assert code != 0 and "computes nothing at run time" in out, out[-3000:]
    assert "optimized_float_model" not in out and "not a readable" not in out


def test_string_input_is_one_error_in_the_checker(tmp_path: Path) -> None:
    """StringConcat of two string inputs (ONNX's test_string_concat): the checker ended in 'internal error:
    TypeError: ufunc isfinite not supported'. Both tools now refuse the string input by name."""
    nodes = [helper.make_node("StringConcat", ["x", "y"], ["z"], name="concat")]
    strings = TensorProto.STRING
    model = _model(nodes, [("x", strings, [2]), ("y", strings, [2])], [("z", strings, [2])], [], opset=20)
    model.ir_version = 9
    code, out = _checker(tmp_path, model)
    assert code != 0 and INTERNAL not in out, out[-3000:]
    errors = [line for line in out.splitlines() if "ERROR" in line]
    assert len(errors) == 1 and "input 'x' is a string tensor" in errors[0], out[-3000:]


def test_string_output_beside_a_float_one_converts(tmp_path: Path) -> None:
    """A float model with a second output cast to strings: the calibration stage tested every output for NaN and
    ended in the same 'internal error: TypeError' (checker and makertbin); strings are not checked for NaN."""
    rng = np.random.default_rng(2)
    w = numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.2).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Cast", ["c"], ["s"], name="as_text", to=TensorProto.STRING)]
    model = _model(nodes, [("x", F, [1, 3, 8, 8])], [("c", F, [1, 4, 8, 8]), ("s", TensorProto.STRING, [1, 4, 8, 8])],
                   [w])
    code, out = _checker(tmp_path, model)
    assert INTERNAL not in out and code == 0, out[-3000:]
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    convert_featuremaps(tmp_path, model, {"x": [x, *_noisy(x, rng)]}, "1x3x8x8", "float32", "m",
                        calibration_type="max")
    assert (tmp_path / "out" / "m.bin").is_file()


def test_a_resize_to_sizes_given_at_run_time_says_so(tmp_path: Path) -> None:
    """A Resize whose sizes come from a model input stays on the CPU; its reason said it 'computes on int64
    values', though it resizes float data (hunt 14a D8)."""
    nodes = [helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="resize", mode="nearest")]
    model = _model(nodes, [("x", F, [1, 2, 4, 4]), ("sizes", TensorProto.INT64, [4])], [("y", F, None)], [],
                   opset=13)
    x = np.random.default_rng(0).standard_normal((1, 2, 4, 4)).astype(np.float32)
    convert_featuremaps(tmp_path, model, {"x": [x, x * 2], "sizes": [np.array([1, 2, 8, 8], np.int64)] * 2},
                        "1x2x4x4;4", "float32;int64", "m", calibration_type="max")
    reason = _cpu_reasons(tmp_path / "out" / "m.bin")["resize"]
    assert reason == "Resize takes its int64 input 'sizes' at run time; the BPU needs it constant", reason
