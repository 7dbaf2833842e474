"""Fixtures of the server tests: a multi-variant artifact of the embedded model (fp32 and int8, batch 1
and 4), a server on a free loopback port in this process, and an Engine wrapper that is slow or fails
on demand (to exercise overload, timeouts and device errors without hardware)."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")


@pytest.fixture(scope="session")
def served_artifact(tmp_path_factory) -> Path:
    from inferx_edge.build import BuildOptions, build_artifact
    from inferx_edge.models import DEFAULT_MODEL
    from inferx_edge.targets import host_target_name

    out = tmp_path_factory.mktemp("serve") / "fm.ixa"
    build_artifact(
        BuildOptions(
            model=DEFAULT_MODEL,
            target=host_target_name(),
            output=out,
            precisions=("fp32", "int8"),
            batch_sizes=(1, 4),
            tuning=False,
        ),
        log=lambda *a: None,
    )
    return out


@pytest.fixture(scope="session")
def fp32_artifact(tmp_path_factory) -> Path:
    """Another build of the same model (fp32 only): a second version for hot reload."""
    from inferx_edge.build import BuildOptions, build_artifact
    from inferx_edge.models import DEFAULT_MODEL
    from inferx_edge.targets import host_target_name

    out = tmp_path_factory.mktemp("serve") / "fm-fp32.ixa"
    build_artifact(
        BuildOptions(model=DEFAULT_MODEL, target=host_target_name(), output=out, batch_sizes=(1, 4), tuning=False),
        log=lambda *a: None,
    )
    return out


def serve_options(**kw):
    from inferx_edge.serve.batcher import BatchOptions
    from inferx_edge.serve.live import GovernorOptions
    from inferx_edge.serve.repository import ServeOptions

    batch = {k: kw.pop(k) for k in list(kw) if k in BatchOptions.__dataclass_fields__}
    gov = {k: kw.pop(k) for k in list(kw) if k in GovernorOptions.__dataclass_fields__}
    gov.setdefault("probe_s", 0.05)
    return ServeOptions(
        batch=BatchOptions(**batch), governor=GovernorOptions(**gov), telemetry=kw.pop("telemetry", "none"), **kw
    )


@contextlib.contextmanager
def running_server(paths, options=None, **kw):
    """A :class:`Server` on a free port, run in a thread; yields it; stops and drains on exit."""
    from inferx_edge.serve.server import Server

    server = Server([Path(p) for p in paths], options or serve_options(), port=0, progress=lambda *a: None, **kw)
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("ok", server.run()), daemon=True)
    t.start()
    assert server.started.wait(30), "server did not start"
    try:
        yield server
    finally:
        server.stop()
        t.join(60)
        server.result = result.get("ok")


class FlakyEngine:
    """Wraps the real Engine: ``delay_s`` per batch, and a batch whose first input holds
    :data:`POISON` fails as a broken device would."""

    POISON = 12345.0
    delay_s = 0.0

    def __init__(self, *a, **kw):
        from inferx_edge.runtime.engine import Engine

        self._e = Engine(*a, **kw)

    def __getattr__(self, name):
        return getattr(self._e, name)

    def run_arrays(self, variant, arrays):
        if FlakyEngine.delay_s:
            time.sleep(FlakyEngine.delay_s)
        if (arrays[0] == self.POISON).any():
            raise RuntimeError("CUDA error: an illegal memory access was encountered (simulated)")
        return self._e.run_arrays(variant, arrays)


@pytest.fixture
def flaky_engine(monkeypatch):
    import inferx_edge.runtime

    monkeypatch.setattr(inferx_edge.runtime, "Engine", FlakyEngine)
    FlakyEngine.delay_s = 0.0
    yield FlakyEngine
    FlakyEngine.delay_s = 0.0
