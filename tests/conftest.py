"""Shared fixtures: GPU gating, poisoned allocations, seeded group sizes."""

from __future__ import annotations

import contextlib

import pytest
import torch


def _kernel_gpu_available() -> bool:
    if not torch.cuda.is_available():
        return False
    from torch_bindings.backend import kernel_arch

    return kernel_arch(torch.device("cuda"))[0] is not None


def pytest_collection_modifyitems(config, items):
    if _kernel_gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU with sm_90+ and nvidia-cutlass-dsl")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def poison_cuda_allocator():
    """Fill the caching allocator's free blocks with 0xA5 so unwritten output bytes show up."""

    def poison(nbytes: int = 1 << 28) -> None:
        block = torch.full((nbytes,), 0xA5, dtype=torch.uint8, device="cuda")
        del block

    return poison


@contextlib.contextmanager
def no_sync():
    """Fail on any host-device synchronization inside the block (nothing to check without CUDA)."""
    if not torch.cuda.is_available():
        yield
        return
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def random_group_ends(
    total: int, num_groups: int, generator: torch.Generator, special=(0, 1, 44, 127, 129), multiple: int = 1
) -> list[int]:
    """End offsets of ``num_groups`` groups summing to at most ``total``, with special sizes mixed in.

    Sizes are multiples of ``multiple``; some groups are empty; the last end may be below ``total``.
    """
    sizes = []
    for g in range(num_groups):
        if g < len(special) and num_groups > len(special):
            sizes.append(special[g] * multiple)
        else:
            sizes.append(int(torch.randint(0, 3, (1,), generator=generator)) * multiple)
    weights = torch.rand(num_groups, generator=generator)
    budget = total - sum(sizes)
    if budget < 0:
        sizes = [0] * num_groups
        budget = total
    extra = (weights / weights.sum() * budget).floor().long() // multiple * multiple
    ends, running = [], 0
    for size, more in zip(sizes, extra.tolist(), strict=True):
        running += size + more
        ends.append(running)
    return ends


def random_bits(shape: tuple, dtype: torch.dtype, seed: int, device: str = "cpu") -> torch.Tensor:
    """Arbitrary bit patterns of ``dtype`` (NaN payloads, -0, Inf, subnormals; bool: 0 or 1): what
    a byte copy must move exactly."""
    gen = torch.Generator(device=device).manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen, device=device).to(torch.bool)
    from torch_bindings.reference import BITS_DTYPES

    bits = BITS_DTYPES[dtype.itemsize]
    info = torch.iinfo(bits)
    return torch.randint(info.min, info.max, shape, generator=gen, device=device, dtype=bits).view(dtype)


def assert_same_bytes(actual: torch.Tensor, expected: torch.Tensor, what: str = "") -> None:
    """Shapes, dtypes and every byte equal (``expected`` may live on another device)."""
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, (
        f"{what}: {actual.shape}/{actual.dtype} vs {expected.shape}/{expected.dtype}"
    )
    a, e = actual.view(torch.uint8), expected.to(actual.device).view(torch.uint8)
    if not torch.equal(a, e):
        mismatch = (a != e).nonzero()
        first = mismatch[:4].tolist()
        raise AssertionError(
            f"{what}: {mismatch.shape[0]} bytes differ, first at {first}: "
            f"{[a[tuple(i)].item() for i in first]} vs {[e[tuple(i)].item() for i in first]}"
        )


def cuda_offsets(ends) -> torch.Tensor:
    """int32 end offsets on the GPU."""
    return torch.tensor(ends, dtype=torch.int32, device="cuda")


def kernel_targets(*entries: str) -> dict:
    """SASS targets of the ``cute_kernels.registry`` entries named ``entries``."""
    from cute_kernels import registry

    targets: dict = {}
    for name in entries:
        targets.update(registry.entry(name).sass_targets())
    return targets


def _archs() -> tuple[str, ...]:
    from cute_utils import sass

    return tuple(sass.ARCHS)


@pytest.fixture(scope="module", params=_archs())
def compiled(request):
    """``(arch, {target: SASS summaries})`` for the test module's ``TARGETS``, compiled once per arch."""
    from cute_utils import sass

    arch = request.param
    targets = request.module.TARGETS
    return arch, {name: sass.summarize(sass.cubin_of(build(arch))) for name, build in targets.items()}
