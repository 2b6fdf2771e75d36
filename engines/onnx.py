"""onnxruntime session creation shared by the ONNX engines.

Sessions ask for the configured execution providers and report which ones they actually got, so
a CUDA request that fell back to CPU is visible to `/health` and the log, never silent. There are
two ways to lose a provider, and they have different fixes: the installed onnxruntime build lacks
it (install onnxruntime-gpu), or the build has it but the session could not create it (CUDA or
cuDNN libraries missing, no usable GPU). `check_providers()` finds both at start, before any model
loads, and every later session open re-checks.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import logging
import os
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from engines.base import CancelToken, public_text

log = logging.getLogger(__name__)

def _ort() -> Any:
    """onnxruntime, imported on first use: only a process that runs an engine pays for it (a
    cluster's ingress never does)."""
    import onnxruntime

    return onnxruntime


CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
_PROVIDER_LIBRARIES = {CUDA: "libonnxruntime_providers_cuda.so",
                       "TensorrtExecutionProvider": "libonnxruntime_providers_tensorrt.so"}
_NEEDS_NVIDIA_LIBS = {CUDA: "CUDA/cuDNN", "TensorrtExecutionProvider": "CUDA/cuDNN/TensorRT"}


@dataclass
class RuntimeOptions:
    providers: tuple[str, ...] = (CPU,)
    intra_op_threads: int = 0
    """0 lets onnxruntime choose (one per physical core)."""
    inter_op_threads: int = 1
    spinning: bool = False
    """Whether idle intra-op threads busy-wait for the next parallel step. Off by default: on a
    CPU shared with the event loop, the encoders and other requests the spinning threads take
    the time slices the work needs (Piper ran 16-20 % faster without it, bench/)."""
    provider_options: dict[str, dict[str, str]] = field(default_factory=dict)
    """Options per provider, e.g. `{"CUDAExecutionProvider": {"device_id": "1"}}`."""
    fallbacks: list[str] = field(default_factory=list)
    """Human-readable notes of providers asked for but not obtained, one per provider."""
    in_use: list[str] = field(default_factory=list)
    """Providers the opened sessions actually run on, in order of first use."""
    batch_size: int = 1
    """Most segments of different requests one run takes, on graphs that can batch
    (`engines.batching`); 1: none batch."""
    batch_wait: float = 0.005
    """Seconds a segment waits for others to join its run (only when `batch_size` > 1)."""
    instances: int = 1
    """Sessions of each graph an engine opens (`open_pool`), each running one call at a time
    where there are as many calls as sessions: on a GPU each session has its own CUDA stream, so
    short inferences of different requests overlap on the card. On a CPU one session already
    spreads over every core, so more than one only costs memory."""
    _noted: set[str] = field(default_factory=set, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def note_fallback(self, provider: str, note: str) -> None:
        """Record why `provider` is not in use; logged once per provider at warning level."""
        with self._lock:
            if provider in self._noted:
                return
            self._noted.add(provider)
            self.fallbacks.append(note)
        log.warning(note)

    def note_in_use(self, providers: list[str]) -> None:
        with self._lock:
            self.in_use.extend(p for p in providers if p not in self.in_use)

    def for_model(self, providers: Iterable[str] | None = None, instances: int | None = None
                  ) -> RuntimeOptions:
        """These options with one model's own providers and instances; the notes (fallbacks,
        providers in use) stay shared, so `/health` hears of every model's fallback."""
        return replace(self, providers=self.providers if providers is None else tuple(providers),
                       instances=self.instances if instances is None else instances)


def usable_cores() -> int:
    """The cores this process may run on (its affinity, e.g. a container's cpuset)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def available_providers() -> list[str]:
    """Providers compiled into the installed onnxruntime build (not proof that they work)."""
    return list(_ort().get_available_providers())


def runtime_version() -> str:
    return str(_ort().__version__)


def runtime_package() -> str:
    """`onnxruntime-gpu` when the installed build has CUDA, else `onnxruntime`."""
    return "onnxruntime-gpu" if CUDA in available_providers() else "onnxruntime"


def _unavailable_note(provider: str, available: list[str]) -> str:
    hint = "; install onnxruntime-gpu in place of onnxruntime" if provider == CUDA else ""
    return (f"{provider} requested but not available in this onnxruntime {runtime_version()} "
            f"build (providers: {', '.join(available)}); running on {CPU}{hint}")


def _library_error(provider: str) -> str | None:
    """The shared library a provider cannot load, found by loading its onnxruntime plugin the way
    onnxruntime does; None when it loads (the GPU or driver is the problem) or is not a file."""
    plugin = _PROVIDER_LIBRARIES.get(provider)
    capi = Path(_ort().__file__).parent / "capi"
    if plugin is None or not (capi / plugin).is_file():
        return None
    try:
        ctypes.CDLL(str(capi / "libonnxruntime_providers_shared.so"), mode=ctypes.RTLD_GLOBAL)
        ctypes.CDLL(str(capi / plugin))
    except OSError as exc:
        return f"{plugin} cannot load: {public_text(str(exc))}"
    return None


def _short_error(error: Exception) -> str:
    """The telling part of onnxruntime's provider error, without its C++ template noise."""
    text = " ".join(str(error).split())
    for marker in ("Failed to load library", "CUDA failure", "CUDNN failure", "cudaError"):
        if marker in text:
            return text[text.index(marker):].split(" ; ")[0][:300]
    return text[-300:]


def _fell_back_note(provider: str, got: list[str], error: str | None = None) -> str:
    if error or (error := _library_error(provider)):
        cause = error
    elif libs := _NEEDS_NVIDIA_LIBS.get(provider):
        cause = f"{libs} libraries it was built for or a usable NVIDIA GPU are missing"
    else:
        cause = "the provider failed to initialise"
    return f"{provider} requested but the session fell back to {', '.join(got)} ({cause})"


@functools.cache
def _preload_nvidia_wheels() -> None:
    """Load CUDA/cuDNN from the `nvidia-*` pip wheels when they are installed (the `gpu` extra);
    a CUDA base image provides them system-wide instead and needs nothing here."""
    if not hasattr(_ort(), "preload_dlls") or importlib.util.find_spec("nvidia") is None:
        return
    try:
        _ort().preload_dlls(directory="")
    except Exception as exc:  # the session open that follows reports the real outcome
        log.debug("onnxruntime.preload_dlls failed: %s", exc)


def _create(model: Path | bytes, options: RuntimeOptions, intra_op_threads: int | None = None
            ) -> Any:
    opts = _ort().SessionOptions()
    opts.intra_op_num_threads = (options.intra_op_threads if intra_op_threads is None
                                 else intra_op_threads)
    opts.inter_op_num_threads = options.inter_op_threads
    opts.add_session_config_entry(
        "session.intra_op.allow_spinning", "1" if options.spinning else "0"
    )
    opts.graph_optimization_level = _ort().GraphOptimizationLevel.ORT_ENABLE_ALL
    # Without the arena every large tensor is a fresh allocation the kernel must fault in (Piper
    # 15-25 % and Kokoro ~35 % slower, bench/), and glibc keeps the RSS of a long input anyway.
    # The arena is not shrunk after each run: freeing its chunks to glibc only to fault them in
    # again cost 5-10 % per request and left more RSS behind after bursts, not less. Its memory
    # goes with the session at unload (the registry then trims the heap).
    opts.enable_cpu_mem_arena = True
    # Memory patterns are planned from the first run's shapes, and speech inputs change shape on
    # every call: with them on, onnxruntime 1.18 (the legacy-gpu pin) fails every Piper run after
    # the first ("invalid expand shape" in the duration predictor).
    opts.enable_mem_pattern = False
    available = available_providers()
    wanted: list[str] = []
    for provider in options.providers:
        if provider in available:
            wanted.append(provider)
        else:
            options.note_fallback(provider, _unavailable_note(provider, available))
    if CPU not in wanted:
        wanted.append(CPU)
    if any(p in _NEEDS_NVIDIA_LIBS for p in wanted):
        _preload_nvidia_wheels()
    source = model if isinstance(model, bytes) else str(model)
    error: str | None = None
    try:
        # Without its own fallback onnxruntime raises the provider's error instead of printing
        # it, so the note can name the cause (onnxruntime before 1.19 ignores the flag).
        session = _ort().InferenceSession(
            source, sess_options=opts, providers=wanted,
            provider_options=[options.provider_options.get(p, {}) for p in wanted],
            enable_fallback=0,
        )
    except (RuntimeError, ValueError) as exc:
        if wanted == [CPU]:
            raise
        error = _short_error(exc)
        session = _ort().InferenceSession(source, sess_options=opts, providers=[CPU])
    got = list(session.get_providers())
    for provider in wanted:
        if provider not in got:
            options.note_fallback(provider, _fell_back_note(provider, got, error))
    return session


def open_session(model: Path | bytes, options: RuntimeOptions,
                 intra_op_threads: int | None = None) -> Any:
    """A session with `options`; `intra_op_threads` overrides theirs (an engine whose
    inferences are too small to split over threads)."""
    session = _create(model, options, intra_op_threads)
    options.note_in_use(list(session.get_providers()))
    return session


class SessionPool:
    """Sessions of one graph that take calls at once (`RuntimeOptions.instances`).

    A call takes the least busy session (the first free one, so a lone call always runs on the
    first) and gives it back when it ends, however it ends (an error, a cancel): a pool never
    blocks a call, and with more calls than sessions several share one, as every call shared the
    one session before there were pools. Which session runs a call does not change its samples:
    they are opened alike from one file."""

    def __init__(self, sessions: Iterable[Any], vram_mib: float | None = None,
                 vram_note: str = "") -> None:
        self.sessions = tuple(sessions)
        if not self.sessions:
            raise ValueError("a session pool needs a session")
        self.vram_mib = vram_mib
        """Device memory one session took as it opened (its weights), where it runs on CUDA and
        NVML can tell; None otherwise, `vram_note` saying why."""
        self.vram_note = vram_note
        self._busy = [0] * len(self.sessions)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.sessions)

    def busy(self) -> tuple[int, ...]:
        """Calls running on each session now."""
        with self._lock:
            return tuple(self._busy)

    @contextmanager
    def take(self) -> Iterator[Any]:
        with self._lock:
            index = min(range(len(self._busy)), key=self._busy.__getitem__)
            self._busy[index] += 1
        try:
            yield self.sessions[index]
        finally:
            with self._lock:
                self._busy[index] -= 1

    def providers(self) -> tuple[str, ...]:
        return session_providers(self.sessions)


def _device_used(device: int) -> int | None:
    """Bytes in use on CUDA device `device` (NVML, the `nvidia-ml-py` package); None where NVML
    cannot tell (no driver, not installed)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(device)).used)
    except Exception:
        return None


def open_pool(model: Path | bytes, options: RuntimeOptions, instances: int | None = None,
              intra_op_threads: int | None = None) -> SessionPool:
    """`instances` sessions (default: `options.instances`) of `model`, opened one after the
    other, each as `open_session` opens one. Where they run on CUDA, the growth of the device's
    used memory while each opened is its VRAM (the mean over the sessions).

    Each session reads the graph on its own. Sharing the weights between them (onnxruntime's
    `add_initializer`) measured worse for two instances and barely better for four on CPU (each
    session still packs its own copy for its matrix kernels), and does not reach the copy CUDA
    makes on the card (bench/results/instances.md)."""
    count = max(1, options.instances if instances is None else instances)
    device = int(options.provider_options.get(CUDA, {}).get("device_id", 0))
    sessions, grown = [], []
    for _ in range(count):
        before = _device_used(device) if CUDA in options.providers else None
        session = open_session(model, options, intra_op_threads)
        sessions.append(session)
        if before is not None and CUDA in session.get_providers():
            after = _device_used(device)
            if after is not None:
                grown.append(max(after - before, 0))
    vram: float | None = None
    if CUDA not in session_providers(sessions):
        note = "runs on the CPU"
    elif len(grown) == count:
        vram, note = round(sum(grown) / count / 2**20, 1), ""
    else:
        note = "NVML cannot read the device's memory"
    return SessionPool(sessions, vram, note)


def session_providers(sessions: Iterable[Any]) -> tuple[str, ...]:
    """The providers `sessions` run on, in order of first mention; closed ones (None) skipped."""
    found: dict[str, None] = {}
    for session in sessions:
        if session is not None:
            found.update(dict.fromkeys(session.get_providers()))
    return tuple(found)


def run(session: Any, feeds: dict[str, Any], cancel: CancelToken,
        outputs: list[str] | None = None) -> list[Any]:
    """`session.run` that `cancel` can stop mid-inference: its hook sets the run's
    `RunOptions.terminate`, and onnxruntime gives up at its next node. `outputs`: only these
    (onnxruntime then runs only the nodes they need); None: every output."""
    cancel.check()
    options = _ort().RunOptions()
    forget = cancel.on_cancel(lambda: setattr(options, "terminate", True))
    try:
        return list(session.run(outputs, feeds, options))
    except Exception:
        cancel.check()  # stopped because we asked: a cancel, not an engine failure
        raise
    finally:
        forget()


@contextmanager
def writing(target: Path) -> Iterator[Path]:
    """A path to write `target` at, renamed into place when the block ends and deleted when it
    raises (a full disk, a failed check, Ctrl-C): a reader never sees half a
    file, and no failed attempt is left behind. The name is this process's and thread's, so two
    servers (or Ray replicas) filling one cache dir never write one file."""
    partial = target.with_name(f"{target.name}.part{os.getpid()}-{threading.get_ident()}")
    try:
        yield partial
        partial.replace(target)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def with_outputs(source: Path, target: Path, names: tuple[str, ...], stamp: str) -> bool:
    """Write `source` to `target` with the inner tensors `names` added to its graph outputs
    (the `onnx` package edits the graph; nothing else changes, so the audio is the same).

    Done once: `stamp` (what identifies `source`) is kept beside `target`, and a target with the
    same stamp is reused. False when the graph lacks one of the tensors (another export)."""
    marker = target.with_name(target.name + ".stamp")
    wanted = f"{stamp} {' '.join(names)}"
    if target.exists() and marker.exists() and marker.read_text() == wanted:
        return True
    import onnx
    from onnx import helper

    model = onnx.load(str(source))
    produced = {output for node in model.graph.node for output in node.output}
    if any(name not in produced for name in names):
        return False
    existing = {output.name for output in model.graph.output}
    for name in names:
        if name not in existing:
            model.graph.output.append(helper.make_empty_tensor_value_info(name))
    target.parent.mkdir(parents=True, exist_ok=True)
    with writing(target) as partial:
        onnx.save(model, str(partial))
        del model
    marker.write_text(wanted)
    return True


def _message(*fields: bytes) -> bytes:
    return b"".join(fields)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _int(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def _bytes(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _probe_model() -> bytes:
    """A one-node ONNX model (float[1] Identity), serialised by hand so probing a provider
    needs neither the `onnx` package nor any engine's weights."""
    shape = _bytes(2, _bytes(1, _int(1, 1)))  # TensorShapeProto{dim{dim_value: 1}}
    tensor_type = _bytes(1, _message(_int(1, 1), shape))  # float32
    def value_info(name: bytes) -> bytes:
        return _message(_bytes(1, name), _bytes(2, tensor_type))
    node = _message(_bytes(1, b"x"), _bytes(2, b"y"), _bytes(4, b"Identity"))
    graph = _message(_bytes(1, node), _bytes(2, b"probe"),
                     _bytes(11, value_info(b"x")), _bytes(12, value_info(b"y")))
    return _message(_int(1, 8), _bytes(2, b"voxmux-probe"), _bytes(7, graph),
                    _bytes(8, _int(2, 13)))


def probe_providers(options: RuntimeOptions) -> list[str]:
    """Providers a session with these options really gets, from a throwaway one-node session."""
    return list(_create(_probe_model(), options).get_providers())


def check_providers(options: RuntimeOptions) -> list[str]:
    """At start, before any model loads: record every requested provider this runtime cannot
    give, so `/health` is truthful from the first request. A session is only opened (the probe)
    when an accelerator is requested and compiled in; a CPU-only setup costs nothing."""
    available = available_providers()
    if any(p != CPU and p in available for p in options.providers):
        probe_providers(options)
    else:
        for provider in options.providers:
            if provider not in available:
                options.note_fallback(provider, _unavailable_note(provider, available))
    return list(options.fallbacks)
