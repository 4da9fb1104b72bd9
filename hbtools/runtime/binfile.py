"""The ``.bin`` runtime model container: writer and reader.

The byte layout is documented in docs/bin_format.md; keep the two in step.
Reading is defensive: every length and offset comes from an untrusted file, so
each is checked against the real file size before it is used, and anything
wrong becomes a one-line ``BinFormatError`` (SPEC §8, §10).
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

from hbtools import outputs
from hbtools.errors import HbError, os_error
from hbtools.runs.transaction import warn_if_mid_commit

MAGIC = b"HBTBIN\x1a\n"  # \x1a\n: text-mode copies and newline mangling break the magic
FORMAT_VERSION = (2, 0)
READABLE_MAJORS = (1, 2)  # 1.x files (no compressed sections) still read
FLAG_PACKED = 0x1
SECTION_DEFLATE = 0x1  # format 2: the payload is a zlib stream; the entry's last field is its unpacked length
ZLIB_LEVEL = 6
ZLIB_MAX_RATIO = 1032  # the most a zlib stream can expand (deflate's limit), to bound a claimed length

# magic, major, minor, flags, section_count, body_crc32, table_offset, file_size,
# reserved, header_crc32 (of bytes 0..59).
HEADER = struct.Struct("<8sHHIIIQQ20sI")
# kind, flags, model_index, offset, length, crc32, reserved
ENTRY = struct.Struct("<HHIQQII")
KIND_DIRECTORY, KIND_GRAPH, KIND_BLOB = 1, 2, 3
NO_MODEL = 0xFFFFFFFF  # model_index of file-level sections (the directory)
ALIGN = 16  # payload alignment, so a future reader can mmap graphs without copying
_JSON_FIELDS = ("deps", "config", "inputs", "outputs", "partition", "deleted_nodes", "perf", "meta")


class BinFormatError(HbError):
    """A ``.bin`` file is unreadable, or a model cannot be written as one."""


class _Bad(Exception):
    """Internal: what is wrong, before the file name is prefixed."""


@dataclass
class BinModel:
    """One model inside a ``.bin``; every field except ``graph``/``extra_sections`` is JSON."""

    name: str
    deps: dict[str, str] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    inputs: list[dict[str, Any]] = field(default_factory=list)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    graph: bytes = b""
    partition: dict[str, Any] = field(default_factory=dict)
    deleted_nodes: list[dict[str, Any]] = field(default_factory=list)
    perf: dict[str, Any] | None = None
    meta: dict[str, Any] = field(default_factory=dict)  # free-form tool data (march, desc, ...)
    extra_sections: dict[str, bytes] = field(default_factory=dict)  # named binary blobs

    def load_graph(self) -> Any:
        """Parse ``graph`` into an ``onnx.ModelProto``."""
        import onnx
        from google.protobuf.message import DecodeError

        try:
            model = onnx.load_model_from_string(bytes(self.graph))
        except (DecodeError, ValueError, RuntimeError) as e:
            raise BinFormatError(
                _one_line(f"graph of model {self.name!r} is not a valid ONNX model: {e}")
            ) from None
        _check_text_attributes(model, self.name)
        return model


def _check_text_attributes(model: Any, name: str) -> None:
    """ONNX keeps string attributes as raw bytes; ours are always UTF-8, anything else is damage."""
    g = model.graph
    for k, node in enumerate(g.node):
        # protobuf hands back a string field that is not UTF-8 as bytes (or raises on access)
        try:
            texts = [node.name, node.op_type, node.domain, *node.input, *node.output]
        except UnicodeDecodeError:
            texts = [b""]
        if not all(isinstance(t, str) for t in texts):
            raise BinFormatError(_one_line(f"graph of model {name!r}: node #{k} has a name, type or tensor "
                                           f"name that is not UTF-8 text (corrupted file?)"))
    try:
        names = [v.name for v in (*g.input, *g.output, *g.value_info, *g.initializer)]
    except UnicodeDecodeError:
        names = [b""]
    if not all(isinstance(t, str) for t in names):
        raise BinFormatError(_one_line(f"graph of model {name!r}: a tensor name is not UTF-8 text (corrupted file?)"))
    for node in g.node:
        for attr in node.attribute:
            for raw in (attr.s, *attr.strings):
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError:
                    raise BinFormatError(
                        _one_line(f"graph of model {name!r}: attribute {attr.name!r} of node "
                                  f"{node.name!r} is not UTF-8 text (corrupted file?)")
                    ) from None


@dataclass
class BinFile:
    """A parsed ``.bin``: format version, packed flag and the models in file order."""

    version: tuple[int, int]
    packed: bool
    models: list[BinModel]
    path: str = ""

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.models]

    def selected(self, name: str | None) -> list[BinModel]:
        """The model called ``name`` (the tools' ``-m``), or every model when no name is given."""
        return [self.model(name)] if name else list(self.models)

    def model(self, name: str | None = None) -> BinModel:
        """The model called ``name``; ``None`` means the only one."""
        listing = ", ".join(repr(n) for n in self.names)
        if name is None:
            if len(self.models) == 1:
                return self.models[0]
            raise HbError(
                _one_line(
                    f"{self.path} is a packed file with {len(self.models)} "
                    f"models ({listing}); name the one you want"
                )
            )
        for m in self.models:
            if m.name == name:
                return m
        raise HbError(_one_line(f"{self.path} has no model {name!r}; it holds {listing}"))


def current_deps() -> dict[str, str]:
    """Versions of hbtools, onnx and onnxruntime, for ``BinModel.deps``."""
    from importlib import metadata

    out = {}
    for pkg in ("hbtools", "onnx", "onnxruntime"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


# ---------------------------------------------------------------- writing


def write_bin(
    path: str | os.PathLike[str], models: list[BinModel], *, packed: bool = False
) -> None:
    """Write ``models`` to ``path`` atomically: the old file survives any failure."""
    dest = os.fspath(path)
    try:
        chunks = _serialize(models, packed)  # all validation happens before touching disk
    except _Bad as e:
        raise BinFormatError(_one_line(f"cannot write {dest}: {e}")) from None
    outputs.write_file(dest, chunks)


def _serialize(models: list[BinModel], packed: bool) -> list[bytes]:
    models = list(models)
    if not models:
        raise _Bad("no models to write")
    if len(models) > 1 and not packed:
        raise _Bad(f"{len(models)} models can only be written with packed=True")
    sections: list[tuple[int, int, bytes]] = [(KIND_DIRECTORY, NO_MODEL, b"")]
    entries = []
    for i, m in enumerate(models):
        if not isinstance(m, BinModel):
            raise _Bad(f"model #{i} is a {type(m).__name__}, not a BinModel")
        if not isinstance(m.extra_sections, dict) or not all(
            isinstance(k, str) for k in m.extra_sections
        ):
            raise _Bad(f"model {m.name!r}: extra_sections must be a dict of str to bytes")
        blobs = {
            "graph": m.graph,
            **{f"extra section {k!r}": v for k, v in m.extra_sections.items()},
        }
        for what, blob in blobs.items():
            if not isinstance(blob, (bytes, bytearray, memoryview)):
                raise _Bad(f"model {m.name!r}: {what} is {type(blob).__name__}, not bytes")
        entry = {"name": m.name, **{k: getattr(m, k) for k in _JSON_FIELDS}}
        entry["graph"] = len(sections)
        sections.append((KIND_GRAPH, i, bytes(m.graph)))
        entry["extra_sections"] = {}
        for key, blob in m.extra_sections.items():
            entry["extra_sections"][key] = len(sections)
            sections.append((KIND_BLOB, i, bytes(blob)))
        entries.append(entry)
    sections = [sections[0], *(_deflated(*section) for section in sections[1:])]
    try:
        text = json.dumps({"models": entries}, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as e:
        raise _Bad(_which_field(models, e)) from None
    # A path of bytes that are not UTF-8 (a GBK folder name) holds lone surrogates: the directory keeps them as
    # U+FFFD, so that it stays the UTF-8 JSON every reader takes.
    sections[0] = (KIND_DIRECTORY, NO_MODEL, text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
                   .encode("utf-8"))
    # Validate with the reader's own rules, so whatever is written can be read back.
    _directory_models(json.loads(text), [(k, m, b) for k, m, b, *_ in sections], packed)
    return _pack(sections, FLAG_PACKED if packed else 0)


def _deflated(kind: int, model: int, payload: bytes) -> tuple[int, int, bytes, int, int]:
    """A graph or blob section stored as a zlib stream where that is smaller (int8 weights shrink a
    little, names and attributes a lot), with its flag and unpacked length."""
    packed = zlib.compress(payload, ZLIB_LEVEL)
    if len(packed) >= len(payload) or len(payload) > 0xFFFFFFFF:
        return kind, model, payload, 0, 0
    return kind, model, packed, SECTION_DEFLATE, len(payload)


def _which_field(models: list[BinModel], err: Exception) -> str:
    """Name the model field that json.dumps choked on (only run on failure)."""
    for m in models:
        for key in ("name", *_JSON_FIELDS):
            try:
                json.dumps(getattr(m, key), allow_nan=False)
            except (TypeError, ValueError, RecursionError) as e:
                return f"model {m.name!r}: {key} is not JSON-serialisable ({e})"
    return f"models are not JSON-serialisable ({err})"


def _pack(
    sections: list[tuple[int, int, bytes]], flags: int, version: tuple[int, int] = FORMAT_VERSION
) -> list[bytes]:
    """Lay out header, section table and aligned payloads; return the file as chunks.

    A section is ``(kind, model, payload)`` or ``(kind, model, payload, flags, unpacked_length)``."""
    pos = HEADER.size + ENTRY.size * len(sections)
    table, payloads = [], []
    for kind, model, payload, *stored in sections:
        section_flags, unpacked = stored or (0, 0)
        pad = -pos % ALIGN
        payloads += [bytes(pad), payload]
        pos += pad
        table.append(ENTRY.pack(kind, section_flags, model, pos, len(payload), zlib.crc32(payload), unpacked))
        pos += len(payload)
    chunks = [b"".join(table), *payloads]
    body_crc = 0
    for chunk in chunks:
        body_crc = zlib.crc32(chunk, body_crc)
    head = HEADER.pack(
        MAGIC, *version, flags, len(sections), body_crc, HEADER.size, pos, bytes(20), 0
    )
    return [_seal_header(head), *chunks]


def _seal_header(head: bytes) -> bytes:
    return head[:60] + struct.pack("<I", zlib.crc32(head[:60]))


# ---------------------------------------------------------------- reading


def read_bin(path: str | os.PathLike[str]) -> BinFile:
    """Parse a ``.bin``; any defect raises a one-line ``BinFormatError``."""
    where = os.fspath(path)
    warn_if_mid_commit(where)
    try:
        with open(where, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(HEADER.size)
            version, flags = _check_header(
                head, size
            )  # before reading a possibly huge foreign file
            data = head + f.read(size - len(head))
        models = _parse_body(data, size, flags, version)
    except (IsADirectoryError, PermissionError) as e:  # the machine refused: exit 3, as every tool reports it
        raise os_error(e, "cannot read the .bin") from None
    except OSError as e:  # a missing file is a wrong input (exit 1)
        raise BinFormatError(_one_line(f"cannot read {where}: {e.strerror or e}")) from None
    except _Bad as e:
        raise BinFormatError(_one_line(f"{where}: {e}")) from None
    return BinFile(version, bool(flags & FLAG_PACKED), models, where)


_FOREIGN = {
    b"\x89PNG": "a PNG image",
    b"\xff\xd8\xff": "a JPEG image",
    b"PK\x03\x04": "a zip archive",
    b"\x7fELF": "an ELF executable",
    b"\x93NUMPY": "a NumPy .npy file",
}


def _sniff(head: bytes) -> str:
    for sig, what in _FOREIGN.items():
        if head.startswith(sig):
            return f"it looks like {what}"
    if head[:1] == b"\x08":  # protobuf field 1 varint = ModelProto.ir_version
        return "it looks like an ONNX model; convert it with hb_mapper makertbin first"
    return f"it starts with {head[:8].hex(' ')}"


def _check_header(head: bytes, size: int) -> tuple[tuple[int, int], int]:
    if size == 0:
        raise _Bad("file is empty, not an hbtools .bin model")
    if not head.startswith(MAGIC) and not MAGIC.startswith(head):
        raise _Bad(f"not an hbtools .bin model ({_sniff(head)})")
    if len(head) < HEADER.size:
        raise _Bad(f"truncated: {size} bytes is shorter than the {HEADER.size}-byte header")
    _, major, minor, flags, _, _, _, file_size, _, head_crc = HEADER.unpack(head)
    if zlib.crc32(head[:60]) != head_crc:
        raise _Bad("header checksum mismatch, the file is corrupted")
    readable = " and ".join(f"{m}.x" for m in READABLE_MAJORS)
    if major > max(READABLE_MAJORS):
        raise _Bad(f"format version {major}.{minor} is newer than this hbtools reads ({readable}); upgrade hbtools")
    if major not in READABLE_MAJORS:
        raise _Bad(f"format version {major}.{minor} is not supported (this hbtools reads {readable})")
    if size < file_size:
        raise _Bad(f"truncated: {size} bytes on disk, header says {file_size}")
    if size > file_size:
        raise _Bad(f"{size - file_size} unexpected bytes after the end of the model data")
    return (major, minor), flags


def _parse_body(data: bytes, size: int, flags: int, version: tuple[int, int] = FORMAT_VERSION) -> list[BinModel]:
    _, _, _, _, count, body_crc, table_off, _, _, _ = HEADER.unpack_from(data)
    if len(data) != size:
        raise _Bad("file changed while it was being read")
    if zlib.crc32(memoryview(data)[HEADER.size :]) != body_crc:
        raise _Bad("checksum mismatch, the file is corrupted")
    if table_off < HEADER.size or table_off + count * ENTRY.size > size:
        raise _Bad(f"section table ({count} entries at offset {table_off}) lies outside the file")
    sections = []
    for i in range(count):
        kind, section_flags, model, off, length, crc, unpacked = ENTRY.unpack_from(data, table_off + i * ENTRY.size)
        if off < HEADER.size or off + length > size:
            raise _Bad(f"section #{i} ({length} bytes at offset {off}) lies outside the file")
        payload = data[off : off + length]
        if zlib.crc32(payload) != crc:
            raise _Bad(f"section #{i} checksum mismatch, the file is corrupted")
        if version[0] >= 2:  # format 1 wrote section flags as zero and read them as nothing
            if section_flags & ~SECTION_DEFLATE:
                raise _Bad(f"section #{i} has flags 0x{section_flags:04x} this hbtools does not know; "
                           "upgrade hbtools")
            if section_flags & SECTION_DEFLATE:
                payload = _inflated(payload, unpacked, i)
        sections.append((kind, model, payload))
    dirs = [payload for kind, _, payload in sections if kind == KIND_DIRECTORY]
    if len(dirs) != 1:
        raise _Bad(
            "no directory section" if not dirs else f"{len(dirs)} directory sections, expected one"
        )
    try:
        doc = json.loads(dirs[0].decode("utf-8"))
    except (
        ValueError,
        RecursionError,
    ) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise _Bad(f"directory is not valid UTF-8 JSON ({e})") from None
    return _directory_models(doc, sections, bool(flags & FLAG_PACKED))


def _inflated(payload: bytes, unpacked: int, index: int) -> bytes:
    """A compressed section's bytes, its claimed length checked before any memory is given to it."""
    if unpacked > ZLIB_MAX_RATIO * len(payload) + 64:
        raise _Bad(f"section #{index} claims {unpacked} bytes unpacked from {len(payload)}, more than zlib "
                   "can hold; the file is corrupted")
    stream = zlib.decompressobj()
    try:
        out = stream.decompress(payload, unpacked + 1)
    except zlib.error as e:
        raise _Bad(f"section #{index} is not a valid zlib stream ({e}); the file is corrupted") from None
    if len(out) != unpacked:
        raise _Bad(f"section #{index} unpacks to {len(out)} bytes, not the {unpacked} its entry gives; "
                   "the file is corrupted")
    if not stream.eof or stream.unused_data:
        raise _Bad(f"section #{index} is a {'truncated' if not stream.eof else 'padded'} zlib stream; "
                   "the file is corrupted")
    return out


def _directory_models(
    doc: Any, sections: list[tuple[int, int, bytes]], packed: bool
) -> list[BinModel]:
    """Check the directory's shape and build the models; shared by reader and writer."""
    if not isinstance(doc, dict) or not isinstance(doc.get("models"), list):
        raise _Bad("directory has no 'models' list")
    if not doc["models"]:
        raise _Bad("directory lists no models")
    if len(doc["models"]) > 1 and not packed:
        raise _Bad(f"holds {len(doc['models'])} models but is not marked packed")
    models = [_model(entry, i, sections) for i, entry in enumerate(doc["models"])]
    names = [m.name for m in models]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise _Bad(f"duplicate model names: {', '.join(map(repr, dup))}")
    return models


def _is_obj_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, dict) for x in v)


def _is_str_map(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(x, str) for x in v.values())


_CHECKS = {
    "deps": (_is_str_map, "an object of strings"),
    "config": (lambda v: isinstance(v, dict), "an object"),
    "inputs": (_is_obj_list, "a list of objects"),
    "outputs": (_is_obj_list, "a list of objects"),
    "partition": (lambda v: isinstance(v, dict), "an object"),
    "deleted_nodes": (_is_obj_list, "a list of objects"),
    "perf": (lambda v: v is None or isinstance(v, dict), "an object or null"),
    "meta": (lambda v: isinstance(v, dict), "an object"),
    "extra_sections": (lambda v: isinstance(v, dict), "an object"),
}


def _model(entry: Any, i: int, sections: list[tuple[int, int, bytes]]) -> BinModel:
    if not isinstance(entry, dict):
        raise _Bad(f"model #{i} in the directory is not an object")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise _Bad(f"model #{i} has no name")
    for key, (ok, what) in _CHECKS.items():
        if key not in entry:
            raise _Bad(f"model {name!r} lacks '{key}'")
        if not ok(entry[key]):
            raise _Bad(f"model {name!r}: '{key}' must be {what}")

    def blob(ref: Any, kind: int, what: str) -> bytes:
        # bool is an int subclass; a JSON true must not pass as section 1
        if type(ref) is not int or not 0 <= ref < len(sections):
            raise _Bad(f"model {name!r}: {what} refers to missing section {ref!r}")
        if sections[ref][:2] != (kind, i):
            raise _Bad(
                f"model {name!r}: {what} refers to section #{ref} of the wrong kind or model"
            )
        return sections[ref][2]

    fields = {k: entry[k] for k in _JSON_FIELDS}
    extra = {
        k: blob(ref, KIND_BLOB, f"extra section {k!r}")
        for k, ref in entry["extra_sections"].items()
    }
    return BinModel(
        name=name,
        graph=blob(entry.get("graph"), KIND_GRAPH, "graph"),
        extra_sections=extra,
        **fields,
    )


def _one_line(msg: str) -> str:
    # Messages quote file contents (names, exception text); a newline would split the ERROR line.
    return " ".join(msg.split("\n"))
