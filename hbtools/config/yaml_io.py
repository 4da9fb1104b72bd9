"""Reading the YAML file itself: missing file, syntax errors, duplicate keys, wrong top level."""

from __future__ import annotations

import codecs
from pathlib import Path
from typing import Any

import yaml

from hbtools.errors import ConfigError
from hbtools.log import logger

_MERGE_TAG = "tag:yaml.org,2002:merge"


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key given twice in one mapping with two different values.

    Plain PyYAML keeps the last value silently; a config listing e.g. input_shape
    twice would then run with a value the user may not have meant. A key repeated
    with the same value (a node listed twice in node_info, as vendor configs do)
    means one thing either way: it is kept, with a WARNING.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, tuple[int, yaml.Node]] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
                continue
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if key in seen:
                first, first_value = seen[key]
                where = f"line {line}" if first == line else f"lines {first} and {line}"
                if _same_value(self, first_value, value_node):
                    logger.warning("Key %r is given twice with the same value in the same section of the config "
                                   "(%s); it is used once. Keep only one of them", key, where)
                    continue
                raise ConfigError(
                    f"Key {key!r} is given twice with different values in the same section of the config "
                    f"({where})\nKeep only the one you mean"
                )
            seen[key] = (line, value_node)
        return super().construct_mapping(node, deep=deep)


def _same_value(loader: yaml.SafeLoader, a: yaml.Node, b: yaml.Node) -> bool:
    """Whether two YAML value nodes spell the same value (``construct_object`` caches, nothing is built twice)."""
    return bool(loader.construct_object(a, deep=True) == loader.construct_object(b, deep=True))


def _decoded(raw: bytes, path: Path) -> str:
    """The config's text: UTF-8 (with or without a byte-order mark), UTF-16 with its mark, or, with a WARNING,
    GB18030 (GBK), in which Windows editors save a config with Chinese comments."""
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return raw.decode("utf-16")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        if b"\x00" in raw:
            raise ConfigError(f"Config file {path} is not a text file\nPass the YAML config (not the model or "
                              f"a .bin) with --config") from None
        try:
            text = raw.decode("gb18030")
        except UnicodeDecodeError:
            raise ConfigError(f"Config file {path} is not UTF-8 text ({exc.reason} at byte {exc.start})\n"
                              f"Save it as UTF-8") from None
    logger.warning("config file %s is not UTF-8; read as GBK (GB18030), the encoding of Chinese Windows editors. "
                "Save it as UTF-8", path)
    return text


def read_yaml(path: Path) -> dict[Any, Any]:
    """The parsed top-level mapping of the config file at ``path``."""
    if not path.exists():
        raise ConfigError(f"Config file not found: {path}\nCheck the --config path")
    if not path.is_file():
        raise ConfigError(f"Config path is not a file: {path}\nPass the YAML file, not a folder")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"Cannot read config file {path}: {exc}") from None
    text = _decoded(raw, path)
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        fix = ("Remove the tag: a config holds plain values (strings, numbers, lists), and tags that build "
               "objects are not read" if isinstance(exc, yaml.constructor.ConstructorError)
               else "Fix the YAML syntax there (indentation, quotes, a ':' after each key)")
        raise ConfigError(f"Config file {path} is not valid YAML: {exc.problem or exc.context}{where}\n{fix}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"Config file {path} is not valid YAML: {exc}") from None
    if data is None:
        raise ConfigError(
            f"Config file {path} is empty\nIt needs the groups model_parameters, "
            f"input_parameters, calibration_parameters and compiler_parameters"
        )
    if not isinstance(data, dict):
        raise ConfigError(
            f"Config file {path} must hold a mapping of groups, not a "
            f"{type(data).__name__}\nStart it with 'model_parameters:' and the "
            f"other groups"
        )
    return data
