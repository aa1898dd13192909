"""``torch_bindings.ep`` (SPEC section 9) against ``reference.ep_dispatch`` / ``ep_combine``.

R ranks are simulated in one process (``ep.simulate_dispatch``: the real path's steps and kernels,
R local buffers addressed through the same pointer table); the real multi-GPU run is
``tests/support/ep_multigpu.py`` under torchrun (``test_multigpu_under_torchrun``, where >= 2 GPUs exist).
The two-rank ``SymmetricPool`` tests on CPU run the PyTorch routing's count exchange and ticket check
(``post_counts`` / ``received_counts``); the GPU path's (the route kernel's post, the layout kernel's
ticket flag) is tests/moe/test_ep_route_gpu.py's.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tests.conftest import no_sync
from tests.support.ep_cases import KINDS, assert_dispatch_matches, routing
from tests.support.ep_cases import assert_same as _same
from torch_bindings import ep
from torch_bindings import reference as ref

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _run_case(device, ranks, tokens, hidden, topk, experts, recipe, alignment, kind, rng, calls=2):
    """``calls`` dispatch + combine rounds on one simulated pool (buffers reused: stale rows must
    be cleared), each checked byte for byte."""
    pool = ep.LocalPool(ranks, torch.device(device))
    for _ in range(calls):
        gen = torch.Generator().manual_seed(rng.randrange(2**31))
        xs = [(torch.randn(tokens, hidden, generator=gen) * 4).bfloat16().to(device) for _ in range(ranks)]
        ids = routing(kind, ranks, tokens, topk, experts, rng, device)
        got = ep.simulate_dispatch(xs, ids, experts, pool, recipe=recipe, alignment=alignment)
        want = ref.ep_dispatch(xs, ids, experts, recipe=recipe, alignment=alignment)
        for r in range(ranks):
            assert_dispatch_matches(got[r], want[r], f"rank {r}")
        width = 64
        ys = [
            torch.randn(got[0].q.shape[0], width, generator=gen).bfloat16().to(device) for _ in range(ranks)
        ]
        ws = [torch.rand(tokens, topk, generator=gen).to(device) for _ in range(ranks)]
        outs = ep.simulate_combine(ys, got, ws)
        for r, expected in enumerate(ref.ep_combine(ys, want[0]["pair_rows"], ws)):
            _same(outs[r], expected, f"rank {r} combine")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", ["mxfp8", "fp8_rowwise", "bf16"])
@pytest.mark.parametrize(
    "ranks,tokens,hidden,topk,experts,alignment,kind",
    [
        (1, 64, 256, 2, 4, 32, "random"),
        (1, 100, 128, 8, 16, 16, "one_expert"),
        (2, 50, 128, 3, 8, 32, "random"),
        (2, 40, 384, 4, 4, 128, "same_rank"),
        (4, 33, 256, 8, 8, 32, "dropped"),
        (4, 17, 128, 2, 16, 64, "empty_runs"),
        (3, 129, 512, 1, 3, 32, "one_expert"),
    ],
)
def test_dispatch_combine_match_reference(
    device, recipe, ranks, tokens, hidden, topk, experts, alignment, kind
):
    _run_case(device, ranks, tokens, hidden, topk, experts, recipe, alignment, kind, random.Random(tokens))


def fuzz_cases(seed: int, count: int):
    """Seeded EP cases favouring the edges: R up to 8, one-row and tile-sized groups, skewed routing."""
    rng = random.Random(seed)
    for _ in range(count):
        ranks = rng.choice([1, 1, 2, 3, 4, 8])
        local = rng.choice([1, 2, 3, 8, 32])
        tokens = rng.choice([1, 2, 31, 32, 33, 127, 128, 129, 300])
        yield dict(
            ranks=ranks,
            tokens=tokens,
            hidden=rng.choice([128, 256, 640]),
            topk=rng.choice([1, 2, 4, 8]),
            experts=ranks * local,
            recipe=rng.choice(["mxfp8", "fp8_rowwise", "bf16"]),
            alignment=rng.choice([16, 32, 64, 128]),
            kind=rng.choice(KINDS),
        )


@pytest.mark.parametrize("device", DEVICES)
def test_fuzzed_routing(device):
    count = int(os.environ.get("EP_FUZZ_CASES", "24" if device == "cuda" else "8"))
    for i, case in enumerate(fuzz_cases(2026, count)):
        try:
            _run_case(device, **case, rng=random.Random(i), calls=2)
        except AssertionError as err:
            raise AssertionError(f"fuzz case {i}: {case}: {err}") from None


@pytest.mark.parametrize("device", DEVICES)
def test_autograd_pair_matches_spec(device):
    """bf16 dispatch -> y = 2 q - 1 -> combine; the gradients are SPEC's moves: x's a combine of
    q's gradient with unit weights, y's a dispatch of the weighted output gradient per slot."""
    tokens, hidden, topk, experts = 40, 128, 3, 8
    gen = torch.Generator().manual_seed(3)
    x0 = torch.randn(tokens, hidden, generator=gen).bfloat16().to(device)
    ids = torch.randint(0, experts, (tokens, topk), generator=gen).to(device)
    w0 = torch.rand(tokens, topk, generator=gen).to(device)
    g = torch.randn(tokens, hidden, generator=gen).bfloat16().to(device)
    x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    res = ep.dispatch(x, ids, num_experts=experts, recipe="bf16")
    out = ep.combine((res.q.float() * 2 - 1).bfloat16(), res, w)
    out.backward(g)
    disp = ref.ep_dispatch([x0], [ids], experts, recipe="bf16")[0]
    per_pair = (g.float()[:, None] * w0[:, :, None]).bfloat16()
    grad_q = (ref.ep_dispatch([per_pair], [ids], experts, recipe="bf16")[0]["q"].float() * 2).bfloat16()
    grad_x = ref.ep_combine([grad_q], disp["pair_rows"], [torch.ones_like(w0)])[0]
    _same(x.grad, grad_x, "grad x")
    y = (disp["q"].float() * 2 - 1).bfloat16()
    grad_w = (g.float()[:, None] * y[disp["pair_rows"][0]].float()).sum(-1)
    assert torch.equal(w.grad, grad_w)


@pytest.mark.parametrize("device", DEVICES)
def test_expert_that_saves_q_gets_its_weight_gradient(device):
    """An expert saving the dispatched q for its backward (q @ W.T) must see q, not combine's
    backward rows: the gradient dispatch writes buffers of its own."""
    tokens, hidden, topk, experts = 48, 128, 2, 4
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(tokens, hidden, generator=gen).bfloat16().to(device)
    ids = torch.randint(0, experts, (tokens, topk), generator=gen).to(device)
    w_route = torch.rand(tokens, topk, generator=gen).to(device)
    weight = torch.randn(hidden, hidden, generator=gen).bfloat16().to(device).requires_grad_()
    res = ep.dispatch(x, ids, num_experts=experts, recipe="bf16")
    out = ep.combine(res.q @ weight.t(), res, w_route)
    g = torch.randn(tokens, hidden, generator=gen).bfloat16().to(device)
    out.backward(g)
    q = ref.ep_dispatch([x], [ids], experts, recipe="bf16")[0]["q"]
    per_pair = (g.float()[:, None] * w_route[:, :, None]).bfloat16()
    grad_y = ref.ep_dispatch([per_pair], [ids], experts, recipe="bf16")[0]["q"]
    # The same product on the same device; a tolerance only for cuBLAS's choice of algorithm (an
    # overwritten q gives a different matrix altogether).
    torch.testing.assert_close(weight.grad.float(), (grad_y.t() @ q).float(), rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
def test_combine_with_more_tokens_than_a_grid_row():
    """T > 65535 tokens: combine's grid puts tokens along x."""
    tokens, hidden, experts = 70000, 64, 2
    x = torch.randn(tokens, hidden, device="cuda").bfloat16()
    ids = torch.randint(0, experts, (tokens, 1), device="cuda")
    w = torch.rand(tokens, 1, device="cuda")
    res = ep.dispatch(x, ids, num_experts=experts, recipe="bf16")
    out = ep.combine(res.q, res, w)
    want = ref.weighted_slot_sum(x[:, None], w)
    _same(out, want, "combine")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("by_src", [False, True])
def test_scatter_rows_bias_and_destination_by_source(device, by_src):
    """The row scatter's ``bias`` (added before the skip test) and ``by_src`` (item i goes where
    ``dst_index[src_rows[i]]`` says; a source row outside ``dst_index`` skips) against the moves
    written out in Python, into R = 2 local buffers, with source rows outside ``src`` (zero rows)
    and indices that skip."""
    gen = torch.Generator().manual_seed(int(by_src))
    ranks, height, width, items = 2, 60, 64, 90
    src = torch.randn(50, width, generator=gen).bfloat16()
    src_rows = torch.randint(-3, 56, (items,), generator=gen, dtype=torch.int32)
    # distinct destinations (as tags are), some skipped (-1, 0 before the bias) and some past the
    # buffers; by source row, fewer than the largest source row (rows 40-55 are outside it)
    dst_index = (torch.randperm(ranks * height + 4, generator=gen)[: 40 if by_src else items] - 1).to(
        torch.int32
    )
    dst_index[:2] = torch.tensor([0, -1], dtype=torch.int32)
    src_rows[:3] = torch.tensor([0, 1, 45], dtype=torch.int32)  # by source row: tag 0, -1, outside
    buffers = [torch.full((height, width), 7.0).bfloat16() for _ in range(ranks)]
    want = [b.clone() for b in buffers]
    for i in range(items):
        j = int(src_rows[i]) if by_src else i
        if not 0 <= j < dst_index.shape[0]:
            continue
        d = int(dst_index[j]) - 1
        if 0 <= d < ranks * height:
            row = int(src_rows[i])
            moved = src[row] if 0 <= row < src.shape[0] else torch.zeros(width).bfloat16()
            want[d // height][d % height] = moved
    got = [b.to(device) for b in buffers]
    ptrs = torch.tensor([b.data_ptr() for b in got], dtype=torch.int64, device=device)
    shared = ep.SharedRows(got[0], ptrs, ptrs[0:1], got)
    ep.scatter_rows(src.to(device), shared, src_rows.to(device), dst_index.to(device), bias=-1, by_src=by_src)
    for r in range(ranks):
        _same(got[r].cpu(), want[r], f"buffer {r}")


def test_combine_spread_order_is_a_permutation_far_from_row_order():
    """Combine's send order with several ranks (``_spread_order``): every row once, and neighbouring
    items at least a fifth of the rows apart (rows of one source are contiguous runs)."""
    from torch_bindings.moe.ep import _spread_order

    for n in [*range(0, 70), 1000, 4096, 65536, 69632]:
        order = _spread_order(n, torch.device("cpu")).tolist()
        assert sorted(order) == list(range(n)), n
        if n >= 16:
            gaps = [min(abs(a - b), n - abs(a - b)) for a, b in zip(order[:-1], order[1:], strict=True)]
            assert min(gaps) >= n // 5, (n, min(gaps))


@pytest.mark.parametrize("device", DEVICES)
def test_public_r1_matches_reference(device):
    tokens, hidden, topk, experts = 300, 256, 4, 16
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(tokens, hidden, generator=gen).bfloat16().to(device)
    ids = torch.randint(0, experts, (tokens, topk), generator=gen).to(device)
    res = ep.dispatch(x, ids, num_experts=experts)
    want = ref.ep_dispatch([x], [ids], experts)[0]
    _same(res.q, want["q"], "q")
    _same(res.scales, want["scales"], "scales")
    assert res.q.shape[0] == ref.ep_rows(1, tokens, topk, experts, 32)


@pytest.mark.gpu
def test_no_host_sync_after_first_call():
    x = torch.randn(256, 512, device="cuda").bfloat16()
    ids = torch.randint(0, 8, (256, 4), device="cuda")
    w = torch.rand(256, 4, device="cuda")
    for recipe in ("mxfp8", "fp8_rowwise", "bf16"):
        res = ep.dispatch(x, ids, num_experts=8, recipe=recipe)
        ep.combine(torch.zeros(res.q.shape[0], 128, device="cuda", dtype=torch.bfloat16), res, w)
        with no_sync():
            res = ep.dispatch(x, ids, num_experts=8, recipe=recipe)
            ep.combine(torch.zeros(res.q.shape[0], 128, device="cuda", dtype=torch.bfloat16), res, w)


def test_bad_arguments_name_what_is_wrong():
    x = torch.zeros(4, 256, dtype=torch.bfloat16)
    ids = torch.zeros(4, 2, dtype=torch.int64)
    with pytest.raises(TypeError, match="dispatch: x must be a 2-D tensor of dtype torch.bfloat16"):
        ep.dispatch(x.float(), ids, num_experts=4)
    with pytest.raises(ValueError, match="topk_idx must be"):
        ep.dispatch(x, ids[:3], num_experts=4)
    with pytest.raises(ValueError, match="recipe"):
        ep.dispatch(x, ids, num_experts=4, recipe="fp4")
    with pytest.raises(ValueError, match="alignment"):
        ep.dispatch(x, ids, num_experts=4, alignment=24)
    with pytest.raises(ValueError, match=r"D \(96\) must be a multiple of 128"):
        ep.dispatch(torch.zeros(4, 96, dtype=torch.bfloat16), ids, num_experts=4)
    for recipe in ("mxfp8", "fp8_rowwise", "bf16"):
        with pytest.raises(ValueError, match="dispatch: scaling_mode must be one of"):
            ep.dispatch(x, ids, num_experts=4, recipe=recipe, scaling_mode="round")
    res = ep.dispatch(x, ids, num_experts=4, recipe="bf16")
    with pytest.raises(ValueError, match="combine: y must have the dispatched"):
        ep.combine(torch.zeros(3, 8, dtype=torch.bfloat16), res, torch.ones(4, 2))
    with pytest.raises(TypeError, match="combine: y must be a 2-D tensor of dtype torch.bfloat16"):
        ep.combine(torch.zeros(res.q.shape[0], 8), res, torch.ones(4, 2))
    with pytest.raises(ValueError, match=r"D' \(12\) must be a multiple of 8"):
        ep.combine(torch.zeros(res.q.shape[0], 12, dtype=torch.bfloat16), res, torch.ones(4, 2))
    with pytest.raises(ValueError, match="topk_weights"):
        ep.combine(torch.zeros(res.q.shape[0], 8, dtype=torch.bfloat16), res, torch.ones(4, 3))


class _Recipe(str):
    """A str subclass: the checks compare a choice with its own type, so it is refused."""


def test_fast_dispatch_check_is_as_strict_as_the_full_check():
    """``checks.fast_ep_dispatch_ok`` lets ``dispatch`` skip its full checks: over every combination
    of the good and bad arguments below, whatever it accepts the full check accepts, and it accepts
    every valid one but those with a tensor or int subclass (valid calls do not silently take the
    slow checks)."""
    import enum

    from torch_bindings import checks

    class Count(enum.IntEnum):
        FOUR = 4

    base = torch.zeros(8 * 256 + 8, dtype=torch.bfloat16)
    xs = {
        "good": base[:2048].view(8, 256),
        "misaligned": base[4 : 2048 + 4].view(8, 256),  # 8 bytes off: only the kernels' (CUDA) limit
        "fp32": torch.zeros(8, 256),
        "3-D": torch.zeros(8, 256, 1, dtype=torch.bfloat16),
        "strided": torch.zeros(8, 512, dtype=torch.bfloat16)[:, ::2],
        "D 96": torch.zeros(8, 96, dtype=torch.bfloat16),
        "D 16": torch.zeros(8, 16, dtype=torch.bfloat16),
        "subclass": torch.nn.Parameter(torch.zeros(8, 256, dtype=torch.bfloat16), requires_grad=False),
        "not a tensor": [[0.0] * 256] * 8,
    }
    ids = {
        "good": torch.zeros(8, 2, dtype=torch.int64),
        "int32 strided": torch.zeros(2, 8, dtype=torch.int32).t(),
        "int16": torch.zeros(8, 2, dtype=torch.int16),
        "T 7": torch.zeros(7, 2, dtype=torch.int64),
        "1-D": torch.zeros(16, dtype=torch.int64),
        "other device": torch.zeros(8, 2, dtype=torch.int64, device="meta"),
        "not a tensor": [[0, 1]] * 8,
    }
    scalars = itertools.product(
        [4, 6, 0, True, 4.0, Count.FOUR],  # num_experts (R = 2)
        ["mxfp8", "fp8_rowwise", "bf16", "fp4", _Recipe("bf16")],  # recipe
        [32, 16, 24, True],  # alignment
        ["rceil", "floor", "round", None],  # scaling_mode
    )
    for (xn, x), (idn, idx), (experts, recipe, align, mode) in itertools.product(
        xs.items(), ids.items(), list(scalars)
    ):
        case = (xn, idn, experts, recipe, align, mode)
        fast = checks.fast_ep_dispatch_ok(x, idx, experts, 2, recipe, align, mode)
        try:
            checks.check_ep_dispatch(x, idx, experts, 2, recipe, align, mode)
            valid = True
        except (TypeError, ValueError):
            valid = False
        assert valid or not fast, f"fast check accepts what the full check refuses: {case}"
        if valid and xn != "subclass" and type(experts) is int:
            assert fast, f"fast check declines a valid call: {case}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("recipe", ["mxfp8", "fp8_rowwise", "bf16"])
def test_no_grad_calls_match_the_autograd_calls(device, recipe, monkeypatch):
    """Without a gradient to carry (no input requires one, ``no_grad``, ``inference_mode``),
    dispatch and combine skip their autograd functions: the same bytes as with them, no autograd
    node. A gradient needed by the weights alone keeps combine's function; forward-mode AD still
    reaches the functions, which raise (no jvp) rather than drop the tangent."""
    from torch.autograd import forward_ad

    tokens, hidden, topk, experts = 40, 256, 3, 8
    gen = torch.Generator().manual_seed(17)
    x = torch.randn(tokens, hidden, generator=gen).bfloat16().to(device)
    ids = torch.randint(0, experts, (tokens, topk), generator=gen).to(device)
    w = torch.rand(tokens, topk, generator=gen).to(device)
    tracked = ep.dispatch(x.clone().requires_grad_(), ids, num_experts=experts, recipe=recipe)
    assert (tracked.q if recipe == "bf16" else tracked.grad_anchor).grad_fn is not None
    y = torch.randn(tracked.q.shape[0], 64, generator=gen).bfloat16().to(device)
    want = ep.combine(y.clone().requires_grad_(), tracked, w)
    assert ep.combine(y, tracked, w.clone().requires_grad_()).grad_fn is not None

    def refuse(*args):
        raise AssertionError("an autograd function ran without a gradient to carry")

    with monkeypatch.context() as patch:
        patch.setattr(ep._DispatchFn, "apply", refuse)
        patch.setattr(ep._CombineFn, "apply", refuse)
        for mode in (contextlib.nullcontext, torch.no_grad, torch.inference_mode):
            with mode():
                plain = ep.dispatch(x, ids, num_experts=experts, recipe=recipe)
                weights = w if mode is contextlib.nullcontext else w.clone().requires_grad_()
                out = ep.combine(y, plain, weights)
            for name in ("q", "scales", "tags", "dst_index", "padded_group_end_offsets"):
                if getattr(tracked, name) is not None:
                    _same(getattr(plain, name), getattr(tracked, name), f"{mode.__name__}: {name}")
            assert (plain.q if recipe == "bf16" else plain.grad_anchor).grad_fn is None
            assert out.grad_fn is None
            _same(out, want, f"{mode.__name__}: combine")
    with forward_ad.dual_level(), pytest.raises(NotImplementedError, match="jvp"):
        ep.dispatch(forward_ad.make_dual(x, torch.ones_like(x)), ids, num_experts=experts, recipe=recipe)


@pytest.mark.parametrize("missing", ["functorch", "forward_ad"])
def test_torch_without_the_transform_state_takes_the_autograd_functions(monkeypatch, missing):
    """The no-gradient path asks torch's own (private) forward-AD and functorch state; a torch that
    lacks it sends every call through the autograd functions, with the same bytes."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(16, 256, generator=gen).bfloat16()
    ids = torch.randint(0, 4, (16, 2), generator=gen)
    want = ep.dispatch(x, ids, num_experts=4, recipe="fp8_rowwise")
    applied = []
    original = ep._DispatchFn.apply
    monkeypatch.setattr(ep._DispatchFn, "apply", lambda *a: applied.append(1) or original(*a))
    assert ep._needs_autograd(x) is False
    if missing == "functorch":
        monkeypatch.delattr(torch._C._functorch, "peek_interpreter_stack")
    else:
        monkeypatch.delattr(ep._forward_ad, "_current_level")
    assert ep._needs_autograd(x) is True
    got = ep.dispatch(x, ids, num_experts=4, recipe="fp8_rowwise")
    assert applied == [1]
    for name in ("q", "scales", "tags", "padded_group_end_offsets"):
        _same(getattr(got, name), getattr(want, name), name)


@pytest.mark.gpu
def test_misaligned_x_is_refused_before_any_launch():
    x = torch.zeros(4 * 256 + 4, dtype=torch.bfloat16, device="cuda")[4:].view(4, 256)  # 8 bytes off
    ids = torch.zeros(4, 2, dtype=torch.int64, device="cuda")
    with pytest.raises(ValueError, match="dispatch: the CuTeDSL kernels need 16-byte aligned tensors"):
        ep.dispatch(x, ids, num_experts=4, recipe="bf16")


@pytest.mark.parametrize("device", DEVICES)
def test_results_view_their_own_rows_at_r1_and_copy_out_of_a_slot_ring(device):
    """R = 1 buffers are the call's own: the result's scales and tags view them. A reused slot
    (a ``SlotRing``) is written again by later calls: its results hold copies (fp8_rowwise's scales
    and tags one copy, each with its own version counter: writing the scales in place leaves the
    tags, which the autograd contexts save, unversioned)."""
    shape = ep.EpShape(1, 4, 256, 2, 4, 32, "fp8_rowwise")
    ids = torch.tensor([[0, 1], [1, 2], [2, 3], [3, 0]], device=device)
    x = torch.randn(4, 256, device=device).bfloat16()
    pool = ep.LocalPool(1, torch.device(device))
    slot = pool.acquire("family", ep._dispatch_kinds(shape))
    routing = ep.route(ids, 4)
    lay = ep.layout(routing, pool.exchange_counts(routing, slot), 0, shape, slot.filled)
    bufs = slot.views[0]
    ep.send_dispatch(x, lay, bufs, shape, 0, "rceil")
    ep.zero_padding(lay, bufs)
    for owned in (True, False):
        res = ep.finish_dispatch(lay, bufs, shape, 0, owned=owned)
        for got, own in ((res.tags, bufs["tags"].own), (res.scales, bufs["s"].own)):
            assert (got.untyped_storage().data_ptr() == own.untyped_storage().data_ptr()) is owned
            assert torch.equal(got, own.view(-1))
        version = res.tags._version
        res.scales.mul_(1.0)
        assert res.tags._version == version and torch.equal(res.tags, bufs["tags"].own.view(-1))
    assert ep.LocalPool.owns_buffers and not ep.SlotRing.owns_buffers


@pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="needs >= 2 GPUs (tests/support/ep_multigpu.py under torchrun)"
)
def test_multigpu_under_torchrun():
    gpus = torch.cuda.device_count()
    env = {
        **os.environ,
        "NCCL_NVLS_ENABLE": "0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1",
    }
    root = Path(__file__).resolve().parents[2]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={gpus}",
        "tests/support/ep_multigpu.py",
    ]
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "cases passed" in done.stdout
    # Ranks that chose different slots: every rank stops at the device assert, none hangs. The agent
    # stops the others once one exits; polling every 5 s gives every rank the time to print its line.
    diverge = [*cmd[:3], "--monitor-interval=5", *cmd[3:], "--diverge"]
    done = subprocess.run(diverge, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0, done.stdout[-4000:] + done.stderr[-4000:]
    for rank in range(gpus):
        assert f"rank {rank}: slot assert fired" in done.stdout, done.stdout[-4000:] + done.stderr[-4000:]


def test_group_none_is_the_default_group_and_local_is_r1(monkeypatch):
    """dispatch's ``group=None`` follows torch.distributed (the default group when initialized with
    several ranks); ``ep.LOCAL`` is R = 1 whatever is initialized."""
    from tests.support.ep_cases import fake_data_parallel_world

    assert ep.resolve_group(None) is None and ep.group_size(None) == 1  # not initialized
    fake_data_parallel_world(monkeypatch)
    assert ep.resolve_group(None) is not None and ep.group_size(None) == 2
    assert ep.resolve_group(ep.LOCAL) is None and ep.group_size(ep.LOCAL) == 1
    x = torch.randn(16, 128).bfloat16()
    ids = torch.randint(0, 4, (16, 2))
    res = ep.dispatch(x, ids, num_experts=4, recipe="bf16", group=ep.LOCAL)
    assert res.shape.ranks == 1 and res.padded_group_end_offsets.shape == (4,)
    with pytest.raises(AssertionError, match="multi-rank group"):
        ep.dispatch(x, ids, num_experts=4, recipe="bf16")


def test_slot_state_views():
    """A slot with a state: ``filled``, ``prev_filled`` and ``ticket_ok`` are views of its words 0,
    1 and 2 (what the layout kernel writes); a state and a ``filled`` of its own are refused."""
    state = torch.tensor([7, 8, 1], dtype=torch.int32)
    slot = ep.Slot({}, state=state)
    state.add_(10)
    assert slot.filled.tolist() == [17] and slot.prev_filled.tolist() == [18] and int(slot.ticket_ok) == 11
    assert slot.ticket_ok.dim() == 0
    with pytest.raises(ValueError, match="not both"):
        ep.Slot({}, torch.zeros(1, dtype=torch.int32), state=state)


def _two_rank_pool(rank: int, tables: dict):
    """A ``SymmetricPool`` as ``rank`` of 2 sees it, its slots plain CPU tensors; a slot's count
    table (asked for with ``counts``) is one of two CPU tensors kept in ``tables`` (per family and
    index) and shared by both ranks' pools, so the row scatter of :meth:`post_counts` writes into
    the peer's table as it does through symmetric memory. The barrier is left to the caller's
    order of calls."""
    pool = ep.SymmetricPool.__new__(ep.SymmetricPool)
    ep.SlotRing.__init__(pool)
    pool.group, pool.ranks, pool.rank = None, 2, rank

    def allocate(family, kinds, index, counts):
        views = {n: ep.SharedRows(torch.zeros(s, dtype=d), None, None) for n, (s, d) in kinds.items()}
        table = None
        if counts:
            fresh = [torch.zeros(2, counts, dtype=torch.int32) for _ in range(2)]
            pair = tables.setdefault((family, index), fresh)
            table = ep.SharedRows(pair[rank], None, None, pair)
        return ep.Slot({rank: views}, torch.zeros(1, dtype=torch.int32), index, counts=table)

    pool._allocate = allocate
    return pool


@pytest.mark.parametrize("field", ["tokens", "hidden", "topk", "alignment", "recipe", "same"])
def test_ranks_that_disagree_on_shapes_trip_the_slot_assert(field):
    """Two ranks take slot 0 of their dispatch family and post their counts (each its own routing).
    With the same family each rank reads both ranks' counts, row r from rank r; when the families
    differ (T, D, k, alignment or recipe) their slots are different buffers, so each rank finds in
    its table a row its peer did not write for this call, and the device assert fires on both."""
    shape = ep.EpShape(2, 32, 128, 2, 4, 32, "bf16")
    other = {"tokens": 16, "hidden": 256, "topk": 4, "alignment": 64, "recipe": "mxfp8", "same": None}[field]
    peer_shape = shape if other is None else replace(shape, **{field: other})
    tables: dict = {}
    gen = torch.Generator().manual_seed(5)
    posted = []
    for rank, s in ((1, peer_shape), (0, shape)):
        pool = _two_rank_pool(rank, tables)
        slot = pool.acquire(ep._family(s, "dispatch"), ep._dispatch_kinds(s), counts=5)
        assert slot.index == 0
        routing = ep.route(torch.randint(0, 4, (32, 2), generator=gen), 4, slot.ticket)
        pool.post_counts(routing, slot)
        posted.append((pool, slot, routing))
    counts = {pool.rank: routing.counts for pool, _, routing in posted}
    assert not torch.equal(counts[0], counts[1])  # so a row in the wrong place shows
    for pool, slot, _ in posted:  # after the barrier
        if field == "same":
            assert torch.equal(pool.received_counts(slot, 4), torch.stack([counts[0], counts[1]]))
        else:
            with pytest.raises(RuntimeError):
                pool.received_counts(slot, 4)


def test_slot_ticket_is_stable_across_processes():
    """The ticket is a CRC of the family's repr, not Python's per-process salted hash: another
    interpreter (another PYTHONHASHSEED) computes the same."""
    family = ep._family(ep.EpShape(2, 32, 128, 2, 4, 32, "mxfp8"), "dispatch")
    code = (
        "from torch_bindings import ep; "
        "print(ep.slot_ticket(ep._family(ep.EpShape(2, 32, 128, 2, 4, 32, 'mxfp8'), 'dispatch'), 3))"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert int(out.stdout) == ep.slot_ticket(family, 3)
    assert 0 <= ep.slot_ticket(family, 3) < 2**31 and ep.slot_ticket(family, 3) != ep.slot_ticket(family, 4)


def _posted_pair(tables: dict, shape):
    """Both ranks of a two-rank mock take slot 0 of ``shape``'s dispatch family and post the same
    counts; returns their pools, slots and the ids."""
    ids = torch.randint(0, 4, (32, 2))
    pools = [_two_rank_pool(rank, tables) for rank in (0, 1)]
    family, kinds = ep._family(shape, "dispatch"), ep._dispatch_kinds(shape)
    slots = [pool.acquire(family, kinds, counts=5) for pool in pools]
    for pool, slot in zip(pools, slots, strict=True):
        pool.post_counts(ep.route(ids, 4, slot.ticket), slot)
    return pools, slots, ids


def test_a_replayed_slot_never_reads_a_previous_replays_row():
    """A slot a CUDA graph captured keeps its ticket for every replay, so reading its table
    overwrites the tickets: a rank whose peer did not post for this replay (their calls diverged)
    finds -1, not a row of the previous replay that would pass."""
    tables: dict = {}
    pools, slots, ids = _posted_pair(tables, ep.EpShape(2, 32, 128, 2, 4, 32, "bf16"))
    for pool, slot in zip(pools, slots, strict=True):
        slot.captured = True
        pool.received_counts(slot, 4)
        assert bool((slot.counts.own[:, 4] == -1).all())
    pools[0].post_counts(ep.route(ids, 4, slots[0].ticket), slots[0])  # the next replay, rank 0 alone
    with pytest.raises(RuntimeError):
        pools[0].received_counts(slots[0], 4)


def test_a_row_from_an_earlier_use_of_the_slot_trips_the_assert():
    """The ticket moves on with every acquire: when one rank takes the slot again and its peer does
    not (the peer holds the slot's previous result alive, so their calls diverged), the row left in
    the table by the slot's previous use does not pass for this use's."""
    shape = ep.EpShape(2, 32, 128, 2, 4, 32, "bf16")
    pools, slots, ids = _posted_pair({}, shape)
    for pool, slot in zip(pools, slots, strict=True):
        pool.received_counts(slot, 4)
    family = ep._family(shape, "dispatch")
    again = pools[0].acquire(family, ep._dispatch_kinds(shape), counts=5)
    assert again is slots[0] and again.ticket == ep.slot_ticket(family, 0) + 2  # the second use
    pools[0].post_counts(ep.route(ids, 4, again.ticket), again)
    with pytest.raises(RuntimeError):
        pools[0].received_counts(again, 4)


def test_slot_table_compares_tickets():
    """Combine's backward (no count exchange) checks the tickets every rank wrote into its slot table:
    a peer's slot of another family trips the assert."""
    shape = ep.EpShape(2, 32, 128, 2, 4, 32, "bf16")
    pool = _two_rank_pool(0, {})
    mine = pool.acquire(ep._family(shape, "grad"), ep._dispatch_kinds(shape))
    theirs = ep.slot_ticket(ep._family(replace(shape, tokens=16), "grad"), 0)
    table = torch.tensor([[mine.ticket], [theirs]], dtype=torch.int32)
    pool._slot_table = ep.Slot({0: {"ids": ep.SharedRows(table, None, None)}})
    with pytest.raises(RuntimeError):
        pool.verify(mine)
    table[1] = mine.ticket
    pool.verify(mine)
    mine.captured = True  # a replayed slot: its table is overwritten once checked
    pool.verify(mine)
    assert bool((table == -1).all())
    with pytest.raises(RuntimeError):
        pool.verify(mine)


_WITHOUT_CUTLASS = """
import importlib.abc, sys

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "cutlass":
            raise ImportError("cutlass made unimportable")

sys.meta_path.insert(0, Refuse())
import torch
import torch_bindings
from torch_bindings import ep

x, ids = torch.randn(16, 128).bfloat16(), torch.randint(0, 4, (16, 2))
for recipe in ("mxfp8", "fp8_rowwise", "bf16"):
    r = ep.dispatch(x, ids, num_experts=4, recipe=recipe)
    ep.combine(torch.zeros(r.q.shape[0], 128, dtype=torch.bfloat16), r, torch.rand(16, 2))
assert "cutlass" not in sys.modules
print("ok")
"""


def test_ep_imports_and_runs_on_cpu_without_cutlass():
    """``import torch_bindings.ep`` and the R = 1 path on CPU need no CuTeDSL (kernels load lazily)."""
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root))
    out = subprocess.run(
        [sys.executable, "-c", _WITHOUT_CUTLASS], env=env, cwd=root, capture_output=True, text=True
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_ep_kernel_keys_are_named_and_looked_up_as_plain_tuples():
    """The EP bindings' kernel keys: each NamedTuple builds its kernel's variant from named fields,
    and ``_kernel`` finds a compiled kernel from the plain tuple of the same fields (a NamedTuple
    compares and hashes equal), compiling only on a miss."""
    pytest.importorskip("cutlass")
    from cute_kernels.combine_sum import CombineSumVariant
    from cute_kernels.ep_route import EpFillVariant, EpIdVariant
    from cute_kernels.pad import RowGatherVariant

    cases = [
        (ep.ScatterKey, ("row_scatter", "bfloat16", 16), RowGatherVariant("bfloat16", 16)),
        (ep.IdKey, ("ep_route", "int64"), EpIdVariant("int64")),
        (ep.IdKey, ("ep_layout", "int32"), EpIdVariant("int32")),
        (ep.FillKey, ("ep_zero_fill", "bfloat16", 16), EpFillVariant("bfloat16", 16)),
        (ep.CombineSumKey, ("combine_sum",), CombineSumVariant()),
    ]

    class Target:
        def __init__(self):
            self.kernels, self.compiled = {}, []

        def kernel(self, key, variant_of):
            self.compiled.append(variant_of(key, self))
            self.kernels[key] = f"kernel {len(self.compiled)}"
            return self.kernels[key]

    target = Target()
    for key_class, key, variant in cases:
        first = ep._kernel(target, key_class, key)
        assert target.compiled[-1] == variant
        assert ep._kernel(target, key_class, key) == first  # found, not compiled again
    assert len(target.compiled) == len(cases)


@pytest.mark.parametrize("recipe", ["bf16", "mxfp8", "fp8_rowwise"])
def test_new_symmetric_slots_hold_the_references_unfilled_rows(recipe):
    """A new slot of symmetric buffers starts as rows no pair filled (``ep.fill_unfilled_rows``),
    as the reference's rows past the last group read: zero bytes, and 1.0 in fp8_rowwise scale
    rows. (A slot's first call fills only its padding rows, so the rows past the last group keep
    these values; 2 H200 caught fp8_rowwise scales of 0.0 there.)"""
    shape = ep.EpShape(2, 16, 128, 2, 4, 32, recipe)
    ids = [torch.zeros(16, 2, dtype=torch.int64), torch.ones(16, 2, dtype=torch.int64)]
    xs = [torch.randn(16, 128).bfloat16() for _ in range(2)]
    want = ref.ep_dispatch(xs, ids, 4, recipe=recipe, alignment=32)[0]
    last = int(want["padded_group_end_offsets"][-1])
    for name, (size, dtype) in ep._dispatch_kinds(shape).items():
        own = (
            torch.full(size, 0x5A, dtype=torch.uint8).view(dtype)
            if dtype.itemsize == 1
            else torch.full(size, 7, dtype=dtype)
        )
        ep.fill_unfilled_rows(own, name)
        if name == "s" and recipe == "fp8_rowwise":
            assert last < own.shape[0] and torch.equal(want["scales"][last:], own.view(-1)[last:])
        else:
            assert not own.view(torch.uint8).any(), name
        if name == "q":
            assert torch.equal(want["q"][last:].view(torch.uint8), own[last:].view(torch.uint8))
