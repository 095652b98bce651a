#!/usr/bin/env bash
# Fails when `systemd-analyze security --offline=yes` rates toolwall.service above the
# allowed exposure (default 2.0, on systemd's 0.0 to 10.0 scale), and prints the figure
# and every setting that still counts against it.
set -euo pipefail
cd "$(dirname "$0")/.."

max="${1:-2.0}"
unit=systemd/toolwall.service

command -v systemd-analyze >/dev/null || {
    echo "check-security.sh: systemd-analyze not found (Debian/Ubuntu package: systemd)" >&2
    exit 1
}

report="$(systemd-analyze security --offline=yes --no-pager "$unit" 2>&1)" || true
figure="$(printf '%s\n' "$report" | sed -n 's/.*Overall exposure level for [^:]*: \([0-9][0-9]*\.[0-9]\).*/\1/p' | tail -n 1)"
if [[ -z "$figure" ]]; then
    echo "check-security.sh: no exposure level in the report:" >&2
    printf '%s\n' "$report" >&2
    exit 1
fi

printf '%s\n' "$report" | grep '✗' || true
echo "exposure of $unit: $figure (allowed: $max)"

# The optional cgroup drop-in, for the record (not the unit's default; see the file).
dropin=systemd/toolwall-cgroups.conf
if [[ -f "$dropin" ]]; then
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    grep -v '^ProtectControlGroups=' "$unit" | sed '/^\[Install\]/,$d' >"$work/toolwall.service"
    grep -v '^\[Service\]' "$dropin" >>"$work/toolwall.service"
    with="$(systemd-analyze security --offline=yes --no-pager "$work/toolwall.service" 2>&1 |
        sed -n 's/.*Overall exposure level for [^:]*: \([0-9][0-9]*\.[0-9]\).*/\1/p' | tail -n 1)"
    echo "exposure with the optional $dropin: ${with:-unknown} (informational)"
fi
if awk -v got="$figure" -v max="$max" 'BEGIN { exit !(got > max) }'; then
    echo "check-security.sh: exposure $figure is above $max" >&2
    exit 1
fi
