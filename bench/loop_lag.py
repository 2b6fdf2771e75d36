"""Event-loop lag under hostile loads, and the server's memory growth for each bomb (issue 42).

    .venv/bin/python -m bench.loop_lag            # writes bench/results/loop_lag.json and .md
    .venv/bin/python -m bench.loop_lag --quick    # smaller: into bench/results/quick/

A full run takes about 10 minutes on a 2-core machine, a quick one about 2 (60 lexicons of
1,000 entries, a 200,000-character job, a book of 12 short chapters, 10 Wyoming clients held
30 s by a server whose send timeout is 10 s, a 0.3 GB EPUB bomb).

Every phase runs on a fresh `voxmux serve` (cpu profile, eSpeak NG preloaded, cache off) on a
free loopback port, with its own data and lexicon folders in a temporary directory. A probe
process polls `GET /health` over one kept-alive httpx connection every 50 ms (the next poll
starts when the last one answered, so a stall is one long poll) and reports p50 / p99 / worst of
the polls that overlap each window. A thread reads the server's RSS every 50 ms: before, peak,
and 2 s after. Phases:

1. no load: the probe alone;
2. lexicon flood: 60 lexicons of 5,000 entries (keyless `POST /v1/audio/lexicons`; what the
   per-owner budgets refuse is counted, and the rest goes on with what was accepted), then
   one-sentence speech requests (pcm) in a loop, then a `PUT` giving one lexicon new words,
   and a request;
3. a 2,000,000-character job on the Redis job store (a `redis-server --maxmemory-policy
   noeviction` started here) with 8 clients reading its `/events`, while `GET
   /v1/audio/jobs/{id}` is timed;
4. a finished book of many chapters (mp3) being zipped by `GET /v1/audio/jobs/{id}/zip` (8
   clients at once), while short mp3 speech requests, which need a worker thread, are timed;
5. 60 Wyoming clients from one address, each sending one long `synthesize` and never reading:
   how many connections the server still holds after 90 s;

and, each on a fresh server, bombs whose RSS growth is measured: an EPUB whose manifest holds
1.5 GB of zeros (1.5 MB deflated) sent to `POST /v1/audio/jobs`; 200 `<break time="10s"/>` on
`/v1/audio/speech`, ElevenLabs' with-timestamps route (pcm_44100) and a 6-item batch; the
lexicon flood's growth comes from phase 2. Targets (the issue's): worst `/health` under 100 ms
under every load, RSS growth under 100 MB for each bomb; each figure is reported against them,
never asserted. A phase that fails, or whose server dies, records why; the others still run.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import math
import multiprocessing
import queue
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import zipfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import redis

from bench.common import (
    ROOT,
    Server,
    free_port,
    percentiles,
    run_benchmark,
    sentences,
    timed_phase,
    voxmux_process,
)

MODEL = "espeak"
MB = 1_000_000
TARGET_LAG_MS = 100.0
TARGET_RSS_MB = 100.0
POLL_S = 0.05
"""Interval of the `/health` probe and of the RSS reader."""
POLL_TIMEOUT_S = 120.0
"""A `/health` poll that takes longer counts as this long, and failed."""
SETTLE_S = 2.0
"""Wait after a bomb's answer before reading RSS "after"."""
REQUEST_TIMEOUT_S = 600.0
ENV = {"VOXMUX_PRELOAD": MODEL, "VOXMUX_CACHE_MAX_ITEMS": "0", "VOXMUX_IDLE_TTL": "-1"}
BREAK_FLOOD = "<speak>hi" + '<break time="10s"/>' * 200 + "bye</speak>"

Sample = tuple[float, float, int]
"""One `/health` poll: when it started (monotonic s), how long it took (s), its status (0: no
answer)."""


@dataclass(frozen=True)
class Plan:
    window_s: float
    """Seconds the probe runs under a steady load (no load, SSE listeners, speech loop)."""
    lexicons: int
    lexicon_entries: int
    job_chars: int
    listeners: int
    book_chapters: int
    book_sentences: int
    """Sentences per chapter of the zipped book."""
    zip_clients: int
    wyoming_clients: int
    wyoming_hold_s: float
    epub_zeros: int
    """Bytes of zeros in the EPUB bomb's extra manifest item."""
    batch_items: int = 6
    wyoming_env: dict[str, str] = field(default_factory=dict)
    """Settings of the Wyoming phase's server beyond the defaults."""


FULL = Plan(window_s=20, lexicons=60, lexicon_entries=5000, job_chars=2_000_000, listeners=8,
            book_chapters=40, book_sentences=15, zip_clients=8, wyoming_clients=60,
            wyoming_hold_s=90, epub_zeros=1_500_000_000)
QUICK = Plan(window_s=8, lexicons=60, lexicon_entries=1000, job_chars=200_000, listeners=8,
             book_chapters=12, book_sentences=12, zip_clients=8, wyoming_clients=10,
             wyoming_hold_s=30, epub_zeros=300_000_000,
             wyoming_env={"VOXMUX_WYOMING_SEND_TIMEOUT": "10"})
"""Quick: the Wyoming hold is 30 s, so a send timeout of 10 s has had its chance; the bomb is
still over the default EPUB budget (256 MiB)."""


# -- figures -----------------------------------------------------------------------------------

def lag(samples: list[Sample], start: float, end: float) -> dict[str, Any]:
    """`/health` latency of the polls overlapping [start, end]: p50, p99 and worst in ms, how
    many, how many failed (no answer, or not 200), and whether all answered and the worst
    meets the target."""
    inside = [(seconds, status) for began, seconds, status in samples
              if began <= end and began + seconds >= start]
    if not inside:
        return {"polls": 0, "failed": 0, "p50_ms": None, "p99_ms": None, "worst_ms": None,
                "under_target": None}
    ms = [seconds * 1000 for seconds, _ in inside]
    spread = percentiles(ms)
    worst = max(ms)
    return {"polls": len(ms), "failed": sum(status != 200 for _, status in inside),
            "p50_ms": round(spread["p50"], 1), "p99_ms": round(spread["p99"], 1),
            "worst_ms": round(worst, 1),
            "under_target": worst < TARGET_LAG_MS and all(status == 200 for _, status in inside)}


def growth(before: int, peak: int, after: int, alive: bool) -> dict[str, Any]:
    """RSS figures in MB; growth is the peak's over `before`, held against the target."""
    peak_growth = (peak - before) / MB
    return {"before_mb": round(before / MB, 1), "peak_mb": round(peak / MB, 1),
            "after_mb": round(after / MB, 1) if alive else None,
            "growth_peak_mb": round(peak_growth, 1),
            "growth_after_mb": round((after - before) / MB, 1) if alive else None,
            "under_target": peak_growth < TARGET_RSS_MB, "server_alive": alive}


def text_of(chars: int) -> str:
    """Plain text of the benchmark's sentences, about `chars` characters long."""
    per = len(sentences(10)) / 10
    return sentences(math.ceil(chars / per))


# -- the EPUB bomb -----------------------------------------------------------------------------

CONTAINER = """<?xml version="1.0" encoding="UTF-8"?>
<container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:container">
  <rootfiles><rootfile full-path="OEBPS/content.opf"
    media-type="application/oebps-package+xml"/></rootfiles>
</container>
"""
OPF = """<?xml version="1.0" encoding="UTF-8"?>
<package xmlns="http://www.idpf.org/2007/opf" version="3.0" unique-identifier="id">
  <metadata xmlns:dc="http://purl.org/dc/elements/1.1/">
    <dc:identifier id="id">voxmux-bench-bomb</dc:identifier>
    <dc:title>A small book</dc:title><dc:language>en</dc:language>
  </metadata>
  <manifest>
    <item id="chapter" href="chapter.xhtml" media-type="application/xhtml+xml"/>
    <item id="zeros" href="zeros.bin" media-type="application/octet-stream"/>
  </manifest>
  <spine><itemref idref="chapter"/></spine>
</package>
"""
CHAPTER = """<?xml version="1.0" encoding="UTF-8"?>
<html xmlns="http://www.w3.org/1999/xhtml"><head><title>One</title></head>
<body><h1>Chapter one</h1><p>The morning train left the station exactly on time.</p></body>
</html>
"""
ZEROS_NAME = "OEBPS/zeros.bin"


def epub_bomb(zeros: int, chunk: int = 1 << 22) -> bytes:
    """A valid one-chapter EPUB whose manifest also holds `ZEROS_NAME`: `zeros` bytes of zeros,
    deflated (about a thousandth of that in the file)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as book:
        book.writestr(zipfile.ZipInfo("mimetype"), "application/epub+zip",
                      compress_type=zipfile.ZIP_STORED)
        book.writestr("META-INF/container.xml", CONTAINER)
        book.writestr("OEBPS/content.opf", OPF)
        book.writestr("OEBPS/chapter.xhtml", CHAPTER)
        block = memoryview(bytes(chunk))
        with book.open(ZEROS_NAME, "w", force_zip64=True) as out:
            for start in range(0, zeros, chunk):
                out.write(block[:min(chunk, zeros - start)])
    return buffer.getvalue()


# -- probes ------------------------------------------------------------------------------------

def _poll(url: str, stop: Any, ready: Any, out: Any) -> None:
    """The probe process: `GET /health` every `POLL_S` on one kept-alive connection."""
    samples: list[Sample] = []
    with httpx.Client(base_url=url, timeout=POLL_TIMEOUT_S) as client:
        while not stop.is_set():
            began = time.monotonic()
            try:
                status = client.get("/health").status_code
            except httpx.HTTPError:
                status = 0
            samples.append((began, time.monotonic() - began, status))
            ready.set()
            time.sleep(max(0.0, POLL_S - (time.monotonic() - began)))
    out.put(samples)


class Probe:
    """`/health` polled from another process (so this one's threads take none of its time);
    `window(name)` marks a stretch whose polls `lags()` summarizes."""

    def __init__(self, url: str) -> None:
        context = multiprocessing.get_context("spawn")
        self._stop = context.Event()
        ready = context.Event()
        self._out: Any = context.Queue()
        self._process = context.Process(target=_poll, args=(url, self._stop, ready, self._out),
                                        daemon=True)
        self._process.start()
        self.samples: list[Sample] = []
        self.windows: dict[str, tuple[float, float]] = {}
        if not ready.wait(60):
            self.stop()
            raise RuntimeError("the /health probe did not start")

    @contextmanager
    def window(self, name: str) -> Iterator[None]:
        began = time.monotonic()
        try:
            yield
        finally:
            self.windows[name] = (began, time.monotonic())

    def stop(self) -> None:
        if self._process.pid is None or self.samples:
            return
        self._stop.set()
        with contextlib.suppress(queue.Empty):
            self.samples = self._out.get(timeout=POLL_TIMEOUT_S + 10)
        self._process.join(5)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()

    def lags(self) -> dict[str, dict[str, Any]]:
        return {name: lag(self.samples, *span) for name, span in self.windows.items()}


@contextmanager
def probing(server: Server) -> Iterator[Probe]:
    probe = Probe(server.url)
    try:
        yield probe
    finally:
        probe.stop()


def alive(pid: int) -> bool:
    try:
        status: str = psutil.Process(pid).status()
    except psutil.Error:
        return False
    return bool(status != psutil.STATUS_ZOMBIE)


def warmed(server: Server, client: httpx.Client) -> None:
    """One ordinary request, then until the server's RSS holds still (at most 15 s): what a
    server does once after it is ready (py3langid's model, read at start in a thread, is
    about 70 MB) is not counted against the load measured next."""
    speech(client, "Hello there, this is a warm-up.")
    deadline = time.monotonic() + 15
    last = server.rss()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = server.rss()
        if abs(now - last) < MB:
            return
        last = now


class RssWatch:
    """The server's RSS read every `POLL_S` in a thread, from construction to `stop()`."""

    def __init__(self, server: Server) -> None:
        self._server = server
        self.before = server.rss()
        self.peak = self.before
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(POLL_S):
            now = self._server.rss()
            if not now and not alive(self._server.pid):
                return
            self.peak = max(self.peak, now)

    def stop(self, settle: float = SETTLE_S) -> dict[str, Any]:
        """Figures once `settle` seconds have passed (still read meanwhile)."""
        time.sleep(settle)
        self._done.set()
        self._thread.join()
        after = self._server.rss()
        return growth(self.before, max(self.peak, after), after, alive(self._server.pid))


# -- servers -----------------------------------------------------------------------------------

class ServerDied(RuntimeError):
    """The phase's server process ended while the phase ran."""


@contextmanager
def fresh_server(env: dict[str, str] | None = None, *, must_live: bool = True
                 ) -> Iterator[Server]:
    """`voxmux serve` with `ENV` and `env`, its data and lexicons in a temporary folder; an
    error while its process has gone is `ServerDied`, and so is its death in the block when
    it `must_live` (a bomb's measure records the death instead)."""
    with tempfile.TemporaryDirectory(prefix="voxmux-loop-lag-") as folder, voxmux_process({
            **ENV, "VOXMUX_DATA_DIR": f"{folder}/data",
            "VOXMUX_LEXICONS_DIR": f"{folder}/lexicons", **(env or {})}) as server:
        try:
            yield server
        except Exception as exc:
            if not alive(server.pid):
                raise ServerDied(f"the server died ({type(exc).__name__}: {exc})") from exc
            raise
        if must_live and not alive(server.pid):
            raise ServerDied("the server died during the phase")


@contextmanager
def redis_server(folder: Path) -> Iterator[str]:
    """A `redis-server` on a free loopback port, no persistence, `noeviction` (jobs must not
    be evicted); yields its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
    port = free_port()
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(folder), "--maxmemory", "4gb", "--maxmemory-policy", "noeviction"],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        client = redis.Redis.from_url(url)
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)
        client.close()
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# -- requests ----------------------------------------------------------------------------------

@dataclass
class Answer:
    status: int | None
    seconds: float
    bytes: int = 0
    body: str = ""
    """The start of a non-2xx answer (its error), or of a JSON answer."""

    def json(self) -> dict[str, Any]:
        row: dict[str, Any] = {"status": self.status, "seconds": round(self.seconds, 2),
                               "bytes": self.bytes}
        if self.body:
            row["body"] = self.body[:300]
        return row


def send(client: httpx.Client, method: str, path: str, *, keep: bool = False,
         **kwargs: Any) -> Answer:
    """A request whose answer is read to its end, counting bytes, not kept (a bomb's answer
    can be gigabytes) unless `keep` or it is an error; a transport error is status None."""
    began = time.perf_counter()
    size, head = 0, b""
    try:
        with client.stream(method, path, **kwargs) as response:
            for chunk in response.iter_bytes():
                size += len(chunk)
                if (keep or response.status_code >= 300) and len(head) < 65536:
                    head += chunk
            status: int | None = response.status_code
    except httpx.HTTPError as exc:
        return Answer(None, time.perf_counter() - began, size, f"{type(exc).__name__}: {exc}")
    return Answer(status, time.perf_counter() - began, size, head.decode("utf-8", "replace"))


def error_code(answer: Answer) -> str:
    """The `code` of an answer's error (OpenAI's shape), else its status."""
    with contextlib.suppress(ValueError, KeyError, TypeError):
        return str(json.loads(answer.body)["error"]["code"])
    return str(answer.status)


def speech(client: httpx.Client, text: str, fmt: str = "pcm") -> Answer:
    return send(client, "POST", "/v1/audio/speech", json={
        "model": MODEL, "voice": "alloy", "input": text, "response_format": fmt})


def loop_until(deadline: float, least: int, act: Callable[[int], Answer]) -> list[Answer]:
    """`act(i)` one after another until `deadline` has passed and it ran `least` times."""
    answers: list[Answer] = []
    while time.monotonic() < deadline or len(answers) < least:
        answers.append(act(len(answers)))
    return answers


def _paced(answer: Answer, at_least: float) -> Answer:
    """`answer`, after waiting what is left of `at_least` seconds since it was sent."""
    time.sleep(max(0.0, at_least - answer.seconds))
    return answer


def seconds_of(answers: list[Answer]) -> dict[str, Any]:
    values = [a.seconds for a in answers]
    if not values:
        return {"n": 0}
    spread = percentiles(values)
    return {"n": len(values), "p50_s": round(spread["p50"], 3), "max_s": round(max(values), 3),
            "statuses": sorted({str(a.status) for a in answers})}


# -- phases ------------------------------------------------------------------------------------

def no_load(plan: Plan) -> dict[str, Any]:
    with fresh_server() as server, probing(server) as probe, probe.window("no load"):
        time.sleep(plan.window_s)
    return {"rows": [{"load": "no load", **probe.lags()["no load"], "note": ""}]}


def lexicon_flood(plan: Plan) -> dict[str, Any]:
    created: list[Answer] = []
    accepted: list[str] = []
    with fresh_server() as server, httpx.Client(base_url=server.url,
                                                timeout=REQUEST_TIMEOUT_S) as client, \
            probing(server) as probe:
        warmed(server, client)
        watch = RssWatch(server)
        with probe.window("create"):
            for i in range(plan.lexicons):
                name = f"flood{i:02d}"
                entries = {f"zq{i:02d}{j:05d}x": "zee queue" for j in range(plan.lexicon_entries)}
                answer = send(client, "POST", "/v1/audio/lexicons", json={
                    "name": name, "language": "en", "entries": entries})
                created.append(answer)
                if answer.status == 201:
                    accepted.append(name)
        word = "zq0000000x" if accepted else "hello"
        with probe.window("speak"):
            spoken = loop_until(time.monotonic() + plan.window_s, 2, lambda i: speech(
                client, f"Request {i} says {word} once."))
        with probe.window("put"):
            replaced = (send(client, "PUT", f"/v1/audio/lexicons/{accepted[0]}", json={
                "language": "en", "entries": {f"zp00{j:05d}x": "zed pea"
                                              for j in range(plan.lexicon_entries)}})
                        if accepted else None)
            after_put = speech(client, "After the change, zp0000000x is new." if replaced
                               else f"After the change, {word} again.")
        rss = watch.stop()
    refused = [a for a in created if a.status != 201]
    lags = probe.lags()
    detail: dict[str, Any] = {
        "asked": plan.lexicons, "entries_each": plan.lexicon_entries,
        "accepted": len(accepted), "refused": len(refused),
        "refusals": dict(Counter(error_code(a) for a in refused)),
        "refusal_example": refused[0].body[:300] if refused else None,
        "create_seconds": seconds_of(created), "speech": seconds_of(spoken),
        "put": replaced.json() if replaced else None, "speech_after_put": after_put.json(),
        "rss": rss,
    }
    flood = f"{plan.lexicons} x {plan.lexicon_entries:,} entries"
    rows = [
        {"load": f"lexicon flood: creating {flood}", **lags["create"],
         "note": f"{len(accepted)} accepted, {len(refused)} refused; POST p50 "
                 f"{detail['create_seconds']['p50_s']} s"},
        {"load": "lexicon flood: speech requests", **lags["speak"],
         "note": f"{len(spoken)} requests, p50 {detail['speech']['p50_s']} s, "
                 f"max {detail['speech']['max_s']} s"},
        {"load": "lexicon flood: PUT, then a request", **lags["put"],
         "note": (f"PUT {replaced.status} in {replaced.seconds:.2f} s; " if replaced else "")
                 + f"request {after_put.status} in {after_put.seconds:.2f} s"},
    ]
    return {"rows": rows, "detail": detail,
            "bomb": {"bomb": f"lexicon flood ({flood})", "status": f"{len(accepted)} x 201, "
                     f"{len(refused)} refused", "seconds": round(sum(
                         a.seconds for a in created), 2), "rss": rss}}


def _listen(url: str, job_id: str, stop: threading.Event, counts: list[int], index: int,
            connected: threading.Event) -> None:
    """One SSE client of the job's events, counting them, until `stop` or the stream ends."""
    with contextlib.suppress(httpx.HTTPError), \
            httpx.Client(base_url=url, timeout=httpx.Timeout(30, read=10)) as client, \
            client.stream("GET", f"/v1/audio/jobs/{job_id}/events") as response:
        for line in response.iter_lines():
            if line.startswith("data:"):
                counts[index] += 1
                connected.set()
            if stop.is_set():
                return


def big_job(plan: Plan) -> dict[str, Any]:
    text = text_of(plan.job_chars)
    with tempfile.TemporaryDirectory(prefix="voxmux-loop-lag-redis-") as folder, \
            redis_server(Path(folder)) as url, \
            fresh_server({"VOXMUX_JOBS_STORE": "redis", "VOXMUX_CACHE_URL": url}) as server, \
            httpx.Client(base_url=server.url, timeout=REQUEST_TIMEOUT_S) as client, \
            probing(server) as probe:
        with probe.window("create"):
            created = send(client, "POST", "/v1/audio/jobs", keep=True, json={
                "model": MODEL, "voice": "alloy", "input": text, "response_format": "pcm"})
        if created.status != 202:
            raise RuntimeError(f"the job was not created: {created.json()}")
        job_id = json.loads(created.body)["id"]
        stop = threading.Event()
        counts = [0] * plan.listeners
        connected = [threading.Event() for _ in range(plan.listeners)]
        listeners = [threading.Thread(target=_listen, daemon=True, args=(
            server.url, job_id, stop, counts, i, connected[i])) for i in range(plan.listeners)]
        try:
            for listener in listeners:
                listener.start()
            deadline = time.monotonic() + 60
            for event in connected:
                event.wait(max(0.0, deadline - time.monotonic()))
            with probe.window("listen"):
                reads = loop_until(time.monotonic() + plan.window_s, 3, lambda _: _paced(
                    send(client, "GET", f"/v1/audio/jobs/{job_id}", keep=True), 0.25))
        finally:
            stop.set()
            for listener in listeners:
                listener.join(15)
        progress = json.loads(reads[-1].body).get("progress") if reads[-1].status == 200 else None
        purged = send(client, "DELETE", f"/v1/audio/jobs/{job_id}", params={"purge": "true"})
    lags = probe.lags()
    detail: dict[str, Any] = {
        "chars": len(text), "create": {**created.json(), "body": None},
        "get_job": seconds_of(reads), "progress_at_end": progress,
        "events_per_listener": counts, "purge": purged.json()}
    got = detail["get_job"]
    rows = [
        {"load": f"{len(text):,}-character job (Redis): POST", **lags["create"],
         "note": f"{created.status} in {created.seconds:.2f} s"},
        {"load": f"{len(text):,}-character job (Redis): {plan.listeners} SSE listeners",
         **lags["listen"],
         "note": f"GET job p50 {got['p50_s'] * 1000:.0f} ms, max {got['max_s'] * 1000:.0f} ms; "
                 f"{min(counts)}-{max(counts)} events per listener"},
    ]
    return {"rows": rows, "detail": detail}


def book_markdown(chapters: int, per_chapter: int) -> str:
    return "\n\n".join(f"# Chapter {i + 1}\n\n{sentences(per_chapter)}" for i in range(chapters))


def wait_done(client: httpx.Client, job_id: str, timeout: float = REQUEST_TIMEOUT_S) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = str(client.get(f"/v1/audio/jobs/{job_id}").json()["status"])
        if status in ("done", "failed", "cancelled"):
            return status
        time.sleep(0.5)
    raise RuntimeError(f"the book job did not finish in {timeout:g} s")


def book_zip(plan: Plan) -> dict[str, Any]:
    text = book_markdown(plan.book_chapters, plan.book_sentences)
    with fresh_server() as server, httpx.Client(base_url=server.url,
                                                timeout=REQUEST_TIMEOUT_S) as client:
        began = time.perf_counter()
        created = send(client, "POST", "/v1/audio/jobs", keep=True, json={
            "model": MODEL, "voice": "alloy", "input": text, "input_format": "markdown",
            "response_format": "mp3"})
        if created.status != 202:
            raise RuntimeError(f"the book job was not created: {created.json()}")
        job_id = json.loads(created.body)["id"]
        status = wait_done(client, job_id)
        rendered = time.perf_counter() - began
        if status != "done":
            raise RuntimeError(f"the book job ended {status}")
        zips: list[Answer] = []
        with probing(server) as probe, probe.window("zip"):
            threads = [threading.Thread(target=lambda: zips.append(send(
                client, "GET", f"/v1/audio/jobs/{job_id}/zip")), daemon=True)
                for _ in range(plan.zip_clients)]
            for thread in threads:
                thread.start()
            small: list[Answer] = []
            while not small or any(thread.is_alive() for thread in threads):
                small.append(_paced(speech(client, f"A short request, number {len(small)}.",
                                           "mp3"), 0.2))
            for thread in threads:
                thread.join(REQUEST_TIMEOUT_S)
    lags = probe.lags()
    detail: dict[str, Any] = {
        "chapters": plan.book_chapters, "chars": len(text), "render_s": round(rendered, 1),
        "zips": [z.json() for z in zips], "small_mp3": seconds_of(small)}
    mp3 = detail["small_mp3"]
    zip_s = max((z.seconds for z in zips), default=0.0)
    rows = [{"load": f"book ZIP ({plan.book_chapters} chapters, {plan.zip_clients} clients)",
             **lags["zip"],
             "note": f"ZIP {zips[0].bytes / MB:.0f} MB in {zip_s:.1f} s (slowest client); "
                     f"mp3 speech p50 {mp3['p50_s']} s, max {mp3['max_s']} s "
                     f"({mp3['n']} requests)" if zips else "no ZIP answered"}]
    return {"rows": rows, "detail": detail}


def wyoming_client(port: int, text: str) -> socket.socket:
    """A Wyoming client that sends one `synthesize` of `text` and never reads."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    event = {"type": "synthesize", "data": {"text": text, "voice": {"name": MODEL}}}
    sock.sendall(json.dumps(event).encode() + b"\n")
    return sock


def held(pid: int, port: int) -> int:
    """Connections the server holds open on `port` (its sockets, whatever their TCP state)."""
    try:
        connections = psutil.Process(pid).net_connections("tcp")
    except psutil.Error:
        return 0
    return sum(1 for c in connections
               if c.laddr and c.laddr.port == port and c.status != psutil.CONN_LISTEN)


def drained(sock: socket.socket, limit: int = 64 * MB) -> str:
    """Read what a never-reading client was sent: `eof` if the server closed the connection,
    `reset`, or `open`."""
    sock.setblocking(False)
    size = 0
    try:
        while size < limit:
            chunk = sock.recv(1 << 16)
            if not chunk:
                return "eof"
            size += len(chunk)
    except BlockingIOError:
        return "open"
    except OSError:
        return "reset"
    return "open"


def wyoming(plan: Plan) -> dict[str, Any]:
    port = free_port()
    text = sentences(70)
    socks: list[socket.socket] = []
    timeline: list[tuple[float, int]] = []
    with fresh_server({"VOXMUX_WYOMING_PORT": str(port), **plan.wyoming_env}) as server, \
            probing(server) as probe:
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError("Wyoming is not listening") from None
                    time.sleep(0.2)
            with httpx.Client(base_url=server.url, timeout=REQUEST_TIMEOUT_S) as client:
                warmed(server, client)
            watch = RssWatch(server)
            with probe.window("hold"):
                began = time.monotonic()
                socks += [wyoming_client(port, text) for _ in range(plan.wyoming_clients)]
                while (spent := time.monotonic() - began) < plan.wyoming_hold_s:
                    timeline.append((round(spent, 1), held(server.pid, port)))
                    time.sleep(min(5.0, plan.wyoming_hold_s - spent))
                still = held(server.pid, port)
            rss = watch.stop(0)
            ends = [drained(sock) for sock in socks]
        finally:
            for sock in socks:
                sock.close()
    lags = probe.lags()
    detail: dict[str, Any] = {
        "clients": plan.wyoming_clients, "text_chars": len(text), "hold_s": plan.wyoming_hold_s,
        "held_at_end": still, "held_over_time": timeline, "rss": rss, "env": plan.wyoming_env,
        "client_side": {kind: ends.count(kind) for kind in ("eof", "reset", "open")}}
    rows = [{"load": f"{plan.wyoming_clients} never-reading Wyoming clients, one address",
             **lags["hold"],
             "note": f"{still} of {plan.wyoming_clients} still held after "
                     f"{plan.wyoming_hold_s:g} s; RSS +{rss['growth_peak_mb']:.0f} MB"}]
    return {"rows": rows, "detail": detail}


# -- bombs -------------------------------------------------------------------------------------

def bomb(label: str, act: Callable[[httpx.Client], Answer]) -> dict[str, Any]:
    """`act` on a fresh server: its answer and the server's RSS growth."""
    with fresh_server(must_live=False) as server, httpx.Client(
            base_url=server.url, timeout=REQUEST_TIMEOUT_S) as client:
        warmed(server, client)
        watch = RssWatch(server)
        answer = act(client)
        rss = watch.stop()
    return {"bomb": label, **answer.json(), "rss": rss}


def bombs(plan: Plan) -> list[dict[str, Any]]:
    payload = base64.b64encode(epub_bomb(plan.epub_zeros)).decode()
    items = [{"model": MODEL, "voice": "alloy", "input": BREAK_FLOOD, "response_format": "pcm"}
             for _ in range(plan.batch_items)]
    runs: list[tuple[str, Callable[[httpx.Client], Answer]]] = [
        (f"EPUB, {plan.epub_zeros / 1e9:g} GB of zeros in {len(payload) / MB:.1f} MB of base64",
         lambda c: send(c, "POST", "/v1/audio/jobs", json={
             "model": MODEL, "voice": "alloy", "input": payload, "input_format": "epub",
             "response_format": "mp3"})),
        ("200 x 10 s breaks: /v1/audio/speech pcm",
         lambda c: send(c, "POST", "/v1/audio/speech", json=items[0])),
        ("200 x 10 s breaks: ElevenLabs with-timestamps pcm_44100",
         lambda c: send(c, "POST", f"/v1/text-to-speech/{MODEL}/with-timestamps",
                        params={"output_format": "pcm_44100"}, json={"text": BREAK_FLOOD})),
        (f"200 x 10 s breaks: {plan.batch_items}-item /v1/audio/batch",
         lambda c: send(c, "POST", "/v1/audio/batch", json={"items": items})),
    ]
    found = []
    for label, act in runs:
        print(f"-- bomb: {label}", flush=True)
        try:
            found.append(bomb(label, act))
        except Exception as exc:  # a server that did not start or died: the next bomb runs
            found.append({"bomb": label, "error": f"{type(exc).__name__}: {exc}"})
        print(f"   {found[-1]}", flush=True)
    return found


# -- the run -----------------------------------------------------------------------------------

def code_state() -> dict[str, Any]:
    """The commit measured and the files changed on top of it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              check=False).stdout.rstrip()
    return {"commit": git("rev-parse", "--short", "HEAD") or "unknown (not a git checkout)",
            "modified": [line[3:] for line in git("status", "--porcelain",
                                                  "--untracked-files=no").splitlines()]}


PHASES: dict[str, Callable[[Plan], dict[str, Any]]] = {
    "no load": no_load, "lexicon flood": lexicon_flood, "big job": big_job,
    "book zip": book_zip, "wyoming": wyoming,
}


def measure(quick: bool) -> dict[str, Any]:
    plan = QUICK if quick else FULL
    phases: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    details: dict[str, Any] = {}
    found: list[dict[str, Any]] = []
    for name, run in PHASES.items():
        with timed_phase(name, phases):
            try:
                result = run(plan)
            except Exception as exc:  # recorded; the next phase runs on its own server
                rows.append({"load": name, "error": f"{type(exc).__name__}: {exc}"})
                print(f"   {rows[-1]}", flush=True)
                continue
        rows += result["rows"]
        details[name] = result.get("detail")
        if "bomb" in result:
            found.append(result["bomb"])
        for row in result["rows"]:
            print(f"   {row}", flush=True)
    with timed_phase("bombs", phases):
        found = bombs(plan) + found
    return {
        "quick": quick, "plan": asdict(plan), "code": code_state(), "model": MODEL,
        "server_env": ENV,
        "probe": "a separate process polls GET /health every 50 ms on one kept-alive httpx "
                 "connection (the next poll starts when the last one answered); a window's "
                 "figures are the polls overlapping it",
        "rss": "the server process (and its helpers) read every 50 ms from /proc; peak over "
               "the load, after = 2 s after its answer",
        "targets": {"worst_health_ms": TARGET_LAG_MS, "rss_growth_mb": TARGET_RSS_MB},
        "loads": rows, "bombs": found, "details": details, "phases": phases,
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _mb(size: int | None) -> str:
    return "-" if size is None else f"{size:,} B" if size < MB else f"{size / MB:,.1f} MB"


def _verdict(ok: bool | None) -> str:
    return "-" if ok is None else "yes" if ok else "**no**"


def summary(result: dict[str, Any]) -> str:
    m = result["machine"]
    code = result["code"]
    changed = f" plus changes to {', '.join(code['modified'])}" if code["modified"] else ""
    others = ", ".join(f"{name} {p['other_work']['others']:.0%}"
                       for name, p in result["phases"].items())
    lines = [
        "# Event-loop lag and bomb memory (issue 42)", "",
        f"{m['cpu_model']}, {m['cpus']} CPUs, {m['date']}; code {code['commit']}{changed}. "
        f"Reproduce: `.venv/bin/python -m bench.loop_lag{' --quick' if result['quick'] else ''}`"
        ". Share of the machine other processes took in each phase: " + others + ".", "",
        *(["A quick run: smaller sizes (`plan` in the JSON).", ""]
          if result["quick"] else []),
        f"`/health` from {result['probe']}. Target: worst under "
        f"{result['targets']['worst_health_ms']:g} ms.", "",
        "| load | polls (failed) | p50 (ms) | p99 (ms) | worst (ms) | on target | "
        "what happened |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in result["loads"]:
        if "error" in row:
            lines.append(f"| {row['load']} | - | - | - | - | - | failed: {row['error']} |")
            continue
        lines.append(f"| {row['load']} | {row['polls']} ({row['failed']}) | {_ms(row['p50_ms'])} | "
                     f"{_ms(row['p99_ms'])} | {_ms(row['worst_ms'])} | "
                     f"{_verdict(row['under_target'])} | {row['note']} |")
    lines += [
        "", f"RSS of the server: {result['rss']}. Target: growth under "
        f"{result['targets']['rss_growth_mb']:g} MB.", "",
        "| bomb | answered | seconds | bytes out | RSS before (MB) | growth at peak (MB) | "
        "growth after (MB) | on target |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in result["bombs"]:
        if "error" in row:
            lines.append(f"| {row['bomb']} | failed: {row['error']} | | | | | | |")
            continue
        rss = row["rss"]
        after = "server died" if rss["growth_after_mb"] is None else \
            f"{rss['growth_after_mb']:,.0f}"
        status = "no answer" if row["status"] is None else row["status"]
        lines.append(f"| {row['bomb']} | {status} | {row['seconds']} | "
                     f"{_mb(row.get('bytes'))} | {rss['before_mb']:,.0f} | "
                     f"{rss['growth_peak_mb']:,.0f} | {after} | "
                     f"{_verdict(rss['under_target'])} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    run_benchmark("loop_lag", (__doc__ or "").split("\n\n")[0], measure, summary)
