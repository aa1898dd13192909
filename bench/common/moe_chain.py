"""The bf16 MoE layer as the usual chain of PyTorch ops (the baseline of ``bench_ep``'s layer rows).

Router top-k (the same router as ``MoELayer``), then per rank: sort the (token, slot) pairs by
destination rank, ``all_to_all_single`` of the split sizes and a host read of them (the sync the
chain needs to size its buffers), ``all_to_all_single`` of the rows with those splits (autograd
through ``torch.distributed.nn``), sort the received rows by local expert, the bf16 experts
(``torch._grouped_mm``, any group sizes: no padding needed), unsort, ``all_to_all_single`` back,
unsort, and the routing-weighted sum in fp32. With R = 1 the all-to-alls are skipped.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _a2a(x: torch.Tensor, out_splits: list[int], in_splits: list[int]) -> torch.Tensor:
    """Differentiable ``all_to_all_single`` of rows."""
    if dist.get_world_size() == 1:
        return x
    from torch.distributed.nn.functional import all_to_all_single

    out = x.new_empty((sum(out_splits), x.shape[1]))
    return all_to_all_single(out, x, out_splits, in_splits)


def _counts(values: torch.Tensor, bins: int) -> torch.Tensor:
    return torch.zeros(bins, dtype=torch.int64, device=values.device).index_add_(
        0, values, torch.ones_like(values)
    )


def bf16_chain(layer, x: torch.Tensor) -> torch.Tensor:
    """``layer`` (a ``MoELayer`` of recipe bf16: its router and experts) as the chain above, x (T, D)
    bf16 -> (T, D) bf16."""
    ranks = dist.get_world_size() if dist.is_initialized() else 1
    local = layer.num_experts // ranks
    idx, weights = layer.route(x)
    tokens, topk = idx.shape
    e = idx.reshape(-1)
    order = torch.sort(e // local, stable=True).indices
    send = x.index_select(0, order // topk)
    counts = _counts(e // local, ranks)
    if ranks > 1:
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts)
        in_splits, out_splits = counts.tolist(), recv_counts.tolist()  # the host sync
        recv_e = e.new_empty(sum(out_splits))
        dist.all_to_all_single(recv_e, e[order].contiguous(), out_splits, in_splits)
    else:
        in_splits = out_splits = [e.numel()]
        recv_e = e[order]
    recv = _a2a(send, out_splits, in_splits)
    by_expert = torch.sort(recv_e % local, stable=True)
    grouped = recv.index_select(0, by_expert.indices)
    ends = torch.cumsum(_counts(by_expert.values, local), 0).to(torch.int32)
    y = layer.experts(grouped, ends)
    back = _a2a(y.index_select(0, torch.argsort(by_expert.indices)), in_splits, out_splits)
    pairs = back.index_select(0, torch.argsort(order)).view(tokens, topk, -1)
    return (pairs.float() * weights[:, :, None]).sum(1).to(torch.bfloat16)


__all__ = ["bf16_chain"]
