#!/usr/bin/env bash
# Checks the unit files with `systemd-analyze verify`: no warning, no error.
#
# verify insists that ExecStart's binary exists, and /usr/bin/toolwall is not installed on
# a build machine; so the units are checked in a temporary copy whose ExecStart points at
# the binary just built (TOOLWALL_BIN, else target/release/toolwall, else
# target/debug/toolwall, built if missing). Nothing else in the copy changes.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v systemd-analyze >/dev/null || {
    echo "verify.sh: systemd-analyze not found (Debian/Ubuntu package: systemd)" >&2
    exit 1
}

bin="${TOOLWALL_BIN:-}"
if [[ -z "$bin" ]]; then
    for candidate in target/release/toolwall target/debug/toolwall; do
        if [[ -x "$candidate" ]]; then bin="$candidate"; break; fi
    done
fi
if [[ -z "$bin" ]]; then
    cargo build --quiet --bin toolwall
    bin=target/debug/toolwall
fi
bin="$(realpath "$bin")"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
units=()
for unit in systemd/*.service systemd/*.socket; do
    cp "$unit" "$work/"
    units+=("$work/$(basename "$unit")")
done
service="$work/toolwall.service"
sed -i "s#^ExecStart=/usr/bin/toolwall #ExecStart=$bin #" "$service"
if [[ "$(grep -c "^ExecStart=$bin " "$service")" != 1 ]]; then
    echo "verify.sh: toolwall.service must have exactly one ExecStart=/usr/bin/toolwall line" >&2
    exit 1
fi
if diff <(grep -v '^ExecStart=' systemd/toolwall.service) <(grep -v '^ExecStart=' "$service") >/dev/null; then :; else
    echo "verify.sh: the copy differs from systemd/toolwall.service beyond ExecStart" >&2
    exit 1
fi

status=0
output="$(systemd-analyze verify --man=no "${units[@]}" 2>&1)" || status=$?
if [[ $status -ne 0 || -n "$output" ]]; then
    echo "systemd-analyze verify found problems (exit $status):" >&2
    echo "$output" >&2
    exit 1
fi
echo "systemd-analyze verify: ${#units[@]} units clean"
