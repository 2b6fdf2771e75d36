"""The Serve application: an ingress deployment and the engine deployment.

`build(settings)` is what `voxmux serve --ray` runs; `build_app` is the same for Serve's own
tooling (`serve run app.cluster.app:build_app`, KubeRay's RayService `import_path`), with the
settings taken from the environment (`VOXMUX_*`, set in the runtime env) and the arguments.

Serve admits and queues; the replicas only render. An engine replica takes `engine_ongoing`
requests (Serve's `max_ongoing_requests`, by default what one process admits: `concurrency` plus
`queue_size`): `concurrency` of them render and the rest wait for turns that its lane hands out
fairly by client. Requests beyond wait in Serve's queue in front of the replicas, up to
`queue_size` per ingress replica (`max_queued_requests`), and one more is a 429 with `Retry-After`.
Serve sends a model's requests to the replicas holding it while they have room, then places it on
another replica (a waiting request is tried again at most `ray_router_max_backoff` seconds apart),
and its autoscaling adds engine replicas while more requests than `concurrency` are on each (up to
`ray_engine_max_replicas`) and removes them when the load has gone. Both deployments are
health-checked and finish their requests before they stop (`lifecycle`). A model with resources of
its own (`ray_model_resources`: a GPU, a node's custom resource) has an engine deployment of its
own whose replicas Ray places only where those resources are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ray import serve
from ray.serve import Application

from app.cluster.engines import Engines
from app.cluster.ingress import Ingress
from app.settings import Settings

APP_NAME = "voxmux"
INGRESS, ENGINES = "VoxMux", "VoxMuxEngines"
"""Deployment names, as Serve's config files (a RayService's `deployments:`) refer to them."""


def absolute(settings: Settings) -> Settings:
    """Settings whose relative paths are taken from here, not from each worker's directory."""
    paths = ("models_dir", "cache_dir", "credentials_dir", "config_dir", "catalogue", "log_dir")
    update = {name: Path(value).resolve() for name in paths
              if isinstance(value := getattr(settings, name), Path)}
    return settings.model_copy(update=update)


def engine_scaling(settings: Settings) -> dict[str, Any]:
    """How many engine replicas: Serve's autoscaling between `ray_engine_replicas` and
    `ray_engine_max_replicas` (aiming at `ray_engine_target_ongoing` requests per replica), or a
    fixed count when the two are equal."""
    if settings.ray_engine_max_replicas <= settings.ray_engine_replicas:
        return {"num_replicas": settings.ray_engine_replicas}
    return {"autoscaling_config": {
        "min_replicas": settings.ray_engine_replicas,
        "initial_replicas": settings.ray_engine_replicas,
        "max_replicas": settings.ray_engine_max_replicas,
        "target_ongoing_requests": settings.ray_engine_target_ongoing or settings.concurrency,
        "upscale_delay_s": settings.ray_engine_upscale_delay,
        "downscale_delay_s": settings.ray_engine_downscale_delay,
        **settings.ray_engine_autoscaling,
    }}


def engine_ongoing(settings: Settings) -> int:
    """Requests an engine replica takes at once (`ray_engine_ongoing`, or what one process
    admits: `concurrency` rendering and `queue_size` waiting): more than it renders, so a burst
    waits in the replica's fair turns, which interleave its requests segment by segment,
    rather than in Serve's router, which hands a request on only when a replica has room and
    lets it start only when a whole request before it has ended. (Four per engine thread
    measured a burst of 8 at 7x the single process's first audio p50.)"""
    return settings.ray_engine_ongoing or settings.concurrency + settings.queue_size


SHUTDOWN_GRACE_SECONDS = 30.0
"""Beyond the request timeout, how long a replica being replaced or scaled down waits for its
requests to end."""
HEALTH_PERIOD_SECONDS = 1.0
"""Serve learns of a killed replica from its next health check: at 5 s, the request after a kill
waited 2.7 s of it before the replacement even started (it starts in about 2.5 s)."""
HEALTH_TIMEOUT_SECONDS = 15.0
"""A check that takes longer fails the replica: far above a busy replica's answer."""


def lifecycle(settings: Settings) -> dict[str, Any]:
    """Serve's health checks and graceful shutdown for both deployments: a replica is checked
    every `HEALTH_PERIOD_SECONDS` (`check_health`), and one being stopped (a downscale, a new
    version, a RayService upgrade) finishes its longest request first (Serve's default, 20 s,
    cut long streams)."""
    return {"health_check_period_s": HEALTH_PERIOD_SECONDS,
            "health_check_timeout_s": HEALTH_TIMEOUT_SECONDS,
            "graceful_shutdown_timeout_s": settings.request_timeout + SHUTDOWN_GRACE_SECONDS,
            "graceful_shutdown_wait_loop_s": 1.0}


def build(settings: Settings, *, engine_options: dict[str, Any] | None = None,
          ingress_options: dict[str, Any] | None = None) -> Application:
    """The application for `settings`; the options override Serve deployment options."""
    settings = absolute(settings)

    def engine_deployment(name: str, resources: dict[str, float], models: list[str] | None
                          ) -> Application:
        return serve.deployment(name=name)(Engines).options(**{
            **engine_scaling(settings),
            **lifecycle(settings),
            "max_ongoing_requests": engine_ongoing(settings),
            "max_queued_requests": settings.queue_size,
            "request_router_config": {
                "initial_backoff_s": min(0.025, settings.ray_router_max_backoff),
                "max_backoff_s": settings.ray_router_max_backoff},
            "ray_actor_options": actor_resources(settings.ray_engine_cpus, resources),
            **(engine_options or {}),
        }).bind(settings, models)

    placed = settings.ray_model_resources
    engines = engine_deployment(ENGINES, {}, None)
    pinned = {model: engine_deployment(placed_name(model), resources, [model])
              for model, resources in placed.items()}
    ingress: Application = serve.deployment(name=INGRESS)(serve.ingress()(Ingress)).options(**{
        **lifecycle(settings),
        "num_replicas": settings.ray_ingress_replicas,
        "max_ongoing_requests": settings.ray_ingress_max_ongoing,
        "ray_actor_options": {"num_cpus": settings.ray_ingress_cpus},
        **(ingress_options or {}),
    }).bind(settings, engines, pinned)
    return ingress


def actor_resources(cpus: float, resources: dict[str, float]) -> dict[str, Any]:
    """Ray's actor options for an engine replica: `CPU` and `GPU` (in any case: environment keys
    arrive in lower case) are its `num_cpus` and `num_gpus` (Ray refuses them among
    `resources`), the rest custom resources. A fraction of a GPU (0.25) lets that many replicas
    share one card, each its own process with its own sessions (Ray places them by the
    fraction; the card's memory is theirs to share); above one, Ray takes whole GPUs only."""
    custom = dict(resources)
    named = {key.upper(): key for key in custom if key.upper() in ("CPU", "GPU")}
    options: dict[str, Any] = {"num_cpus": custom.pop(named["CPU"]) if "CPU" in named else cpus}
    if "GPU" in named:
        gpus = custom.pop(named["GPU"])
        if gpus <= 0 or (gpus > 1 and not float(gpus).is_integer()):
            raise ValueError(f"a model's GPU resource must be a fraction of one GPU (0 < x <= 1) "
                             f"or whole GPUs, not {gpus:g}")
        options["num_gpus"] = gpus
    options["resources"] = custom
    return options


def placed_name(model: str) -> str:
    """The engine deployment of a model placed by resources."""
    return f"{ENGINES}_{model}"


def build_app(args: dict[str, str]) -> Application:
    """Serve's application builder: `args` are settings (`{"profile": "gpu"}`), the rest comes
    from `VOXMUX_*` in the environment."""
    from app.settings import load_settings

    profile = args.pop("profile", None)
    return build(load_settings(profile, **args))
