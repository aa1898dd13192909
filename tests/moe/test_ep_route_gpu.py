"""The EP routing kernels (``cute_kernels.ep_route``) on the GPU against ``torch_bindings.ep``'s
PyTorch routing, bit for bit: counts, ranks and the exchange's slot number (route), destinations
and this rank's padded groups (layout, R = 1..8 ranks simulated, both count-matrix row strides),
the zero fill of every buffer kind against the row-scatter zero fill (fresh and reused buffers,
dirty memory), and the R > 1 path's count post (route) and ticket check and fill end (layout).
Fuzzed routings: E up to 1024, T up to 70000, k 1..8, dropped ids (-1, >= E, int64 ids above
2^32), all pairs to one expert, empty experts, int32 and int64 ids, strided topk_idx. Also: no
host sync, CUDA-graph replay of new routings, and the PyTorch path for more than
``EP_MAX_EXPERTS`` experts."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import no_sync

from cute_utils.constants import EP_MAX_EXPERTS
from tests.support.ep_cases import assert_same
from torch_bindings import ep
from torch_bindings import reference as ref
from torch_bindings.warn import forget

pytestmark = pytest.mark.gpu

KINDS = ("random", "distinct", "one", "few", "skewed", "dropped")
_INT = {"int32": torch.int32, "int64": torch.int64}


def _ids(kind: str, tokens: int, topk: int, experts: int, dtype: str, seed: int) -> torch.Tensor:
    """(T, k) expert ids of one rank on the GPU, of ``kind`` (module docstring's edges)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shape = (tokens, topk)
    ids = torch.randint(0, experts, shape, device="cuda", generator=gen)
    if kind == "distinct" and topk <= experts:
        ids = torch.rand(tokens, experts, device="cuda", generator=gen).topk(topk, dim=1).indices
    elif kind == "one":
        ids.fill_(seed % experts)
    elif kind == "few":  # most experts empty
        used = torch.randperm(experts, device="cuda", generator=gen)[: max(1, experts // 8)]
        ids = used[torch.randint(0, used.numel(), shape, device="cuda", generator=gen)]
    elif kind == "skewed":
        ids = (torch.rand(shape, device="cuda", generator=gen) ** 4 * experts).long().clamp(max=experts - 1)
    elif kind == "dropped":
        draw = torch.rand(shape, device="cuda", generator=gen)
        ids = torch.where(draw < 0.1, -1, ids)
        ids = torch.where(draw > 0.9, experts + ids % 7, ids)
        if dtype == "int64":  # ids that alias an expert in their low 32 bits still drop
            ids = torch.where((draw > 0.45) & (draw < 0.5), ids + 2**32, ids)
            ids = torch.where((draw > 0.5) & (draw < 0.52), -(2**40), ids)
    return ids.to(_INT[dtype])


def _cases(seed: int, count: int):
    """Seeded (ranks, tokens, topk, experts, kind, dtype) cases, edges favoured."""
    rng = random.Random(seed)
    for _ in range(count):
        ranks = rng.choice([1, 1, 2, 3, 4, 8])
        local = rng.choice([1, 2, 5, 8, 32, 128])
        yield (
            ranks,
            rng.choice([1, 2, 33, 511, 4096, 4097, 12345]),
            rng.randint(1, 8),
            ranks * local,
            rng.choice(KINDS),
            rng.choice(list(_INT)),
        )


CASES = [
    (1, 70000, 8, 1024, "random", "int64"),  # P = 560000 pairs, E = 1024
    (8, 70000, 1, 1024, "dropped", "int32"),
    (1, 8192, 8, 256, "distinct", "int64"),  # the bench shape
    (1, 1, 1, 1, "one", "int32"),
    (2, 3000, 8, 2, "one", "int64"),  # every pair to one expert
    (8, 20000, 2, 1024, "few", "int32"),
    (3, 4097, 5, 3, "dropped", "int64"),
    *_cases(2026, 24),
]


def _check_route(ids: torch.Tensor, experts: int, slot_index: int) -> ep.Routing:
    """The route kernel's counts, ranks and message against the PyTorch routing; returns the kernel's."""
    got = ep.route(ids, experts, slot_index)
    want = ep._route_torch(ids, experts)
    assert got.message is not None and got.message.shape == (experts + 1,)
    assert torch.equal(got.counts, want.counts), "counts"
    assert int(got.message[experts]) == slot_index, "slot number after the counts"
    flat = ids.reshape(-1)
    kept = (flat >= 0) & (flat < experts)
    assert got.position.dtype == torch.int32
    assert torch.equal(got.position[kept].long(), want.position[kept]), "ranks"
    assert bool((got.position[~kept] == -1).all()), "dropped pairs rank -1"
    return got


def _exchanged(counts: list[torch.Tensor], slot_index: int) -> torch.Tensor:
    """The (R, E) view of an (R, E + 1) matrix, as ``SymmetricPool.exchange_counts`` returns it."""
    experts = counts[0].shape[0]
    out = torch.full((len(counts), experts + 1), slot_index, dtype=torch.int32, device="cuda")
    out[:, :experts] = torch.stack(counts)
    return out[:, :experts]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_route_and_layout_match_pytorch(case, poison_cuda_allocator):
    ranks, tokens, topk, experts, kind, dtype = case
    shape = ep.EpShape(
        ranks, tokens, 128, topk, experts, random.Random(tokens).choice([16, 32, 64, 128]), "bf16"
    )
    idss = [_ids(kind, tokens, topk, experts, dtype, 7 * tokens + s) for s in range(ranks)]
    if kind == "random":  # a strided topk_idx: the binding makes it contiguous
        idss = [torch.cat([t, t], dim=1)[:, ::2] for t in idss]
    poison_cuda_allocator()
    routings = [_check_route(t, experts, s % 3) for s, t in enumerate(idss)]
    torch_routings = [ep._route_torch(t, experts) for t in idss]
    stacked = torch.stack([r.counts for r in routings])
    filled = torch.tensor(
        [random.Random(experts).randrange(shape.rows + 1)], dtype=torch.int32, device="cuda"
    )
    for counts in (stacked, _exchanged([r.counts for r in routings], 1)):
        for rank in range(ranks):
            poison_cuda_allocator()
            got = ep.layout(routings[rank], counts, rank, shape, filled)
            want = ep._layout_torch(torch_routings[rank], stacked, rank, shape, filled)
            assert got.zero_index is None and got.filled is filled
            for name in ("dst_index", "padded_start", "padded_end", "sizes"):
                a, b = getattr(got, name), getattr(want, name)
                assert a.dtype == b.dtype == torch.int32 and torch.equal(a, b), f"rank {rank} {name}"


def _tables(ranks: int, width: int) -> tuple[list[torch.Tensor], ep.SharedRows]:
    """R (R, width) int32 count tables on this GPU standing for the ranks' symmetric tables (dirty:
    every word 7), and rank 0's view of them as the route kernel's ``post``."""
    tables = [torch.full((ranks, width), 7, dtype=torch.int32, device="cuda") for _ in range(ranks)]
    ptrs = torch.tensor([t.data_ptr() for t in tables], dtype=torch.int64, device="cuda")
    return tables, ep.SharedRows(tables[0], ptrs, ptrs[0:1])


@pytest.mark.parametrize("dtype", list(_INT))
@pytest.mark.parametrize(("ranks", "experts"), [(4, 64), (8, 1024), (3, 33)])
def test_route_posts_and_layout_checks_and_tracks(dtype, ranks, experts):
    """The R > 1 path's fused steps, R tables on one GPU: each rank's route kernel writes its counts
    and ticket into row ``rank`` of every table; the layout kernel on a whole table equals the
    PyTorch layout, sets the slot's ticket flag (1; 0 when one rank's ticket differs), moves its fill
    end (``state[1]`` the old end, ``state[0]`` the new), and the zero fill then clears the rows up
    to the old end (equal to the row-scatter fill given that end); for a captured slot the tickets
    become -1 and the counts stay."""
    tokens, topk, ticket = 3000, 8, 123457
    shape = ep.EpShape(ranks, tokens, 128, topk, experts, 32, "fp8_rowwise")
    kinds = ("skewed", "dropped", "one", "few", "random")
    idss = [_ids(kinds[r % 5], tokens, topk, experts, dtype, r) for r in range(ranks)]
    tables, post = _tables(ranks, experts + 1)
    routings = [ep.route(idss[r], experts, ticket, post, r) for r in range(ranks)]
    assert all(r.posted for r in routings)
    sent = torch.stack([torch.cat([r.counts, r.counts.new_full((1,), ticket)]) for r in routings])
    for r, table in enumerate(tables):
        assert torch.equal(table, sent), f"table of rank {r}"
    stacked = torch.stack([ep._route_torch(t, experts).counts for t in idss])
    pool = ep.LocalPool(1, torch.device("cuda"))
    old_end = shape.rows - 5  # past every new end: the fill clears the tail up to it
    for rank in range(ranks):
        state = torch.tensor([old_end, -9, -9], dtype=torch.int32, device="cuda")
        slot = ep.Slot({}, ticket=ticket, state=state)
        lay = ep.layout(routings[rank], tables[rank], rank, shape, None, slot)
        want = ep._layout_torch(ep._route_torch(idss[rank], experts), stacked, rank, shape, None)
        for name in ("dst_index", "padded_start", "padded_end", "sizes"):
            assert torch.equal(getattr(lay, name), getattr(want, name)), f"rank {rank} {name}"
        assert lay.tracked and lay.filled is slot.prev_filled and lay.zero_index is None
        assert slot.state.tolist() == [int(want.padded_end[-1]), old_end, 1], f"rank {rank}"
        got_bufs, want_bufs = _dirty_slot(pool, shape, rank), _dirty_slot(pool, shape, rank)
        ep.zero_padding(lay, got_bufs.views[0])
        filled = torch.tensor([old_end], dtype=torch.int32, device="cuda")
        zero = ep._zero_rows(want.padded_start, want.padded_end, want.sizes, filled, shape.rows)
        scatter = ep.Layout(want.dst_index, want.padded_start, want.padded_end, want.sizes, zero, filled)
        ep.zero_padding(scatter, want_bufs.views[0])
        for name, rows in got_bufs.views[0].items():
            assert_same(rows.own, want_bufs.views[0][name].own, f"rank {rank}: {name}")
    tables[1][ranks - 1, experts] = ticket + 1  # the last rank chose another slot
    slot = ep.Slot({}, ticket=ticket, state=torch.zeros(3, dtype=torch.int32, device="cuda"))
    ep.layout(routings[1], tables[1], 1, shape, None, slot)
    assert int(slot.ticket_ok) == 0 and bool((tables[1][:, experts] != -1).all())
    slot.captured = True
    ep.layout(routings[0], tables[0], 0, shape, None, slot)
    assert int(slot.ticket_ok) == 1 and bool((tables[0][:, experts] == -1).all())
    assert torch.equal(tables[0][:, :experts], sent[:, :experts]), "the reset leaves the counts"


def _dirty_slot(pool: ep.LocalPool, shape: ep.EpShape, seed: int) -> ep.Slot:
    """Buffers of one dispatch of ``shape`` (every kind of its recipe), random bytes everywhere."""
    slot = pool.acquire(("test", shape, seed), ep._dispatch_kinds(shape))
    gen = torch.Generator(device="cuda").manual_seed(seed)
    for rows in slot.views[0].values():
        flat = rows.own.view(torch.uint8).view(-1)
        flat.copy_(torch.randint(0, 256, flat.shape, dtype=torch.uint8, device="cuda", generator=gen))
    return slot


@pytest.mark.parametrize("recipe", ["mxfp8", "fp8_rowwise", "bf16"])
@pytest.mark.parametrize("hidden", [128, 640, 2048])
@pytest.mark.parametrize("fresh", [True, False])
def test_zero_fill_matches_row_scatter(recipe, hidden, fresh):
    """Every buffer kind (q, e8m0 scale rows, tags; fp8_rowwise scales get 1.0) after
    the zero fill kernel equals the row-scatter zero fill of the same dirty bytes."""
    rng = random.Random(hidden + fresh)
    pool = ep.LocalPool(1, torch.device("cuda"))
    for trial in range(4):
        ranks, local = rng.choice([(1, 8), (2, 4), (4, 32), (8, 128), (1, 1024)])
        tokens, topk = rng.choice([(1, 1), (300, 8), (2049, 3)])
        shape = ep.EpShape(ranks, tokens, hidden, topk, ranks * local, rng.choice([16, 32, 64, 128]), recipe)
        idss = [
            _ids(rng.choice(KINDS), tokens, topk, shape.experts, "int64", trial + s) for s in range(ranks)
        ]
        counts = torch.stack([ep.route(t, shape.experts).counts for t in idss])
        rank = rng.randrange(ranks)
        filled = (
            None if fresh else torch.tensor([rng.randrange(shape.rows + 1)], dtype=torch.int32, device="cuda")
        )
        lay = ep.layout(ep.route(idss[rank], shape.experts), counts, rank, shape, filled)
        got, want = _dirty_slot(pool, shape, trial), _dirty_slot(pool, shape, trial)
        ep.zero_padding(lay, got.views[0])
        zero = ep._zero_rows(lay.padded_start, lay.padded_end, lay.sizes, filled, shape.rows)
        scatter = ep.Layout(lay.dst_index, lay.padded_start, lay.padded_end, lay.sizes, zero, filled)
        ep.zero_padding(scatter, want.views[0])
        for name, rows in got.views[0].items():
            assert_same(rows.own, want.views[0][name].own, f"trial {trial}: {name} ({shape})")


def test_no_host_sync():
    """Route, exchange (R = 1), layout and zero fill after the first call: no host sync."""
    shape = ep.EpShape(1, 512, 256, 4, 64, 32, "mxfp8")
    ids = _ids("dropped", 512, 4, 64, "int64", 3)
    pool = ep.LocalPool(1, torch.device("cuda"))
    slot = pool.acquire(("sync", shape), ep._dispatch_kinds(shape))
    filled = torch.zeros(1, dtype=torch.int32, device="cuda")

    def steps():
        routing = ep.route(ids, shape.experts, slot.index)
        lay = ep.layout(routing, pool.exchange_counts(routing, slot), 0, shape, filled)
        ep.zero_padding(lay, slot.views[0])
        return lay

    steps()
    torch.cuda.synchronize()
    with no_sync():
        for _ in range(3):
            steps()


def test_cuda_graph_replays_new_routings():
    """Route, layout and zero fill captured once; replays with new ids in the captured input give
    the PyTorch routing's layout and the row-scatter zero fill."""
    shape = ep.EpShape(1, 1000, 256, 6, 32, 64, "fp8_rowwise")
    static = _ids("random", shape.tokens, shape.topk, shape.experts, "int32", 0)
    filled = torch.zeros(1, dtype=torch.int32, device="cuda")
    pool = ep.LocalPool(1, torch.device("cuda"))
    slot = _dirty_slot(pool, shape, 0)

    def steps():
        routing = ep.route(static, shape.experts)
        lay = ep.layout(routing, pool.exchange_counts(routing, slot), 0, shape, filled)
        ep.zero_padding(lay, slot.views[0])
        return lay

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        steps()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        lay = steps()
    for seed, kind in enumerate(("skewed", "dropped", "one")):
        static.copy_(_ids(kind, shape.tokens, shape.topk, shape.experts, "int32", seed + 1))
        filled.fill_(seed * 997)
        want_slot = _dirty_slot(pool, shape, seed + 10)
        for name, rows in slot.views[0].items():
            rows.own.copy_(want_slot.views[0][name].own)
        graph.replay()
        routing = ep._route_torch(static, shape.experts)
        want = ep._layout_torch(routing, routing.counts[None], 0, shape, filled)
        for name in ("dst_index", "padded_start", "padded_end", "sizes"):
            assert torch.equal(getattr(lay, name), getattr(want, name)), f"{kind}: {name}"
        zero = ep._zero_rows(want.padded_start, want.padded_end, want.sizes, filled, shape.rows)
        scatter = ep.Layout(want.dst_index, want.padded_start, want.padded_end, want.sizes, zero, filled)
        ep.zero_padding(scatter, want_slot.views[0])
        for name, rows in slot.views[0].items():
            assert_same(rows.own, want_slot.views[0][name].own, f"{kind}: {name}")


def test_more_experts_than_the_tables_take_the_pytorch_routing():
    """E > EP_MAX_EXPERTS: PyTorch routing and layout on the GPU (no message), the zero fill kernel
    where E_local fits; the dispatch still equals the reference."""
    ranks, tokens, topk, experts = 2, 8, 2, 2 * EP_MAX_EXPERTS
    xs = [torch.randn(tokens, 128, device="cuda").bfloat16() for _ in range(ranks)]
    ids = [_ids("random", tokens, topk, experts, "int64", s) for s in range(ranks)]
    assert ep.route(ids[0], experts).message is None
    got = ep.simulate_dispatch(xs, ids, experts, ep.LocalPool(ranks, torch.device("cuda")), recipe="bf16")
    want = ref.ep_dispatch(xs, ids, experts, recipe="bf16")
    for r in range(ranks):
        assert_same(got[r].q, want[r]["q"], f"rank {r}")
        assert torch.equal(got[r].padded_group_end_offsets, want[r]["padded_group_end_offsets"])


def test_pytorch_routing_on_a_gpu_warns_once():
    """A GPU dispatch past the routing kernels' tables takes the PyTorch routing with a warning,
    once per process (no silent slow path); a second call is silent."""
    import warnings

    forget(ep.TORCH_ROUTING_WARNING)
    x = torch.randn(8, 128, device="cuda").bfloat16()
    ids = torch.randint(0, 2 * EP_MAX_EXPERTS, (8, 2), device="cuda")
    with pytest.warns(UserWarning, match=f"num_experts={2 * EP_MAX_EXPERTS} is more than the routing"):
        ep.dispatch(x, ids, num_experts=2 * EP_MAX_EXPERTS, recipe="bf16")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ep.dispatch(x, ids, num_experts=2 * EP_MAX_EXPERTS, recipe="bf16")
        ep.dispatch(x, ids, num_experts=EP_MAX_EXPERTS, recipe="bf16")
