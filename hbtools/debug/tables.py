"""Sensitivity tables: the console layout of the vendor tool, plain text and CSV files."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence


def console_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """``===title===``, the header, a rule, then one left-aligned row per node.

    Every column is as wide as its longest cell plus two spaces; the rules span all
    columns and the title is centred in the top rule.
    """
    widths = [max(len(str(c)) for c in col) + 2 for col in zip(headers, *rows, strict=True)]
    total = sum(widths)
    left = max(total - len(title), 0) // 2
    lines = ["=" * left + title + "=" * max(total - len(title) - left, 0)]
    lines.append(_line(headers, widths))
    lines.append("-" * total)
    lines.extend(_line(r, widths) for r in rows)
    return "\n".join(lines)


def _line(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()


def csv_text(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(headers)
    writer.writerows(rows)
    return buf.getvalue()
