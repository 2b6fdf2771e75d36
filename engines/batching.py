"""Dynamic batching: segments that several requests hand one onnxruntime session at about the
same time run as one padded inference, and each request gets its own part of the result back.

A GPU that renders one short segment at a time sits mostly idle; several segments in one run use
it better. On a CPU every core is already busy with one segment (bench/results/batching.md: the
padded run takes longer than the same segments one by one), so it is off unless
`RuntimeOptions.batch_size` asks for it. Only a graph with a batch dimension and per-item lengths
can batch (Piper's VITS graphs, Kokoro's fp32 vocoder cut out by `engines.kokoro_batch`;
hibari's graph is built for one segment).

How a call goes: it joins the queue of calls that can share a run (same `key`: the inputs every
item of a run shares, such as Piper's scales). The call at the head of a queue leads: it waits
until `size` calls are queued or `wait` seconds have passed since it arrived, takes up to
`size`, pads them into one run (`join`), runs it and hands each call its part (`split`). A call
that is alone when its wait ends runs as it would unbatched, and stays cancellable mid-inference.
A cancelled call leaves the queue at once; one whose run has begun stops waiting for it (the
others' run goes on; a leader that was cancelled finishes the run for the rest, then stops). A
padded run that fails (one item's ids out of the graph's range, say) is run again item by item,
so each call gets its own audio or its own error, never another request's.

The batcher holds no session: each call names the one it runs on (a reload opens a new one, and
calls on different sessions never share a run), so unloading a model frees its session.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from engines.base import CancelToken
from engines.onnx import run

Feeds = dict[str, Any]
Join = Callable[[list[Feeds]], Feeds]
"""The items' feeds padded into one run's feeds."""
Split = Callable[[list[Feeds], list[Any]], list[list[Any]]]
"""One run's outputs cut into each item's outputs, shaped as an unbatched run gives them."""


@dataclass(eq=False)
class _Call:
    session: Any
    feeds: Feeds
    arrived: float
    outputs: list[Any] | None = None
    error: BaseException | None = None
    done: bool = False


@dataclass(eq=False)
class Batcher:
    size: int
    """Most items one run takes; 1 runs every call on its own."""
    wait: float
    """Seconds the head of a queue waits for others to join it."""
    key: Callable[[Feeds], Hashable]
    join: Join
    split: Split
    runs: list[int] = field(default_factory=list)
    """The size of each padded or waited-for run, newest last (the last 1000), for tests and
    `bench/gpu_sweep.py` (a call that skipped the batcher is not counted)."""
    _queues: dict[Hashable, list[_Call]] = field(default_factory=dict)
    _changed: threading.Condition = field(default_factory=threading.Condition)

    def run(self, session: Any, feeds: Feeds, cancel: CancelToken, *, alone: bool = False
            ) -> list[Any]:
        """`session.run` on `feeds`, in a padded run with other calls where they meet;
        `alone`: never batched (a call no other can share a run with, such as a re-render at
        one request's own exact speed factor, would only wait)."""
        if self.size <= 1 or alone:
            return run(session, feeds, cancel)
        cancel.check()
        call = _Call(session, feeds, time.monotonic())
        key = (id(session), self.key(feeds))
        forget = cancel.on_cancel(self._wake)
        try:
            batch = self._queue(key, call, cancel)
        finally:
            forget()
        if batch is None:  # run by another call's leader
            return self._result(call)
        if len(batch) == 1:
            self._record(1)
            return run(session, feeds, cancel)
        self._run(batch)
        cancel.check()
        return self._result(call)

    def _queue(self, key: Hashable, call: _Call, cancel: CancelToken) -> list[_Call] | None:
        """Wait in `key`'s queue: the batch to run when `call` leads one, None once another
        call's run has given it its outputs. Raises `Cancelled` (leaving the queue) if cancelled
        before either."""
        with self._changed:
            queue = self._queues.setdefault(key, [])
            queue.append(call)
            self._changed.notify_all()
            while not call.done:
                if cancel.cancelled:
                    if call in queue:
                        queue.remove(call)
                        if not queue and self._queues.get(key) is queue:
                            del self._queues[key]
                        self._changed.notify_all()  # a new head of the queue leads
                    cancel.check()
                if call not in queue:  # in a run that another call leads
                    self._changed.wait()
                    continue
                left = call.arrived + self.wait - time.monotonic()
                if queue[0] is call and (len(queue) >= self.size or left <= 0):
                    batch = queue[:self.size]
                    del queue[:self.size]
                    if not queue:
                        del self._queues[key]
                    self._changed.notify_all()
                    return batch
                self._changed.wait(max(left, 0.0) if queue[0] is call else None)
            return None

    def _run(self, batch: list[_Call]) -> None:
        """Run `batch` as one inference (no single call's cancel stops it), hand out the parts;
        if the padded run fails, each item alone."""
        self._record(len(batch))
        try:
            feeds = [c.feeds for c in batch]
            parts: list[list[Any] | BaseException] = list(
                self.split(feeds, run(batch[0].session, self.join(feeds), CancelToken())))
        except Exception:
            parts = [self._alone(c) for c in batch]
        except BaseException as exc:  # the thread itself is stopping: nobody waits in vain
            parts = [exc] * len(batch)
        with self._changed:
            for c, part in zip(batch, parts, strict=True):
                if isinstance(part, BaseException):
                    c.error = part
                else:
                    c.outputs = part
                c.done = True
            self._changed.notify_all()
        if isinstance(parts[0], BaseException) and not isinstance(parts[0], Exception):
            raise parts[0]

    def _alone(self, call: _Call) -> list[Any] | BaseException:
        self._record(1)
        try:
            return run(call.session, call.feeds, CancelToken())
        except Exception as exc:
            return exc

    def _result(self, call: _Call) -> list[Any]:
        if call.error is not None:
            raise call.error
        assert call.outputs is not None
        return call.outputs

    def _record(self, size: int) -> None:
        with self._changed:
            self.runs.append(size)
            del self.runs[:-1000]

    def _wake(self) -> None:
        with self._changed:
            self._changed.notify_all()
