"""An MCP client built on the official Python SDK (PyPI `mcp`), for tests/relay_sdk.rs: it
calls a tool of the SDK relay fixture (tests/fixtures/sdk_relay_server.py) through toolwall
and prints one JSON object on stdout with what its callbacks saw. Any failure is a non-zero
exit with the traceback on stderr.

    sdk_relay_client.py http URL TOKEN legacy|2026-07-28 SERVER SCENARIO
    sdk_relay_client.py stdio TOOLWALL_BIN CONFIG SERVER SCENARIO
    sdk_relay_client.py relay RELAY_BIN SOCKET SERVER SCENARIO   (toolwall-relay, framed unix)

Scenarios: count (progress and log messages), greet (an elicitation the user accepts),
direct (the same asked with ctx.elicit, which the SDK sends to 2025 sessions only),
decline (one the user declines), nocap (a client without the elicitation capability),
sample (sampling), roots (roots/list), cancel (a call abandoned after 1.5 s), approve and
deny (the `note` tool, which an ask rule holds for the human at the client: the question
is answered yes or no), operator (the same without the elicitation capability), late (the
`impatient` tool, whose question the user answers only after 8 s, long after the server
answered the call without it), where (a parameter that travels as a header too),
complete (completion of the `greet` prompt; legacy session).
"""

import json
import sys

import anyio
import mcp.types as types
from mcp import ClientSession, StdioServerParameters
from mcp.client.client import Client
from mcp.shared.exceptions import MCPError
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

TOOLS = {"count": ("count", {"n": 3}), "greet": ("greet", {}), "decline": ("greet", {}),
         "direct": ("ask", {}),
         "nocap": ("greet", {}), "sample": ("sample", {}), "roots": ("roots", {}),
         "cancel": ("wait", {"secs": 30}), "approve": ("note", {"text": "from the client"}),
         "deny": ("note", {"text": "from the client"}),
         "operator": ("note", {"text": "from the client"}),
         "late": ("impatient", {}), "where": ("where", {"region": "Zürich west"})}


class Seen:
    def __init__(self, scenario):
        self.scenario = scenario
        self.out = {"progress": [], "logs": [], "elicited": [], "sampled": 0, "roots_asked": 0}

    async def progress(self, p, total, message):
        self.out["progress"].append([p, total, message])

    async def log(self, params):
        self.out["logs"].append(params.data)

    async def elicit(self, context, params):
        self.out["elicited"].append(params.message)
        if params.message.startswith("toolwall asks"):
            return types.ElicitResult(action="accept",
                                      content={"approve": self.scenario == "approve"})
        if self.scenario == "decline":
            return types.ElicitResult(action="decline")
        if self.scenario == "late":
            await anyio.sleep(8)
        return types.ElicitResult(action="accept", content={"name": "Ada"})

    async def sample(self, context, params):
        self.out["sampled"] += 1
        return types.CreateMessageResult(role="assistant", model="test-model",
                                         content=types.TextContent(type="text", text="hi there"))

    async def roots(self, context):
        self.out["roots_asked"] += 1
        return types.ListRootsResult(roots=[types.Root(uri="file:///work/project")])

    def callbacks(self):
        cb = {"logging_callback": self.log}
        if self.scenario not in ("nocap", "operator"):
            cb["elicitation_callback"] = self.elicit
        if self.scenario == "sample":
            cb["sampling_callback"] = self.sample
        if self.scenario == "roots":
            cb["list_roots_callback"] = self.roots
        return cb


async def call(do_call, seen, tool, args):
    if seen.scenario == "cancel":
        with anyio.move_on_after(1.5):
            await do_call(tool, args, progress_callback=seen.progress)
        seen.out["cancelled"] = True
        # Give the cancellation time to travel before the session closes.
        await anyio.sleep(1.0)
        return
    try:
        result = await do_call(tool, args, progress_callback=seen.progress)
    except MCPError as e:
        # A JSON-RPC error answer (a 2026-07-28 server's -32021, say).
        seen.out["error"] = {"code": e.code, "message": e.message, "data": e.data}
        return
    seen.out["is_error"] = bool(result.is_error)
    seen.out["texts"] = [c.text for c in result.content if getattr(c, "type", None) == "text"]


async def over_session(read, write, seen, tool, args):
    async with ClientSession(read, write, **seen.callbacks()) as session:
        await session.initialize()
        await session.set_logging_level("info")
        await call(session.call_tool, seen, tool, args)


async def complete(session, seen, server):
    """The server's completions of the `greet` prompt, asked by the name agents see; and
    whether toolwall declares what the server offers (completions; resources.subscribe is
    not declared on the HTTP door, which has no standing stream for the updates)."""
    caps = session.initialize_result.capabilities
    seen.out["completions_declared"] = caps.completions is not None
    seen.out["subscribe_declared"] = bool(caps.resources and caps.resources.subscribe)
    ref = types.PromptReference(type="ref/prompt", name=f"{server}__greet")
    r = await session.complete(ref, {"name": "name", "value": "A"})
    seen.out["completions"] = list(r.completion.values)


async def http(url, token, mode, server, scenario):
    seen = Seen(scenario)
    if scenario == "complete":
        headers = {} if token == "-" else {"Authorization": f"Bearer {token}"}
        async with create_mcp_http_client(headers=headers) as http_client:
            transport = streamable_http_client(url, http_client=http_client)
            async with transport as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    await complete(session, seen, server)
        return seen.out
    tool, args = TOOLS[scenario]
    headers = {} if token == "-" else {"Authorization": f"Bearer {token}"}
    async with create_mcp_http_client(headers=headers) as http_client:
        transport = streamable_http_client(url, http_client=http_client)
        if mode == "legacy":
            async with transport as (read, write):
                await over_session(read, write, seen, f"{server}__{tool}", args)
        else:
            async with Client(transport, mode=mode, log_level="info", **seen.callbacks()) as client:
                await call(client.call_tool, seen, f"{server}__{tool}", args)
    return seen.out


async def stdio(binary, config, server, scenario, relay=False):
    seen = Seen(scenario)
    tool, args = TOOLS[scenario]
    if relay:
        params = StdioServerParameters(command=binary, args=["--connect", f"unix:{config}"])
    else:
        params = StdioServerParameters(command=binary, args=["stdio", "--config", config])
    async with stdio_client(params) as (read, write):
        await over_session(read, write, seen, f"{server}__{tool}", args)
    return seen.out


def main(argv):
    if len(argv) == 7 and argv[1] == "http":
        out = anyio.run(http, *argv[2:])
    elif len(argv) == 6 and argv[1] in ("stdio", "relay"):
        out = anyio.run(stdio, *argv[2:], argv[1] == "relay")
    else:
        print(__doc__, file=sys.stderr)
        return 2
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
