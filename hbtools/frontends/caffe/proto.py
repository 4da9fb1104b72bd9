"""Caffe message classes, built at import time from ``schema.CAFFE_SCHEMA``.

The schema text is compiled with protobuf's pure-python descriptor API (a
``FileDescriptorProto`` added to a private ``DescriptorPool``): no ``protoc``,
no generated module, and no clash with a ``caffe_pb2`` a user may have imported.
The parser below understands just the proto2 subset the schema uses: messages,
enums (top level or nested), ``optional``/``repeated`` fields and the
``default`` and ``packed`` options.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from hbtools.frontends.caffe.schema import CAFFE_SCHEMA

PACKAGE = "caffe"
_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {
    "double": _F.TYPE_DOUBLE, "float": _F.TYPE_FLOAT, "int64": _F.TYPE_INT64, "uint64": _F.TYPE_UINT64,
    "int32": _F.TYPE_INT32, "uint32": _F.TYPE_UINT32, "bool": _F.TYPE_BOOL, "string": _F.TYPE_STRING,
    "bytes": _F.TYPE_BYTES,
}
_TOKEN = re.compile(r'"[^"]*"|[A-Za-z_][\w.]*|-?[\d.][\w.+-]*|[{}\[\]=;,]')


@dataclass
class _Field:
    label: str
    type: str
    name: str
    number: int
    options: dict[str, str]


@dataclass
class _Message:
    name: str
    fields: list[_Field] = field(default_factory=list)
    enums: dict[str, list[tuple[str, int]]] = field(default_factory=dict)


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _TOKEN.findall(text)
        self.pos = 0

    def next(self, expected: str | None = None) -> str:
        token = self.tokens[self.pos]
        self.pos += 1
        if expected is not None and token != expected:
            raise ValueError(f"schema: expected {expected!r}, found {token!r} (token {self.pos})")
        return token

    def peek(self) -> str:
        return self.tokens[self.pos]

    def enum(self) -> tuple[str, list[tuple[str, int]]]:
        name = self.next()
        self.next("{")
        values = []
        while self.peek() != "}":
            value = self.next()
            self.next("=")
            values.append((value, int(self.next())))
            self.next(";")
        self.next("}")
        return name, values

    def message(self) -> _Message:
        msg = _Message(self.next())
        self.next("{")
        while (token := self.next()) != "}":
            if token == "enum":
                name, values = self.enum()
                msg.enums[name] = values
                continue
            type_, name = self.next(), self.next()
            self.next("=")
            number, options = int(self.next()), {}
            if self.peek() == "[":
                self.next()
                while True:
                    key = self.next()
                    self.next("=")
                    options[key] = self.next().strip('"')
                    if self.next() == "]":
                        break
            self.next(";")
            msg.fields.append(_Field(token, type_, name, number, options))
        return msg

    def file(self) -> tuple[list[_Message], dict[str, list[tuple[str, int]]]]:
        messages, enums = [], {}
        while self.pos < len(self.tokens):
            kind = self.next()
            if kind == "message":
                messages.append(self.message())
            elif kind == "enum":
                name, values = self.enum()
                enums[name] = values
            else:
                raise ValueError(f"schema: unexpected {kind!r}")
        return messages, enums


def _file_descriptor(text: str) -> descriptor_pb2.FileDescriptorProto:
    messages, enums = _Parser(text).file()
    names = {m.name for m in messages}
    fdp = descriptor_pb2.FileDescriptorProto(name="hbtools_caffe.proto", package=PACKAGE, syntax="proto2")

    def add_enum(target: Any, name: str, values: list[tuple[str, int]]) -> None:
        enum = target.add(name=name)
        for value, number in values:
            enum.value.add(name=value, number=number)

    for name, values in enums.items():
        add_enum(fdp.enum_type, name, values)
    for msg in messages:
        proto = fdp.message_type.add(name=msg.name)
        for name, values in msg.enums.items():
            add_enum(proto.enum_type, name, values)
        for f in msg.fields:
            fp = proto.field.add(name=f.name, number=f.number, json_name=f.name,
                                 label=_F.LABEL_REPEATED if f.label == "repeated" else _F.LABEL_OPTIONAL)
            if f.type in _SCALARS:
                fp.type = _SCALARS[f.type]
            elif f.type in msg.enums:
                fp.type, fp.type_name = _F.TYPE_ENUM, f".{PACKAGE}.{msg.name}.{f.type}"
            elif f.type in enums:
                fp.type, fp.type_name = _F.TYPE_ENUM, f".{PACKAGE}.{f.type}"
            elif f.type in names:
                fp.type, fp.type_name = _F.TYPE_MESSAGE, f".{PACKAGE}.{f.type}"
            else:
                raise ValueError(f"schema: unknown type {f.type} of {msg.name}.{f.name}")
            if "default" in f.options:
                fp.default_value = f.options["default"]
            if f.options.get("packed") == "true":
                fp.options.packed = True
    return fdp


def _classes() -> dict[str, type]:
    pool = descriptor_pool.DescriptorPool()
    fdp = _file_descriptor(CAFFE_SCHEMA)
    pool.AddSerializedFile(fdp.SerializeToString())
    return {m.name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{m.name}"))
            for m in fdp.message_type}


_CLASSES = _classes()
NetParameter = _CLASSES["NetParameter"]
LayerParameter = _CLASSES["LayerParameter"]
BlobProto = _CLASSES["BlobProto"]
BlobShape = _CLASSES["BlobShape"]
# Weights-only view of a .caffemodel: layer name, type and blobs, nothing else, so a
# model saved by a Caffe branch with its own layer-parameter fields still reads. A
# blob's packed float data is read as raw bytes (same wire type) for np.frombuffer.
WeightsNet = _CLASSES["WeightsNet"]
