#!/usr/bin/env bash
# Builds toolwall and installs it as a system service:
#   binary       PREFIX/bin/toolwall                (PREFIX defaults to /usr)
#   units        /etc/systemd/system/toolwall{.service,.socket,-vsock.socket,-http.socket}
#   users        toolwall and toolwall-agent (sysusers.d/toolwall.conf), if missing
#   config       /etc/toolwall/toolwall.toml from examples/toolwall.toml, if missing
# then reloads systemd, enables the unix door (systemctl enable --now toolwall.socket) and
# restarts the service if it runs (an upgrade).
#
# Usage: systemd/install.sh [--prefix DIR] [--dry-run]
#   --dry-run   print every action and change nothing (no build either)
set -euo pipefail
self="$(realpath "${BASH_SOURCE[0]}")"
cd "$(dirname "$self")/.."

prefix=/usr
dry_run=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --prefix)
            [[ $# -ge 2 && -n "$2" ]] || { echo "install.sh: --prefix needs a directory" >&2; exit 2; }
            prefix="$2"
            shift 2
            ;;
        --prefix=*)
            prefix="${1#--prefix=}"
            shift
            ;;
        --dry-run)
            dry_run=1
            shift
            ;;
        -h | --help)
            sed -n '2,11p' "$self" | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "install.sh: unknown argument $1 (try --help)" >&2
            exit 2
            ;;
    esac
done
[[ "$prefix" == /* ]] || { echo "install.sh: --prefix must be an absolute path, not $prefix" >&2; exit 2; }
prefix="${prefix%/}"
[[ -n "$prefix" ]] || prefix=/

user=toolwall
bin_dir="$prefix/bin"
binary="$bin_dir/toolwall"
unit_dir=/etc/systemd/system
sysusers_file=/etc/sysusers.d/toolwall.conf
config_dir=/etc/toolwall
config="$config_dir/toolwall.toml"
units=(toolwall.service toolwall.socket toolwall-vsock.socket toolwall-http.socket)

# Runs a command, or in a dry run only shows it.
run() {
    if [[ $dry_run -eq 1 ]]; then
        echo "would run: $*"
    else
        echo "+ $*"
        "$@"
    fi
}

note() {
    echo "-- $*"
}

if [[ $dry_run -eq 0 && $(id -u) -ne 0 ]]; then
    echo "install.sh: run as root (or try --dry-run)" >&2
    exit 1
fi

# 1. Build.
run cargo build --release --locked --bin toolwall

# 2. The binary.
run install -D -m 0755 target/release/toolwall "$binary"

# 3. The service user and group.
run install -D -m 0644 systemd/toolwall.sysusers "$sysusers_file"
if getent passwd "$user" >/dev/null; then
    note "user $user exists"
elif command -v systemd-sysusers >/dev/null; then
    run systemd-sysusers "$sysusers_file"
else
    run useradd --system --user-group --home-dir /var/lib/toolwall --no-create-home \
        --shell /usr/sbin/nologin --comment "toolwall MCP firewall" "$user"
fi
# The agent user: workspace commands run as it (never as toolwall or root).
agent_user=toolwall-agent
if getent passwd "$agent_user" >/dev/null; then
    note "user $agent_user exists"
elif command -v systemd-sysusers >/dev/null; then
    run systemd-sysusers "$sysusers_file"
else
    run useradd --system --user-group --home-dir /nonexistent --no-create-home \
        --shell /usr/sbin/nologin --comment "toolwall agent programs" "$agent_user"
fi

# 4. The units; ExecStart follows the prefix.
for unit in "${units[@]}"; do
    if [[ "$unit" == toolwall.service && "$binary" != /usr/bin/toolwall ]]; then
        if [[ $dry_run -eq 1 ]]; then
            echo "would run: install -D -m 0644 systemd/$unit $unit_dir/$unit (with ExecStart=$binary ...)"
        else
            staged="$(mktemp)"
            sed "s#^ExecStart=/usr/bin/toolwall #ExecStart=$binary #" "systemd/$unit" >"$staged"
            run install -D -m 0644 "$staged" "$unit_dir/$unit"
            rm -f "$staged"
        fi
    else
        run install -D -m 0644 "systemd/$unit" "$unit_dir/$unit"
    fi
done

# 5. The config, never overwritten. Readable by the service's group, writable by root only.
if [[ -e "$config" ]]; then
    note "keeping the existing $config"
else
    run install -d -m 0755 "$config_dir"
    run install -m 0640 -o root -g "$user" examples/toolwall.toml "$config"
fi

# 6. Start the unix door; the first connection starts the service. A running service (an
# upgrade) restarts on the new binary, draining its calls first.
run systemctl daemon-reload
run systemctl enable --now toolwall.socket
run systemctl try-restart toolwall.service
if [[ $dry_run -eq 1 ]]; then
    note "dry run: nothing was changed"
else
    note "installed. Check: systemctl status toolwall.socket; agents in group $user connect to /run/toolwall/mcp.sock"
fi
note "guest VMs: systemctl enable --now toolwall-vsock.socket; HTTP door: systemctl enable --now toolwall-http.socket"
