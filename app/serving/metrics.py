"""Prometheus metrics on a registry of the app's own, never prometheus-client's global one.

Events (requests, loads) are counted as they happen; levels (queue depth, active requests, cache
size, loaded models) are read from the live objects at scrape time.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.serving.cache import AudioCache
from app.serving.scheduler import Scheduler
from engines.registry import EngineRegistry, ModelStatus

CONTENT_TYPE = CONTENT_TYPE_LATEST

_SECONDS = (0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_RTF = (0.01, 0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1, 1.5, 2, 5)


class _Levels(Collector):
    def __init__(self, scheduler: Scheduler, registry: EngineRegistry, cache: AudioCache) -> None:
        self._scheduler = scheduler
        self._registry = registry
        self._cache = cache

    def collect(self) -> Iterator[Metric]:
        lanes = self._scheduler.lanes()
        states = self._registry.status()
        queue = GaugeMetricFamily(
            "voxmux_queue_depth", "Requests waiting for a slot", labels=["model"]
        )
        active = GaugeMetricFamily(
            "voxmux_active", "Requests holding a synthesis slot", labels=["model"]
        )
        loaded = GaugeMetricFamily("voxmux_model_loaded", "1 when the model is ready",
                                   labels=["model"])
        for model_id in states:
            lane = lanes.get(model_id)
            queue.add_metric([model_id], lane.queued if lane else 0)
            active.add_metric([model_id], lane.running if lane else 0)
            loaded.add_metric([model_id], int(states[model_id].status is ModelStatus.READY))
        yield queue
        yield active
        yield loaded
        yield GaugeMetricFamily(
            "voxmux_models_loaded", "Models ready to synthesize",
            value=sum(s.status is ModelStatus.READY for s in states.values()),
        )
        yield CounterMetricFamily("voxmux_cache_hits", "Requests served from the audio cache",
                                  value=self._cache.hits)
        yield CounterMetricFamily("voxmux_cache_misses", "Cache lookups that found nothing",
                                  value=self._cache.misses)
        yield GaugeMetricFamily("voxmux_cache_items", "Entries in the audio cache",
                                value=self._cache.items)
        yield GaugeMetricFamily("voxmux_cache_bytes", "Audio bytes held by the cache",
                                value=self._cache.bytes)


class Metrics:
    def __init__(self, scheduler: Scheduler, registry: EngineRegistry, cache: AudioCache) -> None:
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
        self.registry.register(_Levels(scheduler, registry, cache))

    def observe_request(self, model: str, status: str, total_s: float | None,
                        ttfb_s: float | None, rtf: float | None) -> None:
        self.requests.labels(model, status).inc()
        if status != "done":
            return
        if total_s is not None:
            self.duration.labels(model).observe(total_s)
        if ttfb_s is not None:
            self.ttfb.labels(model).observe(ttfb_s)
        if rtf is not None:
            self.rtf.labels(model).observe(rtf)

    def render(self) -> bytes:
        return generate_latest(self.registry)
