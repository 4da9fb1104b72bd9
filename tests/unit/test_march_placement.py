"""March profiles as data, and the BPU/CPU placement they give (build_partition on small graphs)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from builders import _Graph, make_project
from onnx import ModelProto, TensorProto

from hbtools.config.model import NodeInfo
from hbtools.march.constraints import classify_broadcast
from hbtools.march.profiles import BROADCASTS, FORMS, PROFILES, get_profile
from hbtools.ops import registry
from hbtools.pipeline import optimize
from hbtools.pipeline.runner import makertbin
from hbtools.quant.units import Partition, build_partition
from hbtools.tools.verifier import verify
from horizon_tc_ui import HB_ONNXRuntime

MARCHES = ("bernoulli2", "bayes", "bayes-e", "nash-e", "nash-m")


def _partition(model: ModelProto, march: str, node_info: dict[str, NodeInfo] | None = None, **kw) -> Partition:
    return build_partition(model, get_profile(march), node_info or {}, **kw)


def _placement(part: Partition) -> dict[str, tuple[str, str]]:
    return {name: (on, sub) for name, on, sub, _ in part.rows()}


def _reason(part: Partition, node: str) -> str:
    return part.unit_of_node[node].reason


@pytest.mark.parametrize("march", MARCHES)
def test_profiles_are_well_formed_data(march: str) -> None:
    p = get_profile(march.upper())  # case-insensitive
    assert p.name == march and p.board and p.peak_int8_tops > 0 and p.ddr_gbps > 0 and p.core_num
    assert p.bpu_ops == frozenset(p.ops)
    for op, rule in p.ops.items():
        # a built-in unit kind, or one an op class quantizes itself (HzOp.unit_kind)
        assert all(f in FORMS or registry.op_for_unit_kind(f) is not None for f in rule.forms), op
        assert set(rule.broadcast) <= set(BROADCASTS), op
        assert 1 <= rule.ranks[0] <= rule.ranks[1], op
        assert rule.table_type == "" or rule.table_type.startswith("Hz"), op
    assert p.ops["Conv"].table_type == "HzSQuantizedConv"
    assert p.ops["Sigmoid"].table_type == "HzLut"
    assert p.ops["Mul"].table_type == "HzSQuantizedMul"


def test_march_differences_live_in_the_data() -> None:
    x3, x5 = PROFILES["bernoulli2"], PROFILES["bayes-e"]
    assert not x3.int16 and x5.int16
    assert x3.quantized_input_layout == "NHWC"
    assert "Reshape" not in x3.ops and "Reshape" in x5.ops
    assert x3.ops["Conv"].kernel < x5.ops["Conv"].kernel
    assert x3.ops["Conv"].ranks == (4, 4)


@pytest.mark.parametrize(("a", "b", "form"), [
    ([1, 8, 4, 4], [1, 8, 4, 4], "same"),
    ([1, 8, 4, 4], [1], "scalar"),
    ([1, 8, 4, 4], [1, 8, 1, 1], "channel"),
    ([1, 8, 4, 4], [8, 1, 1], "channel"),
    ([1, 8, 4, 4], [1, 1, 4, 4], "general"),
    ([1, 8, 4, 4], [1, 3, 4, 4], None),
    # unknown dims (a sequence length behind a Loop): known where the other operand is 1 on each of them
    ([1, None, 11], [11], "general"),
    ([1, 8, None, None], [8, 1, 1], "channel"),
    ([None, 8], [1], "scalar"),
    ([1, None, 11], [7, 11], None),
    ([1, None, 11], [1, None, 11], None),
    ([None, 11], [1, 7, 11], None),
])
def test_classify_broadcast(a: list[int], b: list[int], form: str | None) -> None:
    assert classify_broadcast(a, b) == form


def _reshape_pow_chain() -> ModelProto:
    """conv -> Reshape to 3-D -> Pow -> Reshape back -> conv: BPU on bayes-e, split on bernoulli2."""
    g = _Graph(7)
    c1 = g.conv("data", 3, 8)
    flat = g.op("Reshape", [c1, g.const(np.array([1, 8, 64], dtype=np.int64), "s3")])
    sq = g.op("Pow", [flat, g.const(np.float32(2.0))])
    back = g.op("Reshape", [sq, g.const(np.array([1, 8, 8, 8], dtype=np.int64), "s4")])
    out = g.conv(back, 8, 4)
    return g.model({"data": [1, 3, 8, 8]}, [out]).model


def test_reshape_chain_splits_subgraphs_on_bernoulli2() -> None:
    model = _reshape_pow_chain()
    x5 = _partition(model, "bayes-e")
    assert {sub for _, _, sub, _ in x5.rows()} == {"id(0)"}
    x3 = _partition(model, "bernoulli2")
    placed = _placement(x3)
    assert placed["Conv_0"] == ("BPU", "id(0)")
    assert placed["Reshape_0"] == ("CPU", "--") and placed["Pow_0"] == ("CPU", "--")
    assert placed["Conv_1"] == ("BPU", "id(1)")
    assert "Reshape is not supported on the BPU of bernoulli2 (RDK X3)" in _reason(x3, "Reshape_0")
    assert "3-D tensor [1, 8, 64]" in _reason(x3, "Pow_0") and "4-D" in _reason(x3, "Pow_0")
    # Rows: one per node, CPU rows show the ONNX type.
    assert [r[0] for r in x3.rows()] == [n.name for n in model.graph.node]
    assert ("Pow_0", "CPU", "--", "Pow") in x3.rows()


def test_a_computed_0d_bound_is_named_as_the_input_that_breaks_the_rank_rule() -> None:
    """openWakeWord's melspectrogram: Clip(x, min=ReduceMax(x, keepdims=0) - 80): x is 4-D, its
    bound is a computed 0-D tensor; the reason must say the bound is the 0-D tensor, not the Clip."""
    g = _Graph(13)
    c = g.conv("data", 3, 8)
    peak = g.op("ReduceMax", [c], keepdims=0)
    low = g.op("Sub", [peak, g.const(np.float32(80.0))])
    out = g.op("Clip", [c, low])
    part = _partition(g.model({"data": [1, 3, 8, 8]}, [out]).model, "bayes-e")
    reason = _reason(part, "Clip_0")
    assert f"Clip reads a 0-D tensor '{low}' (input 1" in reason and "1-D to 5-D" in reason, reason
    assert "Sub on a 0-D tensor []" in _reason(part, "Sub_0")
    # the reduction to it: 'ReduceMax on a 0-D tensor' read as if its 4-D input were 0-D (LPRNet's reasons)
    reduced = _reason(part, "ReduceMax_0")
    assert "ReduceMax of [1, 8, 8, 8] gives a 0-D tensor []" in reduced, reduced


@pytest.mark.parametrize(("build", "node", "x3_reason"), [
    (lambda g: g.op("Transpose", [g.conv("data", 3, 8)], perm=[0, 1, 3, 2]), "Transpose_0", "perm [0, 1, 3, 2]"),
    (lambda g: g.op("Concat", [g.conv("data", 3, 8), g.conv("data", 3, 8)], axis=0), "Concat_0", "axis 0"),
    (lambda g: g.op("Mul", [g.conv("data", 3, 8), g.op("Relu", [g.conv("data", 3, 1)])]), "Mul_0",
     "general broadcasting"),
])
def test_march_constraints_give_reasons(build, node: str, x3_reason: str) -> None:
    g = _Graph(8)
    out = build(g)
    model = g.model({"data": [1, 3, 8, 8]}, [g.conv(out, 8 if node != "Concat_0" else 8, 4, k=1)]).model
    assert _placement(_partition(model, "bayes-e"))[node][0] == "BPU"
    x3 = _partition(model, "bernoulli2")
    assert _placement(x3)[node][0] == "CPU"
    assert x3_reason in _reason(x3, node) and "bernoulli2" in _reason(x3, node)


def test_kernel_limit_is_per_march() -> None:
    g = _Graph(9)
    model = g.model({"data": [1, 3, 16, 16]}, [g.conv("data", 3, 4, k=9)]).model
    assert _placement(_partition(model, "bayes-e"))["Conv_0"][0] == "BPU"
    x3 = _partition(model, "bernoulli2")
    assert _placement(x3)["Conv_0"][0] == "CPU"
    assert "kernel [9, 9] exceeds 7" in _reason(x3, "Conv_0")


def test_unlowered_and_unknown_ops_say_why() -> None:
    g = _Graph(10)
    c = g.conv("data", 3, 8)
    s = g.op("Softmax", [c], axis=1)
    t = g.op("Mul", [s, g.const(np.full([1, 8, 1, 1], 0.5, dtype=np.float32))])
    outputs = [g.conv(t, 8, 4), g.op("ReduceSum", [c, g.const(np.array([1], dtype=np.int64))]),
               g.op("DepthToSpace", [c], blocksize=2),
               g.op("Cast", [g.op("ArgMax", [c], axis=1)], to=TensorProto.FLOAT),
               g.op("Pow", [c, g.const(np.full([1, 8, 1, 1], 2.0, dtype=np.float32))])]
    model = g.model({"data": [1, 3, 8, 8]}, outputs).model
    x5 = _partition(model, "bayes-e")
    # Softmax, a per-channel constant, DepthToSpace, ReduceSum (a ReduceMean's integer sum) and an ArgMax over
    # 8 channels have integer kernels
    assert _placement(x5)["Softmax_0"][0] == _placement(x5)["Mul_0"][0] == _placement(x5)["DepthToSpace_0"][0] == "BPU"
    assert _placement(x5)["ReduceSum_0"][0] == _placement(x5)["ArgMax_0"][0] == "BPU"
    assert x5.unit_of_node["ArgMax_0"].table_type == "HzSQuantizedArgMax"
    assert "only scalar constants" in _reason(x5, "Pow_0")
    x3 = _partition(model, "bernoulli2")
    assert "Softmax is not supported on the BPU of bernoulli2" in _reason(x3, "Softmax_0")


def test_an_instance_norm_on_x3_is_named_as_the_op_hbtools_wrote_for_it() -> None:
    """The optimize stage writes an InstanceNormalization as its layer norm; on RDK X3 the reason said
    'LayerNormalization is not supported' next to the user's InstanceNorm node, an op the model does not have."""
    g = _Graph(13)
    c = g.conv("data", 3, 8)
    scale, bias = g.const(np.ones(8, np.float32), "scale"), g.const(np.zeros(8, np.float32), "bias")
    model = g.model({"data": [1, 3, 8, 8]}, [g.conv(g.op("InstanceNormalization", [c, scale, bias]), 8, 4)]).model
    norm = next(n.name for n in model.graph.node if n.op_type == "InstanceNormalization")
    x3 = _partition(optimize.run(model, get_profile("bernoulli2")), "bernoulli2")
    assert f"the optimize stage wrote {norm} as one" in _reason(x3, norm), _reason(x3, norm)


def test_the_flatten_written_for_a_reduce_mean_on_x3_says_whose_it_is() -> None:
    """``x.mean((2, 3))`` is written as a global pool and a Flatten; where the Flatten stays on RDK X3's CPU (before
    a graph output), its row bore the ReduceMean's name with the reason 'Flatten is not supported', an op the
    user's model does not have."""
    g = _Graph(13)
    pooled = g.op("ReduceMean", [g.conv("data", 3, 8)], axes=[2, 3], keepdims=0)
    model = g.model({"data": [1, 3, 8, 8]}, [g.gemm(pooled, 8, 4)]).model
    x3 = _partition(optimize.run(model, get_profile("bernoulli2")), "bernoulli2")
    flatten = next(u for u in x3.units if u.on == "CPU")
    assert flatten.main.op_type == "Flatten" and flatten.main.name != "ReduceMean_0", flatten.main.name
    assert "(the optimize stage wrote this Flatten for ReduceMean_0)" in flatten.reason, flatten.reason
    assert _placement(x3)["ReduceMean_0"] == ("BPU", "id(0)")


def test_overrides_and_isolated_ops() -> None:
    """A Transpose between two CPU ops stays in float unless run_on_bpu or fast-perf (all_bpu) says otherwise."""
    g = _Graph(11)
    s1 = g.op("Hardmax", [g.conv("data", 3, 8)], axis=1)  # not a BPU op
    t = g.op("Transpose", [s1], perm=[0, 1, 3, 2])
    s2 = g.op("Hardmax", [t], axis=1)
    model = g.model({"data": [1, 3, 8, 8]}, [g.conv(s2, 8, 4)]).model
    default = _partition(model, "bayes-e")
    assert _placement(default)["Transpose_0"] == ("CPU", "--")
    assert "kept in float" in _reason(default, "Transpose_0")
    forced = _partition(model, "bayes-e", {"Transpose_0": NodeInfo(on="BPU")})
    assert _placement(forced)["Transpose_0"] == ("BPU", "id(1)")
    fast = _partition(model, "bayes-e", all_bpu=True)
    assert _placement(fast)["Transpose_0"] == ("BPU", "id(1)")
    assert _placement(fast)["Conv_1"] == ("BPU", "id(2)")
    on_cpu = _partition(model, "bayes-e", {"Conv_0": NodeInfo(on="CPU")})
    assert _placement(on_cpu)["Conv_0"] == ("CPU", "--")
    assert "run_on_cpu" in _reason(on_cpu, "Conv_0")


def test_a_join_of_results_into_a_model_output_runs_in_float() -> None:
    """A Concat joining results into a model output, even behind layout moves, runs on the CPU, so each
    piece leaves the BPU on its own grid; the Mul and Sigmoid that feed it stay on the BPU. A join that a BPU node
    also reads, integer outputs (set_model_output_int16), run_on_bpu and fast-perf keep it on the BPU."""
    g = _Graph(15)
    x = g.conv("data", 3, 8)
    boxes = g.op("Mul", [g.conv(x, 8, 4, k=1), g.const(np.float32(320.0), "stride")])
    scores = g.op("Sigmoid", [g.conv(x, 8, 3, k=1)])
    joined = g.op("Concat", [boxes, scores], axis=1)
    out = g.op("Transpose", [g.op("Reshape", [joined, g.const(np.array([1, 7, -1], np.int64), "s")])], perm=[0, 2, 1])
    model = g.model({"data": [1, 3, 8, 8]}, [out]).model
    part = _partition(model, "bayes-e")
    placed = _placement(part)
    assert [placed[n][0] for n in ("Conv_0", "Conv_1", "Mul_0", "Conv_2", "Sigmoid_0")] == ["BPU"] * 5
    assert [placed[n][0] for n in ("Concat_0", "Reshape_0", "Transpose_0")] == ["CPU"] * 3
    assert "joins several results into a model output" in _reason(part, "Concat_0")
    for kept in (_partition(model, "bayes-e", integer_outputs=True), _partition(model, "bayes-e", all_bpu=True),
                 _partition(model, "bayes-e", {"Concat_0": NodeInfo(on="BPU")})):
        assert _placement(kept)["Concat_0"][0] == "BPU"
    g = _Graph(16)
    x = g.conv("data", 3, 8)
    joined = g.op("Concat", [g.conv(x, 8, 4, k=1), g.op("Sigmoid", [g.conv(x, 8, 3, k=1)])], axis=1)
    model = g.model({"data": [1, 3, 8, 8]}, [joined, g.conv(joined, 7, 2, k=1)]).model
    assert _placement(_partition(model, "bayes-e"))["Concat_0"][0] == "BPU"


def test_small_subgraphs_between_cpu_nodes_stay_in_float() -> None:
    """A BPU subgraph between CPU nodes doing less work than a BPU call costs (an unrolled recurrence's
    per-step product) runs in float; a large one, one run_on_bpu names, and the model's largest stay."""
    g = _Graph(13)
    x = g.op("Hardmax", [g.conv("data", 3, 16)], axis=1)  # 442368 MACs: the largest subgraph
    small = g.op("Hardmax", [g.conv(x, 16, 4, k=1)], axis=1)  # 65536 MACs
    large = g.op("Hardmax", [g.conv(x, 16, 16)], axis=1)  # 2359296 MACs
    model = g.model({"data": [1, 3, 32, 32]}, [small, large]).model
    part = _partition(model, "bayes-e")
    placed = _placement(part)
    assert placed["Conv_0"] == ("BPU", "id(0)") and placed["Conv_2"] == ("BPU", "id(1)")
    assert placed["Conv_1"] == ("CPU", "--")
    assert "a BPU subgraph of 65536 MACs between CPU nodes" in _reason(part, "Conv_1")
    assert "run_on_bpu" in _reason(part, "Conv_1")
    assert _placement(_partition(model, "bayes-e", {"Conv_1": NodeInfo(on="BPU")}))["Conv_1"][0] == "BPU"
    assert _placement(_partition(model, "bayes-e", all_bpu=True))["Conv_1"][0] == "BPU"
    # after CPU nodes at the model's output (PESTO's final Softmax after a CPU Conv, hunt 15 D4) too
    g = _Graph(15)
    tail = g.op("Softmax", [g.op("Hardmax", [g.conv("data", 3, 16)], axis=1)], axis=1)
    part = _partition(g.model({"data": [1, 3, 32, 32]}, [tail]).model, "bayes-e")
    assert _placement(part)["Softmax_0"] == ("CPU", "--")
    assert "a BPU subgraph of 0 MACs after CPU nodes at the model's output" in _reason(part, "Softmax_0")
    # reading a BPU result the CPU reads as well (CenterNet's peaks: hm * (maxpool(hm) == hm), hunt 23 D5), it is
    # between CPU nodes too: that result is in float already
    g = _Graph(17)
    hm = g.op("Sigmoid", [g.conv("data", 3, 8)])
    keep = g.op("Cast", [g.op("Equal", [g.op("MaxPool", [hm], kernel_shape=[3, 3], pads=[1] * 4), hm])], to=1)
    part = _partition(g.model({"data": [1, 3, 16, 16]}, [g.op("Mul", [hm, keep])]).model, "bayes-e")
    placed = _placement(part)
    assert placed["Conv_0"] == ("BPU", "id(0)") and placed["Mul_0"] == ("CPU", "--"), placed
    assert {sub for on, sub in placed.values() if on == "BPU"} == {"id(0)"}
    # alone between CPU nodes, a small subgraph is the model's BPU part and stays
    g = _Graph(14)
    alone = g.op("Hardmax", [g.conv(g.op("Hardmax", ["data"], axis=1), 3, 4, k=1)], axis=1)
    assert _placement(_partition(g.model({"data": [1, 3, 8, 8]}, [alone]).model, "bayes-e"))["Conv_0"][0] == "BPU"


def test_run_on_bpu_of_an_impossible_node_warns(caplog: pytest.LogCaptureFixture,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # hbtools.log.setup (run by earlier CLI tests) stops propagation to the root logger caplog hooks.
    monkeypatch.setattr(logging.getLogger("hbtools"), "propagate", True)
    g = _Graph(12)
    model = g.model({"data": [1, 3, 8, 8]}, [g.op("Softmax", [g.conv("data", 3, 8)], axis=1)]).model
    with caplog.at_level("WARNING", logger="hbtools"):
        part = _partition(model, "bernoulli2", {"Softmax_0": NodeInfo(on="BPU"), "nope": NodeInfo(on="CPU")})
    assert _placement(part)["Softmax_0"][0] == "CPU"
    text = caplog.text
    assert "Softmax_0 cannot run on the BPU" in text and "bernoulli2" in text
    assert "nope" in text and "not in the optimized model" in text
    caplog.clear()
    with caplog.at_level("WARNING", logger="hbtools"):
        _partition(model, "bernoulli2", {"Softmax_0": NodeInfo(on="BPU")}, warn=False)
    assert not caplog.text


def test_division_of_two_tensors_on_bernoulli2_says_int16_is_missing() -> None:
    """On bayes-e a Div of two tensors is a product with an int16 reciprocal table; bernoulli2 has no int16,
    and its CPU reason says so rather than that no march could run it."""
    from hbtools.pipeline import optimize

    g = _Graph(16)
    c = g.conv("data", 3, 8)
    divisor = g.op("Add", [g.op("Relu", [g.conv("data", 3, 8)]), g.const(np.float32(1.0))])
    model = g.model({"data": [1, 3, 8, 8]}, [g.conv(g.op("Div", [c, divisor]), 8, 4)]).model
    x5 = _partition(optimize.run(model, get_profile("bayes-e")), "bayes-e")
    assert "Div_0" not in x5.unit_of_node or _placement(x5)["Div_0"][0] == "BPU"
    x3 = _partition(optimize.run(model, get_profile("bernoulli2")), "bernoulli2")
    assert _placement(x3)["Div_0"][0] == "CPU"
    assert "int16" in _reason(x3, "Div_0") and "bernoulli2 (RDK X3)" in _reason(x3, "Div_0")


def test_a_wide_decoder_conv_transpose_runs_on_the_bpu(tmp_path: Path) -> None:
    """A ViT / U-Net decoder upsampling (384 channels, k 4, stride 2) sums 6144 products per output:
    the lowering splits it into exact chunks, so it stays on the BPU instead of 'kept in float'."""
    g = _Graph(13)
    x = g.conv("data", 3, 384, k=1)
    w = g.const((0.01 * g.rng.standard_normal((384, 8, 4, 4))).astype(np.float32), "up_w")
    up = g.op("ConvTranspose", [x, w], kernel_shape=[4, 4], strides=[2, 2], pads=[1, 1, 1, 1])
    fm = g.model({"data": [1, 3, 4, 4]}, [g.conv(up, 8, 4)])
    part = _partition(fm.model, "bayes-e")
    assert _placement(part)["ConvTranspose_0"][0] == "BPU", _reason(part, "ConvTranspose_0")
    # Converted, the .bin (x86 simulator) and the quantized model agree exactly, and the quantized
    # model stays the calibrated model's integer twin.
    paths = makertbin(make_project(tmp_path, fm, cal_count=2).config_path, "onnx")
    assert all(o.passed for o in verify(paths["quantized"], paths["bin"], None, 3).outputs)
    x = np.random.default_rng(0).integers(0, 256, (1, 3, 4, 4), dtype=np.uint8)
    got = HB_ONNXRuntime(model_file=paths["quantized"]).run(None, {"data": x})[0].ravel()
    want = HB_ONNXRuntime(model_file=paths["calibrated"]).run(None, {"data": x})[0].ravel()
    assert float(got @ want / np.linalg.norm(got) / np.linalg.norm(want)) >= 0.9999


@pytest.mark.parametrize(("march", "patch"), [("bayes-e", 14), ("bayes-e", 10), ("bernoulli2", 6)])
def test_patch_embedding_with_a_stride_beyond_the_bpu_runs_there(tmp_path: Path, march: str, patch: int) -> None:
    """A patch embedding whose kernel the BPU takes but whose stride it does not (DINOv2's 14x14/14 on X5, whose
    convs stride at most 8) stayed on the CPU; as SpaceToDepth and a 1x1 Conv it runs on the BPU, same values."""
    from hbtools.pipeline import optimize

    g = _Graph(21)
    w = (0.05 * g.rng.standard_normal((16, 3, patch, patch))).astype(np.float32)
    tokens = g.op("Conv", ["data", g.const(w, "patch_w")], kernel_shape=[patch, patch], strides=[patch, patch])
    fm = g.model({"data": [1, 3, 4 * patch, 4 * patch]}, [g.conv(tokens, 16, 8, k=1)])
    part = _partition(optimize.run(fm.model, get_profile(march)), march)
    assert all(on == "BPU" for on, _ in _placement(part).values()), part.rows()
    project = make_project(tmp_path, fm, cal_count=2, march=march)
    paths = makertbin(project.config_path, "onnx")
    assert all(o.passed for o in verify(paths["quantized"], paths["bin"], None, 2).outputs)
    x = np.random.default_rng(1).integers(0, 256, (1, 3, 4 * patch, 4 * patch), dtype=np.uint8)
    got = HB_ONNXRuntime(model_file=paths["optimized"]).run(None, {"data": x})[0]
    want = HB_ONNXRuntime(model_file=paths["original"]).run(None, {"data": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("optimization", [None, "set_all_nodes_int16"])
def test_reduce_min_selects_levels_on_the_bpu_as_reduce_max_does(tmp_path: Path, optimization: str | None) -> None:
    """ReduceMin picks one of its input's levels, as ReduceMax does: it runs on the BPU between two convs
    (one subgraph, not two around a CPU node), and the calibrated and quantized models agree bit for bit
    (int8 and int16, on the integers or through a float kernel)."""
    g = _Graph(21)
    low = g.op("ReduceMin", [g.conv("data", 3, 8)], axes=[1], keepdims=1)
    fm = g.model({"data": [1, 3, 8, 8]}, [g.conv(g.op("Mul", [low, g.const(np.float32(0.5))]), 1, 4)], 13)
    part = _partition(fm.model, "bayes-e")
    assert _placement(part)["ReduceMin_0"] == ("BPU", "id(0)"), _reason(part, "ReduceMin_0")
    assert {sub for _, sub in _placement(part).values()} == {"id(0)"}
    assert _placement(_partition(fm.model, "bernoulli2"))["ReduceMin_0"][0] == "CPU"
    project = make_project(tmp_path, fm, cal_count=2)
    if optimization:
        project.write(calibration_parameters={"calibration_type": "max", "optimization": optimization})
    paths = makertbin(project.config_path, "onnx")
    assert all(o.passed for o in verify(paths["quantized"], paths["bin"], None, 2).outputs)
    for seed in range(3):
        x = np.random.default_rng(seed).integers(0, 256, (1, 3, 8, 8), dtype=np.uint8)
        got = HB_ONNXRuntime(model_file=paths["quantized"]).run(None, {"data": x})[0]
        want = HB_ONNXRuntime(model_file=paths["calibrated"]).run(None, {"data": x})[0]
        np.testing.assert_array_equal(got.astype(np.float32), want)


def test_conv_reason_names_every_limit_it_breaks() -> None:
    """An STFT written as a Conv (openwakeword's melspectrogram: 1-D kernel 512, stride 160) breaks the kernel
    and the stride limits. Long kernels are split into pieces on the BPU, strides are not, so a reason naming the
    kernel alone reads as if the split should have applied."""
    from onnx import helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((9, 1, 40)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="stft", kernel_shape=[40], strides=[20])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 400])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 9, 19])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    part = _partition(model, "bayes-e")
    assert _placement(part)["stft"][0] == "CPU"
    reason = _reason(part, "stft")
    assert "kernel [40] exceeds 15" in reason and "stride [20] exceeds 8" in reason, reason


@pytest.mark.parametrize("order", [[0, 1, 2, 3], [0, 2, 1, 3]])
def test_equal_small_subgraphs_keep_the_same_one_on_the_bpu_whatever_the_node_order(order: list[int]) -> None:
    """Two BPU products of equal work between CPU nodes (a 3-D Split and Concat on RDK X3): one stays on the BPU.
    Which one followed the node order, and the quantize stage rebuilds the partition from a graph whose nodes
    may come in another order than the calibrate stage's: a product then reached the BPU uncalibrated."""
    g = _Graph(1)
    halves = g.op("Split", ["x"], n_out=2, axis=0)
    products = [g.op("MatMul", [h, g.const(g.rng.standard_normal((4, 3)).astype(np.float32), "w")])
                for h in (halves, halves.replace("out0", "out1"))]
    out = g.op("Concat", products, axis=0)
    g.nodes = [g.nodes[k] for k in order]
    part = _partition(g.model({"x": [2, 3, 4]}, [out], opset=11).model, "bernoulli2")
    assert [n for n, (on, _) in _placement(part).items() if on == "BPU"] == ["MatMul_0"]


def test_a_concat_the_march_refuses_is_named_by_what_it_makes() -> None:
    """RDK X3's reason for an output Concat of 3-D heads named its first input's shape ('Concat on a 3-D tensor
    [1, 1152, 1]' for a [1, 2016, 1] output; hunt 32): true, but it reads as the wrong tensor."""
    g = _Graph(13)
    c = g.conv("data", 3, 8)
    heads = [g.op("Reshape", [g.conv(c, 8, k, k=1), g.const(np.array([1, -1, 1], np.int64), "shape")])
             for k in (2, 3)]
    out = g.op("Concat", heads, axis=1)
    part = _partition(g.model({"data": [1, 3, 4, 4]}, [out]).model, "bernoulli2")
    reason = _reason(part, "Concat_0")
    assert "Concat on a 3-D tensor [1, 80, 1]" in reason, reason
