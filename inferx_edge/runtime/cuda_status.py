"""What this device's TVM needs to run CUDA artifacts, as one JSON line (``deploy`` runs it on the device):

    python -m inferx_edge.runtime.cuda_status
    {"arch": "aarch64", "driver_cuda": [12, 6], "installed_cudart": 13, "works": false}

``driver_cuda``: the CUDA version the NVIDIA driver supports (null without a driver);
``installed_cudart``: the CUDA runtime major the installed TVM's ``libtvm_runtime_cuda.so`` links;
``works``: the installed library can run on this driver (then no CUDA 12 build is needed).
"""

from __future__ import annotations

import json
import os

from inferx_edge.runtime import _tvm
from inferx_edge.runtime.compat import driver_cuda_version


def status() -> dict:
    _tvm.import_tvm_runtime()
    driver = driver_cuda_version()
    installed = _tvm.installed_cudart_major()
    return {
        "arch": os.uname().machine,
        "driver_cuda": list(driver) if driver else None,
        "installed_cudart": installed,
        "works": bool(driver and driver[0] >= installed),
    }


if __name__ == "__main__":
    print(json.dumps(status()))
