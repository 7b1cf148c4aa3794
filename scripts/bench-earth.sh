#!/usr/bin/env bash
# Benchmark of the web console's Earth page: a fresh registry (debug build,
# embedded broker, the shipped Earth data), then tests/browser/bench-earth.mjs
# in headless chromium prints the time from the Earth command's response to
# 500 highlights drawn, and the frames per second while the satellite layer
# animates. Stops the registry it started; leaves no process behind.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cargo build -p cloud-registry --bin cloud-registry
bin="${CARGO_TARGET_DIR:-target}/debug/cloud-registry"
work=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat > "$work/registry.toml" <<TOML
[http]
listen = "127.0.0.1:$port"
[store]
path = "$work/registry.sqlite3"
[auth]
bootstrap_admin_token_file = "$work/admin.token"
[mqtt]
mode = "embedded"
listen = "127.0.0.1:0"
TOML
"$bin" serve --config "$work/registry.toml" >/dev/null 2>"$work/registry.log" &
reg=$!
cleanup() { kill "$reg" 2>/dev/null || true; wait "$reg" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
for _ in $(seq 1 100); do
  curl -sf "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break
  sleep 0.2
done
BENCHLINK_URL="http://127.0.0.1:$port" BENCHLINK_TOKEN="$(cat "$work/admin.token")" \
  node tests/browser/bench-earth.mjs
