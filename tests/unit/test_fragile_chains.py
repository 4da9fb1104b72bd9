"""A log of a power computed in the model: the WARNING names the chain to keep in float.

Found on basic-pitch and openwakeword's melspectrogram (PyPI): even every activation in int16 left the output
far from float (quiet spectrum bins fall on 0, and their log is tens of dB off). The WARNING said to find the
nodes with hmct-debugger, a 3-14 minute round trip; putting the power -> log chain on the CPU
(run_on_cpu) brought the spectrum within 1.6 dB. The chain is now named in the WARNING.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from conformance import convert_featuremaps
from onnx import TensorProto, helper, numpy_helper

from hbtools.quant.fragile import fragile_nodes


def _log_power(divide_by_range: bool = False) -> onnx.ModelProto:
    """Conv (the STFT) -> square -> + eps -> Log; optionally a Conv and a division by the log's range after."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((16, 1, 8, 1)) * 0.3).astype(np.float32), "w"),
             numpy_helper.from_array(np.array(1e-10, np.float32), "eps"),
             numpy_helper.from_array((rng.standard_normal((4, 16, 1, 1)) * 0.2).astype(np.float32), "w2")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["stft"], name="stft", strides=[4, 1]),
             helper.make_node("Mul", ["stft", "stft"], ["power"], name="square"),
             helper.make_node("Add", ["power", "eps"], ["floored"], name="floor"),
             helper.make_node("Log", ["floored"], ["db"], name="log")]
    if divide_by_range:  # the range of a log spectrum: no squaring before it, not such a chain
        nodes += [helper.make_node("Conv", ["db", "w2"], ["y"], name="head"),
                  helper.make_node("ReduceMax", ["db"], ["top"], name="top", keepdims=1),
                  helper.make_node("Div", ["y", "top"], ["z"], name="by_range")]
    out = "z" if divide_by_range else "db"
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 256, 1])],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def test_the_chain_runs_from_the_squaring_to_the_log() -> None:
    model = _log_power(divide_by_range=True)
    every = {o for n in model.graph.node for o in n.output}
    assert fragile_nodes(model, every) == ["square", "floor", "log"]  # not the division by the log's range
    assert fragile_nodes(model, {"z"}) == []  # nothing of the chain on a grid: nothing to say


def test_the_warning_names_the_chain_as_a_yaml_list(tmp_path: Path) -> None:
    """Audio spanning 80 dB: the quiet part's power falls below an int16 step of the loud part's."""
    rng = np.random.default_rng(1)
    samples = []
    for _ in range(4):
        loud = rng.standard_normal((1, 1, 128, 1)) * 10.0
        quiet = rng.standard_normal((1, 1, 128, 1)) * 10.0 ** rng.uniform(-6, -2, (1, 1, 128, 1))
        samples.append(np.concatenate([loud, quiet], axis=2).astype(np.float32))
    out = convert_featuremaps(tmp_path, _log_power(), {"x": samples}, "1x1x256x1", "float32", "m")
    warnings = [line for line in out.splitlines() if "WARNING even with every activation int16" in line]
    assert warnings, out[-3000:]
    assert "keep it in float with run_on_cpu: ['square', 'floor', 'log']" in warnings[0], warnings[0]


def test_a_log_mel_chain_takes_the_filterbank_and_the_users_names(tmp_path: Path) -> None:
    """A mel filterbank (a 1x1 Conv whose bias holds the 1e-10 floor) between the power and its log: the chain
    stopped at that Conv and named the log alone, and the log on the CPU then read exact zeros (-inf in half the
    output). A division the optimize stage writes as a Reciprocal and a Mul was named 'divide_reciprocal', a
    name run_on_cpu refuses (hunt 14a D1, D2)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((16, 1, 8, 1)) * 0.3).astype(np.float32), "w"),
             numpy_helper.from_array((np.abs(rng.standard_normal((8, 16, 1, 1))) * 0.2).astype(np.float32), "mel_w"),
             numpy_helper.from_array(np.full(8, 1e-10, np.float32), "floor"),
             numpy_helper.from_array(np.array(1e-10, np.float32), "eps")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["stft"], name="stft", strides=[4, 1]),
             helper.make_node("Mul", ["stft", "stft"], ["power"], name="square"),
             helper.make_node("Conv", ["power", "mel_w", "floor"], ["mel"], name="mel"),
             helper.make_node("Log", ["mel"], ["db"], name="log"),
             helper.make_node("Add", ["power", "eps"], ["p"], name="add_eps"),
             helper.make_node("Div", ["stft", "p"], ["ratio"], name="divide")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 256, 1])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("db", "ratio")],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    every = {o for n in model.graph.node for o in n.output}
    assert fragile_nodes(model, every) == ["square", "mel", "log", "add_eps", "divide"]
    samples = []
    for _ in range(4):
        quiet = rng.standard_normal((1, 1, 128, 1)) * 10.0 ** rng.uniform(-6, -2, (1, 1, 128, 1))
        samples.append(np.concatenate([rng.standard_normal((1, 1, 128, 1)) * 10.0, quiet], axis=2).astype(np.float32))
    out = convert_featuremaps(tmp_path, model, {"x": samples}, "1x1x256x1", "float32", "m")
    [warning] = [line for line in out.splitlines() if "WARNING even with every activation int16" in line]
    assert "run_on_cpu: ['square', 'mel', 'log', 'add_eps', 'divide']" in warning, warning


def test_a_normalisation_is_no_such_chain() -> None:
    """An L2 normalisation of an embedding (x / sqrt(sum(x * x)), F.normalize written as ONNX ops, and the same as
    a reciprocal and a product) divides by a root of its own squares: the quotient is bounded. The WARNING named
    it (Resemblyzer's speaker encoder: run_on_cpu: ['/ReduceL2', '/Div'], which changed nothing; hunt 15 D1)."""
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array((rng.standard_normal((16, 4, 1, 1)) * 0.3).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([1], np.int64), "axes"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    for form in ("div", "reciprocal", "pow"):
        root = helper.make_node("Pow", ["sum", "half"], ["norm"], name="norm") if form == "pow" else \
            helper.make_node("Sqrt", ["sum"], ["norm"], name="norm")
        tail = [helper.make_node("Reciprocal", ["norm"], ["inv"], name="inverse"),
                helper.make_node("Mul", ["emb", "inv"], ["y"], name="divide")] if form == "reciprocal" else \
            [helper.make_node("Div", ["emb", "norm"], ["y"], name="divide")]
        nodes = [helper.make_node("Conv", ["x", "w"], ["emb"], name="embed"),
                 helper.make_node("Mul", ["emb", "emb"], ["sq"], name="square"),
                 helper.make_node("ReduceSum", ["sq", "axes"], ["sum"], name="sum", keepdims=1), root, *tail]
        graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 1, 1])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        assert fragile_nodes(model, {o for n in model.graph.node for o in n.output}) == [], form


def test_the_advice_names_an_unrolled_recurrence() -> None:
    """Resemblyzer's speaker encoder (a 64-step LSTM, unrolled onto the BPU): every activation int16 left its
    embeddings at cosine 0.97, and the WARNING named no node, or a normalisation that changed nothing. With the
    layer on the CPU the embeddings reached 0.9994 (hunt 15 D1): the WARNING names the layer by its own name."""
    from hbtools.pipeline import optimize
    from hbtools.quant.fragile import float_advice

    steps, channels, hidden = 8, 6, 5
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array((rng.standard_normal(shape) * 0.4).astype(np.float32), name)
             for name, shape in (("W", (1, 4 * hidden, channels)), ("R", (1, 4 * hidden, hidden)))]
    lstm = helper.make_node("LSTM", ["x", "W", "R"], ["y", "h"], name="speaker_lstm", hidden_size=hidden)
    graph = helper.make_graph([lstm], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [steps, 1, channels])],
                              [helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, 1, hidden])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    optimized = optimize.run(model)
    assert not any(n.op_type == "LSTM" for n in optimized.graph.node)
    every = {o for n in optimized.graph.node for o in n.output}
    for weights in (False, True):
        advice = float_advice(optimized, every, weights)
        assert advice.endswith("the recurrence unrolled over its time steps (its int8 weights' error comes back at "
                               "every step); keep it in float with run_on_cpu: ['speaker_lstm']"), advice
    assert float_advice(optimize.run(_log_power()), {"db"}) == (" Here that is most likely this chain from a "
                                                                "squaring to a log, division or root; keep it in "
                                                                "float with run_on_cpu: ['square', 'floor', 'log']")


def _linear_attention() -> onnx.ModelProto:
    """EfficientViT's LiteMLA normalisation in small: ReLU(q) divided by a sum of ReLU(k) over the channels + eps
    (k's weights come in opposite pairs, so the sum is one of absolute values, never 0), a ratio that keeps no
    scale of the input, as a Div of two tensors the optimize stage writes as a product with a reciprocal table;
    a Conv after."""
    rng = np.random.default_rng(5)
    wk = rng.standard_normal((8, 3, 3, 3)) * 0.3
    inits = [numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "wq"),
             numpy_helper.from_array(np.concatenate([wk, -wk]).astype(np.float32), "wk"),
             numpy_helper.from_array(np.array([1], np.int64), "channels"),
             numpy_helper.from_array(np.array(1e-15, np.float32), "eps"),
             numpy_helper.from_array((rng.standard_normal((4, 8, 1, 1)) * 0.3).astype(np.float32), "wo")]
    nodes = [helper.make_node("Conv", ["x", "wq"], ["q0"], name="/attn/q", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["q0"], ["q"], name="/attn/q_relu"),
             helper.make_node("Conv", ["x", "wk"], ["k0"], name="/attn/k", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["k0"], ["k"], name="/attn/k_relu"),
             helper.make_node("ReduceSum", ["k", "channels"], ["total"], name="/attn/sum", keepdims=1),
             helper.make_node("Add", ["total", "eps"], ["den"], name="/attn/Add"),
             helper.make_node("Div", ["q", "den"], ["ratio"], name="/attn/Div"),
             helper.make_node("Conv", ["ratio", "wo"], ["y"], name="/proj")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def test_the_warning_names_the_divisions_through_a_reciprocal_table(tmp_path: Path) -> None:
    """EfficientViT's linear attention divides by sums spanning 0.1 to 4000 across the samples, which no int16
    reciprocal table holds: every activation int16 left the output at cosine 0.965, and the WARNING sent the user
    to hmct-debugger, though the optimize stage knew which Divs it wrote with a reciprocal table (keeping those 4
    in float gave 0.995; hunt 26 D3). No squaring precedes the divisor: no log / division chain. Here the sum
    spans 0.2 to 3800, and the input 0.05 to 200, which int16 holds. The weights are not to blame: the int8
    weights' cosine the WARNING compares with is the one of the weights as kept (a split conv's remainder with
    them), not the 0.979 before the split."""
    rng = np.random.default_rng(6)
    samples = [(rng.standard_normal((1, 3, 8, 8)) * scale).astype(np.float32) for scale in np.geomspace(0.05, 200, 8)]
    model = _linear_attention()
    for folder in ("bpu", "cpu"):
        (tmp_path / folder).mkdir()
    out = convert_featuremaps(tmp_path / "bpu", model, {"x": samples}, "1x3x8x8", "float32", "m")
    assert "1 Divs of two tensors written as a product with an int16 reciprocal table" in out, out[-3000:]
    [warning] = [line for line in out.splitlines() if "WARNING even with every activation int16" in line]
    assert "this division, computed through a reciprocal lookup table" in warning, warning
    assert warning.endswith("keep it in float with run_on_cpu: ['/attn/Div']"), warning
    # the advice holds: with that Div in float the output is near float
    out = convert_featuremaps(tmp_path / "cpu", model, {"x": samples}, "1x3x8x8", "float32", "m",
                              calibration={"run_on_cpu": "/attn/Div"})
    assert "WARNING even with every activation int16" not in out, out[-3000:]


def test_a_magnitude_of_squares_no_division_reads_is_a_chain() -> None:
    """silero-vad's STFT magnitude, sqrt(re * re + im * im) read by convolutions: the squares span twice the decades
    of the frames' loudness, and 12 % of its voice decisions flipped on int16 grids, none with the four nodes in
    float; the WARNING named nothing (hunt 32 D1). A root a division reads stays the division's to judge."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((4, 1, 8, 1)) * 0.3).astype(np.float32), n)
             for n in ("w_re", "w_im", "w_out")]
    inits[2] = numpy_helper.from_array((rng.standard_normal((2, 4, 1, 1)) * 0.3).astype(np.float32), "w_out")
    nodes = [helper.make_node("Conv", ["x", "w_re"], ["re"], name="re", strides=[4, 1]),
             helper.make_node("Conv", ["x", "w_im"], ["im"], name="im", strides=[4, 1]),
             helper.make_node("Mul", ["re", "re"], ["re2"], name="square_re"),
             helper.make_node("Mul", ["im", "im"], ["im2"], name="square_im"),
             helper.make_node("Add", ["re2", "im2"], ["power"], name="add"),
             helper.make_node("Sqrt", ["power"], ["magnitude"], name="sqrt"),
             helper.make_node("Conv", ["magnitude", "w_out"], ["y"], name="out")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 256, 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    every = {o for n in model.graph.node for o in n.output}
    assert fragile_nodes(model, every) == ["square_re", "square_im", "add", "sqrt"]
    normalised = helper.make_model(helper.make_graph(
        [*nodes[:6], helper.make_node("Div", ["re", "magnitude"], ["y"], name="divide")], "g",
        list(graph.input), [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits[:2]),
        opset_imports=[helper.make_opsetid("", 13)])
    assert "sqrt" not in fragile_nodes(normalised, every)  # re / |z|: bounded, judged as the division
