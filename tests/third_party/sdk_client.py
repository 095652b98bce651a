"""An MCP client built on the official Python SDK (PyPI `mcp`), for tests/third_party_clients.rs.

It connects to toolwall, lists the tools, calls `local__echo`, and prints one JSON object on
stdout with what it saw; the Rust test asserts on that. Any failure is a non-zero exit with
the traceback on stderr.

    sdk_client.py http URL TOKEN legacy|auto|2026-07-28 TEXT
    sdk_client.py stdio TOOLWALL_BIN CONFIG TEXT

TOKEN "-" sends no Authorization header. `legacy` drives ClientSession by hand (initialize
handshake, Mcp-Session-Id); the others use the SDK's high-level Client, which in `auto`
mode tries server/discover first and in a version mode speaks that version directly.
"""

import json
import sys

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.client import Client
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

ECHO = "local__echo"


def summary(protocol_version, server_name, tools, result):
    texts = [c.text for c in result.content if getattr(c, "type", None) == "text"]
    return {
        "protocol_version": protocol_version,
        "server_name": server_name,
        "tools": sorted(t.name for t in tools.tools),
        "echo_is_error": bool(result.is_error),
        "echo_texts": texts,
    }


async def over_session(read, write, text):
    async with ClientSession(read, write) as session:
        init = await session.initialize()
        tools = await session.list_tools()
        result = await session.call_tool(ECHO, {"text": text})
        return summary(init.protocol_version, init.server_info.name, tools, result)


async def over_client(transport, mode, text):
    async with Client(transport, mode=mode) as client:
        tools = await client.list_tools()
        result = await client.call_tool(ECHO, {"text": text})
        info = client.server_info
        return summary(client.protocol_version, info.name if info else None, tools, result)


async def http(url, token, mode, text):
    headers = {} if token == "-" else {"Authorization": f"Bearer {token}"}
    async with create_mcp_http_client(headers=headers) as http_client:
        transport = streamable_http_client(url, http_client=http_client)
        if mode == "legacy":
            async with transport as (read, write):
                return await over_session(read, write, text)
        return await over_client(transport, mode, text)


async def stdio(binary, config, text):
    params = StdioServerParameters(command=binary, args=["stdio", "--config", config])
    async with stdio_client(params) as (read, write):
        return await over_session(read, write, text)


def main(argv):
    if len(argv) == 6 and argv[1] == "http":
        out = anyio.run(http, argv[2], argv[3], argv[4], argv[5])
    elif len(argv) == 5 and argv[1] == "stdio":
        out = anyio.run(stdio, argv[2], argv[3], argv[4])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
