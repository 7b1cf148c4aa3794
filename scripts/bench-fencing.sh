#!/usr/bin/env bash
# The fencing benchmark: action round trip and registry/edge CPU per action
# of the build before fencing (commit cc355aa) against the current tree, in
# one `action-bench --baseline-bins` run (docs/benchmarks.md "Fencing:
# before and after").
#
#   scripts/bench-fencing.sh [action-bench options, e.g. --requests 2000 --rounds 3]
#
# The baseline's release binaries are built once from a `git worktree` of
# BASELINE_REV at $CARGO_TARGET_DIR/baseline-<rev>/src into
# $CARGO_TARGET_DIR/baseline-<rev> (default target/baseline-<rev>) and kept
# for the next run. The worktree stays too: the registry reads its Earth
# data from its source tree. To rebuild: `git worktree remove` that src
# and delete the directory. Needs nothing beyond the crates in Cargo.lock.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
rev=${BASELINE_REV:-cc355aa}
target=${CARGO_TARGET_DIR:-$repo/target}
case $target in /*) ;; *) target=$repo/$target ;; esac
base_target=$target/baseline-$rev
base_bins=$base_target/release

if [[ -x $base_bins/cloud-registry && -x $base_bins/edge-agent ]]; then
  echo "bench-fencing: reusing the baseline binaries in $base_bins" >&2
else
  tree=$base_target/src
  mkdir -p "$base_target"
  [[ -d $tree ]] || git worktree add --detach "$tree" "$rev"
  echo "bench-fencing: building the baseline ($rev) into $base_target" >&2
  (cd "$tree" && CARGO_TARGET_DIR=$base_target \
    cargo build --locked --release -p cloud-registry -p edge-agent --bins)
fi

echo "bench-fencing: building the current release binaries into $target" >&2
CARGO_TARGET_DIR=$target \
  cargo build --locked --release -p cloud-registry -p edge-agent -p benchlink-e2e --bins
exec "$target/release/action-bench" --baseline-bins "$base_bins" "$@"
