"""1-D layers as 4-D layers of one row, for a BPU that takes 4-D tensors only (RDK X3)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from onnx import ModelProto, NodeProto, helper, numpy_helper

from hbtools.graph.bpu_forms._common import _axes_node, _opset, reshape_node
from hbtools.graph.bpu_forms.resizes import resize_of_the_row
from hbtools.graph.graph import GraphView, remove_dead_nodes
from hbtools.march.profiles import MarchProfile
from hbtools.ops.base import fresh_name

ROW = 2  # the axis a [N, C, L] tensor gains: [N, C, 1, L]

# Element-wise functions of their first input (further inputs are scalar constants: Clip's bounds).
_UNARY = ("Relu", "Sigmoid", "Tanh", "LeakyRelu", "Elu", "Selu", "Celu", "HardSigmoid", "HardSwish", "Softplus",
          "Softsign", "Exp", "Log", "Abs", "Neg", "Sqrt", "Erf", "Identity", "Clip", "Gelu", "Mish", "Reciprocal",
          "ThresholdedRelu", "Sin", "Cos", "Floor", "Ceil", "Round", "Sign")
# Element-wise ops of inputs that broadcast against each other: activations and constants.
_BROADCASTING = ("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "PRelu")
_REDUCTIONS = {"ReduceMean": 18, "ReduceSum": 13, "ReduceMax": 18, "ReduceMin": 18}  # the opset axes become an input


def one_row_chains_as_4d(model: ModelProto, profile: MarchProfile, placed: Mapping[str, str] | None = None) -> int:
    """On a march whose BPU takes no 3-D tensor (RDK X3): a 1-D Conv / ConvTranspose of [N, C, L] (Conv1d, any
    groups, dilation, pads, stride) as the 2-D one of [N, C, 1, L] with kernel [1, k], and the nodes that read
    such rows as rows too: element-wise ops and activations (a constant of another shape takes the row axis),
    BatchNormalization, Concat / Split / Slice / Pad (axes past the channels move by one), a Resize of the
    length (``resize_of_the_row``) and reductions (one over the length also over the row). A Squeeze of the
    row is written after each of them, and an Unsqueeze before a Conv whose input is no row yet; an Unsqueeze
    of a tensor that has a row is that row. Unread Squeezes go, so a chain of 1-D layers is one Unsqueeze, 4-D
    nodes and one Squeeze: the same values (the row has one element), where every layer of a TC-ResNet or a
    TCN ran on the CPU in float before. Nodes ``placed`` (node_info) puts on the CPU stay. Returns how many
    nodes it wrote over rows."""
    conv = profile.rule("Conv")
    if profile.takes_rank(3) or conv is None or not conv.ranks[0] <= 4 <= conv.ranks[1]:
        return 0
    columns = _column_convs_as_rows(model, profile, placed or {})
    return _Rows(model, placed or {}).run() + columns


def _column_convs_as_rows(model: ModelProto, profile: MarchProfile, placed: Mapping[str, str]) -> int:
    """A 2-D Conv over a single column, [N, C, L, 1] with kernel [k, 1] and nothing across the column, read only by
    a Squeeze of that column (tf2onnx / jax2tf write Keras' Conv1D so: magika's byte classifier) as the same Conv
    over the row [N, C, 1, L] (its input an Unsqueeze of the row where it was an Unsqueeze of the column, or a
    Reshape to the row where a layout op the BPU does not take made the column: the CPU's anyway), the Squeeze
    then of the row: ``_Rows`` carries the layers after it over the row, where the Squeeze left them 3-D on the
    CPU. Not where the column comes from a BPU op or a model input: a CPU Reshape there would split the BPU
    part. Returns how many Convs it turned."""
    view = GraphView(model)
    opset = _opset(model)
    taken = {*(i.name for i in model.graph.input), *(t.name for t in model.graph.initializer),
             *(name for n in model.graph.node for name in (n.name, *n.input, *n.output))}
    turned: dict[str, NodeProto] = {}  # Squeeze name -> its new form
    nodes: list[NodeProto] = []
    for node in model.graph.node:
        if node.name in turned:
            nodes.append(turned[node.name])
            continue
        readers = view.consumers.get(node.output[0], []) if node.output else []
        squeeze = readers[0] if len(readers) == 1 else None
        found = _column_conv(node, squeeze, view, placed)
        if found is None:
            nodes.append(node)
            continue
        shape, w, a = found
        row_in = fresh_name(f"{node.input[0]}_row", taken)
        producer = view.producer.get(node.input[0])
        if producer is not None and producer.op_type == "Unsqueeze" and _unit_axes(producer, view) == [3]:
            nodes.append(_axes_node(model, opset, "Unsqueeze", producer.input[0], row_in, [ROW],
                                    fresh_name(f"{node.name}_row_input", taken)))
        elif not _made_on_the_cpu(producer, profile, view):
            nodes.append(node)
            continue
        else:
            nodes.append(reshape_node(model, node.input[0], row_in, [shape[0], shape[1], 1, shape[2]],
                                      fresh_name(f"{node.name}_row_input", taken)))
        weight = fresh_name(f"{node.input[1]}_row", taken)
        model.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(w.transpose(0, 1, 3, 2)), weight))
        pads = [int(v) for v in a.get("pads") or [0, 0, 0, 0]]
        row_out = fresh_name(f"{node.output[0]}_row", taken)
        conv = helper.make_node("Conv", [row_in, weight, *node.input[2:]], [row_out], name=node.name,
                                kernel_shape=[1, w.shape[2]], pads=[0, pads[0], 0, pads[2]],
                                strides=[1, int((a.get("strides") or [1, 1])[0])],
                                dilations=[1, int((a.get("dilations") or [1, 1])[0])], group=int(a.get("group", 1)))
        nodes.append(conv)
        turned[squeeze.name] = _axes_node(model, opset, "Squeeze", row_out, squeeze.output[0], [ROW],
                                          fresh_name(f"{squeeze.name}_of_row", taken))
        turned[squeeze.name].name = squeeze.name
    if turned:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
        remove_dead_nodes(model)
    return len(turned)


def _column_conv(node: NodeProto, squeeze: NodeProto | None, view: GraphView,
                 placed: Mapping[str, str]) -> tuple[list[int], np.ndarray, dict] | None:
    """(input shape, weight, attributes) of a Conv over a single column read only by a Squeeze of it, else None."""
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or placed.get(node.name) == "CPU" \
            or squeeze is None or squeeze.op_type != "Squeeze" or node.output[0] in view.graph_outputs \
            or _unit_axes(squeeze, view) != [3]:
        return None
    w = view.const(node.input[1])
    shape, out = view.shapes.get(node.input[0]), view.shapes.get(node.output[0])
    a = view.attrs(node)
    if w is None or w.ndim != 4 or w.shape[3] != 1 or shape is None or out is None or len(shape) != 4 \
            or shape[3] != 1 or out[3] != 1 or not all(isinstance(d, int) for d in shape) \
            or a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        return None
    pads = [int(v) for v in a.get("pads") or [0, 0, 0, 0]]
    if pads[1] or pads[3] or int((a.get("strides") or [1, 1])[1]) != 1:
        return None
    return shape, w, a


def _made_on_the_cpu(producer: NodeProto | None, profile: MarchProfile, view: GraphView) -> bool:
    """Whether ``producer`` is a layout op the march's BPU does not take (a Transpose of other axes than NCHW /
    NHWC, a Reshape, Flatten, Squeeze or Unsqueeze where it has no such op)."""
    if producer is None or producer.domain not in ("", "ai.onnx"):
        return False
    rule = profile.rule(producer.op_type)
    if producer.op_type == "Transpose":
        perm = tuple(int(p) for p in view.attrs(producer).get("perm") or ())
        return rule is None or (rule.perms is not None and perm not in rule.perms)
    return producer.op_type in ("Reshape", "Flatten", "Squeeze", "Unsqueeze") and rule is None


def _unit_axes(node: NodeProto, view: GraphView) -> list[int] | None:
    """The axes (of a 4-D tensor, non-negative) a Squeeze takes or an Unsqueeze gives, where constant."""
    a = view.attrs(node)
    given = a.get("axes")
    if given is None and len(node.input) > 1 and node.input[1]:
        given = view.const(node.input[1])
    return None if given is None else [int(v) % 4 for v in np.ravel(given)]


def _row_axis(axis: int) -> int:
    """The axis of [N, C, 1, L] holding axis ``axis`` of [N, C, L]."""
    axis %= 3
    return axis + 1 if axis >= ROW else axis


def _row_shape(shape: list | None) -> list | None:
    return None if shape is None else [*shape[:ROW], 1, *shape[ROW:]]


class _Rows:
    """One pass over the nodes in order, knowing for each 3-D tensor met its row form (``rows``)."""

    into, out_of = "to_2d", "from_2d"  # the names of the nodes writing and undoing a row end so

    def __init__(self, model: ModelProto, placed: Mapping[str, str]) -> None:
        self.model = model
        self.view = GraphView(model)
        self.opset = _opset(model)
        self.placed = placed
        self.shapes = dict(self.view.shapes)
        self.rows: dict[str, str] = {}
        self.renamed: dict[str, str] = {}  # outputs of dropped Unsqueezes -> the rows they made again
        self.nodes: list[NodeProto] = []
        # every name in the model: the names this pass writes are kept apart from them (a pass before this one,
        # ``token_mlps_as_4d``'s over maps before its over tokens, may have written '<tensor>_row' already)
        self.taken = {*(i.name for i in model.graph.input), *(t.name for t in model.graph.initializer),
                      *(name for n in model.graph.node for name in (n.name, *n.input, *n.output))}

    def _fresh(self, hint: str) -> str:
        """``hint`` or, where the model has that name already, ``hint_1``, ``hint_2``, ... ."""
        return fresh_name(hint, self.taken)

    def _fresh_node(self, hint: str) -> str:
        """A node name free for the constants named after it too (``reshape_node``'s, ``_axes_node``'s)."""
        name = self._fresh(hint)
        while {f"{name}_shape", f"{name}_axes"} & self.taken:
            name = self._fresh(hint)
        self.taken.update((f"{name}_shape", f"{name}_axes"))
        return name

    def run(self) -> int:
        count = 0
        for node in self.model.graph.node:
            for k, name in enumerate(node.input):
                node.input[k] = self.renamed.get(name, name)
            if node.domain not in ("", "ai.onnx") or self.placed.get(node.name) == "CPU":
                self.nodes.append(node)
            elif self._layout(node):
                continue
            elif self._conv(node) or self._over_rows(node):
                count += 1
            else:
                self.nodes.append(node)
        if not count and not self.renamed:
            return 0
        del self.model.graph.node[:]
        self.model.graph.node.extend(self.nodes)
        remove_dead_nodes(self.model)
        gone = {*self.renamed, *self.rows} - {o for n in self.model.graph.node for o in n.output}
        stale = [v for v in self.model.graph.value_info if v.name in gone]
        for v in stale:
            self.model.graph.value_info.remove(v)
        return count

    def _axes(self, node: NodeProto) -> list[int] | None:
        a = self.view.attrs(node)
        if "axes" in a:
            return [int(v) for v in a["axes"]]
        given = self.view.const(node.input[1]) if len(node.input) > 1 and node.input[1] else None
        return None if given is None else [int(v) for v in np.ravel(given)]

    def _layout(self, node: NodeProto) -> bool:
        """A Squeeze of the row of a [N, C, 1, L] tensor: its output has that row. An Unsqueeze adding the row
        to a [N, C, L] tensor: dropped where the tensor has a row already, else that row. Whether handled."""
        if node.op_type not in ("Squeeze", "Unsqueeze"):
            return False
        shape, axes = self.shapes.get(node.input[0]), self._axes(node)
        if node.op_type == "Squeeze":
            if node.input[0] in self.rows and shape is not None and len(shape) == 3:
                return self._squeezed_row(node, shape, axes)
            if shape is None or len(shape) != 4 or shape[ROW] != 1 or axes is None or [a % 4 for a in axes] != [ROW]:
                return False
            self.rows[node.output[0]] = node.input[0]
            self.nodes.append(node)
            return True
        if shape is None or len(shape) != 3 or axes is None or [a % 4 for a in axes] != [ROW]:
            return False
        readers = self.view.consumers.get(node.output[0], [])
        if node.input[0] in self.rows and node.output[0] not in self.view.graph_outputs \
                and all(node.output[0] in r.input for r in readers):  # a Loop / If body names it otherwise
            self.renamed[node.output[0]] = self.rows[node.input[0]]
            return True
        self.rows.setdefault(node.input[0], node.output[0])
        self.nodes.append(node)
        return True

    def _squeezed_row(self, node: NodeProto, shape: list, axes: list[int] | None) -> bool:
        """A Squeeze of a [N, C, L] tensor that has a row (``adaptive_avg_pool1d(y, 1).squeeze(-1)``) as one
        Squeeze of that row, its axes moved and the row among them: the pooled map [N, C, 1, 1] flattened once,
        which a Gemm head reads on the BPU (``flattens_after_heads``), where two Squeezes in a row kept the pool
        and the head apart on the CPU."""
        if axes is None and self.view.attrs(node).get("axes") is None and len(node.input) < 2:
            axes = [k for k, d in enumerate(shape) if d == 1]
        if not axes or any(shape[a % 3] != 1 for a in axes):
            return False
        moved = sorted({*(_row_axis(a) for a in axes), ROW})
        squeeze = _axes_node(self.model, self.opset, "Squeeze", self.rows[node.input[0]], node.output[0], moved,
                             self._fresh_node(f"{node.name}_of_row"))
        squeeze.name = node.name
        self.nodes.append(squeeze)
        return True

    def _row_of(self, tensor: str, reader: NodeProto) -> str:
        """The row form of the 3-D ``tensor``: an Unsqueeze where it has none yet."""
        if tensor not in self.rows:
            row = self._fresh(f"{tensor}_row")
            self.nodes.append(self._to_view(tensor, row, self._fresh_node(f"{reader.name}_{self.into}")))
            self.rows[tensor] = row
            self.shapes[row] = self._view_shape(self.shapes.get(tensor))
        return self.rows[tensor]

    def _view_shape(self, shape: list | None) -> list | None:
        """The shape of the 4-D form of a tensor of ``shape``."""
        return _row_shape(shape)

    def _to_view(self, tensor: str, view: str, name: str) -> NodeProto:
        """The node writing ``view``, the 4-D form of ``tensor``."""
        return _axes_node(self.model, self.opset, "Unsqueeze", tensor, view, [ROW], name)

    def _from_view(self, view: str, tensor: str, name: str) -> NodeProto:
        """The node giving ``tensor`` back from ``view``, its 4-D form."""
        return _axes_node(self.model, self.opset, "Squeeze", view, tensor, [ROW], name)

    def _constant(self, name: str, reader: NodeProto) -> str:
        """A constant operand broadcast against [N, C, L], given the row axis (one of fewer than 2 axes
        broadcasts over the last axis either way)."""
        value = self.view.const(name)
        if value.ndim < 2:
            return name
        row = self._fresh(f"{name}_{reader.name}_row")
        shaped = value.reshape((1,) * (3 - value.ndim) + value.shape)
        self.model.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(shaped[:, :, None]), row))
        return row

    def _emit(self, node: NodeProto, inputs: list[str], attrs: dict, keep_outputs: bool = False,
              op_type: str | None = None) -> None:
        """``node`` over rows (as ``op_type`` if given), named as ``node``: its ``inputs`` and ``attrs`` (None: the
        attribute goes); a Squeeze of each output's row gives its 3-D form (unless ``keep_outputs``: it writes
        them itself)."""
        outputs = list(node.output) if keep_outputs else [self._fresh(f"{o}_row") if o else "" for o in node.output]
        new = helper.make_node(op_type or node.op_type, inputs, outputs, name=node.name, domain=node.domain)
        new.attribute.extend(a for a in node.attribute if a.name not in attrs)
        new.attribute.extend(helper.make_attribute(k, v) for k, v in attrs.items() if v is not None)
        self.nodes.append(new)
        if keep_outputs:
            return
        for k, (flat, row) in enumerate(zip(node.output, outputs, strict=True)):
            if flat:
                self.rows[flat] = row
                self.shapes[row] = self._view_shape(self.shapes.get(flat))
                self.nodes.append(self._from_view(row, flat, self._fresh_node(f"{node.name}_{self.out_of}"
                                                                              + (f"_{k}" if k else ""))))

    def _conv(self, node: NodeProto) -> bool:
        """A Conv / ConvTranspose of a 3-D tensor by a constant weight as the one of its row."""
        if node.op_type not in ("Conv", "ConvTranspose") or len(node.input) < 2:
            return False
        w, shape = self.view.const(node.input[1]), self.shapes.get(node.input[0])
        if w is None or w.ndim != 3 or shape is None or len(shape) != 3 \
                or (len(node.input) > 2 and node.input[2] and not self.view.is_const(node.input[2])):
            return False
        a = self.view.attrs(node)
        attrs = {key: [one, *a[key]] for key, one in (("kernel_shape", 1), ("strides", 1), ("dilations", 1),
                                                        ("output_padding", 0), ("output_shape", 1)) if key in a}
        if "pads" in a:
            attrs["pads"] = [0, a["pads"][0], 0, a["pads"][1]]
        weight = self._fresh(f"{node.input[1]}_{node.name}_row")
        self.model.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(w[:, :, None]), weight))
        self._emit(node, [self._row_of(node.input[0], node), weight, *node.input[2:]], attrs)
        return True

    def _over_rows(self, node: NodeProto) -> bool:
        """Any other node that reads a row and has a form over rows (``one_row_chains_as_4d``) as that form."""
        first = node.input[0] if node.input else ""
        if first not in self.rows and not (node.op_type in (*_BROADCASTING, "Concat")
                                           and any(i in self.rows for i in node.input)):
            return False
        if node.op_type in _REDUCTIONS:
            return self._reduction(node)
        if any(len(self.shapes.get(o) or []) != 3 for o in node.output if o):
            return False
        if node.op_type in (*_BROADCASTING, "Concat"):
            return self._joined(node)
        a = self.view.attrs(node)
        rest = list(node.input[1:])
        if node.op_type in _UNARY or (node.op_type == "BatchNormalization" and len(node.output) == 1):
            attrs = {}
        elif node.op_type == "Split":
            attrs = {"axis": _row_axis(a.get("axis", 0))}
        elif node.op_type == "Slice":
            found = self._slice_axes(node)
            if found is None:
                return False
            attrs, rest = found
        elif node.op_type == "Pad":
            found = self._pads(node)
            if found is None:
                return False
            attrs, rest = found
        elif node.op_type == "Resize":
            resize = resize_of_the_row(node, self.view, self.model)
            if resize is None:
                return False
            attrs, rest = {}, list(resize.input[1:])
        else:
            return False
        self._emit(node, [self.rows[first], *rest], attrs)
        return True

    def _joined(self, node: NodeProto) -> bool:
        """An element-wise op of several operands, or a Concat, over rows: each activation as its row (an
        Unsqueeze for one that has none), constants given the row axis."""
        for name in node.input:
            value = self.view.const(name) if name else None
            if (value is not None and value.ndim > 3) or \
                    (value is None and name and len(self.shapes.get(name) or []) != 3):
                return False
        inputs = [(self._constant(i, node) if self.view.is_const(i) else self._row_of(i, node)) if i else ""
                  for i in node.input]
        attrs = {"axis": _row_axis(self.view.attrs(node).get("axis", 1))} if node.op_type == "Concat" else {}
        self._emit(node, inputs, attrs)
        return True

    def _slice_axes(self, node: NodeProto) -> tuple[dict, list[str]] | None:
        """A Slice's attributes and inputs past the data over rows: its axes moved (all of them where none
        are given); None where they are not constant."""
        if self.opset < 10:
            a = self.view.attrs(node)
            axes = a.get("axes", range(len(a["starts"])))
            return {"axes": [_row_axis(x) for x in axes]}, []
        starts = self.view.const(node.input[1])
        given = len(node.input) > 3 and node.input[3]
        axes = self.view.const(node.input[3]) if given else None if starts is None else np.arange(starts.size)
        if axes is None:
            return None
        name = self._fresh(f"{node.name}_axes_row")
        self.model.graph.initializer.append(numpy_helper.from_array(
            np.array([_row_axis(int(x)) for x in np.ravel(axes)], np.int64), name))
        rest = list(node.input[1:])
        rest += [""] * (3 - len(rest))
        rest[2] = name
        return {}, rest

    def _pads(self, node: NodeProto) -> tuple[dict, list[str]] | None:
        """A Pad's attributes and inputs past the data over rows: nothing added on the row."""
        if self.opset < 11:
            pads = list(self.view.attrs(node)["pads"])
            return {"pads": [*pads[:ROW], 0, *pads[ROW:3 + ROW], 0, *pads[3 + ROW:]]}, []
        rest = list(node.input[1:])
        if len(rest) > 2 and rest[2]:  # opset 18: the pads of the given axes, which move
            axes = self.view.const(rest[2])
            if axes is None:
                return None
            rest[2] = self._fresh(f"{node.name}_axes_row")
            self.model.graph.initializer.append(numpy_helper.from_array(
                np.array([_row_axis(int(x)) for x in np.ravel(axes)], np.int64), rest[2]))
            return {}, rest
        pads = self.view.const(rest[0])
        if pads is None or pads.size != 6:
            return None
        rest[0] = self._fresh(f"{node.name}_pads_row")
        self.model.graph.initializer.append(numpy_helper.from_array(
            np.array([*pads[:ROW], 0, *pads[ROW:3 + ROW], 0, *pads[3 + ROW:]], np.int64), rest[0]))
        return {}, rest

    def _reduction(self, node: NodeProto) -> bool:
        """A reduction over rows: its axes moved, and the row among them where it reduces the length or drops
        its axes (a reduction over one value changes nothing); without keepdims it writes its outputs."""
        axes = self.view.reduced_axes(node)
        if axes is None or not axes or len(self.shapes.get(node.input[0]) or []) != 3:
            return False
        keep = int(self.view.attrs(node).get("keepdims", 1))
        moved = [_row_axis(x) for x in axes]
        if not keep or ROW + 1 in moved:
            moved = sorted({*moved, ROW})
        attrs: dict = {"axes": None, "noop_with_empty_axes": None}
        inputs = [self.rows[node.input[0]]]
        if self.opset < _REDUCTIONS[node.op_type]:
            attrs["axes"] = moved
        else:
            name = self._fresh(f"{node.name}_axes_row")
            self.model.graph.initializer.append(numpy_helper.from_array(np.array(moved, np.int64), name))
            inputs.append(name)
        self._emit(node, inputs, attrs, keep_outputs=not keep)
        return True
