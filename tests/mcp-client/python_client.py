"""Drives toolhost's MCP server with the official Python SDK's default `Client`, for
tests/it/mcp.rs.

  python3 python_client.py MODE http  <url> <api-key>
  python3 python_client.py MODE stdio <toolhost binary> <data dir> <tenant>

MODE is the SDK's connect mode: `auto` (the newest protocol version both sides speak) or
`legacy` (the versions before 2026-07-28). Prints one JSON line per step; after "listed" it
waits for one change of the tool list (the test installs a tool meanwhile) and prints
"changed" with the new count: through `subscriptions/listen` on 2026-07-28, through
`notifications/tools/list_changed` before it. Over stdio it skips that step: only its own
process could change the catalog. With EXAMPLE_CALLS (a JSON list of [name, arguments]) it
makes those calls after "listed" instead, one "example" step each."""
import asyncio
import json
import os
import sys

import anyio
from mcp import StdioServerParameters
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


def say(step, **data):
    print(json.dumps({"step": step, **data}), flush=True)


async def main(mode, transport, *rest):
    if transport == "http":
        url, key = rest
        # The SDK's client, with its recommended timeouts (a bare one's 5 s read timeout
        # drops an idle `subscriptions/listen` stream between the server's 15 s pings).
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {key}"})
        server = streamable_http_client(url, http_client=http)
    else:
        binary, data_dir, tenant = rest
        env = {**os.environ, "TOOLHOST_DATA_DIR": data_dir, "TOOLHOST_TENANT": tenant}
        server = StdioServerParameters(command=binary, args=["mcp"], env=env)
    changed = anyio.Event()

    async def on_message(message):
        if getattr(message, "method", None) == "notifications/tools/list_changed":
            changed.set()

    async with Client(server, mode=mode, message_handler=on_message) as client:
        version = client.session.protocol_version
        say("initialized", protocol=version)
        listed = await client.list_tools()
        say("listed", names=[t.name for t in listed.tools])
        if "EXAMPLE_CALLS" in os.environ:
            for name, args in json.loads(os.environ["EXAMPLE_CALLS"]):
                result = await client.call_tool(name, args)
                say("example", name=name, result=result.model_dump(mode="json", by_alias=True, exclude_none=True))
            say("closed")
            return
        ok = await client.call_tool("text_stats", {"text": "one two three"})
        say("called", result=ok.model_dump(mode="json", by_alias=True, exclude_none=True))
        bad = await client.call_tool("text_stats", {"text": 42})
        say("bad_args", result=bad.model_dump(mode="json", by_alias=True, exclude_none=True))
        if transport == "stdio":
            pass  # stdio sees only changes made by its own process: none here
        elif version >= "2026-07-28":
            async with client.listen(tools_list_changed=True) as subscription:
                say("listening")
                with anyio.fail_after(30):
                    async for _event in subscription:
                        break
        else:
            say("listening")
            with anyio.fail_after(30):
                await changed.wait()
        if transport == "http":
            relisted = await client.list_tools()
            say("changed", count=len(relisted.tools))
    say("closed")


asyncio.run(main(*sys.argv[1:]))
