"""Torch-free helpers for developing CuTeDSL kernels (SASS inspection, ...)."""
