"""The bytes-in-flight model's arithmetic (cute_kernels.model): residency and the calibration fit,
on synthetic numbers (no compile)."""

from __future__ import annotations

import pytest

pytest.importorskip("cutlass")

from cute_kernels.model import MACHINES, fit, predicted_ratio, resident_ctas  # noqa: E402


@pytest.mark.parametrize(
    "registers,threads,smem,ctas",
    [
        (40, 128, 8192, 12),  # 40 x 32 = 1280 registers per warp, 4 warps: 65536 / 5120 = 12
        (128, 128, 0, 4),  # 4096 per warp, 4 warps: 4
        (152, 128, 512, 3),  # 4864 per warp (19 units of 256), 4 warps: 65536 / 19456 = 3
        (28, 512, 64, 4),  # threads: 2048 / 512
        (32, 128, 100 * 1024, 2),  # shared memory: 228 KiB / (100 + 1) KiB
        (16, 32, 0, 32),  # the 32-CTA limit
    ],
)
def test_resident_ctas(registers, threads, smem, ctas):
    assert resident_ctas(registers, threads, smem) == ctas


def test_fit_recovers_latency_and_plateau():
    machine = MACHINES["H200"]
    need = machine.need_per_sm(900.0)
    points = [("k", None, min(0.9, b / need), b) for b in (0.25 * need, 0.5 * need, 0.75 * need, 2 * need)]
    result = fit(machine, points)
    assert result.latency_ns == pytest.approx(900.0, abs=10)
    assert result.plateau == pytest.approx(0.9)
    assert max(map(abs, result.errors())) < 0.02
    assert predicted_ratio(need, machine, 900.0) == pytest.approx(1.0)
