"""Prometheus metrics on a registry of the app's own, never prometheus-client's global one.

Events (requests, loads) are counted as they happen; levels (queue depth, active requests, cache
size, loaded models) are read from the live objects at scrape time.

LunaVox's names are exported beside VoxMux's, from the same events, so its dashboards work
unchanged: `lunavox_pool_size` (engine slots of the loaded models: `concurrency` each),
`lunavox_pool_idle` (those not running an engine call now), `lunavox_requests_total{voice,status}`
(status `ok` for a finished request, else VoxMux's outcome), `lunavox_request_duration_seconds`
and `lunavox_rtf` by `voice` (the resolved voice id).
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
from app.serving.scheduler import Lane
from app.serving.tracking import RequestStats
from engines.registry import EngineRegistry, ModelStatus

CONTENT_TYPE = CONTENT_TYPE_LATEST

_SECONDS = (0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_RTF = (0.01, 0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1, 1.5, 2, 5)


class _Levels(Collector):
    def __init__(self, registry: EngineRegistry[Lane], cache: AudioCache) -> None:
        self._registry = registry
        self._cache = cache

    def collect(self) -> Iterator[Metric]:
        handles = self._registry.handles()
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
        for handle in handles:
            lane = handle.lane.state()
            queue.add_metric([handle.id], lane.queued)
            active.add_metric([handle.id], lane.running)
            calls.add_metric([handle.id], lane.in_flight)
            loaded.add_metric([handle.id], int(handle.status is ModelStatus.READY))
        yield queue
        yield active
        yield calls
        yield loaded
        yield GaugeMetricFamily(
            "voxmux_models_loaded", "Models ready to synthesize",
            value=sum(h.status is ModelStatus.READY for h in handles),
        )
        yield CounterMetricFamily("voxmux_cache_hits", "Requests served from the audio cache",
                                  value=self._cache.hits)
        yield CounterMetricFamily("voxmux_cache_misses", "Cache lookups that found nothing",
                                  value=self._cache.misses)
        yield GaugeMetricFamily("voxmux_cache_items", "Entries in the audio cache",
                                value=self._cache.items)
        yield GaugeMetricFamily("voxmux_cache_bytes", "Audio bytes held by the cache",
                                value=self._cache.bytes)
        ready = [h for h in handles if h.status is ModelStatus.READY]
        slots = sum(h.lane.concurrency for h in ready)
        busy = sum(min(h.lane.in_flight, h.lane.concurrency) for h in ready)
        yield GaugeMetricFamily("lunavox_pool_size", "Engine slots of the loaded models (LunaVox)",
                                value=slots)
        yield GaugeMetricFamily("lunavox_pool_idle", "Engine slots not synthesizing now (LunaVox)",
                                value=slots - busy)


class Metrics:
    def __init__(self, registry: EngineRegistry[Lane], cache: AudioCache) -> None:
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
        self.registry.register(_Levels(registry, cache))

    def observe_request(self, model: str, stats: RequestStats, voice: str = "") -> None:
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

    def render(self) -> bytes:
        return generate_latest(self.registry)
