"""The grouped-GEMM training op (SPEC section 8; docs/contract.md, "Grouped GEMM training op").

``scaled_grouped_mm(x, w, group_end_offsets, recipe=...)``: ``y[rows of g] = x[rows of g] @ w[g].T``
for x (M, K) bf16 and w (E, N, K) bf16, differentiable in x and w. Per recipe, forward and backward
quantize with this package's kernels and run three grouped GEMMs:

- forward ``y = x @ w.T`` (2d x 3d, token groups along M);
- dgrad ``grad_x = grad_y @ w`` (2d x 3d);
- wgrad ``grad_w[g] = grad_y[g].T @ x[g]`` (2d x 2d, token groups along the contraction).

torch's FP8 wgrad GEMM needs every token group to start on a 16-row boundary (32 for MXFP8), so any
group sizes work and nothing syncs: FP8 rowwise quantizes the rows of x and grad_y unpadded (its 2d
x 3d GEMM takes any group sizes) and writes their column (wgrad) operands straight into 16-row
padded groups (:func:`fp8_wgrad_cols`: ``pad_and_quantize_fp8_2d_cols``; no pad pass); MXFP8 pads
x and grad_y with :func:`pad_token_groups`, runs every GEMM on the padded copies and unpads the
outputs (notes/grouped-gemm-op.md).

GEMM paths: ``"native"`` runs ``torch._scaled_grouped_mm`` (FP8 rowwise on sm_90 / sm_100, MXFP8 on
sm_100); ``"emulated"`` dequantizes the exact quantized operands to bf16 and runs
``torch._grouped_mm``, for testing the numerics where the native GEMM is missing (CPU; MXFP8 on
Hopper). It is slower than the bf16 recipe. ``gemm="auto"`` takes the native path where it exists
and otherwise the emulation *with a one-time warning*; ``gemm="native"`` raises instead.

``gemm="cute"`` (fp8_rowwise on sm_90 only) runs the project's own grouped GEMM
(``torch_bindings.grouped_gemm_sm90``) for all three GEMMs. Its GEMMs take ragged groups, so
nothing is padded but the column (wgrad) operands, which the column quantizer writes straight into
groups padded to :data:`CUTE_WGRAD_ALIGNMENT` rows (:func:`fp8_wgrad_cols`): the wgrad then has no
group bound inside a reduction box (:func:`_cute_gemm` gives the layouts). ``"auto"`` picks it for
fp8_rowwise on the devices of :data:`AUTO_OWN_GEMM_DEVICES` (where it was measured faster than
torch's in every benchmarked shape) when the kernels run (``backend`` not ``"reference"``) and the
experts fit it (at most its ``MAX_GROUPS``); elsewhere ``"auto"`` keeps torch's GEMM.
``gemm="cute_2d3d"`` (the same limits; opt-in) runs the project's GEMM for the forward and the
dgrad only (notes/grouped-gemm-sm90.md), and torch's wgrad.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from .. import backend as _backend
from .. import checks, reference
from ..checks import CUTE_GEMM_RECIPES, CUTE_GEMMS
from ..pad import pad_token_groups, unpad_token_groups
from ..pad_quantize_fp8 import pad_and_quantize_fp8_2d_cols, pad_and_quantize_fp8_2d_dual
from ..quantize_3d import quantize_mxfp8_3d
from ..quantize_dual import quantize_mxfp8_2d_dual
from ..quantize_fp8 import quantize_fp8_2d, quantize_fp8_2d_dual, quantize_fp8_3d
from ..warn import warn_once
from .tokens import QuantizedTokens, dequant_mx

RECIPES = checks.GROUPED_MM_RECIPES
# Token-group alignment each recipe's wgrad GEMM needs (its group starts must be 16-byte aligned
# along the token dimension; MXFP8's 32-row scale blocks must not straddle groups).
GROUP_ALIGNMENT = {"fp8_rowwise": 16, "mxfp8": 32, "bf16": 1}
# The groups of the column operands the project's 2d x 2d GEMM (gemm="cute") takes: its reduction
# boxes' 128 rows (GroupedGemmConfig.reduction_align), so that no box holds a group bound
# (notes/padded-wgrad-operands.md).
CUTE_WGRAD_ALIGNMENT = 128
# GPU major versions where torch._scaled_grouped_mm runs the recipe.
_NATIVE_MAJORS = {"fp8_rowwise": (9, 10), "mxfp8": (10,)}
#: Devices (``torch.cuda.get_device_name``) where ``gemm="auto"`` runs fp8_rowwise on the project's
#: own sm_90a grouped GEMM (``"cute"``): there it was measured faster than torch's
#: ``_scaled_grouped_mm`` in the forward, the dgrad and the wgrad of every benchmarked shape
#: (notes/grouped-gemm-sm90.md, "gemm='auto'"). Other sm_90 parts keep torch's GEMM until measured.
AUTO_OWN_GEMM_DEVICES = frozenset({"NVIDIA H200"})


def emulation_warning(recipe: str, device_type: str) -> tuple[str, str, str]:
    """``warn.warn_once``'s key of the warning that ``recipe`` runs emulated on ``device_type``."""
    return ("moe.grouped_mm.emulation", recipe, device_type)


def native_gemm_reason(recipe: str, device: torch.device) -> str | None:
    """``None`` when ``torch._scaled_grouped_mm`` runs ``recipe`` on ``device``, else why not."""
    if recipe == "bf16":
        return None
    if device.type != "cuda":
        return f"torch._scaled_grouped_mm needs a CUDA device, the tensors are on {device.type}"
    capability = torch.cuda.get_device_capability(device)
    if capability[0] not in _NATIVE_MAJORS[recipe]:
        arches = " or ".join(f"sm_{m}0" for m in _NATIVE_MAJORS[recipe])
        here = f"sm_{capability[0]}{capability[1]}"
        return f"recipe {recipe!r} needs {arches} for torch._scaled_grouped_mm, this GPU is {here}"
    return None


def cute_gemm_reason(device: torch.device) -> str | None:
    """``None`` when ``gemm="cute"`` / ``"cute_2d3d"`` (the sm_90a grouped GEMM kernel) can run on
    ``device``, else why not (a CPU tensor, a GPU other than sm_90, the CuTeDSL missing)."""
    arch, reason = _backend.kernel_arch(device)
    if arch is None:
        return reason
    if arch != "sm_90a":
        return f"the kernel is built for sm_90a (Hopper) only, this GPU's target is {arch}"
    return None


_names_by_index: dict[int, str] = {}


@torch.compiler.assume_constant_result
def _device_name(index: int) -> str:
    """``torch.cuda.get_device_name(index)``, cached; under ``torch.compile`` a constant of the
    trace (dynamo cannot trace a torch call that returns a string)."""
    if index not in _names_by_index:
        _names_by_index[index] = torch.cuda.get_device_name(index)
    return _names_by_index[index]


def auto_runs_own_gemm(recipe: str, device: torch.device) -> bool:
    """Whether ``gemm="auto"`` runs ``recipe`` on the project's own grouped GEMM on ``device``: an
    fp8_rowwise call on a GPU of :data:`AUTO_OWN_GEMM_DEVICES` where the kernel runs."""
    if recipe not in CUTE_GEMM_RECIPES or device.type != "cuda" or cute_gemm_reason(device) is not None:
        return False
    return _device_name(_backend.cuda_index(device)) in AUTO_OWN_GEMM_DEVICES


def torch_gemm_path(recipe: str, device: torch.device) -> str:
    """torch's GEMM for ``recipe`` on ``device``: ``"native"``, else ``"emulated"`` (no warning)."""
    return "native" if native_gemm_reason(recipe, device) is None else "emulated"


def gemm_path_quiet(recipe: str, device: torch.device) -> str:
    """What ``gemm="auto"`` runs for ``recipe`` on ``device`` (``"cute"``, ``"native"`` or
    ``"emulated"``), with no warning: ``torch_bindings.capabilities`` reports it. A call whose
    experts the own GEMM cannot take, or with ``backend="reference"``, runs torch's instead
    (:func:`gemm_path`)."""
    return "cute" if auto_runs_own_gemm(recipe, device) else torch_gemm_path(recipe, device)


def _own_gemm_takes(experts: int | None, backend: str) -> bool:
    """Whether a call of ``experts`` groups (None: not asked) with this ``backend`` suits the
    project's own GEMM under ``gemm="auto"``: at most its ``MAX_GROUPS`` experts, and the kernels
    asked for (``backend`` not ``"reference"``)."""
    if backend == "reference":
        return False
    if experts is None:
        return True
    from cute_kernels.grouped_gemm_sm90 import MAX_GROUPS

    return experts <= MAX_GROUPS


def gemm_path(
    recipe: str, device: torch.device, gemm: str = "auto", experts: int | None = None, backend: str = "auto"
) -> str:
    """``"native"``, ``"emulated"``, ``"cute"`` or ``"cute_2d3d"``: the GEMMs a call with these
    arguments (``experts`` groups, None where not known; the quantization ``backend``) runs.
    ``gemm="native"`` raises ``RuntimeError`` where the native GEMM is missing; ``"auto"`` picks
    ``"cute"`` where :func:`auto_runs_own_gemm` and the call suits it (:func:`_own_gemm_takes`), else
    the native GEMM, else the emulation with a warning once per (recipe, device type).
    ``gemm="cute"`` and ``"cute_2d3d"`` (checked to be fp8_rowwise by ``checks``) raise
    ``RuntimeError`` where the kernel cannot run."""
    if gemm == "auto" and auto_runs_own_gemm(recipe, device) and _own_gemm_takes(experts, backend):
        return "cute"
    if gemm in CUTE_GEMMS:
        why = cute_gemm_reason(device)
        if why is not None:
            raise RuntimeError(
                f"scaled_grouped_mm: gemm={gemm!r} cannot run here: {why}. It runs the project's "
                "sm_90a FP8 grouped GEMM on an sm_90 GPU; pass gemm='auto' (torch's GEMM or the emulation)."
            )
        return gemm
    reason = native_gemm_reason(recipe, device)
    if gemm == "emulated" and recipe != "bf16":
        return "emulated"
    if reason is None:
        return "native"
    if gemm == "native":
        raise RuntimeError(f"scaled_grouped_mm: gemm='native' cannot run here: {reason}")
    # Under torch.compile the choice is made while tracing and the warning is not raised (the
    # contract says so: gemm="native" is the strict choice there; ``warn_once`` is silent then).
    warn_once(
        emulation_warning(recipe, device.type),
        f"scaled_grouped_mm: {reason}; running the {recipe} EMULATION (dequantized operands, bf16 "
        "torch._grouped_mm): same quantization numerics, slower than recipe='bf16'. Pass "
        "gemm='native' to make this an error, gemm='emulated' to silence it.",
    )
    return "emulated"


@dataclass(frozen=True)
class _Step:
    """What one call runs: the recipe, whether its torch GEMMs are emulated, whether its groups need
    no pad pass (``aligned``: they start on the recipe's alignment, offsets made by
    ``pad_token_groups`` with that alignment or a dispatch; always for fp8_rowwise, whose column
    operands come padded from their quantizer, ``cols_alignment``), the ``backend`` of its
    quantization and padding ops, and which GEMMs are the project's own (fp8_rowwise),
    ``own_gemms``: ``""`` none, ``"all"`` (``gemm="cute"``) or ``"2d3d"``, the forward and dgrad
    (``gemm="cute_2d3d"``; the wgrad is torch's)."""

    recipe: str
    emulated: bool
    aligned: bool
    backend: str = "auto"
    own_gemms: Literal["", "all", "2d3d"] = ""
    #: fp8_rowwise: the group alignment the column (wgrad) operands are written in by their quantizer
    #: (:func:`fp8_wgrad_cols`; 0: the caller's groups as they are).
    cols_alignment: int = 0

    @property
    def alignment(self) -> int:
        return GROUP_ALIGNMENT[self.recipe]

    def runs_own_gemm(self, rhs_dims: int) -> bool:
        """Whether a GEMM whose right operand has ``rhs_dims`` dims (3: 2d x 3d, forward and dgrad;
        2: the 2d x 2d wgrad) runs the project's kernel."""
        return self.own_gemms == "all" or (self.own_gemms == "2d3d" and rhs_dims == 3)


def make_step(recipe: str, gemm: str, ends: torch.Tensor, aligned: bool, backend: str, *, op: str) -> _Step:
    """The :class:`_Step` of a call with these options (:func:`gemm_path` on ``ends``' device;
    ``aligned``: the caller's groups start on the recipe's alignment). fp8_rowwise pads nothing:
    its column (wgrad) operands come in padded groups from their quantizer (``cols_alignment``:
    128 rows for ``gemm="cute"``, else 16 unless the caller's groups are aligned); mxfp8 pads
    unaligned groups. ``"cute_2d3d"`` keeps torch's wgrad (native, or the emulation where it is
    missing, then without the warning). Both cute paths take at most ``MAX_GROUPS`` experts
    (``ValueError`` naming ``group_end_offsets`` otherwise); ``"auto"`` then, and with
    ``backend="reference"``, runs torch's GEMM instead of the own one (:func:`gemm_path`)."""
    path = gemm_path(recipe, ends.device, gemm, ends.numel(), backend)
    if path in CUTE_GEMMS:
        from cute_kernels.grouped_gemm_sm90 import MAX_GROUPS

        if ends.numel() > MAX_GROUPS:
            groups = ends.numel()
            raise ValueError(
                f"{op}: gemm={path!r} takes at most {MAX_GROUPS} experts, group_end_offsets has {groups}"
            )
    torch_path = torch_gemm_path(recipe, ends.device) if path == "cute_2d3d" else path  # the wgrad's
    own_gemms = {"cute": "all", "cute_2d3d": "2d3d"}.get(path, "")
    if recipe == "fp8_rowwise":  # no pad pass: only the wgrad operands are padded, by their quantizer
        cols_alignment = CUTE_WGRAD_ALIGNMENT if path == "cute" else 0 if aligned else GROUP_ALIGNMENT[recipe]
        return _Step(recipe, torch_path == "emulated", True, backend, own_gemms, cols_alignment)
    return _Step(recipe, torch_path == "emulated", aligned or path == "cute", backend, own_gemms)


@dataclass(frozen=True)
class _Groups:
    """The token groups of one call: ``ends`` the caller's end offsets (G,) int32, ``rows`` M, and
    the aligned layout of a padded call (mxfp8 on unaligned groups): ``padded_start`` /
    ``padded_end`` (G,) int32 (None / the caller's ends when ``aligned``)."""

    ends: torch.Tensor
    rows: int
    padded_start: torch.Tensor | None
    padded_end: torch.Tensor


def _aligned(t: torch.Tensor, groups: _Groups, step: _Step) -> torch.Tensor:
    """``t`` itself when the caller's groups are aligned, else its padded copy (groups.padded_*)."""
    if step.aligned:
        return t
    return pad_token_groups(t, groups.ends, alignment=step.alignment, backend=step.backend)[0]


def _unpad(t_padded: torch.Tensor, groups: _Groups, step: _Step) -> torch.Tensor:
    return unpad_token_groups(
        t_padded, groups.ends, groups.padded_start, num_tokens=groups.rows, backend=step.backend
    )


def wgrad_mm(a: torch.Tensor, b: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """bf16 ``torch._grouped_mm`` 2d x 2d (a (N, Mp), b (Mp, K), groups along Mp) -> (G, N, K). An
    empty group's slice is 0: the CUDA kernel writes it so; the CPU fallback leaves it unwritten, so
    on CPU it is masked here (a pass over the output, CPU only)."""
    out = torch._grouped_mm(a, b, ends)
    if out.device.type == "cpu":
        sizes = ends - torch.cat([ends.new_zeros(1), ends[:-1]])
        out = torch.where((sizes > 0).view(-1, 1, 1), out, out.new_zeros(()))
    return out


# ----------------------------------------------------------------------------------------------
# The output dtype
# ----------------------------------------------------------------------------------------------


def output_dtype(x_dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The block's output dtype: the autocast dtype under autocast, else x's (bf16 or fp32)."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return x_dtype


# ----------------------------------------------------------------------------------------------
# fp8_rowwise
# ----------------------------------------------------------------------------------------------


def _dequant_rows_fp8(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """bf16 ``q * scales[..., None, :]`` for a 3d operand (E, Kc, N) with scales (E, N), or
    ``q * scales[:, None]`` for a 2d operand (M, Kc) with scales (M,)."""
    if q.dim() == 3:
        return (q.float() * scales.view(q.shape[0], 1, q.shape[2])).to(torch.bfloat16)
    return (q.float() * scales[:, None]).to(torch.bfloat16)


def _dequant_group_cols_fp8(q: torch.Tensor, scales: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """bf16 ``q[m, c] * scales[g(m) * C + c]`` for q (Mp, C), g(m) the group of row m (rows past the
    last end use the last group's scales; their q is 0)."""
    groups = ends.numel()
    rows = torch.arange(q.shape[0], device=q.device, dtype=ends.dtype)
    g = reference._group_of(rows, ends).clamp_(max=groups - 1)
    return (q.float() * scales.view(groups, -1)[g]).to(torch.bfloat16)


def _cute_gemm(a, b, scale_a, scale_b, ends) -> torch.Tensor:
    """``_fp8_gemm``'s operands (torch's layouts) given to the project's sm_90a kernel
    (``torch_bindings.grouped_gemm_sm90``), which wants every e4m3 operand row-major along the
    reduction: 2d x 3d takes a (M, Kc) as it is and b (E, Kc, N) column-major as its transpose
    (E, N, Kc) row-major (the forward's ``quantize_fp8_3d(w, axis="K")`` q as stored, the dgrad's
    ``axis="N"`` q transposed); 2d x 2d takes a (N, Mp) row-major and b (Mp, K) column-major as
    ``b.t()`` (K, Mp) row-major: column operands in :data:`CUTE_WGRAD_ALIGNMENT`-row padded groups
    (:func:`fp8_wgrad_cols`), whose Mp is a multiple of 128, so their row strides are the 16-byte
    multiples the kernel's TMA loads need, and ``ends`` their padded ends."""
    from ..grouped_gemm_sm90 import grouped_gemm_sm90

    if b.dim() == 3:
        return grouped_gemm_sm90("2d3d", a, b.transpose(-2, -1), scale_a, scale_b, ends)
    return grouped_gemm_sm90("2d2d", a, b.t(), scale_a, scale_b, ends)


def _fp8_gemm(a, b, scale_a, scale_b, ends, step: _Step) -> torch.Tensor:
    """The FP8 rowwise grouped GEMM (fast accumulation, as torchao's recipe): 2d x 3d (a (M, Kc)
    row-major, scale_a (M,); b (E, Kc, N) column-major, scale_b (E, N)) or 2d x 2d (a (N, Mp)
    row-major, b (Mp, K) column-major, group-major scales (G N,) and (G K,)); groups along M or
    along Mp by ``ends``. The project's kernel (:func:`_cute_gemm`; any groups) where
    :meth:`_Step.runs_own_gemm` says so."""
    if step.runs_own_gemm(b.dim()):
        return _cute_gemm(a, b, scale_a, scale_b, ends)
    if not step.emulated:
        return torch._scaled_grouped_mm(
            a, b, scale_a, scale_b, ends, out_dtype=torch.bfloat16, use_fast_accum=True
        )
    if b.dim() == 3:
        return torch._grouped_mm(_dequant_rows_fp8(a, scale_a), _dequant_rows_fp8(b, scale_b), ends)
    a_dq = _dequant_group_cols_fp8(a.t(), scale_a, ends).t()
    return wgrad_mm(a_dq, _dequant_group_cols_fp8(b, scale_b, ends), ends)


def fp8_wgrad_cols(t: torch.Tensor, ends: torch.Tensor, step: _Step):
    """``(q, s, wgrad_ends)``: the grouped FP8 column (wgrad) operand of t (M, C) over the groups
    ``ends``, and the group ends the wgrad GEMM takes with it. With ``step.cols_alignment`` A
    (torch's wgrad on groups that may not start on 16 rows: 16; the project's 2d x 2d GEMM:
    :data:`CUTE_WGRAD_ALIGNMENT`) q is written into groups padded to A rows
    (``pad_and_quantize_fp8_2d_cols``; ``wgrad_ends`` the padded ends); else q has t's rows and
    ``wgrad_ends`` is ``ends``."""
    if step.cols_alignment:
        q, s, _, padded_end = pad_and_quantize_fp8_2d_cols(
            t, ends, alignment=step.cols_alignment, backend=step.backend
        )
        return q, s, padded_end
    q, s = quantize_fp8_2d(t, axis="col", group_end_offsets=ends, backend=step.backend)
    return q, s, ends


def fp8_row_and_wgrad_cols(t: torch.Tensor, ends: torch.Tensor, step: _Step):
    """``(q, s, q_col, s_col, wgrad_ends)``: t's FP8 row operand (``quantize_fp8_2d(axis="row",
    group_end_offsets=ends)``'s bytes below the last end) and its column (wgrad) operand
    (:func:`fp8_wgrad_cols`'s), both from one dual (t read twice, not three times): into padded
    groups ``pad_and_quantize_fp8_2d_dual``, else ``quantize_fp8_2d_dual`` over ``ends`` (its row
    outputs bounded by the last end as the row op's: an expert-parallel dispatch's static rows past
    it are not written; notes/padded-wgrad-operands.md)."""
    if step.cols_alignment:
        q, s, q_col, s_col, _, padded_end = pad_and_quantize_fp8_2d_dual(
            t, ends, alignment=step.cols_alignment, backend=step.backend
        )
        return q, s, q_col, s_col, padded_end
    q, s, q_col, s_col = quantize_fp8_2d_dual(t, group_end_offsets=ends, backend=step.backend)
    return q, s, q_col, s_col, ends


def _fp8_cols(t: torch.Tensor, groups: _Groups, step: _Step):
    """:func:`fp8_wgrad_cols` of t over the call's groups (fp8_rowwise steps never pad: t has the
    caller's rows)."""
    return fp8_wgrad_cols(t, groups.ends, step)


def _fp8_forward(x, w, groups: _Groups, _x_aligned, step: _Step, need_w: bool, tokens):
    """y (M, N) and what backward keeps: x's wgrad operand (q_col, s_col) when w needs a gradient
    (fp8_rowwise steps never pad: x's aligned copy is x itself). Quantized ``tokens`` give the
    forward operand as they are and the wgrad operand from their dequantized rows."""
    q_w, s_w = quantize_fp8_3d(w, axis="K", backend=step.backend)
    if tokens is not None:
        q, s = tokens.q, tokens.scales
        cols = _fp8_cols(tokens.dequantized(backend=step.backend), groups, step) if need_w else (None,) * 3
    elif need_w:
        q, s, *cols = fp8_row_and_wgrad_cols(x, groups.ends, step)
    else:
        q, s = quantize_fp8_2d(x, axis="row", group_end_offsets=groups.ends, backend=step.backend)
        cols = (None,) * 3
    y = _fp8_gemm(q, q_w.transpose(-2, -1), s, s_w, groups.ends, step)
    return y, cols[:2]


def _fp8_backward(grad_y, w, groups: _Groups, saved, step: _Step, need_x: bool, need_w: bool):
    """Rows of grad_y for the dgrad and its column operand for the wgrad (both over the caller's
    groups: any sizes; the columns in padded groups where the wgrad GEMM needs them), each only when
    its gradient is asked for; both from :func:`fp8_row_and_wgrad_cols` where both are."""
    q_col_x, s_col_x = saved
    grad_x = grad_w = None
    q = s = q_col = s_col = wgrad_ends = None
    if need_x and need_w:
        q, s, q_col, s_col, wgrad_ends = fp8_row_and_wgrad_cols(grad_y, groups.ends, step)
    elif need_x:
        q, s = quantize_fp8_2d(grad_y, axis="row", group_end_offsets=groups.ends, backend=step.backend)
    elif need_w:
        q_col, s_col, wgrad_ends = _fp8_cols(grad_y, groups, step)
    if need_x:
        # (E, N, K) column-major: dgrad's right operand
        q_w, s_w = quantize_fp8_3d(w, axis="N", backend=step.backend)
        grad_x = _fp8_gemm(q, q_w, s, s_w, groups.ends, step)
    if need_w:
        # x's column operand (saved) has the layout of grad_y's, made by the same functions
        grad_w = _fp8_gemm(q_col.t(), q_col_x, s_col, s_col_x, wgrad_ends, step)
    return grad_x, grad_w


# ----------------------------------------------------------------------------------------------
# mxfp8
# ----------------------------------------------------------------------------------------------


def _mx_quantize(t: torch.Tensor, ends: torch.Tensor, step: _Step):
    """``(q_1x32, s_1x32, q_32x1, s_32x1)`` of an aligned (Mp, C): blocked M-/K-groups scales for the
    native GEMM, plain scales for the emulation (the groups start on 32-row boundaries, so the
    blocks and their values are the same)."""
    if step.emulated:
        return quantize_mxfp8_2d_dual(t, blocked_scales=False, backend=step.backend)
    return quantize_mxfp8_2d_dual(t, group_end_offsets=ends, backend=step.backend)


def _mx_gemm_emulated(kind: str, a, sa, b, sb, ends) -> torch.Tensor:
    """The emulated GEMMs on plain scales: ``"fwd"`` a 1x32 (Mp, K), b 1x32 (E, N, K);
    ``"dgrad"`` a 1x32 (Mp, N), b 32x1 (E, N, K) column-major with scales (E, K, N/32);
    ``"wgrad"`` a = grad_y 32x1 (Mp, N), b = x 32x1 (Mp, K), scales (N, Mp/32) and (K, Mp/32)."""
    if kind == "fwd":
        return torch._grouped_mm(dequant_mx(a, sa), dequant_mx(b, sb).transpose(-2, -1), ends)
    if kind == "dgrad":
        return torch._grouped_mm(
            dequant_mx(a, sa), dequant_mx(b.transpose(-2, -1), sb).transpose(-2, -1), ends
        )
    return wgrad_mm(dequant_mx(a.t(), sa), dequant_mx(b.t(), sb).t(), ends)


def _mx_gemm(kind: str, a, sa, b, sb, ends, step: _Step) -> torch.Tensor:
    if step.emulated:
        return _mx_gemm_emulated(kind, a, sa, b, sb, ends)
    if b.dim() == 3:  # a 3-D operand takes its per-expert blocked scales flattened: (E, Rp Cp)
        sb = sb.reshape(sb.shape[0], -1)
    if kind == "fwd":
        b = b.transpose(-2, -1)
    elif kind == "wgrad":
        a = a.t()
    return torch._scaled_grouped_mm(a, b, sa, sb, offs=ends, out_dtype=torch.bfloat16)


def _mx_forward(x, w, groups: _Groups, x_aligned, step: _Step, need_w: bool, tokens):
    """MXFP8 operands always come from the aligned copy (the 1x32 GEMM operands too): one dual
    quantization gives the forward's 1x32 operand and the wgrad's 32x1 operand (kept for backward).
    Quantized ``tokens`` give the 1x32 operand as they are and the 32x1 one from their dequantized
    rows."""
    if tokens is not None:
        q, s = tokens.q, (tokens.plain_scales if step.emulated else tokens.scales)
        q_col = s_col = None
        if need_w:
            _, _, q_col, s_col = _mx_quantize(
                tokens.dequantized(backend=step.backend), groups.padded_end, step
            )
    else:
        q, s, q_col, s_col = _mx_quantize(x_aligned, groups.padded_end, step)
    q_w, s_w = quantize_mxfp8_3d(w, block="1x32", blocked_scales=not step.emulated, backend=step.backend)
    out = _mx_gemm("fwd", q, s, q_w, s_w, groups.padded_end, step)
    return (out if step.aligned else _unpad(out, groups, step)), (q_col, s_col)


def _mx_backward(grad_y, w, groups: _Groups, saved, step: _Step, need_x: bool, need_w: bool):
    q_col_x, s_col_x = saved
    q, s, q_col, s_col = _mx_quantize(_aligned(grad_y, groups, step), groups.padded_end, step)
    grad_x = grad_w = None
    if need_x:
        blocked = not step.emulated
        q_w, s_w = quantize_mxfp8_3d(w, block="32x1", blocked_scales=blocked, backend=step.backend)
        grad_x = _mx_gemm("dgrad", q, s, q_w, s_w, groups.padded_end, step)
        grad_x = grad_x if step.aligned else _unpad(grad_x, groups, step)
    if need_w:
        grad_w = _mx_gemm("wgrad", q_col, s_col, q_col_x, s_col_x, groups.padded_end, step)
    return grad_x, grad_w


_FORWARD = {"fp8_rowwise": _fp8_forward, "mxfp8": _mx_forward}
_BACKWARD = {"fp8_rowwise": _fp8_backward, "mxfp8": _mx_backward}


# ----------------------------------------------------------------------------------------------
# The autograd function
# ----------------------------------------------------------------------------------------------


def wanted_grads(ctx: Any, count: int, grad_enabled: bool) -> tuple[bool, ...]:
    """The first ``count`` of ``ctx.needs_input_grad``, all False when grad mode was off at the
    call (``grad_enabled``, read by the caller: inside ``forward`` grad mode is always off). Under
    ``torch.no_grad`` autograd still reports the inputs' ``requires_grad``, but no backward will
    run, so a forward must not make backward-only operands then."""
    if not grad_enabled:
        return (False,) * count
    return tuple(ctx.needs_input_grad[:count])


def _tokens_groups(ends: torch.Tensor) -> _Groups:
    """Quantized tokens come in aligned groups: their ends are the aligned layout's."""
    return _Groups(ends, 0, None, ends)


def _groups(x: torch.Tensor, ends: torch.Tensor, step: _Step):
    """The call's groups and x's aligned copy (x itself when already aligned; else the pad, which
    also yields the aligned offsets every later GEMM and the backward reuse)."""
    if step.aligned:
        return _Groups(ends, x.shape[0], None, ends), x
    x_padded, start, end = pad_token_groups(x, ends, alignment=step.alignment, backend=step.backend)
    return _Groups(ends, x.shape[0], start, end), x_padded


class _ScaledGroupedMM(torch.autograd.Function):
    """Forward and backward of one recipe (module docstring). Backward keeps x's quantized wgrad
    operand (1 byte per element: half of x in bf16) rather than x, and w (a parameter, kept
    anyway); w's backward quantization (along N) is recomputed, not stored."""

    @staticmethod
    def forward(ctx, x, w, ends, step: _Step, tokens=None, grad_enabled: bool = True):
        need_w = wanted_grads(ctx, 2, grad_enabled)[1]
        with torch.autocast(ends.device.type, enabled=False):
            groups, x_aligned = _groups(x, ends, step) if tokens is None else (_tokens_groups(ends), x)
            y, saved = _FORWARD[step.recipe](x, w, groups, x_aligned, step, need_w, tokens)
        ctx.save_for_backward(w, ends, groups.padded_start, groups.padded_end, *saved)
        ctx.step, ctx.rows, ctx.x_dtype = step, x.shape[0], x.dtype
        return y

    @staticmethod
    def backward(ctx, grad_y):
        w, ends, padded_start, padded_end, *saved = ctx.saved_tensors
        need_x, need_w = ctx.needs_input_grad[:2]
        groups = _Groups(ends, ctx.rows, padded_start, padded_end)
        grad_y = grad_y.to(torch.bfloat16).contiguous()
        backward = _BACKWARD[ctx.step.recipe]
        grad_x, grad_w = backward(grad_y, w, groups, saved, ctx.step, need_x, need_w)
        grad_x = None if grad_x is None else grad_x.to(ctx.x_dtype)
        grad_w = None if grad_w is None else grad_w.to(w.dtype)
        return grad_x, grad_w, None, None, None, None


class _Bf16GroupedMM(torch.autograd.Function):
    """The bf16 baseline: ``torch._grouped_mm`` forward, dgrad and wgrad (any group sizes)."""

    @staticmethod
    def forward(ctx, x, w, ends):
        ctx.save_for_backward(x if ctx.needs_input_grad[1] else None, w, ends)
        return torch._grouped_mm(x, w.transpose(-2, -1), ends)

    @staticmethod
    def backward(ctx, grad_y):
        x, w, ends = ctx.saved_tensors
        need_x, need_w = ctx.needs_input_grad[:2]
        grad_y = grad_y.to(torch.bfloat16).contiguous()
        grad_x = torch._grouped_mm(grad_y, w, ends) if need_x else None
        grad_w = wgrad_mm(grad_y.t(), x, ends) if need_w else None
        return grad_x, grad_w, None


def grouped_mm_apply(x, w, ends, step: _Step) -> torch.Tensor:
    """The op without checks, for callers that padded the groups themselves: ``step.aligned``
    promises ``ends`` came from ``pad_token_groups`` (or a dispatch) with the recipe's alignment
    (for fp8_rowwise, where ``aligned`` always holds, ``step.cols_alignment == 0`` promises it).
    x (M, K) bf16/fp32 or :class:`QuantizedTokens`; w (E, N, K) bf16/fp32. Returns y (M, N) in the
    autocast dtype under autocast, else x's dtype (bf16 for quantized tokens)."""
    tokens = x if isinstance(x, QuantizedTokens) else None
    if tokens is not None:
        x = tokens.anchor()
    dtype = output_dtype(x.dtype, ends.device)
    if step.recipe == "bf16":
        y = _Bf16GroupedMM.apply(x.to(torch.bfloat16), w.to(torch.bfloat16), ends)
    else:
        y = _ScaledGroupedMM.apply(x, w, ends, step, tokens, torch.is_grad_enabled())
    return y if y.dtype == dtype else y.to(dtype)


def scaled_grouped_mm(
    x: torch.Tensor,
    w: torch.Tensor,
    group_end_offsets: torch.Tensor,
    *,
    recipe: str = "fp8_rowwise",
    out_dtype: torch.dtype = torch.bfloat16,
    gemm: str = "auto",
    backend: str = "auto",
) -> torch.Tensor:
    """Grouped GEMM ``y[rows of g] = x[rows of g] @ w[g].T`` with low-precision operands (SPEC
    section 8), differentiable in x and w.

    x (M, K) bf16 or fp32 contiguous, or :class:`QuantizedTokens` of the recipe (the dispatch's q,
    scales and padded groups: the forward GEMM takes them as they are); w (E, N, K) bf16 or fp32
    contiguous (one ``nn.Linear`` weight per expert; fp32 master weights are quantized directly);
    ``group_end_offsets`` (E,) int32 on x's device, non-decreasing, last <= M, any group sizes
    (empty groups allowed: their slice of grad_w is 0). Rows of x past the last group's end belong to
    no group: their rows of y and grad_x are unspecified (as with ``torch._grouped_mm``). Returns y
    (M, N) in the autocast dtype under ``torch.autocast``, else x's dtype (bf16 for quantized
    tokens); gradients come back in each input's dtype, only those ``needs_input_grad`` asks for.
    Recipes: ``"fp8_rowwise"`` (SPEC section 7 operands; K, N multiples of 16), ``"mxfp8"`` (SPEC
    sections 2-4 operands; K, N multiples of 32), ``"bf16"`` (``torch._grouped_mm``; K, N multiples
    of 8). ``gemm``: ``"auto"`` (``"cute"`` for fp8_rowwise where :func:`auto_runs_own_gemm`, else
    the native GEMM, or the emulation with a one-time warning), ``"native"`` (torch's; error where
    missing), ``"emulated"``, ``"cute"`` (fp8_rowwise on sm_90, at most
    256 experts: the project's own grouped GEMM, its wgrad operands in 128-row padded groups;
    ``RuntimeError`` elsewhere, CPU included) or ``"cute_2d3d"`` (the same
    limits: the project's GEMM for the forward and dgrad, torch's wgrad); see the module docstring and
    :func:`gemm_path`. ``backend``: the quantization and padding ops' (``"auto"``: the kernels on a
    supported GPU, the reference on CPU, an error on a CUDA device where the kernels cannot run;
    ``"reference"`` asks for the slow reference explicitly). No host sync in forward or backward
    (``backend="reference"`` may sync); works under ``torch.compile`` and CUDA graphs.
    """
    checks.check_scaled_grouped_mm(x, w, group_end_offsets, recipe, out_dtype, gemm, backend)
    quantized = isinstance(x, QuantizedTokens)
    step = make_step(recipe, gemm, group_end_offsets, quantized, backend, op="scaled_grouped_mm")
    return grouped_mm_apply(x, w, group_end_offsets, step)
