"""GPTQ weight rounding: lower layer output error than nearest rounding, same grid."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from hbtools.graph.graph import GraphView
from hbtools.quant import weight_rounding as wr


def _conv_model(w: np.ndarray, group: int, pads: list[int]):
    c_in = w.shape[1] * group
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c_in, 12, 12])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    conv = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", group=group, pads=pads,
                            kernel_shape=list(w.shape[2:]))
    graph = helper.make_graph([conv], "g", [x], [y], [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # what the installed onnxruntime reads
    return model


def _correlated_inputs(rng: np.random.Generator, channels: int, count: int) -> list[np.ndarray]:
    """Inputs whose channels share a common component (as real feature maps do)."""
    common = rng.normal(size=(count, 1, 12, 12))
    return [np.maximum(1.0 + common[k] + 0.2 * rng.normal(size=(channels, 12, 12)), 0)[None].astype(np.float32)
            for k in range(count)]


@pytest.mark.parametrize("group", [1, 8])
def test_gptq_rounding_lowers_layer_output_error(group: int) -> None:
    rng = np.random.default_rng(1)
    w = rng.normal(size=(8, 8 // group, 3, 3)).astype(np.float32)
    model = _conv_model(w, group, [1, 1, 1, 1])
    node = model.graph.node[0]
    assert wr.roundable(node, GraphView(model))
    feeds = [{"x": x} for x in _correlated_inputs(rng, 8, 6)]
    hessian = dict(wr.input_hessians(model, [node], feeds, positions=144))["conv"]
    assert hessian.shape == (group, (8 // group) * 9, (8 // group) * 9)
    thresholds = np.abs(w).reshape(8, -1).max(axis=1).astype(np.float64)
    offsets = wr.rounding_offsets(w, thresholds, group, hessian)
    assert offsets.dtype == np.int8 and offsets.shape == w.shape
    scale = (thresholds / 127).reshape(-1, 1, 1, 1)
    nearest = np.clip(np.round(w / scale), -127, 127)
    chosen = np.clip(nearest + offsets, -127, 127)
    assert np.abs(offsets).max() <= 3, "GPTQ moves weights by a few steps at most"
    # The measured output error of the conv on the data, not only the proxy.
    def out_err(integers: np.ndarray) -> float:
        wq = (integers * scale).astype(np.float32)
        ref_model, q_model = _conv_model(w, group, [1, 1, 1, 1]), _conv_model(wq, group, [1, 1, 1, 1])
        import onnxruntime as ort
        ref = ort.InferenceSession(ref_model.SerializeToString(), providers=["CPUExecutionProvider"])
        got = ort.InferenceSession(q_model.SerializeToString(), providers=["CPUExecutionProvider"])
        return float(np.mean([np.mean((ref.run(None, f)[0] - got.run(None, f)[0]) ** 2) for f in feeds]))

    before, after = out_err(nearest), out_err(chosen)
    assert after < 0.8 * before, f"output MSE {before:.3g} -> {after:.3g}"
    proxy_before = wr.output_error(w, nearest, thresholds, group, hessian)
    proxy_after = wr.output_error(w, chosen, thresholds, group, hessian)
    assert proxy_after < proxy_before


def _textbook_gptq(w: np.ndarray, thresholds: np.ndarray, group: int, hessian: np.ndarray) -> np.ndarray:
    """GPTQ as its paper states it: H⁻¹'s upper Cholesky factor, one column at a time, every
    rounding error spread at once over all later columns. The integers it chooses."""
    out, k = w.shape[0], int(np.prod(w.shape[1:]))
    scale = (thresholds.astype(np.float32) / np.float32(127)).astype(np.float64).reshape(group, -1)
    work = w.astype(np.float64).reshape(group, out // group, k).copy()
    h = hessian + wr.DAMPING * np.diagonal(hessian, axis1=1, axis2=2).mean(axis=1)[:, None, None] * np.eye(k)
    upper = np.linalg.cholesky(np.linalg.inv(h)).transpose(0, 2, 1)
    chosen = np.empty_like(work)
    for j in range(k):
        q = np.clip(np.round(work[:, :, j] / scale), -127, 127)
        chosen[:, :, j] = q
        err = (work[:, :, j] - q * scale) / upper[:, j, j][:, None]
        work[:, :, j + 1:] -= err[:, :, None] * upper[:, None, j, j + 1:]
    return chosen.reshape(w.shape)


@pytest.mark.parametrize("group", [1, 2])
def test_blocked_rounding_chooses_what_textbook_gptq_chooses(group: int) -> None:
    """A layer of several blocks of columns (18 x 3 x 3 = 162 > BLOCK per group): the lazy block
    updates and the factorization of the flipped Hessian choose the same integers."""
    rng = np.random.default_rng(3)
    channels = 18 * group
    w = rng.normal(size=(6, channels // group, 3, 3)).astype(np.float32)
    k = w[0].size
    assert k > wr.BLOCK
    x = rng.normal(size=(group, k, 3 * k)) + rng.normal(size=(group, k, 1))
    hessian = np.matmul(x, x.transpose(0, 2, 1)) / x.shape[2]
    thresholds = np.abs(w).reshape(6, -1).max(axis=1).astype(np.float64)
    offsets = wr.rounding_offsets(w, thresholds, group, hessian)
    nearest = np.clip(np.round(w / (thresholds / 127).reshape(-1, 1, 1, 1)), -127, 127)
    textbook = _textbook_gptq(w, thresholds, group, hessian)
    assert np.array_equal(nearest + offsets, textbook)
    assert np.abs(offsets).max() >= 1  # the rounding did move weights


def test_patches_match_a_direct_convolution(monkeypatch) -> None:
    """Patches times the weight reproduce the conv output: at every position, in order, across chunks;
    and where positions are sampled, at the sampled ones."""
    rng = np.random.default_rng(2)
    w = rng.normal(size=(4, 2, 3, 3)).astype(np.float32)
    x = rng.normal(size=(4, 9, 9)).astype(np.float32)
    geo = wr.ConvGeometry(group=2, kernel=(3, 3), strides=(2, 2), dilations=(1, 1), pads=(1, 1, 1, 1))
    monkeypatch.setattr(wr, "CHUNK_BYTES", 7 * 4 * 9 * 8)  # 25 positions: chunks of 7, 7, 7 and 4
    chunks = list(wr.patches(x, geo, np.random.default_rng(0), positions=10_000))
    assert [c.shape[2] for c in chunks] == [7, 7, 7, 4]
    import onnxruntime as ort
    model = _conv_model(w, 2, [1, 1, 1, 1])
    for n in model.graph.node:
        n.attribute.extend([helper.make_attribute("strides", [2, 2])])
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_value = 9
    model.graph.input[0].type.tensor_type.shape.dim[3].dim_value = 9
    y = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x[None]})[0]
    expected = y[0].reshape(2, 2, -1)  # [group, out/group, positions]
    got = np.matmul(w.reshape(2, 2, -1), np.concatenate(chunks, axis=2))
    assert np.allclose(got, expected, atol=1e-4)
    sampled = np.matmul(w.reshape(2, 2, -1), np.concatenate(list(wr.patches(x, geo, np.random.default_rng(0), 10)),
                                                             axis=2))
    assert sampled.shape[2] == 10
    distance = np.abs(sampled[:, :, :, None] - expected[:, :, None, :]).max(axis=(0, 1))  # [sampled, all]
    assert (distance.min(axis=1) < 1e-4).all() and len(set(distance.argmin(axis=1))) == 10


def test_rounding_offsets_flow_from_calibrated_to_quantized_model(tmp_path) -> None:
    """Offsets stored with a weight's HzCalibration decide the quantized model's integers,
    and the calibrated model (its float emulation) follows them too."""
    import onnx
    from builders import held_out, make_project, resnet_like

    from hbtools.config.loader import load_config
    from hbtools.log import setup
    from hbtools.march.profiles import get_profile
    from hbtools.ops.base import attrs_of
    from hbtools.pipeline import quantize
    from hbtools.pipeline.runner import makertbin
    from hbtools.runtime import HB_ONNXRuntime

    setup(None)
    fm = resnet_like()
    project = make_project(tmp_path, fm, cal_count=6, calibration_type="max")
    paths = makertbin(project.config_path, "onnx")
    calibrated = onnx.load(str(paths["calibrated"]))
    inits = {t.name: numpy_helper.to_array(t) for t in calibrated.graph.initializer}
    rng = np.random.default_rng(3)
    moved = {}
    for node in calibrated.graph.node:
        if node.op_type == "HzCalibration" and attrs_of(node)["kind"] == "weight":
            offsets = rng.integers(-1, 2, size=inits[node.input[0]].shape).astype(np.int8)
            calibrated.graph.initializer.append(numpy_helper.from_array(offsets, f"{node.input[0]}_rounding"))
            node.input.append(f"{node.input[0]}_rounding")
            moved[node.output[0]] = (node, offsets)
    assert moved
    config = load_config(project.config_path, "onnx")
    result = quantize.run(calibrated, config, get_profile(config.model.march))
    q_inits = {t.name: numpy_helper.to_array(t) for t in result.model.graph.initializer}
    assert not any(name.endswith("_rounding") for name in q_inits)
    for conv in (n for n in calibrated.graph.node if n.op_type == "Conv" and n.input[1] in moved):
        node, offsets = moved[conv.input[1]]
        levels = wr_levels(inits[node.input[0]], np.asarray(attrs_of(node)["scales"], dtype=np.float32), offsets)
        assert np.array_equal(q_inits[f"{conv.name}_weight_quantized"].reshape(levels.shape), levels)
    # The emulation tracks the moved integers: calibrated and quantized outputs stay together,
    # while both move away from the model without offsets.
    (tmp_path / "c.onnx").write_bytes(calibrated.SerializeToString())
    (tmp_path / "q.onnx").write_bytes(result.model.SerializeToString())
    xs = held_out(fm, count=3, seed=7)
    outs = {}
    for key, path in (("c", tmp_path / "c.onnx"), ("q", tmp_path / "q.onnx"), ("plain", paths["calibrated"])):
        sess = HB_ONNXRuntime(model_file=str(path))
        outs[key] = np.concatenate([sess.run(None, {sess.input_names[0]: x})[0].ravel() for x in xs])
    scale = np.abs(outs["plain"]).max()
    assert np.abs(outs["c"] - outs["q"]).max() < 0.02 * scale
    assert np.abs(outs["c"] - outs["plain"]).max() > 5 * np.abs(outs["c"] - outs["q"]).max()


def test_default_calibration_records_its_rounding_decision(tmp_path, caplog) -> None:
    """makertbin with default calibration runs the GPTQ step, logs its decision, and the
    calibrated model carries rounding offsets exactly when it says "kept" (how offsets reach
    the quantized model is checked by the test above)."""
    import logging

    import onnx
    from builders import make_project, resnet_like

    from hbtools.log import setup
    from hbtools.pipeline.runner import makertbin

    setup(None)
    logging.getLogger("hbtools").addHandler(caplog.handler)
    try:
        project = make_project(tmp_path, resnet_like(), cal_count=12, calibration_type="default")
        paths = makertbin(project.config_path, "onnx")
    finally:
        logging.getLogger("hbtools").removeHandler(caplog.handler)
    line = next(r.getMessage() for r in caplog.records if "weight rounding (GPTQ)" in r.getMessage())
    calibrated = onnx.load(str(paths["calibrated"]))
    rounded = [n for n in calibrated.graph.node if n.op_type == "HzCalibration" and len(n.input) > 1]
    assert bool(rounded) == ("(kept)" in line), line


def test_without_int16_rounding_and_bias_correction_are_judged_on_the_int8_model(tmp_path, caplog) -> None:
    """On a march without int16 (bernoulli2) no int16 search follows: GPTQ and bias correction are kept
    only if the best method's output cosine, int8 activations as the user runs them, goes up; the
    numbers in the decision are the best of the method scores logged before and after."""
    import logging
    import re

    import onnx
    from builders import make_project, resnet_like

    from hbtools.log import setup
    from hbtools.pipeline.runner import makertbin

    setup(None)
    logging.getLogger("hbtools").addHandler(caplog.handler)
    try:
        project = make_project(tmp_path, resnet_like(), march="bernoulli2", cal_count=12,
                               calibration_type="default")
        paths = makertbin(project.config_path, "onnx")
    finally:
        logging.getLogger("hbtools").removeHandler(caplog.handler)
    lines = [r.getMessage() for r in caplog.records]
    assert not any("weights-only" in line for line in lines)
    method = re.compile(r"calibration method (.+?)(?: with (rounded weights|corrected biases|zero points))?: output "
                        r"cosine (?:below [0-9.]+ \(at most )?([0-9.]+)")
    scores: dict[str | None, list[float]] = {}
    for line in lines:
        found = method.match(line)
        if found:
            scores.setdefault(found.group(2), []).append(float(found.group(3)))
    decisions = [line for line in lines if line.startswith("weight rounding (GPTQ)") and "with the best method" in line]
    assert decisions, lines
    before, after = map(float, re.search(r"output cosine ([0-9.]+) -> ([0-9.]+)", decisions[0]).groups())
    # the grids GPTQ starts from: with the zero points the search tried before it if they were kept
    zero_points = any(line.startswith("zero points on") and line.endswith("(kept)") for line in lines)
    assert before == pytest.approx(max(scores["zero points" if zero_points else None]), abs=1e-6)
    assert after == pytest.approx(max(scores["rounded weights"]), abs=1e-6)
    kept = "(kept)" in decisions[0]
    assert kept == (after > before)
    calibrated = onnx.load(str(paths["calibrated"]))
    rounded = [n for n in calibrated.graph.node if n.op_type == "HzCalibration" and len(n.input) > 1]
    assert bool(rounded) == kept


def wr_levels(w: np.ndarray, scales: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    s = scales.reshape(-1, *[1] * (w.ndim - 1))
    return np.clip(np.round(w / s) + offsets, -127, 127).astype(np.int8)


def test_debugger_sees_rounding_offsets_as_weight_error(tmp_path) -> None:
    """The debugger quantizes a weight with its stored offsets: a conv whose offsets push
    every integer 3 steps off ranks first in weight sensitivity."""
    import onnx
    from builders import resnet_like
    from debug_support import convert_with_dump

    import hbtools.debug as dbg
    from hbtools.log import setup
    from hbtools.ops.base import attrs_of

    setup(None)
    dumped = convert_with_dump(tmp_path, resnet_like())
    model = onnx.load(str(dumped.calibrated))
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    weights = [n for n in model.graph.node if n.op_type == "HzCalibration" and attrs_of(n)["kind"] == "weight"]
    assert len(weights) >= 2
    for k, node in enumerate(weights):
        shape = inits[node.input[0]].shape
        offsets = np.full(shape, 3 if k == 1 else 0, dtype=np.int8)
        model.graph.initializer.append(numpy_helper.from_array(offsets, f"{node.input[0]}_rounding"))
        node.input.append(f"{node.input[0]}_rounding")
    path = tmp_path / "rounded_calibrated_model.onnx"
    onnx.save(model, str(path))
    result = dbg.get_sensitivity_of_nodes(model_or_file=str(path), calibrated_data=str(dumped.data),
                                          node_type="weight")
    assert next(iter(result)) == weights[1].name, result


def test_weights_that_are_fixed_fractions_get_an_exact_grid() -> None:
    """A bilinear kernel (1 : 3 : 3 : 9 / 16) is represented exactly (on the max / 127 grid it was
    14 : 42 : 127); trained weights keep their largest magnitude as the threshold."""
    from hbtools.quant import grids
    from hbtools.quant.plan import exact_grid_thresholds

    taps = np.array([1, 3, 3, 1], np.float32) / 4
    bilinear = np.outer(taps, taps).reshape(1, -1).astype(np.float64)
    trained = np.random.default_rng(0).normal(size=(3, 16))
    thresholds = exact_grid_thresholds(np.vstack([bilinear, trained]))
    steps = grids.scales_for(thresholds, grids.WEIGHT_BITS)
    levels = grids.quantize(bilinear.astype(np.float32), steps[:1].reshape(-1, 1), grids.WEIGHT_BITS)
    assert np.allclose(levels * steps[0], bilinear, rtol=0, atol=1e-7)
    assert np.array_equal(thresholds[1:], np.abs(trained).max(axis=1))


def test_hessian_takes_every_position_of_a_large_map() -> None:
    """A 96x96 map has 9216 output positions, more than the 4096 once sampled: the Hessian is E[x xᵀ]
    over all of them, so the rounding does not depend on a draw of positions."""
    rng = np.random.default_rng(5)
    w = rng.normal(size=(3, 2, 3, 3)).astype(np.float32)
    model = _conv_model(w, 1, [1, 1, 1, 1])
    for k in (2, 3):
        model.graph.input[0].type.tensor_type.shape.dim[k].dim_value = 96
    feeds = [{"x": rng.normal(size=(1, 2, 96, 96)).astype(np.float32)} for _ in range(2)]
    hessian = dict(wr.input_hessians(model, [model.graph.node[0]], feeds))["conv"]
    want = 0.0
    for feed in feeds:
        cols = np.lib.stride_tricks.sliding_window_view(np.pad(feed["x"][0], ((0, 0), (1, 1), (1, 1))), (3, 3),
                                                        axis=(1, 2))  # C, 96, 96, 3, 3
        cols = cols.transpose(0, 3, 4, 1, 2).reshape(18, -1).astype(np.float64)
        want = want + cols @ cols.T / cols.shape[1]
    assert np.allclose(hessian[0], want / len(feeds), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("op", "trans_b"), [("MatMul", 0), ("Gemm", 0), ("Gemm", 1)])
def test_matrix_product_weights_are_rounded_as_a_1x1_conv(op: str, trans_b: int) -> None:
    """A MatMul or Gemm weight gets the offsets its 1x1-conv form gets (rows of the input's last axis are
    its positions), in its own layout."""
    rng = np.random.default_rng(6)
    k, n = 12, 5
    tokens = [np.maximum(rng.normal(size=(1, 16, k)), 0).astype(np.float32) for _ in range(4)]
    w = rng.normal(size=(k, n)).astype(np.float32)
    weight = w.T.copy() if trans_b else w
    attrs = {"transB": trans_b} if op == "Gemm" else {}
    x_shape = [16, k] if op == "Gemm" else [1, 16, k]
    node = helper.make_node(op, ["x", "w"], ["y"], name="mm", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    feeds = [{"x": t.reshape(x_shape)} for t in tokens]
    view = GraphView(model)
    assert wr.roundable(node, view)
    hessian = dict(wr.input_hessians(model, [node], feeds))["mm"]
    rows = np.concatenate([t.reshape(-1, k) for t in tokens]).astype(np.float64)
    want_h = sum(r.T @ r / len(r) for r in np.split(rows, 4 if op == "MatMul" else 64)) / (4 if op == "MatMul" else 64)
    assert np.allclose(hessian[0], want_h)
    thresholds = np.abs(w).max(axis=0)
    got = wr.weight_offsets(node, view, thresholds, hessian)
    as_conv = wr.rounding_offsets(w.T[:, :, None, None], thresholds, 1, hessian)[:, :, 0, 0]
    assert got.shape == weight.shape
    np.testing.assert_array_equal(got, as_conv if trans_b else as_conv.T)


def test_a_hessian_from_too_few_positions_is_not_used() -> None:
    """A 3x3 conv over 32 channels has 288 inputs per patch: one 12x12 sample gives 144 positions, too few
    for its Hessian (the weight keeps nearest rounding); nine give 1296, at least 4 per input."""
    rng = np.random.default_rng(8)
    w = rng.normal(size=(4, 32, 3, 3)).astype(np.float32)
    model = _conv_model(w, 1, [1, 1, 1, 1])
    feeds = [{"x": rng.normal(size=(1, 32, 12, 12)).astype(np.float32)} for _ in range(9)]
    node = model.graph.node[0]
    assert dict(wr.input_hessians(model, [node], feeds[:1])) == {}
    assert set(dict(wr.input_hessians(model, [node], feeds))) == {"conv"}


def test_a_hessian_the_samples_cannot_fill_is_not_built() -> None:
    """A classifier's dense layer over a flattened map (VGG16's 7x7x512 = 25088 inputs in a Keras export) gets
    one row per sample: 8 samples can never give it 4 positions per input, so its Hessian would be dropped.
    It is not built at all: a 4096-input one is 134 MB of float64 (25088 inputs: 5 GB, 16 GB at peak with the
    products), while the conv before it still gets its Hessian."""
    import tracemalloc

    rng = np.random.default_rng(9)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Flatten", ["c"], ["f"], name="flatten"),
             helper.make_node("MatMul", ["f", "d"], ["y"], name="dense")]
    inits = [numpy_helper.from_array(rng.normal(size=(16, 4, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(size=(4096, 4)).astype(np.float32), "d")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    feeds = [{"x": rng.normal(size=(1, 4, 16, 16)).astype(np.float32)} for _ in range(8)]
    tracemalloc.start()
    try:
        hessians = dict(wr.input_hessians(model, [nodes[0], nodes[2]], feeds))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert set(hessians) == {"conv"}
    assert peak < 32_000_000, f"peak {peak / 1e6:.0f} MB: the dense layer's Hessian was built"


def test_a_wide_layer_on_a_large_map_samples_its_positions() -> None:
    """A 3x3x256 conv on a 160x160 map (CRAFT at 640) would take 25600 patches of 2304 inputs per sample, 1.4e11
    multiply-accumulates: GPTQ ran for many minutes. Its positions are sampled down to HESSIAN_PRODUCTS, which the
    densest layer of the corpus (3x3x96 on 120x120, PP-OCR det at 480) stays within, all its positions taken."""
    rng = np.random.default_rng(10)

    def limit(c_in: int) -> int:  # positions per sample, whatever the map
        model = _conv_model(rng.normal(size=(4, c_in, 3, 3)).astype(np.float32), 1, [1, 1, 1, 1])
        return wr._position_limit(model.graph.node[0], GraphView(model), wr.POSITIONS)

    assert limit(96) >= 120 * 120
    wide = limit(256)
    assert wide < 160 * 160 and wide * 2304**2 <= wr.HESSIAN_PRODUCTS
    assert wide * 8 >= wr.POSITIONS_PER_INPUT * 2304  # eight samples still fill its Hessian


def test_a_sampled_hessian_is_close_to_the_whole_one(monkeypatch) -> None:
    """Where the positions are sampled, the Hessian estimates the one over every position."""
    rng = np.random.default_rng(11)
    model = _conv_model(rng.normal(size=(3, 8, 3, 3)).astype(np.float32), 1, [1, 1, 1, 1])
    for k in (2, 3):
        model.graph.input[0].type.tensor_type.shape.dim[k].dim_value = 64
    feeds = [{"x": _correlated_inputs(rng, 8, 1)[0].repeat(6, axis=2).repeat(6, axis=3)[:, :, :64, :64]
              + 0.1 * rng.normal(size=(1, 8, 64, 64)).astype(np.float32)} for _ in range(4)]
    node = model.graph.node[0]
    whole = dict(wr.input_hessians(model, [node], feeds))["conv"]
    monkeypatch.setattr(wr, "HESSIAN_PRODUCTS", 1024 * 72**2)  # 1024 of the 4096 positions per sample
    sampled = dict(wr.input_hessians(model, [node], feeds))["conv"]
    assert not np.array_equal(sampled, whole)
    assert np.linalg.norm(sampled - whole) <= 0.05 * np.linalg.norm(whole)
