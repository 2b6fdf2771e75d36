"""Prometheus metrics on a registry of the app's own, never prometheus-client's global one.

Events (requests, loads) are counted as they happen; levels (queue depth, active requests, cache
size, loaded models) are read at scrape time, from this process or, on a cluster, from the engine
replicas' reports (with a `replica` label where one replica's own figure is meant).

LunaVox's names are exported beside VoxMux's, from the same events, so its dashboards work
unchanged: `lunavox_pool_size` (engine slots of the loaded models: `concurrency` each),
`lunavox_pool_idle` (those not running an engine call now), `lunavox_requests_total{voice,status}`
(status `ok` for a finished request, else VoxMux's outcome), `lunavox_request_duration_seconds`
and `lunavox_rtf` by `voice`.

Every label has a bounded set of values, whatever clients send: `model` is a catalogue model id,
and `voice` is a catalogue voice id of the model, `blend` for any blend of its voices (Kokoro's
`jf_alpha(2)+jm_kumo(1)`, whatever the weights and spacing), else `other` (see `voice_label`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterator
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.serving.cache import CacheSnapshot
from app.serving.fleet import ModelView, ReplicaState
from app.serving.tracking import RequestStats
from engines.registry import EngineRegistry, ModelStatus

CONTENT_TYPE = CONTENT_TYPE_LATEST

_SECONDS = (0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_RTF = (0.01, 0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1, 1.5, 2, 5)

BLEND = "blend"
OTHER = "other"
_BLEND_PART = re.compile(r"\s*([^()+\s]+)\s*(?:\(\s*[0-9]*\.?[0-9]+\s*\))?\s*")

VoiceIds = Callable[[str], Collection[str]]
"""A model id -> the ids of its catalogue voices."""


def voice_label(voice: str, known: Collection[str]) -> str:
    """`voice` as a metric label: itself when it is one of `known` (the model's voice ids),
    `blend` when every `+` part is a known id with an optional `(weight)`, else `other`."""
    if voice in known:
        return voice
    parts = [_BLEND_PART.fullmatch(piece) for piece in voice.split("+")]
    if len(parts) > 1 and all(m is not None and m[1] in known for m in parts):
        return BLEND
    return OTHER


def registry_voice_ids(registry: EngineRegistry[Any]) -> VoiceIds:
    """Voice ids as the model's engine lists them now (they change with a rescan)."""

    def ids(model_id: str) -> Collection[str]:
        if model_id not in registry:
            return ()
        return {v.id for v in registry[model_id].engine.voices()}

    return ids


class _Levels(Collector):
    """Levels as of the scrape being rendered (set just before, read synchronously)."""

    def __init__(self) -> None:
        self.views: dict[str, ModelView] = {}
        self.cache: CacheSnapshot | None = None
        self.replicas: list[ReplicaState] | None = None

    def collect(self) -> Iterator[Metric]:
        queue = GaugeMetricFamily(
            "voxmux_queue_depth", "Admitted requests waiting for their first turn",
            labels=["model"],
        )
        active = GaugeMetricFamily(
            "voxmux_active", "Requests being synthesized (they have had a turn)", labels=["model"]
        )
        calls = GaugeMetricFamily(
            "voxmux_engine_calls_in_flight",
            "Engine calls running now, counted in the engine threads", labels=["model"],
        )
        loaded = GaugeMetricFamily("voxmux_model_loaded", "1 when the model is ready",
                                   labels=["model"])
        for model_id, view in self.views.items():
            queue.add_metric([model_id], view.queued)
            active.add_metric([model_id], view.running)
            calls.add_metric([model_id], view.in_flight)
            loaded.add_metric([model_id], int(view.status is ModelStatus.READY))
        yield queue
        yield active
        yield calls
        yield loaded
        yield GaugeMetricFamily(
            "voxmux_models_loaded", "Models ready to synthesize",
            value=sum(v.status is ModelStatus.READY for v in self.views.values()),
        )
        if self.cache is not None:
            yield CounterMetricFamily("voxmux_cache_hits", "Requests served from the audio cache",
                                      value=self.cache.hits)
            yield CounterMetricFamily("voxmux_cache_misses", "Cache lookups that found nothing",
                                      value=self.cache.misses)
            yield GaugeMetricFamily("voxmux_cache_items", "Entries in the audio cache",
                                    value=self.cache.items)
            yield GaugeMetricFamily("voxmux_cache_bytes", "Audio bytes held by the cache",
                                    value=self.cache.bytes)
        ready = [v for v in self.views.values() if v.status is ModelStatus.READY]
        slots = sum(v.slots for v in ready)
        busy = sum(min(v.in_flight, v.slots) for v in ready)
        yield GaugeMetricFamily("lunavox_pool_size", "Engine slots of the loaded models (LunaVox)",
                                value=slots)
        yield GaugeMetricFamily("lunavox_pool_idle", "Engine slots not synthesizing now (LunaVox)",
                                value=slots - busy)
        if self.replicas is not None:
            yield from _replica_levels(self.replicas)


def _replica_levels(replicas: list[ReplicaState]) -> Iterator[Metric]:
    yield GaugeMetricFamily("voxmux_replicas", "Engine replicas reporting", value=len(replicas))
    holds = GaugeMetricFamily(
        "voxmux_replica_model_loaded", "1 when the replica holds the model ready",
        labels=["replica", "node", "model"],
    )
    queue = GaugeMetricFamily(
        "voxmux_replica_queue_depth", "Requests waiting for their first turn on the replica",
        labels=["replica", "model"],
    )
    calls = GaugeMetricFamily(
        "voxmux_replica_engine_calls_in_flight", "Engine calls running on the replica",
        labels=["replica", "model"],
    )
    for replica in replicas:
        for model_id, state in replica.models.items():
            ready = int(state.status is ModelStatus.READY)
            holds.add_metric([replica.id, replica.node, model_id], ready)
            queue.add_metric([replica.id, model_id], state.queued)
            calls.add_metric([replica.id, model_id], state.in_flight)
    yield holds
    yield queue
    yield calls


class Metrics:
    def __init__(self, voice_ids: VoiceIds | None = None) -> None:
        self.voice_ids: VoiceIds = voice_ids or (lambda model_id: ())
        """Which voices are labelled by their id (see `voice_label`); none unless set."""
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "voxmux_requests", "Finished synthesis requests by model and outcome",
            ["model", "status"], registry=self.registry,
        )
        self.duration = Histogram(
            "voxmux_request_duration_seconds", "Time from admission to the last audio sample",
            ["model"], buckets=_SECONDS, registry=self.registry,
        )
        self.ttfb = Histogram(
            "voxmux_ttfb_seconds", "Time to the first audio chunk", ["model"],
            buckets=_SECONDS, registry=self.registry,
        )
        self.rtf = Histogram(
            "voxmux_rtf", "Real-time factor (synthesis time / audio duration)", ["model"],
            buckets=_RTF, registry=self.registry,
        )
        self.load_seconds = Histogram(
            "voxmux_engine_load_seconds", "Engine load time", ["model"], buckets=_SECONDS,
            registry=self.registry,
        )
        self.lunavox_requests = Counter(
            "lunavox_requests", "Finished synthesis requests by voice and status (LunaVox)",
            ["voice", "status"], registry=self.registry,
        )
        self.lunavox_duration = Histogram(
            "lunavox_request_duration_seconds", "Wall time of one request (LunaVox)", ["voice"],
            buckets=_SECONDS, registry=self.registry,
        )
        self.lunavox_rtf = Histogram(
            "lunavox_rtf", "Real-time factor (LunaVox)", ["voice"], buckets=_RTF,
            registry=self.registry,
        )
        self._levels = _Levels()
        self.registry.register(self._levels)

    def observe_request(self, model: str, stats: RequestStats, voice: str = "") -> None:
        voice = voice_label(voice, self.voice_ids(model))
        self.requests.labels(model, stats.outcome).inc()
        status = "ok" if stats.outcome == "done" else stats.outcome
        self.lunavox_requests.labels(voice, status).inc()
        if stats.outcome != "done":
            return
        self.duration.labels(model).observe(stats.t_total_ms / 1000)
        self.lunavox_duration.labels(voice).observe(stats.t_total_ms / 1000)
        if stats.ttfb_ms is not None:
            self.ttfb.labels(model).observe(stats.ttfb_ms / 1000)
        if stats.rtf is not None:
            self.rtf.labels(model).observe(stats.rtf)
            self.lunavox_rtf.labels(voice).observe(stats.rtf)

    def render(self, views: dict[str, ModelView], cache: CacheSnapshot | None = None,
               replicas: list[ReplicaState] | None = None) -> bytes:
        # No await between setting the levels and rendering them: scrapes cannot interleave.
        self._levels.views, self._levels.cache, self._levels.replicas = views, cache, replicas
        return generate_latest(self.registry)
