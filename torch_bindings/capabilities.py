"""``capabilities(device)``: which path every public op and GEMM recipe takes on a device.

Nothing here launches or compiles anything: the answers come from the same functions the ops call
(``backend.kernel_arch`` for the quantization, padding and EP kernels, ``grouped_mm.gemm_path``
for the GEMMs, ``grouped_mm.cute_gemm_reason`` and ``grouped_mm.auto_runs_own_gemm`` for the
project's own grouped GEMM, ``gemm="cute"`` / ``"cute_2d3d"``), so a report and a call cannot
disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import backend as _backend

#: The public ops that run a CuTeDSL kernel (``backend="auto"`` picks it on a supported GPU).
KERNEL_OPS = (
    "quantize_mxfp8_2d",
    "quantize_mxfp8_2d_dual",
    "quantize_mxfp8_3d",
    "quantize_fp8_2d",
    "quantize_fp8_2d_dual",
    "quantize_fp8_3d",
    "quantize_fp8_3d_dual",
    "swizzle_scales",
    "pad_token_groups",
    "unpad_token_groups",
    "pad_and_quantize_mxfp8_2d",
    "pad_and_quantize_fp8_2d_cols",
    "pad_and_quantize_fp8_2d_dual",
    "ep.dispatch",
    "ep.combine",
)
GEMM_RECIPES = ("fp8_rowwise", "mxfp8", "bf16")
#: ``Capabilities.cute_gemm`` values: ``gemm="auto"`` runs the project's own grouped GEMM here
#: (``grouped_mm.AUTO_OWN_GEMM_DEVICES``); ``gemm="cute"`` (and ``"cute_2d3d"``) runs here when asked
#: for, but ``"auto"`` keeps torch's GEMM (a part where it was not measured:
#: notes/grouped-gemm-sm90.md); or it cannot run here.
CUTE_AUTO, CUTE_OPT_IN, CUTE_UNAVAILABLE = "auto", "opt-in", "unavailable"


@dataclass(frozen=True)
class Capabilities:
    """What runs where on ``device``: ``ops`` (op -> ``"cute"``, ``"reference"`` or
    ``"unavailable"``: ``backend="auto"`` raises there, and ``backend="reference"`` must be asked
    for), ``gemm`` (recipe -> ``"cute"``, ``"native"`` or ``"emulated"``, what ``gemm="auto"``
    runs), ``arch`` (the kernels' compile target, or ``None``), ``reason`` (why the kernels cannot
    run, or ``""``) and ``cute_gemm`` (recipe -> :data:`CUTE_AUTO`, :data:`CUTE_OPT_IN` or
    :data:`CUTE_UNAVAILABLE`: the project's own grouped GEMM, ``gemm="cute"``, for the recipes it
    has: fp8_rowwise)."""

    device: str
    arch: str | None
    reason: str
    ops: dict[str, str]
    gemm: dict[str, str]
    cute_gemm: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"device {self.device}: kernels {self.arch or 'unavailable'}"]
        if self.reason:
            lines.append(f"  why: {self.reason}")
        lines += [f"  {op:28s} {path}" for op, path in self.ops.items()]
        lines += [f"  GEMM {recipe:23s} {path}" for recipe, path in self.gemm.items()]
        lines += [
            f"  GEMM {recipe:23s} gemm='cute' (the project's own): {state}"
            for recipe, state in self.cute_gemm.items()
        ]
        return "\n".join(lines)


def capabilities(device: torch.device | str | int | None = None) -> Capabilities:
    """The path each public op (``backend="auto"``) and each GEMM recipe (``gemm="auto"``) takes on
    ``device`` (default: the current CUDA device if there is one, else the CPU), and whether the
    project's own ``gemm="cute"`` can run there and whether ``"auto"`` picks it."""
    from .checks import CUTE_GEMM_RECIPES
    from .moe.grouped_mm import auto_runs_own_gemm, cute_gemm_reason, gemm_path_quiet

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    arch, reason = _backend.kernel_arch(device)
    if arch is not None:
        path = "cute"
    elif device.type == "cuda":
        path = "unavailable"
    else:
        path = "reference"
    ops = dict.fromkeys(KERNEL_OPS, path)
    gemm = {recipe: gemm_path_quiet(recipe, device) for recipe in GEMM_RECIPES}
    cute = {
        recipe: CUTE_UNAVAILABLE
        if cute_gemm_reason(device)
        else CUTE_AUTO
        if auto_runs_own_gemm(recipe, device)
        else CUTE_OPT_IN
        for recipe in CUTE_GEMM_RECIPES
    }
    return Capabilities(str(device), arch, reason, ops, gemm, cute)


__all__ = ["Capabilities", "capabilities"]
