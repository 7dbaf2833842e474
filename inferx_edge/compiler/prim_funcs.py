"""Which TIR kernels already carry a schedule: TVM marks a scheduled PrimFunc with the
``tirx.is_scheduled`` attribute (a tuned kernel, or one written by hand such as the fused attention and
the LLM kernels); schedule rules and tuners leave those alone."""

from __future__ import annotations


def is_scheduled(func) -> bool:
    """Whether ``func`` is a PrimFunc whose ``tirx.is_scheduled`` attribute is set (and true)."""
    from tvm import tirx

    attrs = func.attrs if isinstance(func, tirx.PrimFunc) else None
    return attrs is not None and "tirx.is_scheduled" in attrs and bool(int(attrs["tirx.is_scheduled"]))


def unscheduled(func) -> bool:
    """Whether ``func`` is a PrimFunc still to be scheduled (not a Relax function, not :func:`is_scheduled`)."""
    from tvm import tirx

    return isinstance(func, tirx.PrimFunc) and not is_scheduled(func)
