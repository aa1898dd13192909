"""swizzle_scales kernel on the GPU: bit-exact to the reference, no sync, graphs, compile, cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import no_sync, random_group_ends

import torch_bindings
from torch_bindings import reference

pytestmark = pytest.mark.gpu


def _scales(shape, generator) -> torch.Tensor:
    bits = torch.randint(0, 256, shape, generator=generator, dtype=torch.uint8)
    return bits.cuda().view(torch.float8_e8m0fnu)


def _assert_same_bytes(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    a, e = actual.view(torch.uint8), expected.to(actual.device).view(torch.uint8)
    if not torch.equal(a, e):
        mismatch = (a != e).nonzero()
        raise AssertionError(f"{mismatch.shape[0]} bytes differ, first at {mismatch[:4].tolist()}")


def _offsets(ends) -> torch.Tensor:
    return torch.tensor(ends, dtype=torch.int32, device="cuda")


@pytest.mark.parametrize(
    "shape",
    [(1, 1), (3, 3), (127, 5), (128, 4), (129, 64), (300, 7), (1000, 56), (8192, 224), (4099, 161), (0, 4)],
)
def test_plain_2d(shape, poison_cuda_allocator):
    gen = torch.Generator().manual_seed(hash(shape) % 1000)
    scales = _scales(shape, gen)
    poison_cuda_allocator()
    with no_sync():
        out = torch_bindings.swizzle_scales(scales, backend="cute")
    _assert_same_bytes(out, reference.swizzle_scales(scales.cpu()))


@pytest.mark.parametrize("shape", [(1, 32, 1), (2, 300, 7), (8, 8192, 160), (3, 128, 256)])
def test_plain_3d(shape, poison_cuda_allocator):
    gen = torch.Generator().manual_seed(7)
    scales = _scales(shape, gen)
    poison_cuda_allocator()
    with no_sync():
        out = torch_bindings.swizzle_scales(scales, backend="cute")
    _assert_same_bytes(out, reference.swizzle_scales(scales.cpu()))


@pytest.mark.parametrize(
    "rows,cols,num_groups",
    [(1, 1, 1), (700, 7, 4), (5000, 56, 8), (4096, 224, 64), (20000, 33, 256), (70000, 160, 1024), (0, 8, 3)],
)
@pytest.mark.parametrize("groups", ["M", "K"])
def test_grouped(rows, cols, num_groups, groups, poison_cuda_allocator):
    gen = torch.Generator().manual_seed(rows * 31 + num_groups)
    if groups == "K":
        rows, cols = max(cols * 4, 1), rows // 8 + num_groups  # wgrad: few rows, many token columns
    scales = _scales((rows, cols), gen)
    total = rows if groups == "M" else cols
    ends = _offsets(random_group_ends(total, num_groups, gen))
    poison_cuda_allocator()
    with no_sync():
        out = torch_bindings.swizzle_scales(scales, group_end_offsets=ends, groups=groups, backend="cute")
    expected = reference.swizzle_scales(scales.cpu(), group_end_offsets=ends.cpu(), groups=groups)
    _assert_same_bytes(out, expected)


def _skewed_scales(shape, skew, generator) -> torch.Tensor:
    """Contiguous scales whose first byte sits ``skew`` bytes past a 16-byte boundary."""
    numel = 1
    for size in shape:
        numel *= size
    storage = torch.empty(numel + 16, dtype=torch.uint8, device="cuda")
    scales = storage[skew : skew + numel].view(shape)
    scales.copy_(torch.randint(0, 256, shape, generator=generator, dtype=torch.uint8))
    assert scales.data_ptr() % 16 == skew and scales.is_contiguous()
    return scales.view(torch.float8_e8m0fnu)


@pytest.mark.parametrize(
    "groups,shape,skew",
    [
        # More row blocks than the persistent grid has CTAs per window: every CTA loops (prefetch).
        (None, (300001, 13), 0),
        (None, (200000, 36), 0),
        (None, (200000, 36), 2),
        (None, (40, 8192, 7), 1),
        (None, (40, 1000, 64), 0),
        ("M", (300001, 13), 3),
        ("M", (200000, 36), 0),
        ("M", (200000, 36), 1),
        ("M", (200000, 100), 1),  # the 128-column window (more than 64 columns)
        ("M", (100000, 160), 0),
        ("K", (1024, 40001), 0),
        ("K", (65536, 100), 3),
        ("K", (1000, 4096), 2),
    ],
)
def test_many_row_blocks_per_cta_any_alignment(groups, shape, skew, poison_cuda_allocator):
    gen = torch.Generator().manual_seed(sum(shape) + skew)
    scales = _skewed_scales(shape, skew, gen)
    kwargs = {}
    if groups is not None:
        total = shape[0] if groups == "M" else shape[1]
        kwargs = {"group_end_offsets": _offsets(random_group_ends(total, 37, gen)), "groups": groups}
    poison_cuda_allocator()
    with no_sync():
        out = torch_bindings.swizzle_scales(scales, backend="cute", **kwargs)
    cpu_kwargs = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    _assert_same_bytes(out, reference.swizzle_scales(scales.cpu(), **cpu_kwargs))


@pytest.mark.parametrize("groups", ["M", "K"])
def test_garbage_offsets_stay_in_bounds(groups):
    """Offsets the kernel cannot validate (decreasing, negative, past the end) must not fault."""
    gen = torch.Generator().manual_seed(3)
    scales = _scales((300, 40), gen)
    ends = _offsets([5000, -7, 120, 3, 1 << 30])
    out = torch_bindings.swizzle_scales(scales, group_end_offsets=ends, groups=groups, backend="cute")
    torch.cuda.synchronize()
    assert out.dtype == torch.float8_e8m0fnu


def test_cuda_graph_replay():
    gen = torch.Generator().manual_seed(11)
    scales = _scales((3000, 56), gen)
    ends = _offsets(random_group_ends(3000, 8, gen))
    torch_bindings.swizzle_scales(scales, group_end_offsets=ends)  # compile outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = torch_bindings.swizzle_scales(scales, group_end_offsets=ends)
    for seed in range(3):
        gen.manual_seed(100 + seed)
        scales.copy_(_scales((3000, 56), gen))
        ends.copy_(_offsets(random_group_ends(3000, 8, gen)))
        graph.replay()
        torch.cuda.synchronize()
        expected = reference.swizzle_scales(scales.cpu(), group_end_offsets=ends.cpu(), groups="M")
        _assert_same_bytes(out, expected)


def test_torch_compile_fullgraph():
    gen = torch.Generator().manual_seed(5)

    @torch.compile(fullgraph=True, dynamic=True)
    def both(scales, ends, k_scales, k_ends):
        m = torch_bindings.swizzle_scales(scales, group_end_offsets=ends, groups="M")
        k = torch_bindings.swizzle_scales(k_scales, group_end_offsets=k_ends, groups="K")
        return m, k

    for rows in (1000, 2500):
        scales = _scales((rows, 24), gen)
        ends = _offsets(random_group_ends(rows, 4, gen))
        k_scales = _scales((256, rows // 32), gen)
        k_ends = _offsets(random_group_ends(rows // 32, 4, gen))
        m, k = both(scales, ends, k_scales, k_ends)
        _assert_same_bytes(m, reference.swizzle_scales(scales.cpu(), group_end_offsets=ends.cpu()))
        expected_k = reference.swizzle_scales(k_scales.cpu(), group_end_offsets=k_ends.cpu(), groups="K")
        _assert_same_bytes(k, expected_k)


def test_no_recompiles_across_sizes_and_offsets():
    gen = torch.Generator().manual_seed(9)
    torch_bindings.swizzle_scales(_scales((100, 8), gen), group_end_offsets=_offsets([50, 100]))
    torch_bindings.swizzle_scales(_scales((100, 8), gen), group_end_offsets=_offsets([50, 100]), groups="K")
    torch_bindings.swizzle_scales(_scales((100, 8), gen))
    torch_bindings.swizzle_scales(_scales((2, 100, 8), gen))  # 3D: a variant of its own
    # The static dims' classes: K-groups sources with R = K % 4 != 0 may end inside a word (raw
    # loads in their ragged form); M-groups / plain sources with C % 4 == 0 take word loads.
    torch_bindings.swizzle_scales(_scales((17, 8), gen), group_end_offsets=_offsets([5, 8]), groups="K")
    before = torch_bindings.compile_stats.compiles + torch_bindings.compile_stats.disk_loads
    for rows, cols, num_groups in [(17, 4, 1), (999, 8, 3), (4096, 12, 17), (130, 40, 64), (70001, 8, 5)]:
        ends = _offsets(random_group_ends(rows, num_groups, gen))
        for groups in ("M", "K"):
            torch_bindings.swizzle_scales(_scales((rows, cols), gen), group_end_offsets=ends, groups=groups)
        torch_bindings.swizzle_scales(_scales((rows, cols), gen))
        torch_bindings.swizzle_scales(_scales((3, rows, cols), gen))
    after = torch_bindings.compile_stats.compiles + torch_bindings.compile_stats.disk_loads
    assert after == before


@pytest.mark.parametrize("cols", [5, 161])
def test_ragged_sources_do_not_recompile_across_rows(cols):
    """C % 4 != 0: raw-word (ragged) kernels whatever M is, so after one call per layout no row
    count, even or odd, compiles another kernel."""
    gen = torch.Generator().manual_seed(cols)

    def calls(rows):
        torch_bindings.swizzle_scales(
            _scales((rows, cols), gen), group_end_offsets=_offsets([rows // 2, rows])
        )
        torch_bindings.swizzle_scales(_scales((rows, cols), gen))
        torch_bindings.swizzle_scales(_scales((3, rows, cols), gen))

    calls(64)
    before = torch_bindings.compile_stats.compiles + torch_bindings.compile_stats.disk_loads
    for rows in (17, 999, 4097, 70001, 70000):
        calls(rows)
    assert torch_bindings.compile_stats.compiles + torch_bindings.compile_stats.disk_loads == before


@pytest.mark.skipif(
    bool(os.environ.get("CUTE_KERNELS_TEST_CONFIG_ARCH")), reason="another arch's configs: disk cache off"
)
def test_disk_cache_second_process(tmp_path):
    """A fresh process with a warm disk cache loads instead of compiling; report both times."""
    script = textwrap.dedent(
        """
        import json, time, torch
        import torch_bindings
        start = time.perf_counter()
        out = torch_bindings.swizzle_scales(
            torch.zeros(256, 8, dtype=torch.uint8, device="cuda"),
            group_end_offsets=torch.tensor([100, 256], dtype=torch.int32, device="cuda"))
        torch.cuda.synchronize()
        stats = torch_bindings.compile_stats
        print(json.dumps({"first_call_s": time.perf_counter() - start, "compiles": stats.compiles,
                          "disk_loads": stats.disk_loads, "compile_s": stats.compile_seconds,
                          "load_s": stats.load_seconds}))
        """
    )
    env = dict(os.environ, CUTE_KERNELS_CACHE_DIR=str(tmp_path))
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print("\ndisk cache:", json.dumps(runs))
    assert runs[0]["compiles"] == 1 and runs[0]["disk_loads"] == 0
    assert runs[1]["compiles"] == 0 and runs[1]["disk_loads"] == 1
    assert runs[1]["load_s"][0] < runs[0]["compile_s"][0]


@pytest.mark.parametrize("groups", ["M", "K"])
def test_too_many_groups_is_refused(groups):
    scales = torch.zeros(64, 64, dtype=torch.float8_e8m0fnu, device="cuda")
    ends = torch.zeros(2049, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="at most 2048 groups"):
        torch_bindings.swizzle_scales(scales, group_end_offsets=ends, groups=groups, backend="cute")
