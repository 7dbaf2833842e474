#!/usr/bin/env bash
set -u
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv > $OUT/r/gpu.txt
t0=$(date +%s)
python3 - > $OUT/r/check.log 2>&1 <<'PY'
import numpy as np, traceback
from benchmarks.gpu_attention import run_kernel
cases = [((6,197,197,64,64), {}), ((4,50,130,32,32), {}), ((2,5,77,128,128), {}), ((3,70,3,16,48), {}), ((1,1,1,64,16), {})]
rng = np.random.default_rng(1)
for shape, view in [((1,3,49,49),(4,3)), ((4,1,1,49),(4,3)), ((2,1,3,49,49),(2,2,3))]:
    cases.append(((int(np.prod(view)),49,49,32,32), {"bias": rng.standard_normal(shape)*3, "view": view, "scale": 0.2}))
m = np.zeros((2,20,30)); m[0,3,:] = -np.inf; m[1,:,7] = -np.inf
cases.append(((2,20,30,16,16), {"bias": m, "view": (2,), "scale": 0.5, "out_dtype": "float16"}))
for shape, kw in cases:
    try:
        scale = kw.pop("scale", shape[3] ** -0.5)
        got, want = run_kernel(*shape, scale, **kw)
        if shape == (2,20,30,16,16): want[0,3] = 0
        err = np.abs(got - want).max() / max(1.0, np.abs(want).max())
        print(shape, "finite", np.isfinite(got).all(), "rel max err", err, "OK" if err < 3e-3 else "FAIL", flush=True)
    except Exception:
        print(shape, "ERROR", traceback.format_exc()[-1500:], flush=True)
PY
echo "check $(( $(date +%s)-t0 )) s" >> $OUT/r/times.txt
timeout 150 python3 -m benchmarks.gpu_attention --batches 64,1 --name gpu_attention_h200 > $OUT/r/attn.log 2>&1
echo "attn rc $? $(( $(date +%s)-t0 )) s" >> $OUT/r/times.txt
cp benchmarks/results/gpu_attention_h200.json $OUT/r/ 2>/dev/null
Z=/tmp/zoo
python3 -m benchmarks.zoo_export --out $Z --models vit_b_16,swin_t,minilm_l6 > $OUT/r/export.log 2>&1
echo "export $(( $(date +%s)-t0 )) s" >> $OUT/r/times.txt
left=$(( 575 - ($(date +%s)-t0) ))
timeout $left python3 -m benchmarks.zoo --target h200 --zoo-dir $Z --out /tmp/z1 --models vit_b_16,swin_t,minilm_l6 \
  --systems inferx-int8,torch-compile --jobs 3 --worker-threads 5 --window 1.5 --name zoo_h200_fused_attention > $OUT/r/z1.log 2>&1
echo "z1 rc $? $(( $(date +%s)-t0 )) s" >> $OUT/r/times.txt
cp /tmp/z1/*.json /tmp/z1/*.md $OUT/r/ 2>/dev/null
