#!/usr/bin/env bash
# Everything the test suite needs beyond the Rust toolchain, with pinned versions.
# Idempotent: safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "nothing beyond the Rust toolchain yet"
