#!/usr/bin/env bash
# GPU run B: depthwise kernels OHWI/HWIO x fp32 channels per thread; then zoo int8 vs torch.compile
set -u
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv > $OUT/r/gpu.txt
Z=/tmp/zoo
python -m benchmarks.zoo_export --out $Z --models convnext_tiny,efficientnet_b0,mobilenet_v3_large,mobilenet_v2,resnet18 > $OUT/r/export.log 2>&1
timeout 230 python -m benchmarks.gpu_depthwise --zoo-dir $Z --jobs 15 --name gpu_depthwise_h200 > $OUT/r/dw.log 2>&1
echo dw rc $? $(date)
timeout 340 python -m benchmarks.zoo --target h200 --zoo-dir $Z --out /tmp/zr --models convnext_tiny,efficientnet_b0,mobilenet_v3_large,resnet18 \
  --systems inferx-int8,torch-compile --jobs 4 --worker-threads 3 --window 1.5 --name zoo_h200_depthwise_hwio > $OUT/r/zoo.log 2>&1
echo zoo rc $? $(date)
cp benchmarks/results/*.json benchmarks/results/*.md $OUT/r/ 2>/dev/null
cd $OUT && tar czf r.tgz r && rm -rf r
