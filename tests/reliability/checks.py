"""Shared by the reliability tests: what must be back to zero, OpenAI error shape, hang-ups."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

from app.serving.scheduler import LaneState
from tests.conftest import LiveServer


def assert_openai_error(body: Any, *, status: int | None = None) -> dict[str, Any]:
    """`body` is `{"error": {"message", "type", "param", "code"}}`, on HayaKoe's routes with its
    `detail` (the same message) beside; returns the inner object."""
    assert isinstance(body, dict) and set(body) in ({"error"}, {"error", "detail"}), body
    error = body["error"]
    assert isinstance(error, dict), body
    assert body.get("detail", error.get("message")) == error.get("message"), body
    assert set(error) == {"message", "type", "param", "code"}, body
    assert isinstance(error["message"], str) and error["message"], body
    assert isinstance(error["type"], str) and error["type"], body
    assert error["param"] is None or isinstance(error["param"], str), body
    assert error["code"] is None or isinstance(error["code"], str), body
    if status is not None and status < 500:
        assert error["type"] in ("invalid_request_error", "authentication_error",
                                 "permission_error", "rate_limit_error"), body
    return error


def lanes(live: LiveServer) -> LaneState:
    """Every model's lane added up: requests started, waiting, engine calls running."""
    states = [handle.lane.state() for handle in live.app.state.service.models()]
    return LaneState(sum(s.running for s in states), sum(s.queued for s in states),
                     sum(s.in_flight for s in states))


def idle_state(live: LiveServer) -> dict[str, Any]:
    """What must be back to zero once no client is left: requests, engine calls, leases, jobs."""
    service = live.app.state.service
    lane = lanes(live)
    return {
        "active": lane.running,
        "queued": lane.queued,
        "in_flight": lane.in_flight,
        "refcounts": {m: s.refcount for m, s in service.registry.status().items() if s.refcount},
        "streams": len(service.running()),
    }


IDLE = {"active": 0, "queued": 0, "in_flight": 0, "refcounts": {}, "streams": 0}
WAITING = {**IDLE, "streams": 1}
"""One job waiting for its reader, holding no place, engine call or lease."""


def wait_until(probe: Callable[[], Any], expected: Any, timeout: float = 20.0) -> Any:
    """Poll `probe` until it returns `expected`; the last value otherwise (for the assert)."""
    deadline = time.monotonic() + timeout
    value = probe()
    while value != expected and time.monotonic() < deadline:
        time.sleep(0.05)
        value = probe()
    return value


RESET = b"\x01\x00\x00\x00\x00\x00\x00\x00"
"""SO_LINGER on with a zero timeout: closing sends a reset, as a killed client would."""


def hang_up(sock: socket.socket) -> None:
    """Close `sock` with a reset, as a killed client would."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET)
    sock.close()
