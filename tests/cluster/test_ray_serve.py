"""`voxmux serve --ray` on a real local Ray cluster and a real redis-server.

One cluster for the module (it takes 10-30 s to start on this machine): two ingress replicas
sharing a Redis cache, two engine replicas holding one model each, one request at a time per
replica plus one queued (so overload is easy to reach). The later tests redeploy once with one
engine replica rendering two requests and taking eighteen (many streams from both ingress
replicas, an eviction meeting a stream, killed replicas), then with one ingress replica and an
engine replica taking only what it renders, the last one with autoscaling: every redeploy
replaces every replica, so the tests that share settings run one after another.
Every replica traces to an OTLP receiver in the test, which shows one trace crossing from the
ingress into the engine replica.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import random
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from websockets.sync.client import connect

from app.cluster import launch
from app.settings import Settings
from tests.cluster.conftest import (
    cluster_settings,
    cluster_state,
    holders,
    in_replicas,
    until,
    wait_healthy,
)
from tests.conftest import decode
from tests.hearing import hear, word_error_rate
from tests.otlp import Receiver, receiver
from tests.redisserver import redis_server

SENTENCES = [
    "The morning train left the station on time.",
    "Passengers read their papers in silence.",
    "Outside, the fields were covered in frost.",
    "A conductor walked slowly down the aisle.",
    "He checked every ticket with great care.",
    "Near the window, a child pointed at the hills.",
    "The sun rose higher over the valley.",
    "Someone laughed at the back of the carriage.",
    "The next stop was still an hour away.",
    "Everyone settled in for the long ride.",
]
TEN = " ".join(SENTENCES)


def unique(text: str) -> str:
    """The same text made new, so the shared cache cannot answer it."""
    return f"Request number {random.randrange(10**9)}. {text}"


@dataclass
class Deployed:
    url: str
    settings: Settings
    traces: Receiver
    current: Settings | None = None
    """What runs now, when a test redeployed."""

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=120)

    def redeploy(self, **update: Any) -> None:
        """Run the application with these settings changed (unless it runs so already)."""
        wanted = self.settings.model_copy(update=update)
        if wanted != self.current:
            launch.deploy(wanted)
            self.current = wanted
        wait_healthy(self.url, replicas=wanted.ray_engine_replicas)


@pytest.fixture(scope="module")
def cluster(ray_available: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    tmp = tmp_path_factory.mktemp("ray")
    with redis_server(tmp / "redis") as redis_url, receiver() as traces:
        # Ray's processes inherit this environment: every replica sets up its own exporter.
        tracing_env = {"OTEL_EXPORTER_OTLP_ENDPOINT": traces.endpoint,
                       "OTEL_BSP_SCHEDULE_DELAY": "200"}
        os.environ.update(tracing_env)
        # A replica takes no more than it renders here (`ray_engine_ongoing` 1), so a second
        # request goes to the other replica and overload is easy to reach; NARROW, below,
        # takes the default (what one process admits).
        settings = cluster_settings(tmp, cache_url=redis_url, ray_engine_replicas=2,
                                    ray_models_per_replica=1, ray_ingress_replicas=2,
                                    jobs_segment_chars=200, ray_engine_ongoing=1)
        launch.start_local(settings, log_to_driver=False)
        try:
            url = launch.deploy(settings)
            wait_healthy(url, replicas=2)
            yield Deployed(url, settings, traces)
        finally:
            launch.stop(local=True)
            for name in tracing_env:
                os.environ.pop(name, None)


def speech(deployed: Deployed, model: str, text: str, fmt: str = "wav") -> httpx.Response:
    with deployed.client() as http:
        return http.post("/v1/audio/speech", json={
            "model": model, "voice": "alloy", "input": text, "response_format": fmt})


def test_the_cluster_binds_loopback_only(cluster: Deployed) -> None:
    import ray

    nodes = ray.nodes()
    assert [n["NodeManagerAddress"] for n in nodes] == ["127.0.0.1"]
    assert nodes[0]["Resources"]["CPU"] == 2
    assert nodes[0]["Resources"]["object_store_memory"] <= cluster.settings.ray_object_store_bytes
    assert not (Path.home() / ".ray" / "auth_token").exists()


def test_serve_runs_the_ingress_and_the_engines_only(cluster: Deployed) -> None:
    """No deployment of VoxMux's own beside the two (no board): status comes from Serve and the
    replicas' metrics."""
    from ray import serve

    from app.cluster.app import APP_NAME, ENGINES, INGRESS

    assert set(serve.status().applications[APP_NAME].deployments) == {INGRESS, ENGINES}
    with cluster.client() as http:
        deployment = http.get("/health").json()["cluster"]["deployment"]
    assert deployment["status"] == "HEALTHY" and deployment["replica_states"] == {"RUNNING": 2}


def onnxruntime_imported() -> bool:
    import sys

    return "onnxruntime" in sys.modules


def test_only_engine_replicas_import_onnxruntime(cluster: Deployed) -> None:
    """The ingress plans from catalogue data (voices, capabilities, fingerprints) and never
    imports onnxruntime; an engine replica that has loaded a model has."""
    from app.cluster.app import ENGINES, INGRESS

    for model in ("kokoro", "piper"):  # plans, voices, cache keys on the ingress
        assert speech(cluster, model, unique("Planned on the ingress.")).status_code == 200
    with cluster.client() as http:
        assert http.get("/v1/audio/voices", params={"model": "kokoro"}).status_code == 200
    assert in_replicas(INGRESS, onnxruntime_imported) == [False, False]
    assert True in in_replicas(ENGINES, onnxruntime_imported)


def test_openai_sdk_speech_on_piper_and_espeak(cluster: Deployed) -> None:
    client = openai.OpenAI(base_url=cluster.url + "/v1", api_key="unused", max_retries=0)
    spoken = {"piper": "The cluster speaks with the same voice as one process.",
              "espeak": "Hello from the speech cluster."}
    for model, text in spoken.items():
        response = client.audio.speech.create(model=model, voice="alloy", input=text,
                                              response_format="wav")
        audio = decode(response.content, "wav")
        assert audio.sample_rate == 22050 and audio.rms > 0.01
        assert len(text) / 25 < audio.duration < len(text) / 6
        assert response.response.headers["x-voxmux-replica"]
        heard = hear(audio.samples, audio.sample_rate).text
        assert word_error_rate(text, heard) < 0.4, heard


def test_one_trace_crosses_from_the_ingress_into_the_engine_replica(cluster: Deployed) -> None:
    rid = f"ray-trace-{random.randrange(10**9)}"
    with cluster.client() as http:
        response = http.post("/v1/audio/speech", headers={"X-Request-ID": rid}, json={
            "model": "espeak", "voice": "en-us", "response_format": "mp3",
            "input": unique("Traced through the cluster. The replica renders each sentence.")})
    assert response.status_code == 200 and response.headers["x-request-id"] == rid

    def crossed(spans: list[Any]) -> bool:
        roots = [s for s in spans if s.attributes.get("voxmux.request_id") == rid]
        return bool(roots) and any(s.name == "replica render" and s.trace_id == roots[0].trace_id
                                   for s in spans)

    spans = cluster.traces.wait(crossed, timeout=60)
    (root,) = [s for s in spans if s.attributes.get("voxmux.request_id") == rid]
    trace = [s for s in spans if s.trace_id == root.trace_id]
    (render,) = [s for s in trace if s.name == "replica render"]
    assert render.parent_id == root.span_id  # the ingress's request span
    assert render.resource["process.pid"] != root.resource["process.pid"]
    assert render.attributes["voxmux.replica"] and render.attributes["voxmux.model"] == "espeak"
    engine_side = [s for s in trace if s.resource["process.pid"] == render.resource["process.pid"]]
    segments = [s for s in engine_side if s.name == "segment"]
    assert len(segments) == int(response.headers["x-voxmux-segments"]) >= 2
    assert all(s.parent_id == render.span_id for s in segments)
    assert {"plan", "encode"} <= {s.name for s in trace
                                  if s.resource["process.pid"] == root.resource["process.pid"]}
    assert root.attributes["voxmux.model"] == "espeak"
    assert root.attributes["voxmux.audio_seconds"] > 1


def test_streaming_reaches_the_client_before_the_whole_audio(cluster: Deployed) -> None:
    speech(cluster, "piper", "Warm.").raise_for_status()  # placement and load are not measured
    client = openai.OpenAI(base_url=cluster.url + "/v1", api_key="unused", max_retries=0)
    started = time.perf_counter()
    arrivals: list[float] = []
    body = b""
    with client.audio.speech.with_streaming_response.create(
        model="piper", voice="alloy", input=unique(TEN), response_format="pcm"
    ) as response:
        rate = int(response.headers["x-sample-rate"])
        for chunk in response.iter_bytes():
            arrivals.append(time.perf_counter() - started)
            body += chunk
    assert len(arrivals) >= 5
    assert arrivals[0] < arrivals[-1] / 3, arrivals
    audio = decode(body, "pcm", pcm_rate=rate)
    assert len(TEN) / 25 < audio.duration < len(TEN) / 6 and audio.rms > 0.01


def fresh(deployed: Deployed) -> list[dict[str, Any]]:
    """The engine replicas' reports made after every request answered so far: a replica counts
    a session as it starts, but its report reaches `/stats` a second or two later (Ray's
    metrics interval), and a reading taken sooner can miss the last request."""
    now = time.time()

    def made_since() -> list[dict[str, Any]]:
        replicas = cluster_state(deployed.url)
        return replicas if replicas and all(r["updated"] > now for r in replicas) else []

    replicas: list[dict[str, Any]] = until(made_since, timeout=15, every=0.25)
    assert replicas, cluster_state(deployed.url)
    return replicas


def served(deployed: Deployed, model: str) -> dict[str, int]:
    """Render sessions of `model` by replica, counting every request answered so far."""
    return {r["id"]: r["models"].get(model, {}).get("served", 0) for r in fresh(deployed)}


def test_requests_go_to_the_replica_that_holds_the_model(cluster: Deployed) -> None:
    speech(cluster, "piper", unique("Place the model.")).raise_for_status()
    before = served(cluster, "piper")  # counts "Place the model."
    (holder,) = holders(cluster.url, "piper")
    for _ in range(6):
        assert speech(cluster, "piper", unique("Route me to the holder.")).status_code == 200
    after = served(cluster, "piper")
    assert {r: after[r] - before.get(r, 0) for r in after} == {
        r: (6 if r == holder else 0) for r in after}
    with cluster.client() as http:
        card = http.get("/v1/models/piper").json()
        health = http.get("/health").json()
        metrics = http.get("/metrics").text
    assert card["status"] == "ready" and card["replicas"] == [holder]
    assert health["status"] == "ok" and len(health["cluster"]["replicas"]) == 2
    assert health["models"]["piper"]["providers"] == ["CPUExecutionProvider"]  # the replica's
    assert 'voxmux_replica_model_loaded{model="piper",' in metrics
    assert f'replica="{holder}"}} 1.0' in metrics and "voxmux_replicas 2.0" in metrics


def from_another_replica(fetch: Any, seen: str, seconds: float = 60) -> httpx.Response:
    """`fetch()` until an ingress replica other than `seen` answers, four at a time. Serve's
    proxy sends a request to the less busy of the ingress replicas, so one after another (both
    idle) kept going to the same one for 16, 40 and more requests in full suite runs; four at
    once keep one busy."""
    from concurrent.futures import ThreadPoolExecutor

    deadline = time.monotonic() + seconds
    with ThreadPoolExecutor(4) as pool:
        while True:
            answers: list[httpx.Response] = list(pool.map(lambda _: fetch(), range(4)))
            other = [r for r in answers if r.headers["x-voxmux-replica"] != seen]
            if other or time.monotonic() > deadline:
                return (other or answers)[0]


def test_a_cache_hit_is_served_by_the_other_ingress_replica(cluster: Deployed) -> None:
    text = unique("Cached once, served from any replica.")
    before = sum(served(cluster, "piper").values())
    first = speech(cluster, "piper", text, fmt="mp3")
    assert first.headers["x-voxmux-cache"] == "miss"
    renders = sum(served(cluster, "piper").values())
    assert renders == before + 1
    again = from_another_replica(lambda: speech(cluster, "piper", text, fmt="mp3"),
                                 first.headers["x-voxmux-replica"])
    assert again.headers["x-voxmux-replica"] != first.headers["x-voxmux-replica"]
    assert again.headers["x-voxmux-cache"] == "hit" and again.content == first.content
    assert sum(served(cluster, "piper").values()) == renders  # no engine was asked
    as_wav = speech(cluster, "piper", text, fmt="wav")
    assert as_wav.headers["x-voxmux-cache"] == "hit"


def test_a_cancelled_stream_stops_its_engine_on_the_replica(cluster: Deployed) -> None:
    speech(cluster, "piper", unique("Warm.")).raise_for_status()
    (holder,) = [r["id"] for r in fresh(cluster) if "piper" in r["holds"]]

    def piper_on_holder() -> dict[str, Any]:
        state = next(r for r in cluster_state(cluster.url) if r["id"] == holder)
        return dict(state["models"]["piper"])

    rendered = piper_on_holder()["rendered"]
    text = unique(" ".join(SENTENCES * 4))
    with cluster.client() as http, http.stream("POST", "/v1/audio/speech", json={
        "model": "piper", "voice": "alloy", "input": text, "response_format": "pcm"}
    ) as response:
        segments = int(response.headers["x-voxmux-segments"])
        next(response.iter_bytes())
    def stopped() -> bool:
        state = piper_on_holder()
        return state["refcount"] == 0 and state["in_flight"] == 0

    assert until(stopped)  # the replica's session ended: lease and engine call released
    assert piper_on_holder()["rendered"] - rendered < segments / 2


def test_cancel_by_id_reaches_the_ingress_replica_running_the_request(cluster: Deployed
                                                                      ) -> None:
    """The cancel lands on whichever ingress replica Serve's proxy picks; the request may run on
    the other one. Tried until the two differ (each try has even odds)."""
    speech(cluster, "piper", unique("Warm.")).raise_for_status()
    for attempt in range(12):
        request_id = f"cancel-{attempt}-{random.randrange(10**9)}"
        with cluster.client() as http, http.stream("POST", "/v1/audio/speech", json={
            "model": "piper", "voice": "alloy", "input": unique(" ".join(SENTENCES * 4)),
            "response_format": "pcm"}, headers={"X-Request-ID": request_id}
        ) as response:
            segments = int(response.headers["x-voxmux-segments"])
            chunks = response.iter_bytes()
            received = len(next(chunks))
            with cluster.client() as other:
                cancel = other.post(f"/v1/audio/requests/{request_id}/cancel")
            if cancel.headers["x-voxmux-replica"] == response.headers["x-voxmux-replica"]:
                continue  # the same replica: not what this test is about
            assert cancel.status_code == 200, cancel.text
            assert cancel.json() == {"id": request_id, "cancelled": True, "requests": 1}
            with contextlib.suppress(httpx.HTTPError):  # a cancelled stream is cut short
                for chunk in chunks:
                    received += len(chunk)
        rate = int(response.headers["x-sample-rate"])
        full = segments * 2.5 * rate * 2  # at least 2.5 s of pcm per sentence if it ran out
        assert received < full / 2
        return
    pytest.fail("every cancel reached the replica that ran the request")


def test_overload_is_a_429_with_retry_after(cluster: Deployed) -> None:
    """Twelve requests at once on replicas that render one each and queue one: each takes
    seconds to render, and the twelve arrive within a fraction of one."""
    results: list[httpx.Response] = []
    lock = threading.Lock()
    text = " ".join(SENTENCES[:4])

    def one() -> None:
        response = speech(cluster, "piper", unique(text), fmt="pcm")
        with lock:
            results.append(response)

    threads = [threading.Thread(target=one) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    refused = [r for r in results if r.status_code == 429]
    done = [r for r in results if r.status_code == 200]
    assert len(results) == 12 and len(refused) + len(done) == 12, [
        (r.status_code, r.text[:300]) for r in results if r.status_code != 200]
    assert refused and done
    for response in refused:
        error = response.json()["error"]
        assert int(response.headers["retry-after"]) >= 1
        assert error["type"] == "rate_limit_error" and error["code"] == "queue_full"
        # Every place taken, or this one client's share of them.
        assert "capacity" in error["message"] or "share" in error["message"], error
    for response in done:
        audio = decode(response.content, "pcm", pcm_rate=int(response.headers["x-sample-rate"]))
        assert audio.duration > len(text) / 25


def test_admin_routes_say_the_cluster_places_models(cluster: Deployed) -> None:
    with cluster.client() as http:
        unload = http.post("/v1/models/piper/unload")
        loaded = http.post("/v1/models/espeak/load")
    assert unload.status_code == 400 and unload.json()["error"]["code"] == "cluster_managed"
    assert loaded.status_code == 200 and loaded.json()["status"] == "ready"
    assert loaded.json()["replicas"]


def test_studio_clips_are_found_by_every_ingress_replica(cluster: Deployed) -> None:
    with cluster.client() as http:
        assert "VoxMux" in http.get("/").text
        result = http.post("/studio/generate", headers={"HX-Request": "true"}, data={
            "model": "piper", "text": "The studio speaks on the cluster.", "format": "mp3",
            "speed": "1.0"})
        assert result.status_code == 200, result.text
        match = re.search(r'<audio id="player"[^>]*src="([^"]+)"', result.text)
        assert match, result.text
        made = result.headers["x-voxmux-replica"]
        clip = from_another_replica(lambda: http.get(match[1]), made)
        assert clip.status_code == 200
    # the other ingress replica served the clip the first one made
    assert clip.headers["x-voxmux-replica"] != made
    audio = decode(clip.content, "mp3")
    assert audio.sample_rate == 22050 and audio.duration > 1 and audio.rms > 0.01


def test_streamed_text_over_websocket_speaks_each_sentence(cluster: Deployed) -> None:
    frames: list[dict[str, Any]] = []
    pcm = b""
    with connect(cluster.url.replace("http", "ws") + "/ws/v1/tts/text") as ws:
        ws.send(json.dumps({"model": "piper", "voice": "alloy"}))
        for token in ["The first sen", "tence arrives. ", "Then a second ", "one follows."]:
            ws.send(json.dumps({"text": token}))
        ws.send(json.dumps({"type": "end"}))
        for message in ws:
            if isinstance(message, bytes):
                pcm += message
                continue
            frames.append(json.loads(message))
            if frames[-1]["type"] in ("done", "error", "cancelled"):
                break
    kinds = [f["type"] for f in frames]
    assert kinds[0] == "started" and kinds[-1] == "done", frames
    assert kinds.count("segment") == 2
    audio = decode(pcm, "pcm", pcm_rate=frames[0]["sample_rate"])
    heard = hear(audio.samples, audio.sample_rate).text
    assert word_error_rate("The first sentence arrives. Then a second one follows.", heard) < 0.4


def ray_logs() -> dict[Path, int]:
    """Every log file of the local cluster (replicas, workers, Serve) and its size now."""
    import ray

    folder = Path(ray._private.worker._global_node.get_logs_dir_path())
    return {path: path.stat().st_size for path in folder.rglob("*") if path.is_file()}


def written_since(before: dict[Path, int]) -> str:
    """What the cluster's logs gained since `before`."""
    text = []
    for path in ray_logs():
        with path.open("rb") as file:
            file.seek(before.get(path, 0))
            text.append(file.read().decode(errors="replace"))
    return "".join(text)


def test_a_job_is_shared_by_the_ingress_replicas_and_spread_over_the_engines(
        cluster: Deployed) -> None:
    """With Redis, jobs live there (`VOXMUX_JOBS_STORE` auto): either ingress replica answers
    for a job, and its chapter's parts render at once, one per engine replica (both replicas
    render some), into audio Whisper hears."""
    text = " ".join([*SENTENCES, *SENTENCES])
    before = served(cluster, "piper")
    with cluster.client() as http:
        made = http.post("/v1/audio/jobs", json={"model": "piper",
                                                 "input": text, "response_format": "wav"})
        assert made.status_code == 202, made.text
        job = made.json()["id"]
        other = from_another_replica(lambda: httpx.get(f"{cluster.url}/v1/audio/jobs/{job}",
                                                       timeout=30),
                                     made.headers["x-voxmux-replica"])
        assert other.status_code == 200 and other.json()["id"] == job
        done = until(lambda: http.get(f"/v1/audio/jobs/{job}").json()["status"] == "done",
                     timeout=120)
        assert done
        audio = decode(http.get(f"/v1/audio/jobs/{job}/audio").content, "wav")
    assert audio.duration > 20
    heard = hear(audio.samples[:int(audio.sample_rate * 9)], audio.sample_rate).text
    # the text's opening, as many words as the first 9 s held (Piper's lengths vary run to run)
    said = " ".join(text.split()[:max(len(heard.split()), 15)])
    assert word_error_rate(said, heard) < 0.5
    after = served(cluster, "piper")
    rendering = [r for r in after if after[r] > before.get(r, 0)]
    assert len(rendering) == 2, (before, after)  # both replicas rendered parts


NARROW = {"ray_engine_replicas": 1, "ray_ingress_replicas": 2, "cache_url": None,
          "cache_max_items": 0, "concurrency": 2, "queue_size": 16, "ray_engine_ongoing": None}
"""One engine replica rendering two requests at once (and taking 18) behind two ingress
replicas, no cache (the same text is rendered each time it is asked for): the tests from here
on share it (a redeploy costs seconds)."""


def test_two_ingress_replicas_stream_through_one_engine_replica(cluster: Deployed) -> None:
    """16 streams at once from both ingress replicas to one engine replica that renders two
    at a time: every one is queued by Serve and spoken whole; nothing collides on the replica."""
    cluster.redeploy(**NARROW)
    speech(cluster, "piper", "Warm.").raise_for_status()
    logs = ray_logs()
    results: list[tuple[str, list[dict[str, Any]]]] = []
    lock = threading.Lock()
    text = "Two sentences for each stream. The second one closes it."

    def one() -> None:
        with httpx.Client(base_url=cluster.url, timeout=300) as http, http.stream(
            "POST", "/v1/audio/speech", json={
                "model": "piper", "voice": "alloy", "input": text,
                "response_format": "pcm", "stream_format": "sse"}) as response:
            assert response.status_code == 200, response.read()
            events = [json.loads(line[6:]) for line in response.iter_lines()
                      if line.startswith("data: ")]
            with lock:
                results.append((response.headers["x-voxmux-replica"], events))

    threads = [threading.Thread(target=one) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert len(results) == 16
    assert len({replica for replica, _ in results}) == 2  # both ingress replicas took some
    for _, events in results:
        kinds = [e["type"] for e in events]
        assert kinds and kinds[-1] == "speech.audio.done", events[-1:]
        assert set(kinds[:-1]) == {"speech.audio.delta"}
        pcm = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
        assert decode(pcm, "pcm", pcm_rate=24000).duration > 2
    logged = written_since(logs)
    assert "Traceback" not in logged and "KeyError" not in logged, logged[-3000:]


def five_counted(cluster: Deployed, enough: Callable[[int, int], bool]) -> None:
    """Five long requests at once: `/stats` counts them within one of five, with `enough`
    (active, queued) on a reading, and (0, 0) once they are done."""
    speech(cluster, "piper", "Warm.").raise_for_status()
    statuses: list[int] = []

    def one() -> None:
        statuses.append(speech(cluster, "piper", TEN, fmt="pcm").status_code)

    threads = [threading.Thread(target=one) for _ in range(5)]
    for thread in threads:
        thread.start()
    readings: list[tuple[int, int]] = []

    def read() -> bool:
        with cluster.client() as http:
            stats = http.get("/stats").json()
        readings.append((stats["active"], stats["queued"]))
        return (abs(stats["active"] + stats["queued"] - 5) <= 1
                and enough(stats["active"], stats["queued"]))

    try:
        assert until(read, timeout=60, every=0.3), readings
    finally:
        for thread in threads:
            thread.join(timeout=300)
    assert statuses == [200] * 5
    assert until(lambda: not read() and readings[-1] == (0, 0), timeout=15), readings


def test_stats_count_what_renders_and_waits_on_the_engine_replica(cluster: Deployed) -> None:
    """Five long requests on one engine replica rendering two at a time: it takes them all
    (more than it renders, so the next is there when a turn ends), and `/stats` counts the five
    within one: `active` those that have had an engine turn (turns go segment by segment, so
    soon all five), `queued` those still waiting for their first. The lane's counters it
    reported were always 0."""
    cluster.redeploy(**NARROW)
    five_counted(cluster, lambda active, queued: active >= 2)


def test_six_streams_on_one_replica_all_hear_audio_before_any_ends(cluster: Deployed) -> None:
    """Six streams at once on one engine replica rendering two at a time: the replica takes
    them all and its lane gives turns segment by segment, as one process does, so every stream
    hears its first audio before any has its whole answer. (A replica that took only what it
    renders left four in Serve's router, each waiting for a whole request to end.)"""
    cluster.redeploy(**NARROW)
    speech(cluster, "piper", "Warm.").raise_for_status()
    firsts: list[float] = []
    ends: list[float] = []
    lock = threading.Lock()
    text = ("The first sentence of this stream. The second sentence follows it. A third one "
            "closes the stream.")

    def one() -> None:
        with httpx.Client(base_url=cluster.url, timeout=300) as http, http.stream(
                "POST", "/v1/audio/speech", json={"model": "piper", "voice": "alloy",
                                                  "input": unique(text),
                                                  "response_format": "pcm"}) as response:
            assert response.status_code == 200
            heard = False
            for chunk in response.iter_bytes():
                if chunk and not heard:
                    heard = True
                    with lock:
                        firsts.append(time.monotonic())
        with lock:
            ends.append(time.monotonic())

    threads = [threading.Thread(target=one) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert len(firsts) == len(ends) == 6
    assert max(firsts) < min(ends), (sorted(firsts), sorted(ends))


def test_an_evicted_model_finishes_the_stream_it_serves(cluster: Deployed) -> None:
    """One engine replica holding one model, two requests at a time: espeak evicts piper while
    piper streams a long text; piper is unloaded only when that stream has ended, and its body
    is whole."""
    cluster.redeploy(**NARROW)
    last = "The very last sentence is about purple elephants."
    text = " ".join([*SENTENCES, *SENTENCES, last])

    def piper_here() -> dict[str, Any]:
        (replica,) = cluster_state(cluster.url)
        return dict(replica["models"].get("piper", {}))

    body = b""
    with cluster.client() as http, http.stream("POST", "/v1/audio/speech", json={
        "model": "piper", "voice": "alloy", "input": text, "response_format": "pcm"}
    ) as response:
        rate = int(response.headers["x-sample-rate"])
        segments = int(response.headers["x-voxmux-segments"])
        chunks = response.iter_bytes()
        body += next(chunks)
        assert http.post("/v1/audio/speech", json={
            "model": "espeak", "input": "Make room.", "response_format": "wav"}
        ).status_code == 200
        evicted = until(lambda: piper_here().get("draining"), timeout=10, every=0.05)
        held = piper_here()
        for chunk in chunks:
            body += chunk
    assert evicted and held["status"] == "ready" and held["refcount"] == 1, held
    audio = decode(body, "pcm", pcm_rate=rate)
    assert len(text) / 25 < audio.duration < len(text) / 6 and segments >= 5
    tail = audio.samples[-int(5 * rate):]
    assert "elephants" in hear(tail, rate).text.lower()

    def piper_gone() -> bool:
        (replica,) = cluster_state(cluster.url)
        return "piper" not in replica["holds"]

    assert until(piper_gone)  # unloaded once its stream ended: nothing is kept past the bound
    (replica,) = cluster_state(cluster.url)
    assert replica["holds"] == ["espeak"]


def replica_id() -> str:
    from ray import serve

    return str(serve.get_replica_context().replica_id.unique_id)


def sse_events(response: httpx.Response, after_first: Any = None) -> list[dict[str, Any]]:
    """The SSE events of `response`; `after_first()` is called once the first has arrived."""
    events: list[dict[str, Any]] = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            events.append(json.loads(line[6:]))
            if len(events) == 1 and after_first is not None:
                after_first()
    return events


def rendering(deployed: Deployed) -> int | None:
    """Requests on the engine replicas (rendering or waiting there), as `/stats` says; None
    while the proxy cannot reach a live ingress replica."""
    try:
        with deployed.client() as http:
            stats = http.get("/stats").json()
        return int(stats["active"]) + int(stats["queued"])
    except (httpx.HTTPError, ValueError, KeyError):
        return None


def test_an_ingress_that_dies_stops_the_engine_work_it_asked_for(cluster: Deployed) -> None:
    """SIGKILL on the ingress replica streaming a long request: its engine replica stops
    rendering for nobody within seconds (it rendered the whole text on)."""
    import os
    import signal

    from app.cluster.app import INGRESS

    cluster.redeploy(**NARROW)
    speech(cluster, "piper", "Warm.").raise_for_status()
    pids = dict(in_replicas(INGRESS, lambda: (replica_id(), os.getpid())))
    with contextlib.suppress(httpx.HTTPError), cluster.client() as http, http.stream(
            "POST", "/v1/audio/speech", json={
                "model": "piper", "voice": "alloy", "input": unique(" ".join(SENTENCES * 4)),
                "response_format": "pcm", "stream_format": "sse"}) as response:
        assert response.status_code == 200
        victim = response.headers["x-voxmux-replica"]
        assert victim in pids
        for line in response.iter_lines():
            if line.startswith("data: "):
                assert until(lambda: rendering(cluster) == 1, timeout=10)
                os.kill(pids[victim], signal.SIGKILL)
                killed = time.monotonic()
                break
    assert until(lambda: rendering(cluster) == 0, timeout=6, every=0.25)
    print(f"engine work stopped {time.monotonic() - killed:.1f} s after its ingress died")


def test_a_killed_engine_replica_ends_its_stream_with_an_error(cluster: Deployed) -> None:
    """SIGKILL on the engine replica mid-stream: the stream ends with an SSE error event at
    once (no hang), Serve starts a new replica and the next request is served by it."""
    import os
    import signal

    from app.cluster.app import ENGINES

    cluster.redeploy(**NARROW)
    speech(cluster, "piper", "Warm.").raise_for_status()
    (pid,) = in_replicas(ENGINES, os.getpid)
    (dead,) = in_replicas(ENGINES, replica_id)
    assert until(lambda: dead in {r["id"] for r in cluster_state(cluster.url)})
    started = time.monotonic()
    with cluster.client() as http, http.stream("POST", "/v1/audio/speech", json={
        "model": "piper", "voice": "alloy", "input": unique(" ".join(SENTENCES * 3)),
        "response_format": "pcm", "stream_format": "sse"}) as response:
        assert response.status_code == 200
        events = sse_events(response, lambda: os.kill(pid, signal.SIGKILL))
    assert time.monotonic() - started < 30
    kinds = [e["type"] for e in events]
    assert kinds[0] == "speech.audio.delta" and kinds[-1] == "error", kinds
    assert "speech.audio.done" not in kinds
    assert events[-1]["error"]["type"] == "server_error", events[-1]
    # The dead replica is gone from the status at the next reading (it stayed 15 s).
    assert until(lambda: dead not in {r["id"] for r in cluster_state(cluster.url)}, timeout=4)
    after = speech(cluster, "piper", unique("The new replica speaks."))
    assert after.status_code == 200, after.text
    assert decode(after.content, "wav").duration > 1
    assert in_replicas(ENGINES, os.getpid) != [pid]


def test_a_request_its_dead_replica_never_answered_is_served_by_another(cluster: Deployed
                                                                         ) -> None:
    """SIGKILL on the engine replica while a request waits there for Kokoro to load (its
    Japanese reader starts: seconds): no byte has been sent, so the call is sent again and the
    client gets the whole clip from the replacement replica."""
    import os
    import signal

    from app.cluster.app import ENGINES

    cluster.redeploy(**NARROW)
    (pid,) = in_replicas(ENGINES, os.getpid)
    assert not holders(cluster.url, "kokoro")
    answers: list[httpx.Response] = []
    asking = threading.Thread(target=lambda: answers.append(
        speech(cluster, "kokoro", unique("Spoken after all."))))
    asking.start()
    time.sleep(0.5)
    os.kill(pid, signal.SIGKILL)
    asking.join(timeout=180)
    (answer,) = answers
    assert answer.status_code == 200, answer.text
    audio = decode(answer.content, "wav")
    assert audio.sample_rate == 24000 and audio.duration > 1 and audio.rms > 0.01
    assert in_replicas(ENGINES, os.getpid) != [pid]


def test_stats_count_requests_waiting_in_serves_queue(cluster: Deployed) -> None:
    """One ingress replica, an engine replica that takes only what it renders (two): of five
    long requests two render and three wait in Serve's router, which no replica reports;
    `/stats` counts them from the ingress's own calls that no replica has taken yet. (It said
    `queued 0` with three waiting there.)"""
    cluster.redeploy(**{**NARROW, "ray_ingress_replicas": 1, "ray_engine_ongoing": 2})
    five_counted(cluster, lambda active, queued: queued >= 2)


def running_engines(deployed: Deployed) -> int:
    with deployed.client() as http:
        deployment = http.get("/health").json()["cluster"]["deployment"]
    return int(deployment["replica_states"].get("RUNNING", 0))


def test_autoscaling_adds_an_engine_replica_under_load_and_removes_it_after(cluster: Deployed
                                                                            ) -> None:
    """Four clients streaming without pause to one replica that renders one request at a time:
    Serve adds a second replica; once they stop, it goes (a short downscale delay here)."""
    cluster.redeploy(ray_engine_replicas=1, ray_engine_max_replicas=2, ray_ingress_replicas=1,
                     cache_url=None, cache_max_items=0, queue_size=16,
                     ray_engine_upscale_delay=0, ray_engine_downscale_delay=1,
                     ray_engine_autoscaling={"look_back_period_s": 1, "metrics_interval_s": 0.5})
    assert running_engines(cluster) == 1
    stop = threading.Event()
    statuses: list[int] = []

    def client() -> None:
        while not stop.is_set():
            response = speech(cluster, "piper", unique(" ".join(SENTENCES[:3])), fmt="pcm")
            statuses.append(response.status_code)

    clients = [threading.Thread(target=client) for _ in range(4)]
    for thread in clients:
        thread.start()
    try:
        assert until(lambda: running_engines(cluster) == 2, timeout=90, every=0.5)
        assert until(lambda: len(cluster_state(cluster.url)) == 2, timeout=60)
    finally:
        stop.set()
        for thread in clients:
            thread.join(timeout=120)
    assert statuses and set(statuses) == {200}
    assert until(lambda: running_engines(cluster) == 1, timeout=90, every=0.5)
