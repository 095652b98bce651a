#!/usr/bin/env bash
# Everything the test suite needs beyond the Rust toolchain, with pinned versions where a
# registry serves them. Idempotent: safe to run again; installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
# systemd-analyze (unit verification, security score) and systemd-socket-activate.
command -v systemd-analyze >/dev/null 2>&1 || need_apt+=(systemd)
command -v systemd-socket-activate >/dev/null 2>&1 || need_apt+=(systemd)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing Debian packages: ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  $sudo_cmd apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi
