#!/usr/bin/env python3
"""One call in flight to the official MCP Python SDK's server over Streamable HTTP, per era:
directly, and through toolwall's HTTP door (toolwall speaking the same era to the server).

    target/mcp-venv/bin/python benches/sdk_http.py --toolwall target/release/toolwall \
        [--calls 2000] [--rounds 3] [--json]

The SDK server is tests/fixtures/sdk_server.py (installed by scripts/install-test-deps.sh
python); the tool called is `shout` with a text unique to each call, and every answer is
checked to hold it. The client is this script (http.client, keep-alive, one connection per
path), the same for every row; rows are interleaved per round. It reports, never asserts, a
time. `--json` runs the SDK server in its JSON-response mode (default: SSE answers)."""

import argparse
import http.client
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LEGACY = "2025-11-25"
MODERN = "2026-07-28"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_port(port, what, patience=30):
    deadline = time.time() + patience
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.time() > deadline:
                sys.exit(f"{what} never listened on {port}")
            time.sleep(0.05)


def first_message(resp, body):
    """The JSON-RPC message of an answer: a JSON body, or the first SSE `data:` event."""
    ctype = resp.getheader("Content-Type", "")
    if ctype.startswith("text/event-stream"):
        for line in body.decode().splitlines():
            if line.startswith("data:"):
                return json.loads(line[5:])
        raise RuntimeError(f"no data in the event stream: {body[:200]!r}")
    return json.loads(body)


class Client:
    """One keep-alive connection to one MCP endpoint, in one era."""

    def __init__(self, port, era, token=None):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.era = era
        self.token = token
        self.session = None
        self.next_id = 1

    def post(self, method, params=None, notification=False, name=None):
        msg = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        if not notification:
            msg["id"] = self.next_id
            self.next_id += 1
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
        }
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if self.era == MODERN:
            headers["MCP-Protocol-Version"] = MODERN
            headers["Mcp-Method"] = method
            if name:
                headers["Mcp-Name"] = name
            p = msg.setdefault("params", {})
            p.setdefault("_meta", {}).update(
                {
                    "io.modelcontextprotocol/protocolVersion": MODERN,
                    "io.modelcontextprotocol/clientCapabilities": {},
                    "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "1"},
                }
            )
        elif self.session:
            headers["Mcp-Session-Id"] = self.session
            headers["MCP-Protocol-Version"] = LEGACY
        self.conn.request("POST", "/mcp", json.dumps(msg), headers)
        resp = self.conn.getresponse()
        body = resp.read()
        if resp.getheader("Mcp-Session-Id"):
            self.session = resp.getheader("Mcp-Session-Id")
        if notification:
            return None
        if resp.status != 200:
            raise RuntimeError(f"{method}: HTTP {resp.status}: {body[:300]!r}")
        return first_message(resp, body)

    def open(self):
        if self.era == LEGACY:
            self.post(
                "initialize",
                {
                    "protocolVersion": LEGACY,
                    "capabilities": {},
                    "clientInfo": {"name": "bench", "version": "1"},
                },
            )
            self.post("notifications/initialized", notification=True)

    def shout(self, tool, n):
        text = f"call {n} of the bench {os.getpid()}"
        m = self.post(
            "tools/call", {"name": tool, "arguments": {"text": text}}, name=tool
        )
        got = m.get("result", {}).get("content", [{}])[0].get("text")
        if got != text.upper():
            raise RuntimeError(f"{tool}: wrong answer {json.dumps(m)[:300]}")


def toolwall_config(d, http_port, sdk_ports):
    # One SDK server per era: toolwall holds the tools of a second server at one address.
    url_l, url_m = (f"http://127.0.0.1:{p}/mcp" for p in sdk_ports)
    return f"""[listen]
http = "127.0.0.1:{http_port}"

[ledger]
path = "{d}/state/ledger.db"

[admin]
socket = "{d}/admin.sock"

[servers.sdkl]
url = "{url_l}"
era = "legacy"

[servers.sdkm]
url = "{url_m}"
era = "modern"
"""


class Toolwall:
    def __init__(self, binary, sdk_ports):
        self.dir = tempfile.TemporaryDirectory(prefix="toolwall-sdk-bench")
        d = self.dir.name
        self.port = free_port()
        self.config = os.path.join(d, "toolwall.toml")
        with open(self.config, "w") as f:
            f.write(toolwall_config(d, self.port, sdk_ports))
        out = subprocess.run(
            [binary, "token", "create", "--principal", "bench", "--config", self.config],
            cwd=d,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        self.token = re.search(r"twt_\S+", out).group(0)
        self.proc = subprocess.Popen(
            [binary, "serve", "--config", self.config],
            cwd=d,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(d, "stderr.log"), "w"),
        )
        wait_port(self.port, "toolwall's HTTP door")
        # Both servers' tools listed (their eras agreed).
        c = Client(self.port, LEGACY, self.token)
        c.open()
        deadline = time.time() + 30
        while True:
            names = {t["name"] for t in c.post("tools/list", {})["result"]["tools"]}
            if {"sdkl__shout", "sdkm__shout"} <= names:
                break
            if time.time() > deadline:
                sys.exit(f"toolwall never listed the SDK's tools: {sorted(names)}")
            time.sleep(0.1)

    @staticmethod
    def start(binary, sdk_ports):
        """Started, or stopped again before the error goes up."""
        tw = Toolwall.__new__(Toolwall)
        try:
            tw.__init__(binary, sdk_ports)
        except BaseException:
            if getattr(tw, "proc", None):
                tw.proc.kill()
                tw.proc.wait()
            raise
        return tw

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.dir.cleanup()


def run(client, tool, calls):
    client.open()
    for n in range(min(200, calls)):  # warm-up
        client.shout(tool, n)
    lat = []
    for n in range(calls):
        t = time.perf_counter()
        client.shout(tool, n)
        lat.append((time.perf_counter() - t) * 1e6)
    lat.sort()
    return lat


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--toolwall", required=True, help="the toolwall binary")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="SDK server answers JSON, not SSE")
    ap.add_argument("--only", choices=["direct", "toolwall"], help="run one path only")
    a = ap.parse_args()
    flags = ["--json"] if a.json else []
    sdk_ports = (free_port(), free_port())
    sdks = [
        subprocess.Popen(
            [sys.executable, os.path.join(ROOT, "tests/fixtures/sdk_server.py"), str(p)]
            + flags,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for p in sdk_ports
    ]
    tw = None
    try:
        for p in sdk_ports:
            wait_port(p, "the SDK server")
        tw = Toolwall.start(a.toolwall, sdk_ports)
        paths = [
            ("direct", LEGACY, lambda e: Client(sdk_ports[0], e), "shout"),
            ("toolwall", LEGACY, lambda e: Client(tw.port, e, tw.token), "sdkl__shout"),
            ("direct", MODERN, lambda e: Client(sdk_ports[1], e), "shout"),
            ("toolwall", MODERN, lambda e: Client(tw.port, e, tw.token), "sdkm__shout"),
        ]
        paths = [p for p in paths if a.only in (None, p[0])]
        print(f"load average {os.getloadavg()[0]:.2f}; SDK answers {'JSON' if a.json else 'SSE'}")
        print("| round | path | era | p50 µs | p90 µs | p99 µs | calls |")
        print("|---|---|---|---:|---:|---:|---:|")
        p50s = {}
        for r in range(a.rounds):
            for path, era, make, tool in paths:
                lat = run(make(era), tool, a.calls)
                q = statistics.quantiles(lat, n=100)
                p50s.setdefault((path, era), []).append(q[49])
                print(
                    f"| {r + 1} | {path} | {era} | {q[49]:.0f} | {q[89]:.0f} | {q[98]:.0f} | {len(lat)} |",
                    flush=True,
                )
        for era in (LEGACY, MODERN) if a.only is None else ():
            d = statistics.median(p50s[("direct", era)])
            t = statistics.median(p50s[("toolwall", era)])
            print(f"era {era}: median p50 direct {d:.0f} µs, through toolwall {t:.0f} µs "
                  f"(+{t - d:.0f} µs, {t / d:.2f}x)")
    finally:
        if tw:
            tw.stop()
        for sdk in sdks:
            sdk.kill()
            sdk.wait()


if __name__ == "__main__":
    main()
