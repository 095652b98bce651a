#!/usr/bin/env bash
# Runs the shipped units under a real service manager: a private systemd booted as PID 1 of
# new pid, mount, network, uts, ipc and cgroup namespaces, with the built binary. Checks
# socket activation (names, group access to the unix door), READY and STATUS, the workers'
# confinement under the unit's sandbox, a workspace command running as the agent user with
# the gateway holding no capability, reload, the watchdog (pings, and a restart when the
# loop hangs), stop (exit 0, nothing left behind) and activation again after a stop.
#
# Usage: systemd/test-under-systemd.sh [--bin PATH] [--relay PATH]
#   defaults: target/debug/toolwall and target/debug/toolwall-relay (built when missing)
#
# Needs root, util-linux (unshare, nsenter, setpriv), systemd and overlayfs. Changes nothing
# outside its work directory (under target/): inside the namespaces /etc is an overlay and
# /run, /var/lib and /tmp are fresh tmpfs mounts, all gone when the test ends.
set -euo pipefail
self="$(realpath "${BASH_SOURCE[0]}")"
cd "$(dirname "$self")/.."

bin=""
relay=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --bin) bin="$2"; shift 2 ;;
        --relay) relay="$2"; shift 2 ;;
        -h | --help) sed -n '2,14p' "$self" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "test-under-systemd.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

fail() {
    echo "FAIL: $*" >&2
    if [[ -s "${work:-}/boot.log" ]]; then cat "$work/boot.log" >&2; fi
    keep_work=1
    exit 1
}
[[ $(id -u) -eq 0 ]] || fail "needs root (it boots systemd in new namespaces)"
for tool in unshare nsenter setpriv; do
    command -v "$tool" >/dev/null || fail "$tool not found (package util-linux)"
done
pid1_bin=/lib/systemd/systemd
[[ -x "$pid1_bin" ]] || fail "$pid1_bin not found (package systemd)"

if [[ -z "$bin" || -z "$relay" ]]; then
    [[ -x target/debug/toolwall && -x target/debug/toolwall-relay ]] ||
        cargo build --quiet --bin toolwall -p toolwall-relay
    bin="${bin:-target/debug/toolwall}"
    relay="${relay:-target/debug/toolwall-relay}"
fi

work="$(realpath target)/systemd-ns.$$"
# The service runs with PrivateTmp= (and /tmp is a fresh tmpfs inside the namespaces): a
# checkout under /tmp or /var/tmp (a fresh clone there) would hide its own binaries from the
# service, which then never starts. Its work directory goes to /opt instead (read-only to
# the service under ProtectSystem=strict, which is all it needs).
if [[ "$work" == /tmp/* || "$work" == /var/tmp/* ]]; then
    work="/opt/toolwall-systemd-ns.$$"
fi
rm -rf "$work"
mkdir -p "$work/units" "$work/etc-upper" "$work/etc-work"
# Copies, so a rebuild during the test changes nothing.
cp "$bin" "$work/toolwall"
cp "$relay" "$work/toolwall-relay"
vsock_port=$((20000 + $$ % 20000))

# The units as installed, but ExecStart on the copy, a vsock port of this run, output to a
# file (no journald here) and a short watchdog so the test is quick.
for unit in systemd/*.service systemd/*.socket; do
    sed -e "s#^ExecStart=/usr/bin/toolwall #ExecStart=$work/toolwall #" \
        -e "s#^ListenStream=vsock::5002#ListenStream=vsock::$vsock_port#" \
        "$unit" >"$work/units/$(basename "$unit")"
done
mkdir -p "$work/units/toolwall.service.d"
cat >"$work/units/toolwall.service.d/test.conf" <<EOF
[Service]
StandardOutput=append:/run/toolwall-test.log
StandardError=append:/run/toolwall-test.log
WatchdogSec=4s
ReadWritePaths=/var/lib/toolwall-ws
EOF
cat >"$work/units/test.target" <<EOF
[Unit]
Description=toolwall test target
EOF
sed -e "s/^vsock = 5002/vsock = $vsock_port/" examples/toolwall.toml >"$work/toolwall.toml"
# One workspace, its root given to the agent user (as an operator must).
cat >>"$work/toolwall.toml" <<EOF

[workspaces.test]
root = "/var/lib/toolwall-ws"
owners = ["uid:*"]
EOF

# PID 1's side: a private view of the system, then systemd itself.
cat >"$work/boot.sh" <<EOF
#!/bin/bash
set -e
mount --make-rprivate /
mount -t overlay overlay -o lowerdir=/etc,upperdir=$work/etc-upper,workdir=$work/etc-work /etc
mount -t tmpfs tmpfs /etc/systemd/system
cp -r $work/units/. /etc/systemd/system/
mkdir -p /etc/toolwall
cp $work/toolwall.toml /etc/toolwall/toolwall.toml
getent group toolwall >/dev/null || groupadd --system toolwall
getent passwd toolwall >/dev/null || useradd --system -g toolwall -M -d /var/lib/toolwall -s /usr/sbin/nologin toolwall
getent passwd tw-agent >/dev/null || useradd -M -G toolwall tw-agent
getent passwd tw-outsider >/dev/null || useradd -M tw-outsider
getent passwd toolwall-agent >/dev/null || useradd --system --user-group -M -d /nonexistent -s /usr/sbin/nologin toolwall-agent
chgrp toolwall /etc/toolwall/toolwall.toml
chmod 0640 /etc/toolwall/toolwall.toml
mount -t tmpfs tmpfs /var/lib
mkdir -p /var/lib/toolwall-ws
chown toolwall-agent: /var/lib/toolwall-ws
mount -t tmpfs tmpfs /run
mkdir -p /run/systemd/system
umount -l /sys/fs/cgroup 2>/dev/null || true
mount -t cgroup2 cgroup2 /sys/fs/cgroup
exec 3>>$work/pid1.log
mount -t tmpfs tmpfs /tmp
export container=other
exec $pid1_bin --system --unit=test.target --log-target=console --log-level=notice </dev/null >&3 2>&3
EOF
chmod +x "$work/boot.sh"

unshare --pid --fork --kill-child --mount --uts --ipc --net --cgroup "$work/boot.sh" \
    2>>"$work/boot.log" &
unshare_pid=$!
pid1=""
cleanup() {
    if [[ -n "$pid1" ]]; then kill -KILL "$pid1" 2>/dev/null || true; fi
    kill "$unshare_pid" 2>/dev/null || true
    wait "$unshare_pid" 2>/dev/null || true
    if [[ "${keep_work:-0}" == 1 ]]; then
        echo "work directory kept: $work" >&2
    else
        rm -rf "$work"
    fi
}
trap cleanup EXIT

for _ in $(seq 100); do
    pid1="$(pgrep -P "$unshare_pid" || true)"
    [[ -n "$pid1" ]] && break
    sleep 0.1
done
[[ -n "$pid1" ]] || fail "systemd did not start"
ns() { nsenter -t "$pid1" -m -p -n -u -i "$@"; }
state=""
for _ in $(seq 300); do
    state="$(ns systemctl is-system-running 2>/dev/null || true)"
    [[ "$state" == running || "$state" == degraded ]] && break
    sleep 0.1
done
[[ "$state" == running || "$state" == degraded ]] || fail "systemd did not come up (state: $state)"
show() { ns systemctl show -p "$2" --value "$1"; }
log() { ns cat /run/toolwall-test.log 2>/dev/null || true; }
check() {
    local what="$1"
    shift
    if "$@"; then echo "ok: $what"; else
        echo "--- toolwall log" >&2
        log >&2
        fail "$what"
    fi
}

# 1. The doors. A host without vsock runs the rest without that door.
ns systemctl start toolwall.socket toolwall-http.socket
if ! ns systemctl start toolwall-vsock.socket 2>/dev/null; then
    echo "note: vsock cannot listen here; testing without the vsock door"
    ns sed -i '/^vsock = /d' /etc/toolwall/toolwall.toml
fi
check "the service waits for its first connection" [ "$(show toolwall.service ActiveState)" = inactive ]
check "the unix door is root:toolwall 0660" \
    [ "$(ns stat -c '%U:%G %a' /run/toolwall/mcp.sock)" = "root:toolwall 660" ]

# 2. An agent in group toolwall, through the relay.
requests='{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}
{"jsonrpc":"2.0","method":"notifications/initialized"}
{"jsonrpc":"2.0","id":2,"method":"tools/list"}
{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"local__echo","arguments":{"text":"through systemd"}}}'
agent() {
    printf '%s\n' "$requests" | ns setpriv --reuid="$1" --regid="$1" --init-groups \
        "$work/toolwall-relay" --connect unix:/run/toolwall/mcp.sock --drain-timeout 10 2>/dev/null
}
answers="$(agent tw-agent || true)"
check "READY=1: the service is active" [ "$(show toolwall.service ActiveState)" = active ]
check "tools/list through the socket systemd passed" grep -q '"id":2,"result":{"tools":\[' <<<"$answers"
check "tools/call answered" grep -q 'through systemd' <<<"$answers"
refused() { ! grep -q '"result"' <<<"$1"; }
check "a user outside group toolwall is refused" refused "$(agent tw-outsider || true)"
procs() { ns cat /sys/fs/cgroup/system.slice/toolwall.service/cgroup.procs 2>/dev/null | wc -l; }
check "the gateway and its worker run in the unit's cgroup" [ "$(procs)" -ge 2 ]
check "STATUS= set" [ -n "$(show toolwall.service StatusText)" ]
check "the unix door came from systemd" grep -Eq 'fd [0-9]+ "mcp-unix"' <<<"$(log)"
check "the unused HTTP socket is explained" grep -q '"mcp-http".*not served' <<<"$(log)"

# 3. The workers confined themselves inside the unit's sandbox.
status="$(ns "$work/toolwall" status --config /etc/toolwall/toolwall.toml)"
check "worker ready under the unit's sandbox" grep -q 'state ready' <<<"$status"
check "Landlock fully enforced" grep -q 'fully_enforced' <<<"$status"

# 3b. Agent programs run as the agent user; only the agent launcher keeps a capability.
ws_requests='{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}
{"jsonrpc":"2.0","method":"notifications/initialized"}
{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"ws__shell_run","arguments":{"worker":"test","command":"id -un; chmod 0777 /var/lib/toolwall 2>&1; cat /var/lib/toolwall/ledger.db 2>&1 | head -c 200"}}}'
ws_answers="$(printf '%s\n' "$ws_requests" | ns setpriv --reuid=tw-agent --regid=tw-agent --init-groups \
    "$work/toolwall-relay" --connect unix:/run/toolwall/mcp.sock --drain-timeout 10 2>/dev/null || true)"
check "a workspace command runs as toolwall-agent" grep -q 'toolwall-agent\\n' <<<"$ws_answers"
check "it cannot chmod toolwall's state directory" grep -q 'Operation not permitted' <<<"$ws_answers"
check "it cannot read the ledger" grep -q 'Permission denied' <<<"$ws_answers"
check "status names the agent user" grep -q 'agent programs: run as toolwall-agent' <<<"$status"
# /proc here is the host's: find the gateway by its command line.
gateway_pid="$(pgrep -f "^$work/toolwall serve" | head -n 1)"
check "the gateway holds no capability" \
    [ "$(grep -E '^Cap(Prm|Eff|Bnd|Amb):' "/proc/$gateway_pid/status" | awk '{print $2}' | sort -u)" = 0000000000000000 ]
launcher_pid="$(pgrep -P "$gateway_pid" -f "agent-launcher" | head -n 1 || true)"
check "the agent launcher keeps CAP_SETUID, CAP_SETGID, CAP_SETPCAP only" \
    [ "$(grep -E '^CapEff:' "/proc/$launcher_pid/status" | awk '{print $2}')" = 00000000000001c0 ]

# 4. Reload.
ns systemctl reload toolwall.service
check "reload: still active, not restarted" \
    [ "$(show toolwall.service ActiveState)/$(show toolwall.service NRestarts)" = active/0 ]
check "reload logged" grep -q 'reloaded' <<<"$(log)"

# 5. Watchdog: pings every 2 s; a hung loop is killed and restarted.
first="$(show toolwall.service WatchdogTimestampMonotonic)"
sleep 5
check "watchdog pings arrive" [ "$(show toolwall.service WatchdogTimestampMonotonic)" != "$first" ]
check "still running after more than the watchdog interval" [ "$(show toolwall.service NRestarts)" = 0 ]
hung="$(show toolwall.service MainPID)"
ns kill -STOP "$hung"
for _ in $(seq 150); do
    [[ "$(show toolwall.service NRestarts)" == 1 && "$(show toolwall.service ActiveState)" == active ]] && break
    sleep 0.1
done
check "a hung loop is restarted by the watchdog" \
    [ "$(show toolwall.service NRestarts)/$(show toolwall.service ActiveState)" = 1/active ]

# 6. Stop: clean exit, nothing left, the socket stays for the next start.
ns systemctl stop toolwall.service 2>/dev/null
check "stop: exit status 0" [ "$(show toolwall.service ExecMainStatus)/$(show toolwall.service Result)" = 0/success ]
check "stop: no process left in the unit" [ "$(procs)" -eq 0 ]
check "stop: the admin socket is removed" ns test ! -e /run/toolwall/admin.sock
check "stop: the unix door stays (systemd holds it)" ns test -S /run/toolwall/mcp.sock
answers="$(agent tw-agent || true)"
check "the next connection starts it again" grep -q 'through systemd' <<<"$answers"

echo "all checks passed"
