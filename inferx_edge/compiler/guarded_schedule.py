"""Default schedules that never fail a build: each kernel tries the rules in order, and a rule that
raises on a kernel is skipped for that kernel (recorded) instead of aborting the whole build.

dlight's ``ApplyDefaultSchedule`` lets any rule's exception escape, so one kernel no rule author
foresaw (EfficientNet's squeeze-excite reduction: ``There are some consumers of the cache-write stage
that are not properly inlined``) failed the build of the whole network. Here the next rule gets the
kernel; the last rule of each pipeline is a generic one (dlight's GPU ``Fallback``, the CPU default
schedule), so every kernel ends with a correct schedule and the build record lists which kernels fell
back and why (``schedule_fallbacks``). A schedule whose kernel then fails code generation (a vector
type CUDA has no name for, source NVRTC rejects) is handed on the same way: the build finds the kernel
and compiles again with that rule skipped for it (:func:`skip_rules`).
"""

from __future__ import annotations

import contextlib
import threading

from inferx_edge.compiler.prim_funcs import unscheduled

_local = threading.local()

#: the PrimFunc attribute naming the rule that scheduled a kernel (kernel profiles report it)
SCHEDULE_RULE_ATTR = "inferx.schedule_rule"


def schedule_rule(func) -> str | None:
    """The rule that scheduled ``func`` (:data:`SCHEDULE_RULE_ATTR`), None for a kernel no default rule
    took (tuned, hand-scheduled, left as is)."""
    rule = func.attrs.get(SCHEDULE_RULE_ATTR) if func.attrs is not None else None
    return str(rule) if rule is not None else None


class FallbackLog:
    """Collects the fallbacks of one compilation: ``with FallbackLog() as log: ...; log.entries``."""

    def __init__(self) -> None:
        self.entries: list[dict[str, str]] = []

    def __enter__(self) -> FallbackLog:
        self._prev = getattr(_local, "log", None)
        _local.log = self
        return self

    def __exit__(self, *exc) -> None:
        _local.log = self._prev


@contextlib.contextmanager
def skip_rules(skipped: dict[str, set[str]]):
    """Within the block, each kernel named in ``skipped`` (kernel name -> rule names) is not offered to
    those rules: the next rule schedules it."""
    prev = getattr(_local, "skip", None)
    _local.skip = skipped
    try:
        yield
    finally:
        _local.skip = prev


def _record(kernel: str, rule: str, exc: BaseException) -> None:
    log = getattr(_local, "log", None)
    msg = str(exc).strip().splitlines()
    entry = {"kernel": kernel, "rule": rule, "error": f"{type(exc).__name__}: {msg[-1] if msg else ''}"[:300]}
    if log is not None:
        log.entries.append(entry)


def _rule_name(rule) -> str:
    return getattr(rule, "name", None) or type(rule).__name__


def guarded_default_schedule(*rules):
    """A module pass like dlight's ``ApplyDefaultSchedule(*rules)`` where a rule raising on a kernel
    passes the kernel to the next rule. A kernel every rule refuses stays unscheduled (the CPU
    codegen runs it as is; for GPUs the last rule is dlight's ``Fallback``, which accepts any kernel)."""
    import tvm
    from tvm import s_tir

    rules = list(rules)

    @tvm.transform.module_pass(opt_level=0, name="GuardedDefaultSchedule")
    def _pass(mod, _ctx):
        updated = {}
        for gv, func in mod.functions_items():
            if not unscheduled(func):
                continue
            target = func.attrs.get("target") or tvm.target.Target.current(allow_none=False)
            skipped = (getattr(_local, "skip", None) or {}).get(gv.name_hint, ())
            for rule in rules:
                if _rule_name(rule) in skipped:
                    continue
                try:
                    space = rule.apply(func, target, False)
                except Exception as exc:  # noqa: BLE001 - any rule failure: the next rule gets the kernel
                    _record(gv.name_hint, _rule_name(rule), exc)
                    continue
                if space is None:
                    continue
                sch = space if isinstance(space, s_tir.Schedule) else space[0]
                func = sch.mod["main"].with_attr("tirx.is_scheduled", True)
                updated[gv] = func.with_attr(SCHEDULE_RULE_ATTR, _rule_name(rule))
                break
        for gv, func in updated.items():
            mod[gv] = func
        return mod

    return _pass
