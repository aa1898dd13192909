"""Reports: a results table printed as markdown and written as JSON (plus the PNG of :mod:`.plot`).

The JSON holds ``{"title", "meta", "columns", "rows"}``; ``meta`` is :func:`run_metadata` (device,
versions, timing methods, the bytes convention, date, command line) plus the bench's own fields.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from bench.common.device import device_name, l2_cache_bytes
from bench.common.plot import DEFAULT_PLOT_SERIES, plot_rows
from bench.common.rows import Column, format_value
from bench.common.timing import timing_methods_used

BYTES_CONVENTION = (
    "bytes moved = bytes read + bytes written (each input byte once, each output byte once); "
    "the copy baseline is dst.copy_(src) of uint8 tensors moving the same total, i.e. it reads "
    "nbytes/2 and writes nbytes/2; GB/s = 1e9 bytes per second; MB = 1e6 bytes"
)


def _norm_columns(columns: Sequence[Column | str]) -> list[Column]:
    out: list[Column] = []
    for c in columns:
        if isinstance(c, str):
            out.append((c, c))
        else:
            key, header = c
            out.append((str(key), str(header)))
    return out


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[Column | str]) -> str:
    """Render ``rows`` as a ``tabulate`` table (GitHub-markdown style) over ``columns``."""
    from tabulate import tabulate

    cols = _norm_columns(columns)
    body = [[format_value(k, row.get(k)) for k, _ in cols] for row in rows]
    return tabulate(body, headers=[h for _, h in cols], tablefmt="github", disable_numparse=True)


def run_metadata(extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Context for a results file: device, versions, timing methods, date, command line."""
    methods = timing_methods_used()
    meta: dict[str, Any] = {
        "device": device_name(),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "python_version": platform.python_version(),
        "timing_method": "+".join(sorted(methods)) if methods else "none",
        "timing_methods_used": methods,
        "timing_note": (
            "median of several samples; each sample = CUDA-event time of CUDA-graph replays "
            "(cuda_graph) or of eager calls (cuda_events) / calls; inputs rotated beyond L2"
        ),
        "bytes_convention": BYTES_CONVENTION,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "argv": list(sys.argv),
        "hostname": platform.node(),
    }
    if torch.cuda.is_available():
        try:
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            meta["sm_count"] = props.multi_processor_count
            meta["capability"] = f"{props.major}.{props.minor}"
            meta["l2_bytes"] = l2_cache_bytes()
        except RuntimeError:
            pass
    if extra:
        meta.update(extra)
    return meta


def _jsonable(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, (torch.dtype, torch.device, Path)):
        return str(value)
    if hasattr(value, "item") and callable(value.item):
        try:
            return _jsonable(value.item())
        except (RuntimeError, ValueError):
            pass
    return str(value)


def report(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[Column | str],
    title: str,
    json_path: str | os.PathLike[str] | None = None,
    png_path: str | os.PathLike[str] | None = None,
    *,
    label_keys: Sequence[str] = ("layout", "shape", "G"),
    plot_series: Sequence[tuple[str, str]] = DEFAULT_PLOT_SERIES,
    panel_key: str | None = "layout",
    meta: Mapping[str, Any] | None = None,
    print_table: bool = True,
) -> str:
    """Print a table of ``rows`` and write it as JSON and as a PNG bar chart.

    Args:
        rows: result rows (see :func:`make_row`).
        columns: ``(key, header)`` pairs (or keys) shown in the table, in order.
        title: table/plot title.
        json_path: where to write ``{"title", "meta", "columns", "rows"}``; ``None``: no JSON.
        png_path: where to write the plot (achieved GB/s per row, one bar per series);
            ``None``: no plot.
        label_keys: row keys that make up a row's x-axis label.
        plot_series: ``(row key, legend name)`` bar series; series with no value are dropped.
        panel_key: one plot panel per distinct value of this row key (``None``: one panel).
        meta: extra metadata merged into :func:`run_metadata` (e.g. baseline names).
        print_table: print the title and the table to stdout.

    Returns:
        The table text.
    """
    table = format_table(rows, columns)
    if print_table:
        print(f"\n## {title}\n")
        print(table, flush=True)
    if json_path is not None:
        json_path = Path(json_path)
        json_path.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "title": title,
            "meta": run_metadata(meta),
            "columns": [{"key": k, "header": h} for k, h in _norm_columns(columns)],
            "rows": [_jsonable(dict(r)) for r in rows],
        }
        json_path.write_text(json.dumps(_jsonable(doc), indent=2) + "\n")
    if png_path is not None:
        plot_rows(rows, title, Path(png_path), label_keys, plot_series, panel_key)
    return table
