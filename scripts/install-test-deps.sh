#!/usr/bin/env bash
# Everything the test suite needs beyond the Rust toolchain, with pinned versions where a
# registry serves them. Idempotent: safe to run again; installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

sudo_cmd=""
[ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"

# Debian packages: systemd-analyze (unit verification, security score) and
# systemd-socket-activate; python3 with venv for the aggregator's test upstreams.
install_debian_packages() {
    local need=()
    command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
    command -v systemd-socket-activate >/dev/null 2>&1 || need+=(systemd)
    command -v python3 >/dev/null 2>&1 || need+=(python3 python3-venv)
    if [ ${#need[@]} -gt 0 ]; then
        echo "installing Debian packages: ${need[*]}"
        export DEBIAN_FRONTEND=noninteractive
        $sudo_cmd apt-get update -qq
        $sudo_cmd apt-get install -y -qq --no-install-recommends "${need[@]}"
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
    mkdir -p target
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$requirements"
    cp "$requirements" "$stamp"
    "$venv/bin/python" -c 'import mcp, importlib.metadata as m; print("MCP Python SDK", m.version("mcp"), "installed")'
}

install_debian_packages
install_python_sdk
