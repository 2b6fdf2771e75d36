"""Wyoming beside a cluster: `voxmux serve --ray --wyoming PORT` serves the Wyoming protocol
from the command's own process.

Serve's proxy carries HTTP and gRPC, not Wyoming's raw TCP events, so the process that deployed
the application listens for them itself, with the very planning an ingress replica does: a
`SpeechService` over the catalogue (engine-free: nothing is loaded here) whose renderer is a
`RayRenderer` on the engine deployments' handles. Serve routes, queues and scales its render
calls exactly as it does the HTTP ingress's; the audio cache is the shared one when
`VOXMUX_CACHE_URL` is set. It runs on its own event loop in a thread of the command, started
after the application is up and stopped before it is deleted.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
from typing import Any

from app.settings import Settings

log = logging.getLogger(__name__)

START_SECONDS = 60.0


class ClusterWyoming:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._started = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="voxmux-wyoming", daemon=True)

    def start(self) -> None:
        """Listen; raises what kept it from listening (a port in use, a bad catalogue)."""
        self._thread.start()
        if not self._started.wait(START_SECONDS):
            raise RuntimeError(f"Wyoming did not start within {START_SECONDS:g} s")
        if self._failure is not None:
            raise self._failure

    def stop(self) -> None:
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(timeout=30)

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # handed to start(), or logged after it
            if not self._started.is_set():
                self._failure = exc
            else:
                log.error("Wyoming stopped: %s", exc)
        finally:
            self._started.set()

    async def _serve(self) -> None:
        from app.protocols.wyoming import start_server
        from app.serving.catalogue import Catalogue
        from app.serving.service import SpeechService
        from app.serving.wiring import build_registry, runtime_options

        settings = self.settings
        self._loop, self._stopping = asyncio.get_running_loop(), asyncio.Event()
        renderer = _renderer(settings)
        catalogue = Catalogue.load(settings.catalogue_path)
        registry = build_registry(settings, catalogue, runtime_options(settings))
        service = SpeechService(settings, registry, renderer=renderer, fleet=renderer,
                                languages=catalogue.languages)
        try:
            server = await start_server(service, settings)
            self._started.set()
            await self._stopping.wait()
            await server.stop()
        finally:
            service.close()
            await registry.close()
            await service.cache.close()


def _renderer(settings: Settings) -> Any:
    """A `RayRenderer` on the running application's engine deployments."""
    from ray import serve

    from app.cluster.app import APP_NAME, ENGINES, placed_name
    from app.cluster.cancels import open_cancels
    from app.cluster.remote import RayRenderer

    engines = serve.get_deployment_handle(ENGINES, app_name=APP_NAME)
    placed = {model: serve.get_deployment_handle(placed_name(model), app_name=APP_NAME)
              for model in settings.ray_model_resources}
    name = f"wyoming-{socket.gethostname()}-{os.getpid()}"
    return RayRenderer(engines, open_cancels(settings.cache_url, name),
                       settings.request_timeout, placed)
