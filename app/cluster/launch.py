"""Start or join a Ray cluster and run VoxMux on it (`voxmux serve --ray` / `--ray-address`).

A local cluster is this machine only: every Ray process binds loopback
(`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` and the node address), token authentication is on with a
token that lives in this process's environment (inherited by Ray's processes; nothing is written
to `~/.ray`), the object store is capped (`VOXMUX_RAY_OBJECT_STORE_BYTES`), the dashboard is off.
Stopping shuts down only what this process started (never `ray stop`, which ends every Ray
process on the host). Joining a cluster deploys the application there and deletes it on exit,
like `serve run`; a standing deployment is a RayService (docs/scale-out.md).
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import threading
import time
from typing import Any

from app.settings import Settings

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"


def local_environment() -> dict[str, str]:
    """What a loopback-only local cluster needs in the environment, set before Ray is imported
    (Ray reads some of it at import time); values already set are kept."""
    wanted = {
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    for name, value in wanted.items():
        os.environ.setdefault(name, value)
    return {name: os.environ[name] for name in wanted}


def start_local(settings: Settings, *, log_to_driver: bool = True) -> None:
    """A local cluster in this process (`ray.init(address="local")`)."""
    local_environment()
    import ray

    from app.cluster.reports import LOCAL_REPORT_MS

    ray.init(address="local", num_cpus=settings.ray_cpus,
             object_store_memory=settings.ray_object_store_bytes, include_dashboard=False,
             _node_ip_address=LOOPBACK, log_to_driver=log_to_driver,
             _system_config={"metrics_report_interval_ms": LOCAL_REPORT_MS})


def join(address: str) -> None:
    import ray

    ray.init(address=address)


def deploy(settings: Settings, **options: Any) -> str:
    """Run the application on the connected cluster; returns the URL it answers on."""
    from ray import serve

    from app.cluster.app import APP_NAME, build

    serve.start(http_options={"host": settings.host, "port": settings.port})
    serve.run(build(settings, **options), name=APP_NAME, route_prefix="/", blocking=False)
    return f"http://{settings.host}:{settings.port}"


def stop(*, local: bool) -> None:
    """Undo `deploy` (and `start_local`): only what this process started."""
    import ray
    from ray import serve

    from app.cluster.app import APP_NAME

    # Deleting the application first drains it: each replica stops once its requests under way
    # have finished (Serve's graceful shutdown, at most `graceful_shutdown_timeout_s`), while
    # the proxy still carries their streams.
    serve.delete(APP_NAME)
    if local:
        serve.shutdown()  # type: ignore[no-untyped-call]
    ray.shutdown()


def serve_on_ray(settings: Settings) -> None:
    """`voxmux serve --ray`: start (or join) the cluster, deploy, serve until SIGTERM or Ctrl-C,
    then drain and clean up: Serve lets the requests under way finish (each replica's graceful
    shutdown) before the cluster stops, and the command exits 0."""
    local = not settings.ray_address
    started = time.perf_counter()
    if local:
        start_local(settings)
    else:
        join(str(settings.ray_address))
    # Ours, not Ray's: its handler aborts the process ("Aborted", exit 134) with the cluster up.
    stopping = threading.Event()
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda *_: stopping.set())
    wyoming = None
    try:
        url = deploy(settings)
        if settings.wyoming_port:  # Serve's proxy carries no raw TCP: this process serves it
            from app.cluster.wyoming import ClusterWyoming

            wyoming = ClusterWyoming(settings)
            wyoming.start()
        log.info("VoxMux on Ray Serve at %s (cluster and application up in %.1f s)", url,
                 time.perf_counter() - started)
        stopping.wait()
        log.info("stopping: draining the requests under way")
    finally:
        if wyoming is not None:
            wyoming.stop()
        stop(local=local)
    log.info("stopped")
