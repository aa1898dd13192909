"""CPU-only tests of bench/bench_quantize_2d.py's pure parts (shapes, bytes, goals, baselines' math)."""

from __future__ import annotations

import pytest
import torch

import torch_bindings.reference as ref_mod
from bench import bench_quantize_2d as bq


def test_case_bytes_and_scale_shapes() -> None:
    c = bq.QuantCase(8192, 7168)
    assert c.scale_shape == (8192, 224)
    assert c.nbytes_moved == 2 * 8192 * 7168 + 8192 * 7168 + 8192 * 224
    g = bq.QuantCase(8192, 5120, groups=8)
    assert g.scale_shape == (8192 + 128 * 8, 160)
    assert g.nbytes_moved == 3 * 8192 * 5120 + (8192 + 1024) * 160
    # padding of both dims (SPEC section 3)
    assert bq.QuantCase(200, 32 * 5).scale_shape == (256, 8)


def test_group_offsets_unaligned_and_end_at_m() -> None:
    c = bq.QuantCase(32768, 2048, groups=8)
    ends = c.group_end_offsets()
    assert len(ends) == 8 and ends[-1] == 32768
    assert all(b >= a for a, b in zip(ends, ends[1:], strict=False))
    assert any(e % 128 for e in ends[:-1]), "groups should be unaligned"
    assert bq.QuantCase(32768, 2048).group_end_offsets() == []


def test_build_shapes() -> None:
    full = bq.build_shapes()
    assert len(full) == 9
    assert [k for _, k in full] == sorted(k for _, k in full), "ordered by K (one compile per K)"
    quick = bq.build_shapes(quick=True)
    assert set(quick) == set(bq.QUICK_SHAPES) and len({k for _, k in quick}) == 1
    assert bq.build_shapes(ms=[4096], ks=[256]) == [(4096, 256)]
    assert bq.build_shapes(quick=True, ms=[8192]) == [(8192, 7168)]
    with pytest.raises(ValueError, match="multiple of 32"):
        bq.build_shapes(ms=[128], ks=[100])


def _row(mode: str, shape: tuple[int, int], groups: int, us: float, copy_us: float, **kw) -> dict:
    row = bq.make_row(
        mode=mode,
        shape=shape,
        G=groups or "-",
        nbytes=bq.QuantCase(*shape, mode, groups).nbytes_moved,
        us=us,
        copy_us=copy_us,
        status=kw.pop("status", "ok"),
    )
    row.update(groups=groups, elems=shape[0] * shape[1], **kw)
    return row


def test_grouped_ratio_and_goals() -> None:
    big, small = (32768, 2048), (8192, 2048)
    rows = [
        _row("rceil", big, 0, 100.0, 92.0, compile_us=500.0, compile_speedup=5.0),
        _row("rceil", big, 8, 104.0, 93.0, compile_us=300.0, compile_speedup=300.0 / 104.0),
        _row("rceil", small, 0, 10.0, 7.6),
        _row("rceil", small, 8, 11.0, 7.0, status="FAIL: q 3 of 9 elements differ"),
    ]
    bq.add_grouped_ratios(rows)
    assert rows[0]["grouped_time_ratio"] is None
    assert rows[1]["grouped_time_ratio"] == pytest.approx(1.04)
    assert rows[3]["grouped_time_ratio"] == pytest.approx(1.1)
    s = bq.goal_summary(rows)
    # ratio: 0.92 >= 0.90 ok; 93/104 = 0.894 < 0.90 missed; 0.76 >= 0.75 ok; FAIL row missed
    assert (s["ratio"]["rows"], s["ratio"]["met"]) == (4, 2)
    assert (s["grouped"]["rows"], s["grouped"]["met"]) == (2, 1)
    assert (s["compile"]["rows"], s["compile"]["met"]) == (2, 1)
    lines = bq.format_goal_lines(s)
    assert len(lines) == 3 and "FAIL" in lines[0] and "0.894" in lines[0]
    assert bq.ratio_goal(32768 * 2048) == bq.GOAL_RATIO_BIG
    assert bq.ratio_goal(32768 * 2048 - 1) == bq.GOAL_RATIO_SMALL


def test_columns_are_row_keys() -> None:
    row = _row("rceil", (8192, 2048), 0, 10.0, 8.0)
    row.update(compile_us=None, compile_speedup=None, grouped_time_ratio=None)
    for key, _ in bq.COLUMNS:
        assert key in row, key


def test_diff_bytes() -> None:
    a = torch.arange(12, dtype=torch.uint8).view(3, 4)
    assert bq.diff_bytes(a, a.clone(), (3, 4)) is None
    assert bq.diff_bytes(a.view(-1), a) is None  # same bytes, other shape: fine without expected shape
    assert "shape" in bq.diff_bytes(a.view(-1), a, (3, 4))
    b = a.clone()
    b[0, 0] = 9
    assert bq.diff_bytes(b, a) == "1 of 12 elements differ"


@pytest.mark.parametrize("mode", ["floor", "rceil"])
def test_compiled_reference_pieces_match_reference_eagerly(mode: str) -> None:
    """What the bench compiles equals the reference (checked here eagerly, on the CPU)."""
    m, k = 384, 256
    x = bq.make_input(m, k, torch.device("cpu"))
    q_ref, s_ref = ref_mod.quantize_mxfp8_2d(x, scaling_mode=mode)
    q, s = bq._ref_ungrouped(ref_mod, x, mode)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    assert torch.equal(s, s_ref.view(torch.uint8))
    ends = torch.tensor([3, 100, 100, 300, m], dtype=torch.int32)
    q_ref, s_ref = ref_mod.quantize_mxfp8_2d(x, scaling_mode=mode, group_end_offsets=ends)
    q, s = bq._ref_grouped(ref_mod, x, ends, mode)
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    assert s.shape == s_ref.shape and torch.equal(s, s_ref.view(torch.uint8))


def test_main_without_cuda_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert bq.main(["--quick"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_help_works() -> None:
    with pytest.raises(SystemExit) as exc:
        bq.main(["--help"])
    assert exc.value.code == 0


def test_copy_baseline_best_scales_and_takes_fastest(monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.common import baselines

    seen: list[int] = []

    aligned = 2 * 4096 * 1221  # 10 MB moved: 5 MB each way, rounded up to 4 KiB

    def fake(nbytes: int, device: object = None, **kw: object) -> baselines.Timing:
        seen.append(nbytes)
        slow = 1.5 if nbytes == aligned else 1.0  # the first size hits a slow path
        return baselines.Timing(us=slow * nbytes / 4000.0, method="cuda_graph", samples_us=[nbytes / 4000.0])

    kernel_us = [3000.0]

    def fake_kernel(nbytes: int, device: object = None, **kw: object) -> baselines.Timing:
        return baselines.Timing(us=kernel_us[0], method="cuda_graph", samples_us=[kernel_us[0]])

    monkeypatch.setattr(baselines, "require_cuda", lambda what="": None)
    monkeypatch.setattr(baselines, "_copy_exact_detailed", fake)
    monkeypatch.setattr(baselines, "_copy_kernel_detailed", fake_kernel)
    best, tries = baselines.copy_baseline_best(10_000_000, tries=2, step_bytes=1000)
    assert seen == [aligned, aligned + 2000]
    assert tries[0] == pytest.approx(3750.0) and tries[1] == pytest.approx(2500.0)  # scaled back
    assert tries[2] == 3000.0  # the SM copy kernel
    assert best.us == pytest.approx(2500.0) and best.samples_us == [pytest.approx(2500.0)]
    kernel_us[0] = 2400.0  # both memcpy sizes on a slow path: the kernel is the ceiling
    assert baselines.copy_baseline_best(10_000_000, tries=2, step_bytes=1000)[0].us == 2400.0
    assert len(baselines.copy_baseline_best(10_000_000, tries=1, kernel_try=False)[1]) == 1


def test_copy_bytes_each_way_alignment() -> None:
    from bench.common import baselines

    # bench_pad's sizes (offsets make them 16- but not 64-byte multiples) round up to 4 KiB
    assert baselines.copy_bytes_each_way(473432160) == 236716032 + 4096
    assert baselines.copy_bytes_each_way(2 * 1423966208) == 1423966208  # already aligned
    assert baselines.copy_bytes_each_way(2 * 1423966208, 1) == 1423966208 + (112 << 10)
    assert baselines.copy_bytes_each_way(1000) == 500  # small: exact (rounding would distort it)
    assert baselines.copy_bytes_each_way(1) == 1


def test_patterned_bytes_avoids_rng() -> None:
    from bench.common import baselines

    t = baselines._patterned_bytes(11, torch.device("cpu"))
    assert t.dtype == torch.uint8 and t.numel() == 11 and len(set(t.tolist())) > 2
