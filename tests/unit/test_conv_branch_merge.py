"""Parallel Conv branches of one tensor, summed, become one Conv (RepVGG / MobileOne / RepViT in training form).

A training checkpoint exported as is reads a tensor through a k x k Conv+BN, a 1 x 1 Conv+BN and often an identity
BatchNorm, and adds them. Left apart, each branch output and each partial sum is rounded to int8 on the BPU and
runs as its own layer (MobileOne-S0 on RDK X3: top-1 0.750 against 0.860 reparameterised, 2.8x the latency).
The optimize stage writes the sum as one Conv whose kernel is the sum of the zero-padded kernels.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from builders import _Graph

from hbtools.graph.origins import recorded_fusions
from hbtools.march.profiles import get_profile
from hbtools.pipeline import optimize

C, H, W = 8, 10, 12


def _run(model, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"feat": x})[0]


def _conv(g: _Graph, x: str, k: int, *, cout: int = C, cin: int = C, groups: int = 1, stride: int = 1,
          pad: int | None = None) -> str:
    w = g.rng.standard_normal((cout, cin // groups, k, k)).astype(np.float32)
    b = (0.1 * g.rng.standard_normal(cout)).astype(np.float32)
    p = k // 2 if pad is None else pad
    return g.op("Conv", [x, g.const(w, "w"), g.const(b, "b")], kernel_shape=[k, k], pads=[p] * 4,
                strides=[stride, stride], group=groups)


def _sum(g: _Graph, terms: list[str]) -> str:
    acc = terms[0]
    for t in terms[1:]:
        acc = g.op("Add", [acc, t])
    return acc


def _optimize(fm, march: str = "bernoulli2"):
    optimized = optimize.run(fm.model, get_profile(march))
    x = np.random.default_rng(5).standard_normal(fm.inputs["feat"]).astype(np.float32)
    want, got = _run(fm.model, x), _run(optimized, x)
    assert got.shape == want.shape
    # exact up to the order of the sums
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), np.abs(got - want).max() / np.abs(want).max()
    return optimized, [n.op_type for n in optimized.graph.node]


def _repvgg_block(g: _Graph, x: str, *, groups: int = 1, identity: bool = True) -> str:
    terms = [g.bn(_conv(g, x, 3, groups=groups), C), g.bn(_conv(g, x, 1, groups=groups), C)]
    if identity:
        terms.append(g.bn(x, C))
    return g.op("Relu", [_sum(g, terms)])


def test_repvgg_block_is_one_conv() -> None:
    g = _Graph(1)
    y = _repvgg_block(g, "feat")
    optimized, ops = _optimize(g.model({"feat": [1, C, H, W]}, [y], featuremap={"feat"}))
    assert ops.count("Conv") == 1 and "Add" not in ops and "BatchNormalization" not in ops, ops
    conv = next(n for n in optimized.graph.node if n.op_type == "Conv")
    assert conv.name == "Conv_0"  # the 3x3 branch, the user's node
    fused = recorded_fusions(optimized)
    # the user's 1x1 branch, identity BatchNorm and the Adds went into it; the last Add writes its output
    assert {fused[n].node for n in ("Conv_1", "BatchNormalization_2", "Add_0", "Add_1")} == {"Conv_0"}, fused
    assert fused["Add_1"].at_output


def test_repvit_token_mixer_with_its_batchnorm_after_the_sum() -> None:
    """RepViT's RepVGGDW: ``bn(conv3x3_bn(x) + conv1x1(x) + x)``, depthwise."""
    g = _Graph(9)
    y = g.bn(_sum(g, [g.bn(_conv(g, "feat", 3, groups=C), C), _conv(g, "feat", 1, groups=C), "feat"]), C)
    optimized, ops = _optimize(g.model({"feat": [1, C, H, W]}, [g.op("Relu", [y])], featuremap={"feat"}))
    assert ops == ["Conv", "Relu"], ops
    assert recorded_fusions(optimized)["BatchNormalization_1"].at_output


def test_mobileone_blocks_depthwise_and_pointwise() -> None:
    g = _Graph(2)
    x = "feat"
    for _ in range(2):  # a depthwise block (groups = C) and a pointwise one, each with 3 parallel kxk branches
        dw = [g.bn(_conv(g, x, 3, groups=C), C) for _ in range(3)]
        dw.append(g.bn(_conv(g, x, 1, groups=C), C))  # the 1x1 scale branch
        x = g.op("Relu", [_sum(g, [*dw, g.bn(x, C)])])
        pw = [g.bn(_conv(g, x, 1), C) for _ in range(3)]
        x = g.op("Relu", [_sum(g, [g.bn(x, C), *pw])])
    optimized, ops = _optimize(g.model({"feat": [1, C, H, W]}, [x], featuremap={"feat"}))
    assert ops.count("Conv") == 4 and "Add" not in ops, ops
    groups = [next((a.i for a in n.attribute if a.name == "group"), 1) for n in optimized.graph.node
              if n.op_type == "Conv"]
    assert groups == [C, 1, C, 1]


def test_input_itself_and_affine_map_join() -> None:
    """RepViT's RepVGGDW without its BatchNorm (x + dwconv3x3(x) + dwconv1x1(x)) and a BatchNorm written as Mul
    and Add."""
    g = _Graph(3)
    y = _sum(g, ["feat", _conv(g, "feat", 3, groups=C), _conv(g, "feat", 1, groups=C)])
    scale = g.const(g.rng.uniform(0.5, 2, (1, C, 1, 1)).astype(np.float32))
    shift = g.const(g.rng.standard_normal((C, 1, 1)).astype(np.float32))
    affine = g.op("Add", [g.op("Mul", [y, scale]), shift])
    y = g.op("Relu", [_sum(g, [_conv(g, y, 3), affine, _conv(g, y, 1)])])
    _, ops = _optimize(g.model({"feat": [1, C, H, W]}, [y], featuremap={"feat"}))
    assert ops.count("Conv") == 2 and "Add" not in ops and "Mul" not in ops, ops


def test_other_terms_of_the_sum_stay() -> None:
    g = _Graph(4)
    other = g.op("Relu", [_conv(g, "feat", 3)])
    y = g.op("Relu", [_sum(g, [_conv(g, "feat", 3), other, _conv(g, "feat", 1)])])
    _, ops = _optimize(g.model({"feat": [1, C, H, W]}, [y], featuremap={"feat"}))
    assert ops.count("Conv") == 2 and ops.count("Add") == 1, ops


def test_a_branch_read_elsewhere_stays() -> None:
    g = _Graph(5)
    a, b = _conv(g, "feat", 3), _conv(g, "feat", 1)
    y = g.op("Relu", [_sum(g, [a, b])])
    _, ops = _optimize(g.model({"feat": [1, C, H, W]}, [y, g.op("Sigmoid", [b])], featuremap={"feat"}))
    assert ops.count("Conv") == 2 and ops.count("Add") == 1, ops


def test_different_strides_stay() -> None:
    """Both give 4x4 from 8x8 (a 1x1 of stride 2, a 5x5 of stride 1 without padding): different taps."""
    g = _Graph(6)
    y = _sum(g, [_conv(g, "feat", 1, stride=2, pad=0), _conv(g, "feat", 5, pad=0)])
    _, ops = _optimize(g.model({"feat": [1, C, 8, 8]}, [g.op("Relu", [y])], featuremap={"feat"}))
    assert ops.count("Conv") == 2 and ops.count("Add") == 1, ops


def test_identity_with_a_strided_conv_or_other_channels_stays_apart() -> None:
    g = _Graph(7)
    y = _sum(g, [_conv(g, "feat", 3, stride=2), _conv(g, "feat", 1, stride=2)])  # merge; no identity of 2x size
    z = _sum(g, [_conv(g, y, 3, cout=2 * C), _conv(g, y, 1, cout=2 * C)])  # merge; C_in != C_out
    _, ops = _optimize(g.model({"feat": [1, C, H, W]}, [g.op("Relu", [z])], featuremap={"feat"}))
    assert ops.count("Conv") == 2 and "Add" not in ops, ops


def test_kernels_that_do_not_nest_stay() -> None:
    """A 1x1 branch reading the row below the 3x3 one's window: one Conv would need a larger kernel than either."""
    g = _Graph(8)
    w1, w3 = g.rng.standard_normal((C, C, 1, 1)), g.rng.standard_normal((C, C, 3, 3))
    a = g.op("Conv", ["feat", g.const(w1.astype(np.float32))], kernel_shape=[1, 1], pads=[3, 0, 0, 0])
    b = g.op("Conv", ["feat", g.const(w3.astype(np.float32))], kernel_shape=[3, 3], pads=[2, 1, 3, 1])
    _, ops = _optimize(g.model({"feat": [1, C, H, W]}, [g.op("Relu", [_sum(g, [a, b])])], featuremap={"feat"}))
    assert ops.count("Conv") == 2, ops


@pytest.mark.parametrize("on", ["CPU", "BPU"])
def test_a_branch_the_user_places_stays(on: str) -> None:
    """node_info naming a branch (on the CPU, or on the BPU with an int16 InputType) keeps the sum as written:
    merged, the entry's InputType was dropped without a word (hunt 28)."""
    g = _Graph(10)
    y = _repvgg_block(g, "feat")
    fm = g.model({"feat": [1, C, H, W]}, [y], featuremap={"feat"})
    ops = [n.op_type for n in optimize.run(fm.model, get_profile("bernoulli2"), placed={"Conv_1": on}).graph.node]
    assert ops.count("Conv") == 3 and ops.count("Add") == 2, ops


def test_a_residual_around_one_conv_stays() -> None:
    """x + conv(x): the deploy form already; the identity tap would widen the kernel's int8 weight range."""
    g = _Graph(11)
    y = g.op("Relu", [_sum(g, [_conv(g, "feat", 3), "feat"])])
    _, ops = _optimize(g.model({"feat": [1, C, H, W]}, [y], featuremap={"feat"}))
    assert ops.count("Conv") == 1 and ops.count("Add") == 1, ops
