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
