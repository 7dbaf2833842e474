"""Device-run helper: after ``benchmarks.gpu_wgmma_gemm`` wrote its record (argument), exit 0 when a
wgmma variant matched cuBLASLt exactly, 3 when none did; when only the swapped-offset variant matched,
switch the kernel's default to it in this copy of the tree (the device's) first."""

import json
import sys

rec = json.load(open(sys.argv[1]))
exact = rec["rows"][0]["exact"]
print("exact:", exact)
plain = any(v for k, v in exact.items() if k.startswith("wgmma") and "swapped" not in k)
swapped = any(v for k, v in exact.items() if "swapped" in k)
if not plain and swapped:
    path = "inferx_edge/compiler/cuda/wgmma.py"
    text = open(path).read()
    old = "def gemm_body(shape: GemmShape, a, b, store: Store, swap_offsets: bool = False)"
    open(path, "w").write(text.replace(old, old.replace("= False", "= True")))
    print("SWAPPED")
sys.exit(0 if (plain or swapped) else 3)
