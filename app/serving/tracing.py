"""OpenTelemetry traces: off unless the standard `OTEL_*` variables (or `VOXMUX_OTEL`) ask.

`setup(settings)` runs once per process (the server, each Ray replica): when tracing is wanted
it installs an SDK tracer provider that batches spans to the OTLP/HTTP exporter, which reads its
endpoint, headers and timeouts from the `OTEL_EXPORTER_OTLP_*` variables itself. When it is not,
nothing is installed: every helper here returns before touching OpenTelemetry's context.

Spans belong to requests. FastAPI's own telemetry opens each HTTP request's or WebSocket
session's root span (`app.main`); the helpers here add children only inside a trace (a root span
of this process, or the context another process sent: `carrier` on the ingress, `continued` on
an engine replica), so a warm-up, a long-form job or a CLI run makes none.
"""

from __future__ import annotations

import functools
import logging
import os
import traceback
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from opentelemetry import propagate, trace
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, StatusCode
from opentelemetry.util.types import Attributes

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from app.settings import Settings

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

NAME = "voxmux"
ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")

_provider: TracerProvider | None = None
_tracer: trace.Tracer = trace.NoOpTracer()


def wanted(settings: Settings, environ: Mapping[str, str] = os.environ) -> bool:
    """`VOXMUX_OTEL` when set; else on when `OTEL_TRACES_EXPORTER` names an exporter other than
    `none` or an OTLP endpoint is set, unless `OTEL_SDK_DISABLED=true`."""
    if settings.otel is not None:
        return settings.otel
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters:
        return exporters != "none"
    return any(environ.get(name) for name in ENDPOINTS)


def setup(settings: Settings) -> bool:
    """Install the exporting tracer provider if tracing is wanted and none is yet; whether this
    process traces."""
    if _provider is None and wanted(settings):
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

        resource = Resource.create({"process.pid": os.getpid()})
        if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
            resource = resource.merge(Resource({"service.name": NAME}))  # OTEL_SERVICE_NAME wins
        provider = TracerProvider(resource=resource)
        for name in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(","):
            name = name.strip().lower()
            if name in ("otlp", "none", ""):  # (`none` with VOXMUX_OTEL=true: OTLP all the same)
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                    OTLPSpanExporter,
                )
                provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
            elif name == "console":
                provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
            else:
                log.warning("tracing: OTEL_TRACES_EXPORTER=%s is not supported (otlp, console)",
                            name)
        trace.set_tracer_provider(provider)
        use(provider)
        log.info("tracing: spans exported over OTLP/HTTP")
    return _provider is not None


def use(provider: TracerProvider | None) -> None:
    """Trace to `provider` from now on; None: stop tracing (the tests' in-memory exporter)."""
    global _provider, _tracer
    _provider = provider
    _tracer = provider.get_tracer(NAME) if provider is not None else trace.NoOpTracer()


def provider() -> TracerProvider | None:
    """The provider this process traces to; None: it does not trace."""
    return _provider


def _traced() -> bool:
    return _provider is not None and trace.get_current_span().get_span_context().is_valid


def span(name: str, attributes: Attributes = None) -> AbstractContextManager[Span]:
    """A child of the current span, ended by the block; an exception leaving the block is
    recorded and sets the status to error. Nothing outside a trace."""
    if not _traced():
        return nullcontext(INVALID_SPAN)
    return _recorded(_tracer.start_as_current_span(
        name, attributes=attributes, record_exception=False, set_status_on_exception=False))


@contextmanager
def _recorded(opened: AbstractContextManager[Span]) -> Iterator[Span]:
    """`opened`'s span, an exception leaving it recorded by `failed` (not by the SDK, which
    would copy its message whole)."""
    with opened as current:
        try:
            yield current
        except Exception as exc:
            failed(exc, current)
            raise


def traced(name: str, describe: Callable[[R], Attributes]
           ) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """A coroutine function run in its own span, which `describe(result)` adds to."""
    def wrap(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        @functools.wraps(fn)
        async def run(*args: P.args, **kwargs: P.kwargs) -> R:
            with span(name) as current:
                result = await fn(*args, **kwargs)
                if current.is_recording():
                    current.set_attributes(describe(result) or {})
                return result
        return run
    return wrap


def current() -> Span:
    """The span a request's work is reported on (its root span; a no-op one untraced)."""
    return trace.get_current_span() if _provider is not None else INVALID_SPAN


QUOTING = ("input", "text")
"""The request fields whose errors may quote the text to speak (an unreadable script's first
words, a sentence without the word): a trace carries their code, never their message."""


def failed(error: BaseException, on: Span | None = None) -> None:
    """Record `error` on `on` (default: the current span): an exception event and an error
    status with its message; for an error about the text to speak (`QUOTING`), its class and
    code in place of the message, and its frames without it, so no input reaches the trace."""
    target = current() if on is None else on
    if not target.is_recording():
        return
    message = getattr(error, "message", None) or str(error)
    if getattr(error, "param", None) in QUOTING:
        message = f"{type(error).__name__} ({getattr(error, 'code', None) or 'no code'}) " \
                  f"about '{error.param}'"  # type: ignore[attr-defined]
        target.record_exception(error, attributes={
            "exception.message": message,
            "exception.stacktrace": "".join(traceback.format_tb(error.__traceback__))})
    else:
        target.record_exception(error)
    target.set_status(StatusCode.ERROR, message)


def carrier() -> dict[str, str]:
    """The current trace as W3C `traceparent` headers, for another process; empty untraced."""
    headers: dict[str, str] = {}
    if _traced():
        propagate.inject(headers)
    return headers


def continued(name: str, headers: Mapping[str, str], attributes: Attributes
              ) -> AbstractContextManager[Span]:
    """A span continuing the trace another process sent (`carrier`); nothing when it sent
    none or this process does not trace."""
    if _provider is None or "traceparent" not in headers:
        return nullcontext(INVALID_SPAN)
    return _recorded(_tracer.start_as_current_span(
        name, context=propagate.extract(headers), kind=SpanKind.SERVER, attributes=attributes,
        record_exception=False, set_status_on_exception=False))
