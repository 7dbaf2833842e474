"""``rpc://tracker:port/key``: upload an artifact's library to a TVM RPC device, load it there, smoke-run it.

The standard way to reach a Jetson from a workstation: ``python -m tvm.exec.rpc_tracker`` on the
host, ``python -m tvm.exec.rpc_server --tracker HOST:PORT --key KEY --no-fork`` on the device (a forked
server process fails CUDA initialization: ``cudaErrorInitializationError``). An RPC server works
in a temporary directory, so this installs nothing permanent: use ``ssh://`` for installs.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import numpy as np

from inferx_edge.deploy.transports import DeployError
from inferx_edge.package import open_artifact


def deploy_rpc(artifact: Path, host: str, port: int, key: str, *, repeat: int = 20, log=print, trust=None):
    from inferx_edge.deploy.result import DeployResult
    from inferx_edge.runtime._tvm import import_tvm_runtime

    tvm = import_tvm_runtime()
    from tvm import rpc

    with open_artifact(artifact, trust=trust) as art:
        m = art.manifest
        variant = m.variant()
        lib = art.member(variant.library)
        sha = hashlib.sha256(lib.read_bytes()).hexdigest()
        log(f"[1/4] requesting device '{key}' from tracker {host}:{port}")
        try:
            tracker = rpc.connect_tracker(host, port)
            remote = tracker.request(key, priority=1, session_timeout=300)
        except Exception as exc:  # TVMError / socket errors
            raise DeployError(f"cannot get device '{key}' from RPC tracker {host}:{port}: {exc}") from exc
        name = f"inferx_{sha[:12]}.so"
        log(f"[2/4] uploading {variant.library} ({lib.stat().st_size // 1024} KiB) as {name}")
        remote.upload(str(lib), target=name)
        echoed = hashlib.sha256(bytes(remote.download(name))).hexdigest()
        if echoed != sha:
            raise DeployError(
                f"checksum mismatch after upload to '{key}': local {sha[:16]}..., device {echoed[:16]}..."
            )
        log("[3/4] loading on the device")
        rlib = remote.load_module(name)
        dev = remote.cuda(0) if m.target["device"] == "cuda" else remote.cpu(0)
        vm = tvm.runtime.vm.VirtualMachine(rlib, dev)
        params = []
        if variant.weights:
            with np.load(art.member(variant.weights)) as npz:
                params = [tvm.runtime.tensor(npz[p], dev) for p in variant.params]
        rng = np.random.default_rng(0)
        inputs = [tvm.runtime.tensor(rng.standard_normal(s.shape).astype(s.dtype), dev) for s in variant.inputs]
        log("[4/4] smoke run on the device")
        out = vm["main"](*inputs, *params)
        outs = [out] if hasattr(out, "numpy") else list(out)
        shapes = [list(o.numpy().shape) for o in outs]
        if any(not np.isfinite(o.numpy()).all() for o in outs):
            raise DeployError(f"smoke run on '{key}' produced non-finite outputs")
        t0 = time.perf_counter()
        timer = vm.time_evaluator("main", dev, number=1, repeat=repeat)
        res = timer(*inputs, *params)
        summary = (
            f"ran {variant.name} on rpc device '{key}' ({m.target['device']}): outputs {shapes}; "
            f"p50 {float(np.median(res.results)) * 1e3:.3f} ms over {repeat} runs "
            f"(measured on the device; {time.perf_counter() - t0:.1f} s wall incl. RPC)"
        )
    return DeployResult(
        f"rpc://{host}:{port}/{key}",
        name,
        None,
        sha,
        selftest=summary,
        notes=["RPC servers run from a temporary directory: nothing was installed permanently"],
    )
