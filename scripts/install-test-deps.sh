#!/usr/bin/env bash
# Everything the test suite needs beyond the Rust toolchain, with pinned versions.
# Idempotent: safe to run again.
#
# - python3 (3.10 or newer) with venv: runs the aggregator's test upstreams
#   (tests/fixtures/upstream.py uses the standard library only).
# - The official MCP Python SDK (PyPI `mcp`, and everything it pulls in, pinned in
#   tests/fixtures/sdk-requirements.txt) in a venv at target/mcp-venv: a server nobody
#   here wrote, for tests/aggregator.rs.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=target/mcp-venv
REQUIREMENTS=tests/fixtures/sdk-requirements.txt

if ! command -v python3 >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1; then
        apt-get update -q && apt-get install -y -q python3 python3-venv
    else
        echo "python3 is required for the aggregator tests" >&2
        exit 1
    fi
fi

stamp="$VENV/.requirements"
if [ -x "$VENV/bin/python" ] && [ -f "$stamp" ] && cmp -s "$stamp" "$REQUIREMENTS"; then
    echo "MCP Python SDK already installed in $VENV"
    exit 0
fi
mkdir -p target
python3 -m venv "$VENV"
"$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$REQUIREMENTS"
cp "$REQUIREMENTS" "$stamp"
"$VENV/bin/python" -c 'import mcp.server.mcpserver, importlib.metadata as m; print("MCP Python SDK", m.version("mcp"), "installed in '"$VENV"'")'
