"""Bytes-in-flight model of every bandwidth-bound registered kernel (``registry.modelled()``) on
H100, H200 and B200 (Little's law).

A memory-bound kernel reaches a device copy's bandwidth ``BW`` only if each SM keeps
``BW x latency / SMs`` bytes of loads in flight. Per kernel and arch the model takes:

- bytes in flight per CTA from the config (each kernel class's ``loads_in_flight``, through
  ``cute_kernels.inflight``);
- CTAs resident per SM from the compiled kernel's registers per thread (``cute_utils.sass``,
  allocated per warp in units of 256), its threads (2048 per SM), its shared memory (static, plus
  ``Kernel.shared_bytes``, the size of the ``@cute.struct`` the kernel allocates: the 1x32
  kernel's rings and scans, the 32x1 kernel's K-groups scan, the MX dual's rings and staging tiles,
  the TMA kernel's rings; the other kernels report 0: their dynamic arrays are small) and the
  32-CTA limit;
- predicted ratio to copy ``min(plateau, bytes per SM / need per SM)``.

Two parameters per device, the latency and the plateau (what a kernel that covers the need reaches:
its stores and instructions are not free), fitted to the ratios ``bench/calibrate_model.py``
measured (``cute_kernels/configs/calibration.json``: every production kernel, and config sweeps of
the FP8 kernels); the calibration error is printed beside them. B200 has not been measured: its copy
bandwidth is taken at H200's fraction of peak, its latency and plateau at H200's (both HBM3e).

    python -m cute_kernels.model [--kernels NAME ...] [--calibration FILE]
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cute_utils.occupancy import MAX_CTAS_PER_SM, SMEM_PER_SM, SMEM_RESERVED_PER_CTA

from . import configs, registry
from .inflight import loads_in_flight, representative_variant

REGISTERS_PER_SM = 65536
THREADS_PER_SM = 2048
REGISTER_UNIT = 256  # registers are allocated per warp in units of 256
CALIBRATION = Path(__file__).with_name("configs") / "calibration.json"


@dataclass(frozen=True)
class Machine:
    """``copy_gbps``: a device copy's bandwidth in bytes per nanosecond (the same number as GB per s);
    ``source``: where it comes from."""

    name: str
    arch: str
    sms: int
    copy_gbps: float
    source: str

    def need_per_sm(self, latency_ns: float) -> float:
        """Bytes each SM keeps in flight to sustain ``copy_gbps`` at ``latency_ns`` (Little's law)."""
        return self.copy_gbps * latency_ns / self.sms


MACHINES = {
    "H100": Machine("H100", "sm_90a", 132, 3030.0, "H100 SXM HBM3: copy measured 3.03 TB/s (bench_fp8_cols)"),
    "H200": Machine(
        "H200", "sm_90a", 132, 4200.0, "H200 HBM3e: copy measured ~4.2 TB/s (notes/copy-baseline.md)"
    ),
    "B200": Machine(
        "B200", "sm_100a", 148, 7000.0, "B200 HBM3e, 8 TB/s peak: copy at H200's 0.875 of peak (assumed)"
    ),
}


@dataclass(frozen=True)
class Occupancy:
    """A compiled kernel's residency: ``registers`` per thread, ``threads`` and ``smem`` bytes per
    CTA, ``ctas`` resident per SM, ``bytes_per_cta`` of loads in flight."""

    registers: int
    threads: int
    smem: int
    ctas: int
    bytes_per_cta: int

    @property
    def bytes_per_sm(self) -> int:
        return self.ctas * self.bytes_per_cta


def resident_ctas(registers: int, threads: int, smem: int) -> int:
    """CTAs per SM allowed by registers (per-warp units of 256), threads, shared memory, 32."""
    warps = -(-threads // 32)
    per_warp = -(-registers * 32 // REGISTER_UNIT) * REGISTER_UNIT
    by_registers = REGISTERS_PER_SM // (per_warp * warps)
    by_smem = SMEM_PER_SM // (smem + SMEM_RESERVED_PER_CTA)
    return min(by_registers, THREADS_PER_SM // threads, by_smem, MAX_CTAS_PER_SM)


@functools.cache
def _compiled_resources(name: str, variant: Any, config: Any, arch: str) -> dict:
    from cute_utils.sass import compile_options, cubin_of, resource_usage

    compiled = registry.entry(name).compile(variant, arch, config=config, options=compile_options(arch))
    return next(r for r in resource_usage(cubin_of(compiled)).values() if r.get("entry", True))


def occupancy(name: str, variant: Any, config: Any, arch: str) -> Occupancy:
    """Residency and bytes in flight of kernel ``name``'s ``variant`` with ``config`` on ``arch``
    (compiles it)."""
    res = _compiled_resources(name, variant, config, arch)
    loads = loads_in_flight(name, variant, config)
    smem = res.get("shared_bytes", 0) + registry.entry(name).kernel_class().shared_bytes(variant, config)
    ctas = resident_ctas(res["registers"], loads.threads, smem)
    return Occupancy(res["registers"], loads.threads, smem, ctas, loads.bytes_per_cta)


def predicted_ratio(bytes_per_sm: float, machine: Machine, latency_ns: float, plateau: float = 1.0) -> float:
    """``min(plateau, bytes_per_sm / need)``: the model's ratio to a device copy."""
    return min(plateau, bytes_per_sm / machine.need_per_sm(latency_ns))


#: The shape class of the representative variants at K = BENCH_COLS (7168) for the kernels whose
#: configs come per shape class (``configs.pick_for_shape``).
_SHAPE_CLASSES = {
    "quantize_fp8_row": "bfloat16/k8192",
    "quantize_fp8_col_amax": "bfloat16/plain/k8192/g1",
    "quantize_fp8_col_cast": "bfloat16/plain/k8192/g1",
}


def production_config(name: str, arch: str, device: str = "") -> Any:
    """The config the bindings launch for the representative variant on ``device`` (a
    ``torch.cuda.get_device_name``; "": a device without tuned entries): for the kernels configured
    per shape class, the tuned entry of the class at K = 7168, else the heuristic."""
    variant = representative_variant(name)
    if name in _SHAPE_CLASSES:
        return configs.pick_for_shape(name, variant, arch, device, _SHAPE_CLASSES[name])
    return configs.pick(name, variant, arch)


def _machine_of(device: str) -> Machine | None:
    return next((m for key, m in MACHINES.items() if key in device), None)


@dataclass(frozen=True)
class Fit:
    """A device's fitted ``latency_ns`` and ``plateau`` and its calibration points: ``(kernel,
    config, measured ratio, bytes in flight per SM)``; ``device``: the measured GPU's name (the
    tuned tables' key; "" for a machine only modelled)."""

    machine: Machine
    latency_ns: float
    plateau: float
    points: list
    device: str = ""

    def predict(self, bytes_per_sm: float) -> float:
        return predicted_ratio(bytes_per_sm, self.machine, self.latency_ns, self.plateau)

    def errors(self) -> list[float]:
        return [self.predict(b) - m for _, _, m, b in self.points]


def fit(machine: Machine, points: list) -> Fit:
    """The latency (10 ns steps in [100, 3000]) and plateau (0.01 steps in [0.80, 1.05]) minimizing
    the squared error of the predictions of ``points``."""

    def cost(params: tuple[float, float]) -> float:
        return sum((predicted_ratio(b, machine, *params) - m) ** 2 for _, _, m, b in points)

    grid = [(float(ns), p / 100) for ns in range(100, 3001, 10) for p in range(80, 106)]
    latency, plateau = min(grid, key=cost)
    return Fit(machine, latency, plateau, points)


def calibrate(path: Path = CALIBRATION) -> dict[str, Fit]:
    """``{machine name: Fit}`` from the measured points in ``path`` (compiles each point's config)."""
    fits = {}
    for device, entry in json.loads(path.read_text()).items():
        machine = _machine_of(device)
        if machine is None:
            continue
        points = []
        for p in entry["points"]:
            variant = representative_variant(p["kernel"])
            config_type = type(production_config(p["kernel"], entry["arch"], device))
            config = config_type(**p["config"])
            occ = occupancy(p["kernel"], variant, config, entry["arch"])
            points.append((p["kernel"], config, p["ratio"], occ.bytes_per_sm))
        fits[machine.name] = replace(fit(machine, points), device=device)
    return fits


def _fit_lines(result: Fit) -> list[str]:
    errors = result.errors()
    need = result.machine.need_per_sm(result.latency_ns) / 1024
    mean, worst = sum(map(abs, errors)) / len(errors), max(map(abs, errors))
    lines = [
        f"{result.machine.name}: fitted latency {result.latency_ns:.0f} ns (need {need:.1f} KiB per SM), "
        f"plateau {result.plateau:.2f}; calibration error over {len(errors)} points: "
        f"mean |err| {mean:.3f}, max |err| {worst:.3f}",
        f"  {'kernel':24s} {'KiB/SM':>7s} {'measured':>8s} {'model':>6s} {'err':>6s}  config",
    ]
    for (kernel, config, measured, per_sm), err in zip(result.points, errors, strict=True):
        row = f"{per_sm / 1024:7.1f} {measured:8.3f} {measured + err:6.3f} {err:+6.3f}"
        lines.append(f"  {kernel:24s} {row}  {config}")
    return lines


def _kernel_lines(names: Sequence[str], machine: Machine, model: Fit) -> list[str]:
    need = machine.need_per_sm(model.latency_ns)
    lines = [
        f"{machine.name} ({machine.arch}, {machine.sms} SMs, copy {machine.copy_gbps / 1000:.2f} TB/s: "
        f"{machine.source}); latency {model.latency_ns:.0f} ns -> need {need / 1024:.1f} KiB per SM",
        f"  {'kernel':24s} {'regs':>4s} {'thr':>5s} {'CTA/SM':>6s} {'KiB/CTA':>7s} {'KiB/SM':>7s} "
        f"{'x need':>6s} {'model':>6s}",
    ]
    for name in names:
        occ = occupancy(
            name,
            representative_variant(name),
            production_config(name, machine.arch, model.device),
            machine.arch,
        )
        per_sm = occ.bytes_per_sm
        lines.append(
            f"  {name:24s} {occ.registers:4d} {occ.threads:5d} {occ.ctas:6d} {occ.bytes_per_cta / 1024:7.1f} "
            f"{per_sm / 1024:7.1f} {per_sm / need:6.2f} {model.predict(per_sm):6.3f}"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--kernels", nargs="+", default=registry.modelled(), help="registry names (default: all modelled)"
    )
    parser.add_argument("--calibration", type=Path, default=CALIBRATION, help="measured points (JSON)")
    args = parser.parse_args(argv)
    print("compiling each kernel's representative variant per arch (a minute or two) ...", flush=True)
    fits = calibrate(args.calibration)
    for result in fits.values():
        print("\n".join(_fit_lines(result)) + "\n")
    if "H200" not in fits:
        raise SystemExit("no H200 points in the calibration: B200's latency and plateau come from H200's fit")
    for name, machine in MACHINES.items():
        model = fits.get(name) or Fit(machine, fits["H200"].latency_ns, fits["H200"].plateau, [])
        print("\n".join(_kernel_lines(args.kernels, machine, model)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
