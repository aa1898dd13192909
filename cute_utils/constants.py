"""Numbers both sides of the torch/kernel line use, defined once (pure Python: no torch, no DSL).

The MX format's block, the blocked scale layout's tile, and the group limits of the kernels' in-kernel
scans. The bindings, the reference and the kernels import them from here.
"""

import struct

#: Elements per MX scale block (SPEC section 2): 1x32 along K, 32x1 along M.
BLOCK_SIZE = 32
#: FP8 rowwise (SPEC section 7): the AND mask that rounds an fp32 scale down to a power of 2 (its
#: mantissa cleared; 0xFF800000 as an int32).
FP8_POW2_MASK = -(1 << 23)
#: The blocked (tcgen05) scale layout's tile: 128 rows x 4 scale columns, 512 bytes (SPEC section 3).
TILE_ROWS = 128
TILE_COLS = 4
#: Most groups a kernel's group scan holds (shared-memory prefix arrays of MAX_GROUPS + 1 words).
MAX_GROUPS = 2048
#: Group count up to which the 1x32 M-groups kernel uses its variant with small scan arrays.
SMALL_GROUPS = 64
#: dtypes (torch names) the pad / unpad kernels are compiled for as they are; any other dtype of 1,
#: 2, 4 or 8 bytes runs as the integer carrier of its size (uint8, int16, int32, int64).
PAD_KERNEL_DTYPES = (
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "bfloat16",
    "float16",
    "float32",
    "float64",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e8m0fnu",
)
#: The swizzle's 128-column window is taken for grouped scales of more than 64 columns and at most
#: this many bytes (notes/swizzle-grouped-window-and-prefetch.md).
SWIZZLE_WIDE_MAX_BYTES = 64 << 20
#: (dtype, vector bytes) pairs the row-scatter kernel is compiled for (the EP bindings launch
#: these): E4M3 rows, E8M0 scale rows (16 B when D % 512 == 0, else 4 B), bf16 rows, and 4-byte
#: words (the int32 row tags, fp32 scales moved as their bits).
SCATTER_VARIANTS = (
    ("float8_e4m3fn", 16),
    ("float8_e8m0fnu", 16),
    ("float8_e8m0fnu", 4),
    ("bfloat16", 16),
    ("bfloat16", 4),
    ("int32", 4),
)
#: (dtype, vector bytes) pairs the EP zero fill (``cute_kernels.ep_route``) is compiled for: the row
#: buffer of every dispatch (``torch_bindings.ep_send.buffer_specs``), E4M3 or bf16 rows of whole
#: 16-byte vectors; the scale rows and tags go with it as 4-byte words.
EP_FILL_VARIANTS = (
    ("float8_e4m3fn", 16),
    ("bfloat16", 16),
)
#: The EP layout kernel's ``mode`` bits (``cute_kernels.ep_route``): keep a slot's fill end in its
#: state (``state[0]``, the previous end to ``state[1]``), check every rank's ticket into
#: ``state[2]``, overwrite the tickets once read (a slot a CUDA graph captured).
LAYOUT_TRACK = 1
LAYOUT_CHECK = 2
LAYOUT_RESET = 4
#: Most experts E the EP routing kernels take (``cute_kernels.ep_route``: shared-memory tables of
#: this many int32 words); ``torch_bindings.ep`` runs its PyTorch routing for more.
EP_MAX_EXPERTS = 1024

# --- SwiGLU in exact fp32 operations (torch_bindings.reference; kernels: cute_utils/swiglu_math.py) ---
#: |g| is clamped to this before exp(-|g|): past it silu(g < 0) rounds to -0 and exp(-|g|) is
#: below every fp32 that can change 1 + e, so the clamp changes no result.
SWIGLU_CLAMP = 112.0
#: fp32 bit patterns: log2(e), ln(2) split Cody-Waite style (LN2_HI has 15 significant bits, so
#: n * LN2_HI is exact for |n| <= 256), and the degree-6 polynomial p(r) = 1 + r + c2 r^2 + ... +
#: c6 r^6 ~ exp(r) on |r| <= ln(2) / 2 (c2..c6; a relative-error minimax fit, 0.05 fp32 ulp).
SWIGLU_LOG2E_BITS = 0x3FB8AA3B
SWIGLU_LN2_HI_BITS = 0x3F317200
SWIGLU_LN2_LO_BITS = 0x35BFBE8E
SWIGLU_EXP_COEFF_BITS = (0x3EFFFFFE, 0x3E2AAA49, 0x3D2AAC79, 0x3C091CF0, 0x3AB51218)
#: The one bf16 NaN the SwiGLU ops write (any NaN result; PyTorch's CPU and CUDA conversions differ).
SWIGLU_BF16_NAN_BITS = 0x7FC0
#: The SwiGLU kernels read silu(g) and silu'(g) of the common gates from a table (the contract
#: sequence's fp32 results, built by the bindings from the reference): the bf16 gates whose magnitude
#: bits lie in [SILU_TABLE_FIRST, SILU_TABLE_END), |g| in [2^-25, 2^7), both signs; closed forms
#: hold below and above it (cute_utils/swiglu_math.py). The span is 4096 magnitudes, so a gate's
#: entry is its magnitude bits mod 4096. Table layout: ``[fn][sign][bits % SILU_TABLE_SPAN]``, fn 0
#: silu, 1 silu', sign 1 for negative g.
SILU_TABLE_FIRST = 0x3300
SILU_TABLE_END = 0x4300
SILU_TABLE_SPAN = SILU_TABLE_END - SILU_TABLE_FIRST  # gates per sign
assert SILU_TABLE_SPAN == 1 << 12  # the entry is the magnitude's low 12 bits
SILU_TABLE_FN = 2 * SILU_TABLE_SPAN  # entries per function


def f32_of_bits(bits: int) -> float:
    """The fp32 value whose bit pattern is ``bits`` (a Python float: exact)."""
    return struct.unpack("<f", struct.pack("<I", bits))[0]
