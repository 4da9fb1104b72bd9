"""The optimize stage's rewrites compute what the exported graph computes (float32 rounding apart).

Each rewrite puts an exporter's form into one the BPU takes; here the original and the
optimized model run in onnxruntime on the same random input, over the forms' variants.
"""

from __future__ import annotations

import copy
import itertools
import logging
import re

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from hbtools.pipeline import optimize


def _run(model, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _pool_model(size: int, k: int, s: int, begin: int, end: int, ceil: int, include: int, opset: int,
                dilation: int = 1):
    dilated = {"dilations": [dilation, dilation]} if dilation > 1 else {}
    node = helper.make_node("AveragePool", ["x"], ["y"], name="pool", kernel_shape=[k, k], strides=[s, s],
                            pads=[begin, begin, end, end], ceil_mode=ceil, count_include_pad=include, **dilated)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                          [1, 2, size, size + 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("opset", [11, 19])
def test_average_pools_over_whole_windows_compute_the_same(opset: int) -> None:
    """count_include_pad=0 with padding and ceil_mode windows hanging over the end become a pool of
    whole windows times a constant map, dilated pools (opset 19) too; every variant gives onnxruntime's
    values and shape, and no pool is left with a divisor that depends on the position (but a dilated
    ceil_mode pool whose whole windows need more end padding than onnxruntime takes: a pad of the kernel's
    size)."""
    rng = np.random.default_rng(3)
    rewritten = kept = 0
    for size, k, s, begin, end, ceil, include, dilation in itertools.product(
            (7, 8), (2, 3), (1, 2, 3), (0, 1), (0, 1), (0, 1), (0, 1), (1, 2) if opset >= 19 else (1,)):
        if k <= max(begin, end):
            continue
        model = _pool_model(size, k, s, begin, end, ceil, include, opset, dilation)
        x = rng.standard_normal((1, 2, size, size + 1)).astype(np.float32)
        want = _run(model, x)
        optimized = optimize.run(model)
        got = _run(optimized, x)
        case = (size, k, s, begin, end, ceil, include, dilation)
        assert got.shape == want.shape, case
        np.testing.assert_allclose(got, want, atol=1e-5, err_msg=str(case))
        for node in optimized.graph.node:
            if node.op_type == "AveragePool":
                a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
                if dilation > 1 and ceil and a.get("ceil_mode", 0):
                    kept += 1
                    continue
                assert not a.get("ceil_mode", 0), case
                assert a.get("count_include_pad", 0) or not any(a.get("pads", [0])), case
        rewritten += any(n.op_type == "Mul" for n in optimized.graph.node)
    assert rewritten > (60 if opset >= 19 else 20)
    assert kept < rewritten / 4


def _auto_pad_model(op: str, auto_pad: str, size: int, k: int, s: int, opset: int, **attrs):
    inputs, inits = ["x"], []
    if op == "Conv":
        w = np.random.default_rng(5).standard_normal((3, 2, k, k)).astype(np.float32)
        inputs, inits = ["x", "w"], [numpy_helper.from_array(w, "w")]
    node = helper.make_node(op, inputs, ["y"], name="node", kernel_shape=[k, k], strides=[s, s], auto_pad=auto_pad,
                            **attrs)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, size, size + 1])
    graph = helper.make_graph([node], "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    return model


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize("op", ["Conv", "AveragePool", "MaxPool"])
def test_auto_pads_become_explicit_pads_that_compute_the_same(op: str, auto_pad: str) -> None:
    """auto_pad (TensorFlow exports) is written as the pads it stands for, which the integer pool and the
    rewrites after it read: the same values and shape as onnxruntime gives, over odd and even sizes, kernels,
    strides, ceil_mode and count_include_pad. A dilated SAME pool keeps its auto_pad: onnxruntime pads it
    for the undilated kernel, which is no explicit padding of the dilated one; so may a SAME pool whose
    kernel is smaller than its stride (onnxruntime crops it)."""
    rng = np.random.default_rng(6)
    rewritten = 0
    pools = op != "Conv"
    for size, k, s, ceil, include, dilation in itertools.product(
            (7, 8), (1, 2, 3), (1, 2, 3), (0, 1) if pools else (0,), (0, 1) if op == "AveragePool" else (0,),
            (1, 2) if pools else (1,)):
        attrs = {"ceil_mode": ceil} if pools else {}
        if op == "AveragePool":
            attrs["count_include_pad"] = include
        if dilation > 1:
            attrs["dilations"] = [dilation, dilation]
        model = _auto_pad_model(op, auto_pad, size, k, s, 19, **attrs)
        x = rng.standard_normal((1, 2, size, size + 1)).astype(np.float32)
        case = (size, k, s, ceil, include, dilation)
        try:
            want = _run(model, x)
        except Exception:  # onnxruntime refuses SAME with ceil_mode where the kernel is smaller than the stride
            continue
        optimized = optimize.run(model)
        got = _run(optimized, x)
        assert got.shape == want.shape, case
        np.testing.assert_allclose(got, want, atol=1e-5, err_msg=str(case))
        if any(a.name == "auto_pad" for n in optimized.graph.node for a in n.attribute):
            assert pools and auto_pad != "VALID" and (dilation > 1 or k < s), case
        else:
            rewritten += 1
    assert rewritten >= 18


def _resize_model(mode: str, coords: str, opset: int, *, scales=None, sizes=None, h: int = 6, w: int = 7):
    inputs = ["x", "roi", "scales", "sizes"] if sizes is not None else ["x", "roi", "scales"]
    consts = [helper.make_tensor("roi", TensorProto.FLOAT, [0], []),
              helper.make_tensor("scales", TensorProto.FLOAT, [4] if scales is not None else [0], scales or [])]
    if sizes is not None:
        consts.append(helper.make_tensor("sizes", TensorProto.INT64, [4], sizes))
    node = helper.make_node("Resize", inputs, ["y"], name="resize", mode=mode, coordinate_transformation_mode=coords)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, h, w])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


RESIZES = {
    "align_corners_x2": ("linear", "align_corners", {"scales": [1, 1, 2, 2]}),
    "half_pixel_x8": ("linear", "half_pixel", {"scales": [1, 1, 8, 8]}),
    "pytorch_half_pixel_sizes": ("linear", "pytorch_half_pixel", {"sizes": [1, 3, 20, 9]}),
    "asymmetric_x1_5": ("linear", "asymmetric", {"scales": [1, 1, 1.5, 1.5]}),
    "width_only": ("linear", "half_pixel", {"scales": [1, 1, 1, 3]}),
    "downsample": ("linear", "half_pixel", {"scales": [1, 1, 0.5, 0.5]}),
    "cubic_x2": ("cubic", "half_pixel", {"scales": [1, 1, 2, 2]}),
}


@pytest.mark.parametrize("opset", [11, 13, 18])
@pytest.mark.parametrize("case", sorted(RESIZES))
def test_interpolations_as_matmuls_compute_the_same(case: str, opset: int) -> None:
    """A linear or cubic Resize the ConvTranspose form does not cover becomes MatMuls by its interpolation
    matrices (align_corners, a factor of 8, sizes, non-integer scales, one axis, downsampling, cubic)."""
    mode, coords, given = RESIZES[case]
    model = _resize_model(mode, coords, opset, **given)
    x = np.random.default_rng(4).standard_normal((1, 3, 6, 7)).astype(np.float32)
    want = _run(model, x)
    optimized = optimize.run(model)
    assert not [n for n in optimized.graph.node if n.op_type == "Resize"], [n.op_type for n in optimized.graph.node]
    got = _run(optimized, x)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=2e-5)



@pytest.mark.parametrize("case", ["align_corners_x2", "pytorch_half_pixel_sizes", "cubic_x2"])
def test_interpolation_matmuls_stay_on_the_bpu_of_x3(case: str) -> None:
    """The H axis is interpolated between two Transposes that RDK X3's BPU runs (NCHW <-> NHWC): a swap of
    H and W ran on its CPU and split conv -> Resize -> conv into three BPU subgraphs."""
    from hbtools.march.profiles import get_profile
    from hbtools.quant.units import build_partition

    mode, coords, given = RESIZES[case]
    resize = _resize_model(mode, coords, 13, **given)
    rng = np.random.default_rng(6)
    w1, w2 = (numpy_helper.from_array(rng.standard_normal((3, 3, 3, 3)).astype(np.float32), n) for n in ("w1", "w2"))
    graph = resize.graph
    graph.node[0].input[0] = "c1"
    graph.node[0].output[0] = "r"
    graph.node.insert(0, helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]))
    graph.node.append(helper.make_node("Conv", ["r", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1]))
    graph.initializer.extend([w1, w2])
    x = rng.standard_normal((1, 3, 6, 7)).astype(np.float32)
    optimized = optimize.run(resize)
    np.testing.assert_allclose(_run(optimized, x), _run(resize, x), atol=1e-4)
    for march in ("bernoulli2", "bayes-e"):
        rows = build_partition(optimized, get_profile(march), {}).rows()
        assert {(on, sub) for _, on, sub, _ in rows} == {("BPU", "id(0)")}, (march, rows)

@pytest.mark.parametrize("opset", [10, 11, 13])
@pytest.mark.parametrize("mode", ["linear", "nearest"])
def test_the_image_pooling_branch_stays_on_the_bpu_of_x3(mode: str, opset: int) -> None:
    """DeepLab's ASPP pools the map to one pixel and resizes it back: a repeat of that pixel. Written as a
    Tile it ran on RDK X3's CPU (no BPU Tile there), between two BPU subgraphs; a nearest Resize stays."""
    from hbtools.march.profiles import get_profile
    from hbtools.quant.units import build_partition

    rng = np.random.default_rng(7)
    scales = numpy_helper.from_array(np.array([1, 1, 8, 8], np.float32), "scales")
    roi = numpy_helper.from_array(np.zeros(0, np.float32), "roi")
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["p"], name="pool"),
             helper.make_node("Conv", ["p", "w1"], ["c"], name="conv1"),
             helper.make_node("Resize", ["c", "scales"] if opset == 10 else ["c", "roi", "scales"], ["u"],
                              name="image_pool_resize", mode=mode),
             helper.make_node("Concat", ["x", "u"], ["cat"], axis=1, name="join"),
             helper.make_node("Conv", ["cat", "w2"], ["y"], name="conv2")]
    weights = [numpy_helper.from_array(rng.standard_normal((3, 3, 1, 1)).astype(np.float32), "w1"),
               numpy_helper.from_array(rng.standard_normal((3, 6, 1, 1)).astype(np.float32), "w2")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [scales, *weights] + ([] if opset == 10 else [roi]))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    for march in ("bernoulli2", "bayes-e"):
        profile = get_profile(march)
        optimized = optimize.run(model, profile)
        np.testing.assert_allclose(_run(optimized, x), _run(model, x), atol=1e-4)
        rows = build_partition(optimized, profile, {}).rows()
        assert {(on, sub) for _, on, sub, _ in rows} == {("BPU", "id(0)")}, (march, rows)


def _recurrent_model(kind: str, direction: str, layout: int, opset: int, *, bias: bool, initial: bool,
                     linear_before_reset: int = 0, steps: int = 5, **extra):
    """One LSTM / GRU with every output, on x [T, B, I] (layout 1: [B, T, I]), random weights."""
    batch, inputs, hidden = 2, 3, 4
    dirs, gates = (2 if direction == "bidirectional" else 1), (4 if kind == "LSTM" else 3)
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.6, (dirs, gates * hidden, inputs)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.normal(0, 0.6, (dirs, gates * hidden, hidden)).astype(np.float32), "R")]
    if bias:
        inits.append(numpy_helper.from_array(rng.normal(0, 0.5, (dirs, 2 * gates * hidden)).astype(np.float32), "B"))
    names = ["x", "W", "R", "B" if bias else "", ""]
    graph_inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                  [steps, batch, inputs] if layout == 0 else [batch, steps, inputs])]
    state = [dirs, batch, hidden] if layout == 0 else [batch, dirs, hidden]
    for name in (["h0", "c0"] if kind == "LSTM" else ["h0"]) if initial else []:
        graph_inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, state))
        names.append(name)
    outputs = ["y", "y_h", "y_c"] if kind == "LSTM" else ["y", "y_h"]
    attrs = {"hidden_size": hidden, "direction": direction, **extra}
    if layout:
        attrs["layout"] = 1
    if linear_before_reset:
        attrs["linear_before_reset"] = 1
    node = helper.make_node(kind, names, outputs, name="rnn", **attrs)
    graph = helper.make_graph([node], "g", graph_inputs,
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _recurrent_cases():
    for kind, direction, layout, opset, bias, initial in itertools.product(
            ("LSTM", "GRU"), ("forward", "reverse", "bidirectional"), (0, 1), (11, 14, 21), (True, False),
            (False, True)):
        if layout and opset < 14:
            continue
        for lbr in (0, 1) if kind == "GRU" else (0,):
            yield kind, direction, layout, opset, bias, initial, lbr


def test_recurrent_layers_unroll_to_the_same_values() -> None:
    """Every direction, layout, opset, with and without biases and initial states (GRU: both reset
    forms): the unrolled graph gives the op's Y, Y_h (and Y_c) to float32 rounding, and holds no
    recurrent op. The reference is onnxruntime, or onnx's reference runtime for layout 1, which
    onnxruntime's kernels refuse."""
    from onnx.reference import ReferenceEvaluator

    from hbtools.graph.recurrent import unroll_recurrences

    cases = 0
    for kind, direction, layout, opset, bias, initial, lbr in _recurrent_cases():
        model = _recurrent_model(kind, direction, layout, opset, bias=bias, initial=initial, linear_before_reset=lbr)
        rng = np.random.default_rng(1)
        feeds = {i.name: rng.normal(0, 1, [d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
                 for i in model.graph.input}
        want = ReferenceEvaluator(model).run(None, feeds) if layout else \
            ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        unrolled = copy.deepcopy(model)
        assert unroll_recurrences(unrolled) == 1
        assert not any(n.op_type in ("LSTM", "GRU") for n in unrolled.graph.node)
        got = ort.InferenceSession(unrolled.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        case = (kind, direction, layout, opset, bias, initial, lbr)
        for w, g in zip(want, got, strict=True):
            assert g.shape == w.shape, case
            np.testing.assert_allclose(g, w, atol=2e-6, rtol=1e-5, err_msg=str(case))
        cases += 1
    assert cases == 180


@pytest.mark.parametrize("extra, why", [({"clip": 3.0}, "a cell clip"),
                                        ({"activations": ["Sigmoid", "Relu", "Tanh"]}, "activations"),
                                        ({"steps": 300}, "300 time steps")])
def test_recurrent_layers_that_cannot_unroll_stay_with_a_reason(extra: dict, why: str) -> None:
    import logging

    from hbtools.graph.recurrent import unroll_recurrences

    model = _recurrent_model("LSTM", "forward", 0, 13, bias=True, initial=False, **extra)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("hbtools")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        assert unroll_recurrences(model) == 0
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert [n.op_type for n in model.graph.node] == ["LSTM"]
    assert any("rnn stays one node" in r.getMessage() and why in r.getMessage() for r in records)


def test_long_recurrent_layers_unroll_where_the_config_puts_them_on_the_bpu() -> None:
    """40 steps x 2 directions stay one (CPU) node unless node_info puts the layer on the BPU; a short
    layer the config puts on the CPU stays too. An unrolled layer's name stays on the node writing Y."""
    from hbtools.graph.recurrent import AUTO_STEPS, unroll_recurrences

    long = _recurrent_model("LSTM", "bidirectional", 0, 13, bias=True, initial=False, steps=40)
    assert 40 * 2 > AUTO_STEPS
    assert unroll_recurrences(copy.deepcopy(long)) == 0
    placed = copy.deepcopy(long)
    assert unroll_recurrences(placed, {"rnn": "BPU"}) == 1
    assert [n.op_type for n in placed.graph.node if n.name == "rnn"] == ["Concat"]
    assert not any(n.op_type == "LSTM" for n in placed.graph.node)
    short = _recurrent_model("GRU", "forward", 0, 13, bias=True, initial=False)
    assert unroll_recurrences(copy.deepcopy(short), {"rnn": "CPU"}) == 0
    assert unroll_recurrences(short) == 1
    # The layer left whole is a CPU node whose reason says how to unroll it.
    from hbtools.march.profiles import get_profile
    from hbtools.quant.units import build_partition

    kept = optimize.run(long)
    part = build_partition(kept, get_profile("bayes-e"), {})
    (unit,) = [u for u in part.units if u.main.op_type == "LSTM"]
    assert unit.on == "CPU" and "node_info ON: BPU" in unit.reason


def test_batch_first_recurrent_layers_which_onnxruntime_cannot_load_convert_when_unrolled() -> None:
    """onnxruntime has no kernel for layout 1: the optimize stage unrolls the layer before onnxruntime
    loads the graph, and one it cannot unroll stops with a message, not an internal error."""
    from onnx.reference import ReferenceEvaluator

    from hbtools.errors import HbError

    model = _recurrent_model("GRU", "bidirectional", 1, 14, bias=True, initial=False, linear_before_reset=1)
    feeds = {"x": np.random.default_rng(2).normal(0, 1, (2, 5, 3)).astype(np.float32)}
    want = ReferenceEvaluator(model).run(None, feeds)
    got = ort.InferenceSession(optimize.run(model).SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, feeds)
    for w, g in zip(want, got, strict=True):
        np.testing.assert_allclose(g, w, atol=2e-6, rtol=1e-5)
    clipped = _recurrent_model("LSTM", "forward", 1, 14, bias=True, initial=False, clip=2.0)
    with pytest.raises(HbError, match="onnxruntime cannot load the model"):
        optimize.run(clipped)


def _pad_div_model(opset: int, value: float, pads: list[int]):
    """y = Pad(x, value) / (Pad(x, value) reduced over its last axis, + 1): a constant Pad and a Div of two
    tensors, as a linear attention writes them."""
    if opset >= 11:
        pad = helper.make_node("Pad", ["x", "pads", "value"], ["p"], name="pad", mode="constant")
        inits = [numpy_helper.from_array(np.array(pads, np.int64), "pads"),
                 numpy_helper.from_array(np.array(value, np.float32), "value")]
    else:
        pad = helper.make_node("Pad", ["x"], ["p"], name="pad", mode="constant", pads=pads, value=value)
        inits = []
    nodes = [pad, helper.make_node("ReduceSum" if opset >= 13 else "ReduceMean", ["p", "axes"] if opset >= 13 else
                                   ["p"], ["s"], name="sum", keepdims=1, **({} if opset >= 13 else {"axes": [-1]})),
             helper.make_node("Abs", ["s"], ["a"], name="abs"),
             helper.make_node("Add", ["a", "one"], ["d"], name="plus_one"),
             helper.make_node("Div", ["p", "d"], ["y"], name="div")]
    inits += [numpy_helper.from_array(np.array([-1], np.int64), "axes"), numpy_helper.from_array(np.float32(1), "one")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("opset", [10, 11, 13, 18])
@pytest.mark.parametrize("value, pads", [(1.0, [0, 0, 0, 0, 0, 0, 1, 0]), (-2.5, [0, 1, 2, 0, 0, 0, 0, 3]),
                                         (0.0, [1, 0, 0, 1, 0, 0, 0, 0])])
def test_constant_pads_and_divisions_of_two_tensors_compute_the_same(opset: int, value: float, pads: list[int]) -> None:
    """A constant Pad becomes Concats of constant blocks (the same values exactly), a Div of two tensors a
    Mul by a Reciprocal (to float32 rounding); both keep their names on the node writing their output,
    and the log counts them."""
    from hbtools.march.profiles import get_profile

    model = _pad_div_model(opset, value, pads)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # the tools' log setup stops propagation to pytest's capture
    log = logging.getLogger("hbtools")
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        optimized = optimize.run(model, get_profile("bayes-e"))
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    said = "\n".join(r.getMessage() for r in records)
    assert "1 constant Pads written as Concats" in said
    assert "1 Divs of two tensors written as a product with an int16 reciprocal table" in said
    types = {n.name: n.op_type for n in optimized.graph.node}
    assert types["pad"] == "Concat" and types["div"] == "Mul" and types["div_reciprocal"] == "Reciprocal", types
    assert "Pad" not in types.values() and "Div" not in types.values()
    x = np.random.default_rng(opset).standard_normal((1, 2, 3, 5)).astype(np.float32)
    np.testing.assert_allclose(_run(optimized, x), _run(model, x), rtol=1e-6, atol=1e-7)


def test_divisions_stay_where_the_config_or_the_march_keeps_them() -> None:
    """node_info ON: CPU keeps the Div; so does a march without int16 (its reciprocal table would be int8)."""
    from hbtools.march.profiles import get_profile

    model = _pad_div_model(13, 1.0, [0, 0, 0, 0, 0, 0, 1, 0])
    for kept in (optimize.run(model, get_profile("bayes-e"), placed={"div": "CPU"}),
                 optimize.run(model, get_profile("bernoulli2"))):
        assert [n.op_type for n in kept.graph.node if n.name == "div"] == ["Div"]
        assert not any(n.op_type == "Reciprocal" for n in kept.graph.node)


def _dilated_model(size: int, dilations: list[int], group: int, bias: bool):
    w = np.random.default_rng(5).standard_normal((6, 4 // group, 3, 3)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w")] + ([numpy_helper.from_array(np.arange(6, dtype=np.float32), "b")]
                                                  if bias else [])
    node = helper.make_node("Conv", ["x", "w", *(["b"] if bias else [])], ["y"], name="aspp", kernel_shape=[3, 3],
                            dilations=dilations, pads=[dilations[0], dilations[1]] * 2, group=group)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("size, dilations, group, bias", [(40, [18, 18], 1, True), (48, [24, 24], 2, False),
                                                          (36, [18, 36], 1, True)])
def test_convs_dilated_beyond_the_march_run_by_phases(size: int, dilations: list[int], group: int, bias: bool) -> None:
    """DeepLab's ASPP dilations (18, 24, 36 > 16 on the bayes family) become SpaceToDepth, a Conv over the
    phases with the dilation divided, and DepthToSpace: the same values, and a Conv the BPU takes."""
    from hbtools.march.profiles import get_profile

    model = _dilated_model(size, dilations, group, bias)
    optimized = optimize.run(model, get_profile("bayes-e"))
    assert [n.op_type for n in optimized.graph.node] == ["SpaceToDepth", "Conv", "DepthToSpace"]
    conv = next(n for n in optimized.graph.node if n.name == "aspp")
    assert max(helper.get_attribute_value(next(a for a in conv.attribute if a.name == "dilations"))) <= 16
    x = np.random.default_rng(size).standard_normal((1, 4, size, size)).astype(np.float32)
    np.testing.assert_allclose(_run(optimized, x), _run(model, x), rtol=1e-5, atol=1e-5)
    # a map that does not divide into phases gets no phases (convs_in_kernel_pieces splits it into single taps)
    odd_model = _dilated_model(size + 1, dilations, group, bias)
    odd = optimize.run(odd_model, get_profile("bayes-e"))
    assert "SpaceToDepth" not in [n.op_type for n in odd.graph.node]
    x = np.random.default_rng(size).standard_normal((1, 4, size + 1, size + 1)).astype(np.float32)
    np.testing.assert_allclose(_run(odd, x), _run(odd_model, x), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("size, dilations, strides, pads, kernel", [
    (14, [36, 36], [1, 1], [36, 36, 36, 36], [1, 1]),   # DeepLabV3 ASPP at 224: every off-centre tap in padding
    (14, [24, 24], [1, 1], [24, 24, 24, 24], [1, 1]),
    (20, [12, 18], [1, 1], [12, 18, 12, 18], [3, 3]),   # the map reaches the outer taps on both axes: kept
    (13, [6, 20], [2, 1], [6, 20, 6, 20], [3, 1]),      # one axis cut, a stride on the other
    (10, [20, 20], [1, 1], [40, 0, 0, 40], [1, 1]),     # one-sided padding: the last tap, then the first survives
])
def test_kernel_taps_that_read_only_padding_are_cut(size: int, dilations: list[int], strides: list[int],
                                                     pads: list[int], kernel: list[int]) -> None:
    """A dilated Conv on a map smaller than its dilation (deeplabv3_mobilenet_v3_large exported at 224: a
    14x14 map under dilation 36) stayed on the CPU ('dilation [36, 36] exceeds 16'); its off-centre taps only
    ever read padding, so the kernel keeps the taps that read the map, with the padding moved: the same
    values, a Conv within the BPU's dilation limit."""
    from hbtools.march.profiles import get_profile

    w = np.random.default_rng(9).standard_normal((6, 4, 3, 3)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], name="aspp", kernel_shape=[3, 3], dilations=dilations,
                            strides=strides, pads=pads)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.arange(6.0, dtype=np.float32), "b")]
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    optimized = optimize.run(model, get_profile("bayes-e"))
    conv = next(n for n in optimized.graph.node if n.op_type == "Conv")
    attrs = {a.name: helper.get_attribute_value(a) for a in conv.attribute}
    weight = next(i for i in optimized.graph.initializer if i.name == conv.input[1])
    assert list(weight.dims[2:]) == kernel
    assert all(d == 1 or k > 1 for d, k in zip(attrs.get("dilations", [1, 1]), kernel, strict=True))
    x = np.random.default_rng(size).standard_normal((1, 4, size, size)).astype(np.float32)
    want = _run(model, x)
    got = _run(optimized, x)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_pad_that_would_need_a_large_constant_block_stays() -> None:
    """Padding the batch of a large map would store a whole map of the value in the model: it stays a Pad."""
    pad = helper.make_node("Pad", ["x", "pads", "value"], ["y"], name="pad", mode="constant")
    graph = helper.make_graph([pad], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 1024, 512])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.array([1, 0, 0, 0, 0, 0, 0, 0], np.int64), "pads"),
                               numpy_helper.from_array(np.array(1.0, np.float32), "value")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    assert [n.op_type for n in optimize.run(model).graph.node] == ["Pad"]


BN_AFTER_LINEAR = {
    # name: (layer, attrs of the Gemm, bias shape (None: none), folded into the layer)
    "gemm_transB": ("Gemm", {"transB": 1}, [6], True),
    "gemm_alpha_beta": ("Gemm", {"transB": 0, "alpha": 0.5, "beta": 2.0}, [6], True),
    "gemm_no_bias": ("Gemm", {"transB": 1}, None, True),
    "gemm_scalar_bias": ("Gemm", {"transB": 1, "beta": 0.5}, [], True),
    "gemm_row_bias": ("Gemm", {"transB": 1}, [3, 1], True),
    "gemm_transA": ("Gemm", {"transA": 1, "transB": 1}, [1, 6], True),
    "matmul": ("MatMul", {}, None, True),
    "matmul_add": ("MatMul", {}, [6], True),
    "gemm_read_twice": ("Gemm", {"transB": 1}, [6], False),  # its output is an output too: the BN stays apart
    "flatten": ("Flatten", {}, None, False),
}


def _bn_after_linear_model(layer: str, attrs: dict, bias_shape: list[int] | None, read_twice: bool, opset: int):
    """[3, 4] -> layer to [3, 6] -> BatchNormalization (BatchNorm1d); Flatten: a [3, 1, 2, 3] input."""
    rng = np.random.default_rng(7)
    inits = [numpy_helper.from_array(v.astype(np.float32), n) for n, v in (
        ("gamma", rng.uniform(0.5, 1.5, 6)), ("beta", rng.normal(0, 0.3, 6)), ("mean", rng.normal(0, 0.3, 6)),
        ("var", rng.uniform(0.5, 1.5, 6)))]
    nodes, x_shape = [], [3, 4]
    if layer == "Flatten":
        x_shape = [3, 1, 2, 3]
        nodes.append(helper.make_node("Flatten", ["x"], ["h"], name="flatten"))
    else:
        trans_b = attrs.get("transB", 0)
        w = rng.normal(0, 0.5, (6, 4) if trans_b else (4, 6)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, "w"))
        a = "x"
        if attrs.get("transA", 0):
            nodes.append(helper.make_node("Transpose", ["x"], ["xt"], name="xt", perm=[1, 0]))
            a = "xt"
        if bias_shape is not None:
            inits.append(numpy_helper.from_array(rng.normal(0, 0.5, bias_shape).astype(np.float32), "b"))
        if layer == "Gemm":
            nodes.append(helper.make_node("Gemm", [a, "w", *(["b"] if bias_shape is not None else [])], ["h"],
                                          name="fc", **attrs))
        elif bias_shape is not None:
            nodes += [helper.make_node("MatMul", [a, "w"], ["mm"], name="fc"),
                      helper.make_node("Add", ["b", "mm"], ["h"], name="fc_bias")]
        else:
            nodes.append(helper.make_node("MatMul", [a, "w"], ["h"], name="fc"))
    nodes.append(helper.make_node("BatchNormalization", ["h", "gamma", "beta", "mean", "var"], ["y"], name="bn",
                                  epsilon=1e-3))
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in (["y", "h"] if read_twice else ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)], outputs,
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model, x_shape


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("case", sorted(BN_AFTER_LINEAR))
def test_batchnorm_of_a_linear_layer_folds_into_it(case: str, opset: int) -> None:
    """A BatchNormalization of [N, C] (nn.Linear + nn.BatchNorm1d) folds into the Gemm or MatMul before it
    (transB, transA, alpha, beta, no bias, a scalar or row bias, MatMul + Add); where nothing folds it
    becomes the depthwise 1x1 Conv a 4-D one is, between Unsqueeze and Squeeze. No BatchNormalization
    is left, and the optimized model computes what the exported one does."""
    layer, attrs, bias_shape, folded = BN_AFTER_LINEAR[case]
    model, x_shape = _bn_after_linear_model(layer, attrs, bias_shape, case == "gemm_read_twice", opset)
    x = np.random.default_rng(8).standard_normal(x_shape).astype(np.float32)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {"x": x})
    optimized = optimize.run(model)
    got = ort.InferenceSession(optimized.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    ops = [n.op_type for n in optimized.graph.node]
    assert "BatchNormalization" not in ops, ops
    assert ("Conv" not in ops) == folded, ops
    if folded:
        assert ops.count("Gemm") == 1 and "MatMul" not in ops and "Add" not in ops, ops


def _group_norm_model(opset: int = 21):
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], name="conv1", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("GroupNormalization", ["c", "gs", "gb"], ["gn"], name="gn", num_groups=4, epsilon=1e-5),
             helper.make_node("Relu", ["gn"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2"], ["y"], name="conv2", kernel_shape=[1, 1])]
    consts = [numpy_helper.from_array((rng.standard_normal(s) * 0.3).astype(np.float32), n)
              for n, s in (("w1", (8, 3, 3, 3)), ("gb", (8,)), ("w2", (4, 8, 1, 1)))]
    consts.append(numpy_helper.from_array((1 + rng.standard_normal(8) * 0.1).astype(np.float32), "gs"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 16])], consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def test_a_function_op_onnxruntime_expands_has_its_shape_arithmetic_folded() -> None:
    """onnxruntime expands GroupNormalization (opset 21) into its function body after its constant folding:
    the body's Shape / Cast / Div / Concat on static shapes must still fold, or the normalization and every
    node after it run on the CPU ('Shape is not supported on the BPU'); the normalization is one node."""
    from hbtools.march.profiles import get_profile
    from hbtools.quant.units import build_partition
    from hbtools.runtime import HB_ONNXRuntime

    model = _group_norm_model()
    x = np.random.default_rng(6).standard_normal((1, 3, 16, 16)).astype(np.float32)
    optimized = optimize.run(model, get_profile("bayes-e"))
    got = HB_ONNXRuntime(onnx_model=optimized).run(None, {"x": x})[0]  # HzLayerNorm: a Horizon op
    np.testing.assert_allclose(got, _run(model, x), rtol=1e-4, atol=1e-4)
    ops = [n.op_type for n in optimized.graph.node]
    assert not {"Shape", "Cast", "Concat", "GroupNormalization"} & set(ops), ops
    # The body's E[x*x] - E[x]**2 variance becomes one layer normalization, as PyTorch's opset-17 spelling
    # of GroupNorm (Reshape -> InstanceNormalization -> Reshape -> Mul -> Add) does.
    assert ops.count("HzLayerNorm") == 1 and "ReduceMean" not in ops, ops
    cpu = [name for name, on, _, _ in build_partition(optimized, get_profile("bayes-e"), {}).rows() if on != "BPU"]
    assert cpu == []


def test_a_conv_the_bpu_takes_keeps_its_padding_only_taps() -> None:
    """A 5x5 Conv on a 1-row map (PP-OCRv2 rec's neck) has rows of taps that read only padding, but the BPU
    takes it as it is: it is left alone, so its float sums, and the calibration built on them, do not move."""
    from hbtools.march.profiles import get_profile

    w = np.random.default_rng(3).standard_normal((8, 1, 5, 5)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="neck", kernel_shape=[5, 5], pads=[2, 2, 2, 2], group=8)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 1, 40])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    optimized = optimize.run(model, get_profile("bayes-e"))
    conv = next(n for n in optimized.graph.node if n.op_type == "Conv")
    weight = next(i for i in optimized.graph.initializer if i.name == conv.input[1])
    assert list(weight.dims[2:]) == [5, 5]


def _exporter_layer_norm(form: str, shared: bool = False):
    """A layer norm over the last axis (``flax_channels``: axis 1) of a (1, 6, 16) MatMul output, as tf2onnx
    (Keras, ``keras*``) or flax / jax2tf (``flax*``) write it; with ``shared`` the mean is also read by a second
    output."""
    rng = np.random.default_rng(9)
    c = 16
    consts = {"w": rng.standard_normal((c, c)) * 0.5, "gamma": 1 + 0.1 * rng.standard_normal(c),
              "beta": 0.1 * rng.standard_normal(c), "eps": 1e-3, "invn": 1.0 / c, "n": float(c), "zero": 0.0,
              "one": 1.0, "half": -0.5, "sixth": 1 / 6, "gamma6": 1 + 0.1 * rng.standard_normal((1, 6, 1)),
              "beta6": 0.1 * rng.standard_normal((1, 6, 1))}
    inits = [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in consts.items()]
    inits += [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in (("ax", [-1]), ("back", [1, 6, 1]))]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"])]

    def add(op, ins, out, **attrs):
        nodes.append(helper.make_node(op, ins, [out], **attrs))

    if form == "flax_channels":  # magika (jax2tf): over axis 1, the variance computed without the reduced axis
        inits += [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in (("ax1", [1]), ("kept", [1, 1, 16]))]
        add("ReduceSum", ["h", "ax1"], "s1", keepdims=0)
        add("Mul", ["s1", "sixth"], "mr")
        add("Reshape", ["mr", "kept"], "m")
        add("Sub", ["h", "m"], "dc")
        add("Mul", ["mr", "mr"], "mm")
        add("Mul", ["h", "h"], "h2")
        add("ReduceSum", ["h2", "ax1"], "s2", keepdims=0)
        add("Mul", ["s2", "sixth"], "m2")
        add("Sub", ["m2", "mm"], "v0")
        add("Max", ["zero", "v0"], "v1")
        add("Reshape", ["v1", "kept"], "var")
        add("Add", ["var", "eps"], "ve")
        add("Sqrt", ["ve"], "sd")
        add("Reciprocal", ["sd"], "inv")
        add("Mul", ["inv", "gamma6"], "ig")
        add("Mul", ["dc", "ig"], "xs")
        add("Add", ["xs", "beta6"], "y")
    elif form.startswith("keras"):
        add("ReduceMean", ["h"], "m", axes=[-1])
        add("Sub", ["h", "m"], "d")
        add("Mul", ["d", "d"], "sq")
        add("ReduceMean", ["sq"], "var", axes=[-1])
    else:
        keep = 0 if form == "flax_keepdims0" else 1
        add("ReduceSum", ["h", "ax"], "s1", keepdims=keep)
        if form == "flax_div":
            add("Div", ["s1", "n"], "m")
        else:
            add("Mul", ["s1", "invn"], "m0" if not keep else "m")
            if not keep:
                add("Reshape", ["m0", "back"], "m")
        add("Mul", ["h", "h"], "h2")
        add("ReduceSum", ["h2", "ax"], "s2", keepdims=keep)
        add("Mul", ["s2", "invn"], "m2" if keep else "m20")
        if not keep:
            add("Unsqueeze", ["m20", "ax"], "m2")
        add("Mul", ["m", "m"], "mm")
        add("Sub", ["m2", "mm"], "v0")
        add("Max", ["v0", "zero"], "var")
    ig = "inv" if form == "keras_nogamma" else "ig"
    if form != "flax_channels":
        add("Add", ["var", "eps"], "ve")
        if form == "keras_pow":
            add("Pow", ["ve", "half"], "inv")
        else:
            add("Sqrt", ["ve"], "sd")
            add("Div", ["one", "sd"], "inv") if form == "flax_div" else add("Reciprocal", ["sd"], "inv")
        if ig == "ig":
            add("Mul", ["inv", "gamma"], "ig")
    if form == "flax_channels":
        pass
    elif form.startswith("flax"):
        add("Sub", ["h", "m"], "dc")
        add("Mul", ["dc", ig], "xs")
        add("Add", ["xs", "beta"], "y")
    else:
        add("Mul", ["h", ig], "xs")
        if form == "keras_neg":
            add("Neg", ["m"], "nm")
            add("Mul", ["nm", ig], "ms")
            add("Add", ["ms", "beta"], "b2")
            add("Add", ["xs", "b2"], "y")
        elif form == "keras_subtract":
            add("Mul", ["m", ig], "ms")
            add("Sub", ["xs", "ms"], "c")
            add("Add", ["c", "beta"], "y")
        else:
            add("Mul", ["m", ig], "ms")
            add("Sub", ["beta", "ms"], "b2")
            add("Add", ["xs", "b2"], "y")
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, c])]
    if shared:
        add("Relu", ["m"], "y2")
        outputs.append(helper.make_tensor_value_info("y2", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, c])],
                              outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


EXPORTER_LAYER_NORMS = ["keras", "keras_neg", "keras_subtract", "keras_pow", "keras_nogamma", "flax", "flax_div",
                        "flax_keepdims0", "flax_channels"]


@pytest.mark.parametrize("form", EXPORTER_LAYER_NORMS)
def test_exporter_layer_norms_become_one_node(form: str) -> None:
    """tf2onnx's Keras layer norm (x * g + (beta - m * g), g = gamma / Sqrt(var + eps)) and flax's (means as
    ReduceSum * 1/N, the variance as E[x*x] - m*m clamped by Max(., 0)) were quantized piece by piece (cosine
    0.947 at the variance under ``max``); each is now one HzLayerNorm, with the float values of the original."""
    from hbtools.march.profiles import get_profile
    from hbtools.runtime import HB_ONNXRuntime

    model = _exporter_layer_norm(form)
    optimized = optimize.run(model, get_profile("bayes-e"))
    ops = [n.op_type for n in optimized.graph.node]
    assert ops == ["MatMul", "HzLayerNorm"], ops
    x = 3 * np.random.default_rng(10).standard_normal((1, 6, 16)).astype(np.float32)
    want = _run(model, x)
    got = HB_ONNXRuntime(onnx_model=optimized).run(None, {"x": x})[0]
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize("form", ["keras", "flax"])
def test_an_exporter_layer_norm_whose_mean_is_read_elsewhere_stays(form: str) -> None:
    from hbtools.march.profiles import get_profile
    from hbtools.runtime import HB_ONNXRuntime

    model = _exporter_layer_norm(form, shared=True)
    optimized = optimize.run(model, get_profile("bayes-e"))
    assert "HzLayerNorm" not in [n.op_type for n in optimized.graph.node]
    x = 3 * np.random.default_rng(10).standard_normal((1, 6, 16)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = HB_ONNXRuntime(onnx_model=optimized).run(None, {"x": x})
    for g, w in zip(got, want, strict=True):
        assert np.abs(g - w).max() <= 1e-5 * np.abs(w).max()


@pytest.mark.parametrize("form", ["keras", "flax", "flax_channels"])
def test_exporter_layer_norms_run_on_the_bpu_under_max(form: str, tmp_path) -> None:
    """makertbin ``max`` on the Keras and flax forms: one HzLayerNorm on the BPU, the .bin agreeing with
    the quantized model (hb_verifier)."""
    from conformance import convert_featuremaps

    from hbtools.metrics import cosine_similarity
    from hbtools.runtime import HB_ONNXRuntime
    from hbtools.runtime.binfile import read_bin
    from hbtools.tools.verifier import verify

    model = _exporter_layer_norm(form)
    rng = np.random.default_rng(11)
    samples = [rng.standard_normal((1, 6, 16)).astype(np.float32) for _ in range(8)]
    out = convert_featuremaps(tmp_path, model, {"x": samples}, "1x6x16", "float32", "m", calibration_type="max")
    assert "1 layer normalizations written as one HzLayerNorm node each" in out
    assert not read_bin(tmp_path / "out" / "m.bin").models[0].partition["cpu_nodes"]
    quantized = tmp_path / "out" / "m_quantized_model.onnx"
    x = rng.standard_normal((1, 6, 16)).astype(np.float32)
    assert cosine_similarity(_run(model, x), HB_ONNXRuntime(model_file=str(quantized)).run(None, {"x": x})[0]) >= 0.99
    verdict = verify(quantized, tmp_path / "out" / "m.bin", None, 5)
    assert all(o.passed for o in verdict.outputs), "hb_verifier: the .bin and the quantized model differ"


def test_recurrent_layers_stay_whole_where_the_bpu_cannot_compute_their_gates(tmp_path) -> None:
    """RDK X3's BPU takes 4-D tensors only, and an unrolled step's gates are [batch, hidden]: ddddocr's OCR model
    (a 32-step bidirectional LSTM behind a CNN) became 66 BPU subgraphs, each step's product on the BPU and its
    gates on the CPU, converting in 3 minutes instead of 40 s, with 2.5x the modelled latency. There the layer
    stays one CPU node and says why; on X5 it is unrolled, and on X3 node_info ON: BPU still unrolls it."""
    import onnx
    from conformance import INTERNAL, _cli

    from hbtools.graph.recurrent import unroll_recurrences
    from hbtools.march.profiles import get_profile

    steps, channels, hidden = 8, 16, 8
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)
             for name, shape, scale in (("w", (channels, 3, 3, 3), 0.3),
                                        ("W", (2, 4 * hidden, channels), channels ** -0.5),
                                        ("R", (2, 4 * hidden, hidden), hidden ** -0.5))]
    inits.append(numpy_helper.from_array(np.array([1, channels, steps], np.int64), "shape"))
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], strides=[4, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Reshape", ["r", "shape"], ["seq"], name="flat"),
             helper.make_node("Transpose", ["seq"], ["t"], perm=[2, 0, 1], name="time_major"),
             helper.make_node("LSTM", ["t", "W", "R"], ["y"], name="rnn", hidden_size=hidden,
                              direction="bidirectional")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, steps])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [steps, 2, 1, hidden])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "m.onnx")
    code, out = _cli(["checker", "--model-type", "onnx", "--march", "bernoulli2", "--model", str(tmp_path / "m.onnx")],
                     tmp_path)
    assert code == 0 and INTERNAL not in out, out[-3000:]
    assert "LSTM rnn stays one node (on the CPU): the BPU of bernoulli2 (RDK X3) takes no 2-D tensors" in out, out
    assert "The model has 1 BPU subgraph(s)" in out, out[-3000:]
    # The table's reason says the same, not that node_info ON: BPU would help (unrolled, it is slower and coarser).
    assert re.search(r"^rnn\s+LSTM\s+LSTM stays one node: unrolled over its time steps, the gates of each step "
                     r"would be 2-D tensors, which the BPU of bernoulli2 \(RDK X3\) does not take$", out, re.M), out
    x3 = get_profile("bernoulli2")
    assert unroll_recurrences(copy.deepcopy(model), profile=get_profile("bayes-e")) == 1
    assert unroll_recurrences(copy.deepcopy(model), {"rnn": "BPU"}, profile=x3) == 1
    assert unroll_recurrences(copy.deepcopy(model), profile=x3) == 0
    # Put on the BPU, the layer is unrolled; the gates still cannot go there, and that is said once, not per part.
    from hbtools.config.model import NodeInfo
    from hbtools.quant.units import build_partition

    placed = optimize.run(onnx.shape_inference.infer_shapes(model), x3, placed={"rnn": "BPU"})
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("hbtools").addHandler(handler)
    try:
        build_partition(placed, x3, {"rnn": NodeInfo(on="BPU")})
    finally:
        logging.getLogger("hbtools").removeHandler(handler)
    said = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    assert len(said) == 1 and said[0].startswith("node rnn cannot run on the BPU in "), said
    # Batch-first layers are unrolled there all the same: onnxruntime has no kernel to run them whole.
    batch_first = _recurrent_model("GRU", "forward", 1, 14, bias=True, initial=False)
    assert unroll_recurrences(batch_first, profile=x3) == 1


def _shift_before_convs_model(op: str, const_shape: list[int], group: int, pads: int, bias: bool,
                              readers: int = 1, scaled: bool = False):
    """Relu (-> Mul by a constant, with ``scaled``) -> Add/Sub of a constant -> ``readers`` Convs (YOLOv7's
    ImplicitA before its detect convs; scaled: PP-LCNetV3's learnable affine block)."""
    rng = np.random.default_rng(11)
    inits = [numpy_helper.from_array(rng.standard_normal(const_shape).astype(np.float32), "a"),
             numpy_helper.from_array(rng.uniform(0.5, 2, [1, 8, 1, 1]).astype(np.float32), "k")]
    nodes = [helper.make_node("Relu", ["x"], ["r0"], name="relu"),
             helper.make_node("Mul" if scaled else "Identity", ["r0", "k"] if scaled else ["r0"], ["r"], name="scale"),
             helper.make_node(op, ["r", "a"], ["s"], name="shift")]
    outs = []
    for k in range(readers):
        inits.append(numpy_helper.from_array(rng.standard_normal((8, 8 // group, 1 + 2 * k, 3)).astype(np.float32),
                                             f"w{k}"))
        inputs = ["s", f"w{k}"]
        if bias:
            inits.append(numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), f"b{k}"))
            inputs.append(f"b{k}")
        nodes.append(helper.make_node("Conv", inputs, [f"y{k}"], name=f"conv{k}", group=group, pads=[pads] * 4))
        outs.append(helper.make_tensor_value_info(f"y{k}", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 7, 9])], outs,
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize(("op", "const_shape", "group", "bias", "readers"), [
    ("Add", [1, 8, 1, 1], 1, True, 1), ("Sub", [8, 1, 1], 2, False, 1), ("Add", [1], 1, False, 2),
    ("Add", [1, 8, 1, 1], 8, True, 2)])
def test_a_shift_before_unpadded_convs_folds_into_their_biases(op: str, const_shape: list[int], group: int,
                                                               bias: bool, readers: int) -> None:
    """An Add of a constant per channel before a 1x1 detect conv (YOLOv7's ImplicitA) stayed one more rounding on
    the BPU (hunt 16 N5): without padding it folds exactly into the bias of every conv reading it."""
    model = _shift_before_convs_model(op, const_shape, group, 0, bias, readers)
    x = np.random.default_rng(0).standard_normal((1, 8, 7, 9)).astype(np.float32)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, {"x": x})
    optimized = optimize.run(model)
    got = ort.InferenceSession(optimized.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)
    kinds = [n.op_type for n in optimized.graph.node]
    assert kinds.count("Conv") == readers and "Add" not in kinds and "Sub" not in kinds, kinds


@pytest.mark.parametrize(("pads", "scaled"), [(1, False), (0, True)])
def test_a_shift_before_a_padded_conv_or_after_a_scale_stays(pads: int, scaled: bool) -> None:
    """A padded conv reads zeros at its edge, not the shift: folding it would be wrong there. After a Mul by a
    constant, the pair is one depthwise conv (PP-LCNetV3's learnable affine block), which the fold leaves as it
    is: it would take no op away."""
    optimized = optimize.run(_shift_before_convs_model("Add", [1, 8, 1, 1], 1, pads, True, scaled=scaled))
    shift = [n for n in optimized.graph.node if n.name in ("shift", "scale")]
    assert shift and not any(n.name.endswith("_bias_shifted") for n in optimized.graph.initializer), \
        [n.name for n in optimized.graph.node]


@pytest.mark.parametrize(("x_shape", "const_shape", "w_shape", "folds"), [
    ([1, 4, 4, 6, 6], [1, 4, 1, 1], [3, 4, 1, 1, 1], False),  # [1, C, 1, 1] on a 5-D map varies along T
    ([1, 4, 6, 6, 6], [1, 4, 1, 1, 1], [3, 4, 1, 1, 1], True),
    ([1, 1, 6, 6], [1, 4, 1, 1], [3, 4, 1, 1], False),  # broadcasts one channel up to four
    ([1, 4, 6], [4, 1, 1], [3, 4, 1], False),  # adds a batch axis to a Conv1d's input
])
def test_a_shift_folds_only_along_the_channels_of_its_own_tensor(x_shape: list[int], const_shape: list[int],
                                                                 w_shape: list[int], folds: bool) -> None:
    """A constant that broadcasts along another axis than the channels, or broadcasts its input up, is no shift
    per channel: folding one gave errors of 46 on a 5-D map and a Conv reading one channel of four (hunt 21
    D1, D2). Whatever is folded or kept, the values are onnxruntime's."""
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array(rng.standard_normal(const_shape).astype(np.float32), "a"),
             numpy_helper.from_array(rng.standard_normal(w_shape).astype(np.float32), "w")]
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Add", ["r", "a"], ["s"], name="shift"),
             helper.make_node("Conv", ["s", "w"], ["y"], name="conv")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    x = rng.standard_normal(x_shape).astype(np.float32)
    optimized = optimize.run(model)
    got, want = _run(optimized, x), _run(model, x)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert (not any(n.op_type == "Add" for n in optimized.graph.node)) == folds, \
        [n.op_type for n in optimized.graph.node]
