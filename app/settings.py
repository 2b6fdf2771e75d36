"""All of VoxMux's settings: one class, env prefix `VOXMUX_`, nested fields split by `__`.

A deployment profile is an env file under `config/profiles/`; variables set in the environment
win over the profile's values.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from app.resources import CONFIG

_HOST = re.compile(r"[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?|\[?[0-9a-f:.]+\]?")
_ORIGIN = re.compile(r"https?://[A-Za-z0-9.-]+(:\d{1,5})?|https?://\[[0-9A-Fa-f:.]+\](:\d{1,5})?")


def _split_csv(value: Any) -> Any:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="VOXMUX_",
        env_nested_delimiter="__",
        extra="ignore",
        validate_default=True,
        use_attribute_docstrings=True,
    )

    profile: str = "cpu"
    """Name of the deployment profile in force (cpu, gpu, legacy-gpu); informational."""
    host: str = "127.0.0.1"
    """Interface the server binds."""
    port: int = 8100
    """TCP port the server listens on."""
    wyoming_port: int = Field(0, ge=0, le=65535)
    """Also serve the Wyoming protocol (Home Assistant) on this TCP port; 0: off."""
    wyoming_host: str = ""
    """Where Wyoming listens; empty: `host`, or 127.0.0.1 when API keys are set (the protocol
    carries no key)."""
    wyoming_zeroconf: str = Field("", pattern=r"^[A-Za-z0-9][A-Za-z0-9 _-]{0,62}$|^$")
    """Announce Wyoming over zeroconf (mDNS) under this name, as Home Assistant discovers
    Wyoming servers; empty: no announcement. Needs the `zeroconf` extra."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Log verbosity."""
    log_dir: Path | None = None
    """When set, `voxmux serve` also writes its log to `<log_dir>/voxmux.log` (rotated at 10 MiB,
    five files kept); the docker images point it at the logs volume."""
    otel: bool | None = None
    """OpenTelemetry traces exported over OTLP/HTTP: true or false; unset: on when the standard
    variables ask for them (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`,
    or `OTEL_TRACES_EXPORTER` other than `none`), which also say where spans go."""

    config_dir: Path = CONFIG
    """Directory of `models.toml` and `profiles/`; default: the copy installed with VoxMux. Read
    from the environment before a profile is, so the profiles can come from here too."""
    catalogue: Path | None = None
    """Model catalogue (models, aliases, OpenAI voice names); default: `config_dir/models.toml`."""
    models_dir: Path = Path("models")
    """User models: `kokoro/` voice packs, `piper/` `.onnx` + `.onnx.json` pairs (relative paths
    are taken from the working directory)."""
    cache_dir: Path = Path("var/cache")
    """Writable dir for assembled weights (the Kokoro ONNX file is joined here once)."""
    credentials_dir: Path = Path("var/credentials")
    """Where `api_keys=auto` keeps its generated key (mode 0600)."""
    lexicon: Path | None = None
    """Deployment lexicon (TOML: `[en]` word = "/ipa/" or "respelling", `[en.<model>]` and
    `[en."<model>:<voice>"]` for one model or voice); default: `config_dir/lexicon.toml` when it
    exists. Read again when it changes."""
    lexicons_dir: Path = Path("var/lexicons")
    """Where each API key's lexicons (`/v1/audio/lexicons`) are stored as JSON."""

    preload: Annotated[list[str], NoDecode] = ["kokoro"]
    """Models loaded and warmed up at start (comma list); `/health` says loading until then."""
    idle_ttl: float = 600
    """Seconds an idle model stays loaded: -1 never unload, 0 unload at once."""
    model_ttl: dict[str, float] = {}
    """Per-model idle TTL overrides, e.g. `VOXMUX_MODEL_TTL__PIPER=-1`."""
    max_loaded: int | None = None
    """Most models resident at once; the least recently used idle one is evicted."""

    gc_freeze: bool = True
    """Once the preloaded models are ready, and after each later model load, move what is
    alive out of the garbage collector's sight (`gc.freeze`): a full collection then walks only
    what came after, a few milliseconds instead of 90-120 ms during which every client waits.
    For one server per process; the tests, which build many apps in one process, turn it off."""

    providers: Annotated[list[str], NoDecode] = ["CPUExecutionProvider"]
    """onnxruntime execution providers in order of preference (comma list)."""
    intra_op_threads: int = 0
    """onnxruntime threads per inference; 0 lets onnxruntime choose."""
    intra_op_spinning: bool = False
    """Let idle onnxruntime threads busy-wait for work; only pays on cores nothing else uses."""
    kokoro_precision: Literal["int8", "fp32", "fp16"] = "int8"
    """Kokoro's graph: `int8` as published (fastest on CPU); `fp32` or `fp16` made from it once
    into `cache_dir` (dequantized weights, float ops: CUDA has kernels for them, not for the
    int8 ones; fp16 keeps the vocoder's signal generation in float32 and needs the `gpu`
    extra's onnxconverter-common). The audio differs from int8's only as much as int8's
    rounding made it."""
    engine_batch: int = Field(1, ge=1, le=64)
    """Most segments of different requests one inference takes, on graphs that can batch
    (Piper's, Kokoro's fp32 graph); 1: no batching. Pays where one segment leaves the device
    idle (a GPU); on a CPU the padded run is slower than the segments one by one
    (bench/results/batching.md). A model that batches runs at least this many engine calls at
    once."""
    engine_batch_wait_ms: float = Field(5, ge=0, le=1000)
    """Milliseconds a segment waits for others to join its run when `engine_batch` > 1."""
    model_providers: dict[str, str] = {}
    """Per-model providers (comma list) in place of `providers`, e.g.
    `VOXMUX_MODEL_PROVIDERS__PIPER=CPUExecutionProvider`: each model on the provider that is
    faster for it (Piper's small graph runs faster on a few CPU cores than on CUDA,
    bench/results/gpu.md)."""
    instances: int = Field(1, ge=1, le=16)
    """Sessions of a model's graph that run requests at once (Kokoro, Piper): on a GPU each has
    its own CUDA stream, so short inferences of several requests overlap on the card, each
    session holding its own copy of the weights in VRAM (`/health` says how much). The model's
    lane then runs at least this many engine calls at once (`concurrency`). On a CPU one session
    already spreads over every core: more only cost memory (bench/results/instances.md)."""
    model_instances: dict[str, Annotated[int, Field(ge=1, le=16)]] = {}
    """Per-model `instances`, e.g. `VOXMUX_MODEL_INSTANCES__KOKORO=2`."""
    cuda_options: dict[str, str] = {}
    """CUDAExecutionProvider options, e.g. `VOXMUX_CUDA_OPTIONS__DEVICE_ID=1`,
    `VOXMUX_CUDA_OPTIONS__GPU_MEM_LIMIT=2147483648` (names as onnxruntime documents them)."""

    max_input_chars: int = Field(4096, gt=0)
    """Longest `input` accepted by the speech routes."""
    max_request_bytes: int = Field(1 << 20, gt=0)
    """Largest HTTP request body accepted; a larger one is refused with 413 before it is read."""
    max_audio_seconds: float = Field(600, gt=0)
    """Budget of audio one request may produce, pauses included: a speech request, each batch
    item, each ElevenLabs, Wyoming and WebSocket request, each text-in session. Refused before
    any audio where the input alone shows it (its SSML silence, or more text than the fastest
    voice reads in time), else the request ends with an error when its audio reaches it."""
    max_ssml_silence_seconds: float = Field(60, ge=0)
    """Budget of silence the SSML breaks of one request (or one job) may ask for in all; each
    break is at most 10 s."""
    first_segment_chars: int = Field(30, gt=10)
    """Budget of the first text segment, kept short so the first audio arrives early: the first
    sentence when it fits, else cut at its last clause mark or word boundary within it. Routes
    that answer with one file pack it like the rest; at the engine's limit every route does."""
    segment_growth: float = Field(2.0, ge=1.0)
    """After the first segment of a whole text, each segment's budget is this many times the
    one before (neighbouring sentences packed together, up to the engine's limit), so a long
    text costs few engine calls; 1 keeps one sentence per segment. Streamed text is never
    packed."""
    segment_packing: Literal["auto", "grow", "full"] = "auto"
    """How segments after the short first one are sized. `grow`: by `segment_growth` (a CPU
    runs one engine call at a time, so early calls stay short while the listener catches up).
    `full`: packed up to the engine's limit at once (fewer, fuller runs: a GPU spends about as
    long on a short segment as on a long one). `auto`: `full` for a model whose sessions run on a
    device (its first provider is not the CPU), `grow` otherwise. The first segment stays short
    either way, and streamed text is never packed."""
    sentence_pause_ms: int = 250
    """Pause inserted between sentences of one request."""
    concurrency: int = Field(1, ge=1)
    """Engine calls at once per model; admitted requests take turns segment by segment. On a
    cluster: the requests one engine replica renders at once (Serve's `max_ongoing_requests`)."""
    queue_size: int = Field(16, ge=0)
    """Requests a model takes on beyond `concurrency`; one more gets a 429 with Retry-After. A
    request counts only while it has engine work: a text socket waiting for text, or a stream
    waiting for its reader, does not. On a cluster: the requests each ingress replica keeps
    waiting in Serve's queue for an engine replica (`max_queued_requests`)."""
    client_max_requests: int = Field(0, ge=0)
    """Requests one client (its API key, else its address) may have in progress on one model;
    one more from it gets a 429 while other clients keep their share. 0: half of
    `concurrency + queue_size`, at least `concurrency`."""
    stream_buffer_seconds: float = Field(20, gt=0)
    """Audio a request may have made ahead of its reader; past it synthesis pauses, holding no
    place and no model, until the reader catches up (a reader that stops for good is dropped by
    the send timeouts)."""
    request_timeout: float = Field(120, gt=0)
    """Seconds one segment may wait for its turn and synthesize; a request that makes no
    progress for that long is stopped (504). A long text that keeps speaking is never cut."""
    unknown_voice: Literal["error", "default"] = "error"
    """A voice the model does not have: `error` refuses the request (400, param `voice`);
    `default` speaks the model's default voice and names the substitution in
    `X-VoxMux-Warnings`."""
    default_model: str = "kokoro"
    """Model (id or alias) for `POST /v1/synth` and `GET /api/tts` requests that name none."""

    cache_max_items: int = Field(512, ge=0)
    """Most responses the audio cache keeps; 0 turns the cache off."""
    cache_max_bytes: int = Field(256 * 1024 * 1024, ge=0)
    """Byte budget of the audio cache (float32 samples); least recently used entries go first."""
    cache_max_item_bytes: int = Field(16 * 1024 * 1024, ge=0)
    """Responses larger than this (float32 bytes, ~170 s at 24 kHz for 16 MiB) are not cached."""
    cache_url: str | None = None
    """Shared cache tier, e.g. `redis://host:6379/0` (the `redis` client, `voxmux[redis]` or
    `voxmux[ray]`): every process and replica reads and fills it, with the budgets above; empty:
    the cache lives in this process."""

    ray_address: str | None = None
    """`voxmux serve --ray`: the Ray cluster to join (`ray://...` or `host:port`); empty starts a
    local one. `--ray-address` sets it."""
    ray_cpus: int | None = Field(None, ge=1)
    """CPUs of a local Ray cluster; empty: every core."""
    ray_object_store_bytes: int = Field(256 * 1024 * 1024, ge=78 * 1024 * 1024)
    """Object store of a local Ray cluster (audio between replicas passes through it)."""
    ray_ingress_replicas: int = Field(1, ge=1)
    """Replicas of the ingress deployment (HTTP, WebSockets, Studio, planning, encoding)."""
    ray_ingress_cpus: float = Field(0.5, ge=0)
    """CPUs Ray reserves for each ingress replica."""
    ray_ingress_max_ongoing: int = Field(256, ge=1)
    """Requests (and open WebSockets) one ingress replica takes at once."""
    ray_engine_replicas: int = Field(1, ge=1)
    """Replicas of the engine deployment at least (and at start); each holds up to
    `ray_models_per_replica` models."""
    ray_engine_max_replicas: int = Field(4, ge=1)
    """Serve's autoscaling adds engine replicas up to this many while requests wait; at or below
    `ray_engine_replicas` there is no autoscaling (that many replicas, always)."""
    ray_engine_target_ongoing: float | None = Field(None, gt=0)
    """Requests (rendering and waiting) per engine replica that autoscaling aims at; empty: the
    model's `concurrency`, so a request that would wait asks for another replica."""
    ray_engine_upscale_delay: float = Field(5, ge=0)
    """Seconds the load must stay above target before a replica is added."""
    ray_engine_downscale_delay: float = Field(120, ge=0)
    """Seconds the load must stay below target before a replica is removed."""
    ray_router_max_backoff: float = Field(0.05, gt=0, le=5)
    """Seconds at most between Serve's tries to place a waiting request on an engine replica
    with room (its router polls the replicas' queues; Serve's default is 0.5 s, idle engine time
    between one request and the next at low concurrency)."""
    ray_engine_autoscaling: dict[str, float] = {}
    """Further fields of Serve's `autoscaling_config` for the engine deployment, e.g.
    `VOXMUX_RAY_ENGINE_AUTOSCALING__LOOK_BACK_PERIOD_S=10`."""
    ray_engine_cpus: float = Field(1, ge=0)
    """CPUs Ray reserves for each engine replica."""
    ray_engine_ongoing: int | None = Field(None, ge=1)
    """Requests one engine replica takes at once: `concurrency` of them render and the rest
    wait on the replica, where its lane gives turns fairly by client and the next segment is
    already there when an engine call ends; empty: `concurrency + queue_size`, what one
    process admits. Serve holds the requests beyond it (`queue_size` at most) until a replica
    has room."""
    ray_model_resources: dict[str, dict[str, float]] = {}
    """Ray resources a model's engine replicas need, by model id, e.g.
    `VOXMUX_RAY_MODEL_RESOURCES__KOKORO__GPU=1` or a custom resource a node was started with
    (`ray start --resources '{"tts_big": 1}'`; names in lower case). Such a model gets an engine
    deployment of its own (`VoxMuxEngines_<model>`, same sizing settings), whose replicas land
    only on nodes that have them; the other models share `VoxMuxEngines`."""
    ray_models_per_replica: int = Field(2, ge=1)
    """Models one engine replica keeps loaded; the least recently used one is evicted (once its
    last request has ended) to make room."""

    data_dir: Path = Path("var/data")
    """Where long-form jobs are kept: `jobs.sqlite3` (jobs, chapters, segments) and `jobs/<id>/`
    (each finished segment's audio, the result ZIP). Survives restarts; nothing to start."""
    jobs_max_bytes: int = Field(5 * 1024**3, ge=0)
    """Bytes the job store may take in all (jobs' text, segment audio, result ZIPs); a new job
    that would pass it is refused and a segment fails its job (`disk_full`, 507), never the
    server. So does a disk that is really full."""
    jobs_retention_hours: float = Field(168, ge=0)
    """Hours a finished (done, failed, cancelled) job and its files are kept; 0 keeps them until
    deleted (`DELETE /v1/audio/jobs/{id}`)."""
    jobs_concurrency: int = Field(1, ge=1)
    """Jobs rendered at once (the others wait, queued)."""
    jobs_store: Literal["auto", "sqlite", "redis"] = "auto"
    """Where jobs are kept: `sqlite` (files under `data_dir`, this process's own), `redis` (in
    `cache_url`'s Redis, shared by every process using it: any of them answers for any job,
    and a job whose process died is taken over by another); `auto`: `redis` on a Ray cluster
    with `cache_url` set, else `sqlite`."""
    jobs_lease_seconds: float = Field(15, gt=0, le=3600)
    """With a shared (Redis) job store: how long a job whose process stopped renewing its lease
    (killed) waits before another process takes it over."""
    jobs_parallel: int = Field(0, ge=0, le=64)
    """Parts of a job's chapter rendered at once, each a run of its segments; 0: one in a
    single process (segments in order, one engine call at a time), one per engine replica
    running on a cluster (Serve spreads the parts over the replicas)."""
    jobs_max_chars: int = Field(5_000_000, gt=0)
    """Longest text a job takes (a long novel is about a million characters)."""
    jobs_max_request_bytes: int = Field(64 * 1024 * 1024, gt=0)
    """Largest body of `POST /v1/audio/jobs` and `/v1/audio/batch` (an EPUB in base64, many
    items); other routes keep `max_request_bytes`."""
    jobs_segment_chars: int = Field(0, ge=0)
    """Longest segment a job's text is cut into; 0: the engine's own limit (fewest engine calls).
    An interactive request on the same model waits for the job segment under way at most, so a
    lower value shortens that wait (on a CPU, a 400-character Kokoro segment takes seconds)."""
    chapter_pause_ms: int = Field(1500, ge=0)
    """Silence between two chapters (or items) in a job's whole audio."""
    batch_max_items: int = Field(32, ge=1)
    """`POST /v1/audio/batch` with up to this many items answers the ZIP itself; with more, 202
    and a job whose result is the ZIP."""
    batch_max_job_items: int = Field(10_000, ge=1)
    """Most items a batch or job may have at all: a batch's items, the `items` of
    `POST /v1/audio/jobs` (counted before the request is parsed whole, with at most 32 JSON
    values for each), a book's chapters."""
    outputs_dir: Path | None = None
    """When set (AngeVoice's `/app/outputs`), every HTTP result is also written here: the speech
    route's audio, a batch's ZIP, a finished job's audio, each with a JSON sidecar."""

    batch_max_audio_seconds: float = Field(1800, gt=0)
    """Budget of audio the items of one `POST /v1/audio/batch` answered with its ZIP may make
    in all; an item past it gets the budget's error in the manifest, unspoken."""
    jobs_max_audio_seconds: float = Field(100 * 3600, gt=0)
    """Budget of audio one long-form job may make (a long novel reads in about 30 hours):
    refused at once when its text alone shows it, else the job fails when it gets there."""
    epub_max_bytes: int = Field(64 * 1024 * 1024, gt=0)
    """Budget of what an EPUB's text files inflate to together (pictures, fonts, audio, video
    and styles are never inflated and not counted), read from its ZIP directory before anything
    is inflated (a small file can inflate to gigabytes); it also bounds the memory one document
    can take. A five-million-character book is 7-15 MB of XHTML."""
    epub_max_entries: int = Field(10_000, gt=0)
    """Most files an EPUB's ZIP may hold."""
    lexicons_max_per_owner: int = Field(32, ge=1)
    """Most lexicons one API key (or the keyless `open` owner) may keep."""
    lexicon_max_entries: int = Field(5000, ge=1)
    """Most entries one lexicon may hold."""
    lexicons_max_entries_per_owner: int = Field(20_000, ge=1)
    """Most entries the lexicons of one API key (or the keyless owner) may hold together."""
    request_log_size: int = Field(100, ge=1, le=100)
    """Recent requests kept for `GET /requests`."""
    stats_window: int = Field(1000, ge=1)
    """Finished requests the latency and RTF percentiles of `/stats` are computed over."""

    api_keys: Annotated[list[SecretStr], NoDecode] = []
    """API keys (comma list); empty leaves the server open; `auto` generates one on first start
    and keeps it in `credentials_dir/api_key` (mode 0600)."""
    auth_scope: Literal["admin", "all"] = "admin"
    """What keys guard: `admin` = /stats, /requests and model load/unload/switch; `all` = every
    route but /health and the session routes."""
    session_ttl: float = Field(12 * 3600, gt=0)
    """Seconds a browser session cookie from `POST /v1/auth/session` stays valid."""

    ws_max_connections: int = Field(64, ge=1)
    """Open WebSocket sessions at once (every speech socket route); one more is closed with
    1013."""
    ws_max_connections_per_client: int = Field(16, ge=1)
    """Open WebSocket sessions of one client (its API key, else its address); one more from it is
    closed with 1013 while other clients can still connect."""
    ws_text_idle_timeout: float = Field(120, gt=0)
    """Seconds a text-in socket (`/ws/v1/tts/text`, `/v1/stream/text`) may send nothing; then its
    text ends as if it had sent `end`: everything it sent is spoken, the final frame follows and
    the socket closes (1000, with the reason)."""
    ws_first_message_timeout: float = Field(15, gt=0)
    """Seconds a WebSocket client has to send its first message before it is closed (1008)."""
    ws_max_message_bytes: int = Field(65536, gt=0)
    """Largest WebSocket message a client may send; a larger one closes the session (1009)."""
    ws_keepalive: float = Field(2.0, gt=0)
    """Seconds without audio after which a WebSocket session sends a `progress` frame."""
    ws_send_timeout: float = Field(60, gt=0)
    """Seconds a WebSocket frame may wait on a client that reads nothing; past it the session
    ends as if the client had left, freeing its connection place and buffered audio."""
    ws_max_pending_chars: int = Field(65536, gt=0)
    """Characters of text a `/ws/v1/tts/text` session may hold waiting to be spoken (text sent
    faster than it is spoken); beyond it the session ends with an error frame and close 1008."""

    wyoming_max_connections: int = Field(64, ge=1)
    """Open Wyoming connections at once; one more is answered with an `error` event and closed."""
    wyoming_max_connections_per_client: int = Field(8, ge=1)
    """Open Wyoming connections of one client address; one more from it is answered with an
    `error` event and closed while other clients can still connect."""
    wyoming_send_timeout: float = Field(60, gt=0)
    """Seconds a Wyoming event may wait on a client that reads nothing; past it the connection
    is closed as if the client had left, and its request stops."""
    max_response_header_bytes: int = Field(4096, ge=512)
    """Largest value of a header VoxMux makes from a request (the normalization report); common
    proxies refuse a response whose headers pass 4 or 8 KiB. A report over it is refused before
    any audio (ask for the SSE stream or the captioned route instead)."""
    allowed_hosts: Annotated[list[str], NoDecode] = []
    """Host names (comma list; `*` = any) this server answers besides loopback ones (localhost,
    127.0.0.0/8, ::1, any port). Empty: a server bound to a loopback address answers loopback
    names only, so a page on another name that resolves to 127.0.0.1 gets no answer (DNS
    rebinding), and one bound beyond loopback (`0.0.0.0`, as in docker) answers any name. Set it
    to the names clients use behind a reverse proxy or for a container: then only those (and
    loopback names) are answered, on any bind. Others get 400 `host_not_allowed`."""
    allowed_origins: Annotated[list[str], NoDecode] = []
    """Browser origins besides the server's own (`scheme://host[:port]`, comma list) whose pages
    may send state-changing requests and open WebSockets without an API key (with the Studio's
    session cookie, or on an open server). Keyed requests (Bearer, `?token=`) need no entry."""
    cors_origins: Annotated[list[str], NoDecode] = []
    """Origins (comma list, or `*`) whose pages may read API responses (CORS); empty = CORS off.
    Never with credentials: cross-origin pages authenticate with `Authorization: Bearer`.
    Explicit origins here are allowed origins too; `*` is not."""
    header_timeout: float = Field(10, gt=0)
    """Seconds a client has to send a whole request head (request line and headers), counted from
    the connection's start or its previous response; then it is closed (408 if it began one)."""
    body_timeout: float = Field(30, gt=0)
    """Seconds a client has to send a whole request body once its head has arrived; then 408
    and the connection is closed."""
    http_send_timeout: float = Field(300, gt=0)
    """Seconds an HTTP client may accept no response bytes (its window full, nothing read)
    before its connection is dropped, as if it had hung up. Long: a paused player may stop
    reading a while."""
    keepalive_timeout: int = Field(5, ge=1)
    """Seconds an idle keep-alive connection stays open after a response."""
    max_connections: int = Field(512, ge=1)
    """Open client connections (HTTP and WebSocket) at once; a request on one more is answered
    503 (`too_many_connections`, WebSocket close 1013) and its connection closed."""
    max_header_bytes: int = Field(65536, ge=1024)
    """Largest request head (request line and headers); over it 414 (a long URL) or 431. The
    default fits a `GET /api/tts` of `max_input_chars` characters of any script."""

    @field_validator("allowed_origins", "cors_origins")
    @classmethod
    def _origins(cls, value: list[str], info: ValidationInfo) -> list[str]:
        origins = [origin.rstrip("/") for origin in value]
        for origin in origins:
            if origin == "*" and info.field_name == "cors_origins":
                continue
            if not _ORIGIN.fullmatch(origin):
                raise ValueError(f"{origin!r} is not an origin like https://app.example:8443")
        return origins

    @field_validator("model_providers")
    @classmethod
    def _model_providers(cls, value: dict[str, str]) -> dict[str, str]:
        for model_id, providers in value.items():
            if not _split_csv(providers):
                raise ValueError(f"model {model_id!r}: name at least one provider")
        return value

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts(cls, value: list[str]) -> list[str]:
        hosts = [host.lower().rstrip(".") for host in value]
        for host in hosts:
            if host != "*" and not _HOST.fullmatch(host):
                raise ValueError(f"{host!r} is not a host name like voxmux.example (no scheme, "
                                 "no port)")
        return hosts

    @field_validator("preload", "providers", "api_keys", "allowed_hosts", "allowed_origins",
                     "cors_origins", mode="before")
    @classmethod
    def _csv(cls, value: Any) -> Any:
        return _split_csv(value)

    @property
    def lexicon_path(self) -> Path:
        return self.lexicon or self.config_dir / "lexicon.toml"

    @property
    def catalogue_path(self) -> Path:
        return self.catalogue or self.config_dir / "models.toml"

    @property
    def client_places(self) -> int:
        """`client_max_requests`, its default worked out."""
        capacity = self.concurrency + self.queue_size
        return self.client_max_requests or max(self.concurrency, capacity // 2)

    def ttl_for(self, model_id: str) -> float:
        return self.model_ttl.get(model_id, self.idle_ttl)

    def providers_for(self, model_id: str) -> list[str]:
        own = self.model_providers.get(model_id)
        return _split_csv(own) if own is not None else list(self.providers)

    def instances_for(self, model_id: str) -> int:
        return self.model_instances.get(model_id, self.instances)


def profiles_dir() -> Path:
    return Path(os.environ.get("VOXMUX_CONFIG_DIR") or CONFIG) / "profiles"


def profile_path(name: str) -> Path:
    folder = profiles_dir()
    path = folder / f"{name}.env"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in folder.glob("*.env")))
        raise ValueError(f"unknown profile '{name}' (known: {known})")
    return path


def load_settings(profile: str | None = None, **overrides: Any) -> Settings:
    """Settings from a profile env file, the environment (wins) and explicit overrides (win)."""
    env_file = profile_path(profile) if profile else None
    if profile:  # the profile named here wins over a VOXMUX_PROFILE left in the environment
        overrides.setdefault("profile", profile)
    return Settings(_env_file=env_file, **overrides)

