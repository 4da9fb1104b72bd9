"""torch exports ``F.unfold`` / ``nn.Unfold`` (im2col: RAFT / PWC local correlation, T2T-ViT's soft split, patch
embeddings) as a Pad, a Gather of constant windows [k, L] along H, one along W, a 6-D Transpose and a Reshape to
[N, C*k*k, L]. The 6-D tensors put the Gathers, Transpose and Reshape on the CPU of RDK X5 between two BPU subgraphs
(hunt 51 D5, hunt 52 D2). Each window tap is a strided Slice of the padded map: the optimize stage writes the unfold
as those Slices, a Concat along the channels and a Gather of channels, all on the BPU, the same values exactly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from builders import _Graph, checked, optimized_agreeing

_SIDE, _CHANNELS = 8, 4


def _unfold_net(kernel: int, stride: int, pad: int, dilation: int, windows: str = "torch") -> onnx.ModelProto:
    """conv -> ``F.unfold(kernel, dilation, pad, stride)`` as torch exports it -> view as [N, C*k*k, h, w] -> conv.
    ``windows="shuffled"`` gives the row Gather indices that are no windows (a reordering of them)."""
    g = _Graph(11)
    features = g.op("Relu", [g.conv("x", 3, _CHANNELS)])
    padded = g.op("Pad", [features, g.const(np.array([0, 0, pad, pad, 0, 0, pad, pad], np.int64), "pads")])
    length = (_SIDE + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1
    index = (np.arange(kernel)[:, None] * dilation + np.arange(length)[None, :] * stride).astype(np.int64)
    rows_index = index if windows == "torch" else index[:, ::-1].copy()
    rows = g.op("Gather", [padded, g.const(rows_index, "rows")], axis=2)  # [N, C, k, L, W + 2p]
    cols = g.op("Gather", [rows, g.const(index, "cols")], axis=4)  # [N, C, k, L, k, L]
    moved = g.op("Transpose", [cols], perm=[0, 1, 2, 4, 3, 5])
    taps = _CHANNELS * kernel * kernel
    unfolded = g.op("Reshape", [moved, g.const(np.array([1, taps, -1], np.int64), "flat")])
    as_map = g.op("Reshape", [unfolded, g.const(np.array([1, taps, length, length], np.int64), "map")])
    return g.model({"x": [1, 3, _SIDE, _SIDE]}, [g.conv(as_map, taps, 5, k=1)]).model


_CASES = {"overlapping": (3, 1, 1, 1), "non_overlapping": (2, 2, 0, 1), "dilated": (3, 1, 2, 2)}


@pytest.mark.parametrize("march", ["bayes-e", "bernoulli2"])
@pytest.mark.parametrize("case", list(_CASES))
def test_an_unfold_runs_on_the_bpu_as_slices(tmp_path: Path, case: str, march: str) -> None:
    model = _unfold_net(*_CASES[case])
    x = np.random.default_rng(2).normal(0, 1, (1, 3, _SIDE, _SIDE)).astype(np.float32)
    output = checked(model, march, tmp_path)
    assert "1 BPU subgraph(s) and 0 CPU node(s)" in output, output
    optimized = optimized_agreeing(model, march, {"x": x}, rtol=0, atol=1e-6)  # the same values, moved
    ops = {n.op_type for n in optimized.graph.node}
    assert "Slice" in ops and "Transpose" not in ops, ops


def test_an_unfold_is_exact_in_every_artefact(tmp_path: Path) -> None:
    """The Slices, Concat and Gather move int8 values on the map's own grid: quantized == calibrated, and the .bin
    agrees (hb_verifier)."""
    from builders import FloatModel, held_out, make_project

    from hbtools.pipeline.runner import makertbin
    from hbtools.tools.verifier import verify
    from horizon_tc_ui import HB_ONNXRuntime

    fm = FloatModel(_unfold_net(*_CASES["overlapping"]), {"x": [1, 3, _SIDE, _SIDE]}, {"x"})
    project = make_project(tmp_path, fm, march="bayes-e", cal_count=4)
    paths = makertbin(project.config_path, "onnx")
    calibrated, quantized = (HB_ONNXRuntime(model_file=str(paths[k])) for k in ("calibrated", "quantized"))
    for x in held_out(fm, 3):
        np.testing.assert_array_equal(quantized.run_feature(None, {"x": x})[0],
                                      calibrated.run_feature(None, {"x": x})[0])
    assert all(o.passed for o in verify(paths["quantized"], paths["bin"], None, 3).outputs)


def test_gathers_of_other_indices_are_left_as_they_are() -> None:
    model = _unfold_net(3, 1, 1, 1, windows="shuffled")
    x = np.random.default_rng(3).normal(0, 1, (1, 3, _SIDE, _SIDE)).astype(np.float32)
    optimized = optimized_agreeing(model, "bayes-e", {"x": x}, rtol=0, atol=1e-6)
    assert "Slice" not in {n.op_type for n in optimized.graph.node}
