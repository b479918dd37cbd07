"""Number formatters shared by the stages' summaries, the CSV plots and the reports.

Each keeps one output format exactly (DVC plots, reports and summary lines compare them byte for
byte); the name says which:

    four_decimals(0.5) -> '0.5000'     compare's tables
    p_value(0.0004)    -> '0.0004'     compare's p-values
    csv_cell(0.1234567) -> '0.123457'  plots/*.csv cells
    table_cell(None)   -> '-'          reprocheck's Markdown table
    four_digits(1.23456) -> '1.235'    a stage's one-line summary
"""

from __future__ import annotations

import math
import unicodedata
from typing import Any


def four_decimals(x: float | None, signed: bool = False) -> str:
    """`x` with 4 decimals (a sign always when `signed`), "n/a" for None.

    >>> four_decimals(0.5), four_decimals(-0.01234, signed=True), four_decimals(0.5, signed=True)
    ('0.5000', '-0.0123', '+0.5000')
    >>> four_decimals(None)
    'n/a'
    """
    if x is None:
        return "n/a"
    return f"{x:+.4f}" if signed else f"{x:.4f}"


def p_value(p: float | None) -> str:
    """A p-value: 4 decimals, 3 significant digits below 0.001, "" for None.

    >>> p_value(0.04321), p_value(0.000123), p_value(None)
    ('0.0432', '0.000123', '')
    """
    if p is None:
        return ""
    return f"{p:.3g}" if p < 0.001 else f"{p:.4f}"


def csv_cell(value: Any) -> str:
    """A CSV cell: floats with 6 significant digits, "" for None or NaN, anything else as str().

    >>> [csv_cell(v) for v in (0.1234567, 3, None, float("nan"), 1e-9, "64+")]
    ['0.123457', '3', '', '', '1e-09', '64+']
    """
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def table_cell(value: Any) -> str:
    """A table cell: floats with 6 significant digits, "-" for None, anything else as str().

    >>> [table_cell(v) for v in (0.1234567, 7, None, "ok")]
    ['0.123457', '7', '-', 'ok']
    """
    return f"{value:.6g}" if isinstance(value, float) else "-" if value is None else str(value)


def four_digits(value: float | None) -> str:
    """4 significant digits, "n/a" for None.

    >>> four_digits(1.23456), four_digits(1234567.0), four_digits(None)
    ('1.235', '1.235e+06', 'n/a')
    """
    return "n/a" if value is None else f"{value:.4g}"


def printable(text: str) -> str:
    """`text` with control characters shown as escapes (newline and tab kept): echoed to a terminal,
    it cannot clear the screen, move the cursor or set the window title. Invalid UTF-8 from the
    command line (lone surrogates) is shown as escapes too.

    >>> print(printable("dose\\x1b[2J 5\\tmg\\x07\\n"))
    dose\\x1b[2J 5	mg\\x07
    <BLANKLINE>
    """
    return "".join(ch if ch in "\n\t" or unicodedata.category(ch) not in ("Cc", "Cs")
                   else ch.encode("unicode_escape", "backslashreplace").decode("ascii") for ch in text)
