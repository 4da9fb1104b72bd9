"""What an output holds whatever the input: the constant part of its arithmetic tail.

Detectors decode positions around a grid of constants: an Ultralytics export computes its boxes as
anchor points minus and plus predicted distances, times the strides; YOLOX adds the grid to its
offsets; a RetinaNet-style head adds anchor boxes. Walking back from an output through element-wise
arithmetic (``ARITHMETIC``) and ops that only move values (``CARRIES``), and through HzCalibration,
gives that tail; evaluated with every tensor computed otherwise (a Conv's, a Sigmoid's output, the
inputs) at zero, its tensors hold their constant parts. The same walk finds the same tail in a float
and in a calibrated model.

Restoration nets add their input to what they compute (``out = x + f(x)``: denoisers, NAFNet, a
super-resolution body added to the bicubic resize of its input). Where the tail reads the model input
through weight-free ops (the preprocessing, a resize: ``EXACT``; a featuremap's normalisation folded into a
depthwise 1x1 Conv), the tail evaluated with the input at
its value and the rest at zero gives, per sample, the part of the output the input alone decides
(``known_model``).
"""

from __future__ import annotations

import logging

import numpy as np
from onnx import ModelProto, NodeProto, TensorProto, helper, numpy_helper

from hbtools.graph.graph import GraphView, is_static

log = logging.getLogger("hbtools")

# Element-wise arithmetic: at zero data its value is the constant it adds (Div: by a constant only).
ARITHMETIC = ("Add", "Sub", "Mul", "Neg", "Div")
# Ops that only move values: what comes out is, element by element, a value of what goes in.
MOVES = ("Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Concat")
CARRIES = (*MOVES, "Split", "Slice", "Gather", "Expand", "Tile")  # those whose extra inputs say where
# Element-wise selections between values (boxes clipped to the picture): ``Tails.grids`` walks through them.
SELECTIONS = ("Clip", "Min", "Max", "Relu")
_STANDARD = ("", "ai.onnx")
# Weight-free ops that keep a value known exactly when their data inputs are (the model input, its
# preprocessing and resizes of it): what the tail reads of the input through them needs no weights.
EXACT = (*ARITHMETIC, *CARRIES, "Resize", "Upsample", "Pad", "Cast")
_EXACT_HZ = ("HzPreprocess", "HzCalibration")
_CONSTANT_GRIDS = ("HzCalibration", "HzBiasCalibration")  # a constant's grid is a constant


def constant_tensors(model: ModelProto) -> set[str]:
    """The tensors computed from initializers alone, a weight's HzCalibration and a bias's HzBiasCalibration
    included: a calibrated model has the same constants as the float model it was built from (and their grids)."""
    constant = {t.name for t in model.graph.initializer}
    for node in model.graph.node:
        ins = [i for i in node.input if i]
        standard = node.domain in _STANDARD
        if (standard and node.op_type == "Constant") or (ins and all(i in constant for i in ins) and (
                standard or node.op_type in _CONSTANT_GRIDS)):
            constant.update(node.output)
    return constant


class Tails:
    """The arithmetic tails of a model's tensors (see the module's text)."""

    def __init__(self, model: ModelProto) -> None:
        self.model = model
        self.producer = {o: n for n in model.graph.node for o in n.output}
        self.inits = {t.name: t for t in model.graph.initializer}
        self.constant = constant_tensors(model)
        self._view: GraphView | None = None
        # Tensors computed from the model inputs (and constants) by weight-free ops alone.
        self.exact = {i.name for i in model.graph.input if i.name not in self.inits}
        for node in model.graph.node:
            data = [i for i in node.input if i and i not in self.constant]
            kind = node.op_type in EXACT if node.domain in _STANDARD else node.op_type in _EXACT_HZ
            kind = kind or (node.op_type == "MatMul" and node.domain in _STANDARD and self._interpolates(node)) \
                or (node.op_type == "Conv" and node.domain in _STANDARD and self._scales_channels(node))
            if kind and data and all(i in self.exact for i in data):
                self.exact.update(o for o in node.output if o)

    def _interpolates(self, node: NodeProto) -> bool:
        """Whether a MatMul resamples its first input along the last axis by a constant matrix whose every
        output is an interpolation of its inputs (each column sums to 1): a linear or cubic Resize as the
        BPU computes it (``bpu_forms.resizes``), the resize of an input a super-resolution net adds to its
        output."""
        weight = self._constant_value(node.input[1])
        return weight is not None and weight.ndim == 2 and weight.dtype.kind == "f" and \
            bool(np.allclose(weight.sum(axis=0), 1, atol=1e-5))

    def _scales_channels(self, node: NodeProto) -> bool:
        """Whether a Conv is a constant scale and shift per channel (a depthwise 1x1 Conv of stride 1 and no
        padding): the normalisation of a featuremap input that the optimize stage folded into one."""
        weight = self._constant_value(node.input[1])
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        return weight is not None and weight.ndim >= 3 and all(d == 1 for d in weight.shape[1:]) \
            and attrs.get("group", 1) == weight.shape[0] and not any(attrs.get("pads", [])) \
            and all(v == 1 for v in attrs.get("strides", [])) and all(v == 1 for v in attrs.get("dilations", []))

    def _constant_value(self, name: str) -> np.ndarray | None:
        """An initializer's value, also behind its HzCalibration (a calibrated model's weight)."""
        while name not in self.inits and name in self.producer and \
                self.producer[name].op_type in ("HzCalibration", "Identity"):
            name = self.producer[name].input[0]
        return numpy_helper.to_array(self.inits[name]) if name in self.inits else None

    def _in_tail(self, node: NodeProto, name: str, selections: bool = False) -> bool:
        op = node.op_type if node.domain in _STANDARD else None
        if name in self.constant or node.op_type == "HzCalibration":
            return True
        if selections and op in SELECTIONS:
            return True
        if op in CARRIES:  # what it moves is its first input (any of a Concat's); the rest say where
            return op == "Concat" or all(not i or i in self.constant for i in node.input[1:])
        return op in ARITHMETIC and (op != "Div" or node.input[1] in self.constant)

    def tail(self, out: str, selections: bool = False) -> tuple[list[NodeProto], list[str]]:
        """The nodes of ``out``'s tail in model order, and the tensors it reads that it does not compute
        (initializers aside); with ``selections``, through element-wise selections (``SELECTIONS``) too."""
        members: set[int] = set()
        leaves: list[str] = []
        stack, seen = [out], set()
        while stack:
            name = stack.pop()
            if not name or name in seen or name in self.inits:
                continue
            seen.add(name)
            node = self.producer.get(name)
            if node is not None and self._in_tail(node, name, selections):
                members.add(id(node))
                stack.extend(node.input[:1] if node.op_type == "HzCalibration" else node.input)
            else:
                leaves.append(name)
        return [n for n in self.model.graph.node if id(n) in members], leaves

    def reads_input(self, out: str) -> bool:
        """Whether ``out``'s tail reads the model input through weight-free ops (``known_model``)."""
        return any(n in self.exact for n in self.tail(out)[1])

    def known_model(self, out: str) -> ModelProto | None:
        """A model of ``out``'s tail that computes, from the model inputs, the part of ``out`` they decide
        alone: the tail's ``exact`` leaves computed from the inputs, its other leaves at zero. None where
        the tail reads no input, or cannot be built (a leaf of unknown shape)."""
        if not self.reads_input(out):
            return None
        nodes, leaves = self.tail(out)
        view = self._view = self._view or GraphView(self.model)
        zeros = [n for n in leaves if n not in self.exact]
        if not all(view.shapes.get(n) and is_static(view.shapes[n]) for n in zeros):
            return None
        members = {id(n) for n in nodes}
        stack = [n for n in leaves if n in self.exact]
        inputs: list[str] = []
        while stack:  # back from the exact leaves to the model inputs
            name = stack.pop()
            node = self.producer.get(name)
            if node is None:
                if name not in self.inits and name not in inputs:
                    inputs.append(name)
            elif id(node) not in members:
                members.add(id(node))
                stack.extend(i for i in node.input if i)
        steps = [helper.make_node("Identity", n.input[:1], n.output[:1], name=n.name)
                 if n.op_type == "HzCalibration" else n for n in self.model.graph.node if id(n) in members]
        used = {i for n in steps for i in n.input}
        zero = [helper.make_tensor(n, view.elem_types.get(n, TensorProto.FLOAT), view.shapes[n],
                                   np.zeros(view.shapes[n], helper.tensor_dtype_to_np_dtype(
                                       view.elem_types.get(n, TensorProto.FLOAT))).tobytes(), raw=True)
                for n in zeros]
        graph = helper.make_graph(
            steps, "known_part", [i for i in self.model.graph.input if i.name in inputs],
            [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
            [*(self.inits[i] for i in sorted(used) if i in self.inits), *zero])
        return helper.make_model(graph, opset_imports=self.model.opset_import, ir_version=self.model.ir_version)

    def adds_constant(self, nodes: list[NodeProto]) -> bool:
        """Whether an Add or Sub of ``nodes`` adds a constant to data."""
        return any(n.op_type in ("Add", "Sub") and any(i in self.constant for i in n.input)
                   and not all(i in self.constant for i in n.input) for n in nodes)

    def at_zero(self, out: str, selections: bool = False) -> dict[str, np.ndarray] | None:
        """Every tensor of ``out``'s tail (``out`` too) at zero data, flat float32; None where the tail
        adds no constant, or cannot be evaluated (an unknown shape, an op the reference lacks). With
        ``selections`` the tail goes on through them, and what follows one holds no constant part."""
        nodes, leaves = self.tail(out, selections)
        if not self.adds_constant(nodes):
            return None
        if self._view is None:
            self._view = GraphView(self.model)
        shapes, types = self._view.shapes, self._view.elem_types
        if not all(shapes.get(n) and is_static(shapes[n]) for n in leaves):
            return None
        steps = [helper.make_node("Identity", n.input[:1], n.output[:1], name=n.name)
                 if n.op_type == "HzCalibration" else n for n in nodes]
        made = [o for n in steps for o in n.output if o]
        used = {i for n in steps for i in n.input}
        graph = helper.make_graph(
            steps, "at_zero",
            [helper.make_tensor_value_info(n, types.get(n, TensorProto.FLOAT), shapes[n]) for n in leaves],
            [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in made],
            [self.inits[i] for i in sorted(used) if i in self.inits])
        probe = helper.make_model(graph, opset_imports=[o for o in self.model.opset_import if o.domain in _STANDARD])
        feeds = {n: np.zeros(shapes[n], helper.tensor_dtype_to_np_dtype(types.get(n, TensorProto.FLOAT)))
                 for n in leaves}
        from onnx.reference import ReferenceEvaluator

        try:
            values = ReferenceEvaluator(probe).run(None, feeds)
        except Exception as exc:  # an op the reference cannot run: no constant part known
            log.debug("no constant part found for %s: %s", out, exc)
            return None
        found = {}
        for name, value in zip(made, values, strict=True):
            value = np.asarray(value)
            if value.dtype.kind == "f":
                found[name] = value.astype(np.float32).reshape(-1)
        return found if out in found else None

    def constant_part(self, out: str) -> np.ndarray | None:
        """What ``out`` holds whatever the input, flat (None: nothing, or not known)."""
        values = self.at_zero(out)
        value = values[out] if values else None
        return value if value is not None and np.any(value) and np.all(np.isfinite(value)) else None

    def grids(self, outputs: list[str]) -> list[str]:
        """The tensors of the ``outputs``' tails (computed from data, not constants) whose constant part
        differs from element to element: a decoding around a grid of positions. On an int8 grid such a
        tensor spends its levels on the positions: an Ultralytics export's boxes at 320x320 on steps of
        2.5 pixels."""
        found: list[str] = []
        for out in outputs:
            # through the clips of boxes to the picture (Clip, Min with its size) to the decoding before them;
            # past a selection, values at zero data are no constant part, but these are upstream of it
            values = {**(self.at_zero(out, selections=True) or {}), **(self.at_zero(out) or {})}
            for name, value in values.items():
                if name not in self.constant and name not in found and value.size > 1 and \
                        np.all(np.isfinite(value)) and np.ptp(value) > 0:
                    found.append(name)
        # what selects among positions (a box's corner against the picture's size) holds positions too
        for node in self.model.graph.node:
            if node.domain in _STANDARD and node.op_type in SELECTIONS and node.output[0] not in found and \
                    any(i in found for i in node.input):
                found.append(node.output[0])
        return found
