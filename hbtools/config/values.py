"""Parsers for the value forms makertbin YAML configs use.

Every parser turns one raw YAML value into its normalised form or raises
``schema.SchemaError`` with a single line that names the parameter and says how
to fix it. The loader puts the ``Key '<group>' error:`` line in front, so the
user sees which group is wrong and exactly what to change.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NoReturn

import yaml
from schema import SchemaError

from hbtools.errors import ConfigError
from hbtools.outputs import REPLACED_PREFIX, file_stem

Parser = Callable[[Any], Any]


def group_error(group: str, detail: str) -> ConfigError:
    """The error every config problem ends up as (seed format: group line, detail line)."""
    return ConfigError(f"Key '{group}' error:\n{detail}")


def fail(message: str) -> NoReturn:
    raise SchemaError(message)


def is_unset(value: Any) -> bool:
    """None, blank strings and empty lists/mappings all mean "not given" (``input_shape: ''``)."""
    if isinstance(value, str):
        return not value.strip()
    return value is None or (isinstance(value, list | dict) and not value)


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def closest_names(word: str, choices: Iterable[str], n: int = 3) -> str:
    """`` (closest: 'a', 'b')`` for the names most like ``word``, or '' if none is close."""
    pool = list(choices)
    close = difflib.get_close_matches(word, pool, n=n, cutoff=0.5) or _holding(word, pool, n)
    return f" (closest: {', '.join(repr(c) for c in close)})" if close else ""


def _holding(word: str, choices: list[str], n: int) -> list[str]:
    """The longer names that hold most of ``word`` in runs of 3+ characters, best first.

    difflib's ratio counts the whole length of both names, so a short name never comes close to an
    exporter's long one ('720_HzDequantize' to '/model.23/cv2.0/cv2.0.2/Conv_output_0_HzDequantize'
    scores 0.44), though the long one holds nearly all of it."""
    if len(word) < 4:
        return []
    scored = []
    for choice in choices:
        if len(choice) <= len(word):
            continue  # as long or shorter: the ratio above already judged it
        matcher = difflib.SequenceMatcher(None, word, choice, autojunk=False)
        held = sum(b.size for b in matcher.get_matching_blocks() if b.size >= 3) / len(word)
        if held >= 0.75:
            scored.append((-held, -matcher.ratio(), choice))
    return [c for *_, c in sorted(scored)[:n]]


def _is_number(value: Any) -> bool:
    # YAML True/False are ints in Python; a boolean is never a number here.
    return isinstance(value, int | float) and not isinstance(value, bool)


def inline_mapping(value: Any) -> Any:
    """A quoted ``'{"data": "ddr"}'`` is read as the mapping it spells (else returned as is)."""
    if isinstance(value, str) and value.strip().startswith("{"):
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError:
            return value
        if isinstance(parsed, dict):
            return parsed
    return value


def split_multi(key: str, value: Any, separators: str = ";,", *, keep_trailing_blank: bool = False) -> list[Any]:
    """``'a; b; c'``, ``'a,b,c'`` or a YAML list -> items; any other scalar is one item.

    Real configs separate values with ``;`` (the vendor documents) or ``,``: both split unless
    ``separators`` says otherwise (one input's per-channel numbers may be written with commas).
    Blank items stay in place (their position matters for per-input values),
    except one left by a trailing separator. Per-input values keep that one too
    (``keep_trailing_blank``): only the input count tells whether ``'a;;'`` is three fields or two
    and a trailing separator (``trailing_separator_dropped``).
    """
    if isinstance(value, str):
        items: list[Any] = [part.strip() for part in re.split(f"[{re.escape(separators)}]", value)]
        if len(items) > 1 and items[-1] == "" and not keep_trailing_blank:
            items.pop()
        return items
    if isinstance(value, list):
        return [v.strip() if isinstance(v, str) else v for v in value]
    if isinstance(value, dict):
        fail(f"'{key}' must be a string (several values separated by ';') or a list, not a mapping")
    return [value]


def trailing_separator_dropped(values: list[Any], count: int | None = None) -> list[Any]:
    """Per-input ``values`` without the blank a trailing separator left (``'a;b;'``).

    With ``count`` (the number of inputs) the blank goes only when the values are one too many, so
    ``'a;;'`` for three inputs stays three fields (the last two unset) and a wrong count is told as written.
    """
    extra = len(values) > 1 and values[-1] is None and (count is None or len(values) == count + 1)
    return values[:-1] if extra else values


def as_text(key: str) -> Parser:
    def parse(value: Any) -> str:
        if isinstance(value, dict | list) or isinstance(value, bool):
            fail(f"'{key}' must be a single string, got {value!r}")
        return str(value).strip()

    return parse


def as_bool(key: str) -> Parser:
    def parse(value: Any) -> bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        fail(f"'{key}' must be True or False, got {value!r}")

    return parse


def separate_batch(value: Any) -> bool:
    """X5's ``separate_batch``: False is the only layout hbtools builds (one input holding the batch)."""
    if as_bool("separate_batch")(value):
        fail("separate_batch: True (on X5: one model input per batch item, each of batch 1) is not "
             "supported by hbtools; a .bin of input_batch N takes one input of batch N. Set "
             "separate_batch: False, or convert with input_batch: 1 and run the items one by one")
    return False


def as_int(key: str, lo: int, hi: int | None = None, *, zero_ok: bool = False) -> Parser:
    """Integer in [lo, hi]; ``zero_ok`` also admits 0 below ``lo`` (max_time_per_fc)."""
    allowed = f"{'0 or ' if zero_ok else ''}{lo}" + (f"-{hi}" if hi is not None else " or more")

    def parse(value: Any) -> int:
        number: int | None = None
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        elif isinstance(value, str) and re.fullmatch(r"[+-]?\d+", value.strip()):
            number = int(value)
        if number is None:
            fail(f"'{key}' must be an integer ({allowed}), got {value!r}")
        if (number == 0 and zero_ok) or (number >= lo and (hi is None or number <= hi)):
            return number
        fail(f"'{key}' is {number}, out of range; use {allowed}")

    return parse


def to_float(value: Any) -> float | None:
    if _is_number(value):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def as_percentile(key: str) -> Parser:
    def parse(value: Any) -> float:
        number = to_float(value)
        if number is None:
            fail(f"'{key}' must be a number in (0, 1], e.g. 0.99995, got {value!r}")
        if not 0.0 < number <= 1.0:
            fail(f"'{key}' is {number}, out of range; use a value in (0, 1], e.g. 0.99995")
        return number

    return parse


def choice(key: str, value: Any, choices: Sequence[str]) -> str:
    """Case-insensitive match against ``choices``; returns the canonical spelling."""
    text = str(value).strip() if isinstance(value, str | int | float) else None
    if text is not None and not isinstance(value, bool):
        for canonical in choices:
            if canonical.lower() == text.lower():
                return canonical
    hint = did_you_mean(str(value), choices)
    fail(f"'{key}' value {value!r} is not valid{hint}; use one of: {', '.join(choices)}")


def as_choice(key: str, choices: Sequence[str]) -> Parser:
    return lambda value: choice(key, value, choices)


def as_names(key: str, choices: Sequence[str] | None = None) -> Parser:
    """A multi-value list of names (node names, op types, ...), blanks dropped."""

    def parse(value: Any) -> list[str]:
        out: list[str] = []
        for item in split_multi(key, value):
            if is_unset(item):
                continue
            if isinstance(item, dict | list | bool):
                fail(f"'{key}' items must be plain names, got {item!r}")
            name = choice(key, item, choices) if choices else str(item)
            if name not in out:
                out.append(name)
        return out

    return parse


def as_per_input(key: str, item: Callable[[str, Any], Any], separators: str = ";,") -> Parser:
    """One value per model input; a blank item becomes None (for that input: unset)."""

    def parse(value: Any) -> list[Any]:
        items = split_multi(key, value, separators, keep_trailing_blank=True)
        return [None if is_unset(v) else item(key, v) for v in items]

    return parse


def choice_item(choices: Sequence[str]) -> Callable[[str, Any], str]:
    return lambda key, value: choice(key, value, choices)


def text_item(key: str, value: Any) -> str:
    if isinstance(value, dict | list | bool):
        fail(f"'{key}' items must be plain strings, got {value!r}")
    return str(value)


def as_file_name(key: str) -> Parser:
    """A plain file name: the artefacts must land inside working_dir, nowhere else."""
    text_of = as_text(key)

    def parse(value: Any) -> str:
        text = text_of(value)
        if not text or text in (".", "..") or any(c in text for c in "/\\\0"):
            fail(f"'{key}' value {value!r} is not a plain file name; give a name without '/', '\\', "
                 f"'..' or NUL (the artefacts are written into working_dir), e.g. 'mobilenet'")
        if len(text.encode()) > 200:
            fail(f"'{key}' is {len(text.encode())} bytes long; use a name under 200 bytes")
        if text.startswith(REPLACED_PREFIX):
            fail(f"'{key}' value {value!r} starts with '{REPLACED_PREFIX}', which names the files a run replaces "
                 f"while it commits its artefacts; use another name, e.g. {text[len(REPLACED_PREFIX):] or 'model'!r}")
        if file_stem(text) != text:
            # the pages describing the model (html, png) are named after it as a file stem: they would not share
            # the model's name
            fail(f"'{key}' value {value!r} holds characters a file name of the artefacts should not (spaces, "
                 f"'*', line breaks, ...) or starts or ends with '.'; use letters, digits, '.', '_' and '-', e.g. "
                 f"{file_stem(text) or 'model'!r}")
        return text

    return parse


def layout_item(key: str, value: Any) -> str:
    # Image inputs must be NCHW/NHWC (checked per input later); featuremap inputs
    # of another rank may name their own layout, so only the spelling is checked here.
    text = str(value).strip().upper()
    if not re.fullmatch(r"[A-Z]+", text):
        fail(f"'{key}' value {value!r} is not a layout; use NCHW or NHWC")
    return text


def shape_item(key: str, value: Any) -> list[int]:
    """``'1x3x224x224'`` -> [1, 3, 224, 224]; every dimension must be positive."""
    if isinstance(value, list) and value and all(_is_number(v) for v in value):
        dims_text = [str(v) for v in value]
    elif _is_number(value) or isinstance(value, str):
        dims_text = [d.strip() for d in str(value).lower().split("x")]
    else:
        fail(f"'{key}' value {value!r} is not a shape; write it like '1x3x224x224'")
    if not all(re.fullmatch(r"[+-]?\d+", d) for d in dims_text):
        fail(
            f"'{key}' value {value!r} is not a shape; write integers joined by 'x', "
            f"e.g. '1x3x224x224'"
        )
    dims = [int(d) for d in dims_text]
    if any(d <= 0 for d in dims):
        fail(
            f"'{key}' value {value!r} has a dimension <= 0; every dimension must be a "
            f"positive integer (set the real size of dynamic dimensions)"
        )
    return dims


def numbers_item(key: str, value: Any) -> list[float] | None:
    """Per-channel numbers: ``'123.675 116.28 103.53'``, a number, a list, or 'None'."""
    if isinstance(value, str) and value.strip().lower() == "none":
        return None
    if _is_number(value):
        value = [value]
    parts = value if isinstance(value, list) else re.split(r"[\s,]+", str(value).strip())
    numbers = [to_float(p) for p in parts]
    if not numbers or any(n is None for n in numbers):
        fail(
            f"'{key}' value {value!r} is not a list of numbers; write one number or one per "
            f"channel separated by spaces (e.g. '123.675 116.28 103.53'), or 'None'"
        )
    if not all(math.isfinite(n) for n in numbers):  # type: ignore[arg-type]
        fail(f"'{key}' value {value!r} is not finite; every number must be a real value (no inf or nan)")
    return numbers  # type: ignore[return-value]


def as_per_channel(key: str, *, nonzero: bool = False) -> Parser:
    """Per-input per-channel numbers, all finite (and not 0 with ``nonzero``: a scale of 0
    would turn every input into zeros and calibrate every threshold to 0).

    A YAML list of plain numbers is read as ONE input's per-channel values (the
    common way to write ``[123.675, 116.28, 103.53]``); several inputs are written
    ``'a b c; d e f'`` or as a list of such strings.
    """

    def item(key: str, value: Any) -> list[float] | None:
        numbers = numbers_item(key, value)
        if nonzero and numbers is not None and 0.0 in numbers:
            fail(f"'{key}' value {value!r} contains 0; a scale of 0 makes the input all zeros, "
                 f"use the real scale (e.g. 0.017 for 1/58.8) or leave it out")
        return numbers

    per_input = as_per_input(key, item, separators=";")  # '123.68, 116.779, 103.939' is one input's

    def parse(value: Any) -> list[list[float] | None]:
        if isinstance(value, list) and value and all(_is_number(v) for v in value):
            return [item(key, value)]  # type: ignore[list-item]
        return per_input(value)

    return parse


def as_shapes(key: str) -> Parser:
    """Per-input shapes; a YAML list of plain integers is one input's shape."""
    per_input = as_per_input(key, shape_item)

    def parse(value: Any) -> list[list[int] | None]:
        if isinstance(value, list) and value and all(_is_number(v) for v in value):
            return [shape_item(key, value)]
        if isinstance(value, str) and "," in value and "x" not in value.lower():
            fail(f"'{key}' value {value!r} is not a shape; join the dimensions with 'x' (e.g. '1x3x224x224') "
                 f"and separate the shapes of several inputs with ';'")
        return per_input(value)

    return parse
