"""Routing patterns and byte comparisons shared by the EP tests: ``tests/test_ep.py`` (one
process) and ``tests/ep_multigpu.py`` (one process per GPU, every rank building every rank's
inputs from one seed)."""

from __future__ import annotations

import random

import torch

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


def assert_same(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), what


def assert_dispatch_matches(got, want: dict, what: str) -> None:
    """A ``DispatchResult`` against ``reference.ep_dispatch``'s dict for the same rank, byte for byte."""
    assert_same(got.q, want["q"], f"{what} q")
    if want["scales"] is not None:
        assert_same(got.scales, want["scales"], f"{what} scales")
    assert torch.equal(got.padded_group_start_offsets, want["padded_group_start_offsets"]), what
    assert torch.equal(got.padded_group_end_offsets, want["padded_group_end_offsets"]), what
