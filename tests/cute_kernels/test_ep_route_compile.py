"""The EP routing kernels (``cute_kernels.ep_route``: route, layout, zero fill) compile for sm_90a and
sm_100a on a CPU-only machine, with the SASS their design needs; plus their configs, their place in
the registry, and the bindings' choice of path on CPU."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_recorded_hashes, kernel_targets, spill_free_kernel

from cute_kernels import configs, registry
from cute_utils.constants import EP_FILL_VARIANTS, EP_MAX_EXPERTS
from torch_bindings import ep

TARGETS = kernel_targets("ep_route", "ep_layout", "ep_zero_fill")


def _id_bits(target: str) -> int:
    return 64 if target.endswith("int64") else 32


@pytest.mark.parametrize("target", sorted(t for t in TARGETS if t.startswith("ep_route_")))
def test_route_sass(compiled, target):
    """Warp-aggregated shared atomics: one MATCH.ANY and one ATOMS.ADD per id of the prefix count's
    batch and per step of the chunk (counted, then ranked), a shuffle per ranking step; the ids read
    at their own width, every load of a batch issued before the counting; besides, the count post's
    two loads (a peer table's 64-bit address, a count read back); three CTA barriers."""
    kernel, text = spill_free_kernel(compiled, target)
    config = configs.pick("ep_route", None, compiled[0])
    per_id = config.loads + 2 * config.steps
    assert kernel.counts.get("MATCH.ANY", 0) == per_id, text
    assert kernel.counts.get("ATOMS.ADD", 0) == per_id, text
    assert kernel.counts.get("SHFL.IDX", 0) == config.steps, text
    bits = _id_bits(target)
    ids = config.loads + config.steps
    assert kernel.global_loads(bits) == ids + 1, text
    assert kernel.global_loads() == ids + 2 and kernel.global_loads(96 - bits) == 1, text
    assert kernel.global_stores() == kernel.global_stores(32), text
    assert kernel.opcode("BAR") == 3, text


@pytest.mark.parametrize("target", sorted(t for t in TARGETS if t.startswith("ep_layout_")))
def test_layout_sass(compiled, target):
    """The (E,) bases scanned in-kernel (warp shuffles, no atomics), int32 stores only."""
    kernel, text = spill_free_kernel(compiled, target)
    assert kernel.counts.get("SHFL.UP", 0) >= 1, text
    assert kernel.opcode("ATOMS") == 0 and kernel.opcode("MATCH") == 0, text
    if _id_bits(target) == 64:
        assert kernel.global_loads(64) == configs.pick("ep_layout", None, compiled[0]).pairs, text
    assert kernel.global_stores() == kernel.global_stores(32), text


@pytest.mark.parametrize("target", sorted(t for t in TARGETS if t.startswith("ep_zero_fill_")))
def test_zero_fill_sass(compiled, target):
    """The row buffer's stores of the variant's vector (``vectors_per_lane`` per row chunk), the aux
    buffers' 32-bit words, no load of any buffer: 32-bit loads of the offsets and ``filled`` only;
    the padding scanned in-kernel."""
    kernel, text = spill_free_kernel(compiled, target)
    width = 8 * int(target.rsplit("_v", 1)[1])
    per_lane = configs.pick("ep_zero_fill", None, compiled[0]).vectors_per_lane
    assert kernel.global_stores(width) == per_lane, text
    assert kernel.global_stores() == per_lane + kernel.global_stores(32), text
    assert kernel.global_loads() == kernel.global_loads(32), text
    assert kernel.counts.get("SHFL.UP", 0) >= 1, text


def test_registry_names():
    ids = {"ep_route_int32", "ep_route_int64", "ep_layout_int32", "ep_layout_int64"}
    fills = {f"ep_zero_fill_{dtype}_v{width}" for dtype, width in EP_FILL_VARIANTS}
    assert set(TARGETS) == ids | fills


def test_not_in_the_bandwidth_model():
    """Latency-bound kernels of a few bytes per pair: the bytes-in-flight model leaves them out."""
    names = {"ep_route", "ep_layout", "ep_zero_fill"}
    assert names <= set(registry.KERNELS) and not names & set(registry.modelled())


def test_configs():
    from cute_kernels.ep_route import EpLayoutConfig, EpRouteConfig, EpZeroFillConfig

    for arch in ("sm_90a", "sm_100a"):
        route = configs.pick("ep_route", None, arch)
        assert (route.warps + 1) * EP_MAX_EXPERTS * 4 <= 48 * 1024
        assert route.chunk_pairs == route.warps * 32 * route.steps
    with pytest.raises(ValueError, match="exceed"):
        EpRouteConfig(warps=16)
    with pytest.raises(ValueError):
        EpLayoutConfig(threads=100)
    with pytest.raises(ValueError):
        EpZeroFillConfig(ctas_per_sm=0)


def test_cpu_takes_the_pytorch_path():
    """On CPU: PyTorch routing (int64 ranks, no message), a zero index for the row scatter."""
    ids = torch.tensor([[0, 3], [3, -1], [7, 3]])
    routing = ep.route(ids, 4)
    assert routing.message is None and routing.position.dtype == torch.int64
    assert routing.counts.tolist() == [1, 0, 0, 3]
    assert routing.position.tolist()[:4] == [0, 0, 1, 0] and routing.position[5] == 2
    shape = ep.EpShape(1, 3, 128, 2, 4, 16, "bf16")
    lay = ep.layout(routing, routing.counts[None], 0, shape, None)
    assert lay.zero_index is not None and lay.zero_index.shape == (shape.rows,)
    assert lay.dst_index.tolist() == [0, 16, 17, -1, -1, 18]
    assert lay.padded_start.tolist() == [0, 16, 16, 16] and lay.padded_end.tolist() == [16, 16, 16, 32]


def test_instruction_hashes_are_the_recorded_ones(compiled):
    assert_recorded_hashes(compiled)
