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


def test_every_kernel_meets_b200_need_on_paper():
    """The sm_100a configs keep at least B200's Little's-law need in flight per SM (at the latency
    fitted on H200, the model's assumption for B200): the representative variant of every
    modelled kernel (``registry.modelled()``) (compiles each for sm_100a, and the calibration points)."""
    from cute_kernels import model, registry

    need = MACHINES["B200"].need_per_sm(model.calibrate()["H200"].latency_ns)
    short = {}
    for name in registry.modelled():
        config = model.production_config(name, "sm_100a")
        occ = model.occupancy(name, model.representative_variant(name), config, "sm_100a")
        if occ.bytes_per_sm < need:
            short[name] = round(occ.bytes_per_sm / need, 2)
    assert not short, f"below B200's need (x need): {short}"
