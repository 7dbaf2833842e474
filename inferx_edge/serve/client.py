"""The load generator's side of the wire: a keep-alive HTTP connection, reading two series from the
server's metrics, and shared-memory requests (one registered region per connection)."""

from __future__ import annotations

import http.client
import json
import math
import re
import socket
import threading

import numpy as np

from inferx_edge.errors import UsageError
from inferx_edge.serve.protocol import DATATYPES, datatype_of


class Client:
    """One keep-alive HTTP connection."""

    def __init__(self, host: str, port: int, token: str | None, timeout_s: float) -> None:
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.conn: http.client.HTTPConnection | None = None
        self.retries = 0  # requests resent once after the connection dropped (counted in the record)

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
        for attempt in (0, 1):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
                self.conn.connect()
                # headers and body go out in two writes: without this each request waits ~40 ms on Nagle
                self.conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                self.conn.request(method, path, body=body, headers={**self.headers, **(headers or {})})
                resp = self.conn.getresponse()
                data = resp.read()
                if resp.getheader("connection", "").lower() == "close":
                    self.conn.close()
                    self.conn = None
                return resp.status, data, resp
            except (ConnectionError, http.client.HTTPException, OSError):
                if self.conn is not None:
                    self.conn.close()
                self.conn = None
                if attempt:
                    raise
                self.retries += 1
        raise AssertionError("unreachable")


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def scrape(client: Client, model: str) -> dict:
    """Energy (J, all devices) and inference count of ``model`` from the server's /metrics (the text
    exposition format: only two series are needed, so no Prometheus client library)."""
    try:
        status, data, _ = client.request("GET", "/metrics")
    except OSError:
        return {"energy_j": None, "count": None}
    if status != 200:
        return {"energy_j": None, "count": None}
    energy, count, has_energy = 0.0, 0.0, False
    for line in data.decode(errors="replace").splitlines():
        m = _SAMPLE.match(line)
        if not m:
            continue
        name, labels, value = m.groups()
        try:
            v = float(value)
        except ValueError:
            continue
        if name == "inferx_energy_joules_total":
            energy += v
            has_energy = True
        elif name == "nv_inference_count" and f'model="{model}"' in (labels or ""):
            count += v
    return {"energy_j": energy if has_energy else None, "count": count}


class ShmRequests:
    """One shm region per client connection (input + output bytes), registered with the server; the
    request body then only names them."""

    def __init__(self, client: Client, meta: dict, inputs: dict[str, np.ndarray], rows: int) -> None:
        from multiprocessing import shared_memory

        self._shm_mod = shared_memory
        self.client, self.meta, self.inputs = client, meta, inputs
        self.in_bytes = sum(a.nbytes for a in inputs.values())
        self.outputs = []
        for o in meta["outputs"]:
            shape = [rows if d == -1 else d for d in o["shape"]]
            self.outputs.append((o["name"], math.prod(shape) * DATATYPES[o["datatype"]].itemsize))
        self.regions: list = []
        self.lock = threading.Lock()

    def make(self, client: Client) -> tuple[bytes, dict]:
        """A region for the connection ``client`` (registered over it: connections are per thread)."""
        with self.lock:
            i = len(self.regions)
            size = self.in_bytes + sum(n for _, n in self.outputs)
            seg = self._shm_mod.SharedMemory(create=True, size=size)
            self.regions.append(seg)
        at, entries = 0, []
        for name, arr in self.inputs.items():
            raw = np.ascontiguousarray(arr).tobytes()
            seg.buf[at : at + len(raw)] = raw
            entries.append(
                {
                    "name": name,
                    "datatype": datatype_of(arr.dtype),
                    "shape": list(arr.shape),
                    "parameters": {
                        "shared_memory_region": f"lg{i}-{seg.name}",
                        "shared_memory_byte_size": len(raw),
                        "shared_memory_offset": at,
                    },
                }
            )
            at += len(raw)
        outs = []
        for name, n in self.outputs:
            outs.append(
                {
                    "name": name,
                    "parameters": {
                        "shared_memory_region": f"lg{i}-{seg.name}",
                        "shared_memory_byte_size": n,
                        "shared_memory_offset": at,
                    },
                }
            )
            at += n
        status, data, _ = client.request(
            "POST",
            f"/v2/systemsharedmemory/region/lg{i}-{seg.name}/register",
            json.dumps({"key": f"/{seg.name}", "offset": 0, "byte_size": size}).encode(),
        )
        if status != 200:
            raise UsageError(
                f"the server refused the shared memory region ({status}): {data[:300].decode(errors='replace')}"
            )
        return json.dumps({"inputs": entries, "outputs": outs}).encode(), {"Content-Type": "application/json"}

    def close(self) -> None:
        for i, seg in enumerate(self.regions):
            try:
                self.client.request("POST", f"/v2/systemsharedmemory/region/lg{i}-{seg.name}/unregister")
            except OSError:
                pass
            seg.close()
            seg.unlink()
        self.regions = []
