"""Numbers both sides of the torch/kernel line use, defined once (pure Python: no torch, no DSL).

The MX format's block, the blocked scale layout's tile, and the group limits of the kernels' in-kernel
scans. The bindings, the reference and the kernels import them from here.
"""

#: Elements per MX scale block (SPEC section 2): 1x32 along K, 32x1 along M.
BLOCK_SIZE = 32
#: The blocked (tcgen05) scale layout's tile: 128 rows x 4 scale columns, 512 bytes (SPEC section 3).
TILE_ROWS = 128
TILE_COLS = 4
#: Most groups a kernel's group scan holds (shared-memory prefix arrays of MAX_GROUPS + 1 words).
MAX_GROUPS = 2048
#: Group count up to which the 1x32 M-groups kernel uses its variant with small scan arrays.
SMALL_GROUPS = 64
