"""Tile records: ``tiles.json`` beside a model's MetaSchedule database, the tensor-core tile measured
best for each group of kernels (``tune --search tiles`` writes it, ``build`` reads it).

The file format (``format`` 1)::

    {"format": 1, "groups": {"<tile key>": {"extents": [i, j, k], "best": "<tile text>",
                                             "kernel_version": 3, "candidates": {...}, ...}}}

A *tile key* names what decides a kernel's best tile: its TIR without its name, parameter names and
float constants (:func:`tile_key`), so convolutions that differ only in quantization scales share one
record. No TVM import here: the compiler and the tuner both read this module.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

from inferx_edge.package.atomic import atomic_write

TILES_FILE = "tiles.json"
#: the name int8-only releases gave the file
LEGACY_TILES_FILE = "int8_tiles.json"
FORMAT = 1
#: version of the kernels the candidates compile to, kept in each group's record (``kernel_version``;
#: none: 1). A group timed with an older version is measured again in full: its timings no longer
#: describe what build compiles. 2: the cp.async pipeline's copies spread over the math steps
#: (the cp.async copy interleaving of :mod:`inferx_edge.compiler.cuda.source_patches`); 3: only where two or more
#: stages are in flight (``async3``, ``async4``)
KERNEL_VERSION = 3


def tile_key(script: str) -> str:
    """A name for what decides a kernel's best tile: its TIR (``func.script()``) without the kernel's
    name, its parameter names and its float constants (16 hex digits)."""
    text = "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("#"))
    sig = re.search(r"def (\w+)\((.*?)\):\n", text, re.S)
    if sig:
        names = [sig.group(1)] + re.findall(r"(\w+): T\.(?:Buffer|handle)", sig.group(2))
        for n, name in enumerate(names):
            text = re.sub(rf"\b{re.escape(name)}\b", f"__p{n}__", text)
    text = re.sub(r"T\.float(16|32|64)\([^()]*\)", r"T.float\1(c)", text)
    text = re.sub(r"(?<![\w.])(?:\d+\.\d*|\d+(?=e[-+]?\d))(?:e[-+]?\d+)?", "c", text)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def load_tiles(work_dir: Path, warn=lambda m: print(f"warning: {m}", file=sys.stderr), repair: bool = True) -> dict:
    """The tile records of a database directory ({} when there are none). A file that does not parse
    is skipped with a warning and, with ``repair`` (the search, under the database lock), moved aside
    to ``tiles.json.corrupt`` (its groups are measured again)."""
    path = _tiles_path(work_dir)
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("groups"), dict):
            raise ValueError(f"not a tile file of format {FORMAT}")
    except ValueError as exc:
        if not repair:
            warn(f"{path}: unreadable ({exc}); ignored, its kernels keep the default tiles")
            return {}
        aside = path.with_name(path.name + ".corrupt")
        path.replace(aside)
        warn(f"{path}: unreadable ({exc}); moved to {aside.name}, its kernels will be measured again")
        return {}
    return data


def _tiles_path(work_dir: Path) -> Path:
    """``tiles.json``, or the legacy ``int8_tiles.json`` when only that exists."""
    path = work_dir / TILES_FILE
    return work_dir / LEGACY_TILES_FILE if not path.exists() and (work_dir / LEGACY_TILES_FILE).exists() else path


def has_tiles(work_dir: Path) -> bool:
    return _tiles_path(work_dir).exists()


def save_tiles(work_dir: Path, data: dict) -> None:
    with atomic_write(work_dir / TILES_FILE, "w") as f:
        f.write(json.dumps(data, indent=1, sort_keys=True) + "\n")
    (work_dir / LEGACY_TILES_FILE).unlink(missing_ok=True)  # its records are in tiles.json now
