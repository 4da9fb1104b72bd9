"""MatMuls of an activation and a constant with a weight per batch index (attention heads) run on the BPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conformance import convert_featuremaps
from onnx import ModelProto, TensorProto, helper, numpy_helper
from test_exporter_structures import _agrees_with_source, _cpu_nodes, _model, _normal

F = TensorProto.FLOAT


def _per_head(case: str, opset: int) -> tuple[ModelProto, list[int]]:
    """A conv whose map is read as 4 heads of 64 tokens with 4 features ([1, 4, 64, 4]) and multiplied with a
    constant per head, then a Softmax: ``right`` act @ P [1, 4, 4, 20] (relative-position terms), ``left``
    Q [1, 4, 20, 4] @ act^T (learned queries per head), ``shared`` one map of tokens for every head's weight
    ([1, 1, 64, 4] @ [4, 4, 20])."""
    rng = np.random.default_rng(7)
    heads = 1 if case == "shared" else 4
    inits = [numpy_helper.from_array((rng.standard_normal((16, 16, 1, 1)) * 0.3).astype(np.float32), "w")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"), helper.make_node("Relu", ["c"], ["r"])]
    if case == "left":
        inits += [numpy_helper.from_array(np.array([1, 4, 4, 64], np.int64), "shape"),
                  numpy_helper.from_array(rng.standard_normal((1, 4, 20, 4)).astype(np.float32), "q")]
        nodes += [helper.make_node("Reshape", ["r", "shape"], ["k"]),
                  helper.make_node("MatMul", ["q", "k"], ["s"], name="per_head"),
                  helper.make_node("Softmax", ["s"], ["y"], axis=-1)]
        return _model(nodes, [("x", F, [1, 16, 8, 8])], [("y", F, [1, 4, 20, 64])], inits, opset=opset), [1, 16, 8, 8]
    weight = (1, 4, 4, 20) if case == "right" else (4, 4, 20)
    inits += [numpy_helper.from_array(np.array([1, heads, 64, 4], np.int64), "shape"),
              numpy_helper.from_array(rng.standard_normal(weight).astype(np.float32), "p")]
    nodes += [helper.make_node("Reshape", ["r", "shape"], ["t"]),
              helper.make_node("MatMul", ["t", "p"], ["s"], name="per_head"),
              helper.make_node("Softmax", ["s"], ["y"], axis=-1)]
    x = [1, 4, 8, 8] if case == "shared" else [1, 16, 8, 8]
    if case == "shared":  # a conv to 4 channels: the tokens' 4 features
        inits[0] = numpy_helper.from_array((rng.standard_normal((4, 4, 1, 1)) * 0.3).astype(np.float32), "w")
    return _model(nodes, [("x", F, x)], [("y", F, [1, 4, 64, 20])], inits, opset=opset), x


@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("case", ["right", "left", "shared"])
def test_a_weight_per_head_runs_on_the_bpu(case: str, opset: int, tmp_path: Path) -> None:
    """They ran on the CPU ('MatMul with a batched constant weight has no BPU form'): now a MatMul per head with
    that head's 2-D weight, joined again, with the source's numbers."""
    model, shape = _per_head(case, opset)
    rng = np.random.default_rng(3)
    dims = "x".join(map(str, shape))
    out = convert_featuremaps(tmp_path, model, {"x": _normal(rng, shape)}, dims, "float32", "m")
    assert "1 MatMuls of a constant batched along one axis" in out
    assert not _cpu_nodes(tmp_path / "out" / "m.bin")
    _agrees_with_source(model, tmp_path / "out", tuple(shape), rng, optimized=True)


def test_a_weight_per_batch_index_on_rdk_x3_stays_whole_on_the_cpu(tmp_path: Path) -> None:
    """ONNX's test_matmul_3d with its second operand a constant: RDK X3's BPU takes no 3-D Split or Concat, so
    the per-batch products would each sit between CPU nodes. The conversion ended in "internal error: tensor
    ... reaches the BPU without calibration" (the calibrate and quantize stages kept different products on
    the BPU); the MatMul now stays whole on the CPU, with its reason."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((2, 4, 3)).astype(np.float32), "b")]
    model = _model([helper.make_node("MatMul", ["x", "b"], ["y"], name="batched")], [("x", F, [2, 3, 4])],
                   [("y", F, [2, 3, 3])], inits, opset=11)
    convert_featuremaps(tmp_path, model, {"x": _normal(rng, [2, 3, 4])}, "2x3x4", "float32", "m", "max",
                        march="bernoulli2")
    reasons = {c["name"]: c["reason"] for c in _cpu_nodes(tmp_path / "out" / "m.bin")}
    assert reasons == {"batched": "MatMul with a batched constant weight [2, 4, 3] has no BPU form"}, reasons
    _agrees_with_source(model, tmp_path / "out", (2, 3, 4), rng, optimized=True)
