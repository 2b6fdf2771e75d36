"""The `voxmux` command.

`voxmux serve [--profile NAME] [--host H] [--port P] [--ray | --ray-address ADDR]` starts the
server, in this process or on Ray Serve (a local cluster, or the one at ADDR);
`voxmux doctor [--profile NAME] [--json] [--strict]` checks the installation;
`voxmux say TEXT -o FILE` speaks into a file and `voxmux voices` lists the catalogue, in this
process (`app.cli.speak`); `voxmux book BOOK -o BOOK.m4b` makes an audiobook, resumably
(`app.cli.audiobook`); `voxmux mcp` serves the MCP tools over stdio (`app.cli.mcp`).
The profile comes from `--profile`, else `VOXMUX_PROFILE`, else `cpu`.
"""

from __future__ import annotations

import argparse
import importlib.util
import os

from app.cli import audiobook, speak
from app.settings import Settings, load_settings

# The server's modules (uvicorn, the app, FastAPI) and the doctor's are imported by the command
# that needs them: `voxmux say` and `voxmux voices` start about two seconds sooner without them.

DEFAULT_PROFILE = "cpu"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="voxmux", description="VoxMux text-to-speech gateway")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="start the HTTP server")
    _add_profile(serve)
    serve.add_argument("--host", help="bind address (env VOXMUX_HOST)")
    serve.add_argument("--port", type=int, help="port (env VOXMUX_PORT)")
    serve.add_argument("--wyoming", type=int, metavar="PORT", dest="wyoming_port",
                       help="also serve the Wyoming protocol (Home Assistant) on this port "
                            "(env VOXMUX_WYOMING_PORT)")
    cluster = serve.add_mutually_exclusive_group()
    cluster.add_argument("--ray", action="store_true",
                         help="serve on Ray Serve, on a local cluster (needs voxmux[ray])")
    cluster.add_argument("--ray-address", metavar="ADDR",
                         help="serve on Ray Serve, on the cluster at ADDR (env VOXMUX_RAY_ADDRESS)")
    check = commands.add_parser(
        "doctor", help="check Python, onnxruntime, GPU, models, voices and writable dirs"
    )
    _add_profile(check)
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    check.add_argument("--strict", action="store_true",
                       help="exit non-zero on warnings too (e.g. a GPU profile running on CPU)")
    speak.add_commands(commands, _add_profile)
    audiobook.add_command(commands)
    _add_profile(commands.choices["book"])
    _add_profile(commands.add_parser(
        "mcp", help="serve the MCP tools over stdio, for a desktop agent (no HTTP server)"))
    return parser


def _add_profile(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--profile",
        help=f"deployment profile: cpu, gpu or legacy-gpu (default: env VOXMUX_PROFILE, else "
             f"{DEFAULT_PROFILE})",
    )


def resolve_settings(args: argparse.Namespace) -> Settings:
    """Settings for parsed arguments: flags beat environment variables beat the profile file."""
    profile = args.profile or os.environ.get("VOXMUX_PROFILE") or DEFAULT_PROFILE
    flags = {name: getattr(args, name, None)
             for name in ("host", "port", "ray_address", "wyoming_port")}
    return load_settings(profile, **{k: v for k, v in flags.items() if v is not None})


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = resolve_settings(args)
    except ValueError as exc:  # an unknown profile, or a value pydantic refuses
        parser.error(str(exc))
    if args.command == "doctor":
        from app.cli import doctor

        raise SystemExit(doctor.run(settings, as_json=args.json, strict=args.strict))
    if args.command in ("say", "voices"):
        raise SystemExit(speak.run(args, settings))
    if args.command == "book":
        raise SystemExit(audiobook.run(args, settings))
    if args.command == "mcp":
        from app.cli import mcp

        raise SystemExit(mcp.run(settings))
    _serve(args, settings, parser)


def _serve(args: argparse.Namespace, settings: Settings, parser: argparse.ArgumentParser) -> None:
    import uvicorn

    from app.cli.logs import configure_logging
    from app.http.connections import server_config
    from app.main import create_app
    from engines import heap

    configure_logging(settings)
    heap.limit_arenas()  # before uvicorn and the engines start their threads
    if args.ray or settings.ray_address:
        _serve_on_ray(settings, parser)
        return
    server = uvicorn.Server(server_config(create_app(settings), settings))
    server.run()
    if not server.started:  # the port is taken, or the app failed to start
        raise SystemExit(3)


def _serve_on_ray(settings: Settings, parser: argparse.ArgumentParser) -> None:
    if importlib.util.find_spec("ray") is None:
        parser.error("--ray needs Ray Serve: pip install 'voxmux[ray]'")
    from app.cluster.launch import serve_on_ray

    serve_on_ray(settings)


if __name__ == "__main__":
    main()
