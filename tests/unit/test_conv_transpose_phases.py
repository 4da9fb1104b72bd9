"""ConvTransposes with a kernel or stride beyond the BPU's limits run on the BPU as a stride-1 Conv over the
stride's phases, the phases then put in place (DepthToSpace, or Reshape / Transpose / Reshape along one axis)
and a Slice keeping what the pads keep.

Found on a HiFi-GAN vocoder (upsamplers ConvTranspose1d(k=16, s=8, p=4)) and the FCN-8s head (ConvTranspose2d
k16 s8): on RDK X5 both ran on the CPU ('ConvTranspose kernel [16] exceeds 14'), with a BPU subgraph on each
side (hunt 42 D3).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from builders import _Graph
from conformance import convert_and_check
from onnx import TensorProto, helper, numpy_helper

from hbtools.march.profiles import get_profile
from hbtools.pipeline import optimize


def _conv_transpose(shape: list[int], cout: int, kernel: list[int], strides: list[int], pads: list[int],
                    group: int = 1, output_padding: list[int] | None = None, bias: bool = True):
    rng = np.random.default_rng(sum(kernel) + sum(strides))
    w = rng.standard_normal((shape[1], cout // group, *kernel)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w")]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32), "b"))
    attrs = {"kernel_shape": kernel, "strides": strides, "pads": pads, "group": group}
    if output_padding:
        attrs["output_padding"] = output_padding
    node = helper.make_node("ConvTranspose", ["x", "w", *(["b"] if bias else [])], ["y"], name="up", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _run(model, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


CASES = {
    "hifigan_1d": ([1, 8, 32], 4, [16], [8], [4, 4], 1, None),
    "fcn_2d": ([1, 4, 10, 10], 3, [16, 16], [8, 8], [4, 4, 4, 4], 1, None),
    "odd_kernel_output_padding": ([1, 6, 9], 4, [17], [8], [3, 5], 1, [5]),
    "grouped_1d": ([1, 6, 20], 6, [15], [3], [0, 2], 3, None),
    "one_row": ([1, 5, 1, 24], 3, [1, 16], [1, 8], [0, 4, 0, 4], 1, None),
    "one_column": ([1, 5, 24, 1], 3, [16, 1], [8, 1], [4, 0, 4, 0], 1, None),
    "stride_beyond_x3_2d": ([1, 3, 6, 7], 2, [6, 6], [6, 6], [0, 0, 0, 0], 1, None),
    # 40 x 64 phase channels, more than RDK X3's convs take (2048): a Conv that wide runs as several (hunt 44 D5)
    "phases_wider_than_x3": ([1, 40, 3, 3], 40, [16, 16], [8, 8], [4, 4, 4, 4], 1, None),
}


@pytest.mark.parametrize("march", ["bayes-e", "bernoulli2"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_conv_transposes_over_phases_give_the_same_values(case: str, march: str) -> None:
    shape, cout, kernel, strides, pads, group, output_padding = CASES[case]
    if march == "bernoulli2" and len(shape) != 4:
        pytest.skip("RDK X3 takes 4-D tensors: 1-D layers are rows by then (one_row, one_column)")
    model = _conv_transpose(shape, cout, kernel, strides, pads, group, output_padding)
    profile = get_profile(march)
    optimized = optimize.run(model, profile)
    limits = profile.rule("ConvTranspose")
    beyond = max(kernel) > limits.kernel or max(strides) > limits.stride
    assert ("ConvTranspose" in [n.op_type for n in optimized.graph.node]) != beyond  # within them: left as it is
    rule = profile.rule("Conv")
    for node in (n for n in optimized.graph.node if n.op_type == "Conv"):
        a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
        assert max(a.get("strides", [1])) <= rule.stride and max(a["kernel_shape"]) <= rule.kernel, a
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    ref = _run(model, x)
    got = _run(optimized, x)
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_a_conv_transpose_within_the_limits_is_left_as_it_is() -> None:
    model = _conv_transpose([1, 4, 10, 10], 3, [4, 4], [2, 2], [1, 1, 1, 1])
    optimized = optimize.run(model, get_profile("bayes-e"))
    assert [n.op_type for n in optimized.graph.node] == ["ConvTranspose"]


@pytest.mark.parametrize("rank", [1, 2], ids=["hifigan_1d", "fcn_2d"])
def test_a_k16_s8_upsampler_runs_on_the_bpu(tmp_path: Path, rank: int) -> None:
    """Conv, LeakyRelu, the k16 s8 ConvTranspose, LeakyRelu, Conv: one BPU subgraph and no CPU node on RDK X5 (it
    was two subgraphs and the ConvTranspose on the CPU), the quantized model close to float."""
    g = _Graph(6)
    size = [24] if rank == 1 else [6, 6]
    k = [16] * rank
    w = g.const((g.rng.standard_normal((8, 4, *k)) * 0.1).astype(np.float32))
    a = g.op("LeakyRelu", [g.op("Conv", ["feat", g.const((g.rng.standard_normal((8, 6, *[3] * rank)) * 0.2)
                                                       .astype(np.float32))], pads=[1] * 2 * rank)], alpha=0.1)
    up = g.op("LeakyRelu", [g.op("ConvTranspose", [a, w], kernel_shape=k, strides=[8] * rank, pads=[4] * 2 * rank)],
              alpha=0.1)
    y = g.op("Conv", [up, g.const((g.rng.standard_normal((2, 4, *[3] * rank)) * 0.2).astype(np.float32))],
             pads=[1] * 2 * rank)
    fm = g.model({"feat": [1, 6, *size]}, [y], featuremap={"feat"})
    outcome = convert_and_check(fm, tmp_path, calibration_type="max")
    assert not outcome.cpu, outcome.placement()
    assert min(outcome.cosine) >= 0.99, outcome.cosine


def test_phases_wider_than_the_channel_limit_run_on_the_bpu() -> None:
    """A 40-class k16 s8 head on RDK X3 (40 x 64 phase channels) stayed a float ConvTranspose on the CPU, while
    the same Conv, DepthToSpace and Slice written by hand ran on the BPU (hunt 44 D5)."""
    from hbtools.quant.units import build_partition

    shape, cout, kernel, strides, pads, group, output_padding = CASES["phases_wider_than_x3"]
    profile = get_profile("bernoulli2")
    optimized = optimize.run(_conv_transpose(shape, cout, kernel, strides, pads, group, output_padding), profile)
    part = build_partition(optimized, profile, {})
    assert not [(n.op_type, u.reason) for u in part.units if u.on == "CPU" for n in u.nodes]
