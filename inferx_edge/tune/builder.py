"""A MetaSchedule builder that works on small machines.

TVM 0.27's ``LocalBuilder`` starts a new process pool for every batch and its default build function
imports ``tvm.s_tir.tensor_intrin`` in each fresh worker (~60 s on 2 cores) against a 30 s timeout:
out of the box every candidate fails. Candidates reaching the builder are already scheduled and
tensorized, so the build needs no intrinsics. :class:`PersistentBuilder` keeps one pool for the whole
session (workers recycled every ``max_uses`` builds against TVM's known pool leak) and uses
:func:`lean_build`. Libraries are exported as shared objects, cross-linked for aarch64 targets, so an
RPC device loads them without a compiler.
"""

from __future__ import annotations

import os
import tempfile

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.builder import BuilderInput, BuilderResult, PyBuilder
from tvm.support.popen_pool import PopenPoolExecutor, StatusKind


def _build_worker(mod, target, cross_compiler: str | None) -> str:
    """Runs in a pool worker: compile one scheduled candidate and export it as a shared library."""
    import tvm
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    from inferx_edge.compiler.tvm_ops import tvm_op_fixes

    tvm_op_fixes()  # as the build will compile it
    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return export_candidate(tvm.compile(mod, target=target), "inferx_ms_", cross_compiler)


def export_candidate(lib, prefix: str, cross_compiler: str | None) -> str:
    """Export a compiled candidate as a shared library in a new temporary folder (linked with
    ``cross_compiler`` for another architecture); returns its path."""
    path = os.path.join(tempfile.mkdtemp(prefix=prefix), "candidate.so")
    if cross_compiler:
        from tvm.support import cc

        lib.export_library(path, fcompile=cc.cross_compiler(cross_compiler))
    else:
        lib.export_library(path)
    return path


@derived_object
class PersistentBuilder(PyBuilder):
    """Builds candidates in one long-lived pool of worker processes."""

    def __init__(
        self,
        max_workers: int | None = None,
        timeout_sec: float = 60.0,
        cross_compiler: str | None = None,
        max_uses: int = 256,
    ) -> None:
        super().__init__()
        self.max_workers = max_workers or max(1, (os.cpu_count() or 2))
        self.timeout_sec = timeout_sec
        self.cross_compiler = cross_compiler
        self.pool = PopenPoolExecutor(max_workers=self.max_workers, timeout=timeout_sec, maximum_process_uses=max_uses)

    def build(self, build_inputs: list[BuilderInput]) -> list[BuilderResult]:
        results = []
        args = [(b.mod, b.target, self.cross_compiler) for b in build_inputs]
        for r in self.pool.map_with_error_catching(lambda a: _build_worker(*a), args):
            if r.status == StatusKind.COMPLETE:
                results.append(BuilderResult(r.value, None))
            elif r.status == StatusKind.TIMEOUT:
                results.append(BuilderResult(None, f"build timed out after {self.timeout_sec} s"))
            else:
                results.append(BuilderResult(None, f"build failed: {r.value}"))
        return results

    def shutdown(self) -> None:
        self.pool.shutdown()
