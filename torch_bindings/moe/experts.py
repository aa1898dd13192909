"""The SwiGLU expert block as two autograd nodes (SPEC section 8; notes/expert-block.md).

``experts_forward(x, w13, w2, ends, recipe=...)``: ``h13 = x w13[e].T`` (gate and up fused, the
transformers ``gate_up_proj`` layout: rows ``[0, H)`` gate, ``[H, 2H)`` up), ``h = silu(gate) * up``,
``out = h w2[e].T`` per group. The gate/up GEMM is one node, SwiGLU and the down GEMM the other
(autograd then frees h13 and accumulates w2's gradient before the gate/up backward runs); the
down node hands grad_h13's FP8 operands to the gate/up node. Forward and backward are written once
over a per-recipe set of operand functions (:class:`Fp8Rowwise`, :class:`Mxfp8`), so that

- x is quantized once (its row operand for the forward GEMM, its column operand for w13's wgrad);
- one GEMM computes gate and up; one dgrad GEMM gives x's gradient (no sum of two);
- SwiGLU and its backward come with the quantization of their outputs (FP8 rowwise: the fused
  ``swiglu_quantize_fp8`` / ``swiglu_backward_quantize_fp8`` kernels, whose SwiGLU is defined in
  exact fp32 operations (docs/contract.md section 7), then a column pass; MXFP8: PyTorch's SwiGLU
  and one dual quantization);
- weights are quantized through a :class:`WeightCache` (once per value of the parameter);
- backward computes only what ``ctx.needs_input_grad`` asks for (a frozen expert skips its wgrads,
  the first layer skips x's dgrad);
- x and the weights may be bf16 or fp32 (the quantizers read either); gradients come back in each
  input's dtype.

FP8 rowwise takes groups of any sizes and pads nothing: its 2d x 3d GEMMs take them as they are, and
the column (wgrad) operands are written into padded groups by the column quantizer itself where the
wgrad GEMM needs it (``grouped_mm.fp8_wgrad_cols``: 16 rows for torch's wgrad unless the caller's
groups are aligned, 128 rows for the project's own, ``gemm="cute"``, which ``gemm="auto"`` picks on
the devices of ``grouped_mm.AUTO_OWN_GEMM_DEVICES``; ``gemm="cute_2d3d"`` runs that kernel for the
2d x 3d GEMMs only). MXFP8's groups must start on its alignment (``GROUP_ALIGNMENT``):
:func:`experts_forward` pads unaligned groups once around the block; dispatch output and
``pad_token_groups`` output are aligned already. x may also arrive quantized
(:class:`QuantizedTokens`, from ``ep.dispatch``): its forward operand is used as it is and its
column operand is made from the dequantized rows.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch.optim.optimizer import register_optimizer_step_post_hook

from ..pad import pad_token_groups, unpad_token_groups
from ..quantize import quantize_mxfp8_2d
from ..quantize_3d import quantize_mxfp8_3d
from ..quantize_fp8 import quantize_fp8_2d, quantize_fp8_3d, quantize_fp8_3d_dual
from ..swiglu import swiglu_backward_quantize_fp8, swiglu_quantize_fp8
from . import grouped_mm as _mm
from .grouped_mm import output_dtype
from .tokens import QuantizedTokens

Tensor = torch.Tensor


# --- Weight cache ---------------------------------------------------------------------------------


class _Generation:
    """A counter that every ``torch.optim`` step moves (a global optimizer step post-hook, installed
    with the first :class:`WeightCache`), and :func:`invalidate_weight_caches` too. It is part of
    every cache stamp because some in-place updates leave a parameter's version counter where it
    was: the fused optimizers (``AdamW(fused=True)``) and writes through ``param.data``."""

    value = 0
    hooked = False

    @classmethod
    def bump(cls, *_args) -> None:
        cls.value += 1

    @classmethod
    def hook(cls) -> None:
        if not cls.hooked:
            register_optimizer_step_post_hook(cls.bump)
            cls.hooked = True


def invalidate_weight_caches() -> None:
    """Make every :class:`WeightCache` recompute its entries on their next use. Optimizer steps of
    ``torch.optim`` do this by themselves; call it after changing weights any other way that does
    not move their version counters (``param.data`` writes, an optimizer outside ``torch.optim``,
    loading a state dict into ``.data``)."""
    _Generation.bump()


class WeightCache:
    """Quantized weights, computed once per value of each weight and reused across micro-batches and
    recomputation. An entry is keyed by (name, operand format) and stamped with the weight's version
    counter, address, shape, dtype and device and the optimizer-step generation
    (:func:`invalidate_weight_caches`): an optimizer step, any in-place edit or a new tensor misses
    and recomputes it. A stale entry is dropped before its replacement is computed, so the two never
    hold memory together. Under ``torch.compile`` the cache is bypassed."""

    def __init__(self) -> None:
        self._entries: dict[tuple, tuple[tuple, tuple]] = {}
        _Generation.hook()

    def get(self, name: str, form: tuple, w: Tensor, compute) -> tuple:
        """``compute(w)``'s operands of format ``form`` (layout, recipe, emulated) for ``w`` as it is
        now, from the cache when ``w`` is unchanged."""
        if torch.compiler.is_compiling():
            return compute(w)
        try:
            stamp = (_Generation.value, w._version, w.data_ptr(), tuple(w.shape), w.dtype, w.device)
        except RuntimeError:  # an inference tensor has no version counter: never cached
            return compute(w)
        entry = self._entries.pop((name, form), None)
        if entry is not None and entry[0] == stamp:
            self._entries[(name, form)] = entry
            return entry[1]
        del entry  # the stale operands go before the new ones are made
        operands = compute(w)
        self._entries[(name, form)] = (stamp, operands)
        return operands

    def nbytes(self) -> int:
        """Bytes of device memory the cached operands hold."""
        return sum(t.nbytes for _, operands in self._entries.values() for t in operands)

    def clear(self) -> None:
        self._entries.clear()


# --- Operands per recipe --------------------------------------------------------------------------


@dataclass(frozen=True)
class Operand:
    """A quantized GEMM operand: ``q`` and its scales ``s`` (layouts per recipe, see the functions);
    ``ends``: for an FP8 rowwise column (wgrad) operand, the end offsets of its groups, which the
    wgrad GEMM takes (padded, or the call's own; None: the call's groups)."""

    q: Tensor
    s: Tensor
    ends: Tensor | None = None


def _swiglu_torch(h13: Tensor) -> Tensor:
    """bf16 ``silu(gate) * up`` as PyTorch computes it (each op rounded to bf16)."""
    gate, up = h13.chunk(2, dim=-1)
    return F.silu(gate) * up


def _swiglu_backward_torch(grad_h: Tensor, h13: Tensor) -> Tensor:
    """(M, 2H) bf16 gradient of ``silu(gate) * up`` in fp32, rounded once."""
    gate, up = h13.float().chunk(2, dim=-1)
    g = grad_h.float()
    sig = torch.sigmoid(gate)
    d_gate = g * up * sig * (1 + gate * (1 - sig))
    return torch.cat([d_gate, g * gate * sig], dim=-1).to(torch.bfloat16)


class Fp8Rowwise:
    """FP8 rowwise operands (SPEC section 7): rows of activations for the 2d x 3d GEMMs, columns per
    group for the wgrad, weights along K (forward) or N (dgrad); ``torch._scaled_grouped_mm`` with
    fast accumulation, its emulation, or the project's sm_90a kernel (``step.own_gemms``: all, or
    the 2d x 3d GEMMs: the same operands, laid out for it by ``grouped_mm._cute_gemm``,
    groups of any sizes)."""

    name = "fp8_rowwise"

    def __init__(self, step: _mm._Step) -> None:
        self.step = step

    def rows(self, t: Tensor, ends: Tensor) -> Operand:
        """Rows of t up to the last group end (a dispatch's static row count is mostly past it; the
        GEMMs never read those rows)."""
        return Operand(*quantize_fp8_2d(t, axis="row", group_end_offsets=ends, backend=self.step.backend))

    def cols(self, t: Tensor, ends: Tensor) -> Operand:
        """t's column (wgrad) operand, in padded groups where the wgrad GEMM needs them (16 rows for
        torch's on unaligned groups, 128 for the project's: ``grouped_mm.fp8_wgrad_cols``)."""
        return Operand(*_mm.fp8_wgrad_cols(t, ends, self.step))

    def operands(self, t: Tensor, ends: Tensor, rows: bool, cols: bool):
        """t's row and column operands, each only when asked for (else None): both from one dual
        (``grouped_mm.fp8_row_and_wgrad_cols``: padded or not, as the wgrad GEMM needs), else the
        single ops (the same bytes)."""
        if rows and cols:
            q, s, q_col, s_col, wgrad_ends = _mm.fp8_row_and_wgrad_cols(t, ends, self.step)
            return Operand(q, s), Operand(q_col, s_col, wgrad_ends)
        return (self.rows(t, ends) if rows else None), (self.cols(t, ends) if cols else None)

    def tokens_rows(self, tokens: QuantizedTokens) -> Operand:
        return Operand(tokens.q, tokens.scales)

    def weight(self, w: Tensor, layout: str) -> tuple:
        return quantize_fp8_3d(w, axis="K" if layout == "fwd" else "N", backend=self.step.backend)

    def weight_both(self, w: Tensor) -> tuple:
        """``(q_k, s_k, q_n, s_n)``: both layouts from one pass pair (``quantize_fp8_3d_dual``)."""
        return quantize_fp8_3d_dual(w, backend=self.step.backend)

    def forward_mm(self, a: Operand, w: tuple, ends: Tensor) -> Tensor:
        return _mm._fp8_gemm(a.q, w[0].transpose(-2, -1), a.s, w[1], ends, self.step)

    def dgrad_mm(self, a: Operand, w: tuple, ends: Tensor) -> Tensor:
        return _mm._fp8_gemm(a.q, w[0], a.s, w[1], ends, self.step)

    def wgrad_mm(self, a: Operand, b: Operand, ends: Tensor) -> Tensor:
        """``a`` (fresh) and ``b`` (saved) come from :meth:`cols` with the same groups, so ``b``'s
        layout is ``a``'s (its padded ends are not saved)."""
        wgrad_ends = ends if a.ends is None else a.ends
        return _mm._fp8_gemm(a.q.t(), b.q, a.s, b.s, wgrad_ends, self.step)

    def swiglu(self, h13: Tensor, ends: Tensor, cols: bool) -> tuple[Operand, Operand | None]:
        """h's row operand from the fused ``swiglu_quantize_fp8`` (one pass over h13's rows up to the
        last group end: a dispatch's static row count is mostly past it) and, for w2's wgrad, its
        column operand from the bf16 h that pass wrote."""
        h, q, s = swiglu_quantize_fp8(h13, group_end_offsets=ends, backend=self.step.backend)
        return Operand(q, s), (self.cols(h, ends) if cols else None)

    def swiglu_backward(self, grad_h: Tensor, h13: Tensor, ends: Tensor, rows: bool, cols: bool):
        """grad_h13's row operand from the fused ``swiglu_backward_quantize_fp8`` and its column
        operand (w13's wgrad) from the bf16 grad_h13 it wrote."""
        g13, q, s = swiglu_backward_quantize_fp8(
            grad_h, h13.contiguous(), group_end_offsets=ends, backend=self.step.backend
        )
        return (Operand(q, s) if rows else None), (self.cols(g13, ends) if cols else None)


class Mxfp8:
    """MXFP8 operands (SPEC sections 2-4): one dual quantization per activation (1x32 M-groups for the
    2d x 3d GEMMs, 32x1 K-groups for the wgrad; plain scales when emulated), weights 3D 1x32 (forward)
    and 32x1 (dgrad); ``torch._scaled_grouped_mm`` with blocked scales (sm_100) or its emulation."""

    name = "mxfp8"

    def __init__(self, step: _mm._Step) -> None:
        self.step = step

    def _both(self, t: Tensor, ends: Tensor) -> tuple[Operand, Operand]:
        q, s, q_col, s_col = _mm._mx_quantize(t, ends, self.step)
        return Operand(q, s), Operand(q_col, s_col)

    def operands(self, t: Tensor, ends: Tensor, rows: bool, cols: bool):
        """t's row and column operands, each only when asked for (else None): one dual pass when
        both are, the single 1x32 pass for rows alone (the same bits as the dual's)."""
        if rows and not cols:
            return self.rows(t, ends), None
        if not (rows or cols):
            return None, None
        both = self._both(t, ends)
        return (both[0] if rows else None), both[1]

    def rows(self, t: Tensor, ends: Tensor | None = None) -> Operand:
        if ends is None or self.step.emulated:
            return Operand(*quantize_mxfp8_2d(t, blocked_scales=False, backend=self.step.backend))
        return Operand(*quantize_mxfp8_2d(t, group_end_offsets=ends, backend=self.step.backend))

    def cols(self, t: Tensor, ends: Tensor) -> Operand:
        return self._both(t, ends)[1]

    def tokens_rows(self, tokens: QuantizedTokens) -> Operand:
        return Operand(tokens.q, tokens.plain_scales if self.step.emulated else tokens.scales)

    def weight(self, w: Tensor, layout: str) -> tuple:
        block = "1x32" if layout == "fwd" else "32x1"
        blocked = not self.step.emulated
        return quantize_mxfp8_3d(w, block=block, blocked_scales=blocked, backend=self.step.backend)

    def forward_mm(self, a: Operand, w: tuple, ends: Tensor) -> Tensor:
        return _mm._mx_gemm("fwd", a.q, a.s, w[0], w[1], ends, self.step)

    def dgrad_mm(self, a: Operand, w: tuple, ends: Tensor) -> Tensor:
        return _mm._mx_gemm("dgrad", a.q, a.s, w[0], w[1], ends, self.step)

    def wgrad_mm(self, a: Operand, b: Operand, ends: Tensor) -> Tensor:
        return _mm._mx_gemm("wgrad", a.q, a.s, b.q, b.s, ends, self.step)

    def swiglu(self, h13: Tensor, ends: Tensor, cols: bool) -> tuple[Operand, Operand | None]:
        return self.operands(_swiglu_torch(h13), ends, True, cols)

    def swiglu_backward(self, grad_h: Tensor, h13: Tensor, ends: Tensor, rows: bool, cols: bool):
        return self.operands(_swiglu_backward_torch(grad_h, h13), ends, rows, cols)


RECIPES = {"fp8_rowwise": Fp8Rowwise, "mxfp8": Mxfp8}


# --- The autograd functions ------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class ExpertsCall:
    """One call's choices: ``step`` (recipe, emulated, backend; groups aligned), ``cache`` (or None:
    weights quantized every call), ``tokens`` (x quantized already, or None), ``grad_enabled``
    (grad mode at the call: off, the forward makes no backward operands)."""

    step: _mm._Step
    cache: WeightCache | None = None
    tokens: QuantizedTokens | None = None
    grad_enabled: bool = True

    def ops(self):
        """The recipe's operand functions (:data:`RECIPES`) for this call's step."""
        return RECIPES[self.step.recipe](self.step)

    def for_backward(self) -> ExpertsCall:
        """What a context keeps: the step and the cache, not the tokens (their rows are free once
        the forward is done)."""
        return ExpertsCall(self.step, self.cache)


def _weight(call: ExpertsCall, ops, name: str, w: Tensor, layout: str) -> tuple:
    """w's operands for the ``layout`` GEMM (``"fwd"``: along K; ``"dgrad"``: along N). Cached: a
    weight that will need both (it requires a gradient) and a recipe with a dual pass get both
    layouts from one pass pair (w read twice, not three times) the first time either is asked for."""
    if call.cache is None:
        return ops.weight(w, layout)
    if w.requires_grad and hasattr(ops, "weight_both"):
        form = ("both", call.step.recipe, call.step.emulated)
        both = call.cache.get(name, form, w, ops.weight_both)
        return both[:2] if layout == "fwd" else both[2:]
    form = (layout, call.step.recipe, call.step.emulated)  # the operands' format
    return call.cache.get(name, form, w, lambda t: ops.weight(t, layout))


def _x_operands(call: ExpertsCall, ops, x: Tensor, ends: Tensor, need_cols: bool):
    """x's forward (row) operand and, when w13 needs a gradient, its wgrad (column) operand."""
    if call.tokens is not None:
        rows = ops.tokens_rows(call.tokens)
        return rows, (
            ops.cols(call.tokens.dequantized(backend=call.step.backend), ends) if need_cols else None
        )
    return ops.operands(x, ends, True, need_cols)


@dataclass(eq=False)
class _Handoff:
    """grad_h13's FP8 operands, from the down node's backward to the gate/up node's: the row operand
    (x's dgrad) when ``need_rows``, the column operand (w13's wgrad) when ``need_cols`` (both set by
    the gate/up forward). The gate/up node receives a zero-stride placeholder as h13's gradient, so
    the bf16 grad_h13 is freed as soon as its operands exist; it takes the operands and clears them
    (a retained graph's next backward hands over new ones). One backward pass at a time: two
    threads running backward through one retained graph would share it."""

    need_rows: bool = False
    need_cols: bool = False
    rows: Operand | None = None
    cols: Operand | None = None


def _placeholder_like(t: Tensor) -> Tensor:
    """A zero of t's dtype expanded to t's shape: a gradient that holds no memory."""
    return t.new_zeros(()).expand(t.shape)


def _will_run_next(ctx) -> bool:
    """Whether this backward pass will run the node that made the first input (the gate/up node):
    not under ``torch.autograd.grad(out, [w2])`` or ``backward(inputs=[w2])``, which prune it."""
    node = ctx.next_functions[0][0]
    return node is not None and torch._C._will_engine_execute_node(node)


def _pair(q: Tensor | None, s: Tensor | None) -> Operand | None:
    """The operand saved as ``_tensors(op)``."""
    return None if q is None else Operand(q, s)


def _tensors(op: Operand | None) -> tuple:
    """``(q, s)`` of an operand to save for backward, ``(None, None)`` for none."""
    return (None, None) if op is None else (op.q, op.s)


class _GateUpFn(torch.autograd.Function):
    """``h13 = x w13[e].T`` per aligned group ``ends`` (module docstring). Saves x's column operand
    (FP8, only when w13 needs a gradient, none under ``torch.no_grad``) and w13. The context keeps no
    reference to quantized input tokens: a dispatch's rows are free once the forward is done (its
    wgrad operand is the column operand saved here). Backward: x's dgrad, then w13's wgrad, on the
    operands :class:`_DownFn`'s backward hands over (its gradient argument is a placeholder)."""

    @staticmethod
    def forward(ctx, x, w13, ends, call: ExpertsCall, handoff: _Handoff):
        ops = call.ops()
        need_x, need_w13 = _mm.wanted_grads(ctx, 2, call.grad_enabled)
        with torch.autocast(ends.device.type, enabled=False):
            x_rows, x_cols = _x_operands(call, ops, x, ends, need_w13)
            h13 = ops.forward_mm(x_rows, _weight(call, ops, "w13", w13, "fwd"), ends)
        handoff.need_rows, handoff.need_cols = need_x, need_w13
        ctx.call, ctx.handoff, ctx.x_dtype = call.for_backward(), handoff, x.dtype
        ctx.save_for_backward(w13, ends, *_tensors(x_cols))
        return h13

    @staticmethod
    def backward(ctx, _placeholder):
        w13, ends, xq, xs = ctx.saved_tensors
        call, handoff = ctx.call, ctx.handoff
        ops = call.ops()
        need_x, need_w13 = ctx.needs_input_grad[:2]
        d_rows, d_cols = handoff.rows, handoff.cols
        handoff.rows = handoff.cols = None
        grad_x = grad_w13 = None
        # x's dgrad before w13's wgrad: w13's FP8 copy (uncached) and grad_h13's row operand are
        # gone before grad_w13, the largest tensor of the backward, is allocated.
        if need_x:
            grad_x = ops.dgrad_mm(d_rows, _weight(call, ops, "w13", w13, "dgrad"), ends)
            grad_x = grad_x.to(ctx.x_dtype)
        del d_rows
        if need_w13:
            grad_w13 = ops.wgrad_mm(d_cols, _pair(xq, xs), ends).to(w13.dtype)
        return grad_x, grad_w13, None, None, None


class _DownFn(torch.autograd.Function):
    """``out = silu(gate) * up`` times ``w2[e].T`` per aligned group ``ends``, from h13 (module
    docstring). Saves h13 (bf16, SwiGLU backward's input, only when h13 needs a gradient), h's
    column operand (FP8, only when w2 needs a gradient) and w2. Backward: w2's dgrad and the SwiGLU
    backward with the quantization of grad_h13 into the :class:`_Handoff` (only when the gate/up
    node will run), then w2's wgrad; w2's gradient leaves with this node, so autograd accumulates
    it before the gate/up node's backward runs."""

    @staticmethod
    def forward(ctx, h13, w2, ends, call: ExpertsCall, handoff: _Handoff):
        ops = call.ops()
        need_h13, need_w2 = _mm.wanted_grads(ctx, 2, call.grad_enabled)
        with torch.autocast(ends.device.type, enabled=False):
            h_rows, h_cols = ops.swiglu(h13, ends, cols=need_w2)
            out = ops.forward_mm(h_rows, _weight(call, ops, "w2", w2, "fwd"), ends)
        ctx.call, ctx.handoff = call.for_backward(), handoff
        ctx.save_for_backward(w2, ends, h13 if need_h13 else None, *_tensors(h_cols))
        return out

    @staticmethod
    def backward(ctx, grad_out):
        w2, ends, h13, hq, hs = ctx.saved_tensors
        call, handoff = ctx.call, ctx.handoff
        ops = call.ops()
        need_w2 = ctx.needs_input_grad[1]
        need_h13 = ctx.needs_input_grad[0] and _will_run_next(ctx)
        g = grad_out.to(torch.bfloat16).contiguous()
        del grad_out
        g_rows, g_cols = ops.operands(g, ends, need_h13, need_w2)  # one dual pass where both are needed
        grad_h13 = None
        if need_h13:
            del g
            grad_h = ops.dgrad_mm(g_rows, _weight(call, ops, "w2", w2, "dgrad"), ends)
            del g_rows
            handoff.rows, handoff.cols = ops.swiglu_backward(
                grad_h, h13, ends, rows=handoff.need_rows, cols=handoff.need_cols
            )
            del grad_h
            grad_h13 = _placeholder_like(h13)
        # w2's wgrad last: its fresh gradient is not alive through the SwiGLU backward's tensors.
        grad_w2 = ops.wgrad_mm(g_cols, _pair(hq, hs), ends).to(w2.dtype) if need_w2 else None
        return grad_h13, grad_w2, None, None, None


def _low_precision_experts(x: Tensor, w13: Tensor, w2: Tensor, ends: Tensor, call: ExpertsCall) -> Tensor:
    """The low-precision block on aligned groups as two autograd nodes (gate/up, then SwiGLU and
    down) joined by a :class:`_Handoff`: two nodes, so that autograd frees h13 and accumulates w2's
    gradient before the gate/up backward allocates w13's (notes/expert-block.md, peak memory)."""
    handoff = _Handoff()
    h13 = _GateUpFn.apply(x, w13, ends, call, handoff)
    return _DownFn.apply(h13, w2, ends, call, handoff)


# --- bf16 ---------------------------------------------------------------------------------------------


def _bf16_experts(x: Tensor, w13: Tensor, w2: Tensor, ends: Tensor) -> Tensor:
    """The bf16 baseline as two ``torch._grouped_mm`` calls on the fused weight and PyTorch's SwiGLU:
    bf16 operands (fp32 inputs cast, their gradients cast back by autograd)."""
    bf16 = torch.bfloat16
    h13 = _mm._Bf16GroupedMM.apply(x.to(bf16), w13.to(bf16), ends)
    return _mm._Bf16GroupedMM.apply(_swiglu_torch(h13), w2.to(bf16), ends)


# --- Entry point ---------------------------------------------------------------------------------------


class _PadGroups(torch.autograd.Function):
    """``pad_token_groups`` with its gradient (the unpad of the padded gradient)."""

    @staticmethod
    def forward(ctx, x, ends, alignment: int, backend: str):
        padded, start, end = pad_token_groups(x, ends, alignment=alignment, backend=backend)
        ctx.save_for_backward(ends, start)
        ctx.rows, ctx.backend = x.shape[0], backend
        ctx.mark_non_differentiable(start, end)
        return padded, start, end

    @staticmethod
    def backward(ctx, grad_padded, _grad_start, _grad_end):
        ends, start = ctx.saved_tensors
        grad = unpad_token_groups(
            grad_padded.contiguous(), ends, start, num_tokens=ctx.rows, backend=ctx.backend
        )
        return grad, None, None, None


class _UnpadGroups(torch.autograd.Function):
    """``unpad_token_groups`` with its gradient (the pad of the gradient: padding rows get 0)."""

    @staticmethod
    def forward(ctx, padded, ends, start, rows: int, alignment: int, backend: str):
        ctx.save_for_backward(ends)
        ctx.alignment, ctx.backend = alignment, backend
        return unpad_token_groups(padded, ends, start, num_tokens=rows, backend=backend)

    @staticmethod
    def backward(ctx, grad):
        (ends,) = ctx.saved_tensors
        padded = pad_token_groups(grad.contiguous(), ends, alignment=ctx.alignment, backend=ctx.backend)[0]
        return padded, None, None, None, None, None


def experts_forward(
    x: Tensor | QuantizedTokens,
    w13: Tensor,
    w2: Tensor,
    ends: Tensor,
    step: _mm._Step,
    cache: WeightCache | None = None,
) -> Tensor:
    """The expert block (module docstring) without checks: x (M, D) bf16/fp32 or
    :class:`QuantizedTokens`; w13 (E, 2H, D), w2 (E, D, H) bf16/fp32; ``ends`` (E,) int32; ``step``
    the recipe, GEMM path and backend, ``step.aligned`` whether the groups need no padding (they
    start on the recipe's alignment, as ``QuantizedTokens`` always do, or the recipe is
    fp8_rowwise, which never pads). Returns (M, D) in :func:`output_dtype`."""
    tokens = x if isinstance(x, QuantizedTokens) else None
    device = ends.device
    grad_enabled = torch.is_grad_enabled()
    if tokens is not None:
        anchor = tokens.anchor()
        dtype = output_dtype(torch.bfloat16, device)
        out = _low_precision_experts(anchor, w13, w2, ends, ExpertsCall(step, cache, tokens, grad_enabled))
        return out if out.dtype == dtype else out.to(dtype)
    dtype = output_dtype(x.dtype, device)
    if step.recipe == "bf16":
        out = _bf16_experts(x, w13, w2, ends)
    elif step.aligned:
        out = _low_precision_experts(x, w13, w2, ends, ExpertsCall(step, cache, None, grad_enabled))
    else:
        alignment = _mm.GROUP_ALIGNMENT[step.recipe]
        padded, start, end = _PadGroups.apply(x, ends, alignment, step.backend)
        call = ExpertsCall(replace(step, aligned=True), cache, None, grad_enabled)
        out = _low_precision_experts(padded, w13, w2, end, call)
        out = _UnpadGroups.apply(out, ends, start, x.shape[0], alignment, step.backend)
    return out if out.dtype == dtype else out.to(dtype)


__all__ = [
    "ExpertsCall",
    "QuantizedTokens",
    "WeightCache",
    "experts_forward",
    "invalidate_weight_caches",
    "output_dtype",
]
