"""The calibrated model's float32 fake quants of int16 grids, after an integer add / mul and after an
integer conv's accumulator, give the integer ops' rule bit for bit.

The lowering rounds and clips these in float32 with one Clip for both grid bounds (a Relu's lower bound
folded into it) and scales the levels with one float32 Mul, where it used to clip with a Max and a Min and
to finish an add's or mul's fake quant in float64. The rule stays: ``round`` half to even of the integer
op's float32 value, clipped to -32767..32767 (or the grid a search feeds), times the float32 step. The
inputs cover every level, values beyond the grid at both ends and many rounding ties.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from hbtools.ops.base import DOMAIN, DOMAIN_VERSION
from hbtools.ops.calibration import HzCalibration
from hbtools.ops.names import calibration_node, fed_input
from hbtools.runtime import HB_ONNXRuntime
from hbtools.runtime.lowering import lower_model

QMAX = 32767


def _model(nodes, inputs: dict, output: str, initializers=()):
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(k, TensorProto.FLOAT, s)
                                           for k, s in inputs.items()],
                              [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)], list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                    helper.make_opsetid(DOMAIN, DOMAIN_VERSION)])
    model.ir_version = 8
    return model


def _fq(tensor: str, step: float, bits: int = 16):
    qmax = 127 if bits == 8 else QMAX
    return HzCalibration.build(tensor, f"{tensor}_fq", kind="activation", thresholds=[qmax * step], bits=bits,
                               scales=np.array([step], np.float32))


def _levels() -> np.ndarray:
    """Levels at and near both ends of the int16 grid, around 0, and odd ones (ties with a step of 1/2)."""
    rng = np.random.default_rng(3)
    edges = [-QMAX, -QMAX + 1, -QMAX + 2, -16385, -16384, -16383, -3, -2, -1, 0, 1, 2, 3, 16383, 16384, 16385,
             QMAX - 2, QMAX - 1, QMAX]
    return np.unique(np.concatenate([edges, rng.integers(-QMAX, QMAX + 1, 100)])).astype(np.float64)


def _run(model, feeds: dict) -> np.ndarray:
    return HB_ONNXRuntime(onnx_model=model).run(None, feeds)[0]


def _rule(op: str, la: np.ndarray, lb: np.ndarray, steps: dict, lo: float = -QMAX, hi: float = QMAX):
    """The integer add's / mul's float32 rule (``twins._sum_levels``, ``_product_levels``), clipped, scaled."""
    s = np.float64(steps["y"])
    a32, b32 = la.astype(np.float32), lb.astype(np.float32)
    if op == "Mul":
        m = np.float32(np.float64(steps["a"]) * np.float64(steps["b"]) / s)
        value = (a32 * b32) * m
    else:
        ma, mb = (np.float32(np.float64(steps[k]) / s) for k in "ab")
        value = a32 * ma + b32 * (-mb if op == "Sub" else mb)
    assert value.dtype == np.float32
    q = np.clip(np.round(value), lo, hi)
    return q.astype(np.float32) * np.float32(steps["y"]), value


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul"])
def test_int16_add_sub_mul_fake_quant_follows_the_integer_rule(op: str) -> None:
    # multipliers 1 and 1/2 (Add / Sub) and 1/2 (Mul): half the pairs land on a tie, and sums and products
    # leave the grid at both ends
    steps = {"a": 0.5, "b": 0.25, "y": 0.5 if op != "Mul" else 0.25}
    la, lb = np.meshgrid(_levels(), _levels(), indexing="ij")
    nodes = [_fq("a", steps["a"]), _fq("b", steps["b"]), helper.make_node(op, ["a_fq", "b_fq"], ["y"], name="op"),
             _fq("y", steps["y"])]
    model = _model(nodes, {"a": [1, *la.shape], "b": [1, *la.shape]}, "y_fq")
    got = _run(model, {"a": (la * steps["a"]).astype(np.float32)[None],
                       "b": (lb * steps["b"]).astype(np.float32)[None]})
    want, value = _rule(op, la, lb, steps)
    ties = np.abs(np.abs(value) % 1 - 0.5) == 0
    assert ties.sum() > 500 and (value > QMAX + 0.5).any() and (value < -QMAX - 0.5).any()
    assert np.array_equal(got.view(np.uint32), want[None].view(np.uint32)), \
        f"{np.count_nonzero(got != want[None])} of {got.size} pairs differ"
    # rounded and clipped in float32, the output one float32 Mul: no float64 step on the way
    lowered = lower_model(model)
    producer = {o: n for n in lowered.graph.node for o in n.output}
    assert producer["y_fq"].op_type == "Mul" and producer[producer["y_fq"].input[0]].op_type == "Clip"


@pytest.mark.parametrize("relu", [False, True])
def test_int16_conv_accumulator_fake_quant_follows_the_integer_rule(relu: bool) -> None:
    """x (int16, step 1/2) -> 1x1 conv with weight level 4 (step 5/16) [-> Relu] -> int16 fake quant of step
    1/4: the accumulator 4 * lx times the float32 multiplier 5/8 is 2.5 * lx, a tie for every odd level,
    and leaves the grid at both ends."""
    lx = np.arange(-QMAX, QMAX + 1, dtype=np.float64)
    w = numpy_helper.from_array(np.full([1, 1, 1, 1], 1.25, np.float32), "w")
    nodes = [_fq("x", 0.5),
             HzCalibration.build("w", "w_fq", kind="weight", thresholds=[127 * 0.3125], bits=8, axis=0,
                                 scales=np.array([0.3125], np.float32)),
             helper.make_node("Conv", ["x_fq", "w_fq"], ["c"], name="conv")]
    out = "c"
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["r"], name="relu"))
        out = "r"
    nodes.append(_fq(out, 0.25))
    model = _model(nodes, {"x": [1, 1, 1, lx.size]}, f"{out}_fq", [w])
    got = _run(model, {"x": (lx * 0.5).astype(np.float32).reshape(1, 1, 1, -1)})
    m = np.float32(np.float64(np.float32(0.5)) * np.float64(np.float32(0.3125)) / np.float64(np.float32(0.25)))
    value = (4 * lx).astype(np.float32) * m
    assert m == 0.625 and (np.abs(value) % 1 == 0.5).sum() > 30000
    want = np.clip(np.round(value), 0 if relu else -QMAX, QMAX).astype(np.float32) * np.float32(0.25)
    assert np.array_equal(got.reshape(-1).view(np.uint32), want.view(np.uint32)), \
        f"{np.count_nonzero(got.reshape(-1) != want)} of {want.size} levels differ"
    ops = {n.op_type for n in lower_model(model).graph.node}
    assert "Min" not in ops, ops  # the grid's two bounds in one Clip


@pytest.mark.parametrize("qmax", [127, QMAX])
def test_fed_grids_clip_to_the_fed_bounds(qmax: int) -> None:
    """A search's session (fed scale and qmax, 8 or 16 bits in one session): the add's fake quant clips to
    the fed grid, beyond it at both ends and on ties alike."""
    steps = {"a": 0.5, "b": 0.25, "y": 0.5}
    la, lb = np.meshgrid(_levels(), _levels(), indexing="ij")
    nodes = [_fq("a", steps["a"]), _fq("b", steps["b"]), helper.make_node("Add", ["a_fq", "b_fq"], ["y"], name="op"),
             _fq("y", steps["y"])]
    model = _model(nodes, {"a": [1, *la.shape], "b": [1, *la.shape]}, "y_fq")
    lowered = lower_model(model, feed_calibration=True)
    feeds = {"a": (la * steps["a"]).astype(np.float32)[None], "b": (lb * steps["b"]).astype(np.float32)[None]}
    for k in ("a", "b", "y"):
        node = calibration_node(k)
        feeds[fed_input(node, "scale")] = np.array(steps[k], np.float32)
        feeds[fed_input(node, "qmax")] = np.array(QMAX, np.float32)
    feeds[fed_input(calibration_node("y"), "qmax")] = np.array(qmax, np.float32)
    session = ort.InferenceSession(lowered.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(["y_fq"], feeds)[0]
    want, _ = _rule("Add", la, lb, steps, -qmax, qmax)
    assert np.array_equal(got.view(np.uint32), want[None].view(np.uint32)), \
        f"{np.count_nonzero(got != want[None])} of {got.size} pairs differ"
