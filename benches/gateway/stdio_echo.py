#!/usr/bin/env python3
"""A trivial MCP echo server over stdio for the benchmark: one `echo` tool, no threads,
one line in, one line out. The same process is driven directly by the bench client and,
in the next door, through toolwall as a local server (`[servers.echo] command`)."""

import json
import sys


def main():
    out = sys.stdout
    for line in sys.stdin:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        mid = msg.get("id")
        if mid is None or "method" not in msg:
            continue
        method = msg["method"]
        params = msg.get("params") or {}
        if method == "tools/call":
            text = (params.get("arguments") or {}).get("text", "")
            result = {"content": [{"type": "text", "text": text}]}
        elif method == "initialize":
            result = {"protocolVersion": params.get("protocolVersion", "2025-06-18"),
                      "capabilities": {"tools": {}},
                      "serverInfo": {"name": "bench-echo", "version": "1"}}
        elif method == "server/discover":
            result = {"supportedVersions": ["2026-07-28"], "capabilities": {"tools": {}},
                      "serverInfo": {"name": "bench-echo", "version": "1"}}
        elif method == "tools/list":
            result = {"tools": [{"name": "echo", "description": "Echo the text",
                                 "inputSchema": {"type": "object",
                                                 "properties": {"text": {"type": "string"}}}}]}
        elif method in ("resources/list", "prompts/list", "resources/templates/list"):
            key = {"resources/list": "resources", "prompts/list": "prompts",
                   "resources/templates/list": "resourceTemplates"}[method]
            result = {key: []}
        elif method == "ping":
            result = {}
        else:
            out.write(json.dumps({"jsonrpc": "2.0", "id": mid,
                                  "error": {"code": -32601, "message": "Method not found"}}) + "\n")
            out.flush()
            continue
        out.write(json.dumps({"jsonrpc": "2.0", "id": mid, "result": result}) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
