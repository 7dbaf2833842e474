#!/usr/bin/env bash
# One half of an A/B on a GPU host: a zoo model timed with module constants switched by sed on the
# host's copy of the tree (restored afterwards), so both halves run on one warm machine in one call.
#
#   bash scripts/device_ab.sh MODEL LABEL [SED_EXPR FILE]...
#   e.g. (remote run, carry [".device", ".whl"], after `source .device/install.sh` and the wheels of
#   scripts/device_wheels.sh on PYTHONPATH):
#   bash scripts/device_ab.sh densenet121 dn_off
#   SYSTEMS=inferx-int8 bash scripts/device_ab.sh densenet121 dn_on \
#       's/^CHUNK_MAJOR = True/CHUNK_MAJOR = False/' inferx_edge/compiler/cuda/rules/vectorized_elementwise.py
#
# Writes $OUT/LABEL/LABEL.json and .md (benchmarks/zoo.py records; artifacts and tuning logs removed so
# they do not come back). Give each half a `note` saying what was switched before committing it.
# Environment: SYSTEMS (default inferx-int8,torch-compile; the peer in one half is enough), BATCHES
# (default 64), ROUNDS (3), TARGET (h200), ZOO (/tmp/zoo: exports made there on first use), TAIL (12 lines
# of the benchmark's output shown), TUNE (minutes of tile search before the build, none by default; the
# tile database comes back as $OUT/LABEL/LABEL_tiles.json: the device returns no deeply nested files).
set -u
[ $# -ge 2 ] && [ $(($# % 2)) -eq 0 ] || { echo "usage: $0 MODEL LABEL [SED_EXPR FILE]..." >&2; exit 2; }
: "${OUT:?set OUT to the folder whose files come back}"
model=$1 label=$2
shift 2
zoo=${ZOO:-/tmp/zoo}
saved=()
restore() { for f in "${saved[@]}"; do mv "$f.orig" "$f"; done; }
trap restore EXIT
while [ $# -gt 0 ]; do
  cp "$2" "$2.orig" && saved+=("$2")
  sed -i "$1" "$2"
  if cmp -s "$2" "$2.orig"; then echo "$1 changed nothing in $2" >&2; exit 2; fi
  diff "$2.orig" "$2"
  shift 2
done
[ -d "$zoo/$model" ] || python3 -m benchmarks.zoo_export --models "$model" --out "$zoo" >/dev/null
if [ -n "${TUNE:-}" ]; then
  jobs=(--tune-tiles "$TUNE" --jobs 1 --worker-threads 16)  # one model: the search gets every core
else
  jobs=(--jobs 2 --worker-threads 8)
fi
python3 benchmarks/zoo.py --target "${TARGET:-h200}" --zoo-dir "$zoo" --out "$OUT/$label" --window 1.0 \
  --models "$model" --systems "${SYSTEMS:-inferx-int8,torch-compile}" --batches "${BATCHES:-64}" \
  "${jobs[@]}" --rounds "${ROUNDS:-3}" --name "$label" 2>&1 | tail -"${TAIL:-12}"
if [ -n "${TUNE:-}" ]; then
  tiles=$(find "$OUT/$label/tuning_logs" -name tiles.json | head -1)
  if [ -n "$tiles" ]; then cp "$tiles" "$OUT/$label/${label}_tiles.json"; else echo "no tile database written" >&2; fi
fi
rm -rf "$OUT/$label/artifacts" "$OUT/$label/tuning_logs"
