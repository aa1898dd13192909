"""The pad / unpad kernels compile for sm_90a and sm_100a on a CPU-only machine, with SASS we expect;
plus the CPU-side pieces of their bindings (vector width choice, fake shapes, reference num_tokens)."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_recorded_hashes, kernel_targets
from torch._subclasses.fake_tensor import FakeTensorMode

import cute_kernels.pad
import torch_bindings
from torch_bindings import pad as pad_bindings
from torch_bindings import reference

TARGETS = kernel_targets("pad", "unpad")


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_compiles_with_expected_sass(compiled, target):
    arch, summaries = compiled
    (kernel,) = [k for k in summaries[target] if k.entry]
    info = kernel.format()
    assert kernel.arch == arch
    assert kernel.local_bytes == 0 and kernel.local_loads == 0 and kernel.local_stores == 0, info
    # ctas_per_sm=4 with 256 threads caps registers at 64 (4 x 16-byte vectors in flight per lane).
    assert kernel.registers <= 64, info
    width_bits = 8 * int(target.rsplit("_v", 1)[1])
    per_lane = cute_kernels.pad.PadKernel.default_config(None, arch).vectors_per_lane
    # The data moves at the variant's width, all loads of a row chunk issued before its stores.
    assert kernel.global_loads(width_bits) >= per_lane and kernel.global_stores(width_bits) >= per_lane, info
    # Besides data: 32-bit offset loads (the scan, padded_start) and, for pad, the padded offsets.
    widths = {width_bits, 32}
    assert kernel.global_loads() == sum(kernel.global_loads(w) for w in widths), info
    assert kernel.global_stores() == sum(kernel.global_stores(w) for w in widths), info
    assert kernel.counts.get("SHFL.UP", 0) >= 1, "the group sizes are scanned in-kernel"


def test_registry_names():
    expected = set()
    for op in ("pad", "unpad"):
        # One kernel per element size (a byte copy): uint8, int16, int32, int64 carriers.
        expected |= {f"{op}_uint8_v{w}" for w in (16, 4, 1)} | {f"{op}_int16_v{w}" for w in (16, 4, 2)}
        expected |= {f"{op}_int32_v{w}" for w in (16, 4)} | {f"{op}_int64_v{w}" for w in (16, 8)}
    assert set(TARGETS) == expected


@pytest.mark.parametrize(
    "dtype,cols,offset,expected",
    [
        (torch.bfloat16, 7168, 0, 16),
        (torch.bfloat16, 8, 1, 2),  # pointer 2 bytes past a boundary
        (torch.bfloat16, 6, 0, 4),
        (torch.bfloat16, 7, 0, 2),
        (torch.float32, 3, 0, 4),
        (torch.float32, 4, 0, 16),
        (torch.float8_e4m3fn, 5, 0, 1),
        (torch.float8_e4m3fn, 4, 0, 4),
        (torch.bfloat16, 0, 0, 2),  # torch gives (4, 0) the row stride 1
        (torch.int64, 3, 0, 8),
        (torch.float64, 2, 0, 16),
    ],
)
def test_vector_width_choice(dtype, cols, offset, expected):
    base = torch.zeros(1 << 17, dtype=torch.uint8).view(dtype)
    x = base[offset : offset + 4 * cols].view(4, cols)
    assert pad_bindings._gather("pad", x, 4, cols, pad_bindings.operand_of(x))[1][2] == expected


def test_fake_shapes():
    with FakeTensorMode():
        x = torch.empty(157, 7, dtype=torch.bfloat16, device="cuda")
        ends = torch.empty(5, dtype=torch.int32, device="cuda")
        padded, start, end = pad_bindings._pad_fake(x, ends, 64)
        assert padded.shape == (reference.padded_rows(157, 5, 64), 7) and padded.dtype == torch.bfloat16
        assert start.shape == end.shape == (5,) and start.dtype == torch.int32
        out = pad_bindings._unpad_fake(padded, ends, start, 157)
        assert out.shape == (157, 7) and out.dtype == torch.bfloat16


def test_public_ops_run_reference_on_cpu_with_num_tokens():
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(-(2**15), 2**15, (50, 3), generator=gen, dtype=torch.int16).view(torch.bfloat16)
    ends = torch.tensor([0, 7, 7, 40], dtype=torch.int32)
    padded, start, end = torch_bindings.pad_token_groups(x, ends, alignment=16)
    assert torch.equal(end, torch.tensor([0, 16, 16, 64], dtype=torch.int32))
    back = torch_bindings.unpad_token_groups(padded, ends, start, num_tokens=50)
    assert back.shape == (50, 3)
    assert torch.equal(back[:40].view(torch.int16), x[:40].view(torch.int16))
    assert not back[40:].view(torch.int16).any()  # rows past the last group are zero
    short = torch_bindings.unpad_token_groups(padded, ends, start)  # num_tokens from the offsets
    assert torch.equal(short.view(torch.int16), x[:40].view(torch.int16))


@pytest.mark.parametrize(
    "num_tokens,error,match",
    [
        (-1, ValueError, "num_tokens must be >= 0"),
        (2.0, TypeError, "num_tokens must be None or an int"),
        (True, TypeError, "num_tokens"),
        (39, ValueError, "last value"),
    ],
)
def test_unpad_num_tokens_checked(num_tokens, error, match):
    padded = torch.zeros(64, 4)
    ends = torch.tensor([10, 40], dtype=torch.int32)
    start = torch.tensor([0, 16], dtype=torch.int32)
    with pytest.raises(error, match=match):
        torch_bindings.unpad_token_groups(padded, ends, start, num_tokens=num_tokens)


@pytest.mark.parametrize(
    "dtype,carrier,width",
    [
        ("bfloat16", "int16", 16),
        ("float16", "int16", 2),
        ("float8_e4m3fn", "uint8", 16),
        ("int8", "uint8", 1),
        ("float32", "int32", 4),
        ("float64", "int64", 8),
    ],
)
def test_dtype_kernels_have_the_carrier_instructions(dtype, carrier, width):
    """Bindings compile pad / unpad per dtype (no carrier view per call): the same instructions."""
    from cute_kernels import registry
    from cute_kernels.pad import ELEMENT_TYPES, RowGatherVariant
    from cute_utils.constants import PAD_KERNEL_DTYPES
    from cute_utils.sass import compile_options, cubin_of, disassemble, instruction_hash

    assert set(ELEMENT_TYPES) == set(PAD_KERNEL_DTYPES) and dtype in PAD_KERNEL_DTYPES
    entry = registry.entry("pad")

    def hash_of(name: str) -> str:
        compiled = entry.compile(RowGatherVariant(name, width), "sm_90a", options=compile_options("sm_90a"))
        return instruction_hash(disassemble(cubin_of(compiled)))

    assert hash_of(dtype) == hash_of(carrier)


def test_instruction_hashes_are_the_recorded_ones(compiled):
    assert_recorded_hashes(compiled)
