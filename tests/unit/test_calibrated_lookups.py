"""The calibrated model runs its int8 element-wise ops as the quantized model does, on uint8.

Where an Add, Sub or Mul of two int8 fake-quantized tensors (or a Concat of them, or an integer
product's accumulator) feeds an int8 fake quant with a constant grid, the lowering computes the
output levels on uint8 (the int8 add's and mul's DequantizeLinear and QuantizeLinear, a table
per Concat part, one QuantizeLinear) instead of the float64 twin arithmetic. They follow the
integer ops' own rule, so the calibrated model still equals the quantized one bit for bit.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from arch_builders import mobilenetv3_block
from builders import fpn_like, held_out, make_project

from hbtools.log import setup
from hbtools.ops.base import DOMAIN, attrs_of
from hbtools.pipeline.runner import makertbin
from hbtools.runtime import HB_ONNXRuntime
from hbtools.runtime.lowering import lower_model
from hbtools.runtime.session import ort_session


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    setup(None)
    root = tmp_path_factory.mktemp("fpn")
    fm = fpn_like()
    project = make_project(root, fm, cal_count=8)
    project.write(calibration_parameters={"calibration_type": "max"})
    paths = makertbin(project.config_path, "onnx")
    samples = held_out(fm, count=8, seed=5)
    return fm, paths, samples


def test_calibrated_equals_quantized_bit_for_bit(converted) -> None:
    _, paths, samples = converted
    calibrated, quantized = (HB_ONNXRuntime(model_file=str(paths[k])) for k in ("calibrated", "quantized"))
    for k, x in enumerate(samples):
        c = calibrated.run(None, {"data": x})[0]
        q = quantized.run(None, {"data": x})[0].astype(np.float32)
        assert np.array_equal(c, q), f"held-out sample {k}: max difference {np.abs(c - q).max()}"


def test_int8_fake_quants_after_add_mul_concat_and_products_come_from_uint8_levels(converted) -> None:
    fm, paths, _ = converted
    model = onnx.load(str(paths["calibrated"]))
    ops = {n.name: n.op_type for n in fm.model.graph.node}
    outputs = {n.output[0]: n.name for n in model.graph.node}
    # The fake quant right after each Add / Mul / Concat of the float model
    wanted = {n.output[0]: ops[outputs[n.input[0]]] for n in model.graph.node
              if n.domain == DOMAIN and n.op_type == "HzCalibration" and n.input[0] in outputs
              and ops.get(outputs[n.input[0]]) in ("Add", "Mul", "Concat", "ConvTranspose")}
    assert set(wanted.values()) == {"Add", "Mul", "Concat", "ConvTranspose"}, wanted
    producers = {o: n.op_type for n in lower_model(model, keep=list(wanted)).graph.node for o in n.output}
    # From uint8 levels (DequantizeLinear), not from a float64 product (Cast)
    assert {y: producers[y] for y in wanted} == dict.fromkeys(wanted, "DequantizeLinear")


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul"])
def test_every_pair_of_int8_levels_follows_the_integer_ops_rule(op: str) -> None:
    """fq(fq(a) op fq(b)) over all 65,536 level pairs, with steps whose sums land on rounding ties: the
    lookup gives the integer op's rule, clip(round(la * ma + lb * mb)) * s for Add/Sub with the float32
    multipliers ma = sa / s, mb = +-sb / s and each operation rounded to float32; for Mul
    clip(round(float32(la * lb) * m)) * s with the float32 multiplier m = sa * sb / s, which here rounds
    hundreds of pairs apart from the float64 quotient (la * sa * lb * sb) / s."""
    from onnx import TensorProto, helper

    from hbtools.ops.base import DOMAIN_VERSION
    from hbtools.ops.calibration import HzCalibration

    steps = {"a": np.float32(0.1), "b": np.float32(0.3), "y": np.float32(0.2)}
    levels = np.arange(-127, 128, dtype=np.float64)
    la, lb = np.meshgrid(levels, levels, indexing="ij")
    feeds = {"a": (la * np.float64(steps["a"])).astype(np.float32)[None],
             "b": (lb * np.float64(steps["b"])).astype(np.float32)[None]}
    nodes = [HzCalibration.build(k, f"{k}_fq", kind="activation", thresholds=[127 * float(steps[k])], bits=8,
                                 scales=np.array([steps[k]])) for k in ("a", "b")]
    nodes.append(helper.make_node(op, ["a_fq", "b_fq"], ["y"], name="op"))
    nodes.append(HzCalibration.build("y", "y_fq", kind="activation", thresholds=[127 * float(steps["y"])], bits=8,
                                     scales=np.array([steps["y"]])))
    shape = [1, *la.shape]
    graph = helper.make_graph(nodes, "pair", [helper.make_tensor_value_info(k, TensorProto.FLOAT, shape)
                                              for k in ("a", "b")],
                              [helper.make_tensor_value_info("y_fq", TensorProto.FLOAT, shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                    helper.make_opsetid(DOMAIN, DOMAIN_VERSION)])
    model.ir_version = 8
    got = HB_ONNXRuntime(onnx_model=model).run(None, feeds)[0]
    va, vb = la * np.float64(steps["a"]), lb * np.float64(steps["b"])
    value = {"Add": va + vb, "Sub": va - vb, "Mul": va * vb}[op]
    s = np.float64(steps["y"])
    if op == "Mul":
        m = np.float32(np.float64(steps["a"]) * np.float64(steps["b"]) / s)
        rounded = np.round((np.float32(la * lb) * m).astype(np.float64))
        assert np.count_nonzero(rounded != np.round(value / s)) > 100, "the two rules should differ here"
    else:
        sign = -1.0 if op == "Sub" else 1.0
        ma, mb = (np.float32(np.float64(steps[k]) / s) for k in "ab")
        rounded = np.round((la.astype(np.float32) * ma + lb.astype(np.float32) * (sign * mb)).astype(np.float64))
    want = (np.clip(rounded, -127, 127) * s).astype(np.float32)[None]
    ties = np.abs(np.abs(value / s) % 1 - 0.5) < 1e-6
    assert ties.sum() > 100, "the steps should put many pairs on a rounding tie"
    diff = np.flatnonzero(got != want)
    first = (la.reshape(-1)[diff[:3]], lb.reshape(-1)[diff[:3]])
    assert diff.size == 0, f"{diff.size} pairs differ, the first at levels {first}"
    # as the quantized model's int8 add / mul: DequantizeLinear of the uint8 copies, a Sub (of the negated
    # product) or two Muls, a QuantizeLinear; no table, nothing in float64
    ops = {n.op_type for n in lower_model(model).graph.node}
    middle = "Mul" if op == "Mul" else "Sub"
    assert "GatherElements" not in ops and {"DequantizeLinear", middle, "QuantizeLinear"} <= ops, ops


def test_average_pool_follows_the_integer_window_sums(tmp_path) -> None:
    """AveragePool (a 3x2 window, as PP-OCR rec's neck has) on int16 levels: the calibrated model sums the
    levels exactly and scales in float64, as the quantized model's integer pool does, not float32 means."""
    from builders import FloatModel, _Graph


    setup(None)
    g = _Graph(8)
    x = g.op("Relu", [g.conv("data", 3, 16)])
    pooled = g.op("AveragePool", [x], kernel_shape=[3, 2], strides=[3, 2])
    out = g.op("Sigmoid", [g.conv(pooled, 16, 4, k=1)])
    fm: FloatModel = g.model({"data": [1, 3, 48, 64]}, [out])
    project = make_project(tmp_path, fm, cal_count=6)
    project.write(calibration_parameters={"calibration_type": "max", "optimization": "set_all_nodes_int16"})
    paths = makertbin(project.config_path, "onnx")
    differ = _levels_differ(paths, fm, pooled, seed=9)
    assert differ == 0, f"{differ} pooled levels differ between the calibrated and the quantized model"


def _levels_differ(paths: dict, fm, tensor: str, seed: int) -> int:
    """How many levels of ``tensor`` differ between the calibrated model (its value over its step) and the
    quantized model, on 12 held-out samples."""
    from hbtools.ops.names import quantized_tensor

    step = next(attrs_of(n)["scales"][0] for n in onnx.load(str(paths["calibrated"])).graph.node
                if n.op_type == "HzCalibration" and n.input[0] == tensor)
    names = {"calibrated": f"{tensor}_calibrated", "quantized": quantized_tensor(tensor)}
    sessions = {}
    for k, name in names.items():
        lowered = lower_model(onnx.load(str(paths[k])), keep=[name])
        lowered.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
        sessions[k] = ort_session(lowered)
    differ = 0
    for raw in held_out(fm, count=12, seed=seed):
        x = (raw.astype(np.int16) - 128).astype(np.int8)
        c, q = (sessions[k].run([names[k]], {"data": x})[0].astype(np.float64) for k in ("calibrated", "quantized"))
        differ += int((np.round(c / np.float64(np.float32(step))) != q).sum())
    return differ


@pytest.fixture(scope="module")
def converted_int16(tmp_path_factory):
    setup(None)
    root = tmp_path_factory.mktemp("fpn16")
    fm = fpn_like(h=32)
    project = make_project(root, fm, cal_count=8)
    project.write(calibration_parameters={"calibration_type": "max", "optimization": "set_all_nodes_int16"})
    paths = makertbin(project.config_path, "onnx")
    return fm, paths, held_out(fm, count=8, seed=6)


def test_int16_adds_sum_in_float32_in_both_models(converted_int16) -> None:
    """Every tensor int16: the quantized Add sums float32(a * ma) + float32(b * mb) in float32
    (``requantize_f32``), and the calibrated model's twins follow that rule, so the two models
    still agree bit for bit; where the float64 sum would round differently, they would not."""
    _, paths, samples = converted_int16
    quantized_model = onnx.load(str(paths["quantized"]))
    adds = [n for n in quantized_model.graph.node if n.op_type == "HzSQuantizedEltwise"
            and attrs_of(n)["mode"] == "add"]
    assert adds and all(attrs_of(n).get("requantize_f32") == 1 and attrs_of(n)["out_type"] == "int16" for n in adds)
    calibrated, quantized = (HB_ONNXRuntime(model_file=str(paths[k])) for k in ("calibrated", "quantized"))
    for k, x in enumerate(samples):
        c = calibrated.run(None, {"data": x})[0]
        q = quantized.run(None, {"data": x})[0].astype(np.float32)
        assert np.array_equal(c, q), f"held-out sample {k}: {np.count_nonzero(c != q)} values differ"


def test_int16_muls_requantize_in_float32_in_both_models(tmp_path) -> None:
    """Every tensor int16 in a MobileNetV3 block: its SE Mul of two activations requantizes
    float32(float32(a * b) * m) (``requantize_f32``), and the calibrated model's twins follow that
    rule, so the Mul's levels agree in both models; with the float64 quotient of values a few differ."""

    setup(None)
    fm = mobilenetv3_block(h=64)
    project = make_project(tmp_path, fm, cal_count=6)
    project.write(calibration_parameters={"calibration_type": "max", "optimization": "set_all_nodes_int16"})
    paths = makertbin(project.config_path, "onnx")
    muls = [n for n in onnx.load(str(paths["quantized"])).graph.node if n.op_type == "HzSQuantizedEltwise"
            and attrs_of(n)["mode"] == "mul"]
    assert muls and all(attrs_of(n).get("requantize_f32") == 1 and attrs_of(n)["out_type"] == "int16" for n in muls)
    product = fm.model.graph.node[[n.op_type for n in fm.model.graph.node].index("Mul")].output[0]
    differ = _levels_differ(paths, fm, product, seed=8)
    assert differ == 0, f"{differ} levels of the Mul differ between the calibrated and the quantized model"


@pytest.mark.parametrize("op", ["Mul", "Add"])
def test_an_op_of_a_tensor_with_itself_is_its_lookup_table_in_both_models(op: str, tmp_path) -> None:
    """x * x (an SSD Normalize's square, Caffe's Eltwise PROD of a blob with itself) and x + x are functions of one
    tensor: a lookup table in the quantized model, built in float32. The calibrated model computed them as a
    product (sum) of two activations in float64, and at int16 ten of 16384 levels of a ramp landed on the
    other side of a rounding tie."""
    from builders import FloatModel
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node(op, ["x", "x"], ["y"], name="self")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 128, 128])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    setup(None)
    project = make_project(tmp_path, FloatModel(model, {"x": [1, 1, 128, 128]}, {"x"}), cal_count=4)
    project.write(calibration_parameters={"calibration_type": "max", "optimization": "set_all_nodes_int16"})
    paths = makertbin(project.config_path, "onnx")
    assert [n.op_type for n in onnx.load(str(paths["quantized"])).graph.node if n.op_type.startswith("HzLut")]
    calibrated, quantized = (HB_ONNXRuntime(model_file=str(paths[k])) for k in ("calibrated", "quantized"))
    x = np.linspace(-3, 3, 128 * 128, dtype=np.float32).reshape(1, 1, 128, 128)  # every few int16 levels
    c, q = calibrated.run(None, {"x": x})[0], quantized.run(None, {"x": x})[0].astype(np.float32)
    assert np.array_equal(c, q), f"{int((c != q).sum())} values differ, by up to {np.abs(c - q).max()}"
