#!/usr/bin/env bash
# Run the Benchlink demo on the embedded defaults: a registry (embedded MQTT
# broker on a free port, SQLite), one simulated bench with device simulators
# on pseudo-terminals, a scripted audit agent leasing, acting and collecting
# evidence, a preemption, and an Earth command; prints the web console's URL
# (`--console-seconds N` keeps the lab up N s after the job to look at it).
# Leaves no process behind.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cargo build --workspace --bins
exec cargo run --quiet -p benchlink-e2e --bin benchlink-demo -- "$@"
