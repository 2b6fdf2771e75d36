"""What the engine replicas say about themselves, through Ray's own metrics.

Each engine replica sets Ray metrics (`ray.serve.metrics.Gauge`, which Serve
tags with the application, deployment and replica) from its `ReplicaState`, and each node's
metrics agent exports them in Prometheus' text format (the endpoint an operator's Prometheus
scrapes, names prefixed `ray_`). An ingress replica reads them back from every live node's
endpoint (`read_replicas`) at most once a `REPORT_SECONDS`, however many status reads ask
(`RayRenderer.replicas`), so `/health`, `/stats`, `/v1/models` and `/metrics` show which replica
holds what without a singleton on any path. Only the replicas Ray lists as live actors are kept
(`live_replicas`): a killed one drops out at the next reading; one that stops reporting drops out
after `STALE_SECONDS` too. The figures are as fresh as Ray's metrics report interval (1 s on a
local cluster, 10 s by Ray's default elsewhere).
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from dataclasses import fields
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from app.serving.fleet import ReplicaModel, ReplicaState
from engines.registry import ModelStatus

REPORT_SECONDS = 1.0
"""A replica reports at least this often, and at once when something changed."""
STALE_SECONDS = 5 * REPORT_SECONDS + 10
"""A replica whose last report is older than this is gone (Ray's default report interval is
10 s: a live replica on a joined cluster must not age out between two of them)."""
SCRAPE_SECONDS = 2.0
"""How long a node's metrics endpoint may take to answer; a slower node's replicas are left out
of that reading."""
LOCAL_REPORT_MS = 1000
"""Ray's metrics report interval on a local cluster (`launch.start_local`)."""

SEEN, PRELOADING, MODEL = ("voxmux_replica_seen_seconds", "voxmux_replica_preloading",
                           "voxmux_replica_model")
STATUSES = list(ModelStatus)
NUMERIC = [f.name for f in fields(ReplicaModel)
           if f.name not in ("status", "error", "providers")]
"""The fields of a `ReplicaModel` carried as numbers (`status` as its index in `STATUSES`)."""
PROVIDER = "provider:"
"""`field` prefix of a model's providers: `provider:<name>` is its rank from 1, 0 once gone."""


class ReplicaGauges:
    """An engine replica's state as Ray metrics (set from its event loop)."""

    def __init__(self, node: str) -> None:
        from ray.serve.metrics import Gauge

        self._node = {"node": node}
        self._seen = Gauge(SEEN, "Wall-clock time of the engine replica's last report",
                           tag_keys=("node",))
        self._preloading = Gauge(PRELOADING, "1 while the engine replica preloads its models",
                                 tag_keys=("node",))
        self._model = Gauge(MODEL, "One model on the engine replica: `field` names what (status"
                            " is an index: unloaded, loading, ready, error)",
                            tag_keys=("node", "model", "field"))  # type: ignore[arg-type]
        self._known: set[str] = set()
        self._providers: dict[str, tuple[str, ...]] = {}

    def publish(self, state: ReplicaState) -> None:
        for model_id in self._known - set(state.models):  # gone here: say so, not silence
            self._model.set(0, tags={**self._node, "model": model_id, "field": "status"})
        for model_id, model in state.models.items():
            tags = {**self._node, "model": model_id}
            self._model.set(STATUSES.index(model.status), tags={**tags, "field": "status"})
            for name in NUMERIC:
                value = getattr(model, name)
                self._model.set(float(value or 0), tags={**tags, "field": name})
            for provider in set(self._providers.get(model_id, ())) - set(model.providers):
                self._model.set(0, tags={**tags, "field": PROVIDER + provider})
            for rank, provider in enumerate(model.providers, 1):
                self._model.set(rank, tags={**tags, "field": PROVIDER + provider})
            self._providers[model_id] = model.providers
        self._known |= set(state.models)
        self._preloading.set(float(state.preloading), tags=self._node)
        self._seen.set(state.updated, tags=self._node)


def parse(texts: list[str], application: str, deployments: set[str]) -> list[ReplicaState]:
    """The replicas of `deployments` in metrics texts (one per node), freshest report each."""
    seen: dict[str, tuple[float, str]] = {}
    preloading: dict[str, bool] = {}
    values: defaultdict[str, defaultdict[str, dict[str, float]]] = defaultdict(
        lambda: defaultdict(dict))
    for text in texts:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = sample.labels
                if (labels.get("application") != application
                        or labels.get("deployment") not in deployments
                        or "replica" not in labels):
                    continue
                replica = labels["replica"]
                if sample.name == "ray_" + SEEN:
                    if sample.value >= seen.get(replica, (0.0, ""))[0]:
                        seen[replica] = (sample.value, labels.get("node", ""))
                elif sample.name == "ray_" + PRELOADING:
                    preloading[replica] = bool(sample.value)
                elif sample.name == "ray_" + MODEL:
                    values[replica][labels["model"]][labels["field"]] = sample.value
    now = time.time()
    states = []
    for replica, (updated, node) in seen.items():
        if now - updated > STALE_SECONDS:
            continue
        models = {}
        for model_id, figures in values[replica].items():
            status = STATUSES[int(figures.get("status", 0))]
            if status is ModelStatus.UNLOADED and not figures.get("in_flight"):
                continue
            numbers: dict[str, Any] = {name: figures.get(name, 0.0) for name in NUMERIC}
            for name in ("refcount", "running", "queued", "in_flight", "slots", "served",
                         "rendered", "instances"):
                numbers[name] = int(numbers[name])
            numbers["draining"] = bool(numbers["draining"])
            numbers["load_seconds"] = numbers["load_seconds"] or None
            ranked = sorted((rank, name.removeprefix(PROVIDER)) for name, rank in figures.items()
                            if name.startswith(PROVIDER) and rank > 0)
            models[model_id] = ReplicaModel(status=status, error=None,
                                            providers=tuple(p for _, p in ranked), **numbers)
        states.append(ReplicaState(replica, node, models, preloading.get(replica, False),
                                   updated))
    return sorted(states, key=lambda s: s.id)


def live_replicas(application: str, deployments: set[str]) -> set[str]:
    """The ids of the replicas of `deployments` that Ray lists as live actors now (Serve names
    each `SERVE_REPLICA::<application>#<deployment>#<replica id>`). Blocking."""
    import ray

    found = set()
    for actor in ray.util.list_named_actors(all_namespaces=True):
        kind, _, rest = str(actor["name"]).partition("::")
        parts = rest.split("#")
        if kind == "SERVE_REPLICA" and len(parts) == 3 and parts[0] == application \
                and parts[1] in deployments:
            found.add(parts[2])
    return found


async def read_replicas(application: str, deployments: set[str]) -> list[ReplicaState]:
    """The engine replicas' last reports, from the metrics endpoint of every live node."""
    import ray

    nodes = await asyncio.to_thread(ray.nodes)
    urls = [f"http://{n['NodeManagerAddress']}:{n['MetricsExportPort']}/metrics"
            for n in nodes if n.get("Alive") and n.get("MetricsExportPort")]
    async with httpx.AsyncClient(timeout=SCRAPE_SECONDS) as http:
        answers = await asyncio.gather(*(http.get(url) for url in urls),
                                       return_exceptions=True)
    texts = [a.text for a in answers if isinstance(a, httpx.Response) and a.is_success]
    return parse(texts, application, deployments)
