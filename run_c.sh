#!/usr/bin/env bash
# GPU run C: zoo int8 vs torch.compile: squeeze-excite gates split, transposes sunk
set -u
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv > $OUT/r/gpu.txt
Z=/tmp/zoo
python -m benchmarks.zoo_export --out $Z --models efficientnet_b0,mobilenet_v3_large,convnext_tiny > $OUT/r/export.log 2>&1
timeout 400 python -m benchmarks.zoo --target h200 --zoo-dir $Z --out /tmp/zr --models efficientnet_b0,mobilenet_v3_large,convnext_tiny \
  --systems inferx-int8,torch-compile --jobs 3 --worker-threads 5 --window 1.5 --name zoo_h200_se_gates > $OUT/r/zoo.log 2>&1
echo zoo rc $? $(date)
cp benchmarks/results/*.json benchmarks/results/*.md $OUT/r/ 2>/dev/null
cd $OUT && tar czf r.tgz r && rm -rf r
