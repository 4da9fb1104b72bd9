"""The .bin container: round trips, every corruption category, fuzzing, atomic writes."""

from __future__ import annotations

import json
import os
import struct
import zlib

import pytest
from bin_fixtures import mutate_bytes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from hbtools.errors import EXIT_SYSTEM, HbError, ResourceError
from hbtools.runtime import binfile as bf
from hbtools.runtime.binfile import BinFile, BinFormatError, BinModel, read_bin, write_bin


def _graph(op: str = "Relu") -> bytes:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 4, 4])
    g = helper.make_graph([helper.make_node(op, ["x"], ["y"])], "g", [x], [y])
    return helper.make_model(g).SerializeToString()


def _model(name: str = "mobilenet", op: str = "Relu", **kw) -> BinModel:
    fields = dict(
        deps={"hbtools": "0.1.0", "onnx": "1.15.0", "onnxruntime": "1.17.0"},
        config={"march": "bayes-e", "input_type_rt": "nv12", "optimize_level": "O3"},
        inputs=[
            {
                "name": "x",
                "input_type_rt": "nv12",
                "input_type_train": "rgb",
                "layout": "NCHW",
                "shape": [1, 3, 4, 4],
                "dtype": "uint8",
                "input_source": "pyramid",
                "batch": 1,
            }
        ],
        outputs=[{"name": "y", "shape": [1, 3, 4, 4], "dtype": "float32"}],
        graph=_graph(op),
        partition={"bpu_subgraphs": [{"name": "sub0", "nodes": ["n0"]}], "cpu_nodes": []},
        deleted_nodes=[{"name": "Dequantize_0", "type": "Dequantize"}],
        perf={"layers": [{"name": "n0", "cycles": 12.5}]},
        meta={"desc": "ünïcode ✓"},
        extra_sections={"weights": bytes(range(256))},
    )
    fields.update(kw)
    return BinModel(name=name, **fields)


def _write(tmp_path, models=None, *, packed=False, name="m.bin"):
    path = tmp_path / name
    write_bin(path, models or [_model()], packed=packed)
    return path


def _reseal(data: bytes, *, fix_size: bool = True) -> bytes:
    """Recompute every checksum (and the size field) so a mutation reaches the structural checks."""
    b = bytearray(data)
    if len(b) < bf.HEADER.size:
        return bytes(b)
    h = list(bf.HEADER.unpack_from(b))
    count, table = h[4], h[6]
    for i in range(min(count, 64)):
        pos = table + i * bf.ENTRY.size
        if pos < bf.HEADER.size or pos + bf.ENTRY.size > len(b):
            break
        e = list(bf.ENTRY.unpack_from(b, pos))
        e[5] = zlib.crc32(b[e[3] : e[3] + e[4]])
        bf.ENTRY.pack_into(b, pos, *e)
    if fix_size:
        h[7] = len(b)
    h[5] = zlib.crc32(b[bf.HEADER.size :])
    b[: bf.HEADER.size] = bf._seal_header(bf.HEADER.pack(*h))
    return bytes(b)


def _craft(tmp_path, directory, *, flags=0, version=bf.FORMAT_VERSION, extra=()):
    """A well-checksummed file with an arbitrary directory payload and one graph section."""
    payload = directory if isinstance(directory, bytes) else json.dumps(directory).encode()
    sections = [(bf.KIND_DIRECTORY, bf.NO_MODEL, payload), (bf.KIND_GRAPH, 0, _graph()), *extra]
    path = tmp_path / "crafted.bin"
    path.write_bytes(b"".join(bf._pack(sections, flags, version)))
    return path


def _entry(**kw):
    d = {k: getattr(_model(), k) for k in bf._JSON_FIELDS}
    d.update(name="m", graph=1, extra_sections={})
    d.update(kw)
    return d


def _err(path) -> str:
    with pytest.raises(BinFormatError) as ei:
        read_bin(path)
    msg = str(ei.value)
    assert "\n" not in msg and str(path) in msg
    return msg


# ---------------------------------------------------------------- round trips


def test_round_trip_one_model(tmp_path):
    m = _model()
    f = read_bin(_write(tmp_path, [m]))
    assert isinstance(f, BinFile)
    assert f.version == bf.FORMAT_VERSION and f.packed is False
    assert f.models == [m] and f.model() == m and f.model("mobilenet") == m
    assert f.model().load_graph().graph.node[0].op_type == "Relu"


def test_round_trip_packed_several(tmp_path):
    ms = [_model("a", "Relu"), _model("b", "Sigmoid", perf=None, extra_sections={}), _model("c")]
    f = read_bin(_write(tmp_path, ms, packed=True))
    assert f.packed and f.names == ["a", "b", "c"] and f.models == ms
    assert f.model("b").load_graph().graph.node[0].op_type == "Sigmoid"
    with pytest.raises(HbError, match=r"3 models \('a', 'b', 'c'\)"):
        f.model()
    with pytest.raises(HbError, match=r"no model 'zz'; it holds 'a', 'b', 'c'"):
        f.model("zz")


def test_payloads_aligned_and_default_model(tmp_path):
    data = _write(tmp_path, [BinModel("bare")]).read_bytes()
    h = bf.HEADER.unpack_from(data)
    for i in range(h[4]):
        assert bf.ENTRY.unpack_from(data, h[6] + i * bf.ENTRY.size)[3] % bf.ALIGN == 0
    assert read_bin(tmp_path / "m.bin").model() == BinModel("bare")
    assert set(bf.current_deps()) == {"hbtools", "onnx", "onnxruntime"}


def test_newer_minor_accepted_unknown_parts_ignored(tmp_path):
    d = {"models": [_entry(future_key=[1, 2])], "future_top": {}}
    blob = (77, 0, b"future section kind")
    path = _craft(tmp_path, d, version=(1, 9), flags=0x8000, extra=[blob])
    f = read_bin(path)
    assert f.version == (1, 9) and f.model().name == "m"


# ---------------------------------------------------------------- corruption categories


def test_missing_and_directory_path(tmp_path):
    assert "cannot read" in _err(tmp_path / "nope.bin")  # a wrong input (exit 1)
    with pytest.raises(ResourceError, match="cannot read the .bin .*it is a folder"):  # the machine's refusal (exit 3)
        read_bin(tmp_path)


def test_empty(tmp_path):
    (tmp_path / "e.bin").write_bytes(b"")
    assert "empty" in _err(tmp_path / "e.bin")


@pytest.mark.parametrize(
    "blob, hint",
    [
        (b"\x89PNG\r\n\x1a\n" + bytes(100), "PNG image"),
        (b"PK\x03\x04" + bytes(100), "zip archive"),
        (b"name: x\nmarch: bayes\n", "starts with 6e 61"),
    ],
)
def test_foreign_files(tmp_path, blob, hint):
    (tmp_path / "f.bin").write_bytes(blob)
    msg = _err(tmp_path / "f.bin")
    assert "not an hbtools .bin" in msg and hint in msg


def test_onnx_file_named_bin(tmp_path):
    (tmp_path / "model.bin").write_bytes(_graph())
    assert "looks like an ONNX model" in _err(tmp_path / "model.bin")


def test_truncated_everywhere(tmp_path):
    data = _write(tmp_path).read_bytes()
    cut = tmp_path / "cut.bin"
    for n in range(1, len(data)):
        cut.write_bytes(data[:n])
        assert "truncated" in _err(cut), n


def test_trailing_garbage(tmp_path):
    path = _write(tmp_path)
    path.write_bytes(path.read_bytes() + b"xx")
    assert "2 unexpected bytes" in _err(path)


def test_newer_major_refused(tmp_path):
    path = _craft(tmp_path, {"models": [_entry()]}, version=(3, 1))
    assert "format version 3.1 is newer" in _err(path) and "upgrade hbtools" in _err(path)
    path = _craft(tmp_path, {"models": [_entry()]}, version=(0, 1))
    assert "0.1 is not supported" in _err(path)


def test_graph_and_blobs_are_stored_compressed_and_read_back(tmp_path):
    graph = _graph() + bytes(4096)  # compressible (trailing bytes load_graph never sees)
    m = _model(graph=graph, extra_sections={"zeros": bytes(10000), "noise": os.urandom(300)})
    path = _write(tmp_path, [m])
    assert path.stat().st_size < len(graph) + 10000
    data = path.read_bytes()
    h = bf.HEADER.unpack_from(data)
    entries = [bf.ENTRY.unpack_from(data, h[6] + i * bf.ENTRY.size) for i in range(h[4])]
    flags = {e[0]: e[1] for e in entries if e[0] != bf.KIND_BLOB}
    assert flags == {bf.KIND_DIRECTORY: 0, bf.KIND_GRAPH: bf.SECTION_DEFLATE}
    assert sorted(e[1] for e in entries if e[0] == bf.KIND_BLOB) == [0, bf.SECTION_DEFLATE]  # noise stays raw
    assert read_bin(path).models == [m]


def test_format_1_files_still_read(tmp_path):
    """Files written before section compression (format 1.0, section flags zero) read as they were."""
    path = _craft(tmp_path, {"models": [_entry()]}, version=(1, 0))
    f = read_bin(path)
    assert f.version == (1, 0) and f.model().load_graph().graph.node[0].op_type == "Relu"


@pytest.mark.parametrize(("stored", "unpacked", "expect"), [
    (zlib.compress(b"x" * 100), 99, "unpacks to 100 bytes, not the 99"),
    (zlib.compress(b"x" * 100), 101, "unpacks to 100 bytes, not the 101"),
    (b"not a zlib stream at all", 50, "not a valid zlib stream"),
    (zlib.compress(b"x" * 100), 2**32 - 1, "more than zlib can hold"),
    (zlib.compress(b"x" * 100)[:-3], 100, "truncated zlib stream"),
    (zlib.compress(b"x" * 100) + b"zz", 100, "padded zlib stream"),
])
def test_damaged_compressed_section(tmp_path, stored, unpacked, expect):
    directory = json.dumps({"models": [_entry(extra_sections={"w": 2})]}).encode()
    sections = [(bf.KIND_DIRECTORY, bf.NO_MODEL, directory), (bf.KIND_GRAPH, 0, _graph()),
                (bf.KIND_BLOB, 0, stored, bf.SECTION_DEFLATE, unpacked)]
    path = tmp_path / "damaged.bin"
    path.write_bytes(b"".join(bf._pack(sections, 0)))
    msg = _err(path)
    assert "section #2" in msg and expect in msg


def test_unknown_section_flag_refused(tmp_path):
    sections = [(bf.KIND_DIRECTORY, bf.NO_MODEL, json.dumps({"models": [_entry()]}).encode()),
                (bf.KIND_GRAPH, 0, _graph(), 0x4, 0)]
    path = tmp_path / "future.bin"
    path.write_bytes(b"".join(bf._pack(sections, 0)))
    assert "flags 0x0004" in _err(path) and "upgrade hbtools" in _err(path)


@pytest.mark.parametrize(
    "where, expect",
    [(10, "header checksum"), (200, "checksum mismatch"), (-3, "checksum mismatch")],
)
def test_checksum_mismatch(tmp_path, where, expect):
    path = _write(tmp_path)
    b = bytearray(path.read_bytes())
    b[where] ^= 0x40
    path.write_bytes(bytes(b))
    assert expect in _err(path)


def test_section_checksum_mismatch(tmp_path):
    # Body checksum resealed, section checksum left stale: the per-section CRC catches it.
    path = _write(tmp_path)
    b = bytearray(path.read_bytes())
    b[-3] ^= 1
    h = list(bf.HEADER.unpack_from(b))
    h[5] = zlib.crc32(b[bf.HEADER.size :])
    b[: bf.HEADER.size] = bf._seal_header(bf.HEADER.pack(*h))
    path.write_bytes(bytes(b))
    assert "section #" in _err(path) and "checksum mismatch" in _err(path)


@pytest.mark.parametrize(
    "directory, expect",
    [
        (b"{not json", "not valid UTF-8 JSON"),
        (b"\xff\xfe{}", "not valid UTF-8 JSON"),
        (b"[" * 100000 + b"]" * 100000, "not valid UTF-8 JSON"),
        (b'{"models": [{"n": 1' + b"9" * 5000 + b"}]}", "not valid UTF-8 JSON"),
        ([1, 2], "no 'models' list"),
        ({"models": []}, "lists no models"),
        ({"models": [7]}, "model #0 in the directory is not an object"),
        ({"models": [_entry(name="")]}, "model #0 has no name"),
        ({"models": [_entry(deps={"onnx": 1})]}, "'deps' must be an object of strings"),
        ({"models": [_entry(inputs=[1])]}, "'inputs' must be a list of objects"),
        ({"models": [_entry(perf=[])]}, "'perf' must be an object or null"),
        ({"models": [{"name": "m"}]}, "lacks 'deps'"),
        ({"models": [_entry(graph=9)]}, "refers to missing section 9"),
        ({"models": [_entry(graph=True)]}, "refers to missing section True"),
        ({"models": [_entry(graph=0)]}, "wrong kind or model"),
        ({"models": [_entry(extra_sections={"w": 1})]}, "wrong kind or model"),
        ({"models": [_entry(), _entry()]}, "not marked packed"),
    ],
)
def test_bad_directory(tmp_path, directory, expect):
    assert expect in _err(_craft(tmp_path, directory))


def test_duplicate_names_in_packed(tmp_path):
    d = {"models": [_entry(), _entry(graph=2)]}
    path = _craft(tmp_path, d, flags=bf.FLAG_PACKED, extra=[(bf.KIND_GRAPH, 1, _graph())])
    assert "duplicate model names: 'm'" in _err(path)


def test_missing_directory(tmp_path):
    path = tmp_path / "nodir.bin"
    path.write_bytes(b"".join(bf._pack([(bf.KIND_GRAPH, 0, _graph())], 0)))
    assert "no directory section" in _err(path)
    two = [(bf.KIND_DIRECTORY, bf.NO_MODEL, b"{}")] * 2
    path.write_bytes(b"".join(bf._pack(two, 0)))
    assert "2 directory sections" in _err(path)


def _patch(path, fn):
    b = bytearray(path.read_bytes())
    fn(b)
    path.write_bytes(_reseal(bytes(b)))


def test_section_table_out_of_range(tmp_path):
    path = _write(tmp_path)
    _patch(path, lambda b: struct.pack_into("<I", b, 16, 0xFFFFFFFF))  # absurd section count
    assert "section table" in _err(path) and "lies outside the file" in _err(path)
    path = _write(tmp_path)
    _patch(path, lambda b: struct.pack_into("<Q", b, 24, 2**63))  # table offset
    assert "section table" in _err(path)


def test_section_offsets_out_of_range(tmp_path):
    path = _write(tmp_path)
    entry = bf.HEADER.size
    _patch(path, lambda b: struct.pack_into("<Q", b, entry + 16, 2**64 - 1))  # length
    assert "section #0" in _err(path) and "lies outside the file" in _err(path)
    path = _write(tmp_path)
    _patch(path, lambda b: struct.pack_into("<Q", b, entry + 8, 3))  # offset inside the header
    assert "section #0" in _err(path)


def test_error_is_hberror_with_one_line_for_hostile_names(tmp_path):
    path = _craft(tmp_path, {"models": [_entry(name="a\nb", deps=[])]})
    with pytest.raises(HbError) as ei:
        read_bin(path)
    assert "\n" not in str(ei.value) and len(ei.value.lines()) == 1


def test_load_graph_rejects_garbage():
    with pytest.raises(BinFormatError, match="not a valid ONNX model"):
        BinModel("m", graph=b"\xff\xff\xff\xff").load_graph()


# ---------------------------------------------------------------- fuzzing


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    ms = [_model("a", perf=None, extra_sections={}), _model("b", extra_sections={"w": b"12"})]
    write_bin(d / "base.bin", ms, packed=True)
    return d, (d / "base.bin").read_bytes()


_MUTATION = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10**6), st.integers(1, 255)),
    st.tuples(st.just("set"), st.integers(0, 10**6), st.integers(0, 255)),
    st.tuples(st.just("cut"), st.integers(0, 10**6), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, 10**6), st.integers(0, 255)),
    st.tuples(st.just("delete"), st.integers(0, 10**6), st.integers(1, 40)),
)




@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(_MUTATION, min_size=1, max_size=4), reseal=st.booleans())
def test_fuzz_only_binformaterror(sample, ops, reseal):
    folder, base = sample
    data = mutate_bytes(base, ops)
    if reseal:  # get past the checksums so the structural checks are exercised too
        data = _reseal(data)
    path = folder / "fuzz.bin"
    path.write_bytes(data)
    try:
        f = read_bin(path)
    except BinFormatError as e:
        assert "\n" not in str(e)
        return
    assert data == base or reseal  # without resealing, any change must be detected
    assert f.models and all(isinstance(m, BinModel) for m in f.models)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda kids: (
        st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=5), kids, max_size=3)
    ),
    max_leaves=8,
)
_KEYS = ["name", "graph", "extra_sections", *bf._JSON_FIELDS]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    edits=st.lists(st.tuples(st.sampled_from(_KEYS), st.none() | _JSON), max_size=3),
    top=st.none() | _JSON,
    packed=st.booleans(),
)
def test_fuzz_directory_schema(sample, edits, top, packed):
    # Near-valid directories: one valid model entry with a few fields replaced or deleted.
    folder, _ = sample
    entry = _entry()
    for key, value in edits:
        if value is None:
            entry.pop(key, None)
        else:
            entry[key] = value
    directory = {"models": [entry]} if top is None else top
    path = _craft(folder, directory, flags=bf.FLAG_PACKED if packed else 0)
    try:
        read_bin(path)
    except BinFormatError as e:
        assert "\n" not in str(e)


# ---------------------------------------------------------------- writing


def _leftovers(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_write_unserialisable_leaves_nothing(tmp_path):
    bad = _model(config={"when": object()})
    with pytest.raises(BinFormatError, match=r"model 'mobilenet': config is not JSON-serialisable"):
        write_bin(tmp_path / "out.bin", [bad])
    assert _leftovers(tmp_path) == []


def test_write_failure_keeps_old_file_and_removes_temp(tmp_path, monkeypatch):
    path = _write(tmp_path, name="out.bin")
    before = path.read_bytes()

    def boom(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(bf.os, "fsync", boom)
    with pytest.raises(ResourceError, match="cannot write .*No space left") as info:  # the machine refused: exit 3
        write_bin(path, [_model("other")])
    assert info.value.exit_code == EXIT_SYSTEM
    assert path.read_bytes() == before and _leftovers(tmp_path) == ["out.bin"]


def test_write_interrupted_removes_temp(tmp_path, monkeypatch):
    def interrupt(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(bf.os, "fsync", interrupt)
    with pytest.raises(KeyboardInterrupt):
        write_bin(tmp_path / "out.bin", [_model()])
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize(
    "models, packed, expect",
    [
        ([], False, "no models"),
        ([_model("a"), _model("b")], False, "packed=True"),
        ([_model("a"), _model("a")], True, "duplicate model names"),
        ([_model(graph="text")], False, "graph is str, not bytes"),
        ([_model(extra_sections={1: b""})], False, "extra_sections must be a dict"),
        ([_model(perf={"x": float("nan")})], False, "perf is not JSON-serialisable"),
        ([_model(deps={"onnx": 1.15})], False, "'deps' must be an object of strings"),
        ([_model(name="")], False, "has no name"),
        (["not a model"], False, "not a BinModel"),
    ],
)
def test_write_rejects_bad_models(tmp_path, models, packed, expect):
    with pytest.raises(BinFormatError, match=expect):
        write_bin(tmp_path / "out.bin", models, packed=packed)
    assert _leftovers(tmp_path) == []


def test_write_into_missing_directory(tmp_path):
    with pytest.raises(ResourceError, match="cannot write .*does not exist"):
        write_bin(tmp_path / "no" / "out.bin", [_model()])


def test_graph_with_non_utf8_attribute_is_a_format_error() -> None:
    node = helper.make_node("HzLut", ["x"], ["y"], name="lut", domain="horizon", out_type=b"\xce\x00int8")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.INT8, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.INT8, [1])])
    model = BinModel(name="damaged", graph=helper.make_model(graph).SerializeToString())
    with pytest.raises(BinFormatError, match="attribute 'out_type' of node 'lut' is not UTF-8"):
        model.load_graph()
