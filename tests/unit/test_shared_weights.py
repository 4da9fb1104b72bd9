"""A weight read by several nodes (an unrolled recurrence) is stored once in the quantized model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from builders import _Graph, make_project
from onnx import TensorProto, numpy_helper
from test_pipeline_small import convert, heldout, outputs

from hbtools.metrics import cosine_similarity
from hbtools.runtime.lowering import lower_model
from hbtools.tools.verifier import verify

STEPS = 6


def _unrolled_recurrence() -> object:
    """h = tanh(x_t W + h U + b) over STEPS steps, every step reading the same W, U and b."""
    g = _Graph(7)
    w = g.const((g.rng.standard_normal((32, 64)) / np.sqrt(32)).astype(np.float32), "w")
    u = g.const((g.rng.standard_normal((64, 64)) / 8).astype(np.float32), "u")
    b = g.const((0.1 * g.rng.standard_normal(64)).astype(np.float32), "b")
    steps = g.op("Split", ["seq"], n_out=STEPS, axis=1)
    outs = [f"{steps[:-1]}{k}" for k in range(STEPS)]  # Split's outputs: <name>_out0 .. _out{STEPS-1}
    h = g.op("Tanh", [g.op("Add", [g.op("MatMul", [outs[0], w]), b])])
    for x_t in outs[1:]:
        h = g.op("Tanh", [g.op("Add", [g.op("Add", [g.op("MatMul", [x_t, w]), g.op("MatMul", [h, u])]), b])])
    return g.model({"seq": [1, STEPS, 32]}, [h], featuremap={"seq"})


def test_a_weight_read_at_every_step_is_stored_once(tmp_path: Path) -> None:
    fm = _unrolled_recurrence()
    conv = convert(make_project(tmp_path / "rnn", fm))
    quantized = onnx.load(str(conv.paths["quantized"]))
    int8_weights = [numpy_helper.to_array(t).shape for t in quantized.graph.initializer
                    if t.data_type == TensorProto.INT8 and len(t.dims) == 2]
    # One copy of W [32, 64] and one of U [64, 64] for all the steps, as in the float model.
    assert sorted(int8_weights) == [(32, 64), (64, 64)], int8_weights
    readers = [n for n in quantized.graph.node if n.op_type == "HzSQuantizedConv"]
    assert len(readers) == 2 * STEPS - 1
    float_size = conv.paths["original"].stat().st_size
    for kind in ("quantized", "bin"):
        assert conv.paths[kind].stat().st_size < float_size, f"{kind} not smaller than the float model"
    # What HB_ONNXRuntime runs (integer kernels' re-laid weights included) holds one copy of each too.
    for kind in ("calibrated", "quantized"):
        lowered = lower_model(onnx.load(str(conv.paths[kind])))
        large = [numpy_helper.to_array(t) for t in lowered.graph.initializer if len(t.raw_data) >= 1024]
        contents = {(a.dtype.str, a.shape, a.tobytes()) for a in large}
        assert len(contents) == len(large), f"{kind}: {len(large) - len(contents)} repeated constants when lowered"
    x = heldout(conv.fm)
    got, want = outputs(conv, "quantized", x)[0], outputs(conv, "calibrated", x)[0]
    assert cosine_similarity(got, want) > 0.9999
    result = verify(conv.paths["quantized"], conv.paths["bin"], None, 3)
    assert all(c.passed for c in result.outputs)
