"""An OTLP/HTTP trace receiver in the test process: what a collector would get from VoxMux.

`receiver()` serves `POST /v1/traces` on a free loopback port, decodes each body with
opentelemetry-proto's `ExportTraceServiceRequest` (as a collector does) and keeps the spans.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    resource: dict[str, Any]
    status: int
    """`Status.StatusCode`: 0 unset, 1 ok, 2 error."""
    events: tuple[str, ...]


@dataclass
class Receiver:
    endpoint: str
    """For `OTEL_EXPORTER_OTLP_ENDPOINT` (the exporter adds `/v1/traces`)."""
    spans: list[ReceivedSpan] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def wait(self, found: Callable[[list[ReceivedSpan]], bool], timeout: float = 60
             ) -> list[ReceivedSpan]:
        """The spans received, once `found(spans)` holds (or the timeout passed)."""
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                spans = list(self.spans)
            if found(spans) or time.monotonic() > deadline:
                return spans
            time.sleep(0.1)


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


def _attributes(values: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in values if isinstance(kv, KeyValue)}


def _decode(body: bytes) -> list[ReceivedSpan]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(ReceivedSpan(
                    span.name, span.trace_id.hex(), span.span_id.hex(), span.parent_span_id.hex(),
                    _attributes(span.attributes), resource, span.status.code,
                    tuple(event.name for event in span.events)))
    return spans


@contextmanager
def receiver() -> Iterator[Receiver]:
    received = Receiver("")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            spans = _decode(body)
            with received.lock:
                received.spans += spans
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    received.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield received
    finally:
        server.shutdown()
        server.server_close()
