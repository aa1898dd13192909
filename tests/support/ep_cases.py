"""Routing patterns and byte comparisons shared by the EP tests: ``tests/moe/test_ep.py`` (one
process) and ``tests/support/ep_multigpu.py`` (one process per GPU, every rank building every rank's
inputs from one seed)."""

from __future__ import annotations

import random
import warnings

import torch
import torch.utils.checkpoint as checkpoint

import torch_bindings as tb
from torch_bindings import ep

KINDS = ("random", "one_expert", "empty_runs", "one_rank", "same_rank", "dropped")


def routing(kind: str, ranks: int, tokens: int, topk: int, experts: int, rng: random.Random, device) -> list:
    """topk ids (T, k) of every rank, favouring the edges of the expert-major layout: all pairs to
    one expert, a few experts only (runs of empty groups, empty first/last), only rank 0's experts
    (every other rank receives nothing), all k slots on the sender's rank, dropped ids."""
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    local = experts // ranks
    out = []
    for s in range(ranks):
        ids = torch.randint(0, experts, (tokens, topk), generator=gen)
        if kind == "one_expert":
            ids[:] = rng.randrange(experts)
        elif kind == "empty_runs":
            used = torch.tensor(rng.sample(range(experts), max(1, experts // 4)))
            ids = used[torch.randint(0, used.numel(), (tokens, topk), generator=gen)]
        elif kind == "one_rank":
            ids = torch.randint(0, local, (tokens, topk), generator=gen)
        elif kind == "same_rank":
            ids = (s * local + torch.randint(0, local, (tokens, topk), generator=gen)) % experts
        elif kind == "dropped":
            ids[torch.rand(tokens, topk, generator=gen) < 0.1] = experts + 1
            ids[0, 0] = -1
        out.append(ids.to(device))
    return out


class _FakeGroup:
    group_name = "fake data-parallel world"


def fake_data_parallel_world(monkeypatch) -> list:
    """torch.distributed looks initialized with a default group of 2 ranks (a data-parallel run,
    DDP or FSDP). Returns a list that records every attempt to build multi-rank EP buffers (each
    attempt also raises)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    touched: list = []

    def refuse(*args, **kwargs):
        touched.append(args)
        raise AssertionError("multi-rank EP buffers were asked for")

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(c10d._world, "default_pg", _FakeGroup())  # dist.group.WORLD
    monkeypatch.setattr(ep, "_pool", _recording(ep._pool, touched))
    monkeypatch.setattr(ep, "_POOLS", {})
    monkeypatch.setattr(ep.SymmetricPool, "__init__", refuse)
    return touched


def _recording(pool, touched: list):
    """``ep._pool`` that records (and refuses) a call that resolves to a multi-rank group."""

    def wrapped(group, device):
        if ep.resolve_group(group) is not None:
            touched.append(group)
            raise AssertionError("dispatch ran over a multi-rank group")
        return pool(group, device)

    return wrapped


def assert_same(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), what


def assert_dispatch_matches(got, want: dict, what: str) -> None:
    """A ``DispatchResult`` against ``reference.ep_dispatch``'s dict for the same rank, byte for byte."""
    assert_same(got.q, want["q"], f"{what} q")
    if want["scales"] is not None:
        assert_same(got.scales, want["scales"], f"{what} scales")
    assert torch.equal(got.padded_group_start_offsets, want["padded_group_start_offsets"]), what
    assert torch.equal(got.padded_group_end_offsets, want["padded_group_end_offsets"]), what


class Layer:
    """One MoE layer (dispatch bf16 -> ``scaled_grouped_mm`` of ``recipe`` -> combine) with its own
    parameters and routing: w (E_local, D, D) experts, ids (T, k) global expert ids, routing
    weights (T, k). Drawn from ``gen`` on every rank alike; ``rank`` picks this rank's routing."""

    def __init__(self, gen, device, recipe: str, tokens, dim, topk, experts, ranks, rank=0) -> None:
        self.recipe, self.experts = recipe, experts
        self.w = (torch.randn(experts // ranks, dim, dim, generator=gen) / dim**0.5).bfloat16().to(device)
        self.w.requires_grad_()
        ids = [torch.randint(0, experts, (tokens, topk), generator=gen) for _ in range(ranks)]
        weights = [torch.rand(tokens, topk, generator=gen) for _ in range(ranks)]
        self.ids = ids[rank].to(device)
        self.weights = weights[rank].to(device).requires_grad_()

    def __call__(self, h: torch.Tensor, clone: bool) -> torch.Tensor:
        r = ep.dispatch(h, self.ids, num_experts=self.experts, recipe="bf16")
        q = r.q.clone() if clone else r.q
        y = tb.scaled_grouped_mm(q, self.w, r.padded_group_end_offsets, recipe=self.recipe)
        return ep.combine(y, r, self.weights)


def layer_grads(layers, x, grad_out, *, clone: bool, checkpointed: tuple = ()) -> list[torch.Tensor]:
    """Forward through every layer (those in ``checkpointed`` under torch.utils.checkpoint), backward
    of ``grad_out``; every gradient (x's, each layer's w and routing weights), cloned."""
    for layer in layers:
        layer.w.grad = layer.weights.grad = None
    h = x.clone().requires_grad_()
    out = h
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the emulated GEMMs' one-time warning (CPU, MXFP8 on Hopper)
        for i, layer in enumerate(layers):
            if i in checkpointed:
                out = checkpoint.checkpoint(layer, out, clone, use_reentrant=False)
            else:
                out = layer(out, clone)
        out.backward(grad_out)
    grads = [h.grad]
    for layer in layers:
        grads += [layer.w.grad, layer.weights.grad]
    return [g.clone() for g in grads]


def assert_grads_equal(got: list, want: list, what: str) -> None:
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert_same(a, b, f"{what}: gradient {i}")
