"""Where the tile search (:mod:`inferx_edge.tune.tiles`) times its candidates: this host's GPU, or
one behind a TVM RPC tracker."""

from __future__ import annotations

import os

import numpy as np

from inferx_edge.errors import UsageError


class _GPU:
    dev = None

    def load(self, path: str):
        raise NotImplementedError

    def measure(self, path: str, host_args: list[np.ndarray], repeat: int, min_repeat_ms: int):
        """(median seconds, every argument after one call) of the library's kernel on ``host_args``."""
        import tvm

        lib = self.load(path)
        args = [tvm.runtime.tensor(a, self.dev) for a in host_args]
        lib["main"](*args)
        self.dev.sync()
        after = [a.numpy() for a in args]
        timer = lib.time_evaluator("main", self.dev, number=1, repeat=repeat, min_repeat_ms=min_repeat_ms)
        return float(np.median(timer(*args).results)), after

    def close(self) -> None:
        pass


class LocalGPU(_GPU):
    """Candidates run on this host's GPU 0."""

    def __init__(self) -> None:
        import tvm

        self.dev = tvm.cuda(0)
        if not self.dev.exist:
            raise UsageError("tune --search tiles measures on a CUDA GPU and this host has none; use --rpc")
        self.name = str(self.dev.device_name)

    def load(self, path: str):
        import tvm

        return tvm.runtime.load_module(path)


class RemoteGPU(_GPU):
    """Candidates run on GPU 0 of a device behind a TVM RPC tracker (libraries uploaded one by one)."""

    def __init__(self, rpc) -> None:
        from tvm import rpc as tvm_rpc

        self.session = tvm_rpc.connect_tracker(rpc.host, rpc.port).request(rpc.key, session_timeout=600)
        self.dev = self.session.cuda(0)
        self.name = f"{rpc.key} via {rpc.host}:{rpc.port}"
        self.uploaded = 0

    def load(self, path: str):
        self.uploaded += 1
        name = f"inferx_tile_{os.getpid()}_{self.uploaded}.so"
        self.session.upload(path, name)
        return self.session.load_module(name)

    def close(self) -> None:
        self.session = None
