"""Multi-GPU checks of ``torch_bindings.ep`` (SPEC section 9), one process per GPU:

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \\
        torchrun --nproc-per-node 2 tests/support/ep_multigpu.py

Every rank builds every rank's inputs from one seed, so it can run the reference for the whole group
(``reference.ep_dispatch`` / ``ep_combine``) and compare its own results byte for byte: skewed
routing (all pairs to one expert, empty experts, k slots on one rank, dropped ids), repeated calls
on the same buffers, more experts than the routing kernels take (the PyTorch routing's count
exchange and ticket check through symmetric memory, a slot used twice), dispatch + combine
replayed from a CUDA graph with new inputs, the bf16 autograd pair, and no host sync once the
buffers exist. ``--diverge``: ranks that hold different results alive, which the slot assert must
stop (the process fails; ``tests/moe/test_ep.py`` checks how).
"""

from __future__ import annotations

import os
import random
import sys
import zlib

for _name in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
    os.environ.setdefault(_name, "0" if _name == "NCCL_NVLS_ENABLE" else "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from ep_cases import (  # noqa: E402 (this script's folder)
    Layer,
    assert_dispatch_matches,
    assert_grads_equal,
    assert_same,
    layer_grads,
    routing,
)

from cute_utils.constants import EP_MAX_EXPERTS  # noqa: E402
from torch_bindings import ep  # noqa: E402
from torch_bindings import reference as ref  # noqa: E402


def _check(case: str, tokens: int, hidden: int, topk: int, experts: int, recipe: str, alignment: int) -> None:
    rank, ranks = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", torch.cuda.current_device())
    seed = zlib.crc32(f"{case}/{tokens}/{hidden}/{topk}/{experts}/{recipe}".encode())
    gen = torch.Generator().manual_seed(seed)
    xs = [torch.randn(tokens, hidden, generator=gen).bfloat16().to(dev) for _ in range(ranks)]
    ids = routing(case, ranks, tokens, topk, experts, random.Random(seed), dev)
    ws = [torch.rand(tokens, topk, generator=gen).to(dev) for _ in range(ranks)]
    got = ep.dispatch(xs[rank], ids[rank], num_experts=experts, recipe=recipe, alignment=alignment)
    want = ref.ep_dispatch(xs, ids, experts, recipe=recipe, alignment=alignment)
    mine = want[rank]
    if mine["scales"] is not None and not torch.equal(
        got.scales.view(torch.uint8), mine["scales"].view(torch.uint8)
    ):
        _describe_scale_mismatch(got, mine, f"{case} {recipe} T{tokens} E{experts} rank {rank}")
    assert_dispatch_matches(got, mine, f"{case} rank {rank}")
    width = 256
    ys = [torch.randn(got.q.shape[0], width, generator=gen).bfloat16().to(dev) for _ in range(ranks)]
    out = ep.combine(ys[rank], got, ws[rank])
    want_out = ref.ep_combine(ys, mine["pair_rows"], ws)[rank]
    assert_same(out, want_out, f"{case} rank {rank} combine")


def _check_graph_replay(recipe: str) -> None:
    """dispatch + combine captured once in a CUDA graph (after an eager call made their slots), then
    replayed with new tokens, routings, weights and expert outputs copied into the captured inputs:
    every replay's results equal the reference byte for byte (the layout kernel re-checks the
    tickets, which it overwrites once read, and moves the fill end in every replay)."""
    rank, ranks = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", torch.cuda.current_device())
    tokens, hidden, topk, experts, width = 96, 256, 4, 4 * ranks, 128
    gen = torch.Generator().manual_seed(zlib.crc32(f"graph/{recipe}".encode()))
    x = torch.randn(tokens, hidden, generator=gen).bfloat16().to(dev)
    ids = torch.randint(0, experts, (tokens, topk), generator=gen).to(dev)
    w = torch.rand(tokens, topk, generator=gen).to(dev)
    res = ep.dispatch(x, ids, num_experts=experts, recipe=recipe)
    y = torch.zeros(res.q.shape[0], width, dtype=torch.bfloat16, device=dev)
    ep.combine(y, res, w)
    del res
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        res = ep.dispatch(x, ids, num_experts=experts, recipe=recipe)
        out = ep.combine(y, res, w)
    for step, kind in enumerate(("random", "one_expert", "empty_runs")):
        xs = [torch.randn(tokens, hidden, generator=gen).bfloat16().to(dev) for _ in range(ranks)]
        idss = routing(kind, ranks, tokens, topk, experts, random.Random(step), dev)
        ws = [torch.rand(tokens, topk, generator=gen).to(dev) for _ in range(ranks)]
        ys = [torch.randn(y.shape[0], width, generator=gen).bfloat16().to(dev) for _ in range(ranks)]
        for static, new in ((x, xs[rank]), (ids, idss[rank]), (w, ws[rank]), (y, ys[rank])):
            static.copy_(new)
        graph.replay()
        want = ref.ep_dispatch(xs, idss, experts, recipe=recipe)[rank]
        assert_dispatch_matches(res, want, f"graph {recipe} {kind} rank {rank}")
        assert_same(out, ref.ep_combine(ys, want["pair_rows"], ws)[rank], f"graph {recipe} {kind} combine")


def _describe_scale_mismatch(got, want: dict, what: str) -> None:
    """Print where a dispatch's scales differ from the reference: the first differing rows
    (fp8_rowwise: one fp32 per row; mxfp8: (row, column) from SPEC's blocked offsets inverted) and
    the padded group ends."""
    a, b = got.scales.view(torch.uint8).flatten(), want["scales"].view(torch.uint8).flatten()
    ends = got.padded_group_end_offsets.tolist()
    print(
        f"{what}: scales {tuple(got.scales.shape)} vs {tuple(want['scales'].shape)}; ends {ends}", flush=True
    )
    if a.numel() != b.numel():
        return
    if got.scales.dim() == 1:  # fp8_rowwise
        rows = (got.scales.view(torch.int32) != want["scales"].view(torch.int32)).nonzero().flatten()
        for r in rows[:12].tolist():
            print(f"  row {r}: got {float(got.scales[r])} want {float(want['scales'][r])}", flush=True)
        return
    diff, cols = (a != b).nonzero().flatten(), want["scales"].shape[-1]
    for i in diff[:12].tolist():
        tile, within = divmod(i, 512)
        row = (tile // max(1, cols // 4)) * 128 + (within // 16) % 32 + 32 * ((within % 16) // 4)
        col = (tile % max(1, cols // 4)) * 4 + within % 4
        print(f"  byte {i}: row {row} col {col} got {int(a[i])} want {int(b[i])}", flush=True)


def _check_autograd(tokens: int, hidden: int, topk: int, experts: int) -> None:
    """bf16 dispatch -> y = 2 q - 1 -> combine, backward against SPEC's formulas."""
    rank, ranks = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator().manual_seed(7)
    xs = [torch.randn(tokens, hidden, generator=gen).bfloat16().to(dev) for _ in range(ranks)]
    ids = [torch.randint(0, experts, (tokens, topk), generator=gen).to(dev) for _ in range(ranks)]
    ws = [torch.rand(tokens, topk, generator=gen).to(dev) for _ in range(ranks)]
    gs = [torch.randn(tokens, hidden, generator=gen).bfloat16().to(dev) for _ in range(ranks)]
    x = xs[rank].clone().requires_grad_()
    w = ws[rank].clone().requires_grad_()
    res = ep.dispatch(x, ids[rank], num_experts=experts, recipe="bf16")
    out = ep.combine((res.q.float() * 2 - 1).bfloat16(), res, w)
    out.backward(gs[rank])
    disp = ref.ep_dispatch(xs, ids, experts, recipe="bf16")
    per_pair = [(g.float()[:, None] * wt[:, :, None]).bfloat16() for g, wt in zip(gs, ws, strict=True)]
    gy = ref.ep_dispatch(per_pair, ids, experts, recipe="bf16")
    gq = [(d["q"].float() * 2).bfloat16() for d in gy]
    gx = ref.ep_combine(gq, disp[0]["pair_rows"], [torch.ones_like(wt) for wt in ws])[rank]
    assert torch.equal(x.grad.view(torch.int16), gx.view(torch.int16)), (rank, "grad x")
    ys = [(d["q"].float() * 2 - 1).bfloat16() for d in disp]
    stacked = torch.cat(ys + [ys[0].new_zeros(1, hidden)])
    rows = disp[0]["pair_rows"][rank]
    pair_y = stacked[torch.where(rows >= 0, rows, ranks * ys[0].shape[0])]
    gw = (gs[rank].float()[:, None] * pair_y.float()).sum(-1)
    assert torch.equal(w.grad, gw), (rank, "grad w")


def _check_layers(recipes: tuple, checkpointed: tuple = ()) -> None:
    """Several MoE layers alive at once (buffer lifetime, SPEC section 6): the gradients equal the
    same model's with every dispatched q cloned, bit for bit, on every rank; then two dispatch
    results held and both read."""
    rank, ranks = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", torch.cuda.current_device())
    tokens, dim, topk, experts = 96, 256, 4, 4 * ranks
    gen = torch.Generator().manual_seed(len(recipes) * 31 + len(checkpointed))
    layers = [Layer(gen, dev, r, tokens, dim, topk, experts, ranks, rank) for r in recipes]
    xs = [torch.randn(tokens, dim, generator=gen).bfloat16() for _ in range(ranks)]
    gs = [torch.randn(tokens, dim, generator=gen).bfloat16() for _ in range(ranks)]
    x, g = xs[rank].to(dev), gs[rank].to(dev)
    plain = layer_grads(layers, x, g, clone=True)
    got = layer_grads(layers, x, g, clone=False, checkpointed=checkpointed)
    assert_grads_equal(got, plain, f"rank {rank} layers {recipes} checkpointed {checkpointed}")
    ids = [layer.ids for layer in layers[:2]]
    held = [ep.dispatch(x, i, num_experts=experts, recipe="fp8_rowwise") for i in ids]
    xs_dev = [t.to(dev) for t in xs]
    for n, result in enumerate(held):
        gathered = [torch.empty_like(ids[n]) for _ in range(ranks)]
        dist.all_gather(gathered, ids[n])
        want = ref.ep_dispatch(xs_dev, gathered, experts, recipe="fp8_rowwise")[rank]
        assert_dispatch_matches(result, want, f"rank {rank} held result {n}")


def _check_moe_layer() -> None:
    """``MoELayer`` across the group: bf16 forward and gradients close to the bf16 chain
    (all_to_all_single with splits, permute, bf16 experts) with the same router and experts, FP8
    rowwise close to both; two layers with the second under activation checkpointing give the
    same gradients as without."""
    import torch.utils.checkpoint as checkpoint

    from bench.common.moe_chain import bf16_chain
    from torch_bindings import MoELayer

    rank, ranks = dist.get_rank(), dist.get_world_size()
    tokens, dim, hidden, topk, experts = 128, 256, 128, 4, 4 * ranks
    torch.manual_seed(100 + rank)
    world = dist.group.WORLD  # expert parallelism is asked for by passing the group
    layers = {
        r: MoELayer(dim, hidden, experts, topk, recipe=r, group=world, device="cuda")
        for r in ("bf16", "fp8_rowwise")
    }
    local = MoELayer(dim, hidden, experts, topk, recipe="bf16", device="cuda")  # no group: R = 1
    assert local.experts.w13.shape[0] == experts, (rank, "MoELayer() must keep every expert local")
    local(torch.randn(tokens, dim, device="cuda").bfloat16())
    dist.broadcast(layers["bf16"].router.weight.data, 0)
    layers["fp8_rowwise"].load_state_dict(layers["bf16"].state_dict())
    x0 = torch.randn(tokens, dim, device="cuda").bfloat16()

    def grads(forward, layer):
        layer.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_()
        out = forward(x)
        out.float().square().sum().backward()
        return [out.detach(), x.grad] + [p.grad for p in layer.parameters()]

    chain = grads(lambda a: bf16_chain(layers["bf16"], a), layers["bf16"])
    ours = grads(layers["bf16"], layers["bf16"])
    fp8 = grads(layers["fp8_rowwise"], layers["fp8_rowwise"])
    for a, b, c in zip(ours, chain, fp8, strict=True):
        assert sqnr(a, b) >= 35.0, (rank, "MoELayer bf16 vs chain", sqnr(a, b))
        assert sqnr(c, b) >= 18.0, (rank, "MoELayer fp8_rowwise vs chain", sqnr(c, b))
    pair = torch.nn.ModuleList([layers["bf16"], layers["fp8_rowwise"]])

    def two(checkpointed):
        pair.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_()
        h = pair[0](x)
        h = checkpoint.checkpoint(pair[1], h, use_reentrant=False) if checkpointed else pair[1](h)
        h.float().square().sum().backward()
        return [x.grad] + [p.grad for p in pair.parameters()]

    assert_grads_equal(two(True), two(False), f"rank {rank} MoELayer checkpoint")


def sqnr(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return float(10 * torch.log10(b.square().sum() / (a - b).square().sum().clamp_min(1e-30)))


#: What ``--diverge`` prints on a rank whose dispatch stopped at the slot assert.
DIVERGED = "slot assert fired"


def _diverge() -> None:
    """Ranks holding different results alive: rank 0 frees the first of three results, the others
    the second, so the next dispatch takes slot 0 on rank 0 and slot 1 elsewhere (no allocation, so
    no collective to hang in). The tickets differ, so the layout's ticket flag trips the device
    assert: each rank prints :data:`DIVERGED` and exits with 3 (``os._exit``: the CUDA context is
    gone); a dispatch that finishes prints that it did and exits with 0, which the caller fails."""
    rank, ranks = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", torch.cuda.current_device())
    x = torch.randn(256, 512, device=dev).bfloat16()
    ids = torch.randint(0, 8 * ranks, (256, 4), device=dev)
    held = [ep.dispatch(x, ids, num_experts=8 * ranks) for _ in range(3)]  # slots 0, 1, 2 everywhere
    torch.cuda.synchronize()
    dist.barrier()
    del held[0 if rank == 0 else 1]
    try:
        ep.dispatch(x, ids, num_experts=8 * ranks)
        torch.cuda.synchronize()
    except RuntimeError as exc:
        print(f"rank {rank}: {DIVERGED}: {str(exc).splitlines()[0]}", flush=True)
        os._exit(3)
    print(f"rank {rank}: the diverged dispatch finished", flush=True)


def main() -> None:
    dist.init_process_group("nccl")
    rank, ranks = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank % torch.cuda.device_count())
    if "--diverge" in sys.argv:
        _diverge()
        return
    cases, failures = 0, []
    for recipe in ("mxfp8", "fp8_rowwise", "bf16"):
        for case in ("random", "one_expert", "one_rank", "empty_runs", "same_rank", "dropped", "random"):
            for tokens, hidden, topk, experts, align in (
                (256, 512, 4, 8 * ranks, 32),
                (77, 384, 8, 4 * ranks, 16),
            ):
                try:
                    _check(case, tokens, hidden, topk, experts, recipe, align)
                except AssertionError as exc:  # report every failing case, then fail
                    failures.append(f"{recipe} {case} T{tokens} E{experts}: {exc}")
                    print(f"FAIL {failures[-1]}", flush=True)
                cases += 1
    many = (EP_MAX_EXPERTS // ranks + 1) * ranks  # past the routing kernels' tables, a multiple of R
    for recipe in ("mxfp8", "fp8_rowwise", "bf16"):  # the PyTorch routing, twice on one slot
        for case in ("random", "dropped"):
            try:
                _check(case, 64, 256, 4, many, recipe, 16)
            except AssertionError as exc:
                failures.append(f"{recipe} {case} T64 E{many}: {exc}")
                print(f"FAIL {failures[-1]}", flush=True)
            cases += 1
    for recipe in ("mxfp8", "fp8_rowwise", "bf16"):
        try:
            _check_graph_replay(recipe)
        except AssertionError as exc:
            failures.append(f"graph replay {recipe}: {exc}")
            print(f"FAIL {failures[-1]}", flush=True)
        cases += 1
    _check_autograd(96, 256, 4, 4 * ranks)
    cases += 1
    for recipes, checkpointed in (
        (("bf16", "bf16"), ()),
        (("bf16", "fp8_rowwise", "bf16"), ()),
        (("fp8_rowwise", "mxfp8", "bf16", "fp8_rowwise"), (1,)),
    ):
        _check_layers(recipes, checkpointed)
        cases += 1
    _check_moe_layer()
    cases += 1
    # Steady state: buffers exist, so nothing may sync the host.
    dev = torch.device("cuda", torch.cuda.current_device())
    x = torch.randn(256, 512, device=dev).bfloat16()
    ids = torch.randint(0, 8 * ranks, (256, 4), device=dev)
    w = torch.rand(256, 4, device=dev)
    for step in range(4):  # a result alive during the next call: two slots, made in steps 0 and 1
        if step == 2:
            torch.cuda.set_sync_debug_mode("error")
        res = ep.dispatch(x, ids, num_experts=8 * ranks)
        ep.combine(torch.zeros(res.q.shape[0], 256, device=dev, dtype=torch.bfloat16), res, w)
    torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    dist.barrier()
    if failures:
        raise AssertionError(f"rank {rank}: {len(failures)} of {cases} cases failed")
    if rank == 0:
        print(
            f"ep multi-GPU: {cases} cases passed on {ranks} ranks ({torch.cuda.get_device_name()})",
            flush=True,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
