"""Cases and byte comparisons shared by the EP send tests
(``tests/torch_bindings/test_ep_send_cpu.py``, ``tests/torch_bindings/test_ep_send_gpu.py``): R
dirty destination buffers per kind as local tensors with their address table, destinations with
dropped and bad indices, rows with special values, and the expected buffers built item by item
from the public quantizers (independent of ``reference.ep_quantize_send``)."""

from __future__ import annotations

import torch

from tests.conftest import random_bits
from torch_bindings import reference as ref
from torch_bindings.ep_send import PeerBuffers, SendBuffers, buffer_specs


def bits(t: torch.Tensor) -> torch.Tensor:
    """``t`` viewed as the integer dtype of its element size (byte-exact comparisons, fp8 included)."""
    return t.view(ref.BITS_DTYPES[t.element_size()])


RECIPES = [
    ("mxfp8", dict(scaling_mode="rceil")),
    ("mxfp8", dict(scaling_mode="floor")),
    ("fp8_rowwise", dict(round_scales_to_power_of_2=True)),
    ("fp8_rowwise", dict(round_scales_to_power_of_2=False)),
    ("bf16", {}),
]


def make_buffers(recipe: str, ranks: int, rows: int, hidden: int, seed: int, device="cpu") -> SendBuffers:
    """R dirty (random-bits) local buffers of every kind ``recipe`` sends, with their address tables."""
    kinds = {}
    for i, (name, (shape, dtype)) in enumerate(buffer_specs(recipe, rows, hidden).items()):
        tensors = [random_bits(shape, dtype, seed + 10 * i + r, device) for r in range(ranks)]
        ptrs = torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64, device=device)
        kinds[name] = PeerBuffers(tensors[0], ptrs, tensors)
    return SendBuffers(kinds["q"], kinds.get("scales"), kinds["tags"])


def snapshot(buffers: SendBuffers) -> dict:
    """Copies of every buffer's bits (same-size integers), by kind, on the CPU."""
    kinds = {"q": buffers.q, "scales": buffers.scales, "tags": buffers.tags}
    return {n: [bits(t).cpu().clone() for t in k.tensors] for n, k in kinds.items() if k is not None}


def destinations(tokens: int, topk: int, ranks: int, rows: int, gen: torch.Generator, bad: bool = True):
    """(T*k,) int32: distinct valid rows of the R*P, some dropped (-1 or other negatives), some past
    R*P (bad); needs R*P >= T*k."""
    index = torch.randperm(ranks * rows, generator=gen)[: tokens * topk].to(torch.int32)
    if bad and index.numel():
        pick = torch.rand(index.numel(), generator=gen)
        index[pick < 0.1] = -1
        index[(pick >= 0.1) & (pick < 0.15)] = -(2**31)
        index[(pick >= 0.15) & (pick < 0.2)] = ranks * rows
        index[(pick >= 0.2) & (pick < 0.22)] = 2**31 - 1
    return index


def special_rows(tokens: int, hidden: int, gen: torch.Generator) -> torch.Tensor:
    """bf16 (T, D) random rows with special values mixed in: NaN, +-Inf, zero rows, bf16 max, 448,
    480, subnormals, one outlier per row, negative zero."""
    x = (torch.randn(tokens, hidden, generator=gen) * 3).to(torch.bfloat16)
    specials = [
        float("nan"),
        float("inf"),
        -float("inf"),
        torch.finfo(torch.bfloat16).max,
        -torch.finfo(torch.bfloat16).max,
        448.0,
        480.0,
        2.0**-126,
        2.0**-133,
        -0.0,
    ]
    for t in range(tokens):
        kind = t % 6
        if kind == 1:
            x[t] = 0
        elif kind == 2:
            x[t, int(torch.randint(hidden, (1,), generator=gen))] = specials[t % len(specials)]
        elif kind == 3:
            x[t] = x[t] * 1e-38  # subnormal magnitudes
        elif kind == 4:
            x[t, : min(hidden, 32)] = specials[(t // 6) % len(specials)]
    return x


def expected_moves(x, index, before: dict, recipe: str, rank: int, topk: int, options: dict) -> dict:
    """The buffers after the send (on the CPU), item by item from the existing quantizers: row t of
    q (and of the scales) and tag ``rank * T * k + i + 1`` to every valid destination; nothing else
    changes. The quantizers run on x's device: a GPU test passes x on the GPU, because a NaN row
    scale ``1 / NaN`` has the GPU's NaN bits there (as in
    tests/torch_bindings/test_quantize_fp8_gpu.py) and the host's on the CPU."""
    if recipe == "mxfp8":
        q, s = ref.quantize_mxfp8_2d(x, blocked_scales=False, **options)
    elif recipe == "fp8_rowwise":
        q, s = ref.quantize_fp8_2d(x, axis="row", **options)
        s = s.view(-1, 1)
    else:
        q, s = x, None
    after = {n: [t.clone() for t in ts] for n, ts in before.items()}
    q, s = bits(q).cpu(), None if s is None else bits(s).cpu()
    rows = after["q"][0].shape[0]
    pairs = x.shape[0] * topk
    for i, d in enumerate(index.cpu().tolist()):
        if d < 0 or d >= len(after["q"]) * rows:
            continue
        b, r = divmod(d, rows)
        after["q"][b][r] = q[i // topk]
        if s is not None:
            after["scales"][b][r] = s[i // topk]
        after["tags"][b][r] = rank * pairs + i + 1
    return after


def assert_buffers_equal(got: dict, want: dict, what: str) -> None:
    """Every buffer's bits equal (both from :func:`snapshot` / :func:`expected_moves`)."""
    assert got.keys() == want.keys(), what
    for name in want:
        for b, (g, w) in enumerate(zip(got[name], want[name], strict=True)):
            if not torch.equal(g, w):
                bad = (g != w).reshape(g.shape[0], -1).any(1).nonzero().flatten()[:8].tolist()
                raise AssertionError(f"{what}: {name}[{b}] differs in rows {bad}")
