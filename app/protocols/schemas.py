"""Request and response bodies of the HTTP API (pydantic models only)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator

from engines.registry import ModelStatus

ResponseFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    @field_validator("*")
    @classmethod
    def _encodable(cls, value: Any) -> Any:
        # A JSON escape like "\ud800" smuggles in a lone surrogate that no encoder downstream
        # (cache key, engine, error body) accepts: refuse it here, as a 400.
        if isinstance(value, str):
            try:
                value.encode()
            except UnicodeEncodeError:
                raise ValueError("text must be valid Unicode, not a lone surrogate") from None
        return value


class VoiceRef(Strict):
    id: str = Field(min_length=1)


def voice_id(voice: str | VoiceRef | None) -> str | None:
    return voice.id if isinstance(voice, VoiceRef) else voice


class SpeechOptions(Strict):
    """The speech fields every VoxMux route shares, without the text."""

    model: str = Field(min_length=1)
    voice: str | VoiceRef | None = None
    instructions: str | None = None
    speed: float = Field(1.0, ge=0.25, le=4.0)
    language: str | None = Field(None, description="Override the detected language (e.g. ja)")

    @property
    def voice_id(self) -> str | None:
        return voice_id(self.voice)

    def plan_fields(self) -> dict[str, Any]:
        """The keyword arguments of `SpeechService.plan` these options set."""
        return {"model": self.model, "voice": self.voice_id, "speed": self.speed,
                "language": self.language, "instructions": self.instructions}


class PronouncedOptions(SpeechOptions):
    """The speech fields of the routes that take SSML and report how text was read."""

    input_format: Literal["text", "ssml"] | None = Field(
        None, description="`ssml`: the input is SSML (also detected from a leading `<speak>`)")
    normalization_report: bool = Field(
        False, description="Report what each span was read as (say-as, sub, phoneme, lexicon) "
        "in the `X-VoxMux-Normalization` header")

    def plan_fields(self) -> dict[str, Any]:
        return super().plan_fields() | {"input_format": self.input_format,
                                         "report": self.normalization_report}


Timestamps = Literal["word"]


class SpeechRequest(PronouncedOptions):
    """OpenAI's `POST /v1/audio/speech` body, plus `language`; `text` is an alias of `input`."""

    input: str = Field(validation_alias=AliasChoices("input", "text"))
    response_format: ResponseFormat = "mp3"
    stream_format: Literal["audio", "sse"] = "audio"
    timestamps: Timestamps | None = Field(
        None, description="`word`: a `speech.audio.timestamps` event before each segment's "
        "audio (SSE only)")


class CaptionedSpeechRequest(PronouncedOptions):
    """`POST /v1/audio/captioned_speech` (and Kokoro-FastAPI's `/dev/captioned_speech`): the
    speech fields, audio as base64 in JSON with its word timings. `model` defaults to `kokoro`
    as on Kokoro-FastAPI."""

    model: str = Field("kokoro", min_length=1)
    input: str = Field(validation_alias=AliasChoices("input", "text"))
    response_format: ResponseFormat = "mp3"
    stream: bool = Field(True, description="Newline-delimited JSON, one object per segment")
    return_timestamps: bool = True
    captions: Literal["srt", "vtt"] | None = Field(None, description="Add subtitle text")


class SynthOptions(Strict):
    """LunaVox's request fields without the text: `POST /v1/synth`, `WS /v1/stream`, and the
    init frame of `WS /v1/stream/text`. `voice` is a LunaVox mode word or a voice id
    (app.protocols.lunavox); the sampling fields are accepted and reported as ignored."""

    model: str | None = Field(None, min_length=1, description="Model id or alias (VoxMux's)")
    voice: str | VoiceRef | None = Field(
        None, description="base, custom (with speaker), clone, design, or a voice id"
    )
    speaker: str | None = Field(None, description="Voice id for voice=custom")
    instructions: str | None = None
    speed: float = Field(1.0, ge=0.25, le=4.0)
    language: str | None = Field(None, description="Override the detected language (e.g. ja)")
    instruct: str | None = None
    reference: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None
    seed: int | None = None

    @property
    def voice_id(self) -> str | None:
        return voice_id(self.voice)


class StreamRequest(SynthOptions):
    """The one request frame of `WS /v1/stream`: the options and the text."""

    input: str = Field(validation_alias=AliasChoices("input", "text"))


class SynthRequest(StreamRequest):
    """`POST /v1/synth`: the speech fields, one WAV file back; `model` defaults per settings."""

    response_format: Literal["wav"] = "wav"


class StreamFragment(Strict):
    """A frame after the init frame on `WS /v1/stream/text`: text to append, or the end."""

    text: str = ""
    end: bool = False


class SessionRequest(Strict):
    """`POST /v1/auth/session`: trade an API key for a browser session cookie."""

    key: str


WsAudioFormat = Literal["pcm_s16le", "wav"]


class WsOptions(PronouncedOptions):
    """First frame of `WS /ws/v1/tts/text`: the speech options, without text."""

    format: WsAudioFormat = Field(
        "pcm_s16le", description="Raw s16le mono, or the same preceded by one WAV header frame"
    )
    binary: bool = Field(True, description="False: audio as base64 in JSON `audio` frames")
    timestamps: Timestamps | None = Field(
        None, description="`word`: a `words` frame before each segment's audio")


class WsSpeechRequest(WsOptions):
    """The one request frame of `WS /ws/v1/tts`: the speech fields plus `format` and `binary`."""

    input: str = Field(validation_alias=AliasChoices("input", "text"))


class WsTextMessage(Strict):
    """A frame after the options on `WS /ws/v1/tts/text`: text to append, then the command."""

    type: Literal["text", "flush", "end", "cancel"] = "text"
    text: str = ""


class LexiconBody(Strict):
    """A lexicon's content: `entries` map a word to `/ipa/` or a respelling."""

    language: str = Field("en", min_length=2, max_length=16)
    scope: str = Field("", description="Empty (every model), a model id, or `model:voice`")
    entries: dict[str, str]


class LexiconCreate(LexiconBody):
    name: str = Field(min_length=1, max_length=64)


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


class ModelCard(BaseModel):
    id: str
    """The model id, or the alias asked for (`tts-1`)."""
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "voxmux"
    alias_of: str | None = None
    """For an alias: the model it names (its id); null for a model."""
    engine: str
    status: ModelStatus
    installed: bool = True
    aliases: list[str] = []
    description: str = ""
    default_voice: str = ""
    current: bool = False
    """The model last loaded or switched to (AngeVoice's active model)."""
    running: int = 0
    """Engine calls running now."""
    error: str | None = None
    voice_errors: dict[str, str] = {}
    replicas: list[str] | None = None
    """On a cluster (`voxmux serve --ray`): the engine replicas holding the model."""


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class VoiceCard(BaseModel):
    id: str
    name: str
    language: str
    gender: str
    model: str


class VoiceList(BaseModel):
    object: Literal["list"] = "list"
    data: list[VoiceCard]
    voices: list[VoiceCard]
    """The same list under the key Open WebUI reads (it takes each voice's `id` and `name`)."""


class AudioModel(BaseModel):
    id: str
    name: str


class AudioModelList(BaseModel):
    """`GET /v1/audio/models`, the shape Open WebUI reads for its TTS model picker."""

    models: list[AudioModel]


class SwitchRequest(Strict):
    model: str = Field(min_length=1)
    unload_previous: bool = True


class SwitchResponse(BaseModel):
    model: str
    previous: str | None
    previous_unloaded: bool
    previous_busy: bool
    status: ModelStatus


class ModelRescanCard(BaseModel):
    model: str
    added: list[str]
    removed: list[str]
    changed: list[str]
    """Voices whose files were replaced under the same id."""
    voice_errors: dict[str, str]
    cache_cleared: int


class RescanResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelRescanCard]


HealthStatus = Literal["ok", "loading", "degraded"]


class Health(BaseModel):
    status: HealthStatus
    idle: bool = False
    """No model is loaded now: the server is healthy, and the next request loads its model."""
    profile: str
    models: dict[str, dict[str, Any]]
    warnings: list[str] = []
    cluster: dict[str, Any] | None = None
    """On a cluster: the engine replicas, which models each holds, their queues."""


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 403, 404, 409, 429, 500, 503)
}


class BatchItem(SpeechOptions):
    """One item of `POST /v1/audio/batch`: a speech body (`stream_format` has no place here)."""

    input: str = Field(validation_alias=AliasChoices("input", "text"))
    response_format: ResponseFormat = "mp3"


class BatchRequest(Strict):
    """`POST /v1/audio/batch`: speech bodies, each checked on its own (a bad one fails alone)."""

    items: list[Any] = Field(min_length=1)


class JobItem(Strict):
    """One item of a job's `items`: its text and what it changes of the job's options."""

    input: str = Field(validation_alias=AliasChoices("input", "text"))
    title: str | None = None
    voice: str | VoiceRef | None = None
    speed: float | None = Field(None, ge=0.25, le=4.0)
    language: str | None = None


class JobRequest(SpeechOptions):
    """`POST /v1/audio/jobs`: the speech fields and a long `input` (plain text, Markdown or an
    EPUB in base64, per `input_format`) or a list of `items`; no `max_input_chars` limit."""

    input: str | None = Field(None, validation_alias=AliasChoices("input", "text"))
    input_format: Literal["text", "ssml", "markdown", "epub"] = Field(
        "text", description="`ssml`: the input is one SSML document (also detected from a "
        "leading `<speak>`); items are SSML when they start with `<speak>`")
    items: list[JobItem] | None = Field(
        None, min_length=1, description="At most `VOXMUX_BATCH_MAX_JOB_ITEMS` (10,000 unless "
        "set), counted before any is read; their texts together at most `VOXMUX_JOBS_MAX_CHARS`")
    response_format: ResponseFormat | Literal["m4b"] = Field(
        "mp3", description="`m4b`: the whole job is one audiobook (AAC in MP4, a chapter "
        "marker at each chapter, its title and author, an EPUB's cover); each chapter alone "
        "is AAC")
    title: str | None = Field(None, max_length=500,
                              description="The job's name (a book's title)")


class JobProgress(BaseModel):
    done: int
    total: int
    audio_seconds: float
    eta_seconds: float | None


class JobCard(BaseModel):
    id: str
    object: Literal["audio.job"] = "audio.job"
    kind: Literal["book", "batch"]
    status: Literal["queued", "running", "done", "failed", "cancelled"]
    created_at: int
    finished_at: int | None = None
    title: str | None = None
    model: str | None = None
    response_format: str | None = None
    progress: JobProgress
    error: ErrorInfo | None = None
    chapters: list[dict[str, Any]] | None = None


class JobList(BaseModel):
    """A page of the caller's jobs, newest first (`?limit=`, `?after=<the last id of the page
    before>`), as OpenAI pages its lists."""

    object: Literal["list"] = "list"
    data: list[JobCard]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False
