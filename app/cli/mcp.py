"""`voxmux mcp`: VoxMux's MCP tools over stdio, for a desktop agent that starts it as a
subprocess (no HTTP server needed), on the speech service and job runner in this process.

stdout is the protocol's: anything else that writes to file descriptor 1 (a library's C code,
a stray print) is sent to stderr, and the protocol keeps a descriptor of its own. Jobs live in
`<VOXMUX_DATA_DIR>/mcp`, never the server's store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys

from app.cli.local import local_service
from app.jobs.runner import JobRunner
from app.protocols import mcp
from app.settings import Settings


def run(settings: Settings) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="voxmux mcp: %(levelname)s %(message)s")
    protocol = os.dup(1)
    os.dup2(2, 1)  # fd 1 now reaches stderr; the protocol writes to its own copy of stdout
    sys.stdout = os.fdopen(protocol, "w", encoding="utf-8", buffering=1)
    settings = settings.model_copy(update={"data_dir": settings.data_dir / "mcp",
                                           "outputs_dir": None})
    with contextlib.suppress(KeyboardInterrupt):  # the agent stopping it
        asyncio.run(_serve(settings))
    return 0


async def _serve(settings: Settings) -> None:
    async with local_service(settings) as service:
        runner = JobRunner(service, settings)
        await runner.start()
        try:
            await mcp.build(service, runner).run_stdio_async()
        finally:
            await runner.stop()
