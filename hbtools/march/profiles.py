"""BPU architecture profiles, as data.

Each profile says which ONNX op types the BPU executes and as which Horizon op
kind, whether int16 is available, the core_num range, the quantized model's
input layout, and the cost-model figures hb_perf uses. Code asks a profile;
it never branches on a march name.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hbtools.errors import HbError

# Unit kinds the quantizer knows how to lower (see hbtools.quant.units).
CONV_OPS = {"Conv": "HzSQuantizedConv", "ConvTranspose": "HzSQuantizedConvTranspose", "Gemm": "HzSQuantizedConv",
            "MatMul": "HzSQuantizedMatMul"}
ELTWISE_OPS = {"Add": "HzSQuantizedAdd", "Sub": "HzSQuantizedSub", "Mul": "HzSQuantizedMul"}
POOL_OPS = {"GlobalAveragePool": "HzSQuantizedGlobalAveragePool", "AveragePool": "HzSQuantizedAveragePool"}
# Ops that move or select int8 values without changing them (output scale = input scale).
PASSIVE_OPS = ("MaxPool", "GlobalMaxPool", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze",
               "Slice", "Split", "Resize", "Identity")
# Element-wise functions of one tensor (with scalar constants): a run of them becomes one HzLut.
UNARY_OPS = ("Relu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "LeakyRelu", "Elu", "Selu",
             "Softplus", "Exp", "Log", "Sqrt", "Pow", "Abs", "Neg", "Erf", "Reciprocal", "Add", "Sub",
             "Mul", "Div", "Min", "Max", "Gelu", "Mish", "ThresholdedRelu", "PRelu")


@dataclass(frozen=True)
class MarchProfile:
    name: str
    board: str
    int16: bool
    core_num: tuple[int, ...]
    quantized_input_layout: str | None  # forced layout of the quantized model's image inputs
    peak_int8_tops: float
    ddr_gbps: float
    bpu_ops: frozenset[str] = field(default_factory=frozenset)
    max_kernel: int = 15
    max_stride: int = 8
    max_channels: int = 8192


_COMMON_BPU = frozenset({*CONV_OPS, *ELTWISE_OPS, *POOL_OPS, *PASSIVE_OPS, *UNARY_OPS, "Concat", "HzPreprocess"})

PROFILES: dict[str, MarchProfile] = {
    p.name: p
    for p in (
        MarchProfile("bernoulli2", "RDK X3", int16=False, core_num=(1, 2), quantized_input_layout="NHWC",
                     peak_int8_tops=5.0, ddr_gbps=12.8, bpu_ops=_COMMON_BPU, max_kernel=7, max_stride=4,
                     max_channels=2048),
        MarchProfile("bayes", "RDK Ultra", int16=True, core_num=(1,), quantized_input_layout=None,
                     peak_int8_tops=96.0, ddr_gbps=51.2, bpu_ops=_COMMON_BPU),
        MarchProfile("bayes-e", "RDK X5", int16=True, core_num=(1,), quantized_input_layout=None,
                     peak_int8_tops=10.0, ddr_gbps=25.6, bpu_ops=_COMMON_BPU),
        MarchProfile("nash-e", "S100", int16=True, core_num=(1,), quantized_input_layout=None,
                     peak_int8_tops=80.0, ddr_gbps=68.3, bpu_ops=_COMMON_BPU),
        MarchProfile("nash-m", "S100P", int16=True, core_num=(1,), quantized_input_layout=None,
                     peak_int8_tops=128.0, ddr_gbps=102.4, bpu_ops=_COMMON_BPU),
    )
}


def get_profile(march: str) -> MarchProfile:
    try:
        return PROFILES[march.lower()]
    except KeyError:
        raise HbError(f"unknown march '{march}'; choose one of {', '.join(PROFILES)}") from None
