"""CPU-only tests of the benchmark harness's pure parts (bench/common/, bench/bench_swizzle.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from bench import common
from bench.bench_swizzle import (
    COLUMNS,
    GOAL_MIN_BYTES,
    SwizzleCase,
    build_cases,
    goal_summary,
)
from bench.common import baselines, cli, rowlog, timing
from bench.common.groups import skewed_group_sizes
from bench.common.rowlog import diff_bytes

# ------------------------------------------------------------------------------------------
# bandwidth math and rows
# ------------------------------------------------------------------------------------------


def test_gbps_math() -> None:
    # 1000 bytes in 1 us = 1e9 B/s = 1 GB/s; 1 GB in 1 s = 1 GB/s.
    assert common.gbps(1000, 1.0) == pytest.approx(1.0)
    assert common.gbps(1e9, 1e6) == pytest.approx(1.0)
    # 64 MiB read + 64 MiB written in 40 us
    assert common.gbps(2 * 64 * 2**20, 40.0) == pytest.approx(2 * 64 * 2**20 / 40e-6 / 1e9)


@pytest.mark.parametrize("bad", [0.0, -1.0, None, float("nan")])
def test_gbps_rejects_nonpositive_time(bad: float | None) -> None:
    with pytest.raises(ValueError, match="positive"):
        common.gbps(1000, bad)  # type: ignore[arg-type]


def test_make_row_derived_columns() -> None:
    nbytes = 100_000_000
    row = common.make_row(
        layout="2d", shape=(4, 5), G="-", nbytes=nbytes, us=50.0, copy_us=40.0, baseline_us=100.0
    )
    assert list(row)[:3] == ["layout", "shape", "G"]
    assert row["mb_moved"] == pytest.approx(100.0)
    assert row["gbps"] == pytest.approx(2000.0)
    assert row["copy_gbps"] == pytest.approx(2500.0)
    assert row["ratio_to_copy"] == pytest.approx(0.8)
    assert row["ratio_to_copy"] == pytest.approx(row["gbps"] / row["copy_gbps"])
    assert row["baseline_gbps"] == pytest.approx(1000.0)
    assert row["speedup"] == pytest.approx(2.0)
    assert row["status"] == "ok"


def test_make_row_missing_times_are_none() -> None:
    row = common.make_row(nbytes=10, us=None, copy_us=1.0, baseline_us=None, status="FAIL: x")
    assert row["us"] is None and row["gbps"] is None and row["ratio_to_copy"] is None
    assert row["baseline_us"] is None and row["speedup"] is None
    assert row["copy_gbps"] == pytest.approx(0.01)
    assert row["status"] == "FAIL: x"


def test_format_value() -> None:
    assert common.format_value("us", None) == "n/a"
    assert common.format_value("speedup", 2.345) == "2.35x"
    assert common.format_value("ratio_to_copy", 0.81234) == "0.812"
    assert common.format_value("gbps", 2912.44) == "2912.4"
    assert common.format_value("mb_moved", 58.72) == "58.72"
    assert common.format_value("shape", (8, 8192, 160)) == "(8, 8192, 160)"
    assert common.format_value("us", float("inf")) == "n/a"
    assert common.format_value("G", 8) == "8"


# ------------------------------------------------------------------------------------------
# report: table, JSON, PNG
# ------------------------------------------------------------------------------------------


def _fake_rows() -> list[dict]:
    return [
        common.make_row(
            layout="2d",
            shape=(131072, 224),
            G="-",
            nbytes=58_720_256,
            us=22.0,
            copy_us=20.0,
            baseline_us=40.0,
        ),
        common.make_row(
            layout="M-groups",
            shape=(131072, 160),
            G=8,
            nbytes=42_000_000,
            us=None,
            copy_us=15.0,
            baseline_us=None,
            status="FAIL: 3 of 10 bytes differ from reference",
        ),
        common.make_row(layout="3d", shape=(32, 8192, 160), G="-", nbytes=83_886_080, us=30.0, copy_us=28.0),
    ]


def test_report_writes_table_json_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = _fake_rows()
    json_path = tmp_path / "sub" / "bench.json"
    png_path = tmp_path / "sub" / "bench.png"
    table = common.report(rows, COLUMNS, "fake swizzle", json_path, png_path, meta={"benchmark": "fake"})

    printed = capsys.readouterr().out
    assert "fake swizzle" in printed and table in printed
    for header in (
        "layout",
        "shape",
        "MB moved",
        "our us",
        "our GB/s",
        "copy GB/s",
        "ratio to copy",
        "torchao us",
        "speedup vs torchao",
    ):
        assert header in table
    assert "(131072, 224)" in table
    assert "n/a" in table
    assert "FAIL" in table
    assert "0.909" in table  # 20/22
    assert "1.82x" in table  # 40/22

    doc = json.loads(json_path.read_text())
    assert doc["title"] == "fake swizzle"
    meta = doc["meta"]
    for key in ("device", "torch_version", "timing_method", "date", "bytes_convention"):
        assert key in meta
    assert meta["torch_version"] == torch.__version__
    assert meta["benchmark"] == "fake"
    if not torch.cuda.is_available():
        assert "cpu" in meta["device"]
    assert [c["header"] for c in doc["columns"]] == [h for _, h in COLUMNS]
    assert len(doc["rows"]) == 3
    assert doc["rows"][0]["shape"] == [131072, 224]
    assert doc["rows"][1]["us"] is None
    assert doc["rows"][0]["ratio_to_copy"] == pytest.approx(20.0 / 22.0)

    data = png_path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 1000


def test_report_without_files(tmp_path: Path) -> None:
    table = common.report(_fake_rows(), ["layout", ("us", "our us")], "t", None, None, print_table=False)
    assert "our us" in table
    assert list(tmp_path.iterdir()) == []


def test_report_nonfinite_values_become_null(tmp_path: Path) -> None:
    rows = [{"layout": "x", "gbps": float("nan"), "obj": torch.float8_e8m0fnu}]
    path = tmp_path / "r.json"
    common.report(rows, ["layout", "gbps"], "t", path, None, print_table=False)
    doc = json.loads(path.read_text())  # strict JSON: no NaN tokens
    assert doc["rows"][0]["gbps"] is None
    assert doc["rows"][0]["obj"] == "torch.float8_e8m0fnu"


def test_run_metadata_records_timing_methods() -> None:
    common.reset_timing_methods()
    assert common.run_metadata()["timing_method"] == "none"
    timing._record_method(timing.GRAPH_METHOD)
    timing._record_method(timing.GRAPH_METHOD)
    timing._record_method(timing.EVENTS_METHOD)
    meta = common.run_metadata({"extra": 1})
    assert meta["timing_methods_used"] == {"cuda_graph": 2, "cuda_events": 1}
    assert meta["timing_method"] == "cuda_events+cuda_graph"
    assert meta["extra"] == 1
    common.reset_timing_methods()


# ------------------------------------------------------------------------------------------
# argparse helper and output paths
# ------------------------------------------------------------------------------------------


def test_parser_defaults() -> None:
    args = common.make_parser("x").parse_args([])
    assert args.out is None and args.quick is False
    assert args.iters == 100 and args.warmup == 10 and args.reps == 7 and args.use_graph is True
    assert common.timing_kwargs(args) == {"warmup": 10, "iters": 100, "reps": 7, "use_graph": True}


def test_parser_options(tmp_path: Path) -> None:
    args = common.make_parser("x").parse_args(
        ["--out", str(tmp_path / "o"), "--quick", "--iters", "7"]
        + ["--reps", "3", "--warmup", "2", "--no-graph"]
    )
    assert args.out == tmp_path / "o" and args.quick and args.iters == 7
    assert common.timing_kwargs(args) == {"warmup": 2, "iters": 7, "reps": 3, "use_graph": False}
    json_path, png_path = common.output_paths(args, "swizzle")
    assert json_path == tmp_path / "o" / "swizzle.json"
    assert png_path == tmp_path / "o" / "swizzle.png"
    assert (tmp_path / "o").is_dir()


def test_parts_arg(capsys: pytest.CaptureFixture[str]) -> None:
    parser = common.make_parser("x")
    cli.add_parts_arg(parser, ("gemm", "module"))
    assert parser.parse_args([]).parts == {"gemm", "module"}
    assert parser.parse_args(["--parts", "module, gemm"]).parts == {"gemm", "module"}
    assert parser.parse_args(["--parts", "module"]).parts == {"module"}
    for bad in ("modules", ",", "gemm,x"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--parts", bad])
    assert "choose from gemm, module" in capsys.readouterr().err


def test_default_results_dir_is_bench_results() -> None:
    assert common.RESULTS_DIR == cli.RESULTS_DIR == Path(cli.__file__).resolve().parents[1] / "results"
    assert common.RESULTS_DIR.name == "results" and common.RESULTS_DIR.parent.name == "bench"


def test_add_common_args_to_existing_parser() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--mine", type=int, default=3)
    common.add_common_args(parser)
    args = parser.parse_args(["--mine", "4", "--quick"])
    assert args.mine == 4 and args.quick


# ------------------------------------------------------------------------------------------
# rotating inputs (pure logic, CPU tensors) and CUDA requirements
# ------------------------------------------------------------------------------------------


def test_make_rotating_inputs_counts_sets() -> None:
    calls = []

    def make() -> tuple[torch.Tensor]:
        calls.append(1)
        return (torch.empty(1000, dtype=torch.uint8),)

    sets = common.make_rotating_inputs(make, min_bytes=10_500, memory_cap_bytes=1 << 30)
    assert len(sets) == 11 == len(calls)
    assert len({s[0].data_ptr() for s in sets}) == 11
    # bytes_per_set counts outputs too
    assert (
        len(common.make_rotating_inputs(make, min_bytes=10_000, bytes_per_set=2000, memory_cap_bytes=1 << 30))
        == 5
    )
    # a set larger than min_bytes: one set
    assert len(common.make_rotating_inputs(make, min_bytes=10, memory_cap_bytes=1 << 30)) == 1
    # memory cap and max_sets bound the count
    assert len(common.make_rotating_inputs(make, min_bytes=10**9, memory_cap_bytes=3500)) == 3
    assert len(common.make_rotating_inputs(make, min_bytes=10**9, memory_cap_bytes=1 << 30, max_sets=4)) == 4
    # a cap smaller than one set still gives one set
    assert len(common.make_rotating_inputs(make, min_bytes=10**9, memory_cap_bytes=10)) == 1


def test_make_rotating_inputs_requires_tuple() -> None:
    with pytest.raises(TypeError, match="tuple"):
        common.make_rotating_inputs(lambda: torch.empty(3), min_bytes=1)  # type: ignore[arg-type,return-value]


def test_tensor_nbytes() -> None:
    t = torch.empty(10, dtype=torch.float32)
    assert common.tensor_nbytes((t, [t, None], {"a": torch.empty(3, dtype=torch.uint8)}, 5)) == 83


def test_l2_default_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert common.l2_cache_bytes() == common.DEFAULT_L2_BYTES


def test_cuda_functions_raise_clear_error_without_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(common.CudaUnavailableError, match="needs a CUDA GPU"):
        common.require_cuda("bench_x")
    with pytest.raises(common.CudaUnavailableError, match="time_cuda"):
        common.time_cuda(lambda: None)
    with pytest.raises(common.CudaUnavailableError, match="copy_baseline_us"):
        common.copy_baseline_us(1 << 20)
    assert issubclass(common.CudaUnavailableError, RuntimeError)


def test_median() -> None:
    assert timing._median([3.0, 1.0, 2.0]) == 2.0
    assert timing._median([4.0, 1.0, 2.0, 3.0]) == 2.5


def test_run_calls_keeps_one_output_per_set() -> None:
    sets = [(1,), (2,), (3,)]
    ring: list = [None] * 3
    timing._run_calls(lambda x: x * 10, sets, ring, 2, 4)  # indices 2, 0, 1, 2
    assert ring == [10, 20, 30]


# ------------------------------------------------------------------------------------------
# bench_swizzle's pure parts
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("total,groups", [(16384, 8), (65536, 64), (512, 8), (7, 8), (0, 4)])
def test_skewed_group_sizes(total: int, groups: int) -> None:
    sizes = skewed_group_sizes(total, groups)
    assert len(sizes) == groups
    assert sum(sizes) == total
    assert all(s >= 0 for s in sizes)
    assert sizes == skewed_group_sizes(total, groups)  # deterministic
    if total >= 128 * groups:
        assert any(s % 128 for s in sizes)  # unaligned
        assert max(sizes) > 2 * min(sizes)  # skewed


def test_case_output_shapes() -> None:
    assert SwizzleCase("2d", (131001, 226)).output_shape == (131072, 228)
    assert SwizzleCase("M-groups", (131072, 160), groups=8).output_shape == (131072 + 1024, 160)
    assert SwizzleCase("K-groups", (7168, 4096), groups=8).output_shape == (7168, 4096 + 32)
    assert SwizzleCase("K-groups", (100, 10), groups=2).output_shape == (128, 18)
    assert SwizzleCase("3d", (8, 5000, 250)).output_shape == (8, 5120, 252)
    c = SwizzleCase("M-groups", (1000, 7), groups=3)
    assert c.input_bytes == 7000 and c.output_bytes == (1000 + 384) * 8
    assert c.nbytes_moved == 7000 + 1384 * 8
    offs = c.group_end_offsets()
    assert len(offs) == 3 and offs[-1] == 1000 and offs == sorted(offs)
    k = SwizzleCase("K-groups", (2048, 512), groups=8)
    assert k.group_end_offsets()[-1] == 512
    assert SwizzleCase("3d", (2, 3, 4)).group_end_offsets() == []


def test_build_cases() -> None:
    quick = build_cases(quick=True)
    assert 3 <= len(quick) <= 5
    assert {c.layout for c in quick} == {"2d", "M-groups", "K-groups", "3d"}
    assert all(c.input_bytes >= GOAL_MIN_BYTES for c in quick)
    full = build_cases()
    assert len(full) > len(quick)
    assert {c.layout for c in full} == {"2d", "M-groups", "K-groups", "3d"}
    assert {c.groups for c in full if c.layout == "M-groups"} == {8, 64}
    assert any(c.input_bytes >= 100e6 for c in full)
    assert sum(c.input_bytes >= GOAL_MIN_BYTES for c in full) >= 8
    assert all(c.layout == "3d" for c in build_cases(layouts=["3d"]))
    assert {c.layout for c in build_cases(quick=True, layouts=["M", "K"])} == {"M-groups", "K-groups"}


def test_diff_bytes_on_scales() -> None:
    a = torch.arange(24, dtype=torch.uint8).reshape(4, 6).view(torch.float8_e8m0fnu)
    assert diff_bytes(a, a.clone(), (4, 6)) is None
    b = a.view(torch.uint8).clone()
    b[1, 2] = 200
    msg = diff_bytes(a, b.view(torch.float8_e8m0fnu), (4, 6))
    assert msg is not None and "1 of 24 elements differ" in msg
    assert "shape" in (diff_bytes(a, a, (4, 7)) or "")


def test_goal_summary() -> None:
    big = int(GOAL_MIN_BYTES)
    rows = [
        {"layout": "2d", "shape": (1,), "G": "-", "input_mb": big / 1e6, "ratio_to_copy": 0.9},
        {"layout": "3d", "shape": (2,), "G": "-", "input_mb": big / 1e6, "ratio_to_copy": 0.7},
        {"layout": "2d", "shape": (3,), "G": "-", "input_mb": 1.0, "ratio_to_copy": 0.1},
        {"layout": "K-groups", "shape": (4,), "G": 8, "input_mb": 2 * big / 1e6, "ratio_to_copy": None},
    ]
    s = goal_summary(rows)
    assert s["shapes"] == 3 and s["met"] == 1
    assert s["worst"]["shape"] == (4,)
    assert not math.isnan(float(s["met"]))


# ------------------------------------------------------------------------------------------
# shared bench scaffolding
# ------------------------------------------------------------------------------------------


def test_short_error_fmt_opt_is_fail() -> None:
    msg = common.short_error(ValueError("bad thing\nsecond line"))
    assert msg == "ValueError: bad thing"
    assert len(common.short_error(RuntimeError("x" * 500), 50)) == 50
    assert common.fmt_opt(None, ".2f") == "n/a" and common.fmt_opt(1.234, ".1f") == "1.2"
    assert common.is_fail({"status": "FAIL: x"}) and not common.is_fail({"status": "ok"})
    assert not common.is_fail({})


def test_diff_bytes_nan_payloads_and_strides() -> None:
    a = torch.tensor([1.0, float("nan")], dtype=torch.float32)
    b = a.clone()
    b.view(torch.int32)[1] += 1  # another NaN payload: torch.equal on floats would miss it
    assert diff_bytes(a, a.clone()) is None
    assert diff_bytes(a, b) == "1 of 2 elements differ"
    t = torch.arange(12, dtype=torch.uint8).view(3, 4)
    assert diff_bytes(t.t().contiguous().t(), t, (3, 4)) is None  # logical order, any strides
    assert "vs reference" in diff_bytes(t, t.view(torch.int16))


def test_skewed_group_ends() -> None:
    ends = common.skewed_group_ends(1000, 5, seed=2)
    assert ends[-1] == 1000 and ends == sorted(ends)
    assert [b - a for a, b in zip([0] + ends, ends, strict=False)] == skewed_group_sizes(1000, 5, seed=2)


def test_add_bench_args() -> None:
    parser = common.make_parser("x")
    common.add_bench_args(parser, op="op")
    args = parser.parse_args([])
    assert args.backend == "cute" and not args.no_torchao and not args.no_check and args.copy_tries == 2
    args = parser.parse_args(["--backend", "reference", "--no-torchao", "--no-check", "--copy-tries", "3"])
    assert args.backend == "reference" and args.no_torchao and args.no_check and args.copy_tries == 3
    bare = common.add_bench_args(common.make_parser("y"), torchao=False, check=False, backend=None)
    assert not hasattr(bare.parse_args([]), "backend") and not hasattr(bare.parse_args([]), "no_torchao")


def test_rowlog(monkeypatch: pytest.MonkeyPatch) -> None:
    log = common.RowLog()
    log.note("a")
    log.fail("first")
    log.fail("second")
    assert log.status == "FAIL: first"

    def fake(fn, inputs, **kw):  # type: ignore[no-untyped-def]
        if fn is None:
            raise RuntimeError("boom")
        return common.Timing(us=5.0, method="cuda_graph", samples_us=[4.0, 6.0], calls_per_sample=3,
                             fallback_reason="why not")  # fmt: skip

    monkeypatch.setattr(rowlog, "time_cuda_detailed", fake)
    ok = common.RowLog()
    assert ok.time("ours", lambda: None, [()], {}) == 5.0
    assert ok.time("torchao", None, [()], {}) is None  # type: ignore[arg-type]
    assert ok.status == "ok" and "torchao n/a: RuntimeError: boom" in ok.note_text()
    assert ok.time("ours", None, [()], {}, fatal=True) is None  # type: ignore[arg-type]
    assert ok.status.startswith("FAIL: timing raised")
    row = ok.fill({})
    assert row["timing_methods"] == {"ours": "cuda_graph"}
    assert row["us_spread"]["ours"]["min"] == 4.0 and "ours: why not" in row["note"]


def test_copy_suspect_note() -> None:
    row = common.make_row(nbytes=10**9, us=100.0, copy_us=120.0)
    assert "suspect" in (common.copy_suspect_note(row, [120.0, 121.0]) or "")
    assert common.copy_suspect_note(common.make_row(nbytes=10**9, us=100.0, copy_us=90.0), [90.0]) is None
    small = common.make_row(nbytes=10**6, us=1.0, copy_us=2.0)  # fits in L2: no suspicion
    assert common.copy_suspect_note(small, [2.0]) is None


def test_measure_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {}

    def fake(nbytes, device, tries, **kw):  # type: ignore[no-untyped-def]
        seen.update(nbytes=nbytes, tries=tries, **kw)
        return common.Timing(us=3.0, method="cuda_events"), [3.0, 4.0]

    monkeypatch.setattr(baselines, "copy_baseline_best", fake)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    log = common.RowLog()
    assert common.measure_copy(100, torch.device("cpu"), {"iters": 5}, 3, log) == (3.0, [3.0, 4.0])
    assert seen == {"nbytes": 100, "tries": 3, "iters": 5} and log.methods == {"copy": "cuda_events"}


def test_finish(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rows = [{"name": "a", "status": "ok"}, {"name": "b", "status": "FAIL: nope"}]
    assert common.finish(rows, lambda r: r["name"], ["goal: 1/2"], (tmp_path / "x.json", None)) == 1
    out = capsys.readouterr().out
    assert "goal: 1/2" in out and "FAIL b: FAIL: nope" in out and "x.json" in out
    assert common.finish(rows[:1], lambda r: r["name"], [], ()) == 0


def test_cuda_or_none_without_gpu(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert common.cuda_or_none("bench_x") is None
    assert "error: bench_x needs a CUDA GPU" in capsys.readouterr().err


def test_raise_recompile_limit() -> None:
    """Saved and restored by hand: ``monkeypatch`` on dynamo's config module broke its later use
    (``recompile_limit does not exist`` in a later ``torch.compile`` in the same process)."""
    cfg = torch._dynamo.config
    names = [
        n for n in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit") if hasattr(cfg, n)
    ]
    saved = {n: getattr(cfg, n) for n in names}
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    try:
        setattr(cfg, name, 8)
        common.raise_recompile_limit(64)
        assert getattr(cfg, name) == 64
    finally:
        for n, value in saved.items():
            setattr(cfg, n, value)


# ------------------------------------------------------------------------------------------
# the package: submodules and re-exports
# ------------------------------------------------------------------------------------------


def test_package_reexports_what_the_scripts_import() -> None:
    """Every ``from bench.common import X`` in bench/*.py resolves, to the submodule's object."""
    import ast

    bench_dir = Path(common.__file__).resolve().parents[1]
    for path in sorted(bench_dir.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bench.common"):
                module = __import__(node.module, fromlist=["_"])
                for alias in node.names:
                    assert hasattr(module, alias.name), f"{path.name}: {node.module}.{alias.name}"
    for name in common.__all__:
        obj = getattr(common, name)
        home = getattr(obj, "__module__", None)
        if callable(obj) and home is not None and home.startswith("bench.common."):
            assert getattr(__import__(home, fromlist=["_"]), name) is obj, name


# ------------------------------------------------------------------------------------------
# per-op trace (bench.common.op_trace)
# ------------------------------------------------------------------------------------------


def test_tensor_bytes_counts_every_tensor_once_per_reference() -> None:
    from bench.common.op_trace import tensor_bytes

    a, b = torch.empty(3, 4, dtype=torch.bfloat16), torch.empty(5, dtype=torch.float32)
    assert tensor_bytes(a) == 24 and tensor_bytes((a, [b, 7], None)) == 44 and tensor_bytes("x") == 0


@pytest.mark.gpu
def test_trace_ops_times_the_outer_ops_and_restores_dispatch() -> None:
    import torch_bindings as tb
    from bench.common.op_trace import op_rows, trace_ops
    from torch_bindings.op import KernelOp

    x = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
    original = KernelOp.dispatch

    def step():
        tb.quantize_fp8_2d(x, axis="row")
        tb.quantize_fp8_2d(x, axis="row")

    step()
    totals, step_us = trace_ops(step)
    assert KernelOp.dispatch is original
    (name,) = totals
    t = totals[name]
    assert t.calls == 2 and 0 < t.us <= step_us
    assert t.nbytes == 2 * (x.numel() * 2 + x.numel() + 256 * 4)  # x read; e4m3 q and fp32 scales written
    rows = op_rows(totals, step_us)
    assert rows[0]["op"] == name and rows[0]["of copy"] > 0 and rows[-1]["us"] >= 0

    def failing():
        tb.quantize_fp8_2d(x, axis="row")
        with pytest.raises(RuntimeError, match="traces do not nest"):
            trace_ops(step)
        raise KeyError("step failed")

    with pytest.raises(KeyError, match="step failed"):
        trace_ops(failing)
    assert KernelOp.dispatch is original


# ------------------------------------------------------------------------------------------
# clock and power under sustained load (bench_grouped_gemm --power)
# ------------------------------------------------------------------------------------------


def test_power_samples_skip_unusable_lines_and_the_settling_third() -> None:
    from bench.common.power import parse_samples, steady_medians

    text = "900, 300.5\n[N/A], 650.0\n1300, 690.1\n\n1320, 692.0\n1310, 691.0\n1330"
    pairs = parse_samples(text)
    assert pairs == [(900.0, 300.5), (1300.0, 690.1), (1320.0, 692.0), (1310.0, 691.0)]
    assert steady_medians(pairs) == (1310.0, 691.0, 3)  # the first of four samples is left out
    with pytest.raises(ValueError, match="no clock"):
        steady_medians(parse_samples("[N/A], [N/A]\n"))


def test_power_mode_is_an_option_of_the_gemm_bench() -> None:
    from bench.bench_grouped_gemm import __doc__ as doc
    from bench.bench_grouped_gemm import main

    assert "--power" in doc
    if not torch.cuda.is_available():
        assert main(["--power", "--seconds", "0.1"]) == 2  # no GPU: the bench's usual exit


def _fake_nvidia_smi(tmp_path, monkeypatch, line: str) -> None:
    """An ``nvidia-smi`` on PATH that records its arguments and prints ``line`` six times; CUDA
    events, syncs and device properties faked so that ``sustained`` runs on a CPU."""
    import os
    from types import SimpleNamespace

    script = tmp_path / "nvidia-smi"
    script.write_text(
        f'#!/bin/sh\necho "$@" > {tmp_path}/args\nfor i in 1 2 3 4 5 6; do echo "{line}"; done\n'
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")

    class Event:
        def __init__(self, **_):
            pass

        def record(self):
            pass

        def elapsed_time(self, other):
            return 2.0

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(uuid="abc-123"))


def test_sustained_samples_the_device_by_uuid(tmp_path, monkeypatch) -> None:
    from bench.common import power

    _fake_nvidia_smi(tmp_path, monkeypatch, "1300, 690.5")
    calls = []
    run = power.sustained(lambda: calls.append(1), 0, seconds=0.3, batch=4)
    assert (run.sm_mhz, run.watts, run.samples) == (1300.0, 690.5, 4)
    assert len(calls) % 4 == 0 and run.us > 0
    assert "-i GPU-abc-123" in (tmp_path / "args").read_text()
    with pytest.raises(ValueError, match="positive"):
        power.sustained(lambda: None, 0, seconds=0.3, batch=0)


def test_sustained_says_what_nvidia_smi_printed(tmp_path, monkeypatch) -> None:
    from bench.common import power

    _fake_nvidia_smi(tmp_path, monkeypatch, "[N/A], [N/A]")
    with pytest.raises(RuntimeError, match="N/A"):
        power.sustained(lambda: None, 0, seconds=0.2, batch=1)
