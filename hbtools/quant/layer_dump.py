"""``layer_out_dump``: which layer results ``hb_mapper infer`` writes, and where each artefact holds them.

Layers are the model outputs and, with ``layer_out_dump: True``, every conv-like
BPU unit (Conv/ConvTranspose/Gemm/MatMul with its fused Relu/Clip), named after
its conv node. Float artefacts hold them as float tensors; the quantized model
holds most as int8/int16 tensors whose scale is nowhere in the graph, so the
quantize step of makertbin records, in the model's metadata, which tensor holds
each layer and its scale. The same record travels into the ``.bin``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import ModelProto, TensorProto

from hbtools.config.model import Config
from hbtools.graph.model_io import read_json_metadata, write_json_metadata
from hbtools.march.profiles import MarchProfile
from hbtools.ops.base import DOMAIN
from hbtools.ops.names import CALIBRATED_SUFFIX
from hbtools.pipeline.quantize import QuantizedResult
from hbtools.quant.calibrated import read_calibrated
from hbtools.quant.units import model_partition

META_KEY = "hbtools.layer_out_dump"
CONV_KINDS = ("conv", "matmul")


@dataclass(frozen=True)
class Layer:
    name: str  # file name stem: ${name}_float.bin
    tensor: str  # tensor of the model that holds the result
    scale: tuple[float, ...] | None = None  # integer tensor: value of one step (per channel along axis)
    axis: int = 1
    zero_point: int = 0  # asymmetric integer tensor: the level of 0

    def to_float(self, value: np.ndarray) -> np.ndarray:
        """The layer result as float32 (integers dequantized like HzDequantize does, in float32)."""
        if self.scale is None:
            return np.asarray(value, dtype=np.float32)
        scale = np.asarray(self.scale, dtype=np.float32)
        if scale.size > 1:
            shape = [1] * value.ndim
            shape[self.axis] = -1
            scale = scale.reshape(shape)
        if self.zero_point:
            return (value.astype(np.float32) - np.float32(self.zero_point)) * scale
        return value.astype(np.float32) * scale


def annotate(result: QuantizedResult) -> None:
    """Record in the quantized model where each conv layer's and output's result is, with its scale."""
    model = result.model
    produced = {o for n in model.graph.node for o in n.output}
    entries: list[dict] = []

    def add(name: str, tensor: str) -> None:
        qt = result.tensors.get(tensor)
        if qt is not None and qt.dtype in ("int8", "int16") and qt.name in produced:
            entries.append({"name": name, "tensor": qt.name, "scale": [float(s) for s in qt.scale.reshape(-1)],
                            "axis": qt.axis, **({"zero_point": qt.zero_point} if qt.zero_point else {})})
        elif tensor in produced:
            entries.append({"name": name, "tensor": tensor})

    for unit in result.partition.units:
        if unit.on == "BPU" and unit.kind in CONV_KINDS:
            add(unit.main.name, unit.outputs[0])
    for out in model.graph.output:
        if out.type.tensor_type.elem_type == TensorProto.FLOAT:
            entries.append({"name": out.name, "tensor": out.name})
        else:
            add(out.name, out.name)
    write_json_metadata(model, META_KEY, entries)


def recorded_layers(model: ModelProto) -> list[Layer] | None:
    """The layers ``annotate`` recorded in a quantized model, or None."""
    entries = read_json_metadata(model, META_KEY)
    if entries is None:
        return None
    return [Layer(e["name"], e["tensor"], tuple(e["scale"]) if e.get("scale") else None, e.get("axis", 1),
                  int(e.get("zero_point", 0))) for e in entries]


def is_quantized(model: ModelProto) -> bool:
    return any(n.domain == DOMAIN and n.op_type.startswith("HzSQuantized") for n in model.graph.node)


def output_layers(model: ModelProto) -> list[Layer]:
    return [Layer(o.name, o.name) for o in model.graph.output]


def conv_layers(model: ModelProto, config: Config, profile: MarchProfile,
                optimized: ModelProto | None = None) -> list[Layer]:
    """Conv-like BPU units of a float artefact (original, optimized or calibrated), by the same partition.

    ``optimized``: the optimized artefact, whose units the quantized model's layers are. Its partition
    names the layers of a model that is not calibrated: the original model's Conv, BatchNormalization and
    Relu are separate nodes, and its own partition dumped the raw Conv under the name of the quantized
    layer that includes the other two (vec_diff found every such layer far from float). A layer is the
    same tensor in both models (the optimize stage keeps the names of what it fuses); one the model does
    not hold is left out.
    """
    calibrated = read_calibrated(model)
    own = calibrated.float_model
    reference = optimized if optimized is not None and not calibrated.activations else own
    part = model_partition(reference, profile, config, warn=False)
    tensors = {o for n in model.graph.node for o in n.output}
    layers = []
    for unit in part.units:
        if unit.on == "BPU" and unit.kind in CONV_KINDS:
            t = unit.outputs[0]
            # The calibrated model's fake-quantized value is what the quantized model computes.
            held = f"{t}{CALIBRATED_SUFFIX}" if f"{t}{CALIBRATED_SUFFIX}" in tensors else t
            if held in tensors:
                layers.append(Layer(unit.main.name, held))
    return layers
