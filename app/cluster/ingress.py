"""The ingress deployment: the whole VoxMux app, rendering on the engine deployment.

Every ingress replica builds the same FastAPI app as `voxmux serve` (`create_app`), with a
`RayRenderer` as its renderer and fleet: routes, errors, planning, the cache, joins, encoders,
streaming framings and the Studio are the single process's code. Each response names the ingress
replica that answered in `X-VoxMux-Replica`; its `X-Request-ID` is the one Serve's proxy adds
(the client's own, which the app also tracks, or one Serve made), so the app's copy is dropped.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from ray import serve
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.cluster.cancels import open_cancels
from app.cluster.remote import RayRenderer
from app.settings import Settings


class ClusterHeaders:
    """Adds `X-VoxMux-Replica` to every HTTP response and leaves `X-Request-ID` to Serve."""

    def __init__(self, app: ASGIApp, replica: str) -> None:
        self.app = app
        self.header = (b"x-voxmux-replica", replica.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def stamped(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", []) if h[0] != b"x-request-id"]
                message["headers"] = [*headers, self.header]
            await send(message)

        await self.app(scope, receive, stamped)


class Ingress:
    def __init__(self, settings: Settings, engines: Any, placed: dict[str, Any]) -> None:
        """`engines`: the engine deployment's handle; `placed`: those of the models placed by
        resources, by model id."""
        self.settings = settings
        context = serve.get_replica_context()
        self.replica = context.replica_id.unique_id
        self.renderer = RayRenderer(engines, open_cancels(settings.cache_url, self.replica),
                                    settings.request_timeout, placed,
                                    caller=f"{context.deployment}#{self.replica}")

    def __serve_build_asgi_app__(self) -> FastAPI:
        from app.main import create_app

        app = create_app(self.settings, renderer=self.renderer, fleet=self.renderer)
        app.add_middleware(ClusterHeaders, replica=self.replica)
        return app
