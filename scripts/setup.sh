#!/usr/bin/env bash
# Install what Benchlink needs on a Debian/Ubuntu machine that has only the
# Rust toolchain: the C libraries the media and serial crates link against,
# and the programs the tests drive (socat, PulseAudio, espeak-ng, tesseract,
# Mosquitto, libfaketime, chromium and node for the console's browser tests,
# with their npm packages). Idempotent: does nothing when everything is present.
set -euo pipefail

packages=(
  pkg-config
  libasound2-dev   # alsa-sys: cpal (microphone) and rodio (speaker)
  libudev-dev      # serialport: USB port enumeration for `edge-agent devices`
  libclang-dev     # bindgen: nokhwa's V4L2 bindings (camera)
  socat            # tests: extra pseudo-terminal pairs
  pulseaudio       # tests: userland audio server with a null sink
  pulseaudio-utils # pactl
  espeak-ng        # speaker play_tts default TTS command
  tesseract-ocr    # screen_capture ocr default command; the registry's derived ocr_text
  pocketsphinx     # the registry's `command` speech provider (config/speech/bench-words.gram)
  pocketsphinx-en-us # its English acoustic model and dictionary
  mosquitto        # tests: the external-broker path
  faketime         # tests: libfaketime steps the registry's wall clock (clock_steps)
  curl             # README "A first look by hand", docs/http-api.md walk-through
  jq               # the same
  chromium         # tests: the console's browser tests (tests/browser)
  fonts-wqy-microhei # a CJK font, so the Earth page's Chinese text shows in chromium's screenshots
  systemd          # tests: systemd-analyze verify / security on the shipped units
  lintian          # scripts/package.sh --lint, tests/tests/packages.rs
  prometheus       # tests/tests/metrics.rs: promtool check metrics on both /metrics texts
  debootstrap      # tests/tests/packages.rs: the Debian 12 root the packages install into
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# node and npm for the browser tests' scripts, unless a node install
# (which may bring its own npm) is there already.
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The console's Earth page: d3-geo, topojson-client and world-atlas' Natural
# Earth map, pinned by the lockfile; cloud-registry/build.rs embeds the few
# files it needs, so nothing is fetched when the page runs.
vendor_dir="$(dirname "$0")/../cloud-registry/console-vendor"
if [ ! -f "$vendor_dir/node_modules/.package-lock.json" ] || [ "$vendor_dir/package-lock.json" -nt "$vendor_dir/node_modules/.package-lock.json" ]; then
  echo "setup: npm ci in cloud-registry/console-vendor" >&2
  (cd "$vendor_dir" && npm ci --no-audit --no-fund --silent)
fi

# The console's browser tests: playwright-core, pinned by the lockfile.
browser_dir="$(dirname "$0")/../tests/browser"
if [ ! -d "$browser_dir/node_modules" ]; then
  echo "setup: npm ci in tests/browser" >&2
  (cd "$browser_dir" && npm ci --no-audit --no-fund --silent)
fi

# The MCP server's test client: the official Python MCP SDK in a venv,
# pinned by tests/mcp/requirements.txt.
mcp_dir="$(dirname "$0")/../tests/mcp"
if [ ! -x "$mcp_dir/.venv/bin/python" ] || ! "$mcp_dir/.venv/bin/python" -c 'import mcp' 2>/dev/null; then
  echo "setup: python venv for the MCP client in tests/mcp/.venv" >&2
  if ! python3 -m venv --help >/dev/null 2>&1; then
    sudo_cmd=()
    if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
    "${sudo_cmd[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
  fi
  python3 -m venv "$mcp_dir/.venv"
  "$mcp_dir/.venv/bin/pip" install -q --disable-pip-version-check -r "$mcp_dir/requirements.txt"
fi

# The OpenAPI fuzz run (tests/tests/openapi.rs): schemathesis in a venv,
# pinned by tests/schemathesis/requirements.txt.
st_dir="$(dirname "$0")/../tests/schemathesis"
if [ ! -x "$st_dir/.venv/bin/schemathesis" ] || ! "$st_dir/.venv/bin/python" -c 'import schemathesis' 2>/dev/null; then
  echo "setup: python venv for schemathesis in tests/schemathesis/.venv" >&2
  python3 -m venv "$st_dir/.venv"
  "$st_dir/.venv/bin/pip" install -q --disable-pip-version-check -r "$st_dir/requirements.txt"
fi
