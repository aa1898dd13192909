"""The EP send kernel on the GPU (``torch_bindings.ep_send.quantize_and_send``): the bytes of q, the
scales and the tags in R local destination buffers (addressed through a device table, as symmetric
memory's peers are) equal what the public quantizers and the scatter rules give, item by item
(``tests/ep_send_cases.expected_moves``), on random data with special values, several T, D, k, R,
dropped slots and bad indices, dirty buffers (rows no item names keep their bytes); no host sync;
CUDA-graph capture and replay; the chunk loops of rows longer than one chunk. The expected bytes
come from the quantizers run on the GPU (NaN row scales carry the device's NaN bits)."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import no_sync
from tests.support.ep_send_cases import (
    RECIPES,
    assert_buffers_equal,
    destinations,
    expected_moves,
    make_buffers,
    snapshot,
    special_rows,
)
from torch_bindings.ep_send import quantize_and_send

pytestmark = pytest.mark.gpu

SHAPES = [
    # (T, D, k, R)
    (1, 32, 1, 1),
    (17, 96, 3, 2),  # mxfp8 scale rows of 3 bytes (D % 128 != 0)
    (300, 256, 8, 4),
    (64, 2048, 8, 2),
    (40, 7168, 8, 4),  # the MoE width: 896 vectors over 128 threads (a partial chunk)
    (33, 8192, 2, 3),  # exactly one chunk
    (9, 8448, 4, 2),  # one chunk and a bit: two chunks, fp8_rowwise reads the row twice
    (5, 16384, 2, 2),
    (3, 64, 130, 1),  # k > threads: the tag loop strides over the CTA
]


def _case(recipe, options, tokens, hidden, topk, ranks, seed, *, rows=None, bad=True):
    """x (T, D) on the GPU, dst_index, dirty buffers there, and the expected buffers (CPU)."""
    gen = torch.Generator().manual_seed(seed)
    rows = rows or max(-(-tokens * topk // ranks) + 3, 1)
    x = special_rows(tokens, hidden, gen)
    index = destinations(tokens, topk, ranks, rows, gen, bad=bad)
    buffers = make_buffers(recipe, ranks, rows, hidden, seed, device="cuda")
    rank = seed % 7
    x = x.cuda()
    want = expected_moves(x, index, snapshot(buffers), recipe, rank, topk, options)
    return x, index.cuda(), buffers, rank, want


def _skip_width(recipe, hidden):
    if recipe == "mxfp8" and hidden % 32:
        pytest.skip("mxfp8 needs D % 32 == 0")


@pytest.mark.parametrize("recipe,options", RECIPES)
@pytest.mark.parametrize("tokens,hidden,topk,ranks", SHAPES)
def test_bytes_match_the_quantizers(recipe, options, tokens, hidden, topk, ranks):
    _skip_width(recipe, hidden)
    x, index, buffers, rank, want = _case(
        recipe, options, tokens, hidden, topk, ranks, tokens + hidden + topk
    )
    quantize_and_send(x, index, buffers, recipe=recipe, rank=rank, topk=topk, **options)
    torch.cuda.synchronize()
    assert_buffers_equal(
        snapshot(buffers), want, f"{recipe} {options} T={tokens} D={hidden} k={topk} R={ranks}"
    )


@pytest.mark.parametrize("recipe,options", [r for r in RECIPES if r[0] != "mxfp8"])
@pytest.mark.parametrize("hidden", [8, 24, 72, 1000])
def test_widths_not_a_multiple_of_32(recipe, options, hidden):
    x, index, buffers, rank, want = _case(recipe, options, 11, hidden, 3, 2, hidden)
    quantize_and_send(x, index, buffers, recipe=recipe, rank=rank, topk=3, **options)
    torch.cuda.synchronize()
    assert_buffers_equal(snapshot(buffers), want, f"{recipe} D={hidden}")


@pytest.mark.parametrize("recipe,options", RECIPES)
def test_no_tokens_and_only_dropped_slots(recipe, options):
    for tokens, bad_only in ((0, False), (6, True)):
        x, index, buffers, rank, _ = _case(recipe, options, tokens, 64, 2, 2, 3, rows=8)
        if bad_only:
            index = torch.tensor([-1, 16, 17, 2**31 - 1, -7, -(2**31)] * 2, dtype=torch.int32, device="cuda")
        before = snapshot(buffers)
        quantize_and_send(x, index, buffers, recipe=recipe, rank=rank, topk=2, **options)
        torch.cuda.synchronize()
        assert_buffers_equal(snapshot(buffers), before, f"{recipe} T={tokens}: nothing written")


def test_many_tokens_and_a_view_of_x():
    """T > 65535 CTAs along x; x a 16-byte aligned row slice of a larger tensor; (T, k) indices."""
    tokens, hidden, topk = 70000, 64, 1
    gen = torch.Generator().manual_seed(9)
    big = special_rows(tokens + 2, hidden, gen)
    x = big.cuda()[2:]
    index = destinations(tokens, topk, 1, tokens, gen, bad=False)
    buffers = make_buffers("mxfp8", 1, tokens, hidden, 9, device="cuda")
    want = expected_moves(x, index, snapshot(buffers), "mxfp8", 3, topk, {})
    quantize_and_send(x, index.cuda().view(tokens, topk), buffers, recipe="mxfp8", rank=3, topk=topk)
    torch.cuda.synchronize()
    assert_buffers_equal(snapshot(buffers), want, "70000 tokens")


@pytest.mark.parametrize("recipe,options", RECIPES)
def test_no_host_sync(recipe, options):
    x, index, buffers, rank, want = _case(recipe, options, 50, 512, 4, 2, 21)
    first = make_buffers(recipe, 2, buffers.q.own.shape[0], 512, 99, device="cuda")
    quantize_and_send(x, index, first, recipe=recipe, rank=rank, topk=4, **options)  # compile, load
    torch.cuda.synchronize()
    with no_sync():
        quantize_and_send(x, index, buffers, recipe=recipe, rank=rank, topk=4, **options)
    torch.cuda.synchronize()
    assert_buffers_equal(snapshot(buffers), want, f"{recipe} under sync debug mode")


@pytest.mark.parametrize("recipe,options", RECIPES)
def test_cuda_graph_capture_and_replay(recipe, options):
    """Captured once, replayed on new x (same buffers and indices): the replay writes the new bytes."""
    tokens, hidden, topk, ranks = 24, 256, 3, 2
    x, index, buffers, rank, _ = _case(recipe, options, tokens, hidden, topk, ranks, 31)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        quantize_and_send(x, index, buffers, recipe=recipe, rank=rank, topk=topk, **options)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        quantize_and_send(x, index, buffers, recipe=recipe, rank=rank, topk=topk, **options)
    gen = torch.Generator().manual_seed(77)
    for _ in range(2):
        new_x = special_rows(tokens, hidden, gen).cuda()
        want = expected_moves(new_x, index, snapshot(buffers), recipe, rank, topk, options)
        x.copy_(new_x)
        graph.replay()
        torch.cuda.synchronize()
        assert_buffers_equal(snapshot(buffers), want, f"{recipe} replay")


@pytest.mark.parametrize("recipe,options", RECIPES)
def test_small_chunks(recipe, options):
    """One warp, one vector per thread: every row spans several chunks (the chunk loops, fp8_rowwise's
    two passes) on the real kernel with a non-default config."""
    from cute_kernels import registry
    from cute_kernels.ep_send import SendConfig, SendVariant
    from torch_bindings.backend import kernel_arch

    arch, _ = kernel_arch(torch.device("cuda"))
    pow2 = options.get("round_scales_to_power_of_2", True)
    variant = SendVariant(recipe, options.get("scaling_mode", "rceil"), pow2)
    kernel = registry.entry("ep_send").compile(variant, arch, config=SendConfig(threads=32, vectors=1))
    tokens, hidden, topk = 13, 1024, 3
    x, index, buffers, rank, want = _case(recipe, options, tokens, hidden, topk, 2, 41)
    scales = buffers.tags if recipe == "bf16" else buffers.scales
    q, tags = buffers.q, buffers.tags
    kernel(x, index.view(tokens, topk), q.own, q.ptrs, scales.own, scales.ptrs, tags.own, tags.ptrs, rank)
    torch.cuda.synchronize()
    assert_buffers_equal(snapshot(buffers), want, f"{recipe} small chunks")
