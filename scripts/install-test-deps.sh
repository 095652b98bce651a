#!/usr/bin/env bash
# Everything the test suite needs beyond the Rust toolchain, with pinned versions where a
# registry serves them (pins: scripts/versions.env and tests/fixtures/sdk-requirements.txt).
# Idempotent: safe to run again; installs only what is missing or pinned differently.
#
#   scripts/install-test-deps.sh              everything
#   scripts/install-test-deps.sh PART...      only these parts: systemd, python3, python,
#                                             node (debian = systemd and python3)
#
# The tests run it themselves for the parts they use (tests/common/deps.rs), so a fresh
# clone needs nothing but `cargo test --workspace`.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=versions.env
. scripts/versions.env

sudo_cmd=""
[ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"

apt_install() {
    echo "installing Debian packages: $*"
    export DEBIAN_FRONTEND=noninteractive
    $sudo_cmd apt-get update -qq
    $sudo_cmd apt-get install -y -qq --no-install-recommends "$@"
}

# Debian packages: systemd-analyze (unit verification, security score) and
# systemd-socket-activate.
install_systemd() {
    if ! command -v systemd-analyze >/dev/null 2>&1 \
        || ! command -v systemd-socket-activate >/dev/null 2>&1; then
        apt_install systemd
    fi
}

# python3 with venv, for the aggregator's test upstreams and the Python SDK's venv.
install_python3() {
    if ! command -v python3 >/dev/null 2>&1 || ! python3 -c 'import venv' >/dev/null 2>&1; then
        apt_install python3 python3-venv
    fi
}

# The official MCP Python SDK (PyPI `mcp`, and everything it pulls in, pinned in
# tests/fixtures/sdk-requirements.txt) in a venv at target/mcp-venv: a server (and client)
# nobody here wrote. tests/fixtures/upstream.py itself needs the standard library only.
install_python_sdk() {
    local venv=target/mcp-venv requirements=tests/fixtures/sdk-requirements.txt
    local stamp="$venv/.requirements"
    if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && cmp -s "$stamp" "$requirements"; then
        echo "MCP Python SDK already installed in $venv"
        return
    fi
    if ! grep -qx "mcp==$MCP_PY_VERSION" "$requirements"; then
        echo "$requirements does not pin mcp==$MCP_PY_VERSION (scripts/versions.env)" >&2
        exit 1
    fi
    install_python3
    mkdir -p target
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$requirements"
    cp "$requirements" "$stamp"
    "$venv/bin/python" -c 'import mcp, importlib.metadata as m; print("MCP Python SDK", m.version("mcp"), "installed")'
}

# Node 22 (the npm registry's `node` package), the MCP conformance suite, the MCP
# Inspector and the reference filesystem and "everything" servers (run as local servers
# behind toolwall), pinned exactly, in target/third-party/node_modules. npm 11 runs no dependency
# install scripts unless allowed; the `node` package needs its preinstall (it installs the
# platform's node binary package from the registry), so that one is allowed by name.
install_node_tools() {
    command -v npm >/dev/null 2>&1 || apt_install npm
    local dir=target/third-party
    mkdir -p "$dir"
    local manifest="$dir/package.json"
    local wanted
    wanted=$(cat <<EOF
{
  "private": true,
  "description": "third-party MCP clients for toolwall's tests (scripts/install-test-deps.sh)",
  "dependencies": {
    "node": "$NODE22_VERSION",
    "@modelcontextprotocol/conformance": "$CONFORMANCE_VERSION",
    "@modelcontextprotocol/inspector": "$INSPECTOR_VERSION",
    "@modelcontextprotocol/server-filesystem": "$FS_SERVER_VERSION",
    "@modelcontextprotocol/server-everything": "$EVERYTHING_SERVER_VERSION"
  },
  "allowScripts": {
    "node": true
  }
}
EOF
)
    local bin="$dir/node_modules/.bin"
    if [ -f "$manifest" ] && [ "$(cat "$manifest")" = "$wanted" ] \
        && [ "$("$bin/node" --version 2>/dev/null)" = "v$NODE22_VERSION" ] \
        && [ -x "$bin/conformance" ] && [ -x "$bin/mcp-inspector" ] \
        && [ -x "$bin/mcp-server-filesystem" ] && [ -x "$bin/mcp-server-everything" ]; then
        echo "node $NODE22_VERSION, conformance $CONFORMANCE_VERSION, inspector $INSPECTOR_VERSION, server-filesystem $FS_SERVER_VERSION, server-everything $EVERYTHING_SERVER_VERSION already installed in $dir"
        return
    fi
    printf '%s\n' "$wanted" >"$manifest"
    rm -f "$dir/package-lock.json"
    npm install --prefix "$dir" --no-audit --no-fund --loglevel=error
    local got
    got=$("$bin/node" --version)
    if [ "$got" != "v$NODE22_VERSION" ]; then
        echo "expected node v$NODE22_VERSION in $bin, got $got" >&2
        exit 1
    fi
    echo "node $got, conformance $CONFORMANCE_VERSION, inspector $INSPECTOR_VERSION, server-filesystem $FS_SERVER_VERSION, server-everything $EVERYTHING_SERVER_VERSION installed in $dir"
}

parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(systemd python3 python node)

# Tests run this from several processes at once: one installer at a time.
mkdir -p target
exec 9>target/.install-test-deps.lock
flock 9

for part in "${parts[@]}"; do
    case "$part" in
        debian)
            install_systemd
            install_python3
            ;;
        systemd) install_systemd ;;
        python3) install_python3 ;;
        python) install_python_sdk ;;
        node) install_node_tools ;;
        *)
            echo "unknown part $part (expected systemd, python3, python, node or debian)" >&2
            exit 2
            ;;
    esac
done
