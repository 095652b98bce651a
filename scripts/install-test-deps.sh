#!/usr/bin/env bash
# Everything the test suite needs beyond the Rust toolchain, with pinned versions where a
# registry serves them (pins: scripts/versions.env). Idempotent: safe to run again; installs
# only what is missing or pinned differently.
#
#   scripts/install-test-deps.sh              everything
#   scripts/install-test-deps.sh PART...      only these parts: systemd, node, python
#
# Parts:
# - systemd: systemd-analyze (unit verification, security score), systemd-socket-activate.
# - node:    Node 22 (the npm registry's `node` package), the MCP conformance suite and the
#            MCP Inspector, in target/third-party/node_modules.
# - python:  the official MCP Python SDK (PyPI `mcp`) in the venv target/third-party/venv.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=versions.env
. scripts/versions.env

THIRD_PARTY=target/third-party
VENV="$THIRD_PARTY/venv"

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

apt_install() {
  echo "installing Debian packages: $*"
  export DEBIAN_FRONTEND=noninteractive
  as_root apt-get update -qq
  as_root apt-get install -y -qq --no-install-recommends "$@"
}

install_systemd_tools() {
  local need=()
  command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
  command -v systemd-socket-activate >/dev/null 2>&1 || need+=(systemd)
  if [ ${#need[@]} -gt 0 ]; then
    apt_install systemd
  fi
}

# Node 22 and the npm tools, pinned exactly. npm 11 runs no dependency install scripts
# unless allowed; the `node` package needs its preinstall (it fetches the platform's node
# binary package from the registry), so that one is allowed by name.
install_node_tools() {
  command -v npm >/dev/null 2>&1 || apt_install npm
  mkdir -p "$THIRD_PARTY"
  local manifest="$THIRD_PARTY/package.json"
  local wanted
  wanted=$(cat <<EOF
{
  "private": true,
  "description": "third-party MCP clients for toolwall's tests (scripts/install-test-deps.sh)",
  "dependencies": {
    "node": "$NODE22_VERSION",
    "@modelcontextprotocol/conformance": "$CONFORMANCE_VERSION",
    "@modelcontextprotocol/inspector": "$INSPECTOR_VERSION"
  },
  "allowScripts": {
    "node": true
  }
}
EOF
)
  local bin="$THIRD_PARTY/node_modules/.bin"
  if [ -f "$manifest" ] && [ "$(cat "$manifest")" = "$wanted" ] \
    && [ "$("$bin/node" --version 2>/dev/null)" = "v$NODE22_VERSION" ] \
    && [ -x "$bin/conformance" ] && [ -x "$bin/mcp-inspector" ]; then
    echo "node $NODE22_VERSION, conformance $CONFORMANCE_VERSION, inspector $INSPECTOR_VERSION: installed"
    return
  fi
  printf '%s\n' "$wanted" >"$manifest"
  rm -f "$THIRD_PARTY/package-lock.json"
  npm install --prefix "$THIRD_PARTY" --no-audit --no-fund --loglevel=error
  local got
  got=$("$bin/node" --version)
  if [ "$got" != "v$NODE22_VERSION" ]; then
    echo "expected node v$NODE22_VERSION in $bin, got $got" >&2
    exit 1
  fi
  PATH="$PWD/$bin:$PATH" conformance --version
  echo "node $got, conformance $CONFORMANCE_VERSION, inspector $INSPECTOR_VERSION: installed in $THIRD_PARTY"
}

# The official MCP Python SDK, pinned, in its own venv.
install_python_sdk() {
  if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    apt_install python3 python3-venv
  fi
  local stamp="$VENV/.mcp-version"
  if [ -x "$VENV/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$MCP_PY_VERSION" ]; then
    echo "MCP Python SDK $MCP_PY_VERSION: installed"
    return
  fi
  mkdir -p "$THIRD_PARTY"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "mcp==$MCP_PY_VERSION"
  "$VENV/bin/python" -c 'import mcp.client.streamable_http, mcp.client.stdio'
  printf '%s\n' "$MCP_PY_VERSION" >"$stamp"
  echo "MCP Python SDK $MCP_PY_VERSION: installed in $VENV"
}

parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(systemd node python)

# Tests may run this from several processes at once: one installer at a time.
mkdir -p "$THIRD_PARTY"
exec 9>"$THIRD_PARTY/.install.lock"
flock 9

for part in "${parts[@]}"; do
  case "$part" in
    systemd) install_systemd_tools ;;
    node) install_node_tools ;;
    python) install_python_sdk ;;
    *)
      echo "unknown part $part (expected systemd, node or python)" >&2
      exit 2
      ;;
  esac
done
