"""CPU-only tests of cute_utils.sass.

Toy CuTeDSL kernels are compiled for sm_90a and sm_100a (no GPU needed) and their SASS summaries are
checked against what the kernels must compile to. The expected numbers were cross-checked with
``ptxas -v`` output (``cute.compile(..., options="... remarks{ptx}")``).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import cutlass
import cutlass.cute as cute
import pytest

from cute_utils import sass

ARCHS = ("sm_90a", "sm_100a")
ROWS, COLS = 128, 64  # fp32 tensor copied by the toys, one (8, 64) tile per 128-thread CTA
TILE_ROWS = 8


def _have_nvdisasm() -> bool:
    try:
        sass.find_nvdisasm()
    except RuntimeError:
        return False
    return True


needs_nvdisasm = pytest.mark.skipif(
    not _have_nvdisasm(), reason="nvdisasm missing: pip install nvidia-cuda-nvdisasm"
)


# ---- toy kernels ---------------------------------------------------------------------------------


def _tiled_copy_128b() -> cute.TiledCopy:
    """128 threads as (8, 16), each moving 4 contiguous fp32 (128 bits) of an (8, 64) row-major tile."""
    atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), cutlass.Float32, num_bits_per_copy=128)
    return cute.make_tiled_copy_tv(atom, cute.make_layout((8, 16), stride=(16, 1)), cute.make_layout((1, 4)))


@cute.kernel
def _copy_kernel(a: cute.Tensor, b: cute.Tensor, tiled_copy: cute.TiledCopy):
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    thr = tiled_copy.get_slice(tidx)
    src = thr.partition_S(cute.local_tile(a, (TILE_ROWS, COLS), (bidx, 0)))
    frag = cute.make_rmem_tensor_like(src)
    cute.copy(tiled_copy, src, frag)
    cute.copy(tiled_copy, frag, thr.partition_D(cute.local_tile(b, (TILE_ROWS, COLS), (bidx, 0))))


@cute.jit
def _copy_host(a: cute.Tensor, b: cute.Tensor):
    _copy_kernel(a, b, _tiled_copy_128b()).launch(grid=(ROWS // TILE_ROWS, 1, 1), block=(128, 1, 1))


@cute.kernel
def _smem_kernel(a: cute.Tensor, b: cute.Tensor, tiled_copy: cute.TiledCopy):
    """Global -> static smem tile -> (another thread's slot) -> global, all 128-bit accesses."""
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    buf = cute.arch.alloc_smem(cutlass.Float32, TILE_ROWS * COLS, alignment=16)  # static: 2048 B
    s = cute.make_tensor(buf, cute.make_layout((TILE_ROWS, COLS), stride=(COLS, 1)))
    thr = tiled_copy.get_slice(tidx)
    src = thr.partition_S(cute.local_tile(a, (TILE_ROWS, COLS), (bidx, 0)))
    frag = cute.make_rmem_tensor_like(src)
    cute.copy(tiled_copy, src, frag)
    cute.copy(tiled_copy, frag, thr.partition_D(s))
    cute.arch.barrier()
    cute.copy(tiled_copy, tiled_copy.get_slice(127 - tidx).partition_S(s), frag)
    cute.copy(tiled_copy, frag, thr.partition_D(cute.local_tile(b, (TILE_ROWS, COLS), (bidx, 0))))


@cute.jit
def _smem_host(a: cute.Tensor, b: cute.Tensor):
    _smem_kernel(a, b, _tiled_copy_128b()).launch(grid=(ROWS // TILE_ROWS, 1, 1), block=(128, 1, 1))


@cute.kernel
def _local_kernel(a: cute.Tensor, b: cute.Tensor):
    """A register array indexed at run time has to live in local memory (stack frame)."""
    tidx, _, _ = cute.arch.thread_idx()
    r = cute.make_rmem_tensor(cute.make_layout(64), cutlass.Float32)
    for i in cutlass.range_constexpr(64):  # unrolled in Python: constant indices
        r[i] = a[tidx * 64 + i]
    b[tidx] = r[tidx % 64] + r[(tidx * 7) % 64]


@cute.jit
def _local_host(a: cute.Tensor, b: cute.Tensor):
    _local_kernel(a, b).launch(grid=(1, 1, 1), block=(128, 1, 1))


_TOYS = {"copy": _copy_host, "smem": _smem_host, "local": _local_host}


def _fakes() -> tuple[object, object]:
    def fake() -> object:
        return cute.runtime.make_fake_compact_tensor(
            cutlass.Float32, (ROWS, COLS), stride_order=(1, 0), assumed_align=16
        )

    return fake(), fake()


def _compile(toy: str, arch: str, extra: str = "") -> object:
    return cute.compile(_TOYS[toy], *_fakes(), options=sass.compile_options(arch, extra))


@functools.cache
def _cubin(toy: str, arch: str) -> bytes:
    return sass.cubin_of(_compile(toy, arch))


@functools.cache
def _sass_text(toy: str, arch: str) -> str:
    return sass.disassemble(_cubin(toy, arch))


def _summary(toy: str, arch: str) -> sass.KernelSass:
    kernels = sass.summarize(_cubin(toy, arch), sass=_sass_text(toy, arch))
    assert len(kernels) == 1, [k.name for k in kernels]
    return kernels[0]


# ---- nvdisasm and options --------------------------------------------------------------------------


@needs_nvdisasm
def test_find_nvdisasm_and_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = sass.find_nvdisasm()
    assert os.access(path, os.X_OK)
    monkeypatch.setenv(sass.NVDISASM_ENV, path)
    assert sass.find_nvdisasm() == path
    monkeypatch.setenv(sass.NVDISASM_ENV, str(tmp_path / "no-such-nvdisasm"))
    with pytest.raises(RuntimeError, match=sass.NVDISASM_ENV):
        sass.find_nvdisasm()


def test_compile_options() -> None:
    opts = sass.compile_options("sm_90a")
    assert opts.startswith("--gpu-arch sm_90a --keep-cubin --dump-dir=")
    dump_dir = Path(opts.split("--dump-dir=", 1)[1])
    assert dump_dir.is_dir() and not any(dump_dir.iterdir())
    assert not dump_dir.is_relative_to(Path.cwd())
    with_ffi = sass.compile_options("sm_100a", extra="--enable-tvm-ffi")
    assert with_ffi.startswith("--gpu-arch sm_100a --keep-cubin") and with_ffi.endswith(" --enable-tvm-ffi")
    assert with_ffi.split("--dump-dir=")[1].split()[0] != str(dump_dir)  # a fresh directory per compile
    with pytest.raises(ValueError):
        sass.compile_options("hopper")


def test_cubin_of_errors() -> None:
    with pytest.raises(RuntimeError, match="compile_options"):
        sass.cubin_of(object())
    with pytest.raises(RuntimeError, match="did not produce"):
        sass.cubin_of(types.SimpleNamespace(__cubin__="/missing/dir/k.sm_90a.cubin"))
    with pytest.raises(ValueError):
        sass.resource_usage(b"not an elf")


# ---- toy kernels for both architectures ------------------------------------------------------------


def test_one_process_compiles_both_archs() -> None:
    cubins = {arch: _cubin("copy", arch) for arch in ARCHS}
    assert cubins["sm_90a"] != cubins["sm_100a"]
    for arch, cubin in cubins.items():
        assert sass.cubin_arch(cubin) == arch


@needs_nvdisasm
@pytest.mark.parametrize("arch", ARCHS)
def test_vectorized_copy(arch: str) -> None:
    k = _summary("copy", arch)
    assert k.arch == arch and k.entry
    assert "copy_kernel" in k.name
    assert k.name in _sass_text("copy", arch)
    assert k.global_loads(128) >= 1 and k.global_stores(128) >= 1
    assert k.global_loads() == k.global_loads(128) and k.global_stores() == k.global_stores(128)
    assert k.has_vectorized_global() and not k.has_vectorized_shared()
    assert k.local_bytes == 0 and k.local_loads == 0 and k.local_stores == 0
    assert k.shared_bytes == 0 and k.named_barriers == 0
    assert k.threads == (128, 1, 1)
    # The allocation covers every register the SASS names (ptxas adds a couple of its own).
    highest = max(int(r) for r in re.findall(r"\bR(\d+)\b", _sass_text("copy", arch)))
    assert highest + 1 <= k.registers <= 32
    assert k.instructions > 0 and k.counts.get("EXIT", 0) >= 1
    text = k.format()
    assert "LDG.128 x" in text and "STG.128 x" in text and f"[{arch}]" in text


@needs_nvdisasm
@pytest.mark.parametrize("arch", ARCHS)
def test_static_shared_memory(arch: str) -> None:
    k = _summary("smem", arch)
    assert k.shared_bytes == TILE_ROWS * COLS * 4  # ptxas -v: "2048 bytes smem"
    usage = sass.resource_usage(_cubin("smem", arch))[k.name]
    assert usage["shared_section_bytes"] == k.shared_bytes + 1024  # sm_90+ reserved shared memory
    assert k.shared_stores(128) >= 1 and k.shared_loads(128) >= 1 and k.has_vectorized_shared()
    assert k.global_loads(128) >= 1 and k.global_stores(128) >= 1
    assert k.opcode("BAR") >= 1 and k.named_barriers == 1
    assert any(m.startswith("BAR.") for m in k.barriers)
    assert k.local_bytes == 0


@needs_nvdisasm
@pytest.mark.filterwarnings("ignore:This static loop has 64 iterations")
@pytest.mark.parametrize("arch", ARCHS)
def test_local_memory(arch: str) -> None:
    k = _summary("local", arch)
    assert k.local_bytes >= 64 * 4  # ptxas -v: "272 bytes stack frame"
    assert k.local_stores > 0 and k.local_loads > 0
    assert k.shared_bytes == 0


def test_tvm_ffi_options_compose() -> None:
    if importlib.util.find_spec("tvm_ffi") is None:
        pytest.skip("apache-tvm-ffi not installed")
    cubin = sass.cubin_of(_compile("copy", "sm_90a", extra="--enable-tvm-ffi"))
    assert sass.cubin_arch(cubin) == "sm_90a"


# ---- SASS text parsing (no compile) -----------------------------------------------------------------

_SYNTHETIC = """
\t.section\t.text.kern_a,"ax",@progbits
kern_a:
        /*0000*/                   LDG.E.128 R8, desc[UR4][R2.64] ;
        /*0010*/              @!P0 LDG.E.U8 R4, desc[UR4][R2.64] ;
        /*0020*/                   LDG.E.LTC128B.64 R4, desc[UR4][R2.64] ;
        /*0030*/                   LDG.E.ENL2.256 R12, R16, desc[UR4][R2.64] ;
        /*0040*/                   STG.E desc[UR4][R2.64], R5 ;
        /*0050*/                   LDS.U16 R0, [R1] ;
        /*0060*/               @P1 STS.64 [R1], R4 ;
        /*0070*/                   LDSM.16.MT88.4 R4, [R2] ;
        /*0080*/                   STL.128 [R1], R8 ;
        /*0090*/                   LDL R8, [R1] ;
        /*00a0*/                   UTMALDG.2D [UR8], [UR4], desc[UR10] ;
        /*00b0*/                   UTMASTG.2D [UR4], [UR6] ;
        /*00c0*/                   UBLKCP.S.G [UR4], [UR6], UR8 ;
        /*00d0*/                   F2FP.SATFINITE.E4M3.F32.PACK_AB_MERGE_C R0, R1, R2, RZ ;
        /*00e0*/                   F2FP.BF16.F32.PACK_AB R0, R1, R2 ;
        /*00f0*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4+0x8], R3 ;
        /*0100*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0110*/                   MEMBAR.ALL.CTA ;
        /*0120*/                   EXIT ;
        /*0130*/                   NOP;
\t.section\t.text.kern_b,"ax",@progbits
        /*0000*/                   EXIT ;
\t.section\t.nv.shared.kern_a,"aw",@nobits
        /*0000*/                   NOT_AN_INSTRUCTION ;
"""


def test_parse_synthetic_sass() -> None:
    functions = sass.parse_sass(_SYNTHETIC)
    assert list(functions) == ["kern_a", "kern_b"] and functions["kern_b"] == ["EXIT"]
    assert sass.mnemonic(functions["kern_a"][1]) == "LDG.E.U8"
    k = sass.KernelSass.from_instructions("kern_a", "sm_90a", functions["kern_a"])
    assert k.memory == {
        "LDG.128": 1, "LDG.8": 1, "LDG.64": 1, "LDG.256": 1, "STG.32": 1, "LDS.16": 1, "STS.64": 1,
        "LDSM.16.MT88.4": 1, "STL.128": 1, "LDL.32": 1,
    }  # fmt: skip
    assert k.global_loads() == 4 and k.global_loads(128) == 1 and k.global_stores(32) == 1
    assert k.local_loads == 1 and k.local_stores == 1
    assert k.has_vectorized_shared() and k.has_vectorized_shared(min_bits=128)  # LDSM counts
    assert k.tma == {"UTMALDG.2D": 1, "UTMASTG.2D": 1, "UBLKCP.S.G": 1}
    assert k.tma_loads == 1 and k.tma_stores == 1
    assert k.fp8_conversions == {"F2FP.SATFINITE.E4M3.F32.PACK_AB_MERGE_C": 1}
    assert k.barriers == {
        "SYNCS.PHASECHK.TRANS64.TRYWAIT": 1, "BAR.SYNC.DEFER_BLOCKING": 1, "MEMBAR.ALL.CTA": 1
    }  # fmt: skip
    assert k.instructions == 19 and k.counts["NOP"] == 1
    assert "UTMALDG.2D x1" in k.format() and "opcodes:" in k.format(verbose=True)


# ---- command line ------------------------------------------------------------------------------------


def _fake_registry(monkeypatch: pytest.MonkeyPatch, targets: dict | None) -> None:
    module = types.ModuleType("cute_kernels")
    if targets is not None:
        module.sass_targets = lambda: targets
    monkeypatch.setitem(sys.modules, "cute_kernels", module)


@needs_nvdisasm
def test_cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def broken(arch: str) -> object:
        raise RuntimeError("does not compile")

    _fake_registry(monkeypatch, {"copy": lambda arch: _compile("copy", arch), "broken": broken})
    assert sass.main(["--list"]) == 0
    assert capsys.readouterr().out.split() == ["broken", "copy"]

    assert sass.main(["copy", "--arch", "all", "--dump", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for arch in ARCHS:
        assert f"=== copy [{arch}]" in out
        assert "copy_kernel" in (tmp_path / f"copy_{arch}.sass").read_text()
        assert sass.cubin_arch((tmp_path / f"copy_{arch}.cubin").read_bytes()) == arch
    assert out.count("LDG.128 x") == 2

    assert sass.main(["broken", "--arch", "sm_90a"]) == 1
    assert "does not compile" in capsys.readouterr().err
    assert sass.main(["nope"]) == 2

    _fake_registry(monkeypatch, None)
    assert sass.main(["--list"]) == 2
    assert "sass_targets" in capsys.readouterr().err


@needs_nvdisasm
def test_cli_skips_archs_a_target_does_not_build(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A target whose build carries ``archs`` (an sm_90a-only kernel) is built for those alone."""

    def copy(arch: str) -> object:
        assert arch == "sm_90a", "never asked for another arch"
        return _compile("copy", arch)

    copy.archs = ("sm_90a",)
    _fake_registry(monkeypatch, {"copy": copy})
    assert sass.main(["copy", "--arch", "all", "--hash"]) == 0
    lines = capsys.readouterr().out.split("\n")
    assert [line.split()[:2] for line in lines if line] == [["copy", "sm_90a"]]
    assert sass.main(["copy", "--arch", "sm_100a"]) == 0
    assert "not built" in capsys.readouterr().out


def test_cli_module_entry_point() -> None:
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-m", "cute_utils.sass", "--help"], cwd=root, capture_output=True, text=True
    )
    assert proc.returncode == 0 and "--arch" in proc.stdout
