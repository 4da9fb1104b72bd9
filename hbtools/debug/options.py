"""Checks of the debugger's plain arguments (metrics, node types, numbers, lists)."""

from __future__ import annotations

from collections.abc import Sequence

from hbtools.errors import HbError
from hbtools.metrics import METRICS

NODE_TYPES = ("node", "weight", "activation")


def metric_list(metrics: str | Sequence[str], param: str) -> list[str]:
    """One metric name or a list of them; the first decides the ranking."""
    # 'cosine-similarity,mse' as typed on a command line: no metric name holds a comma
    names = [m.strip() for m in metrics.split(",") if m.strip()] if isinstance(metrics, str) \
        else list(metrics or [])
    if not names:
        raise HbError(f"{param} is empty; choose from {', '.join(METRICS)}")
    for name in names:
        if name not in METRICS:
            raise HbError(f"{param}: unknown metric {name!r}; choose from {', '.join(METRICS)}")
    return list(dict.fromkeys(names))


def one_metric(metric: str, param: str) -> str:
    if not isinstance(metric, str):
        raise HbError(f"{param} takes one metric name, got {metric!r}; choose from {', '.join(METRICS)}")
    return metric_list(metric, param)[0]


def node_type(value: str, param: str, choices: Sequence[str] = NODE_TYPES) -> str:
    if value not in choices:
        raise HbError(f"{param}: unknown node type {value!r}; choose from {', '.join(map(repr, choices))}")
    return value


def names(value: str | Sequence[str] | None, param: str) -> list[str] | None:
    """A node name or a flat list of names (None stays None)."""
    if value is None:
        return None
    items = [_name(item) for item in _listed(value, param)]
    for item in items:
        if not isinstance(item, str):
            raise HbError(f"{param} takes node names, got {item!r}")
    return items


def _name(value: object) -> object:
    """A whole number as the node name it spells (a model's nodes named 103, 104, ...)."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _listed(value: object, param: str) -> list:
    if isinstance(value, str | int) and not isinstance(value, bool):
        return [value]
    if not isinstance(value, Sequence):
        raise HbError(f"{param} takes a node name or a list of node names, got {value!r}")
    return list(value)


def groups(value: str | Sequence[str | Sequence[str]] | None, param: str) -> list[str | list[str]] | None:
    """quantize_node / non_quantize_node: names (one curve each) and lists of names (one curve per list)."""
    if value is None:
        return None
    out: list[str | list[str]] = []
    for item in map(_name, _listed(value, param)):
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, Sequence) and all(isinstance(_name(x), str) for x in item):
            out.append([_name(x) for x in item])
        else:
            raise HbError(f"{param} takes node names or lists of node names, got {item!r}")
    if not out:
        raise HbError(f"{param} is empty")
    return out


def number(value: object, param: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise HbError(f"{param} must be a number, got {value!r}")
    return float(value)


def cosine_threshold(value: object, param: str) -> float:
    """A cosine similarity to compare nodes' output cosines with: a number in (0, 1]."""
    threshold = number(value, param)
    if not 0 < threshold <= 1:  # NaN too
        raise HbError(f"{param} is {value!r}: nodes are picked where the output cosine similarity is below it, so it "
                      "must be a number above 0 and at most 1 (0.999 by default)")
    return threshold


def integer_or_none(value: object, param: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise HbError(f"{param} must be an integer, got {value!r}")
    return value
