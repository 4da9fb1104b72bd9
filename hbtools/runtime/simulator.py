"""x86 simulator of a ``.bin`` model (SPEC §8).

Executes the model from ``input_type_rt`` data without the ONNX lowering that
HB_ONNXRuntime uses: every Hz op runs its numpy ``reference`` (exact integer
arithmetic), and runs of standard ONNX nodes (data movement on integers, float
CPU ops) run in onnxruntime sessions built once, when the simulator is created.

The schedule is a topological order that keeps standard nodes of the same kind
(BPU or CPU) together, so a whole float CPU region (a LayerNorm, say) is one
session and onnxruntime optimises it as it would inside the full model.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import onnxruntime as ort
from onnx import ModelProto, NodeProto, helper, numpy_helper

from hbtools.errors import HbError
from hbtools.graph.graph import references
from hbtools.ops import custom, quantized, registry
from hbtools.ops.base import DOMAIN
from hbtools.runtime.binfile import BinFormatError
from hbtools.runtime.blas import one_blas_thread
from hbtools.runtime.rt_input import to_model_input
from hbtools.runtime.runtime_model import RuntimeModel, numpy_dtype
from hbtools.runtime.session import make_session
from hbtools.runtime.structure import Structure, analyse, tensor_info


@dataclass
class Step:
    """One unit of execution: a single Hz node, or a run of standard nodes in one session."""

    nodes: list[NodeProto]
    label: str  # profile name: BPU_<subgraph> or the CPU node(s)
    inputs: list[str]
    outputs: list[str]
    op: type | None = None  # Hz op class for a Hz step
    session: ort.InferenceSession | None = None


@dataclass
class Simulator:
    model: RuntimeModel
    expose_all: bool = False  # keep every intermediate tensor (hb_verifier -r)
    threads: int = 1
    steps: list[Step] = field(init=False)
    structure: Structure = field(init=False)

    def __post_init__(self) -> None:
        graph = self.model.graph
        # Custom CPU ops run their Python implementation: the files the conversion recorded.
        custom.ensure_registered(graph, self.model.config_group("custom_op"))
        info = tensor_info(graph)
        self.structure = analyse(graph, self.model.bin.partition, info)
        self._constants = _constants(graph)
        # a step never spans two subgraphs: its time is booked to one (hrt_model_exec's profile)
        places = [f"{on}:{self.structure.subgraph_of.get(i)}" for i, on in enumerate(self.structure.on)]
        order = _schedule(graph, places, set(self._constants))
        self.steps = self._build_steps(order, info)

    def __del__(self) -> None:
        # The references' decoded tables hold the nodes, and through them the whole model.
        quantized.forget(self.model.graph.graph.node)

    # ---- construction ---------------------------------------------------------------------
    def _label(self, index: int, node: NodeProto) -> str:
        k = self.structure.subgraph_of.get(index)
        return node.name if k is None else "BPU_" + self.structure.subgraph_name(self.model.name, k)

    def _build_steps(self, order: list[list[int]], info: dict) -> list[Step]:
        nodes = list(self.model.graph.graph.node)
        needed_later = _consumers_after(order, nodes, [o.name for o in self.model.graph.graph.output])
        steps = []
        for k, group in enumerate(order):
            members = [nodes[i] for i in group]
            produced = [o for n in members for o in n.output if o]
            inside = set(produced)
            inputs = list(dict.fromkeys(i for n in members for i in references(n)  # If branches read outer tensors
                                        if i and i not in inside and i not in self._constants))
            outputs = produced if self.expose_all else [o for o in produced if o in needed_later[k]]
            labels = list(dict.fromkeys(self._label(i, nodes[i]) for i in group))
            step = Step(members, " + ".join(labels), inputs, outputs)
            if members[0].domain == DOMAIN:
                try:
                    step.op = registry.get(members[0].op_type)
                except KeyError:
                    raise BinFormatError(f"node '{members[0].name}' has unknown op type "
                                         f"{members[0].op_type!r}") from None
            else:
                step.session = self._session(members, inputs, outputs, info)
            steps.append(step)
        return steps

    def _session(self, members: list[NodeProto], inputs: list[str], outputs: list[str],
                 info: dict) -> ort.InferenceSession:
        src = self.model.graph
        missing = [t for t in inputs if t not in info]
        if missing:
            raise BinFormatError(f"type of tensor '{missing[0]}' (input of node '{members[0].name}') is unknown")
        used = {i for n in members for i in references(n)}
        graph = helper.make_graph(
            members, "segment",
            [helper.make_tensor_value_info(t, info[t].elem_type, None) for t in inputs],
            [helper.make_tensor_value_info(t, info[t].elem_type, None) if t in info
             else helper.make_empty_tensor_value_info(t) for t in outputs],
            [t for t in src.graph.initializer if t.name in used],
        )
        opsets = [o for o in src.opset_import if o.domain != DOMAIN]
        model = helper.make_model(graph, opset_imports=opsets)
        model.ir_version = src.ir_version
        try:
            return make_session(model, threads=self.threads)
        except Exception as e:  # onnxruntime's exception types are not importable
            raise BinFormatError(f"node '{members[0].name}' ({members[0].op_type}) cannot be run: "
                                 f"{_first_line(e)}") from None

    # ---- running --------------------------------------------------------------------------
    def prepare(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Runtime data of every input -> the model input tensors."""
        names = [d.name for d in self.model.inputs]
        unknown = sorted(set(feeds) - set(names))
        missing = [n for n in names if n not in feeds]
        if unknown or missing:
            raise HbError(f"model '{self.model.name}' takes inputs {names}; "
                          f"missing {missing}, unknown {unknown}")
        return {d.name: to_model_input(d, feeds[d.name]) for d in self.model.inputs}

    def run(self, feeds: Mapping[str, np.ndarray], *, timings: dict[str, list[float]] | None = None,
            prepared: bool = False) -> dict[str, np.ndarray]:
        """Outputs by name, in model output order, from ``input_type_rt`` data (or model tensors)."""
        tensors = self.run_all(feeds, timings=timings, prepared=prepared)
        return {o.name: tensors[o.name] for o in self.model.outputs}

    def run_all(self, feeds: Mapping[str, np.ndarray], *, timings: dict[str, list[float]] | None = None,
                prepared: bool = False) -> dict[str, np.ndarray]:
        """Every tensor the run kept (all of them with ``expose_all``)."""
        # The integer references' matrix products are many and mid-sized: OpenBLAS's threads, which
        # wait for each other by spinning, made them 3x slower beside any busy process (PP-OCR rec).
        with one_blas_thread():
            return self._run_all(feeds, timings, prepared)

    def _run_all(self, feeds: Mapping[str, np.ndarray], timings: dict[str, list[float]] | None,
                 prepared: bool) -> dict[str, np.ndarray]:
        start = time.perf_counter()
        env: dict[str, np.ndarray] = dict(feeds) if prepared else self.prepare(feeds)
        for d in self.model.inputs:
            if d.name not in env:
                raise HbError(f"model '{self.model.name}': no data for input '{d.name}'")
            if env[d.name].dtype != d.dtype or tuple(env[d.name].shape) != d.shape:
                raise HbError(f"input '{d.name}' must be {d.dtype} {list(d.shape)}, "
                              f"got {env[d.name].dtype} {list(env[d.name].shape)}")
        _record(timings, "Preprocess", start)
        if self.model.batch == 1:
            return self._run_item(env, timings)
        # A batch-N .bin holds a batch-1 graph: run it per item and join the items along axis 0.
        parts = {k: np.split(v, self.model.batch) for k, v in env.items()}
        items = [self._run_item({k: p[i] for k, p in parts.items()}, timings) for i in range(self.model.batch)]
        return {name: np.concatenate([item[name].reshape(1) if item[name].ndim == 0 else item[name]
                                      for item in items]) for name in items[0]}

    def _run_item(self, env: dict[str, np.ndarray], timings: dict[str, list[float]] | None) -> dict[str, np.ndarray]:
        for step in self.steps:
            start = time.perf_counter()
            env.update(self._execute(step, env))
            _record(timings, step.label, start)
        for o in self.model.outputs:  # an output that is a constant (a length the input shape fixes)
            if o.name not in env and o.name in self._constants:
                env[o.name] = self._constants[o.name]
        return env

    def _execute(self, step: Step, env: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        node = step.nodes[0]
        try:
            if step.op is not None:
                args = [self._value(t, env) if t else None for t in node.input]
                return dict(zip(node.output, step.op.reference(node, args), strict=True))
            results = step.session.run(step.outputs, {t: env[t] for t in step.inputs})
            return dict(zip(step.outputs, results, strict=True))
        except HbError:
            raise
        except Exception as e:  # corrupted attributes or shapes surface here, as any exception type
            raise HbError(f"model '{self.model.name}': node '{node.name}' ({node.op_type}) failed: "
                          f"{_first_line(e)}") from None

    def _value(self, name: str, env: dict[str, np.ndarray]) -> np.ndarray:
        return env[name] if name in env else self._constants[name]


def _record(timings: dict[str, list[float]] | None, label: str, start: float) -> None:
    if timings is not None:
        timings.setdefault(label, []).append((time.perf_counter() - start) * 1000.0)


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[-1] if text else ''}"


def _constants(graph: ModelProto) -> dict[str, np.ndarray]:
    out = {}
    for t in graph.graph.initializer:
        try:
            out[t.name] = numpy_helper.to_array(t)
        except Exception as e:  # malformed tensor data
            raise BinFormatError(f"initializer '{t.name}' is unreadable: {_first_line(e)}") from None
        numpy_dtype(t.data_type)
    return out


def _schedule(graph: ModelProto, places: list[str], constants: set[str]) -> list[list[int]]:
    """Topological order grouped into steps: each Hz node alone, standard nodes in runs of the same place (a
    BPU subgraph, the CPU)."""
    nodes = list(graph.graph.node)
    producer: dict[str, int] = {}
    for i, n in enumerate(nodes):
        for o in n.output:
            if o:
                if o in producer:
                    raise BinFormatError(f"tensor '{o}' is produced by two nodes")
                producer[o] = i
    graph_inputs = {vi.name for vi in graph.graph.input}
    deps: list[set[int]] = []
    users: list[list[int]] = [[] for _ in nodes]
    for i, n in enumerate(nodes):
        d = set()
        for t in references(n):  # with what If/Loop branches read from the main graph
            if not t or t in constants or t in graph_inputs:
                continue
            if t not in producer:
                raise BinFormatError(f"node '{n.name}' reads tensor '{t}' that nothing produces")
            d.add(producer[t])
        deps.append(d)
        for j in d:
            users[j].append(i)
    pending = [len(d) for d in deps]
    ready = sorted(i for i, c in enumerate(pending) if c == 0)
    groups: list[list[int]] = []
    kind = None
    while ready:
        pick = next((i for i in ready if _kind(nodes[i], places[i]) == kind and kind is not None), ready[0])
        ready.remove(pick)
        this = _kind(nodes[pick], places[pick])
        if this is not None and this == kind:
            groups[-1].append(pick)
        else:
            groups.append([pick])
        kind = this
        for u in users[pick]:
            pending[u] -= 1
            if pending[u] == 0:
                ready.append(u)
        ready.sort()
    if sum(len(g) for g in groups) != len(nodes):
        raise BinFormatError("the graph has a cycle")
    return groups


def _kind(node: NodeProto, place: str) -> str | None:
    """Standard nodes group by where they run; Hz nodes never group (None)."""
    return None if node.domain == DOMAIN else place


def _consumers_after(order: list[list[int]], nodes: list[NodeProto], outputs: list[str]) -> list[set[str]]:
    """For each step, the tensors some later step (or the model output) reads."""
    later: set[str] = set(outputs)
    result: list[set[str]] = [set() for _ in order]
    for k in range(len(order) - 1, -1, -1):
        result[k] = set(later)
        for i in order[k]:
            later.update(t for t in references(nodes[i]) if t)
    return result
