"""EP send on one GPU: the fused quantize-and-send kernel (``torch_bindings.ep_send``) next to the
chain it replaces (the quantizer, then one row-scatter launch per buffer kind, as
``torch_bindings.ep.send_dispatch`` runs today) and a device copy of the same bytes.

    python -m bench.bench_ep_send [--tokens 8192] [--hidden 7168] [--topk 8] [--ranks 1 4]
        [--recipes mxfp8 fp8_rowwise bf16] [--configs] [--no-graph]

The R destination buffers of each kind are local tensors addressed through a device table, so the
stores go to HBM, not over NVLink (the multi-GPU number is ``bench_ep``'s once ``ep`` calls the
kernel). Every (token, slot) item goes to a distinct random row of the R buffers (no drops).
Bytes moved: x read once plus every item's q row, scale and tag written. Per row: time (CUDA-graph
replays, median), GB/s, ratio to the copy, and for the fused kernel the speedup over the chain and
whether the two wrote the same bytes. ``--configs`` also times the kernel under other launch
configs (``SendConfig``: threads, vectors per thread, CTAs per SM) with the bytes checked.
"""

from __future__ import annotations

import argparse
import sys

import torch

from bench.common.baselines import copy_baseline_us
from bench.common.device import cuda_or_none, device_name
from bench.common.timing import time_cuda
from torch_bindings import ep, quantize_fp8_2d, quantize_mxfp8_2d
from torch_bindings.ep_send import PeerBuffers, SendBuffers, buffer_specs, quantize_and_send

CONFIGS = [(128, 8, 7), (128, 4, 8), (256, 4, 4), (256, 2, 8), (512, 2, 2), (64, 16, 4)]


def _kinds(recipe: str, ranks: int, rows: int, hidden: int, int32_scales: bool = False) -> dict:
    """R zeroed local tensors per buffer kind, by name: ``(PeerBuffers, ep.SharedRows)`` views of them
    (fp8_rowwise's unfused chain moves its scales as int32: the row scatter has no fp32 variant)."""
    out = {}
    for name, (shape, dtype) in buffer_specs(recipe, rows, hidden).items():
        if int32_scales and dtype == torch.float32:
            dtype = torch.int32
        tensors = [torch.zeros(shape, dtype=dtype, device="cuda") for _ in range(ranks)]
        ptrs = torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64, device="cuda")
        out[name] = (
            PeerBuffers(tensors[0], ptrs, tensors),
            ep.SharedRows(tensors[0], ptrs, ptrs[:1], tensors),
        )
    return out


def _fused(x, index, kinds: dict, recipe: str, topk: int, config=None):
    """The fused send through the binding, or (``config``) the kernel compiled with that config."""
    buffers = SendBuffers(kinds["q"][0], kinds["scales"][0] if "scales" in kinds else None, kinds["tags"][0])
    if config is None:
        return lambda: quantize_and_send(x, index, buffers, recipe=recipe, rank=1, topk=topk)
    from cute_kernels import registry
    from cute_kernels.ep_send import SendConfig, SendVariant
    from torch_bindings.backend import kernel_arch

    arch, _ = kernel_arch(x.device)
    kernel = registry.entry("ep_send").compile(SendVariant(recipe), arch, config=SendConfig(*config))
    scales = buffers.tags if recipe == "bf16" else buffers.scales
    q, tags, index2 = buffers.q, buffers.tags, index.view(x.shape[0], topk)
    return lambda: kernel(x, index2, q.own, q.ptrs, scales.own, scales.ptrs, tags.own, tags.ptrs, 1)


def _unfused(x, index, kinds: dict, recipe: str, topk: int):
    """The chain: quantize, then one row scatter per kind (tags computed as ``send_dispatch`` does)."""
    pairs = torch.arange(x.shape[0] * topk, dtype=torch.int32, device=x.device)
    src_rows = pairs // topk

    def run():
        if recipe == "mxfp8":
            q, s = quantize_mxfp8_2d(x, blocked_scales=False)
        elif recipe == "fp8_rowwise":
            q, s = quantize_fp8_2d(x, axis="row")
            s = s.view(torch.int32).view(-1, 1)
        else:
            q, s = x, None
        ep.scatter_rows(q, kinds["q"][1], src_rows, index)
        if s is not None:
            ep.scatter_rows(s, kinds["scales"][1], src_rows, index)
        tags = (pairs + (1 * pairs.numel() + 1)).view(-1, 1)
        ep.scatter_rows(tags, kinds["tags"][1], pairs, index)

    return run


def _same_bytes(a: dict, b: dict) -> bool:
    return all(
        torch.equal(x.view(torch.uint8), y.view(torch.uint8))
        for name in a
        for x, y in zip(a[name][0].tensors, b[name][0].tensors, strict=True)
    )


def bench_case(args, recipe: str, ranks: int) -> list[str]:
    """The rows of one (recipe, R)."""
    tokens, hidden, topk = args.tokens, args.hidden, args.topk
    gen = torch.Generator(device="cuda").manual_seed(ranks)
    x = torch.randn(tokens, hidden, device="cuda", generator=gen).bfloat16()
    rows = -(-tokens * topk // ranks)
    index = torch.randperm(ranks * rows, device="cuda", generator=gen)[: tokens * topk].to(torch.int32)
    scale_bytes = {"mxfp8": hidden // 32, "fp8_rowwise": 4, "bf16": 0}[recipe]
    row_bytes = hidden * (2 if recipe == "bf16" else 1) + scale_bytes + 4
    nbytes = tokens * hidden * 2 + tokens * topk * row_bytes
    copy_us = copy_baseline_us(nbytes)
    fused_kinds, chain_kinds = _kinds(recipe, ranks, rows, hidden), _kinds(recipe, ranks, rows, hidden, True)
    timing = dict(use_graph=not args.no_graph)
    fused_us = time_cuda(_fused(x, index, fused_kinds, recipe, topk), **timing)
    chain_us = time_cuda(_unfused(x, index, chain_kinds, recipe, topk), **timing)
    same = _same_bytes(fused_kinds, chain_kinds)
    head = f"| {recipe} | {ranks} | {nbytes / 1e6:.0f} |"
    lines = [
        f"{head} copy | {copy_us:.0f} | {nbytes / copy_us / 1e3:.0f} | 1.00 | | |",
        f"{head} unfused chain | {chain_us:.0f} | {nbytes / chain_us / 1e3:.0f} | "
        f"{copy_us / chain_us:.2f} | | |",
        f"{head} fused | {fused_us:.0f} | {nbytes / fused_us / 1e3:.0f} | {copy_us / fused_us:.2f} | "
        f"{chain_us / fused_us:.2f}x | {same} |",
    ]
    for config in CONFIGS if args.configs else ():
        kinds = _kinds(recipe, ranks, rows, hidden)
        us = time_cuda(_fused(x, index, kinds, recipe, topk, config), **timing)
        lines.append(
            f"{head} fused {config} | {us:.0f} | {nbytes / us / 1e3:.0f} | {copy_us / us:.2f} | "
            f"{chain_us / us:.2f}x | {_same_bytes(kinds, chain_kinds)} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument("--topk", type=int, default=8)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--recipes", nargs="+", default=["mxfp8", "fp8_rowwise", "bf16"])
    parser.add_argument("--configs", action="store_true", help="also time other SendConfigs")
    parser.add_argument("--no-graph", action="store_true", help="time eager calls, not graph replays")
    args = parser.parse_args(argv)
    if cuda_or_none("bench_ep_send") is None:
        return 2
    print(f"### EP send, T={args.tokens} D={args.hidden} k={args.topk} ({device_name()})")
    print("| recipe | R | MB moved | op | time us | GB/s | ratio to copy | fused vs chain | same bytes |")
    print("|---|---|---|---|---|---|---|---|---|")
    for recipe in args.recipes:
        for ranks in args.ranks:
            print("\n".join(bench_case(args, recipe, ranks)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
