"""What a compiled library holds, read from its bytes: CPU architecture and embedded CUDA device code.

Used before a library is loaded (a foreign library must be refused, not dlopen'ed) and by ``inspect``.
"""

from __future__ import annotations

import re
from pathlib import Path

from inferx_edge.errors import ArtifactError

#: ELF e_machine -> architecture name as ``platform.machine()`` spells it.
ELF_MACHINES = {62: "x86_64", 183: "aarch64", 190: "cuda"}
_EM_CUDA = 190


def elf_machine(path: Path) -> str:
    """The architecture an ELF shared library was built for (``x86_64``, ``aarch64``, or ``elf-<n>``)."""
    with open(path, "rb") as f:
        header = f.read(20)
    if len(header) < 20 or header[:4] != b"\x7fELF":
        raise ArtifactError(f"library {path.name} is not an ELF shared object")
    code = int.from_bytes(header[18:20], "little" if header[5] == 1 else "big")
    return ELF_MACHINES.get(code, f"elf-{code}")


def embedded_cuda_code(path: Path) -> dict[str, list[str]]:
    """CUDA device code inside a library: ``{"cubin": ["sm_87", ...], "ptx": ["sm_87", ...]}``.

    Cubins are ELF images with e_machine EM_CUDA whose e_flags hold the SM version; PTX is text
    with a ``.target sm_XX`` directive. CUDA *source* (what TVM leaves when it could not compile) shows
    up as ``"source"`` entries.
    """
    data = Path(path).read_bytes()
    cubins = []
    for m in re.finditer(rb"\x7fELF", data):
        o = m.start()
        if o == 0 or len(data) < o + 52 or data[o + 4] != 2:  # 64-bit ELF only
            continue
        if int.from_bytes(data[o + 18 : o + 20], "little") == _EM_CUDA:
            flags = int.from_bytes(data[o + 48 : o + 52], "little")
            # CUDA <= 12 cubins (ELF ABI version 7): SM in e_flags bits 0-7; CUDA 13 (ABI 8): bits 8-15
            cubins.append(f"sm_{(flags >> 8) & 0xFF if data[o + 8] >= 8 else flags & 0xFF}")
    ptx = [t.decode() for t in re.findall(rb"\n\s*\.target\s+(sm_\d+a?)", data)]
    source = ["cuda-c++"] if b'extern "C" __global__' in data else []
    return {"cubin": cubins, "ptx": ptx, "source": source}


_PT_DYNAMIC, _DT_NEEDED, _DT_STRTAB, _PT_LOAD = 2, 1, 5, 1


def needed_libraries(path: Path) -> list[str]:
    """The ``DT_NEEDED`` entries of a 64-bit little-endian ELF shared library (what ``readelf -d``
    lists as NEEDED), read from its program headers without loading it."""
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ArtifactError(f"library {Path(path).name} is not a 64-bit little-endian ELF shared object")

    def u(off: int, n: int) -> int:
        if off + n > len(data):
            raise ArtifactError(f"library {Path(path).name} is truncated")
        return int.from_bytes(data[off : off + n], "little")

    phoff, phentsize, phnum = u(32, 8), u(54, 2), u(56, 2)
    loads, dynamic = [], None
    for i in range(phnum):
        ph = phoff + i * phentsize
        kind, offset, vaddr, filesz = u(ph, 4), u(ph + 8, 8), u(ph + 16, 8), u(ph + 32, 8)
        if kind == _PT_LOAD:
            loads.append((vaddr, offset, filesz))
        elif kind == _PT_DYNAMIC:
            dynamic = (offset, filesz)
    if dynamic is None:
        return []
    entries, strtab = [], None
    for off in range(dynamic[0], dynamic[0] + dynamic[1], 16):
        tag, val = u(off, 8), u(off + 8, 8)
        if tag == 0:
            break
        if tag == _DT_NEEDED:
            entries.append(val)
        elif tag == _DT_STRTAB:
            strtab = val
    if strtab is None:
        return []
    base = next((off + strtab - va for va, off, size in loads if va <= strtab < va + size), None)
    if base is None:
        raise ArtifactError(f"library {Path(path).name}: its string table lies outside its loaded segments")
    names = []
    for e in entries:
        end = data.find(b"\0", base + e)
        names.append(data[base + e : end].decode("utf-8", "replace"))
    return names


def cudart_major(path: Path) -> int | None:
    """The CUDA runtime major version a library links (``libcudart.so.12`` -> 12), or None."""
    for name in needed_libraries(path):
        m = re.fullmatch(r"libcudart\.so\.(\d+)", name)
        if m:
            return int(m.group(1))
    return None
