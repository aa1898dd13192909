"""Shared benchmark harness for the cute-kernels data-movement kernels.

Used by the ``bench_*`` scripts, the tuner (``bench.tune``) and ``demo``. One module per concern:

* :mod:`.device` -- CUDA availability (:func:`require_cuda`, :func:`cuda_or_none`), the L2 size;
* :mod:`.timing` -- :func:`time_cuda` / :func:`time_cuda_detailed` and
  :func:`make_rotating_inputs` (inputs rotated past the L2);
* :mod:`.baselines` -- the device copy baseline (:func:`copy_baseline_best`,
  :func:`measure_copy`) and the ``torch.compile`` recompile limit;
* :mod:`.rows` -- result rows (:func:`make_row`, :func:`gbps`), cell formatting, shared columns;
* :mod:`.report` -- the table, the JSON file and the run metadata (:func:`report`);
* :mod:`.plot` -- the PNG bar chart of a report;
* :mod:`.rowlog` -- :class:`RowLog` (one row's status, notes, timings), :func:`diff_bytes`,
  :func:`progress_row` and :func:`finish`;
* :mod:`.cli` -- the shared options, the results folder and :func:`progress`;
* :mod:`.groups` -- group-size generators (:func:`skewed_group_ends`, :func:`block_group_ends`).
* :mod:`.tuning` -- the tuner's sweep, ranking and table writing; :mod:`.tuned` -- the tuned table
  (not re-exported: only ``bench.tune`` uses them);
* :mod:`.power` -- a call in a sustained loop with the SM clock and board power it ran at
  (not re-exported: only ``bench_grouped_gemm --power`` uses it).

Every public name is re-exported here, so ``from bench.common import X`` works as before.

Conventions
-----------
* **Bytes moved = bytes read + bytes written**, counting each input byte once and each output
  byte once (the fewest bytes any implementation must move).
* **Copy baseline**: a device-to-device ``dst.copy_(src)`` of uint8 tensors that moves the same
  total number of bytes, i.e. it reads ``nbytes / 2`` and writes ``nbytes / 2``. It is timed with
  the same timer in the same run, so ``ratio to copy = copy_us / our_us`` is the fraction of the
  achievable memory bandwidth that a kernel reaches.
* **GB/s** are decimal: ``1 GB = 1e9 bytes``; **MB** in tables are ``1e6`` bytes.
* **Timing**: :func:`time_cuda` warms up, captures the calls into a CUDA graph and times graph
  replays with CUDA events (falling back to plain CUDA-event timing of eager calls when capture
  fails; which one was used is recorded). Each sample averages many calls; the result is the
  median of several samples, in microseconds per call. When the data fits in L2, callers rotate
  among several copies of the inputs (:func:`make_rotating_inputs`) so that every call reads
  from DRAM, as it does in a training step.

Everything here imports on a CPU-only machine; functions that need a GPU raise
:class:`CudaUnavailableError` with a clear message.
"""

from __future__ import annotations

from bench.common.baselines import (
    COPY_ALIGN,
    SUSPECT_BYTES,
    SUSPECT_RATIO,
    copy_baseline_best,
    copy_baseline_detailed,
    copy_baseline_us,
    copy_bytes_each_way,
    copy_suspect_note,
    measure_copy,
    raise_recompile_limit,
)
from bench.common.cli import (
    RESULTS_DIR,
    add_bench_args,
    add_common_args,
    make_parser,
    output_paths,
    progress,
    resolve_out_dir,
    timing_kwargs,
)
from bench.common.device import (
    DEFAULT_L2_BYTES,
    CudaUnavailableError,
    cuda_or_none,
    l2_cache_bytes,
    require_cuda,
)
from bench.common.groups import block_group_ends, skewed_group_ends, skewed_group_sizes
from bench.common.plot import DEFAULT_PLOT_SERIES
from bench.common.report import BYTES_CONVENTION, format_table, report, run_metadata
from bench.common.rowlog import RowLog, diff_bytes, finish, progress_row, short_error
from bench.common.rows import (
    BASELINE_COLUMNS,
    RATE_COLUMNS,
    RATE_SERIES,
    Column,
    fmt_opt,
    format_value,
    gbps,
    is_fail,
    make_row,
)
from bench.common.timing import (
    DEFAULT_MEMORY_CAP_BYTES,
    EVENTS_METHOD,
    GRAPH_METHOD,
    Timing,
    make_rotating_inputs,
    reset_timing_methods,
    tensor_nbytes,
    time_cuda,
    time_cuda_detailed,
    timing_methods_used,
)

__all__ = [
    "BASELINE_COLUMNS",
    "BYTES_CONVENTION",
    "COPY_ALIGN",
    "DEFAULT_L2_BYTES",
    "DEFAULT_MEMORY_CAP_BYTES",
    "DEFAULT_PLOT_SERIES",
    "EVENTS_METHOD",
    "GRAPH_METHOD",
    "RATE_COLUMNS",
    "RATE_SERIES",
    "RESULTS_DIR",
    "SUSPECT_BYTES",
    "SUSPECT_RATIO",
    "Column",
    "CudaUnavailableError",
    "RowLog",
    "Timing",
    "add_bench_args",
    "add_common_args",
    "block_group_ends",
    "copy_baseline_best",
    "copy_baseline_detailed",
    "copy_baseline_us",
    "copy_bytes_each_way",
    "copy_suspect_note",
    "cuda_or_none",
    "diff_bytes",
    "finish",
    "fmt_opt",
    "format_table",
    "format_value",
    "gbps",
    "is_fail",
    "l2_cache_bytes",
    "make_parser",
    "make_rotating_inputs",
    "make_row",
    "measure_copy",
    "output_paths",
    "progress",
    "progress_row",
    "raise_recompile_limit",
    "report",
    "require_cuda",
    "reset_timing_methods",
    "resolve_out_dir",
    "run_metadata",
    "short_error",
    "skewed_group_ends",
    "skewed_group_sizes",
    "tensor_nbytes",
    "time_cuda",
    "time_cuda_detailed",
    "timing_kwargs",
    "timing_methods_used",
]
