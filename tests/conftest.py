"""Shared fixtures: GPU gating, poisoned allocations, seeded group sizes, another arch's configs."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
import torch


def _kernel_gpu_available() -> bool:
    if not torch.cuda.is_available():
        return False
    from torch_bindings.backend import kernel_arch

    return kernel_arch(torch.device("cuda"))[0] is not None


def pytest_collection_modifyitems(config, items):
    if os.environ.get("CUTE_KERNELS_TEST_CONFIG_ARCH"):  # see _configs_of_another_arch
        other = pytest.mark.skip(reason="CUTE_KERNELS_TEST_CONFIG_ARCH: only GPU tests run")
        for item in items:
            if "gpu" not in item.keywords:
                item.add_marker(other)
    if _kernel_gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU with sm_90+ and nvidia-cutlass-dsl")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def _configs_of_another_arch():
    """``CUTE_KERNELS_TEST_CONFIG_ARCH=sm_100a``: kernels compile for the GPU at hand with that
    arch's configs (``cute_kernels.configs``; its tuned entries, none for sm_100a, else its
    heuristics) and the disk cache off, so a Hopper runs the GPU tests on Blackwell's configs (the
    same instructions, other launch shapes); tests not marked ``gpu`` (which pick configs per arch
    themselves) are skipped. Unset: nothing changes."""
    arch = os.environ.get("CUTE_KERNELS_TEST_CONFIG_ARCH")
    if not arch:
        yield
        return
    from cute_kernels import configs

    pick, pick_for_shape = configs.pick, configs.pick_for_shape
    configs.pick = lambda kernel, variant, _: pick(kernel, variant, arch)
    configs.pick_for_shape = lambda kernel, variant, _, device, shape_class: pick_for_shape(
        kernel, variant, arch, device, shape_class
    )
    previous = os.environ.get("CUTE_KERNELS_DISK_CACHE")
    os.environ["CUTE_KERNELS_DISK_CACHE"] = "0"
    yield
    configs.pick, configs.pick_for_shape = pick, pick_for_shape
    if previous is None:
        os.environ.pop("CUTE_KERNELS_DISK_CACHE")
    else:
        os.environ["CUTE_KERNELS_DISK_CACHE"] = previous


@pytest.fixture
def poison_cuda_allocator():
    """Fill the caching allocator's free blocks with 0xA5 so unwritten output bytes show up: one
    large block (outputs over 1 MiB are split from it) and 16 blocks of the small-allocation pool
    (outputs up to 1 MiB come from it, which the large block never reaches; an output that gets
    another free small block can still hold stale bytes: a test of unwritten bytes passes its own
    poisoned output, as the grouped GEMM's do). No sync: allocations and fills only."""

    def poison(nbytes: int = 1 << 28) -> None:
        blocks = [torch.full((nbytes,), 0xA5, dtype=torch.uint8, device="cuda")]
        blocks += [torch.full(((1 << 20) - 512,), 0xA5, dtype=torch.uint8, device="cuda") for _ in range(16)]
        del blocks

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


#: ``{(target, arch): instruction hash}`` of every build the ``compiled`` fixture made this run.
_BUILT_HASHES: dict[tuple[str, str], str] = {}
#: The recorded instruction hashes: ``tests/support/sass_hashes.txt``
#: (``python -m cute_utils.sass '*' --hash`` under a ``# nvidia-cutlass-dsl <version>`` line;
#: regenerate it when a change of SASS is intended and say why in the commit).
GOLDEN_HASHES = Path(__file__).parent / "support" / "sass_hashes.txt"


@pytest.fixture(scope="module", params=_archs())
def compiled(request):
    """``(arch, {target: SASS summaries})`` for the test module's ``TARGETS``, compiled once per arch
    (each build's instruction hash is kept for :func:`assert_recorded_hashes`)."""
    from cute_utils import sass

    arch = request.param
    out = {}
    for name, build in request.module.TARGETS.items():
        cubin = sass.cubin_of(build(arch))
        text = sass.disassemble(cubin)
        out[name] = sass.summarize(cubin, sass=text)
        _BUILT_HASHES[name, arch] = sass.instruction_hash(text)
    return arch, out


def _recorded_hashes() -> tuple[str, dict[tuple[str, str], str]]:
    lines = GOLDEN_HASHES.read_text().splitlines()
    version = lines[0].removeprefix("# nvidia-cutlass-dsl ").strip()
    table = {}
    for line in lines[1:]:
        name, arch, digest = line.split()
        table[name, arch] = digest
    return version, table


def spill_free_kernel(compiled, target: str):
    """``(kernel, text)``: the one kernel of ``target`` in the ``compiled`` fixture's builds and its
    SASS summary, after the checks every build passes (built for the fixture's arch, no local
    memory)."""
    arch, summaries = compiled
    (kernel,) = summaries[target]
    text = kernel.format()
    assert kernel.arch == arch
    assert kernel.local_bytes == 0 and kernel.local_loads == 0 and kernel.local_stores == 0, text
    return kernel, text


def assert_recorded_hashes(compiled) -> None:
    """Every target the ``compiled`` fixture built for its arch has the instruction hash recorded in
    ``tests/support/sass_hashes.txt`` (skipped under another DSL version: ptxas may schedule differently)."""
    import cutlass

    arch, summaries = compiled
    version, table = _recorded_hashes()
    if version != cutlass.__version__:
        pytest.skip(f"hashes recorded with nvidia-cutlass-dsl {version}, this is {cutlass.__version__}")
    changed = [
        f"{name} [{arch}]: {table.get((name, arch), 'not recorded')} -> {_BUILT_HASHES[name, arch]}"
        for name in sorted(summaries)
        if table.get((name, arch)) != _BUILT_HASHES[name, arch]
    ]
    assert not changed, "SASS changed (regenerate tests/support/sass_hashes.txt if intended):\n" + "\n".join(
        changed
    )
