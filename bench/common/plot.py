"""The PNG bar chart of a results table: achieved GB/s per row, one bar per series."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.common.rows import format_value, is_positive

DEFAULT_PLOT_SERIES: tuple[tuple[str, str], ...] = (
    ("gbps", "ours"),
    ("copy_gbps", "copy (same bytes)"),
    ("baseline_gbps", "baseline"),
)


def _row_label(row: Mapping[str, Any], label_keys: Sequence[str]) -> str:
    parts = []
    for k in label_keys:
        v = row.get(k)
        if v is None or v == "" or v == "-":
            continue
        text = format_value(k, v)
        parts.append(f"{k}={text}" if k in ("G",) else text)
    return " ".join(parts)


def plot_rows(
    rows: Sequence[Mapping[str, Any]],
    title: str,
    png_path: Path,
    label_keys: Sequence[str],
    plot_series: Sequence[tuple[str, str]],
    panel_key: str | None = None,
) -> None:
    """Grouped bars of achieved GB/s per row, one panel per distinct ``row[panel_key]``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = [(k, name) for k, name in plot_series if any(is_positive(r.get(k)) for r in rows)]
    panels: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        panels.setdefault(str(r.get(panel_key, "")) if panel_key else "", []).append(r)
    if not panels:
        panels[""] = []
    widest = max(len(p) for p in panels.values())
    ns = max(len(series), 1)
    width = min(max(8.0, 0.22 * widest * ns + 2.5), 26.0)
    fig, axes = plt.subplots(len(panels), 1, figsize=(width, 4.2 * len(panels)), squeeze=False)
    top = max((float(r[k]) for r in rows for k, _ in series if is_positive(r.get(k))), default=1.0)
    bar_w = 0.8 / ns
    for ax, (panel, prow) in zip(axes[:, 0], panels.items(), strict=True):
        for i, (key, name) in enumerate(series):
            xs = [j + (i - (ns - 1) / 2) * bar_w for j in range(len(prow))]
            ys = [float(r[key]) if is_positive(r.get(key)) else 0.0 for r in prow]
            ax.bar(xs, ys, width=bar_w, label=name)
        for j, r in enumerate(prow):
            if str(r.get("status", "ok")).upper().startswith("FAIL"):
                ax.text(j, top * 0.02, "FAIL", color="red", ha="center", va="bottom", rotation=90, fontsize=8)
        ax.set_xticks(list(range(len(prow))))
        keys = [k for k in label_keys if k != panel_key]
        ax.set_xticklabels([_row_label(r, keys) for r in prow], rotation=35, ha="right", fontsize=7)
        ax.set_xlim(-0.6, max(widest, 1) - 0.4)
        ax.set_ylabel("GB/s (read + written)")
        ax.set_title(f"{title}: {panel}" if panel else title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
        ax.set_ylim(0, top * 1.2)
        if series:
            ax.legend(loc="upper left", ncols=len(series), fontsize=8)
    fig.tight_layout()
    png_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
