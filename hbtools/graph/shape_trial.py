"""The user's input shapes tried on the source model before any work: a shape the model cannot take
stops the parse stage with the inputs it concerns, and a model onnxruntime loads only while its
input sizes stay open is told so."""

from __future__ import annotations

import copy
import re
from typing import NoReturn

import numpy as np
import onnx
from onnx import ModelProto, helper

from hbtools.config.model import InputSpec
from hbtools.errors import HbError, last_line


def dry_run(model: ModelProto, inputs: list[InputSpec], declared: dict[str, list[int | None]]) -> None:
    """Run the model once on zeros, so an input_shape it cannot take stops here with its name (and the inputs
    whose fixed sizes in the model it changed, ``declared``)."""
    from hbtools.runtime.session import make_session

    inits = {t.name for t in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name not in inits:
            dtype = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
            feeds[vi.name] = np.zeros([d.dim_value for d in vi.type.tensor_type.shape.dim], dtype=dtype)
    shapes = ", ".join(f"{s.name} {'x'.join(map(str, s.shape)) or 'scalar'}" for s in inputs)
    try:
        session = make_session(model)
    except HbError:
        raise
    except Exception as e:  # onnxruntime's exception types are not importable
        # where input_shape changed a size the model fixes, that is the first thing to undo
        if not _changed_fixed_sizes(inputs, declared) and _loads_with_declared_shapes(model, declared):
            refusing = _plain_node_refusing(e, model)
            if refusing is not None:
                _shapes_do_not_fit(e, refusing, inputs, shapes)
            raise HbError(f"onnxruntime takes the model only while the input sizes it leaves open stay open; with "
                          f"them fixed ({shapes}), as conversion needs, it refuses it: {last_line(e)}",
                          hint="the model changes its own structure with its input sizes (e.g. an If that "
                               "squeezes a dimension only when it is 1, from a scripted export); export it with "
                               "fixed input sizes (a traced export without dynamic axes) and convert that") from None
        _cannot_run(e, inputs, declared, shapes)
    try:
        session.run(None, feeds)
    except HbError:
        raise
    except Exception as e:
        _cannot_run(e, inputs, declared, shapes)


# onnxruntime's load errors name the node whose shape inference failed: "Node (diff) Op (Sub) [ShapeInferenceError] ..."
_FAILING_NODE = re.compile(r"Node \(([^)]*)\) Op \(([^)]*)\)")
# Only a node holding graphs runs another structure than its inference with fixed sizes assumed (the branch an If
# takes at run time); any other node's inference failing means the given shapes meet there in a way it refuses.
_CONTROL_FLOW = ("If", "Loop", "Scan")


def _plain_node_refusing(error: Exception, model: ModelProto) -> onnx.NodeProto | None:
    """The node outside any control flow whose shape inference refused the input shapes given, named by
    onnxruntime's ``error``; None where the error names no such node."""
    found = _FAILING_NODE.search(str(error))
    if found is None or found.group(2) in _CONTROL_FLOW:
        return None
    name, op_type = found.groups()
    candidates = [n for n in model.graph.node if n.op_type == op_type and (n.name == name or not name)]
    return candidates[0] if len(candidates) == 1 else None


def _shapes_do_not_fit(error: Exception, node: onnx.NodeProto, inputs: list[InputSpec], shapes: str) -> NoReturn:
    """The given input shapes meet at ``node`` in sizes it cannot take: the shapes are what to change, not the
    export (the model itself runs with its open sizes)."""
    where = f"node '{node.name}' ({node.op_type})" if node.name else f"the {node.op_type} node"
    if len(inputs) > 1:
        raise HbError(f"the input shapes given do not fit together ({shapes}) at {where}: {last_line(error)}",
                      hint="give input shapes the model can take: their sizes must agree where they meet at that "
                           "node") from None
    raise HbError(f"the input shape given ({shapes}) does not fit {where}: {last_line(error)}",
                  hint="check input_shape (it is in the model's own layout and must fit its layers)") from None


def _changed_fixed_sizes(inputs: list[InputSpec], declared: dict[str, list[int | None]]) -> list[str]:
    """The inputs whose sizes the model fixes and input_shape changes, as "'name' is 1x2" (the model's)."""
    return [f"'{s.name}' is {'x'.join('?' if d is None else str(d) for d in declared[s.name])}"
            for s in inputs if s.name in declared and s.shape is not None and (
                len(declared[s.name]) != len(s.shape) or any(
                    d is not None and d != g for d, g in zip(declared[s.name], s.shape, strict=False)))]


def _cannot_run(error: Exception, inputs: list[InputSpec], declared: dict[str, list[int | None]],
                shapes: str) -> NoReturn:
    changed = _changed_fixed_sizes(inputs, declared)
    hint = "check input_shape (it is in the model's own layout and must fit its layers)"
    if changed:
        hint = (f"input_shape changes sizes the model fixes ({'; '.join(changed)} in the model): give those "
                f"shapes, and check that input_name lists the inputs in the order of the other input "
                f"parameters")
    raise HbError(f"the model cannot run with the input shapes {shapes}: {last_line(error)}", hint=hint) from None


def _loads_with_declared_shapes(model: ModelProto, declared: dict[str, list[int | None]]) -> bool:
    """Whether onnxruntime takes ``model`` once its inputs have the sizes the source model declared (open
    sizes named again), its inferred shapes forgotten."""
    from hbtools.runtime.session import make_session

    loose = copy.deepcopy(model)
    _forget_inferred(loose.graph)
    for vi in loose.graph.input:
        dims = declared.get(vi.name)
        if dims is None or len(dims) != len(vi.type.tensor_type.shape.dim):
            continue
        for k, (d, size) in enumerate(zip(vi.type.tensor_type.shape.dim, dims, strict=True)):
            d.Clear()
            if size is None:
                d.dim_param = f"{vi.name}_dim{k}"
            else:
                d.dim_value = size
    for out in loose.graph.output:
        for d in out.type.tensor_type.shape.dim:
            d.Clear()
    try:
        make_session(loose)
    except Exception:  # noqa: BLE001 - any failure: the fixed shapes are not the only problem
        return False
    return True


def _forget_inferred(graph: onnx.GraphProto) -> None:
    del graph.value_info[:]
    for node in graph.node:
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                _forget_inferred(sub)
