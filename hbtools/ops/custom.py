"""Custom CPU operators: the one registry of user ops, how they are loaded, and their numerics.

A custom op is a node in a domain of its own (e.g. ``horizon.custom``) that the
user implements in Python: a ``compute`` in numpy and a shape function. The file
is written from the ``hb_custom_op create`` template and named in the config's
``custom_op`` group; ``load_op_files`` imports it, and its decorators fill the
registry below. Everything that executes a model asks this module: the parse
check (is the op known?), shape inference (``output_shapes``), the session
wrapper that runs onnxruntime around custom nodes and the ``.bin`` simulator
(``compute``). So the numerics of a custom op exist exactly once, in the user's file.

The vendor's ONNX convention is also understood: a ``PyOp`` node whose
``class_name`` attribute names the registered op.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import logging
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from onnx import ModelProto, NodeProto

from hbtools.errors import HbError
from hbtools.ops.base import DOMAIN, attrs_of

log = logging.getLogger("hbtools")

PYOP = "PyOp"
# Attributes of the vendor's PyOp nodes that describe the op instead of parametrising it.
DESCRIPTIVE_ATTRS = frozenset({"class_name", "module", "compute", "input_types", "output_types",
                               "output_shape", "shape_infer"})
# Domains whose ops onnxruntime or hbtools run themselves (standard, ML and contrib ops, Hz ops).
_BUILTIN_PREFIXES = ("ai.onnx", "com.microsoft")
REGISTER_HINT = ("write its Python implementation with 'hb_custom_op create' and list the file in the config's "
                 "custom_op group (custom_op_method: register, op_register_files: <file>.py, "
                 "custom_op_dir: <folder>)")

ShapeFunction = Callable[[list[list[int]]], Any]


@dataclass
class CustomOp:
    """One registered op: its implementation (a class with ``compute`` or a function) and shape function."""

    name: str
    impl: Any = None
    shape_fn: ShapeFunction | None = None
    source: str = ""  # the file that registered it
    _instances: dict[bytes, Any] = field(default_factory=dict, repr=False)


_REGISTRY: dict[str, CustomOp] = {}
_loading: list[str] = []  # the file being imported, so decorators can record where an op comes from


def _entry(name: str) -> CustomOp:
    if not isinstance(name, str) or not name:
        raise HbError(f"a custom op needs a non-empty name, got {name!r}")
    op = _REGISTRY.get(name)
    source = _loading[-1] if _loading else ""
    if op is None or (source and op.source != source):
        op = _REGISTRY[name] = CustomOp(name, source=source)
    return op


def op_implement_register(name: str) -> Callable[[Any], Any]:
    """Decorator: the class (with a ``compute`` method) or function computing op ``name``."""

    def register(impl: Any) -> Any:
        op = _entry(name)
        op.impl, op._instances = impl, {}
        return impl

    return register


def op_shape_infer_register(name: str) -> Callable[[ShapeFunction], ShapeFunction]:
    """Decorator: the function mapping op ``name``'s input shapes to its output shapes."""

    def register(fn: ShapeFunction) -> ShapeFunction:
        _entry(name).shape_fn = fn
        return fn

    return register


def register(name: str, compute: Any, shape_infer: ShapeFunction | None = None) -> None:
    """Register an op from code instead of a file (same meaning as the two decorators)."""
    op_implement_register(name)(compute)
    if shape_infer is not None:
        op_shape_infer_register(name)(shape_infer)


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def registered() -> dict[str, CustomOp]:
    return dict(_REGISTRY)


# ---- which nodes are custom ops ---------------------------------------------------------------

def is_foreign_domain(domain: str) -> bool:
    """A domain neither onnxruntime nor hbtools executes by itself: where custom ops live."""
    return bool(domain) and domain != DOMAIN and not domain.startswith(_BUILTIN_PREFIXES)


def op_name(node: NodeProto) -> str:
    """The registry key of a node: its op type, or the ``class_name`` of a vendor PyOp node."""
    if node.op_type == PYOP:
        for a in node.attribute:
            if a.name == "class_name" and a.s:
                return a.s.decode(errors="replace")
    return node.op_type


def custom_op_of(node: NodeProto) -> CustomOp | None:
    if not is_foreign_domain(node.domain):
        return None
    op = _REGISTRY.get(op_name(node))
    return op if op is not None and op.impl is not None else None


def has_custom_nodes(model: ModelProto) -> bool:
    return any(custom_op_of(n) is not None for n in model.graph.node)


def unregistered_nodes(model: ModelProto) -> list[NodeProto]:
    """Nodes of foreign domains with no registered implementation (model-local functions excluded)."""
    local = {(f.domain, f.name) for f in model.functions}
    return [n for n in model.graph.node if is_foreign_domain(n.domain) and (n.domain, n.op_type) not in local
            and custom_op_of(n) is None]


def unregistered_message(node: NodeProto) -> str:
    return (f"node '{node.name or '?'}' is custom op {op_name(node)} (domain '{node.domain}') with no registered "
            f"implementation; {REGISTER_HINT}")


# ---- numerics -----------------------------------------------------------------------------------

def _params(node: NodeProto) -> dict[str, Any]:
    return {k: v for k, v in attrs_of(node).items() if k not in DESCRIPTIVE_ATTRS}


def _instance(op: CustomOp, node: NodeProto) -> Any:
    """The op object for this node's attributes (built once per distinct attribute set)."""
    key = b"".join(a.SerializeToString() for a in node.attribute)
    if key not in op._instances:
        params = _params(node)
        try:
            op._instances[key] = op.impl(**params)
        except (Exception, SystemExit) as exc:
            raise HbError(f"custom op {op.name} (node '{node.name}'): cannot create {op.impl.__name__} from the "
                          f"node's attributes {sorted(params)}: {type(exc).__name__}: {exc}",
                          hint=f"make __init__ take these attribute names as arguments ({op.source})") from None
    return op._instances[key]


def compute(node: NodeProto, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """Run the registered implementation of ``node``; outputs are float32 arrays, one per node output."""
    op = custom_op_of(node)
    if op is None:
        raise HbError(unregistered_message(node))
    try:
        if inspect.isclass(op.impl):
            result = _instance(op, node).compute(*inputs)
        else:
            result = op.impl(*inputs, **_params(node))
    except HbError:
        raise
    except (Exception, SystemExit) as exc:
        raise HbError(f"custom op {op.name} (node '{node.name}') failed in compute: {type(exc).__name__}: {exc}",
                      hint=f"fix the compute function in {op.source or 'its registration'}") from None
    outputs = list(result) if isinstance(result, list | tuple) else [result]
    wanted = [o for o in node.output]
    if len(outputs) != len(wanted):
        raise HbError(f"custom op {op.name} (node '{node.name}') returned {len(outputs)} output(s) but the node has "
                      f"{len(wanted)}", hint=f"return one array per output from compute ({op.source})")
    return [np.ascontiguousarray(np.asarray(o, dtype=np.float32)) for o in outputs]


def output_shapes(node: NodeProto, input_shapes: Sequence[Sequence[int | None] | None]) -> list[list[int]] | None:
    """Output shapes from the registered shape function (default: each output shaped like input 0).

    None when an input shape is not fully known (onnx inference may know it later).
    """
    op = custom_op_of(node)
    if op is None or not input_shapes:
        return None
    if any(s is None or any(d is None for d in s) for s in input_shapes):
        return None
    shapes = [[int(d) for d in s] for s in input_shapes]
    if op.shape_fn is None:
        return [list(shapes[0]) for _ in node.output]
    try:
        result = op.shape_fn(shapes)
    except (Exception, SystemExit) as exc:
        raise HbError(f"custom op {op.name} (node '{node.name}') failed in its shape function: "
                      f"{type(exc).__name__}: {exc}", hint=f"fix the shape function in {op.source}") from None
    result = list(result) if isinstance(result, list | tuple) else [result]
    if result and all(isinstance(d, int | np.integer) for d in result):
        result = [result]  # a single shape for a single-output op
    if len(result) != len(node.output) or not all(isinstance(s, list | tuple) for s in result):
        raise HbError(f"custom op {op.name}: the shape function must return a list with one shape per output "
                      f"({len(node.output)}), got {result!r}", hint=f"fix the shape function in {op.source}")
    return [[int(d) for d in s] for s in result]


# ---- loading ------------------------------------------------------------------------------------

def _module_name(path: Path) -> str:
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    stem = "".join(c if c.isalnum() else "_" for c in path.stem)
    return f"hbtools_custom_op_{stem}_{digest}"


def load_op_files(paths: Iterable[str | Path]) -> list[str]:
    """Import each custom-op file (running its registrations); returns the op names they registered."""
    names: list[str] = []
    for given in paths:
        path = Path(given).expanduser().resolve()
        if not path.is_file():
            raise HbError(f"custom op file '{path}' does not exist",
                          hint="check op_register_files and custom_op_dir in the custom_op group")
        before = {k: (v.impl, v.shape_fn) for k, v in _REGISTRY.items()}
        module = _module_name(path)
        spec = importlib.util.spec_from_file_location(module, path)
        if spec is None or spec.loader is None:
            raise HbError(f"custom op file '{path}' cannot be imported as Python", hint="give a .py file")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[module] = mod
        # Helper modules next to the op file import as they would from that folder.
        sys.path.insert(0, str(path.parent))
        _loading.append(str(path))
        try:
            spec.loader.exec_module(mod)
        except SystemExit as exc:  # sys.exit in an op file must not end the tool silently
            sys.modules.pop(module, None)
            raise HbError(f"custom op file '{path}' called sys.exit({exc.code!r}) while loading; an op file may "
                          f"only define and register ops: remove the exit") from None
        except Exception as exc:
            sys.modules.pop(module, None)
            raise HbError(f"custom op file '{path}' failed to load: {type(exc).__name__}: {exc}") from None
        finally:
            _loading.pop()
            sys.path.remove(str(path.parent))
        mine = [k for k, v in _REGISTRY.items() if v.source == str(path) and before.get(k) != (v.impl, v.shape_fn)]
        missing = [k for k in mine if _REGISTRY[k].impl is None]
        if missing:
            raise HbError(f"custom op file '{path}' registers a shape function but no compute for "
                          f"{', '.join(missing)}", hint="decorate the op class with @op_implement_register(name)")
        if not mine:
            raise HbError(f"custom op file '{path}' registers no custom op",
                          hint="decorate the op class with @op_implement_register('<OpType>')")
        for name in mine:
            log.info("custom op %s registered from %s", name, path)
        names.extend(mine)
    return names


def register_from_config(files: Sequence[str | Path]) -> list[str]:
    """makertbin: load the config's ``op_register_files`` (already resolved by the config loader)."""
    return load_op_files(files) if files else []


def recorded_files(custom_op_group: Mapping[str, Any]) -> list[Path]:
    """The op files a conversion recorded in its config snapshot (``.bin`` models)."""
    files = custom_op_group.get("op_register_files") or []
    folder = custom_op_group.get("custom_op_dir")
    out = []
    for f in files if isinstance(files, list) else []:
        if isinstance(f, str) and f:
            p = Path(f)
            out.append(p if p.is_absolute() or not folder else Path(str(folder)) / p)
    return out


def ensure_registered(model: ModelProto, custom_op_group: Mapping[str, Any] | None = None) -> None:
    """Make sure every custom node of ``model`` can run: load the recorded files if needed, else fail clearly."""
    if not unregistered_nodes(model):
        return
    files = [p for p in recorded_files(custom_op_group or {}) if p.is_file()]
    if files:
        load_op_files(files)
    missing = unregistered_nodes(model)
    if missing:
        raise HbError(unregistered_message(missing[0]),
                      hint="in Python, call hbtools.ops.custom.load_op_files(['<file>.py']) before running the model")
