"""Tune a kernel's launch config on the GPU at hand: ``python -m bench.tune KERNEL [options]``.

Sweeps the kernel's declared config space (``cute_kernels.configs.spaces``: ``--space NAME``,
``--quick`` its quick space and fewer shapes) on the target's shapes, inputs rotated past L2; for
each config prints us and the ratio to a copy of the same bytes, and checks its output bytes against
the first config's (and, where the target has one, the public ops' or the reference's); then prints,
per shape class, the config with the best worst ratio. ``--write [FILE]`` merges those winners into
the tuned table (default ``cute_kernels/configs/tuned.json``) under this arch and device name: only
for the kernels configured per shape class (``quantize_fp8_row``, ``quantize_fp8_col``, ``swiglu``);
the others' choices go to ``cute_kernels/configs/sm90.py`` by hand, with the note that measured
them. Results go to ``bench/results/tune_KERNEL.json``. Exit status: 0, 1 when some config wrote
other bytes (then nothing is written), 2 without a GPU.

KERNEL (the options each reads):

- ``swizzle``: every layout's shapes (``--layouts``);
- ``quantize_1x32``: blocked and M-groups (``--dtype``; ``--space padded``: the fused-padding
  variant on seed 000's shapes);
- ``quantize_32x1``: blocked (``--groups G``: G row groups, K-groups scales, space ``groups``);
- ``quantize_dual``: checked against the two single calls (``--dtype``, ``--groups G``, ``--rows``);
- ``pad``: pad and unpad, checked against the reference (``--space full``: the whole grid);
- ``quantize_tma``: the experimental TMA 1x32 kernel, checked against the cp.async kernel
  (``--mode``);
- ``quantize_fp8_row``: per K class;
- ``quantize_fp8_col``: the amax and cast passes per shape class (``--dual``: the dual classes;
  ``--layouts``: only these of plain, groups, experts);
- ``grouped_gemm``: the sm_90a FP8 grouped GEMM's tile width and ring depth (clusters of two, and
  the default tile without a cluster) per GEMM of an expert layer (sm_90 only; its choice goes to
  ``configs/sm90.py`` by hand);
- ``swiglu``: SwiGLU + FP8 rowwise per direction and H class, checked against the reference
  (configs that spill are skipped).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.common.cli import make_parser, output_paths, progress, timing_kwargs

#: KERNEL argument -> the registry kernels it tunes.
TARGETS = {
    "swizzle": ("swizzle",),
    "quantize_1x32": ("quantize_1x32",),
    "quantize_32x1": ("quantize_32x1",),
    "quantize_dual": ("quantize_dual",),
    "pad": ("pad", "unpad"),
    "quantize_tma": ("quantize_tma",),
    "quantize_fp8_row": ("quantize_fp8_row",),
    "quantize_fp8_col": ("quantize_fp8_col_amax", "quantize_fp8_col_cast"),
    "grouped_gemm": ("grouped_gemm_sm90",),
    "swiglu": ("swiglu_fp8",),
}
#: The targets whose winners go to the tuned table (``--write``).
TABLED = ("quantize_fp8_row", "quantize_fp8_col", "swiglu")


def parser() -> argparse.ArgumentParser:
    """The command line (every target's options; each target reads the ones listed above)."""
    p = make_parser(__doc__.splitlines()[0])
    p.add_argument("kernel", choices=sorted(TARGETS), metavar="KERNEL", help=", ".join(sorted(TARGETS)))
    p.add_argument("--space", default="default", help="the config space to sweep (default: default)")
    p.add_argument(
        "--write",
        type=Path,
        nargs="?",
        const=None,
        default=False,
        metavar="FILE",
        help="merge the winners into FILE (default: cute_kernels/configs/tuned.json)",
    )
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    p.add_argument("--mode", default="rceil", choices=("floor", "rceil"))
    p.add_argument("--groups", type=int, default=0, help="G row groups (32x1, dual)")
    p.add_argument("--rows", type=int, nargs="+", help="only shapes with these row counts")
    p.add_argument("--dual", action="store_true", help="quantize_fp8_col: the dual variants' classes")
    p.add_argument("--layouts", nargs="+", default=None, help="swizzle, quantize_fp8_col: only these layouts")
    return p


def _space_name(args: argparse.Namespace) -> str:
    """The space to sweep: ``--space``, or ``groups`` for the 32x1 kernel's K-groups layout."""
    if args.space == "default" and args.kernel == "quantize_32x1" and args.groups:
        return "groups"
    return args.space


def _harness(args: argparse.Namespace, device, arch: str):
    """The sweep's GPU side: registry compiles (the FP8 column passes: spilling configs skipped,
    swizzle: configs that do not compile skipped), CUDA timing, the copy baseline."""
    import torch

    from bench.common.baselines import copy_baseline_best
    from bench.common.timing import make_rotating_inputs, time_cuda
    from bench.common.tuning import Harness
    from cute_kernels import registry
    from cute_utils.sass import compile_options, cubin_of, resource_usage

    def compile_one(name: str, variant, config):
        if name == "grouped_gemm_sm90":  # a build below the register split's count would hang
            try:
                options = compile_options(arch)
                kernel = registry.entry(name).compile(variant, arch, config=config, options=options)
            except Exception as exc:  # noqa: BLE001 - a config that does not compile is skipped
                progress(f"  {name} {config}: {type(exc).__name__}: {exc}")
                return None
            registers = max(f["registers"] for f in resource_usage(cubin_of(kernel)).values())
            if registers < config.launch_registers():
                progress(f"  {name} {config}: {registers} registers < {config.launch_registers()}, skipped")
                return None
            return kernel
        if name.startswith("quantize_fp8_col") or name == "swiglu_fp8":
            kernel = registry.entry(name).compile(variant, arch, config=config, options=compile_options(arch))
            if any(f["local_bytes"] for f in resource_usage(cubin_of(kernel)).values()):
                progress(f"  {name} {config}: spills, skipped")
                return None
            return kernel
        try:
            return registry.entry(name).compile(variant, arch, config=config)
        except Exception as exc:  # noqa: BLE001 - a config that does not compile is skipped
            progress(f"  {name} {config}: {type(exc).__name__}: {exc}")
            return None

    timing = timing_kwargs(args)
    return Harness(
        compile=compile_one,
        time=lambda fn, sets: time_cuda(fn, sets, **timing),
        copy_us=lambda nbytes: copy_baseline_best(nbytes, device, tries=args.copy_tries, **timing)[0].us,
        rotating=make_rotating_inputs,
        as_bytes=lambda t: t.view(torch.uint8).clone(),
        reset=lambda t, byte: t.view(torch.uint8).fill_(byte),
        equal=torch.equal,
        progress=progress,
    )


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.write is not False and args.kernel not in TABLED:
        print(f"error: --write: {args.kernel}'s configs are chosen in configs/sm90.py", file=sys.stderr)
        return 2
    from bench.common.device import cuda_or_none
    from cute_kernels.configs import spaces as declared

    name = _space_name(args)
    unknown = [k for k in TARGETS[args.kernel] if name not in declared.spaces(k)]
    if unknown:
        print(f"error: --space {name}: not declared for {', '.join(unknown)}", file=sys.stderr)
        return 2
    device = cuda_or_none(f"bench.tune {args.kernel}")
    if device is None:
        return 2
    if args.write is not False and args.quick:
        print("error: --quick measures other shapes than the classes': not written", file=sys.stderr)
        return 2
    import torch

    from bench import tune_cases
    from bench.common.report import report
    from bench.common.tuning import sweep, winners, write_winners
    from cute_kernels.configs import TUNED_TABLE, spaces
    from torch_bindings.backend import kernel_arch

    arch, why = kernel_arch(device)
    if arch is None:
        print(f"error: {why}", file=sys.stderr)
        return 2
    space = {k: spaces.space(k, name, quick=args.quick) for k in TARGETS[args.kernel]}
    cases: list = getattr(tune_cases, args.kernel)(args, device)
    print(f"device: {torch.cuda.get_device_name()} ({arch}), {len(cases)} cases, space {name}")
    results = sweep(cases, space, _harness(args, device, arch))
    best = winners(results)
    for kernel, per_class in best.items():
        for shape_class, config in per_class.items():
            print(f"best {kernel} {shape_class or '(all cases)'}: {config}")
    json_path, _ = output_paths(args, f"tune_{args.kernel}")
    rows = [r.row() for r in results]
    columns = list(dict.fromkeys(c for row in rows for c in row))
    report(rows, columns, f"{args.kernel} config sweep ({name})", json_path=json_path, panel_key=None)
    if not all(r.same for r in results):
        print("FAIL: some configs wrote other bytes (same=False); nothing written", file=sys.stderr)
        return 1
    if args.write is not False:
        write_winners(args.write or TUNED_TABLE, arch, torch.cuda.get_device_name(), best)
    return 0


if __name__ == "__main__":
    sys.exit(main())
