"""An MCP client built on the official Python SDK (PyPI `mcp`), for tests/hostile_upstream.rs:
it reads every listing through toolwall (`toolwall-relay` on the framed unix door) with the
SDK's own methods, which validate each answer against the SDK's pydantic models, and prints
one JSON object: per listing, the names (or URIs) it got, or the error the SDK raised.

    sdk_lists.py RELAY_BIN SOCKET
"""

import json
import sys

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import PaginatedRequestParams


async def all_pages(method, field, key):
    names, cursor = [], None
    while True:
        params = PaginatedRequestParams(cursor=cursor) if cursor else None
        result = await method(params=params)
        names.extend(getattr(item, key) for item in getattr(result, field))
        cursor = result.next_cursor
        if not cursor:
            return names


async def main(relay, socket):
    params = StdioServerParameters(command=relay, args=["--connect", f"unix:{socket}"])
    out = {}
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            for label, method, field, key in [
                ("tools", session.list_tools, "tools", "name"),
                ("prompts", session.list_prompts, "prompts", "name"),
                ("resources", session.list_resources, "resources", "uri"),
                ("templates", session.list_resource_templates, "resource_templates",
                 "uri_template"),
            ]:
                try:
                    out[label] = {"names": [str(n) for n in await all_pages(method, field, key)]}
                except Exception as e:  # the SDK refused the answer: say why
                    out[label] = {"error": f"{type(e).__name__}: {e}"[:4000]}
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    print(json.dumps(anyio.run(main, sys.argv[1], sys.argv[2])))
