#!/usr/bin/env bash
# Move the parts of the working tree a GPU-host run does not need (tests/, tuning_logs/,
# benchmarks/results/) out of the repository and back. The tracked tree is ~5.2 MiB; with the 61 MiB
# TVM bundle a remote GPU host that takes at most 64 MiB refuses it, parked it is ~2.2 MiB.
#
#   bash scripts/park_for_device.sh park      # before the remote run
#   bash scripts/park_for_device.sh restore   # after it (copy new records in afterwards)
#
# Never commit while parked: git would record the three folders as deleted.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
store=${INFERX_PARK_DIR:-/tmp/inferx_parked}
dirs=(tests tuning_logs benchmarks/results)
case "${1:-}" in
  park)
    [ -e "$store" ] && { echo "already parked in $store (restore first)" >&2; exit 1; }
    mkdir -p "$store/benchmarks"
    for d in "${dirs[@]}"; do mv "$root/$d" "$store/$d"; done
    mkdir -p "$root/benchmarks/results"  # the benchmarks write their records here
    echo "parked ${dirs[*]} in $store"
    ;;
  restore)
    [ -d "$store" ] || { echo "nothing parked in $store" >&2; exit 1; }
    extra=$(ls -A "$root/benchmarks/results")
    [ -z "$extra" ] || { echo "benchmarks/results/ has new files ($extra): move them aside first" >&2; exit 1; }
    rmdir "$root/benchmarks/results"
    for d in "${dirs[@]}"; do mv "$store/$d" "$root/$d"; done
    rm -rf "$store"
    echo "restored ${dirs[*]}"
    ;;
  *) echo "usage: $0 park|restore" >&2; exit 2 ;;
esac
