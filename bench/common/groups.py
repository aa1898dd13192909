"""Group-size generators: skewed, unaligned token groups like a router's, and uneven 32-row blocks."""

from __future__ import annotations

import numpy as np
import torch


def skewed_group_sizes(total: int, num_groups: int, *, seed: int = 0) -> list[int]:
    """Deterministic, skewed, generally unaligned group sizes that sum to ``total``.

    Sizes follow a heavy-tailed (log-normal) split like a real router's token counts: a few big
    experts, many small ones, possibly some empty.
    """
    if num_groups <= 0:
        raise ValueError(f"num_groups must be positive, got {num_groups}")
    if total < 0:
        raise ValueError(f"total must be >= 0, got {total}")
    rng = np.random.default_rng(1234 + 7919 * seed + num_groups)
    weights = rng.lognormal(mean=0.0, sigma=1.0, size=num_groups)
    raw = weights / weights.sum() * total
    sizes = np.floor(raw).astype(np.int64)
    sizes[int(np.argmax(sizes))] += total - int(sizes.sum())
    return [int(s) for s in sizes]


def skewed_group_ends(total: int, num_groups: int, *, seed: int = 0) -> list[int]:
    """End offsets (cumulative sums) of :func:`skewed_group_sizes`; the last one is ``total``."""
    return [int(v) for v in np.cumsum(skewed_group_sizes(total, num_groups, seed=seed))]


def block_group_ends(rows: int, groups: int, device: torch.device | str = "cuda") -> torch.Tensor:
    """Int32 end offsets of ``groups`` uneven row groups (sizes growing as 1, 2, ..., G) of whole
    32-row blocks covering all ``rows`` (a multiple of 32), on ``device``."""
    blocks = rows // 32
    weights = torch.arange(1, groups + 1, dtype=torch.float64)
    sizes = (weights / weights.sum() * blocks).floor().long()
    sizes[-1] += blocks - int(sizes.sum())
    return (torch.cumsum(sizes, 0) * 32).to(torch.int32).to(device)
