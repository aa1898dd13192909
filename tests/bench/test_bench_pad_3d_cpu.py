"""CPU-only tests of bench_pad, bench_quantize_3d and bench_overhead's pure parts (bytes, cases,
checks through the reference, summaries, exit codes without a GPU; bench_fp8_cols' exit code)."""

from __future__ import annotations

import json

import pytest
import torch

import torch_bindings
import torch_bindings.reference as ref_mod
from bench import bench_fp8_cols, bench_overhead, bench_pad, bench_quantize_3d
from bench.common.rows import make_row

# ------------------------------------------------------------------------------------------
# bench_pad
# ------------------------------------------------------------------------------------------


def test_pad_case_bytes() -> None:
    m, d, g = 16384, 7168, 8
    p = 32 * -(-(m + 32 * g) // 32)
    assert bench_pad.PadCase("pad", m, d, g).padded_rows == p
    assert bench_pad.PadCase("pad", m, d, g).nbytes_moved == 2 * d * (m + p) + 12 * g
    assert bench_pad.PadCase("unpad", m, d, g).nbytes_moved == 4 * d * m + 8 * g
    fused = bench_pad.PadCase("fused", m, d, g)
    assert fused.scale_shape == (p + 128 * g, 224)
    assert fused.nbytes_moved == 2 * d * m + p * d + (p + 128 * g) * 224 + 12 * g
    assert bench_pad.PadCase("pad+quant", m, d, g).nbytes_moved == fused.nbytes_moved
    assert bench_pad.PadCase("fused", 100, 1536, 3).scale_shape[1] == 48  # 4 * ceil(48 / 4)


def test_pad_build_cases() -> None:
    full = bench_pad.build_cases()
    shapes = {(c.tokens, c.dim, c.groups) for c in full}
    assert len(shapes) == 17 and (131072, 7168, 8) in shapes
    assert {c.op for c in full} == set(bench_pad.OPS)
    quick = bench_pad.build_cases(quick=True, modes=("rceil", "floor"))
    assert {(c.tokens, c.dim, c.groups) for c in quick} == {(16384, 7168, 8), (131072, 7168, 8)}
    assert {c.mode for c in quick if c.op == "fused"} == {"rceil", "floor"}
    assert {c.mode for c in quick if c.op == "pad"} == {"rceil"}
    assert {c.op for c in bench_pad.build_cases(ops=["fused"])} == {"fused"}


@pytest.mark.parametrize("op", bench_pad.OPS)
def test_pad_prepare_checks_against_reference(op: str) -> None:
    case = bench_pad.PadCase(op, 300, 64, 4)
    x = torch.randn(300, 64, dtype=torch.bfloat16)
    ends = torch.tensor(case.group_end_offsets(), dtype=torch.int32)
    prep = bench_pad.prepare(case, torch_bindings, ref_mod, x, ends, {}, "reference")
    assert prep.check() is None
    out = prep.fn(*prep.make())
    if case.quantizes:
        assert tuple(out[0].shape) == (case.padded_rows, 64) and tuple(out[1].shape) == case.scale_shape
    assert prep.baseline is None


def test_pad_diff_all_names_the_tensor() -> None:
    a = torch.zeros(4, dtype=torch.int32)
    b = a.clone()
    b[2] = 1
    assert bench_pad._diff_all((a, a, a), (a, a, b)).startswith("padded_end:")


def _pad_row(op: str, us: float | None, copy_us: float, **kw: object) -> dict:
    case = bench_pad.PadCase(op, 16384, 7168, 8)
    row = make_row(op=op, shape=(16384, 7168), G=8, nbytes=case.nbytes_moved, us=us, copy_us=copy_us, **kw)
    row["mode"] = "rceil" if case.quantizes else None
    return row


def test_pad_fused_speedup_and_goals() -> None:
    rows = [
        _pad_row("pad", 100.0, 92.0),
        _pad_row("unpad", 100.0, 80.0),
        _pad_row("fused", 100.0, 90.0),
        _pad_row("pad+quant", 200.0, 90.0),
    ]
    bench_pad.add_fused_speedups(rows)
    assert rows[2]["fused_speedup"] == pytest.approx(2.0)
    assert rows[0]["fused_speedup"] is None and rows[3]["fused_speedup"] is None
    s = bench_pad.goal_summary(rows)
    assert (s["pad"]["met"], s["unpad"]["met"], s["fused"]["met"]) == (1, 0, 1)
    assert s["fused_speedup"] == {"rows": 1, "met": 1, "min": pytest.approx(2.0)}
    lines = bench_pad.format_goal_lines(s)
    assert any("fused vs pad+quant" in line and "1/1" in line for line in lines)
    for key, _ in bench_pad.COLUMNS:
        assert key in rows[2], key


def test_pad_unmeasured_row_in_goals() -> None:
    rows = [_pad_row("fused", None, 90.0, status="FAIL: raised RuntimeError: boom")]
    bench_pad.add_fused_speedups(rows)
    assert bench_pad.goal_summary(rows)["fused"] == {
        "shapes": 1, "measured": 0, "met": 0, "worst": {"shape": (16384, 7168), "G": 8, "ratio_to_copy": None}
    }  # fmt: skip


# ------------------------------------------------------------------------------------------
# bench_quantize_3d
# ------------------------------------------------------------------------------------------


def test_quant3d_case_shapes_and_bytes() -> None:
    c = bench_quantize_3d.Quant3dCase(8, 8192, 5120, "1x32")
    assert c.scale_shape == (8, 8192, 160)
    assert c.nbytes_moved == 3 * 8 * 8192 * 5120 + 8 * 8192 * 160
    t = bench_quantize_3d.Quant3dCase(8, 7168, 2048, "32x1")
    assert t.scale_shape == (8, 2048, 224)
    assert bench_quantize_3d.Quant3dCase(1, 96, 416, "32x1").scale_shape == (1, 512, 4)
    assert c.ratio_goal() == 0.90 and bench_quantize_3d.Quant3dCase(1, 32, 32).ratio_goal() == 0.80


def test_quant3d_build_cases() -> None:
    full = bench_quantize_3d.build_cases()
    assert len(full) == 3 * 2 * 2
    assert {c.experts for c in full} == {1, 8, 32} and {c.block for c in full} == {"1x32", "32x1"}
    assert {c.experts for c in bench_quantize_3d.build_cases(quick=True)} == {8}
    assert len(bench_quantize_3d.build_cases(experts=[2], blocks=["32x1"], modes=["floor", "rceil"])) == 4
    with pytest.raises(ValueError, match="positive"):
        bench_quantize_3d.build_cases(experts=[0])


@pytest.mark.parametrize("block", ["1x32", "32x1"])
def test_quant3d_compare_experts(block: str) -> None:
    case = bench_quantize_3d.Quant3dCase(3, 256, 128, block)
    w = bench_quantize_3d.make_input(3, 256, 128, torch.device("cpu"))
    want = bench_quantize_3d._reference_experts(ref_mod, w, case)
    assert sorted(want) == [0, 2]
    out = ref_mod.quantize_mxfp8_3d(w, block=block)
    assert tuple(out[1].shape) == case.scale_shape
    assert bench_quantize_3d.compare_experts(out, want) is None
    assert bench_quantize_3d.compare_experts((out[0], out[1].reshape(-1)), want, flat_scales=True) is None
    bad = out[1].view(torch.uint8).clone()
    bad[2, 0, 0] ^= 1
    assert bench_quantize_3d.compare_experts((out[0], bad), want) == "expert 2: 1 of 1024 elements differ"


def test_quant3d_goals() -> None:
    def row(e: int, us: float | None, copy_us: float, status: str = "ok") -> dict:
        c = bench_quantize_3d.Quant3dCase(e, 7168, 2048)
        r = make_row(block="1x32", mode="rceil", shape=(e, 7168, 2048), nbytes=c.nbytes_moved, us=us,
                     copy_us=copy_us, status=status)  # fmt: skip
        r["ratio_goal"] = c.ratio_goal()
        return r

    rows = [row(1, 100.0, 85.0), row(8, 100.0, 85.0), row(32, None, 80.0, "FAIL: raised RuntimeError: boom")]
    s = bench_quantize_3d.goal_summary(rows)
    assert (s["rows"], s["timed"], s["met"]) == (3, 3, 1)  # a FAIL row counts as timed and missed
    line = bench_quantize_3d.format_goal_lines(s)[0]
    assert "0.850" in line and "FAIL: raised RuntimeError: boom" in line
    for key, _ in bench_quantize_3d.COLUMNS:
        assert key in rows[0], key


# ------------------------------------------------------------------------------------------
# --help (exit codes without a GPU: tests/bench/test_bench_no_gpu.py)
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("module", [bench_pad, bench_quantize_3d, bench_overhead, bench_fp8_cols])
def test_help_works(module: object) -> None:
    with pytest.raises(SystemExit) as exc:
        module.main(["--help"])  # type: ignore[attr-defined]
    assert exc.value.code == 0


def test_overhead_rule() -> None:
    status = bench_overhead._status
    assert status(13.0, 10.0) == "ok" and status(13.1, 10.0) == "over 13.0 us"
    assert status(6.5, 5.0) == "ok" and status(6.6, 5.0) == "over 6.5 us"  # both rules hold
    assert status(8.0, 6.5) == "ok"  # 1.23x, under 10 us


def test_overhead_measure_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    times = {"op": 12.0, "floor": 10.0}
    monkeypatch.setattr(bench_overhead, "floor_of", lambda fn, device: lambda: "floor")
    monkeypatch.setattr(bench_overhead, "paired_us", lambda fn, floor: (times[fn() or "op"], times[floor()]))
    row = bench_overhead.measure("q3d", lambda: None, torch.device("cpu"))
    assert row == {"call": "q3d", "host_us": 12.0, "floor_us": 10.0, "ratio": 1.2, "status": "ok"}

    def boom() -> None:
        raise NotImplementedError("later")

    row = bench_overhead.measure("x", boom, torch.device("cpu"))
    assert row["host_us"] is None and row["status"] == "raised NotImplementedError: later"


def test_overhead_cpu_mock_runs_every_op(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from torch_bindings import targets

    def once(fn, rounds=9) -> float:
        fn()
        return 1.0

    monkeypatch.setattr(bench_overhead, "host_us_per_call", once)
    monkeypatch.setattr(bench_overhead, "paired_us", lambda fn, floor: (once(fn), once(floor)))
    monkeypatch.setattr(torch.cuda, "synchronize", torch.cuda.synchronize)
    try:
        assert bench_overhead.main(["--cpu-mock", "--out", str(tmp_path)]) == 0
    finally:
        targets._targets.pop(-1, None)  # cpu_mock's CPU target


def test_overhead_median_run() -> None:
    def run(host: float | None, floor: float | None) -> dict:
        ratio = None if host is None else host / floor
        status = "raised X" if host is None else bench_overhead._status(host, floor)
        return {"call": "c", "host_us": host, "floor_us": floor, "ratio": ratio, "status": status}

    row = bench_overhead.median_run([run(14.0, 10.0), run(12.0, 10.0), run(13.0, 10.0)])
    assert (row["host_us"], row["status"], row["runs"]) == (13.0, "ok", "1.40 / 1.20 / 1.30")
    row = bench_overhead.median_run([run(6.6, 5.0), run(9.5, 7.5), run(11.0, 7.5)])  # floors differ
    assert row["host_us"] == 6.6 and row["status"] == "over 6.5 us"
    row = bench_overhead.median_run([run(6.6, 5.0), run(6.0, 5.0)])  # even count: the lower one
    assert row["host_us"] == 6.0
    row = bench_overhead.median_run([run(6.0, 5.0), run(None, None)])
    assert row["status"] == "raised X" and row["runs"] == "1 of 2 raised"


def test_overhead_runs_judge_each_row_on_its_median(
    monkeypatch: pytest.MonkeyPatch, tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--runs 3`` with a scripted timer: row a is over the rule in one run of three (ok), row b in
    two of three (over); the exit code is 1 and the verdict line says 1 of 2."""
    script = {
        "a": iter([(12.0, 10.0), (14.0, 10.0), (12.5, 10.0)]),
        "b": iter([(7.0, 5.0), (6.0, 5.0), (6.8, 5.0)]),
    }
    monkeypatch.setattr(bench_overhead, "cuda_or_none", lambda what: torch.device("cpu"))
    monkeypatch.setattr(bench_overhead, "op_cases", lambda device: {"a": lambda: "a", "b": lambda: "b"})
    monkeypatch.setattr(bench_overhead, "scale_cases", lambda device: {})
    monkeypatch.setattr(bench_overhead, "floor_of", lambda fn, device: None)
    monkeypatch.setattr(bench_overhead, "paired_us", lambda fn, floor: next(script[fn()]))
    assert bench_overhead.main(["--runs", "3", "--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "verdict: 1 of 2 rows within the rule, median of 3 runs: missed" in out
    rows = {r["call"]: r for r in json.loads((tmp_path / "bench_overhead.json").read_text())["rows"]}
    assert (rows["a"]["host_us"], rows["a"]["status"], rows["a"]["runs"]) == (
        12.5,
        "ok",
        "1.20 / 1.40 / 1.25",
    )
    assert (rows["b"]["host_us"], rows["b"]["status"]) == (6.8, "over 6.5 us")
