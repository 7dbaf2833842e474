import json, sys, re
rec = json.load(open(sys.argv[1]))
ex = rec["rows"][0]["exact"]
print("exact:", ex)
plain = any(v for k, v in ex.items() if k.startswith("wgmma") and "swapped" not in k)
swapped = any(v for k, v in ex.items() if "swapped" in k)
if not plain and swapped:
    p = "inferx_edge/compiler/cuda/wgmma.py"
    s = open(p).read().replace("def gemm_body(shape: GemmShape, a, b, store: Store, swap_offsets: bool = False)", "def gemm_body(shape: GemmShape, a, b, store: Store, swap_offsets: bool = True)")
    open(p, "w").write(s); print("SWAPPED")
sys.exit(0 if (plain or swapped) else 3)
