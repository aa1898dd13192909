"""Kernels that no public op runs: kept compiling (CI checks their SASS) and benchmarked by their
tuners, as candidates (``quantize_tma``: the TMA-load path, a Blackwell candidate; notes/quantize-tma.md)."""
