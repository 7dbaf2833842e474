"""Triton's system shared memory extension: a client on the same host registers a POSIX shared-memory
region once, then sends only its name, offset and size per tensor; the server reads inputs from it and
writes outputs into it. Large tensors then never cross the HTTP socket (a 64-image ResNet-50 batch is
38.5 MB of float32: over loopback HTTP the copy, not the GPU, bounds throughput).

Regions are POSIX shm objects (``/dev/shm/<key>``) the client created; keys are plain names (no path
separators), offsets and sizes are checked against the object's size, and a region stays mapped until
it is unregistered (or the server stops).
"""

from __future__ import annotations

import mmap
import os
import re
import threading
from dataclasses import dataclass

_KEY = re.compile(r"^/?[A-Za-z0-9_.\-]{1,200}$")
SHM_ROOT = "/dev/shm"
MAX_REGIONS = 256


class SharedMemoryError(ValueError):
    """A region that cannot be registered or used; the message names it."""


@dataclass
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    map: mmap.mmap

    def status(self) -> dict:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


class SharedMemoryRegistry:
    """Registered regions by name (thread-safe)."""

    def __init__(self, root: str = SHM_ROOT) -> None:
        self.root = root
        self._regions: dict[str, Region] = {}
        self._lock = threading.Lock()

    def register(self, name: str, key, offset, byte_size) -> None:
        if not isinstance(key, str) or not _KEY.match(key) or key.strip("/") in (".", ".."):
            raise SharedMemoryError(f"shared memory key {key!r} must be a POSIX shm name like '/input0'")
        for field, v in (("offset", offset), ("byte_size", byte_size)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise SharedMemoryError(f"region '{name}': {field} must be a non-negative integer, got {v!r}")
        if byte_size == 0:
            raise SharedMemoryError(f"region '{name}': byte_size must be positive")
        with self._lock:
            if name in self._regions:
                raise SharedMemoryError(f"shared memory region '{name}' is already registered; unregister it first")
            if len(self._regions) >= MAX_REGIONS:
                raise SharedMemoryError(f"at most {MAX_REGIONS} shared memory regions may be registered")
            path = os.path.join(self.root, key.lstrip("/"))
            try:
                fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
            except OSError as exc:
                raise SharedMemoryError(f"cannot open shared memory key '{key}': {exc.strerror}") from exc
            try:
                size = os.fstat(fd).st_size
                if offset + byte_size > size:
                    raise SharedMemoryError(
                        f"region '{name}': offset {offset} + byte_size {byte_size} exceed the {size} bytes of '{key}'"
                    )
                m = mmap.mmap(fd, size)
            finally:
                os.close(fd)
            self._regions[name] = Region(name, key, offset, byte_size, m)

    def unregister(self, name: str | None = None) -> None:
        """Forget ``name`` (every region when None). The mapping closes once no request still uses it."""
        with self._lock:
            names = list(self._regions) if name is None else [name]
            if name is not None and name not in self._regions:
                raise SharedMemoryError(f"no shared memory region '{name}' is registered")
            for n in names:
                region = self._regions.pop(n)
                try:
                    region.map.close()
                except BufferError:  # a request still reads it: the mapping goes with the last view
                    pass

    def status(self, name: str | None = None) -> list[dict]:
        with self._lock:
            if name is not None:
                if name not in self._regions:
                    raise SharedMemoryError(f"no shared memory region '{name}' is registered")
                return [self._regions[name].status()]
            return [r.status() for r in self._regions.values()]

    def view(self, name, offset, size) -> memoryview:
        """``size`` bytes at ``offset`` within region ``name``."""
        if not isinstance(name, str):
            raise SharedMemoryError(f"shared_memory_region must be a string, got {name!r}")
        for field, v in (("shared_memory_offset", offset), ("shared_memory_byte_size", size)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise SharedMemoryError(f"region '{name}': {field} must be a non-negative integer, got {v!r}")
        with self._lock:
            region = self._regions.get(name)
            if region is None:
                raise SharedMemoryError(f"no shared memory region '{name}' is registered")
            if offset + size > region.byte_size:
                raise SharedMemoryError(
                    f"region '{name}': offset {offset} + size {size} exceed its {region.byte_size} bytes"
                )
            start = region.offset + offset
            return memoryview(region.map)[start : start + size]

    def close(self) -> None:
        self.unregister(None)
