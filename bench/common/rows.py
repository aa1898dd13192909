"""Result rows: the bandwidth math, :func:`make_row`, cell formatting and the shared columns.

**Bytes moved = bytes read + bytes written**, counting each input byte once and each output byte
once (the fewest bytes any implementation must move). **GB/s** are decimal: ``1 GB = 1e9 bytes``;
**MB** in tables are ``1e6`` bytes. A row is a plain dict; its ``status`` is ``"ok"`` or starts
with ``"FAIL"`` (:func:`is_fail`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

Column = tuple[str, str]
"""``(row key, table header)``; a plain string ``key`` is shorthand for ``(key, key)``."""

#: Table columns every kernel bench shows, as (row key, header): bytes moved, our time and rate, the
#: copy of the same bytes and the ratio; then the torchao baseline and the row status.
RATE_COLUMNS: list[tuple[str, str]] = [
    ("mb_moved", "MB moved"),
    ("us", "our us"),
    ("gbps", "our GB/s"),
    ("copy_gbps", "copy GB/s"),
    ("ratio_to_copy", "ratio to copy"),
]
BASELINE_COLUMNS: list[tuple[str, str]] = [
    ("baseline_us", "torchao us"),
    ("speedup", "speedup vs torchao"),
    ("status", "status"),
]
#: Plot series (row key, legend) every kernel bench draws first.
RATE_SERIES: tuple[tuple[str, str], ...] = (("gbps", "ours"), ("copy_gbps", "copy (same bytes)"))


def gbps(nbytes: float, us: float) -> float:
    """Achieved bandwidth in GB/s (1e9 bytes per second) for ``nbytes`` moved in ``us`` microseconds."""
    if us is None or not us > 0:
        raise ValueError(f"gbps: time must be a positive number of microseconds, got {us!r}")
    return float(nbytes) / (float(us) * 1e3)


def is_positive(x: float | None) -> bool:
    """Whether ``x`` is a finite number > 0 (a usable time or rate)."""
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def make_row(
    *,
    nbytes: int,
    us: float | None,
    copy_us: float | None,
    baseline_us: float | None = None,
    status: str = "ok",
    **fields: Any,
) -> dict[str, Any]:
    """Build one result row (a plain dict) with the derived bandwidth columns.

    Args:
        nbytes: bytes moved (read + written).
        us: our median microseconds (``None`` if it failed or was not timed).
        copy_us: the copy baseline's microseconds for the same ``nbytes``.
        baseline_us: another implementation's microseconds (torchao, say), or ``None``.
        status: ``"ok"``, or a short failure description starting with ``"FAIL"``.
        **fields: descriptive columns (layout, shape, G, ...), kept first and unchanged.

    Returns:
        ``fields`` plus ``nbytes``, ``mb_moved``, ``us``, ``gbps``, ``copy_us``, ``copy_gbps``,
        ``ratio_to_copy`` (= copy_us / us = our GB/s / copy GB/s), ``baseline_us``,
        ``baseline_gbps``, ``speedup`` (= baseline_us / us) and ``status``; values that cannot
        be computed are ``None``.
    """
    row: dict[str, Any] = dict(fields)
    row["nbytes"] = int(nbytes)
    row["mb_moved"] = nbytes / 1e6
    row["us"] = us if is_positive(us) else None
    row["gbps"] = gbps(nbytes, us) if is_positive(us) else None
    row["copy_us"] = copy_us if is_positive(copy_us) else None
    row["copy_gbps"] = gbps(nbytes, copy_us) if is_positive(copy_us) else None
    row["ratio_to_copy"] = copy_us / us if is_positive(us) and is_positive(copy_us) else None
    row["baseline_us"] = baseline_us if is_positive(baseline_us) else None
    row["baseline_gbps"] = gbps(nbytes, baseline_us) if is_positive(baseline_us) else None
    row["speedup"] = baseline_us / us if is_positive(us) and is_positive(baseline_us) else None
    row["status"] = status
    return row


def format_value(key: str, value: Any) -> str:
    """Table text for one cell: ``None`` -> ``n/a``; numbers by what the key measures."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return "n/a"
        if "speedup" in key:
            return f"{value:.2f}x"
        if "ratio" in key:
            return f"{value:.3f}"
        if key.startswith("mb") or key.endswith("_mb"):
            return f"{value:.2f}"
        if "gbps" in key:
            return f"{value:.1f}"
        return f"{value:.2f}" if abs(value) < 1000 else f"{value:.1f}"
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(str(v) for v in value) + ")"
    return str(value)


def fmt_opt(value: float | None, spec: str) -> str:
    """``format(value, spec)``, or ``"n/a"`` for ``None``."""
    return "n/a" if value is None else format(value, spec)


def is_fail(row: Mapping[str, Any]) -> bool:
    """Whether a result row's status is a failure (starts with ``FAIL``)."""
    return str(row.get("status", "ok")).startswith("FAIL")
