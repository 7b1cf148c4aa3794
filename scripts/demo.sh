#!/usr/bin/env bash
# Run the Benchlink demo on the embedded defaults: a registry (embedded MQTT
# broker on a free port, SQLite), one simulated bench with device simulators
# on pseudo-terminals, a scripted audit agent leasing, acting and collecting
# evidence, a preemption, and an Earth command. Leaves no process behind.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cargo build --workspace --bins
exec cargo run --quiet -p benchlink-e2e --bin benchlink-demo -- "$@"
