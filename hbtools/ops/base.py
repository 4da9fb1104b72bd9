"""The shape every Hz op follows: attributes, ONNX lowering, reference numerics.

Artefact files keep Horizon op types in the ``horizon`` domain. When
``HB_ONNXRuntime`` opens a file it replaces each Hz node by standard ONNX nodes
(``HzOp.lower``), so onnxruntime executes everything. ``HzOp.reference`` is an
independent numpy implementation used by tests and the ``.bin`` simulator.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence

import numpy as np
from onnx import NodeProto, TensorProto, ValueInfoProto, helper, numpy_helper

# Constants at least this large are stored once however many nodes read them: an unrolled recurrence
# reads one weight at every step (a 20-step LSTM's copies were 57 of its 69 MB).
SHARED_BYTES = 1024
# A constant cast to another type is kept once computed below this size, and computed again on each read
# above it (a fully connected layer's float64 levels: 0.8 GB for VGG-16's fc6).
KEPT_CAST_BYTES = 16 << 20


def content_key(value: np.ndarray) -> tuple | None:
    """What makes two constants the same (type, shape and bytes), for those of ``SHARED_BYTES`` or more."""
    if value.nbytes < SHARED_BYTES:
        return None
    return value.dtype.str, value.shape, hashlib.sha256(np.ascontiguousarray(value).data).digest()


DOMAIN = "horizon"
DOMAIN_VERSION = 1
CONTRIB_DOMAIN = "com.microsoft"  # onnxruntime's own ops, in every build HB_ONNXRuntime runs on
REQUIRED = object()  # attribute-spec default of an attribute every node must have


def fresh_name(hint: str, taken: set[str]) -> str:
    """``hint``, or ``hint_1``, ``hint_2``, ... : the first not in ``taken``, which it joins."""
    name, i = hint, 0
    while name in taken:
        i += 1
        name = f"{hint}_{i}"
    taken.add(name)
    return name


def attrs_of(node: NodeProto) -> dict:
    """A node's attributes as plain Python values (bytes decoded to str)."""
    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        if isinstance(v, TensorProto):  # float64 values (``HzOp.double_attributes``)
            v = numpy_helper.to_array(v).tolist()
        elif isinstance(v, bytes):
            v = v.decode()
        elif isinstance(v, list) and v and isinstance(v[0], bytes):
            v = [x.decode() for x in v]
        out[a.name] = v
    return out


class LoweringContext:
    """What a lowering may add to the graph besides nodes: constants and fresh names."""

    def __init__(
        self,
        opset: int,
        taken: set[str],
        shapes: dict[str, list[int | None]] | None = None,
        *,
        feed_calibration: bool = False,
    ) -> None:
        self.opset = opset
        self._taken = taken
        self.shapes = shapes or {}
        # When set, activation calibration grids become graph inputs so one session can
        # evaluate any threshold and bit width assignment (the searches).
        self.feed_calibration = feed_calibration
        # Constants a lowering made, by name in the order made: arrays until a caller takes them as
        # initializers (``initializers`` / ``made_constants``), so that those no node ends up reading (a large
        # weight's float64 levels, when its product runs on another form) never become a TensorProto copy.
        self._made: list[str] = []
        self.inputs: list[ValueInfoProto] = []
        # Float64 twins of a calibrated model's tensors (``hbtools.ops.twins``), and the
        # model's constants, which need no twin.
        self.twins: dict = {}
        self.exact = True  # keep twins (off where a lowering is switched piecewise, as the debugger's)
        self.cpu_nodes: set[str] = set()  # computed in float32 by the quantized model: no twins
        self.constants: set[str] = set()
        self.float_constants: set[str] = set()
        self.constant_values: dict[str, TensorProto] = {}
        # uint8 copies (value + 128) of int8 tensors, for onnxruntime's fast integer kernels
        # (``hbtools.ops.uint8_kernels``), and the constants they share.
        self.uint8: dict[str, str] = {}
        self.uint8_constants: dict[str, str] = {}
        self.int8_tensors: set[str] = set()  # tensors an integer op writes as int8
        # int16 levels split into 8-bit parts (``uint8_kernels.int16_parts``), once per tensor and layout
        self.byte_parts: dict[tuple[str, bool], list[tuple[str, str, float]]] = {}
        # int8 levels of the quantized model: what integer ops write, and their moves and exact casts
        self.level_tensors: set[str] = set()
        # Integer tensors an op cast from a float of whole numbers: tensor -> (that float, its type)
        self.float_copies: dict[str, tuple[str, int]] = {}
        self._arrays: dict[str, np.ndarray] = {}
        self._stored: dict[tuple, str] = {}  # content_key -> the constant holding it
        # Constants that are another constant in another type (``cast_constant``): name -> (source, dtype).
        # Their values are made when read, so a large weight is not held in float64 beside its float32 form.
        self._casts: dict[str, tuple[str, np.dtype]] = {}
        self.fused: dict[str, object] = {}  # calibrated-model patterns lowered as one kernel (hbtools.ops.fused)

    def unique(self, hint: str) -> str:
        return fresh_name(hint, self._taken)

    def constant(self, hint: str, value: np.ndarray) -> str:
        """A new constant named after ``hint``, or the name of an equal large one made before."""
        value = np.asarray(value)
        key = content_key(value)
        if key is not None and key in self._stored:
            return self._stored[key]
        name = self.unique(hint)
        self._made.append(name)
        self._arrays[name] = value
        if key is not None:
            self._stored[key] = name
        return name

    def cast_constant(self, hint: str, source: str, dtype: type) -> str:
        """A constant holding constant ``source`` in ``dtype`` (exact conversions only), made once per pair.

        Its value is computed when read (``known``, ``made_constants``), and not kept when large."""
        key = ("cast", source, np.dtype(dtype).str)
        if key in self._stored:
            return self._stored[key]
        name = self.unique(hint)
        self._made.append(name)
        self._casts[name] = (source, np.dtype(dtype))
        self._stored[key] = name
        return name

    def known(self, name: str) -> np.ndarray | None:
        """The value of constant ``name`` (the model's or one a lowering made), else None."""
        if name in self._casts:
            source, dtype = self._casts[name]
            value = self.known(source).astype(dtype)
            if value.nbytes < KEPT_CAST_BYTES:
                self._arrays[name] = value
                del self._casts[name]
            return value
        if name not in self._arrays and name in self.constant_values:
            self._arrays[name] = numpy_helper.to_array(self.constant_values[name])
        return self._arrays.get(name)

    @property
    def made(self) -> list[str]:
        """The names of the constants a lowering made, in the order made."""
        return list(self._made)

    def made_constants(self, names: Collection[str] | None = None) -> list[TensorProto]:
        """The constants the lowerings made (those named in ``names`` only, if given), as initializers."""
        return [numpy_helper.from_array(self.known(n), n) for n in self._made if names is None or n in names]

    @property
    def initializers(self) -> list[TensorProto]:
        """Every constant the lowerings made, as initializers (a new list on each call)."""
        return self.made_constants()

    def graph_input(self, name: str, elem_type: int, shape: list[int]) -> str:
        self._taken.add(name)
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return name

    def rank(self, tensor: str) -> int | None:
        shape = self.shapes.get(tensor)
        return None if shape is None else len(shape)

    def elements(self, tensor: str) -> int:
        """Number of elements of ``tensor``'s static shape (0 where a dimension is unknown)."""
        shape = self.shapes.get(tensor)
        return int(np.prod(shape)) if shape and all(isinstance(d, int) and d > 0 for d in shape) else 0


def add_node(ctx: LoweringContext, op: str, inputs: list[str], hint: str, nodes: list[NodeProto], **attrs) -> str:
    """Append an ``op`` node named and output-named ``<hint>_<op>`` (made unique); returns its output."""
    out = ctx.unique(f"{hint}_{op.lower()}")
    nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
    return out


def reduce_keepdims(ctx: LoweringContext, op: str, x: str, axes: Sequence[int], hint: str,
                    nodes: list[NodeProto]) -> str:
    """A Reduce* ``op`` of ``x`` over ``axes``, keeping them: the axes are an input of ReduceSum from
    opset 13 and of the other reductions from opset 18, an attribute before."""
    out = ctx.unique(f"{hint}_{op.lower()}")
    if ctx.opset >= (13 if op == "ReduceSum" else 18):
        nodes.append(helper.make_node(op, [x, ctx.constant(f"{hint}_axes", np.array(list(axes), dtype=np.int64))],
                                      [out], name=out, keepdims=1))
    else:
        nodes.append(helper.make_node(op, [x], [out], name=out, axes=list(axes), keepdims=1))
    return out


# Inputs of at least this many elements have an integer-valued sum taken one axis at a time.
AXIS_BY_AXIS_ELEMENTS = 1 << 18


def exact_sum(ctx: LoweringContext, x: str, axes: Sequence[int], keepdims: int, elements: int, hint: str,
              nodes: list[NodeProto]) -> str:
    """ReduceSum of ``x`` (integer values: int32, or levels in float64) over ``axes``.

    A large input (``elements``) is summed one axis at a time, the last first. onnxruntime lays
    the maps behind its uint8 convolutions out as NHWC and turns a sum over H and W into a sum
    over the two outer axes of three, which its reduction runs on a slow strided path: 10 ms for
    96 x 160 x 160 float64 levels, 2.3 ms one axis at a time (NCHW: 1.1 and 1.3 ms). The sums are
    exact either way (integers, in float64 below 2**53; in int32 modulo 2**32 in any order), so
    the order changes no bit.
    """
    axes = [int(a) for a in axes]
    steps = [[a] for a in sorted(axes, reverse=True)] if elements >= AXIS_BY_AXIS_ELEMENTS else [axes]
    for k, step in enumerate(steps):
        out = ctx.unique(hint if k == len(steps) - 1 else f"{hint}_{k}")
        if ctx.opset >= 13:
            inputs = [x, ctx.constant(f"{hint}_axes{k}", np.array(step, dtype=np.int64))]
            nodes.append(helper.make_node("ReduceSum", inputs, [out], name=out, keepdims=keepdims))
        else:
            nodes.append(helper.make_node("ReduceSum", [x], [out], name=out, axes=step, keepdims=keepdims))
        x = out
    return x


def reduced_axes(attrs: dict, axes_input: np.ndarray | None, rank: int) -> list[int]:
    """The axes (non-negative, sorted) a Reduce* node reduces, from its attributes and its constant axes
    input (opset 18): all of them when none are given, none with ``noop_with_empty_axes``."""
    axes = attrs.get("axes") if axes_input is None else [int(v) for v in np.ravel(axes_input)]
    if not axes:
        return [] if attrs.get("noop_with_empty_axes", 0) else list(range(rank))
    return sorted(int(v) % rank for v in axes)


class HzOp:
    """Base class: one subclass per Hz op type, registered in ``hbtools.ops.registry``."""

    op_type: str = ""
    # Facts the rest of hbtools asks about instead of keeping lists of op types:
    shape_preserving: bool = False  # output 0 has input 0's shape
    float_output: bool = False  # output 0 is float32
    mac: bool = False  # a multiply-accumulate op (hb_perf counts its MACs)
    boundary: bool = False  # converts between float and integers at a BPU/CPU boundary
    index_output: bool = False  # output 0 is int64 indices (ArgMax): no step, no Dequantize
    reduction: bool = False  # one vector operation per input element, not per output one (hb_perf)

    # An op that quantizes a partition unit by itself: the unit kind (a march profile form) and
    # the ONNX ops it stands for. ``emit`` then turns such a unit into this op; ``float64_twins``
    # says the ONNX ops run exactly on a calibrated model's float64 twins (``hbtools.ops.twins``).
    unit_kind: str = ""
    onnx_ops: tuple[str, ...] = ()
    float64_twins: bool = False
    # Its units read one activation and constant tensors (not scalars: those fold into a lookup table).
    constant_operands: bool = False
    # The Hz op that stands for such a unit's ONNX node in the calibrated model (its lowering emulates
    # this op's numerics), and, on that op, the ONNX op it stands for.
    calibrated_op: str = ""
    float_op: str = ""
    # A float op the optimize stage writes (HzLayerNorm): the ONNX op whose march rule places it.
    device_op: str = ""
    # Its integer kernel reads int16 where the march has int16 (Softmax, LayerNorm: int8 loses them).
    int16_input: bool = False
    # Attribute spec: name -> default (REQUIRED: no default). Empty: not declared (free form).
    attributes: dict[str, object] = {}
    # Attributes stored as float64 tensors: FLOAT(S) attributes are float32, and a requantization
    # multiplier rounded to float32 moves results near a rounding tie to the other integer.
    double_attributes: tuple[str, ...] = ()

    @classmethod
    def make_node(cls, inputs: Sequence[str], outputs: Sequence[str], name: str, **attrs) -> NodeProto:
        """A node of this op; attributes are checked against the spec, ``None`` values left out."""
        attrs = {k: v for k, v in attrs.items() if v is not None}
        # A float32 requantization uses float32 multipliers: float64 would store digits nobody reads.
        precision = np.float32 if attrs.get("requantize_f32") else np.float64
        for k in cls.double_attributes:
            if k in attrs:
                attrs[k] = numpy_helper.from_array(np.asarray(attrs[k], dtype=np.float64).astype(precision))
        if cls.attributes:
            unknown = sorted(set(attrs) - set(cls.attributes))
            missing = sorted(k for k, v in cls.attributes.items() if v is REQUIRED and k not in attrs)
            if unknown or missing:
                raise ValueError(f"{cls.op_type} {name}: unknown attributes {unknown}, missing {missing}")
        return helper.make_node(cls.op_type, list(inputs), list(outputs), name=name, domain=DOMAIN, **attrs)

    @classmethod
    def read(cls, node: NodeProto) -> dict:
        """A node's attributes with the spec's defaults filled in (the inverse of ``make_node``)."""
        defaults = {k: v for k, v in cls.attributes.items() if v is not REQUIRED and v is not None}
        return {**defaults, **attrs_of(node)}

    @classmethod
    def refusal(cls, node: NodeProto, view) -> str:  # noqa: ANN001 - GraphView lives above ops/
        """Why ``node`` cannot become a unit of this op's ``unit_kind`` ("" when it can)."""
        return ""

    @classmethod
    def emit(cls, state, unit) -> None:  # noqa: ANN001 - EmitState and Unit live above ops/
        """Quantize partition ``unit`` (of ``unit_kind``) into this op on the quantize stage's ``state``."""
        raise NotImplementedError

    @classmethod
    def lower(cls, node: NodeProto, ctx: LoweringContext) -> list[NodeProto]:
        """Standard-ONNX nodes computing exactly this node's outputs from its inputs."""
        raise NotImplementedError

    @classmethod
    def reference(cls, node: NodeProto, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """numpy implementation of the node (independent of ``lower``)."""
        raise NotImplementedError
