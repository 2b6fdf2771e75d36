"""The `voxmux` command: `voxmux serve [--profile NAME] [--host H] [--port P]`."""

from __future__ import annotations

import argparse
import logging
import os

import uvicorn

from app.main import create_app
from app.settings import load_settings


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="voxmux", description="VoxMux text-to-speech gateway")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="start the HTTP server")
    serve.add_argument("--profile", default=os.environ.get("VOXMUX_PROFILE"),
                       help="deployment profile: cpu, gpu or legacy-gpu (env VOXMUX_PROFILE)")
    serve.add_argument("--host", help="bind address (env VOXMUX_HOST)")
    serve.add_argument("--port", type=int, help="port (env VOXMUX_PORT)")
    args = parser.parse_args(argv)

    overrides = {k: v for k, v in {"host": args.host, "port": args.port}.items() if v is not None}
    settings = load_settings(args.profile, **overrides)
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port,
                log_level=settings.log_level, ws_max_size=1 << 20)


if __name__ == "__main__":
    main()
