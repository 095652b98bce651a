#!/usr/bin/env bash
# Runs the walls tests (tests/walls.rs) with every gateway started as a non-root service
# user that holds only what systemd/toolwall.service grants (CAP_SETUID, CAP_SETGID and
# CAP_SETPCAP, ambient; setpriv stands in for systemd), the way the shipped unit runs it.
# `cargo test` runs the same tests with the gateway as the calling user (root in CI), and
# tests/service_user.rs covers the service user's own cases (capabilities dropped, no
# capabilities at all). Needs root: it creates the user and starts the gateways under it.
#
# Usage: tests/walls-as-service-user.sh [cargo test arguments...]
#   TOOLWALL_TEST_SERVICE_USER  the service user (default toolwall-test-svc; created when
#                               missing)
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "$(id -u)" != 0 ]]; then
    echo "walls-as-service-user.sh: run as root (it creates the service user and starts gateways as it)" >&2
    exit 1
fi
command -v setpriv >/dev/null || {
    echo "walls-as-service-user.sh: setpriv not found (Debian/Ubuntu package: util-linux)" >&2
    exit 1
}
export TOOLWALL_TEST_SERVICE_USER="${TOOLWALL_TEST_SERVICE_USER:-toolwall-test-svc}"
echo "walls tests with the gateway as service user $TOOLWALL_TEST_SERVICE_USER"
cargo test --test walls "$@"
