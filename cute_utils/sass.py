"""SASS inspection for CuTeDSL kernels, without a GPU.

Compile a kernel for a target architecture with :func:`compile_options` (it keeps the cubin), take the
cubin with :func:`cubin_of`, then

* :func:`disassemble` gives the SASS text (``nvdisasm -c``),
* :func:`resource_usage` reads registers / static shared memory / local memory from the cubin's ELF,
* :func:`summarize` gives one :class:`KernelSass` per function: resources plus instruction counts
  (vector widths of global/shared accesses, local-memory traffic, TMA, FP8 conversions, barriers).

Example::

    import cutlass.cute as cute
    from cute_utils import sass

    compiled = cute.compile(host_fn, *fake_args, options=sass.compile_options("sm_90a"))
    for k in sass.summarize(sass.cubin_of(compiled)):
        print(k.format())

Command line (the kernels come from ``cute_kernels.sass_targets()``, see :func:`main`)::

    python -m cute_utils.sass --list
    python -m cute_utils.sass KERNEL [KERNEL ...] --arch sm_90a|sm_100a|all [--dump DIR] [-v]

Only the Python standard library is used here (no torch, no cutlass import): the ELF is parsed with
:mod:`struct` and the disassembler is the ``nvidia-cuda-nvdisasm`` wheel's ``nvdisasm``.
"""

from __future__ import annotations

import argparse
import atexit
import fnmatch
import hashlib
import importlib.metadata
import importlib.util
import os
import re
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile
import traceback
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ARCHS",
    "NVDISASM_ENV",
    "KernelSass",
    "compile_options",
    "cubin_arch",
    "cubin_of",
    "disassemble",
    "find_nvdisasm",
    "main",
    "memory_access",
    "mnemonic",
    "parse_sass",
    "resource_usage",
    "summarize",
]

#: The architectures this project targets; ``--arch all`` means these.
ARCHS: tuple[str, ...] = ("sm_90a", "sm_100a")
#: Environment variable naming an nvdisasm binary; it takes precedence over every other location.
NVDISASM_ENV = "CUTE_KERNELS_NVDISASM"

_ARCH_RE = re.compile(r"sm_\d{2,3}[af]?")

# --------------------------------------------------------------------------------------------------
# nvdisasm
# --------------------------------------------------------------------------------------------------

_NVDISASM_NAMES = ("nvdisasm.exe", "nvdisasm") if os.name == "nt" else ("nvdisasm",)
_NVDISASM_DISTS = ("nvidia-cuda-nvdisasm", "nvidia-cuda-nvdisasm-cu13", "nvidia-cuda-nvdisasm-cu12")


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _wheel_nvdisasm_candidates() -> Iterable[Path]:
    """nvdisasm binaries installed by the ``nvidia-cuda-nvdisasm`` wheels (no package is imported)."""
    for dist_name in _NVDISASM_DISTS:
        try:
            dist = importlib.metadata.distribution(dist_name)
        except importlib.metadata.PackageNotFoundError:
            continue
        for f in dist.files or ():
            if f.name in _NVDISASM_NAMES and f.parent.name == "bin":
                yield Path(str(dist.locate_file(f)))
    # Wheels whose metadata is missing: look inside the `nvidia` namespace package directly
    # (find_spec on a namespace package executes no code).
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        # e.g. nvidia/cu13/bin/nvdisasm (CUDA 13 wheels), nvidia/cuda_nvdisasm/bin/nvdisasm (CUDA 12)
        for name in _NVDISASM_NAMES:
            yield from sorted(Path(root).glob(f"*/bin/{name}"), reverse=True)


def find_nvdisasm() -> str:
    """Return the path of an ``nvdisasm`` executable.

    Looked up in order: the ``CUTE_KERNELS_NVDISASM`` environment variable (an error if it does not
    name an executable), the ``nvidia-cuda-nvdisasm`` wheel, ``PATH``, ``$CUDA_HOME/bin``.

    :raises RuntimeError: if none is found.
    """
    override = os.environ.get(NVDISASM_ENV)
    if override:
        path = Path(override).expanduser()
        if _is_executable(path):
            return str(path)
        raise RuntimeError(f"{NVDISASM_ENV}={override!r} does not name an executable nvdisasm")
    for path in _wheel_nvdisasm_candidates():
        if _is_executable(path):
            return str(path)
    on_path = shutil.which("nvdisasm")
    if on_path:
        return on_path
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        for name in _NVDISASM_NAMES if root else ():
            path = Path(root) / "bin" / name
            if _is_executable(path):
                return str(path)
    raise RuntimeError(
        "nvdisasm not found. Install it with `pip install nvidia-cuda-nvdisasm` "
        "(or the extra: `pip install 'cute-kernels[sass]'`), put nvdisasm on PATH, "
        f"or set {NVDISASM_ENV}=/path/to/nvdisasm."
    )


def disassemble(cubin: bytes, extra_args: Sequence[str] = ()) -> str:
    """Disassemble a cubin with ``nvdisasm -c`` (code sections only) and return the SASS text.

    ``extra_args`` are passed to nvdisasm as well (e.g. ``("-g",)`` for line info when the kernel
    was compiled with line info, ``("-plr",)`` for register live ranges).
    """
    _check_elf(cubin)
    nvdisasm = find_nvdisasm()
    with tempfile.TemporaryDirectory(prefix="cute_sass_") as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        proc = subprocess.run(
            [nvdisasm, "-c", *extra_args, str(path)], capture_output=True, text=True, check=False
        )
    if proc.returncode != 0:
        raise RuntimeError(f"nvdisasm failed with exit code {proc.returncode}:\n{proc.stderr.strip()}")
    # stderr may carry harmless warnings (sm_90 cubins: "Disassembling Std Elf to Old format ...").
    return proc.stdout


# --------------------------------------------------------------------------------------------------
# Compiling with the cubin kept
# --------------------------------------------------------------------------------------------------

_dump_root: str | None = None


def _new_dump_dir() -> str:
    """A fresh directory for one compile's artifacts, under a per-process root removed at exit."""
    global _dump_root
    if _dump_root is None or not os.path.isdir(_dump_root):
        _dump_root = tempfile.mkdtemp(prefix="cute_kernels_sass_")
        atexit.register(shutil.rmtree, _dump_root, ignore_errors=True)
    return tempfile.mkdtemp(dir=_dump_root)


def _check_arch(arch: str) -> str:
    if not _ARCH_RE.fullmatch(arch):
        raise ValueError(f"arch must look like 'sm_90a' or 'sm_100a', got {arch!r}")
    return arch


def compile_options(arch: str, extra: str = "") -> str:
    """``cute.compile`` options that target ``arch`` and keep the cubin (read it with :func:`cubin_of`).

    Returns ``"--gpu-arch <arch> --keep-cubin --dump-dir=<fresh temp dir>"`` followed by ``extra``
    (for example ``"--enable-tvm-ffi"``). The DSL writes the cubin into the dump directory and reads it
    back into ``compiled.__cubin__`` when ``cute.compile`` returns; each call makes a new directory
    (inside one per-process temporary folder deleted at exit), so nothing lands in the working
    directory and a stale cubin from an earlier compile can never be picked up. Keeping the cubin
    also turns the DSL's in-memory compile cache off for that compile.

    Call it once per ``cute.compile``; ``--gpu-arch`` overrides ``CUTE_DSL_ARCH``, so one process can
    compile for several architectures.
    """
    dump_dir = _new_dump_dir()
    opts = f"--gpu-arch {_check_arch(arch)} --keep-cubin --dump-dir={shlex.quote(dump_dir)}"
    return f"{opts} {extra.strip()}".strip()


def cubin_of(compiled: object) -> bytes:
    """The cubin of a ``cute.compile`` result compiled with :func:`compile_options` options.

    :raises RuntimeError: if the result carries no cubin (compiled without ``--keep-cubin``, or the
        DSL did not write the file: it then leaves the would-be path in ``__cubin__``).
    """
    cubin = getattr(compiled, "__cubin__", None)
    if isinstance(cubin, (bytes, bytearray, memoryview)):
        data = bytes(cubin)
        _check_elf(data)
        return data
    if isinstance(cubin, str):
        raise RuntimeError(
            f"cute.compile did not produce the cubin file {cubin!r} (its dump directory must exist; "
            "use options=compile_options(arch)); the compiled object holds only that path"
        )
    raise RuntimeError(
        f"{type(compiled).__name__} carries no cubin: compile with "
        "cute.compile(..., options=cute_utils.sass.compile_options(arch))"
    )


# --------------------------------------------------------------------------------------------------
# ELF (cubin) parsing
# --------------------------------------------------------------------------------------------------

_SHT_SYMTAB = 2
_SHT_CUDA_INFO = 0x70000000
_STT_FUNC = 2
_STO_CUDA_ENTRY = 0x10

# .nv.info attribute formats and the attribute ids used here (names as nvdisasm prints them).
_EIFMT_NVAL, _EIFMT_BVAL, _EIFMT_HVAL, _EIFMT_SVAL = 1, 2, 3, 4
_EIATTR_REQNTID = 0x10
_EIATTR_FRAME_SIZE = 0x11
_EIATTR_MIN_STACK_SIZE = 0x12
_EIATTR_MAXREG_COUNT = 0x1B
_EIATTR_REGCOUNT = 0x2F
_EIATTR_NUM_BARRIERS = 0x4C

# Shared memory that the driver reserves at the start of every CTA's window on sm_90+; ptxas places
# it at the start of the .nv.shared.<kernel> section (a kernel's own static buffers start at 0x400).
_RESERVED_SMEM_SM90 = 1024


@dataclass(frozen=True)
class _Section:
    name: str
    type: int
    flags: int
    offset: int
    size: int
    link: int
    info: int


@dataclass(frozen=True)
class _Symbol:
    name: str
    info: int
    other: int
    shndx: int
    value: int
    size: int


def _check_elf(data: bytes) -> None:
    if not isinstance(data, (bytes, bytearray)) or data[:4] != b"\x7fELF":
        raise ValueError("not a cubin: missing ELF magic")
    if data[4] != 2 or data[5] != 1:
        raise ValueError("unsupported cubin: expected a 64-bit little-endian ELF")


class _Elf:
    """The few parts of a CUDA ELF (cubin) that resource accounting needs."""

    def __init__(self, data: bytes) -> None:
        _check_elf(data)
        self.data = data
        self.abi_version = data[8]
        (_, _, _, _, _, shoff, self.flags, _, _, _, shentsize, shnum, shstrndx) = struct.unpack_from(
            "<HHIQQQIHHHHHH", data, 16
        )
        raw = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
        names_off = raw[shstrndx][4]
        self.sections = [
            _Section(self._cstr(names_off + r[0]), r[1], r[2], r[4], r[5], r[6], r[7]) for r in raw
        ]
        self.symbols: list[_Symbol] = []
        for sec in self.sections:
            if sec.type == _SHT_SYMTAB:
                str_off = self.sections[sec.link].offset
                for j in range(sec.size // 24):
                    name, info, other, shndx, value, size = struct.unpack_from(
                        "<IBBHQQ", data, sec.offset + 24 * j
                    )
                    self.symbols.append(_Symbol(self._cstr(str_off + name), info, other, shndx, value, size))
                break

    def _cstr(self, off: int) -> str:
        end = self.data.index(b"\0", off)
        return self.data[off:end].decode("utf-8", "replace")

    def section(self, name: str) -> _Section | None:
        for sec in self.sections:
            if sec.name == name:
                return sec
        return None

    def sm(self) -> tuple[int, bool]:
        """(SM number, arch-specific 'a' feature set) from e_flags."""
        if self.abi_version >= 8:  # CUDA ELF ABI v8 (CUDA 13 toolchain, sm_100+): SM in bits 8..15
            return (self.flags >> 8) & 0xFF, bool(self.flags & 0x8)
        return self.flags & 0xFF, bool(self.flags & 0x800)  # EF_CUDA_SM<n>, EF_CUDA_ACCELERATORS

    def nv_info(self, sec: _Section) -> list[tuple[int, bytes]]:
        """(attribute id, payload) entries of a ``.nv.info*`` section."""
        out = []
        pos, end = sec.offset, sec.offset + sec.size
        while pos + 4 <= end:
            fmt, attr = self.data[pos], self.data[pos + 1]
            if fmt == _EIFMT_SVAL:
                (size,) = struct.unpack_from("<H", self.data, pos + 2)
                out.append((attr, self.data[pos + 4 : pos + 4 + size]))
                pos += 4 + size
                pos = sec.offset + ((pos - sec.offset + 3) & ~3)
            elif fmt in (_EIFMT_HVAL, _EIFMT_BVAL, _EIFMT_NVAL):
                out.append((attr, self.data[pos + 2 : pos + 4]))
                pos += 4
            else:  # unknown format: stop rather than misparse
                break
        return out


def cubin_arch(cubin: bytes) -> str:
    """The target architecture recorded in a cubin's ELF header, e.g. ``"sm_90a"`` or ``"sm_100a"``.

    The ELF does not distinguish the family-specific ``f`` targets: a ``sm_100f`` cubin reads as
    ``sm_100``.
    """
    sm, arch_specific = _Elf(cubin).sm()
    return f"sm_{sm}{'a' if arch_specific else ''}"


def _u32(payload: bytes, index: int = 0) -> int:
    return struct.unpack_from("<I", payload, 4 * index)[0]


def resource_usage(cubin: bytes) -> dict[str, dict[str, Any]]:
    """Per-function resources read from the cubin's ELF (the numbers ``ptxas -v`` prints).

    Returns ``{function_name: {...}}`` with the keys

    * ``registers``: registers per thread (``EIATTR_REGCOUNT`` in ``.nv.info``);
    * ``shared_bytes``: static shared memory declared by the kernel (``.nv.shared.<fn>`` size minus
      the 1 KiB that sm_90+ reserves at its start); the shared memory of ``SmemAllocator`` /
      ``cute.struct`` storage is *dynamic* (sized at launch) and is not included;
    * ``shared_section_bytes``: the raw ``.nv.shared.<fn>`` size, reserved part included;
    * ``local_bytes``: per-thread stack frame, i.e. local memory for spills and addressable arrays
      (``EIATTR_FRAME_SIZE``; ``.nv.local.<fn>`` size if larger);
    * ``min_stack_bytes``: ``EIATTR_MIN_STACK_SIZE`` (includes callees);
    * ``max_registers``: register cap the kernel was compiled with (255: none);
    * ``named_barriers``: hardware named barriers used;
    * ``threads``: ``(x, y, z)`` block size required by the kernel (``.reqntid``), or ``None``;
    * ``entry``: whether the function is a kernel entry point (else a non-inlined device function).
    """
    elf = _Elf(cubin)
    sm, _ = elf.sm()
    sym_index: dict[str, int] = {}
    for i, sym in enumerate(elf.symbols):
        if sym.info & 0xF == _STT_FUNC:
            sym_index.setdefault(sym.name, i)

    # Global .nv.info: per-function attributes keyed by the function's symbol index.
    per_symbol: dict[int, dict[int, int]] = {}
    for sec in elf.sections:
        if sec.type == _SHT_CUDA_INFO and sec.name == ".nv.info":
            for attr, payload in elf.nv_info(sec):
                if (
                    attr in (_EIATTR_REGCOUNT, _EIATTR_FRAME_SIZE, _EIATTR_MIN_STACK_SIZE)
                    and len(payload) >= 8
                ):
                    per_symbol.setdefault(_u32(payload, 0), {})[attr] = _u32(payload, 1)

    reserved_cap = next((s.value for s in elf.symbols if s.name == ".nv.reservedSmem.cap"), None)
    result: dict[str, dict[str, Any]] = {}
    for sec in elf.sections:
        if not sec.name.startswith(".text."):
            continue
        name = sec.name[len(".text.") :]
        idx = sym_index.get(name)
        sym = elf.symbols[idx] if idx is not None else None
        glob = per_symbol.get(idx, {}) if idx is not None else {}

        local_attrs: dict[int, bytes] = {}
        info_sec = elf.section(f".nv.info.{name}")
        if info_sec is not None:
            for attr, payload in elf.nv_info(info_sec):
                local_attrs[attr] = payload

        registers = glob.get(_EIATTR_REGCOUNT)
        if registers is None:  # fallback (older toolchains): bits 24..31 of the text section's sh_info;
            # the sm_90a/sm_100a cubins of CUDA 13 keep only the symbol index there (0 = unknown)
            registers = (sec.info >> 24) & 0xFF

        shared_sec = elf.section(f".nv.shared.{name}")
        shared_section = shared_sec.size if shared_sec is not None else 0
        if shared_section:
            reserved = reserved_cap if reserved_cap is not None else (_RESERVED_SMEM_SM90 if sm >= 90 else 0)
            shared = max(0, shared_section - reserved)
        else:
            shared = 0

        local_sec = elf.section(f".nv.local.{name}")
        local = max(glob.get(_EIATTR_FRAME_SIZE, 0), local_sec.size if local_sec is not None else 0)

        if _EIATTR_NUM_BARRIERS in local_attrs:
            barriers = local_attrs[_EIATTR_NUM_BARRIERS][0]
        else:  # ABI v7 (sm_90): barrier count in the text section's flags, bits 20..26
            barriers = (sec.flags >> 20) & 0x7F

        reqntid = local_attrs.get(_EIATTR_REQNTID)
        threads = None
        if reqntid is not None and len(reqntid) >= 12:
            threads = (_u32(reqntid, 0), _u32(reqntid, 1), _u32(reqntid, 2))

        maxreg = local_attrs.get(_EIATTR_MAXREG_COUNT)
        result[name] = {
            "registers": registers,
            "shared_bytes": shared,
            "shared_section_bytes": shared_section,
            "local_bytes": local,
            "min_stack_bytes": glob.get(_EIATTR_MIN_STACK_SIZE, 0),
            "max_registers": struct.unpack_from("<H", maxreg)[0] if maxreg is not None else 255,
            "named_barriers": barriers,
            "threads": threads,
            "entry": bool(sym is not None and sym.other & _STO_CUDA_ENTRY),
        }
    return result


# --------------------------------------------------------------------------------------------------
# SASS text parsing
# --------------------------------------------------------------------------------------------------

_SECTION_RE = re.compile(r"^\s*\.section\s+([^,\s]+)")
_INSTR_RE = re.compile(r"/\*[0-9a-fA-F]+\*/\s+([^;]*?)\s*;")
_PREDICATE_RE = re.compile(r"^@!?U?P[T0-9]+\s+")

# Opcodes whose access width is given by a modifier (no width modifier: 32 bits).
_WIDTH_OPCODES = frozenset({"LDG", "STG", "LDS", "STS", "LDL", "STL", "LD", "ST", "LDGSTS"})
_WIDTH_TOKENS = {
    "U8": 8, "S8": 8, "U16": 16, "S16": 16,
    "8": 8, "16": 16, "32": 32, "64": 64, "128": 128, "256": 256,
}  # fmt: skip
_MATRIX_OPCODES = frozenset({"LDSM", "STSM"})
_FP8_TOKENS = frozenset({"E4M3", "E5M2", "UE8M0", "E8M0", "UE4M3", "E2M1", "E2M3", "E3M2"})
_SYNC_OPCODES = frozenset({"BAR", "SYNCS", "MEMBAR", "WARPSYNC", "FENCE", "ERRBAR", "DEPBAR"})


def parse_sass(sass: str) -> dict[str, list[str]]:
    """Split ``nvdisasm`` output into ``{function_name: [instruction, ...]}``.

    Each instruction is its text without address and ``;``, predicate included
    (e.g. ``"@P0 LDG.E.128 R8, desc[UR4][R2.64]"``).
    """
    functions: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in sass.splitlines():
        m = _SECTION_RE.match(line)
        if m:
            sec = m.group(1)
            current = functions.setdefault(sec[len(".text.") :], []) if sec.startswith(".text.") else None
            continue
        if current is not None:
            m = _INSTR_RE.search(line)
            if m:
                current.append(m.group(1))
    return functions


def instruction_hash(sass: str) -> str:
    """A short sha256 of the instructions of every function in ``sass`` (names, addresses and
    comments left out): equal for builds that differ only in their mangled kernel names."""
    digest = hashlib.sha256()
    for instructions in parse_sass(sass).values():
        digest.update("\n".join(instructions).encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def mnemonic(instruction: str) -> str:
    """Opcode with its modifiers, without predicate and operands: ``"@P0 LDG.E.128 R8, ..."`` ->
    ``"LDG.E.128"``."""
    text = _PREDICATE_RE.sub("", instruction.strip())
    return text.split(None, 1)[0] if text else ""


def memory_access(mnem: str) -> tuple[str, int] | None:
    """``(opcode, bits)`` for LDG/STG/LDS/STS/LDL/STL/LD/ST/LDGSTS mnemonics, else ``None``.

    ``"LDG.E.128"`` -> ``("LDG", 128)``, ``"STS.U8"`` -> ``("STS", 8)``, ``"LDS"`` -> ``("LDS", 32)``.
    """
    parts = mnem.split(".")
    if parts[0] not in _WIDTH_OPCODES:
        return None
    for token in parts[1:]:
        if token in _WIDTH_TOKENS:
            return parts[0], _WIDTH_TOKENS[token]
    return parts[0], 32


@dataclass(frozen=True)
class KernelSass:
    """Resources and instruction mix of one function of a cubin (see :func:`summarize`).

    ``counts`` maps each mnemonic (opcode plus modifiers, e.g. ``"LDG.E.128"``) to its number of
    occurrences in the function's SASS (static counts: a loop body counts once). The other
    dictionaries are views of it:

    * ``memory``: ``"LDG.128"``-style keys (opcode + access bits) for LDG/STG/LDS/STS/LDL/STL/LD/ST/
      LDGSTS, and the full mnemonic for LDSM/STSM (e.g. ``"LDSM.16.M88.4"``);
    * ``tma``: UTMA* / UBLK* instructions (``UTMALDG.2D``, ``UTMASTG.2D``, ``UBLKCP.S.G``, ...);
    * ``fp8_conversions``: ``F2FP`` with an FP8/FP6/FP4/E8M0 format (``F2FP.SATFINITE.E4M3...``);
    * ``barriers``: BAR.*, SYNCS.* (mbarriers), MEMBAR.*, WARPSYNC, FENCE.*, ERRBAR, DEPBAR,
      (U)CGABAR* (cluster barriers).
    """

    name: str
    arch: str
    registers: int
    shared_bytes: int
    local_bytes: int
    instructions: int  # NOPs excluded (alignment padding)
    local_loads: int  # LDL instructions: spill reloads / local array reads
    local_stores: int  # STL instructions
    named_barriers: int = 0
    threads: tuple[int, int, int] | None = None
    entry: bool = True
    counts: dict[str, int] = field(default_factory=dict, hash=False)
    memory: dict[str, int] = field(default_factory=dict, hash=False)
    tma: dict[str, int] = field(default_factory=dict, hash=False)
    fp8_conversions: dict[str, int] = field(default_factory=dict, hash=False)
    barriers: dict[str, int] = field(default_factory=dict, hash=False)

    @classmethod
    def from_instructions(
        cls, name: str, arch: str, instructions: Iterable[str], usage: Mapping[str, Any] | None = None
    ) -> KernelSass:
        """Build a summary from SASS instruction texts and a :func:`resource_usage` entry."""
        counts = Counter(mnemonic(i) for i in instructions)
        counts.pop("", None)
        memory: Counter[str] = Counter()
        tma: Counter[str] = Counter()
        fp8: Counter[str] = Counter()
        barriers: Counter[str] = Counter()
        for mnem, n in counts.items():
            parts = mnem.split(".")
            op = parts[0]
            access = memory_access(mnem)
            if access is not None:
                memory[f"{access[0]}.{access[1]}"] += n
            elif op in _MATRIX_OPCODES:
                memory[mnem] += n
            elif op.startswith(("UTMA", "UBLK")):
                tma[mnem] += n
            elif op == "F2FP" and _FP8_TOKENS.intersection(parts[1:]):
                fp8[mnem] += n
            elif op in _SYNC_OPCODES or "CGABAR" in op:
                barriers[mnem] += n
        usage = usage or {}
        return cls(
            name=name,
            arch=arch,
            registers=int(usage.get("registers", 0)),
            shared_bytes=int(usage.get("shared_bytes", 0)),
            local_bytes=int(usage.get("local_bytes", 0)),
            instructions=sum(n for m, n in counts.items() if m != "NOP"),
            local_loads=sum(n for k, n in memory.items() if k.startswith("LDL.")),
            local_stores=sum(n for k, n in memory.items() if k.startswith("STL.")),
            named_barriers=int(usage.get("named_barriers", 0)),
            threads=usage.get("threads"),
            entry=bool(usage.get("entry", True)),
            counts=dict(counts),
            memory=dict(memory),
            tma=dict(tma),
            fp8_conversions=dict(fp8),
            barriers=dict(barriers),
        )

    # ---- queries -------------------------------------------------------------------------------

    def opcode(self, op: str) -> int:
        """Number of instructions with opcode ``op`` whatever their modifiers (``"BAR"``, ``"HMMA"``)."""
        return sum(n for m, n in self.counts.items() if m.split(".", 1)[0] == op)

    def _access(self, op: str, width: int | None) -> int:
        if width is not None:
            return self.memory.get(f"{op}.{width}", 0)
        return sum(n for k, n in self.memory.items() if k.split(".", 1)[0] == op)

    def global_loads(self, width: int | None = None) -> int:
        """LDG instructions of ``width`` bits (8/16/32/64/128/256), or all of them."""
        return self._access("LDG", width)

    def global_stores(self, width: int | None = None) -> int:
        """STG instructions of ``width`` bits, or all of them."""
        return self._access("STG", width)

    def shared_loads(self, width: int | None = None) -> int:
        """LDS instructions of ``width`` bits, or all of them (LDSM not included)."""
        return self._access("LDS", width)

    def shared_stores(self, width: int | None = None) -> int:
        """STS instructions of ``width`` bits, or all of them (STSM not included)."""
        return self._access("STS", width)

    def has_vectorized_global(self, min_bits: int = 128) -> bool:
        """Whether some LDG or STG moves at least ``min_bits`` per thread."""
        return any(
            n and k.split(".")[0] in ("LDG", "STG") and int(k.split(".")[1]) >= min_bits
            for k, n in self.memory.items()
        )

    def has_vectorized_shared(self, min_bits: int = 64) -> bool:
        """Whether some LDS/STS moves at least ``min_bits`` per thread, or LDSM/STSM is used."""
        for k, n in self.memory.items():
            op = k.split(".")[0]
            if n and (op in _MATRIX_OPCODES or (op in ("LDS", "STS") and int(k.split(".")[1]) >= min_bits)):
                return True
        return False

    @property
    def tma_loads(self) -> int:
        """UTMALDG instructions (TMA tensor loads)."""
        return self.opcode("UTMALDG")

    @property
    def tma_stores(self) -> int:
        """UTMASTG instructions (TMA tensor stores)."""
        return self.opcode("UTMASTG")

    # ---- text ----------------------------------------------------------------------------------

    def format(self, verbose: bool = False) -> str:
        """A compact multi-line summary; ``verbose`` adds every mnemonic's count."""

        def join(items: Mapping[str, int]) -> str:
            return ", ".join(f"{k} x{n}" for k, n in sorted(items.items())) or "-"

        def by_op(prefixes: tuple[str, ...]) -> dict[str, int]:
            return {k: n for k, n in self.memory.items() if k.split(".")[0] in prefixes}

        threads = "x".join(map(str, self.threads)) if self.threads else "?"
        kind = "" if self.entry else " (device function)"
        lines = [
            f"{self.name} [{self.arch}]{kind}",
            f"  resources: {self.registers} regs, {self.shared_bytes} B static smem, "
            f"{self.local_bytes} B local, {self.named_barriers} named barriers, {threads} threads",
            f"  instrs:    {self.instructions} (NOP excluded)",
            f"  global:    {join(by_op(('LDG', 'STG', 'LD', 'ST', 'LDGSTS')))}",
            f"  shared:    {join(by_op(('LDS', 'STS', 'LDSM', 'STSM')))}",
            f"  local:     {join(by_op(('LDL', 'STL')))}",
            f"  tma:       {join(self.tma)}",
            f"  fp8 cvt:   {join(self.fp8_conversions)}",
            f"  sync:      {join(self.barriers)}",
        ]
        if verbose:
            ordered = sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0]))
            lines.append("  opcodes:   " + ", ".join(f"{k} x{n}" for k, n in ordered))
        return "\n".join(lines)


def summarize(cubin: bytes, arch: str | None = None, sass: str | None = None) -> list[KernelSass]:
    """One :class:`KernelSass` per function of ``cubin`` (kernels first, then device functions).

    ``arch`` defaults to the one in the ELF header (:func:`cubin_arch`); ``sass`` to
    ``disassemble(cubin)`` (pass it when you already have it).
    """
    usage = resource_usage(cubin)
    arch = arch or cubin_arch(cubin)
    functions = parse_sass(sass if sass is not None else disassemble(cubin))
    names = list(usage) + [n for n in functions if n not in usage]
    out = [KernelSass.from_instructions(n, arch, functions.get(n, []), usage.get(n)) for n in names]
    return sorted(out, key=lambda k: not k.entry)


# --------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------

Target = Callable[[str], object]


def _load_targets() -> dict[str, Target]:
    try:
        import cute_kernels  # lazy: it may pull in torch and compiles nothing until asked
    except ImportError as exc:
        raise RuntimeError(f"cannot import cute_kernels ({exc}); the SASS targets live there") from exc
    fn = getattr(cute_kernels, "sass_targets", None)
    if not callable(fn):
        raise RuntimeError(
            "cute_kernels.sass_targets() is missing. It must return dict[str, Callable[[str], "
            "compiled]]: target name -> function(arch) returning cute.compile(..., "
            "options=cute_utils.sass.compile_options(arch))"
        )
    targets = fn()
    if not isinstance(targets, Mapping):
        raise RuntimeError(f"cute_kernels.sass_targets() returned {type(targets).__name__}, not a dict")
    return dict(targets)


def _parse_archs(text: str) -> list[str]:
    archs: list[str] = []
    for part in text.split(","):
        part = part.strip()
        for arch in ARCHS if part == "all" else (part,):
            if arch not in archs:
                archs.append(_check_arch(arch))
    return archs


def _safe_filename(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def _match_targets(patterns: Sequence[str], targets: Mapping[str, Any]) -> list[str]:
    """Target names matching each of ``patterns`` (exact names or shell patterns), in pattern order;
    a pattern that matches nothing is returned as is (reported unknown)."""
    names: list[str] = []
    for pattern in patterns:
        matched = sorted(fnmatch.filter(targets, pattern)) or [pattern]
        names.extend(n for n in matched if n not in names)
    return names


def main(argv: Sequence[str] | None = None) -> int:
    """Print SASS summaries of the kernels registered in ``cute_kernels.sass_targets()``.

    The registry contract: ``cute_kernels.sass_targets()`` returns ``dict[str, Callable[[str], obj]]``
    mapping a target name to a function that takes an arch string (``"sm_90a"``) and returns a fresh
    ``cute.compile`` result compiled with ``options=cute_utils.sass.compile_options(arch)`` (extra
    options such as ``--enable-tvm-ffi`` may be appended through its ``extra`` argument). A function
    with an ``archs`` attribute (a tuple of arch strings) is built for those archs alone; the others
    are skipped (and left out of ``--hash``).

    Returns the exit status: 0, 1 if some target failed to compile or disassemble, 2 on usage errors.
    """
    parser = argparse.ArgumentParser(
        prog="python -m cute_utils.sass",
        description="Compile registered CuTeDSL kernels for a GPU architecture (no GPU needed) and "
        "summarize their SASS: registers, shared/local memory, access widths, TMA, FP8 conversions, "
        "barriers.",
    )
    parser.add_argument(
        "kernels",
        nargs="*",
        metavar="KERNEL",
        help="target names or shell patterns ('quantize_dual_*'), or 'all'",
    )
    parser.add_argument("--arch", default="all", help="sm_90a, sm_100a, a comma list, or 'all' (default)")
    parser.add_argument("--dump", metavar="DIR", help="also write DIR/<kernel>_<arch>.sass and .cubin")
    parser.add_argument("--list", action="store_true", help="list the registered targets and exit")
    parser.add_argument("-v", "--verbose", action="store_true", help="also print every opcode's count")
    parser.add_argument(
        "--hash",
        action="store_true",
        help="print one line per kernel and arch: a hash of its instructions (compare builds)",
    )
    args = parser.parse_args(argv)

    try:
        archs = _parse_archs(args.arch)
    except ValueError as exc:
        parser.error(str(exc))

    try:
        targets = _load_targets()
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    if args.list:
        for name in sorted(targets):
            print(name)
        return 0
    if not args.kernels:
        parser.error("name at least one KERNEL, or 'all' (see --list)")
    names = sorted(targets) if "all" in args.kernels else _match_targets(args.kernels, targets)
    unknown = [n for n in names if n not in targets]
    if unknown:
        print(
            f"error: unknown target(s) {', '.join(unknown)}; known: {', '.join(sorted(targets))}",
            file=sys.stderr,
        )
        return 2

    dump_dir = Path(args.dump) if args.dump else None
    if dump_dir is not None:
        dump_dir.mkdir(parents=True, exist_ok=True)

    status = 0
    for name in names:
        for arch in archs:
            if arch not in getattr(targets[name], "archs", (arch,)):
                if not args.hash:
                    print(
                        f"=== {name} [{arch}]: not built (the kernel compiles for "
                        f"{', '.join(targets[name].archs)} only)",
                        flush=True,
                    )
                continue
            if not args.hash:
                print(f"=== {name} [{arch}]", flush=True)
            try:
                cubin = cubin_of(targets[name](arch))
                sass = disassemble(cubin)
                if args.hash:
                    print(f"{name} {arch} {instruction_hash(sass)}", flush=True)
                    continue
                got = cubin_arch(cubin)
                if got != arch and not (arch.endswith("f") and got == arch[:-1]):
                    print(
                        f"warning: {name} was compiled for {got}, not {arch} "
                        "(does the target pass compile_options(arch) to cute.compile?)",
                        file=sys.stderr,
                    )
                for kernel in summarize(cubin, arch=got, sass=sass):
                    print(kernel.format(verbose=args.verbose))
                if dump_dir is not None:
                    stem = f"{_safe_filename(name)}_{arch}"
                    (dump_dir / f"{stem}.sass").write_text(sass)
                    (dump_dir / f"{stem}.cubin").write_bytes(cubin)
                    print(f"  wrote {dump_dir / stem}.sass")
            except Exception as exc:  # keep going with the other targets
                status = 1
                print(f"error: {name} [{arch}]: {type(exc).__name__}: {exc}", file=sys.stderr)
                if args.verbose:
                    traceback.print_exc()
            sys.stdout.flush()
    return status


if __name__ == "__main__":
    sys.exit(main())
