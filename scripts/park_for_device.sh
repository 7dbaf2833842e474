#!/usr/bin/env bash
# Move the parts of the working tree a GPU-host run does not need (tests/, tuning_logs/, docs/,
# benchmarks/results/ and benchmarks/README.md) out of the repository and back. With the 61 MiB TVM
# bundle a remote GPU host takes at most 64 MiB; parked, the tracked tree is ~2.4 MiB.
#
#   bash scripts/park_for_device.sh park      # before the remote run
#   bash scripts/park_for_device.sh restore   # after it (copy new records in afterwards)
#
# Never commit while parked: git would record the three folders as deleted. Parking writes the
# commit into benchmarks/results/.parked_commit; records written while parked name it
# (benchmarks/_record.py), not whatever the GPU host's copy of .git says.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
store=${INFERX_PARK_DIR:-/tmp/inferx_parked}
dirs=(tests tuning_logs docs benchmarks/results benchmarks/README.md)
case "${1:-}" in
  park)
    [ -e "$store" ] && { echo "already parked in $store (restore first)" >&2; exit 1; }
    # the commit the tree is at, for records written on the GPU host (whose copy of .git may not
    # follow this checkout): "<commit> clean|dirty", dirty when tracked files differ from it
    state=clean; git -C "$root" diff --quiet HEAD || state=dirty
    [ "$state" = clean ] || echo "warning: uncommitted changes; records will say git_dirty" >&2
    commit="$(git -C "$root" rev-parse HEAD) $state"
    mkdir -p "$store/benchmarks"
    for d in "${dirs[@]}"; do mv "$root/$d" "$store/$d"; done
    mkdir -p "$root/benchmarks/results"  # the benchmarks write their records here
    echo "$commit" >"$root/benchmarks/results/.parked_commit"
    echo "parked ${dirs[*]} in $store"
    ;;
  restore)
    [ -d "$store" ] || { echo "nothing parked in $store" >&2; exit 1; }
    rm -f "$root/benchmarks/results/.parked_commit"
    extra=$(ls -A "$root/benchmarks/results")
    [ -z "$extra" ] || { echo "benchmarks/results/ has new files ($extra): move them aside first" >&2; exit 1; }
    rmdir "$root/benchmarks/results"
    for d in "${dirs[@]}"; do mv "$store/$d" "$root/$d"; done
    rm -rf "$store"
    echo "restored ${dirs[*]}"
    ;;
  *) echo "usage: $0 park|restore" >&2; exit 2 ;;
esac
