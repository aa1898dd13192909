"""Numbers both sides of the torch/kernel line use, defined once (pure Python: no torch, no DSL).

The MX format's block, the blocked scale layout's tile, and the group limits of the kernels' in-kernel
scans. The bindings, the reference and the kernels import them from here.
"""

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
