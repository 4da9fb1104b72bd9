"""Fuzzing the tools' entry points with mutated .bin files: only the tools' own one-line errors may come out.

Three kinds of mutation of a real (small) .bin: raw bytes (optionally resealed so
the checksums pass and the structural checks are reached), the JSON directory
(descriptors, config, partition ... with checksums intact), and the ONNX graph
(nodes, attributes, shapes, types). Every file goes through the command lines of
hb_model_info, hb_model_modifier and hrt_model_exec model_info, and through the
logic behind hb_perf, the simulator and hb_model_modifier's deletion. A command
may fail only with ``ERROR`` lines (no "internal error"), the logic only with
``HbError``. 2000 files in all; hypothesis is derandomized so CI is repeatable.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator

import numpy as np
import onnx
import pytest
from bin_fixtures import build_bin, invoke, mutate_bytes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper

from hbtools.cli import hb_model_info, hb_model_modifier, hb_perf, hb_verifier, hrt_model_exec
from hbtools.errors import HbError
from hbtools.march.profiles import get_profile
from hbtools.runtime import binfile as bf
from hbtools.runtime.binfile import read_bin
from hbtools.runtime.rt_input import random_rt_input
from hbtools.runtime.runtime_model import load
from hbtools.runtime.simulator import Simulator
from hbtools.tools import modifier, perf_model

FILES = {"bytes": 800, "directory": 600, "graph": 600}  # 2000 mutated files


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz_tools")
    built = build_bin(root / "model", "resnet_like", prefix="fz", input_parameters={"input_type_rt": "nv12"})
    # with one deleted node, so the deleted-node records are fuzzed too
    last = modifier.candidates(read_bin(built.bin).model().load_graph())[-1].name
    model = modifier.delete(read_bin(built.bin).model(), last)
    mp = pytest.MonkeyPatch()
    mp.chdir(root)  # the tools write their logs into the current folder
    yield root, model, _file([model])
    mp.undo()


@pytest.fixture(scope="module")
def quantized_onnx(base):
    return next(base[0].glob("model/model_output/*_quantized_model.onnx"))


def _file(models: list[bf.BinModel]) -> bytes:
    return b"".join(bf._serialize(models, len(models) > 1))


def _reseal(data: bytes) -> bytes:
    """Recompute the checksums and size so a mutation gets past the integrity checks."""
    b = bytearray(data)
    if len(b) < bf.HEADER.size:
        return bytes(b)
    h = list(bf.HEADER.unpack_from(b))
    for i in range(min(h[4], 64)):
        pos = h[6] + i * bf.ENTRY.size
        if pos < bf.HEADER.size or pos + bf.ENTRY.size > len(b):
            break
        e = list(bf.ENTRY.unpack_from(b, pos))
        e[5] = zlib.crc32(b[e[3]: e[3] + e[4]])
        bf.ENTRY.pack_into(b, pos, *e)
    h[7], h[5] = len(b), zlib.crc32(b[bf.HEADER.size:])
    b[: bf.HEADER.size] = bf._seal_header(bf.HEADER.pack(*h))
    return bytes(b)


def check_entry_points(folder, data: bytes) -> None:
    path = folder / "fuzz.bin"
    path.write_bytes(data)
    for command, args in ((hb_model_info.main, [path]), (hb_model_modifier.main, [path]),
                          (hrt_model_exec.main, ["model_info", "--model_file", path])):
        result = invoke(command, args)
        assert result.exit_code in (0, 1), result.output
        assert "internal error" not in result.output and "Traceback" not in result.output, result.output
    try:
        model = load(read_bin(path).model(None), str(path))
        perf_model.estimate(model, get_profile("bayes-e"))
        sim = Simulator(model)
        rng = np.random.default_rng(0)
        sim.run({d.name: random_rt_input(d, rng) for d in model.inputs})
        graph = model.bin.load_graph()
        for cand in modifier.candidates(graph)[:1]:
            modifier.delete(model.bin, cand.name)
    except HbError as e:
        assert all("\n" not in line for line in e.lines()), str(e)


# ---------------------------------------------------------------- raw bytes

_BYTE_OP = st.tuples(st.sampled_from(["flip", "set", "cut", "insert", "delete"]), st.integers(0, 10**6),
                     st.integers(1, 255))




@settings(max_examples=FILES["bytes"], deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(ops=st.lists(_BYTE_OP, min_size=1, max_size=4), reseal=st.booleans())
def test_fuzz_bytes(base, ops, reseal) -> None:
    folder, _, original = base
    data = mutate_bytes(original, ops)
    check_entry_points(folder, _reseal(data) if reseal else data)


# ---------------------------------------------------------------- JSON directory

_WORDS = st.sampled_from(["nv12", "gray", "rgb", "featuremap", "yuv444", "NHWC", "NCHW", "data", "int8",
                          "float32", "bayes-e", "nash-m", "x", "", "pyramid", "name", "type", "attributes",
                          "side", "scale", "layout", "shape", "dtype", "input_type_rt", "nodes", "subgraphs",
                          "cpu_nodes", "debug", "core_num", "march", "input_name", "Dequantize"])
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 40) | st.floats(allow_nan=False, allow_infinity=False) | _WORDS,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(_WORDS, kids, max_size=3),
    max_leaves=6,
)
_DELETE = object()  # an edit that removes the key instead of setting it
_FIELDS = ["name", "deps", "config", "inputs", "outputs", "partition", "deleted_nodes", "perf", "meta"]


def _paths(value: object, prefix: tuple = ()) -> Iterator[tuple]:
    """Every path into a JSON value, the value itself first."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*prefix, i))


def _set(doc: dict, path: tuple, value: object) -> None:
    target = doc
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE and isinstance(target, dict):
        target.pop(path[-1], None)
    elif value is not _DELETE:
        target[path[-1]] = value



@settings(max_examples=FILES["directory"], deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(edits=st.lists(st.tuples(st.sampled_from(_FIELDS), st.integers(0, 10**4), _JSON | st.just(_DELETE)),
                      min_size=1, max_size=3))
def test_fuzz_directory(base, edits) -> None:
    folder, model, _ = base
    fields = {k: json.loads(json.dumps(getattr(model, k))) for k in _FIELDS}
    for field, pick, value in edits:
        paths = list(_paths(fields[field])) if field in fields else [()]
        path = (field, *paths[pick % len(paths)])
        _set(fields, path, value)
    entry = {**fields, "graph": 1, "extra_sections": {}}
    text = json.dumps({"models": [entry]}, allow_nan=False).encode()
    data = b"".join(bf._pack([(bf.KIND_DIRECTORY, bf.NO_MODEL, text), (bf.KIND_GRAPH, 0, bytes(model.graph))], 0))
    check_entry_points(folder, data)


# ---------------------------------------------------------------- ONNX graph

_OPS = ["HzSQuantizedConv", "HzLut", "HzQuantize", "HzDequantize", "HzSQuantizedEltwise", "HzSQuantizedPool",
        "HzRequantize", "HzSQuantizedConcat", "HzNope", "Relu", "Softmax", "Reshape", "Transpose", "Cast", "Conv"]
_EDIT = st.one_of(
    st.tuples(st.just("drop_node"), st.integers(0, 999)),
    st.tuples(st.just("rewire"), st.integers(0, 999), st.integers(0, 3), st.integers(0, 999)),
    st.tuples(st.just("op_type"), st.integers(0, 999), st.sampled_from(_OPS)),
    st.tuples(st.just("domain"), st.integers(0, 999), st.sampled_from(["", "horizon", "ai.other"])),
    st.tuples(st.just("attr"), st.integers(0, 999), st.integers(0, 99),
              st.integers(-3, 8) | st.floats(-4, 4, allow_nan=False) | st.lists(st.integers(-2, 6), max_size=5)
              | st.sampled_from(["int8", "int16", "int32", "Conv", "MatMul", "add", "bogus"])),
    st.tuples(st.just("dim"), st.booleans(), st.integers(0, 9), st.integers(-1, 40)),
    st.tuples(st.just("elem_type"), st.booleans(), st.integers(0, 16)),
    st.tuples(st.just("drop_init"), st.integers(0, 999)),
    st.tuples(st.just("init_dims"), st.integers(0, 999), st.lists(st.integers(0, 9), max_size=4)),
)


def _edit_graph(g: onnx.GraphProto, edit: tuple) -> None:
    kind, *args = edit
    nodes = g.node
    tensors = [t for n in nodes for t in n.output] + [i.name for i in g.input] + ["", "ghost"]
    if kind == "drop_init" and len(g.initializer):
        del g.initializer[args[0] % len(g.initializer)]
    elif kind == "init_dims" and len(g.initializer):
        t = g.initializer[args[0] % len(g.initializer)]
        del t.dims[:]
        t.dims.extend(args[1])
    elif kind in ("dim", "elem_type"):
        vi = g.input[0] if args[0] else g.output[0]
        if kind == "elem_type":
            vi.type.tensor_type.elem_type = args[1]
        elif len(vi.type.tensor_type.shape.dim):
            dims = vi.type.tensor_type.shape.dim
            dims[args[1] % len(dims)].dim_value = args[2]
    elif not len(nodes):
        return
    elif kind == "drop_node":
        del nodes[args[0] % len(nodes)]
    elif kind == "rewire":
        node = nodes[args[0] % len(nodes)]
        if len(node.input):
            node.input[args[1] % len(node.input)] = tensors[args[2] % len(tensors)]
    elif kind == "op_type":
        nodes[args[0] % len(nodes)].op_type = args[1]
    elif kind == "domain":
        nodes[args[0] % len(nodes)].domain = args[1]
    elif kind == "attr":
        node = nodes[args[0] % len(nodes)]
        if len(node.attribute) and args[2] != []:
            old = node.attribute[args[1] % len(node.attribute)]
            node.attribute.remove(old)
            node.attribute.append(helper.make_attribute(old.name, args[2]))


@settings(max_examples=FILES["graph"], deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(edits=st.lists(_EDIT, min_size=1, max_size=3))
def test_fuzz_graph(base, edits) -> None:
    folder, model, _ = base
    graph = model.load_graph()
    for edit in edits:
        _edit_graph(graph.graph, edit)
    mutated = bf.BinModel(**{**model.__dict__, "graph": graph.SerializeToString()})
    check_entry_points(folder, _file([mutated]))


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(edits=st.lists(_EDIT, min_size=1, max_size=2))
def test_fuzz_graph_through_hb_perf_and_hb_verifier(base, quantized_onnx, edits) -> None:
    """The slower tools (picture drawing, two runs) on fewer files (not counted in the 2000)."""
    folder, model, _ = base
    graph = model.load_graph()
    for edit in edits:
        _edit_graph(graph.graph, edit)
    path = folder / "fuzz_slow.bin"
    path.write_bytes(_file([bf.BinModel(**{**model.__dict__, "graph": graph.SerializeToString()})]))
    for command, args in ((hb_perf.main, [path]), (hb_verifier.main, ["-m", f"{quantized_onnx},{path}"])):
        result = invoke(command, args)
        assert result.exit_code in (0, 1), result.output
        assert "internal error" not in result.output and "Traceback" not in result.output, result.output
