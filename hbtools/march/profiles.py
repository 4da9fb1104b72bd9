"""BPU architecture profiles, as data.

Each profile says, per ONNX op type, whether the BPU executes it, as which
Horizon op, and under which constraints (``OpRule``); plus whether int16 is
available, the core_num range, the quantized model's input layout and the
cost-model figures hb_perf uses. Code asks a profile; it never branches on a
march name. ``hbtools.march.constraints`` checks one node against its rule and
words the reason when the node must run on the CPU.

The limits follow the public operator-constraint lists of the boards in
spirit (X3 = bernoulli2 is a 4-D-only BPU without int16 and with small
kernels; the bayes/nash BPUs take tensors up to 5-D). Where hbtools cannot
lower an op the device runs, the rule says so (``forms`` empty) so the checker
can tell "the board cannot" from "hbtools does not yet".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from hbtools.errors import HbError

# Unit kinds hbtools lowers to integer Horizon ops (see hbtools.quant.units).
FORMS = ("preprocess", "conv", "matmul", "eltwise", "lut", "pool", "passive", "concat")
# The most values along its axis an ArgMax / ArgMin on the BPU compares (the vendor's PTQ guide: a
# segmenter's class map is computed on the BPU up to 64 channels, on the CPU beyond).
ARGMAX_MAX_EXTENT = 64
# Two-input operand forms, from the narrowest: equal shapes, one operand a single
# value, one operand one value per channel ([N, C, 1, 1]), any numpy broadcast.
BROADCASTS = ("same", "scalar", "channel", "general")


@dataclass(frozen=True)
class OpRule:
    """How one ONNX op type maps onto a BPU, and the limits that send an instance to the CPU."""

    table_type: str  # the type the node tables show (seed names); "" keeps the ONNX name (data movement)
    forms: tuple[str, ...]  # unit kinds hbtools lowers it to; () = a device op hbtools cannot lower yet
    ranks: tuple[int, int] = (1, 5)  # allowed rank of its activation inputs and outputs
    kernel: int | None = None  # largest kernel size per spatial axis (conv, pool)
    stride: int | None = None
    dilation: int | None = None
    channels: int | None = None  # largest input / output channel count (conv)
    broadcast: tuple[str, ...] = BROADCASTS  # accepted forms of two activation operands
    axes: tuple[int, ...] | None = None  # allowed (non-negative) ``axis`` attribute; None = any
    modes: tuple[str, ...] | None = None  # allowed ``mode`` attribute (Resize)
    perms: tuple[tuple[int, ...], ...] | None = None  # allowed Transpose permutations; None = any
    int16: bool = True  # int16 inputs/outputs possible (where the march has int16 at all)
    extent: int | None = None  # largest size of the axis an index op searches (ArgMax); None = any


@dataclass(frozen=True)
class MarchProfile:
    name: str
    board: str
    int16: bool
    core_num: tuple[int, ...]
    quantized_input_layout: str | None  # forced layout of the quantized model's image inputs
    peak_int8_tops: float
    ddr_gbps: float
    ops: Mapping[str, OpRule] = field(default_factory=dict, hash=False, compare=False)
    # The ranks of the tensors the BPU computes on at all (element-wise ops, convolutions); an op whose rule takes
    # fewer has no form of the others (which its CPU reason says, not that the BPU cannot take them), and a
    # rewrite to a view of a rank it takes may give it one.
    tensor_ranks: tuple[int, int] = (1, 5)
    bpu_ops: frozenset[str] = field(default=frozenset(), init=False)  # op types with a rule

    def __post_init__(self) -> None:
        object.__setattr__(self, "ops", MappingProxyType(dict(self.ops)))
        object.__setattr__(self, "bpu_ops", frozenset(self.ops))

    @property
    def label(self) -> str:
        """How messages name the march: ``bernoulli2 (RDK X3)``."""
        return f"{self.name} ({self.board})"

    def rule(self, op_type: str) -> OpRule | None:
        return self.ops.get(op_type)

    def takes_rank(self, rank: int) -> bool:
        """Whether the BPU computes on tensors of ``rank`` dimensions at all (``tensor_ranks``)."""
        return self.tensor_ranks[0] <= rank <= self.tensor_ranks[1]


def _each(names: Iterable[str], rule: OpRule) -> dict[str, OpRule]:
    return {n: rule for n in names}


# Ops of a run whose own values are no grid's (a bool mask, and the Where or Cast reading it): BPU tables only
# inside a run of element-wise functions that ends in a float tensor.
SELECTING_OPS = ("Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Where", "Cast")
# Element-wise functions of one tensor (with scalar constants): a run of them becomes one HzLut.
LUT_OPS = ("Relu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "LeakyRelu", "Elu", "Selu",
           "Softplus", "Exp", "Log", "Sqrt", "Pow", "Abs", "Neg", "Erf", "Reciprocal", "Div", "Min", "Max",
           "Gelu", "Mish", "ThresholdedRelu", "PRelu", "Celu", "Softsign",
           # steps and periodic functions: a float remainder ``x - floor(x / c) * c``, fake-quant steps
           "Floor", "Ceil", "Round", "Sign", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh",
           "Acosh", "Atanh",
           # a comparison with a constant and what selects or casts by it (torch's F.threshold, Caffe's
           # Threshold): within a run that ends in a float value of the one tensor (``units._lut_unit``)
           *SELECTING_OPS)
# Ops that move or select int8 values without changing them (output scale = input scale).
PASSIVE_OPS = ("MaxPool", "GlobalMaxPool", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze",
               "Slice", "Split", "Resize", "Identity", "DepthToSpace", "SpaceToDepth", "Tile", "Gather",
               "ReduceMax", "ReduceMin", "Pad")

_NCHW_NHWC = ((0, 1, 2, 3), (0, 2, 3, 1), (0, 3, 1, 2))
_NOT_BATCH = (1, 2, 3, 4)

# The bayes family (bayes, bayes-e, nash-*): tensors up to 5-D, large kernels, int16.
_BAYES_OPS: dict[str, OpRule] = {
    "HzPreprocess": OpRule("HzPreprocess", ("preprocess",), ranks=(4, 4)),
    "Conv": OpRule("HzSQuantizedConv", ("conv",), ranks=(3, 5), kernel=15, stride=8, dilation=16, channels=8192),
    "ConvTranspose": OpRule("HzSQuantizedConvTranspose", ("conv",), ranks=(3, 5), kernel=14, stride=8,
                            dilation=1, channels=8192),
    "Gemm": OpRule("HzSQuantizedConv", ("conv",), ranks=(2, 2), channels=8192),
    "MatMul": OpRule("HzSQuantizedMatMul", ("conv", "matmul"), ranks=(2, 5)),
    "Add": OpRule("HzSQuantizedAdd", ("eltwise", "constant_eltwise", "lut")),
    "Sub": OpRule("HzSQuantizedSub", ("eltwise", "constant_eltwise", "lut")),
    "Mul": OpRule("HzSQuantizedMul", ("eltwise", "constant_eltwise", "lut")),
    **_each(LUT_OPS, OpRule("HzLut", ("lut",))),
    # A slope per channel is applied in the requantization; a scalar one is a table.
    "PRelu": OpRule("HzSQuantizedConstantEltwise", ("constant_eltwise", "lut")),
    # A constant-tensor divisor or dividend: the constant is applied in the requantization.
    "Div": OpRule("HzSQuantizedDiv", ("constant_eltwise", "lut")),
    **_each(("Max", "Min"), OpRule("HzSQuantizedMaxMin", ("maxmin", "lut"))),  # of two tensors, or a table
    "GlobalAveragePool": OpRule("HzSQuantizedGlobalAveragePool", ("pool",), ranks=(4, 4)),
    "AveragePool": OpRule("HzSQuantizedAveragePool", ("pool",), ranks=(4, 4), kernel=15, stride=8),
    **_each(PASSIVE_OPS, OpRule("", ("passive",))),
    "MaxPool": OpRule("", ("passive",), ranks=(4, 4), kernel=15, stride=8),
    "GlobalMaxPool": OpRule("", ("passive",), ranks=(4, 4)),
    "Resize": OpRule("", ("passive",), ranks=(4, 4), modes=("nearest",)),
    "Concat": OpRule("HzSQuantizedConcat", ("concat",)),
    "Softmax": OpRule("HzSQuantizedSoftmax", ("softmax",)),
    "LogSoftmax": OpRule("HzSQuantizedLogSoftmax", ("logsoftmax",)),
    **_each(("ReduceMean", "ReduceSum"), OpRule("HzSQuantizedPool", ("pool",))),  # a sum: the mean's, times N
    "LayerNormalization": OpRule("HzSQuantizedLayerNorm", ("layernorm",)),
    **{op: OpRule(f"HzSQuantized{op}", ("argmax",), extent=ARGMAX_MAX_EXTENT) for op in ("ArgMax", "ArgMin")},
    "GridSample": OpRule("", ()),  # a BPU op of the device that hbtools has no integer kernel for yet
}

# bernoulli2 (X3): a 4-D-only BPU. Reshape-like ops, activation x activation MatMul and
# Softmax run on the CPU; a Gather only picks channels; kernels, strides and channels are smaller.
_BERNOULLI2_OPS: dict[str, OpRule] = {
    **{op: replace(rule, ranks=(4, 4)) for op, rule in _BAYES_OPS.items()
       if op not in ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Softmax", "LogSoftmax", "ReduceMean", "ReduceMax",
                     "ReduceMin", "ReduceSum", "LayerNormalization", "GridSample", "Gather", "Tile")},
    "Conv": OpRule("HzSQuantizedConv", ("conv",), ranks=(4, 4), kernel=7, stride=4, dilation=16, channels=2048),
    "ConvTranspose": OpRule("HzSQuantizedConvTranspose", ("conv",), ranks=(4, 4), kernel=14, stride=4,
                            dilation=1, channels=2048, int16=False),
    "Gemm": OpRule("HzSQuantizedConv", ("conv",), ranks=(2, 2), channels=2048),
    "MatMul": OpRule("HzSQuantizedConv", ("conv",), ranks=(2, 4), channels=2048),
    "Add": OpRule("HzSQuantizedAdd", ("eltwise", "constant_eltwise", "lut"), ranks=(4, 4),
                   broadcast=("same", "scalar", "channel")),
    "Sub": OpRule("HzSQuantizedSub", ("eltwise", "constant_eltwise", "lut"), ranks=(4, 4),
                   broadcast=("same", "scalar", "channel")),
    "Mul": OpRule("HzSQuantizedMul", ("eltwise", "constant_eltwise", "lut"), ranks=(4, 4),
                   broadcast=("same", "scalar", "channel")),
    "AveragePool": OpRule("HzSQuantizedAveragePool", ("pool",), ranks=(4, 4), kernel=7, stride=4),
    "MaxPool": OpRule("", ("passive",), ranks=(4, 4), kernel=7, stride=4),
    "Transpose": OpRule("", ("passive",), ranks=(4, 4), perms=_NCHW_NHWC),
    "Concat": OpRule("HzSQuantizedConcat", ("concat",), ranks=(4, 4), axes=_NOT_BATCH),
    "Split": OpRule("", ("passive",), ranks=(4, 4), axes=_NOT_BATCH),
    # Channels picked or reordered by constant indices (a channel shuffle, ``bpu_forms``).
    "Gather": OpRule("", ("passive",), ranks=(4, 4), axes=(1,)),
}

PROFILES: dict[str, MarchProfile] = {
    p.name: p
    for p in (
        MarchProfile("bernoulli2", "RDK X3", int16=False, core_num=(1, 2), quantized_input_layout="NHWC",
                     peak_int8_tops=5.0, ddr_gbps=12.8, ops=_BERNOULLI2_OPS, tensor_ranks=(4, 4)),
        MarchProfile("bayes", "RDK Ultra", int16=True, core_num=(1,), quantized_input_layout=None,
                     peak_int8_tops=96.0, ddr_gbps=51.2, ops=_BAYES_OPS),
        MarchProfile("bayes-e", "RDK X5", int16=True, core_num=(1,), quantized_input_layout=None,
                     peak_int8_tops=10.0, ddr_gbps=25.6, ops=_BAYES_OPS),
        MarchProfile("nash-e", "S100", int16=True, core_num=(1,), quantized_input_layout=None,
                     peak_int8_tops=80.0, ddr_gbps=68.3, ops=_BAYES_OPS),
        MarchProfile("nash-m", "S100P", int16=True, core_num=(1,), quantized_input_layout=None,
                     peak_int8_tops=128.0, ddr_gbps=102.4, ops=_BAYES_OPS),
    )
}


def get_profile(march: str) -> MarchProfile:
    try:
        return PROFILES[march.lower()]
    except KeyError:
        raise HbError(f"unknown march '{march}'; choose one of {', '.join(PROFILES)}") from None
