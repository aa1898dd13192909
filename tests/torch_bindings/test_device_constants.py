"""``torch_bindings.device_constants.ConstantCache`` and the EP address tables built on it. The
stream and capture rules run on the GPU in the silu table's tests (``test_swiglu_gpu.py``)."""

from __future__ import annotations

import pytest
import torch

from torch_bindings.device_constants import ConstantCache
from torch_bindings.moe import ep

CPU = torch.device("cpu")


def test_a_key_is_built_once():
    cache, builds = ConstantCache(), []

    def build():
        builds.append(1)
        return torch.arange(4)

    first = cache.get("a", CPU, build)
    assert cache.get("a", CPU, build) is first and len(builds) == 1
    assert "a" in cache and len(cache) == 1 and not cache.pending("a")  # no event off CUDA


def test_past_the_limit_new_keys_are_built_each_time_and_nothing_is_dropped():
    cache = ConstantCache(limit=2)
    a = cache.get("a", CPU, lambda: torch.zeros(1))
    cache.get("b", CPU, lambda: torch.zeros(1))
    first = cache.get("c", CPU, lambda: torch.ones(1))
    assert cache.get("c", CPU, lambda: torch.ones(1)) is not first  # not cached
    assert cache.get("a", CPU, lambda: torch.ones(1)) is a and "c" not in cache and len(cache) == 2
    with pytest.raises(ValueError, match="limit must be None or >= 1"):
        ConstantCache(limit=0)


def test_address_tables_are_the_addresses_and_cached_by_them():
    tensors = [torch.empty(8, dtype=torch.uint8), torch.empty(3, 5)]
    table = ep._address_table(tensors, CPU)
    assert table.dtype == torch.int64 and table.tolist() == [t.data_ptr() for t in tensors]
    assert ep._address_table(list(tensors), CPU) is table
    other = ep._address_table(tensors[::-1], CPU)
    assert other is not table and other.tolist() == table.tolist()[::-1]


def test_local_pool_buffers_share_the_table_of_their_address():
    pool = ep.LocalPool(1, CPU)
    kinds = {"q": ((4, 16), torch.uint8), "tags": ((4, 1), torch.int32)}
    slot = pool.acquire("family", kinds)
    for rows in slot.views[0].values():
        assert rows.ptrs.tolist() == [rows.own.data_ptr()] and rows.self_ptr is rows.ptrs
        assert ep._address_table([rows.own], CPU) is rows.ptrs
