#!/usr/bin/env bash
# Build the Debian packages edge-agent and cloud-registry (binaries, systemd
# units, configuration kept on upgrade, the service users) with cargo-deb,
# from the `[package.metadata.deb]` tables of edge-agent/Cargo.toml and
# cloud-registry/Cargo.toml. Output: $CARGO_TARGET_DIR/debian/*.deb
# (target/debian/ by default). docs/install-edge-agent.md and
# docs/install-registry.md, "From the Debian package", say how to install
# them; tests/tests/packages.rs installs them into a Debian 12 root.
#
#   scripts/package.sh                        release build, then both packages
#   scripts/package.sh --profile dev --no-build --fast
#                                             package the binaries already in
#                                             target/debug (what the test does)
#   scripts/package.sh --lint                 also run lintian; exit 1 on an error
#
# cargo-deb is installed with `cargo install --locked` into
# $CARGO_TARGET_DIR/tools/cargo-deb-<version> when the pinned version is not
# on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo_deb_version=3.8.0
profile=release
build=1
lint=0
deb_args=()

usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; }

while (($#)); do
  case "$1" in
    --profile)
      (($# >= 2)) || { echo "package: --profile needs a profile name" >&2; exit 2; }
      profile="$2"
      shift 2
      ;;
    --no-build) build=0; shift ;;
    --fast) deb_args+=(--fast); shift ;;
    --lint) lint=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "package: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
case "$profile" in
  dev | debug) profile_dir=debug ;;
  *) profile_dir="$profile" ;;
esac

# cargo-deb: the pinned version from PATH, or from the local root.
cargo_deb=""
if command -v cargo-deb >/dev/null && [ "$(cargo-deb --version 2>/dev/null)" = "$cargo_deb_version" ]; then
  cargo_deb=cargo-deb
else
  tools_root="$target_dir/tools/cargo-deb-$cargo_deb_version"
  cargo_deb="$tools_root/bin/cargo-deb"
  if [ ! -x "$cargo_deb" ]; then
    echo "package: installing cargo-deb $cargo_deb_version into $tools_root" >&2
    CARGO_TARGET_DIR="$tools_root/build" cargo install --locked --quiet \
      --version "$cargo_deb_version" --root "$tools_root" cargo-deb
    rm -rf "$tools_root/build"
  fi
fi

bins=(edge-agent cloud-registry benchlink)
if ((build)); then
  # Without the console's vendored scripts the registry builds, but its
  # Earth page has no map: not something to ship.
  if [ ! -f cloud-registry/console-vendor/node_modules/.package-lock.json ]; then
    echo "package: cloud-registry/console-vendor/node_modules is missing; run scripts/setup.sh first" >&2
    exit 1
  fi
  cargo build --profile "$profile" -p edge-agent -p cloud-registry -p benchlink \
    --bin edge-agent --bin cloud-registry --bin benchlink
else
  for b in "${bins[@]}"; do
    [ -x "$target_dir/$profile_dir/$b" ] || {
      echo "package: --no-build but $target_dir/$profile_dir/$b is missing (cargo build --profile $profile --bin $b)" >&2
      exit 1
    }
  done
fi

debs=()
for pkg in edge-agent cloud-registry; do
  # --no-build: the binaries were built above (or before), once for both
  # packages; cargo-deb strips them into the package.
  out="$("$cargo_deb" --quiet --no-build --profile "$profile" -p "$pkg" \
    --output "$target_dir/debian" "${deb_args[@]}")"
  debs+=("$out")
  echo "$out"
done

if ((lint)); then
  # Warnings left (docs/install-registry.md "From the Debian package"):
  # no-manual-page for the binaries.
  lintian --fail-on error "${debs[@]}"
fi
