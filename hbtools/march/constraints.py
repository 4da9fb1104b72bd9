"""One node against its march rule: the reason it cannot run on the BPU, or None.

The limits are data in ``hbtools.march.profiles``; this module only reads a
node's shapes and attributes and words the first limit it breaks, naming the
march, so the checker can print why a node runs on the CPU.
"""

from __future__ import annotations

import math

import numpy as np
from onnx import NodeProto

from hbtools.graph.bpu_forms.convs import MAX_PIECES
from hbtools.graph.graph import GraphView
from hbtools.march.profiles import MarchProfile, OpRule

_BROADCAST_WORDS = {"same": "equal shapes", "scalar": "a single-value operand",
                    "channel": "a per-channel operand", "general": "general broadcasting"}


def shape_text(shape: list[int | None]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def classify_broadcast(a: list[int | None], b: list[int | None]) -> str | None:
    """Which operand form two shapes are: same, scalar, channel, general (None: unknown or invalid)."""
    if None in a or None in b:
        return _partial_broadcast(a, b)
    if list(a) == list(b):
        return "same"
    if math.prod(a) == 1 or math.prod(b) == 1:
        return "scalar"
    # The operand order says nothing: SqueezeExcitation writes its gate first (scale * x).
    big, small = (a, b) if (len(a), math.prod(a)) >= (len(b), math.prod(b)) else (b, a)
    if _is_channel(big, [1] * (len(big) - len(small)) + list(small)):
        return "channel"
    try:
        np.broadcast_shapes(tuple(a), tuple(b))
    except ValueError:
        return None
    return "general"


def _partial_broadcast(a: list[int | None], b: list[int | None]) -> str | None:
    """The form where one shape has unknown dims (a sequence length behind a Loop, which onnx shape inference
    does not see through) and the other is known and 1 at each of them: the result is the partial shape
    whatever those dims are. Anything else depends on the unknown dims: None."""
    known, partial = (b, a) if None in a else (a, b)
    if None in known or len(known) > len(partial):
        return None
    padded = [1] * (len(partial) - len(known)) + list(known)
    if any(k != 1 and p != k for p, k in zip(partial, padded, strict=True)):
        return None  # an unknown dim meets a dim other than 1, or two known dims differ
    if math.prod(known) == 1:
        return "scalar"
    return "channel" if _is_channel(partial, padded) else "general"


def _is_channel(big: list[int | None], padded: list[int]) -> bool:
    """Whether ``padded`` (the smaller shape, 1s in front to ``big``'s rank) holds one value per channel of ``big``."""
    return len(big) >= 3 and padded[1] == big[1] and all(d == 1 for k, d in enumerate(padded) if k != 1)


# A constant operand the march cannot broadcast is written out at the activation's shape, up to this many
# values (a [1, 1, H, W] mask of a pooling border, a per-column row): beyond it the copy would outweigh the op.
EXPANDED_CONSTANT_LIMIT = 1 << 20


def constant_operand_shape(act: list[int | None] | None, const: list[int], rule: OpRule) -> list[int] | None:
    """The shape a constant operand of ``rule``'s op takes on the BPU against activation shape ``act``: its
    own where the march broadcasts it, ``act`` where only equal shapes work and the constant broadcasts
    into ``act`` (it is copied out at compile time); None where it has no BPU form."""
    form = classify_broadcast(act, const) if act is not None else None
    if form in rule.broadcast:
        return list(const)
    if form is None or "same" not in rule.broadcast or math.prod(act) > EXPANDED_CONSTANT_LIMIT:
        return None
    return list(act) if list(np.broadcast_shapes(tuple(act), tuple(const))) == list(act) else None


def _channels(node: NodeProto, view: GraphView) -> tuple[int, int] | None:
    """(input, output) channels of a conv-like node with a constant weight."""
    w = view.const(node.input[1]) if len(node.input) > 1 else None
    if w is None or w.ndim < 2:
        return None
    a = view.attrs(node)
    group = int(a.get("group", 1))
    if node.op_type == "Conv":
        return int(w.shape[1]) * group, int(w.shape[0])
    if node.op_type == "ConvTranspose":
        return int(w.shape[0]), int(w.shape[1]) * group
    if node.op_type == "Gemm":
        return (int(w.shape[1]), int(w.shape[0])) if a.get("transB", 0) else (int(w.shape[0]), int(w.shape[1]))
    return int(w.shape[-2]), int(w.shape[-1])  # MatMul


def output_parts(node: NodeProto, view: GraphView, limit: int | None) -> list[slice] | None:
    """Output-channel ranges of at most ``limit`` for a Conv (ungrouped), Gemm or MatMul with a constant
    weight that has more output channels than that (a vocabulary-sized CTC head, say): each range is
    one BPU convolution and a Concat joins them. None where the node needs no split or cannot take one."""
    ch = _channels(node, view)
    if limit is None or ch is None or ch[1] <= limit or node.op_type not in ("Conv", "Gemm", "MatMul") \
            or int(view.attrs(node).get("group", 1)) != 1:
        return None
    parts = -(-ch[1] // limit)
    size = -(-ch[1] // parts)  # as even as the count allows
    return [slice(k, min(k + size, ch[1])) for k in range(0, ch[1], size)]


def _kernel(node: NodeProto, view: GraphView) -> list[int]:
    a = view.attrs(node)
    if "kernel_shape" in a:
        return list(a["kernel_shape"])
    w = view.const(node.input[1]) if node.op_type in ("Conv", "ConvTranspose") and len(node.input) > 1 else None
    return list(w.shape[2:]) if w is not None else []


def _too_many_pieces(node: NodeProto, rule: OpRule, view: GraphView) -> str:
    """Why a Conv whose kernel alone is too long was not cut into pieces the BPU takes (``convs_in_kernel_pieces``):
    it would take more than ``MAX_PIECES`` (PESTO's 1040 taps: 70). Empty where that is not the reason."""
    a = view.attrs(node)
    taps = _kernel(node, view)
    if node.op_type != "Conv" or rule.kernel is None or not taps or any(
            limit is not None and values and max(values) > limit
            for limit, values in ((rule.stride, a.get("strides", [])), (rule.dilation, a.get("dilations", [])))):
        return ""
    pieces = math.prod(-(-t // rule.kernel) for t in taps)
    if pieces <= MAX_PIECES:
        return ""
    return f" (cut into pieces it takes, it would be {pieces} convolutions, more than the {MAX_PIECES} hbtools makes)"


def _kept_whole(node: NodeProto, view: GraphView, profile: MarchProfile, wide_input: bool) -> str:
    """Why a Conv with too many input channels was not cut into pieces over them
    (``wide_convs_in_channel_pieces``) when the cut alone would fit. Empty otherwise."""
    from hbtools.graph.bpu_forms.convs import result_leaves_the_bpu  # the rewrite's own test; a lazy import

    if not wide_input or node.op_type != "Conv" or int(view.attrs(node).get("group", 1)) != 1 or \
            not result_leaves_the_bpu(node, view, profile):
        return ""
    return " (cut over its input channels it would fit, but its result leaves the BPU: a sum of pieces would " \
           "give it as int8 where this Conv on the CPU gives it in float)"


def violation(node: NodeProto, rule: OpRule, view: GraphView, profile: MarchProfile) -> str | None:
    """The first constraint of ``rule`` that ``node`` breaks on ``profile``, as a sentence."""
    op, where = node.op_type, f"the BPU of {profile.label}"
    acts = [i for i in node.input if i and not view.is_const(i)]
    lo, hi = rule.ranks
    outs = [o for o in node.output if o]
    # a Concat is named by what it makes (its first input is only a part of it)
    for t in [*outs, *acts] if op == "Concat" else [*acts, *outs]:
        shape = view.shapes.get(t)
        if shape is not None and not lo <= len(shape) <= hi:
            allowed = f"{lo}-D" if lo == hi else f"{lo}-D to {hi}-D"
            # A computed side input (Clip's min, a Pad amount) is named: "Clip on a 0-D tensor" alone
            # reads as if the data were 0-D when it is 4-D.
            side = t in node.input[1:] and t not in node.output and t != node.input[0]
            data = view.shapes.get(node.input[0]) if t in node.output else None
            what = f"{op} reads a {len(shape)}-D tensor '{t}' (input {list(node.input).index(t)}, computed at run " \
                   f"time)" if side else f"{op} of {shape_text(data)} gives a {len(shape)}-D tensor" \
                if data is not None and len(data) != len(shape) else f"{op} on a {len(shape)}-D tensor"
            if profile.takes_rank(len(shape)):
                return f"{what} {shape_text(shape)}: {where} has no {len(shape)}-D {op} (its {op} takes {allowed} " \
                       f"tensors only)"
            return f"{what} {shape_text(shape)}: {where} takes {allowed} tensors only"
    a = view.attrs(node)
    # Every limit broken is named: a kernel too long for the BPU is split into pieces unless the stride
    # is too large as well (an STFT as a Conv: kernel 512, stride 160), and naming the kernel alone hides that.
    broken = [f"{key} {list(values)} exceeds {limit}"
              for key, limit, values in (("kernel", rule.kernel, _kernel(node, view)),
                                         ("stride", rule.stride, a.get("strides", [])),
                                         ("dilation", rule.dilation, a.get("dilations", [])))
              if limit is not None and values and max(values) > limit]
    if broken:
        return f"{op} {' and '.join(broken)}, the largest {where} takes{_too_many_pieces(node, rule, view)}"
    if rule.channels is not None:
        ch = _channels(node, view)
        # More output channels than the limit run as several convolutions (``output_parts``).
        inputs_only = ch is not None and output_parts(node, view, rule.channels) is not None
        if ch is not None and (ch[0] if inputs_only else max(ch)) > rule.channels:
            return f"{op} with {ch[0]} input / {ch[1]} output channels exceeds {where}'s limit of " \
                   f"{rule.channels}{_kept_whole(node, view, profile, ch[0] > rule.channels)}"
    if rule.axes is not None and acts:
        shape = view.shapes.get(acts[0])
        axis = a.get("axis", 0)
        if shape is not None and shape:
            axis %= len(shape)
        if axis not in rule.axes:
            return f"{op} along axis {axis}: {where} takes axis {' or '.join(map(str, rule.axes))} only"
    if rule.extent is not None:
        reason = _extent_violation(node, view, rule.extent, where)
        if reason:
            return reason
    if rule.perms is not None and op == "Transpose":
        shape = view.shapes.get(acts[0]) if acts else None
        perm = tuple(a.get("perm", range(len(shape) - 1, -1, -1) if shape else ()))
        if perm not in rule.perms:
            return f"Transpose with perm {list(perm)}: {where} only converts between NCHW and NHWC"
    if rule.modes is not None:
        mode = a.get("mode", "nearest")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        if mode not in rule.modes:
            also = " (and, as a convolution, linear by a whole factor of 2, 4 or 6 with half-pixel coordinates, " \
                   "or from one pixel)" if op == "Resize" and mode == "linear" else ""
            return f"{op} mode '{mode}': hbtools lowers only {' / '.join(rule.modes)} to {where}{also}"
    if len(acts) == 2 and acts[0] != acts[1] and "eltwise" in rule.forms:
        sa, sb = view.shapes.get(acts[0]), view.shapes.get(acts[1])
        form = classify_broadcast(sa, sb) if sa is not None and sb is not None else None
        if form is not None and form not in rule.broadcast:
            accepted = ", ".join(_BROADCAST_WORDS[f] for f in rule.broadcast)
            return (f"{op} of {shape_text(sa)} and {shape_text(sb)} needs {_BROADCAST_WORDS[form]}; "
                    f"{where} takes {accepted}")
    return None


def _extent_violation(node: NodeProto, view: GraphView, limit: int, where: str) -> str | None:
    """Why an ArgMax / ArgMin searches an axis too long for ``where`` (or of unknown size), else None."""
    shape = view.shapes.get(node.input[0])
    axis = int(view.attrs(node).get("axis", 0))
    if shape and -len(shape) <= axis < len(shape):
        axis %= len(shape)
    size = shape[axis] if shape and 0 <= axis < len(shape) else None
    if size is not None and size <= limit:
        return None
    along = "channels" if axis == 1 else f"values along axis {axis}"
    if size is None:
        return f"{node.op_type} over an axis of unknown size: {where} takes at most {limit} {along}"
    return f"{node.op_type} over {size} {along}: {where} takes at most {limit}"
