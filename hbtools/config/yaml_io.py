"""Reading the YAML file itself: missing file, syntax errors, duplicate keys, wrong top level."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from hbtools.errors import ConfigError

_MERGE_TAG = "tag:yaml.org,2002:merge"


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key given twice in one mapping.

    Plain PyYAML keeps the last value silently; a config listing e.g. input_shape
    twice would then run with a value the user may not have meant.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
                continue
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if key in seen:
                where = f"line {line}" if seen[key] == line else f"lines {seen[key]} and {line}"
                raise ConfigError(
                    f"Key {key!r} is given twice in the same section of the config "
                    f"({where})\nKeep only one of them"
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: Path) -> dict[Any, Any]:
    """The parsed top-level mapping of the config file at ``path``."""
    if not path.exists():
        raise ConfigError(f"Config file not found: {path}\nCheck the --config path")
    if not path.is_file():
        raise ConfigError(f"Config path is not a file: {path}\nPass the YAML file, not a folder")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"Cannot read config file {path}: {exc}") from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(
            f"Config file {path} is not valid YAML: {exc.problem or exc.context}{where}\n"
            f"Fix the YAML syntax there (indentation, quotes, a ':' after each key)"
        ) from None
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
