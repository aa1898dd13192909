"""Writing the tuners' per-device table (``cute_kernels/configs/tuned.json``; its format:
``cute_kernels.configs``)."""

from __future__ import annotations

import json
from pathlib import Path


def merge_tuned(path: Path, kernel: str, arch: str, device: str, entries: dict[str, dict]) -> None:
    """Merge ``entries`` (``{shape class: config fields}``) into ``path`` under ``kernel``, ``arch``
    and ``device`` (``torch.cuda.get_device_name()``); other entries are kept."""
    table = json.loads(path.read_text()) if path.exists() else {}
    table.setdefault(kernel, {}).setdefault(arch, {}).setdefault(device, {}).update(entries)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    partial.replace(path)  # atomic: a reader sees the old table or the new one
    print(f"wrote {len(entries)} {kernel} entries for {device} ({arch}) into {path}")
