"""Drive `benchlink mcp` as an agent host would, with the official Python
MCP SDK over stdio, and print what it saw as JSON lines on stdout for the
Rust test (tests/tests/mcp_server.rs) to check.

usage: drive.py BENCHLINK_BIN full CAPABILITY_ID
       drive.py BENCHLINK_BIN hold CAPABILITY_ID

`full`: initialize, list tools, lease the capability, snapshot, fetch the
snapshot's artifact, release; one JSON object at the end.
`hold`: initialize, lease, print {"lease_id": ...}, then wait to be killed.

The registry's URL and token come from BENCHLINK_URL / BENCHLINK_TOKEN,
passed on to the server.
"""

import asyncio
import base64
import hashlib
import json
import os
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


def emit(obj):
    print(json.dumps(obj), flush=True)


def texts(result):
    return [c.text for c in result.content if getattr(c, "type", "") == "text"]


def first_json(result):
    for t in texts(result):
        try:
            return json.loads(t)
        except ValueError:
            continue
    raise SystemExit(f"no JSON in tool result: {texts(result)}")


async def main(binary, mode, capability):
    params = StdioServerParameters(
        command=binary,
        args=["mcp"],
        env={
            "BENCHLINK_URL": os.environ["BENCHLINK_URL"],
            "BENCHLINK_TOKEN": os.environ["BENCHLINK_TOKEN"],
            "PATH": os.environ.get("PATH", ""),
        },
    )
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            tools = await session.list_tools()
            lease = await session.call_tool(
                "lease",
                {"capability_id": capability, "duration_seconds": 120,
                 "purpose": "MCP client check", "wait_seconds": 10},
            )
            if lease.is_error:
                raise SystemExit(f"lease failed: {texts(lease)}")
            lease_id = first_json(lease)["lease_id"]
            if mode == "hold":
                emit({"lease_id": lease_id})
                await asyncio.sleep(3600)
                return
            act = await session.call_tool(
                "act", {"lease_id": lease_id, "action": "snapshot", "params": {}}
            )
            session_json = first_json(act)
            artifact_id = session_json["artifact_refs"][0]
            fetched = await session.call_tool("fetch_artifact", {"artifact_id": artifact_id})
            images = [c for c in fetched.content if getattr(c, "type", "") == "image"]
            image = images[0] if images else None
            data = base64.b64decode(image.data) if image else b""
            release = await session.call_tool("release", {"lease_id": lease_id})
            emit({
                "server_name": init.server_info.name if init.server_info else None,
                "tools": sorted(t.name for t in tools.tools),
                "descriptions": {t.name: t.description for t in tools.tools},
                "lease_id": lease_id,
                "act_is_error": bool(act.is_error),
                "session_status": session_json["status"],
                "artifact_id": artifact_id,
                "image_mime": image.mime_type if image else None,
                "image_magic": data[:4].hex(),
                "image_sha256": hashlib.sha256(data).hexdigest(),
                "release_status": first_json(release)["status"],
            })


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
