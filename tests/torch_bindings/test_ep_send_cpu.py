"""``torch_bindings.ep_send.quantize_and_send`` on CPU (the reference's moves) against the existing
quantizers and the scatter rules, item by item: R = 1..4 destination buffers simulated as local
tensors, dropped slots, bad indices, dirty buffers (rows no item names keep their bytes), special
values; and the argument checks (raised before any launch)."""

from __future__ import annotations

import random

import pytest
import torch

from tests.support.ep_send_cases import (
    RECIPES,
    assert_buffers_equal,
    destinations,
    expected_moves,
    make_buffers,
    snapshot,
    special_rows,
)
from torch_bindings import reference as ref
from torch_bindings.ep_send import PeerBuffers, SendBuffers, buffer_specs, quantize_and_send


@pytest.mark.parametrize("recipe,options", RECIPES)
@pytest.mark.parametrize(
    "tokens,hidden,topk,ranks",
    [(1, 32, 1, 1), (7, 64, 2, 1), (13, 96, 3, 2), (33, 256, 4, 3), (20, 160, 8, 4), (0, 64, 2, 2)],
)
def test_moves_match_the_quantizers(recipe, options, tokens, hidden, topk, ranks):
    seed = tokens * 1000 + hidden + topk + ranks
    gen = torch.Generator().manual_seed(seed)
    rows = max(tokens * topk // ranks + 5, 1)
    x = special_rows(tokens, hidden, gen)
    index = destinations(tokens, topk, ranks, rows, gen)
    buffers = make_buffers(recipe, ranks, rows, hidden, seed)
    before = snapshot(buffers)
    rank = seed % 5
    quantize_and_send(x, index, buffers, recipe=recipe, rank=rank, topk=topk, **options)
    want = expected_moves(x, index, before, recipe, rank, topk, options)
    assert_buffers_equal(snapshot(buffers), want, f"{recipe} {options}")


@pytest.mark.parametrize("recipe,options", RECIPES)
def test_every_slot_dropped_or_bad_writes_nothing(recipe, options):
    gen = torch.Generator().manual_seed(5)
    x = special_rows(9, 64, gen)
    buffers = make_buffers(recipe, 2, 16, 64, 5)
    before = snapshot(buffers)
    index = torch.tensor([-1, -5, 32, 33, 2**31 - 1, -(2**31)] * 3, dtype=torch.int32)
    quantize_and_send(x, index.view(9, 2), buffers, recipe=recipe, rank=1, topk=2, **options)
    assert_buffers_equal(snapshot(buffers), before, "nothing written")


def test_tags_and_rows_of_one_rank_to_itself():
    """R = 1, every pair kept, in order: buffer row i holds item i's tag and token i // k's row."""
    tokens, hidden, topk, rank = 6, 64, 3, 2
    x = torch.randn(tokens, hidden).bfloat16()
    buffers = make_buffers("bf16", 1, tokens * topk, hidden, 1)
    quantize_and_send(
        x, torch.arange(tokens * topk, dtype=torch.int32), buffers, recipe="bf16", rank=rank, topk=topk
    )
    tags = buffers.tags.own.view(-1)
    assert tags.tolist() == [rank * tokens * topk + i + 1 for i in range(tokens * topk)]
    assert torch.equal(buffers.q.own, x.repeat_interleave(topk, 0))
    assert torch.equal(ref.ep_send_tags(rank, tokens, topk), buffers.tags.own)


def test_reference_rows_are_the_public_quantizers():
    x = torch.randn(5, 96).bfloat16()
    q, s = ref.ep_send_rows(x, recipe="fp8_rowwise", round_scales_to_power_of_2=False)
    q2, s2 = ref.quantize_fp8_2d(x, axis="row", round_scales_to_power_of_2=False)
    assert torch.equal(q.view(torch.uint8), q2.view(torch.uint8)) and torch.equal(s.view(-1), s2)
    q, s = ref.ep_send_rows(x, recipe="mxfp8", scaling_mode="floor")
    q2, s2 = ref.quantize_mxfp8_2d(x, blocked_scales=False, scaling_mode="floor")
    assert torch.equal(q.view(torch.uint8), q2.view(torch.uint8)) and torch.equal(
        s.view(torch.uint8), s2.view(torch.uint8)
    )
    assert ref.ep_send_rows(x, recipe="bf16")[1] is None
    with pytest.raises(ValueError, match="recipe"):
        ref.ep_send_rows(x, recipe="fp8")


def test_fuzzed_shapes_and_ranks():
    rng = random.Random(2026)
    for case in range(12):
        recipe, options = rng.choice(RECIPES)
        tokens, topk, ranks = rng.randint(0, 40), rng.randint(1, 9), rng.randint(1, 4)
        hidden = 32 * rng.randint(1, 12) if recipe == "mxfp8" else 8 * rng.randint(1, 40)
        rows = max(-(-tokens * topk // ranks) + rng.randint(0, 7), 1)
        gen = torch.Generator().manual_seed(case)
        x, index = special_rows(tokens, hidden, gen), destinations(tokens, topk, ranks, rows, gen)
        buffers = make_buffers(recipe, ranks, rows, hidden, case)
        before = snapshot(buffers)
        rank = rng.randint(0, 7)
        quantize_and_send(x, index, buffers, recipe=recipe, rank=rank, topk=topk, **options)
        want = expected_moves(x, index, before, recipe, rank, topk, options)
        assert_buffers_equal(snapshot(buffers), want, f"case {case}: {recipe} T={tokens} D={hidden}")


def test_ep_shared_rows_are_accepted():
    """``torch_bindings.ep``'s buffer objects (``SharedRows``: own, ptrs, tensors) pass as they are."""
    from torch_bindings import ep

    pool = ep.LocalPool(2, torch.device("cpu"))
    slot = pool.acquire("test", buffer_specs("mxfp8", 12, 64))
    kinds = slot.views[1]
    buffers = SendBuffers(kinds["q"], kinds["scales"], kinds["tags"])
    x = torch.randn(4, 64).bfloat16()
    index = torch.tensor([0, 13, -1, 23, 5, 12, 7, 20], dtype=torch.int32)
    quantize_and_send(x, index, buffers, recipe="mxfp8", rank=1, topk=2)
    q, s = ref.quantize_mxfp8_2d(x, blocked_scales=False)
    assert torch.equal(kinds["q"].tensors[1][1].view(torch.uint8), q[0].view(torch.uint8))  # item 1: 13
    assert torch.equal(kinds["scales"].tensors[1][11].view(torch.uint8), s[1].view(torch.uint8))  # item 3: 23
    assert kinds["tags"].tensors[0][5].item() == 1 * 8 + 4 + 1  # item 4 -> row 5 of rank 0


def test_buffer_specs():
    assert buffer_specs("mxfp8", 10, 256) == {
        "tags": ((10, 1), torch.int32),
        "q": ((10, 256), torch.float8_e4m3fn),
        "scales": ((10, 8), torch.float8_e8m0fnu),
    }
    assert buffer_specs("fp8_rowwise", 3, 16)["scales"] == ((3, 1), torch.float32)
    assert set(buffer_specs("bf16", 3, 16)) == {"q", "tags"}
    with pytest.raises(ValueError, match="recipe"):
        buffer_specs("nvfp4", 3, 16)


# --- Argument checks ---------------------------------------------------------------------------------


def _call(x=None, index=None, buffers=None, recipe="mxfp8", **kw):
    x = torch.zeros(4, 64, dtype=torch.bfloat16) if x is None else x
    index = torch.zeros(8, dtype=torch.int32) if index is None else index
    buffers = make_buffers(recipe, 2, 8, 64, 0) if buffers is None else buffers
    kw = {"rank": 0, "topk": 2, **kw}
    quantize_and_send(x, index, buffers, recipe=recipe, **kw)


def _replace_kind(buffers: SendBuffers, name: str, **fields) -> SendBuffers:
    kind = getattr(buffers, name)
    new = PeerBuffers(**{"own": kind.own, "ptrs": kind.ptrs, "tensors": kind.tensors, **fields})
    return SendBuffers(**{**{n: getattr(buffers, n) for n in ("q", "scales", "tags")}, name: new})


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(recipe="nvfp4"), ValueError, "recipe"),
        (dict(scaling_mode="even"), ValueError, "scaling_mode"),
        (dict(round_scales_to_power_of_2=1), TypeError, "round_scales_to_power_of_2"),
        (dict(rank=-1), TypeError, "rank"),
        (dict(rank=True), TypeError, "rank"),
        (dict(topk=0), TypeError, "topk"),
        (dict(x=torch.zeros(4, 64)), TypeError, "x must be"),
        (dict(x=torch.zeros(4, 48, dtype=torch.bfloat16)), ValueError, "D"),
        (dict(x=torch.zeros(4, 64, 1, dtype=torch.bfloat16)), ValueError, "x must be"),
        (dict(x=torch.zeros(64, 4, dtype=torch.bfloat16).t()), ValueError, "contiguous"),
        (dict(x=torch.zeros(4 * 64 + 1, dtype=torch.bfloat16)[1:].view(4, 64)), ValueError, "aligned"),
        (dict(index=torch.zeros(8, dtype=torch.int64)), TypeError, "dst_index"),
        (dict(index=torch.zeros(7, dtype=torch.int32)), ValueError, "T\\*k"),
        (dict(topk=3), ValueError, "T\\*k"),
    ],
)
def test_bad_arguments_raise(kwargs, error, match):
    recipe = kwargs.pop("recipe", "mxfp8")
    if recipe not in ("mxfp8", "fp8_rowwise", "bf16"):
        with pytest.raises(error, match=match):
            _call(buffers=make_buffers("mxfp8", 2, 8, 64, 0), recipe=recipe, **kwargs)
        return
    with pytest.raises(error, match=match):
        _call(recipe=recipe, **kwargs)


def test_bad_buffers_raise():
    good = make_buffers("mxfp8", 2, 8, 64, 0)
    with pytest.raises(TypeError, match="q.own"):
        _call(buffers=_replace_kind(good, "q", own=good.q.own.view(torch.uint8)))
    with pytest.raises(ValueError, match="scales.own"):
        _call(buffers=_replace_kind(good, "scales", own=torch.zeros(8, 4, dtype=torch.float8_e8m0fnu)))
    with pytest.raises(ValueError, match="tags.own"):
        _call(buffers=_replace_kind(good, "tags", own=torch.zeros(9, 1, dtype=torch.int32)))
    with pytest.raises(TypeError, match="ptrs"):
        _call(buffers=_replace_kind(good, "tags", ptrs=good.tags.ptrs.int()))
    with pytest.raises(ValueError, match="same R"):
        _call(buffers=_replace_kind(good, "tags", ptrs=good.tags.ptrs[:1]))
    with pytest.raises(ValueError, match="R >= 1"):
        _call(buffers=_replace_kind(good, "q", ptrs=good.q.ptrs[:0]))
    with pytest.raises(ValueError, match="tensors"):
        _call(buffers=_replace_kind(good, "q", tensors=None))
    with pytest.raises(ValueError, match="tensors"):
        _call(buffers=_replace_kind(good, "q", tensors=good.q.tensors[:1]))
    with pytest.raises(ValueError, match="aligned"):
        own = torch.zeros(8 * 64 + 1, dtype=torch.uint8)[1:].view(torch.float8_e4m3fn).view(8, 64)
        _call(buffers=_replace_kind(good, "q", own=own))
    bf16 = make_buffers("bf16", 2, 8, 64, 0)
    with pytest.raises(ValueError, match="no scales"):
        _call(recipe="bf16", buffers=SendBuffers(bf16.q, good.scales, bf16.tags))
    fp8 = make_buffers("fp8_rowwise", 2, 8, 64, 0)
    with pytest.raises(TypeError, match="scales.own"):
        _call(recipe="fp8_rowwise", buffers=SendBuffers(fp8.q, good.scales, fp8.tags))


def test_uint8_scale_rows_are_accepted():
    good = make_buffers("mxfp8", 2, 8, 64, 0)
    as_bytes = [t.view(torch.uint8) for t in good.scales.tensors]
    buffers = _replace_kind(good, "scales", own=as_bytes[0], tensors=as_bytes)
    x = torch.randn(4, 64).bfloat16()
    index = torch.arange(8, dtype=torch.int32)
    quantize_and_send(x, index, buffers, recipe="mxfp8", rank=0, topk=2)
    _, s = ref.quantize_mxfp8_2d(x, blocked_scales=False)
    assert torch.equal(as_bytes[0], s.view(torch.uint8).repeat_interleave(2, 0))


def test_index_range_limits():
    """R * P and the tags must fit int32: refused before any launch."""
    good = make_buffers("bf16", 1, 8, 64, 0)
    with pytest.raises(ValueError, match="int32"):
        _call(recipe="bf16", buffers=good, rank=2**30)


@pytest.mark.parametrize(
    "recipe,options,key",
    [
        ("mxfp8", {"scaling_mode": "floor"}, ("ep_send", "mxfp8", "floor", True)),
        ("fp8_rowwise", {"round_scales": False}, ("ep_send", "fp8_rowwise", "rceil", False)),
        ("bf16", {}, ("ep_send", "bf16", "rceil", True)),
    ],
)
def test_the_launch_passes_the_kernel_its_key_and_arguments(monkeypatch, recipe, options, key):
    """The CUDA launch path (``launch_send``, what ``quantize_and_send`` and ``torch_bindings.moe.ep``
    call on a GPU), with a recording kernel in place of the compiled one: its table key and its
    arguments in order (the bytes are the GPU tests')."""
    from types import SimpleNamespace

    from torch_bindings import ep_send, targets

    calls = []
    target = SimpleNamespace(kernels={key: lambda *args: calls.append(args)})
    monkeypatch.setattr(targets, "known", lambda tensor: target)
    x = torch.zeros(3, 64, dtype=torch.bfloat16)
    index = torch.zeros(6, dtype=torch.int32)
    buffers = make_buffers(recipe, 2, 8, 64, 0)
    ep_send.launch_send(x, index, buffers, ep_send.SendOptions(recipe, 1, 2, **options))
    ((x_, index_, q, q_ptrs, s, s_ptrs, tags, tag_ptrs, rank),) = calls
    scales = buffers.tags if recipe == "bf16" else buffers.scales
    assert x_ is x and index_.shape == (3, 2) and index_.data_ptr() == index.data_ptr() and rank == 1
    passed, built = (
        (q, q_ptrs, tags, tag_ptrs),
        (buffers.q.own, buffers.q.ptrs, buffers.tags.own, buffers.tags.ptrs),
    )
    assert all(a is b for a, b in zip(passed, built, strict=True))
    assert s.data_ptr() == scales.own.data_ptr() and s_ptrs is scales.ptrs
