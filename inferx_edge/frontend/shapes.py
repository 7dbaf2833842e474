"""``--input-shape name:1x3x224x224`` parsing and the rules for pinning dynamic dimensions."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Sequence

from inferx_edge.errors import ModelError, UsageError

Dim = int | str | None  # int: fixed; str or None: dynamic (named or anonymous)
#: TVM indexes with int32 in places; a dimension or tensor past these cannot be compiled sensibly
MAX_DIM = 2**31 - 1
MAX_ELEMENTS = 2**40


def parse_input_shapes(specs: Iterable[str] | None) -> dict[str, tuple[int, ...]]:
    """Parse ``["image:1x3x224x224", ...]``; a name may itself contain ':' (the last one splits)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs or ():
        name, sep, dims = spec.rpartition(":")
        try:
            shape = tuple(int(d) for d in dims.lower().split("x"))
        except ValueError:
            shape = ()
        if not sep or not name or not shape or any(d <= 0 for d in shape):
            raise UsageError(
                f"malformed --input-shape '{spec}': expected NAME:D1xD2x... with positive integers, "
                f"e.g. image:1x3x224x224"
            )
        if any(d > MAX_DIM for d in shape) or math.prod(shape) > MAX_ELEMENTS:
            raise UsageError(
                f"--input-shape '{spec}' is absurdly large ({math.prod(shape):,} elements; at most {MAX_DIM:,} "
                f"per dimension and {MAX_ELEMENTS:,} in all)"
            )
        if name in shapes:
            raise UsageError(f"--input-shape given twice for input '{name}'")
        shapes[name] = shape
    return shapes


def resolve_shapes(
    declared: Sequence[tuple[str, Sequence[Dim]]], overrides: dict[str, tuple[int, ...]]
) -> dict[str, tuple[int, ...]]:
    """Fix every input's shape from the model's declaration and the user's overrides.

    An override must name a real input, keep its rank, and agree with its fixed dimensions. A named
    dynamic dimension pinned in one input takes that size in every input that shares the name (the
    batch of several inputs, say). A dynamic leading (batch) dimension left unpinned becomes 1, and we
    say so; any other unpinned dynamic dimension is an error, since no default would be right for it.
    """
    names = [n for n, _ in declared]
    unknown = sorted(set(overrides) - set(names))
    if unknown:
        raise UsageError(f"--input-shape names unknown input(s) {unknown}; the model's inputs are {names}")
    resolved = {}
    symbols: dict[str, int] = {}
    for name, dims in declared:
        for d, s in zip(dims, overrides.get(name, ())):
            if isinstance(d, str) and symbols.setdefault(d, s) != s:
                raise UsageError(f"--input-shape gives the shared dimension '{d}' two sizes ({symbols[d]} and {s})")
    for name, dims in declared:
        if name in overrides:
            shape = overrides[name]
            if len(shape) != len(dims):
                raise UsageError(
                    f"--input-shape {name}: model input has rank {len(dims)} ({_fmt(dims)}), got {len(shape)} dims"
                )
            for i, (d, s) in enumerate(zip(dims, shape)):
                if isinstance(d, int) and d != s:
                    raise UsageError(
                        f"--input-shape {name}: dimension {i} is fixed to {d} in the model ({_fmt(dims)}), got {s}"
                    )
            resolved[name] = tuple(shape)
            continue
        dims = [symbols.get(d, d) if isinstance(d, str) else d for d in dims]
        dynamic = [i for i, d in enumerate(dims) if not isinstance(d, int)]
        if [i for i in dynamic if i != 0]:
            raise ModelError(
                f"input '{name}' has dynamic dimensions {_fmt(dims)}; pin them with "
                f"--input-shape {name}:{'x'.join(str(d) if isinstance(d, int) else 'N' for d in dims)}"
            )
        if dynamic:
            print(
                f"note: input '{name}' has a dynamic batch dimension ({_fmt(dims)}); building batch 1 "
                f"(choose another with --input-shape {name}:{'x'.join(['B'] + [str(d) for d in dims[1:]])})",
                file=sys.stderr,
            )
        resolved[name] = tuple(1 if not isinstance(d, int) else d for d in dims)
    return resolved


def _fmt(dims: Sequence[Dim]) -> str:
    return "x".join(str(d) if isinstance(d, int) else (d or "?") for d in dims)
