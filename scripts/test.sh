#!/usr/bin/env bash
# Run every Benchlink test: unit, integration and cross-process end-to-end.
# Needs Mosquitto on 127.0.0.1:1883 (started here if installed and not
# running); PulseAudio is started by the audio tests themselves.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
if ! (exec 3<>/dev/tcp/127.0.0.1/1883) 2>/dev/null; then
  if command -v mosquitto >/dev/null; then
    echo "test: starting mosquitto on 127.0.0.1:1883" >&2
    mosquitto -d -p 1883 || true
    sleep 1
  fi
fi
cargo build --workspace --bins
# The console's JavaScript unit tests (the Earth command's action executor).
node --test tests/browser/unit/
# With arguments (e.g. `-p edge-agent`, a test name), they replace the
# default selection of every crate and target.
if (($#)); then
  cargo test --no-fail-fast "$@"
else
  cargo test --workspace --all-targets --no-fail-fast
fi
