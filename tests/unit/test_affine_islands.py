"""Element-wise work between CPU nodes stays in float, however large its maps (hunt 37 D1).

onnxruntime's ``quantize_dynamic`` writes each layer as a CPU ConvInteger, a CPU rescale and a float bias Add (and
its activation). Each bias Add between two CPU layers became a BPU subgraph of its own: rapid-table's PicoDet
detector had 127. A BPU call for a per-channel scale and shift costs the CPU a quantization of every value it takes
and a dequantization of every value it gives back, as much as the float op; a real convolution still goes.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from hbtools.march.profiles import get_profile
from hbtools.pipeline import optimize
from hbtools.quant.units import build_partition

C, H = 16, 160  # 409,600 values a map: over the small-subgraph bound of 2**18 multiply-accumulates


def _islands(kind: str, count: int = 3):
    """``count`` times: a CPU op (LRN), then ``kind``: a BatchNormalization, a per-channel Mul and Add followed by
    a SiLU, or a 3x3 depthwise conv (9 multiply-accumulates a value); an LRN at the end."""
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"

    def const(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(value.astype(np.float32), name))
        return name

    for i in range(count):
        f = f"f{i}"
        nodes.append(helper.make_node("LRN", [x], [f], name=f"floor{i}", size=3))
        if kind == "batchnorm":
            params = [const(f"{p}{i}", rng.uniform(0.5, 1.5, C)) for p in "sbmv"]
            nodes.append(helper.make_node("BatchNormalization", [f, *params], [f"y{i}"], name=f"bn{i}"))
        elif kind == "affine_silu":
            nodes += [helper.make_node("Mul", [f, const(f"s{i}", rng.uniform(0.5, 1.5, (1, C, 1, 1)))], [f"m{i}"],
                                       name=f"mul{i}"),
                      helper.make_node("Add", [f"m{i}", const(f"b{i}", rng.uniform(-1, 1, (1, C, 1, 1)))], [f"a{i}"],
                                       name=f"add{i}"),
                      helper.make_node("Sigmoid", [f"a{i}"], [f"g{i}"], name=f"sigmoid{i}"),
                      helper.make_node("Mul", [f"a{i}", f"g{i}"], [f"y{i}"], name=f"silu{i}")]
        else:
            nodes.append(helper.make_node("Conv", [f, const(f"w{i}", rng.uniform(-0.3, 0.3, (C, 1, 3, 3)))],
                                          [f"y{i}"], name=f"dw{i}", group=C, kernel_shape=[3, 3], pads=[1] * 4))
        x = f"y{i}"
    nodes.append(helper.make_node("LRN", [x], ["out"], name="floor_last", size=3))
    shape = [1, C, H, H]
    graph = helper.make_graph(nodes, kind, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _subgraphs_and_reasons(model, march: str = "bayes-e"):
    profile = get_profile(march)
    units = build_partition(optimize.run(model, profile), profile, {}).units
    return len({u.subgraph for u in units if u.on == "BPU"}), [u.reason for u in units if u.on == "CPU"]


@pytest.mark.parametrize("kind", ["batchnorm", "affine_silu"])
def test_a_per_channel_affine_between_cpu_nodes_stays_in_float(kind: str) -> None:
    subgraphs, reasons = _subgraphs_and_reasons(_islands(kind))
    # the model keeps its largest BPU part (here one of the three alike); the others go to float
    assert subgraphs == 1, reasons
    assert any("values the CPU would quantize and dequantize for it" in r for r in reasons), reasons


def test_a_depthwise_conv_between_cpu_nodes_stays_on_the_bpu() -> None:
    subgraphs, reasons = _subgraphs_and_reasons(_islands("depthwise"))
    assert subgraphs == 3, reasons
