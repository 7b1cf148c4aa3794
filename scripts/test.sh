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
  exit
fi
status=0
cargo test --workspace --all-targets --no-fail-fast || status=$?
# The registry's integration tests once more with the store in PostgreSQL
# (BENCHLINK_TEST_POSTGRES_URL, by default 127.0.0.1:5432, database test):
# each test in a schema of its own, named bl_test_*; those of earlier runs
# are dropped first.
pg_url=${BENCHLINK_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}
if (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null || [[ -n ${BENCHLINK_TEST_POSTGRES_URL:-} ]]; then
  if command -v psql >/dev/null; then
    psql "$pg_url" -qAt -c "SELECT format('DROP SCHEMA %I CASCADE;', nspname) FROM pg_namespace WHERE nspname LIKE 'bl\_test\_%'" \
      | psql "$pg_url" -q >/dev/null || true
  fi
  BENCHLINK_TEST_STORE=postgres BENCHLINK_TEST_POSTGRES_URL=$pg_url \
    cargo test -p cloud-registry --test '*' --no-fail-fast || status=$?
elif [[ ${CI:-} == true ]]; then
  echo "test: PostgreSQL is not reachable on 127.0.0.1:5432; CI=true needs it for the PostgreSQL pass" >&2
  status=1
else
  echo "test: PostgreSQL is not reachable on 127.0.0.1:5432: the PostgreSQL pass of the registry tests is NOT run (CI=true makes this a failure)" >&2
fi
exit $status
