#!/usr/bin/env python3
"""The official MCP Python SDK's stdio server (PyPI `mcp`, the venv of
`scripts/install-test-deps.sh python`) with one `echo` tool: what people actually run
behind toolwall as a local server, driven directly by the bench client (with the MCP
handshake) and, in the next door, through toolwall (`[servers.sdk] command`)."""

from mcp.server.mcpserver import MCPServer

app = MCPServer("bench-sdk-echo", version="1")


@app.tool()
def echo(text: str) -> str:
    """Echo the text."""
    return text


if __name__ == "__main__":
    app.run("stdio")
