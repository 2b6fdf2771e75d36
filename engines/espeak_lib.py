"""eSpeak NG through ctypes on the library and data that `espeakng-loader` ships.

The C library keeps global state (current voice, parameters, one synth callback), so every call
goes through one process-wide lock. It serves two jobs: phonemes for the neural engines and speech
for the `espeak` engine.

Its wave generator also carries two counters from one synthesis to the next, statics inside its
functions: the phase of its pitch flutter (`Flutter_ix` in `AdvanceParameters`) and the glottal
cycle count its modulation keys on (`cycle_count` in `Wavegen`). So the same text spoken twice in
one process gave different samples, and a long job resumed in a fresh process would not have
matched an uninterrupted one. Every synthesis sets both to 0, as a fresh process has them, sets
its voice anew (which clears the echo buffer some variants fill) and seeds the noise generator:
the same request always gives the same samples. The Klatt variants (`+klatt*`) keep state of
their own in their resonators and are not reproducible this way. Function statics have no
exported name: their addresses come from the library's own symbol table (`_local_symbol`); a
stripped build without one speaks as before, only not reproducibly.
"""

from __future__ import annotations

import ctypes
import logging
import re
import struct
import threading
import unicodedata
from dataclasses import dataclass
from typing import Any

import espeakng_loader
import numpy as np

from engines.base import Audio, CancelToken

log = logging.getLogger(__name__)

_AUDIO_OUTPUT_SYNCHRONOUS = 2
_INITIALIZE_DONT_EXIT = 0x8000
_INITIALIZE_PHONEME_EVENTS = 0x0001
_EVENT_LIST_TERMINATED, _EVENT_WORD, _EVENT_PHONEME = 0, 1, 7
_CHARS_UTF8 = 1
_POS_CHARACTER = 1
_PHONEMES_IPA = 0x02
_PHONEME_INPUT = 0x100
"""espeakPHONEMES: `[[...]]` in the text is read as phoneme mnemonics."""
_RATE, _PITCH = 1, 3
DEFAULT_WPM = 175
MIN_WPM, MAX_WPM = 80, 450

# Punctuation kept around phonemized clauses: eSpeak drops it, but the neural models use it
# for prosody (pauses, question intonation).
_CLAUSE = re.compile(r"([^.,!?;:…。！？、，；：]+)([.,!?;:…。！？、，；：]*\s*)")
_PUNCT_ASCII = str.maketrans("。！？、，；：", ".!?,,;:")



class _EventStruct(ctypes.Structure):
    """`espeak_EVENT` of speak_lib.h."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("unique_identifier", ctypes.c_uint),
        ("text_position", ctypes.c_int),
        ("length", ctypes.c_int),
        ("audio_position", ctypes.c_int),
        ("sample", ctypes.c_int),
        ("user_data", ctypes.c_void_p),
        ("id", ctypes.c_char * 8),
    ]


_SynthCallback = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.POINTER(_EventStruct)
)


@dataclass(frozen=True)
class SpeechEvent:
    """A word starting (`word`, its 0-based character position in the text) or a phoneme
    starting (`word` -1; a pause when `pause`), at `sample` of the synthesized audio."""

    word: int
    sample: int
    pause: bool = False


def _local_symbol(path: str, prefix: bytes) -> int | None:
    """The value (offset in the library) of the first symbol in an ELF64 file's `.symtab` named
    `prefix` or `prefix.<n>` (how compilers name a function's static); None if absent."""
    with open(path, "rb") as handle:
        data = handle.read()
    if data[:5] != b"\x7fELF\x02" or data[5] != 1:  # 64-bit little-endian only
        return None
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
                for i in range(shnum)]
    for _name, kind, _flags, _addr, offset, size, link, _info, _align, entsize in sections:
        if kind != 2 or not entsize:  # SHT_SYMTAB
            continue
        strings = sections[link][4]
        for at in range(offset, offset + size, entsize):
            name_at, _sym_info, _other, _shndx, value, _size = struct.unpack_from(
                "<IBBHQQ", data, at)
            end = data.index(b"\0", strings + name_at)
            name = data[strings + name_at:end]
            if name == prefix or name.startswith(prefix + b"."):
                return int(value)
    return None


class _DlInfo(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]


_CARRIED = (b"Flutter_ix", b"cycle_count")
"""The wave generator's counters that run on from one synthesis to the next (ints, 0 at start)."""


def _carried_state(lib: Any, path: str) -> list[ctypes.c_int] | None:
    """`_CARRIED` in the loaded `lib`, or None where they cannot all be found."""
    try:
        offsets = [_local_symbol(path, name) for name in _CARRIED]
        info = _DlInfo()
        synth = ctypes.cast(lib.espeak_Synth, ctypes.c_void_p).value
        if None in offsets or not ctypes.CDLL(None).dladdr(ctypes.c_void_p(synth),
                                                           ctypes.byref(info)):
            return None
        return [ctypes.c_int.from_address(int(info.fbase) + offset)
                for offset in offsets if offset is not None]
    except (OSError, ValueError, struct.error, AttributeError):
        return None


class _VoiceStruct(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("languages", ctypes.c_void_p),
        ("identifier", ctypes.c_char_p),
        ("gender", ctypes.c_ubyte),
        ("age", ctypes.c_ubyte),
        ("variant", ctypes.c_ubyte),
        ("xx1", ctypes.c_ubyte),
        ("score", ctypes.c_int),
        ("spare", ctypes.c_void_p),
    ]


@dataclass(frozen=True)
class EspeakVoice:
    language: str
    name: str
    identifier: str
    gender: str


class EspeakLibrary:
    """One initialised eSpeak NG instance; use `espeak()` to get the shared one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        path = espeakng_loader.get_library_path()
        self._lib: Any = ctypes.CDLL(path)
        data = espeakng_loader.get_data_path().encode()
        self.sample_rate = int(
            # Phoneme events give word ends and pauses for timings; they change no sample.
            self._lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, data,
                                        _INITIALIZE_DONT_EXIT | _INITIALIZE_PHONEME_EVENTS)
        )
        if self.sample_rate <= 0:
            raise RuntimeError("eSpeak NG failed to initialise its data directory")
        self._lib.espeak_TextToPhonemes.restype = ctypes.c_char_p
        self._lib.espeak_TextToPhonemes.argtypes = [
            ctypes.POINTER(ctypes.c_char_p), ctypes.c_int, ctypes.c_int
        ]
        self._lib.espeak_ListVoices.restype = ctypes.POINTER(ctypes.POINTER(_VoiceStruct))
        self._chunks: list[Audio] = []
        self._cancel: CancelToken | None = None
        self._events: list[SpeechEvent] | None = None
        self._callback = _SynthCallback(self._on_audio)  # kept alive for the C side
        self._lib.espeak_SetSynthCallback(self._callback)
        self._current_voice = b""
        self._identifiers = {v.language: v.identifier for v in self.voices()}
        self._carried = _carried_state(self._lib, path)
        self._seed = getattr(self._lib, "espeak_ng_SetRandSeed", None)
        self.reproducible = self._carried is not None
        """Whether every synthesis starts from the same state (the same text, the same samples)."""
        if not self.reproducible:
            log.warning("eSpeak NG: no symbol table in %s; its audio varies from call to call",
                        path)

    def _on_audio(self, wav: Any, count: int, events: Any) -> int:
        if wav and count > 0:
            pcm = np.ctypeslib.as_array(wav, shape=(count,))
            self._chunks.append(pcm.astype(np.float32) / 32768.0)
        if self._events is not None and events:
            i = 0
            while (event := events[i]).type != _EVENT_LIST_TERMINATED:
                if event.type == _EVENT_WORD:
                    self._events.append(SpeechEvent(event.text_position - 1, event.sample))
                elif event.type == _EVENT_PHONEME:
                    pause = event.id[:1] in (b"", b"_")  # pauses: `_`, `_:`, `_!`
                    self._events.append(SpeechEvent(-1, event.sample, pause))
                i += 1
        return 1 if self._cancel is not None and self._cancel.cancelled else 0  # 1: abort

    def _set_voice(self, voice: str) -> None:
        # eSpeak looks voices up by file name; language codes like en-gb map to gmw/en.
        language, plus, variant = voice.partition("+")
        name = (self._identifiers.get(language, language) + plus + variant).encode()
        if name != self._current_voice:
            if self._lib.espeak_SetVoiceByName(name) != 0:
                raise ValueError(f"eSpeak NG has no voice '{voice}'")
            self._current_voice = name

    def voices(self) -> list[EspeakVoice]:
        with self._lock:
            array = self._lib.espeak_ListVoices(None)
            found: list[EspeakVoice] = []
            i = 0
            while array[i]:
                v = array[i].contents
                # `languages` is a list of (priority byte, NUL-terminated name); take the first.
                language = ctypes.string_at(v.languages + 1).decode()
                gender = {1: "male", 2: "female"}.get(v.gender, "")
                found.append(
                    EspeakVoice(language, (v.name or b"").decode(), v.identifier.decode(), gender)
                )
                i += 1
        return found

    def phonemize(self, text: str, voice: str) -> str:
        """IPA phonemes for `text`, keeping clause punctuation where it stood."""
        pieces: list[str] = []
        with self._lock:
            self._set_voice(voice)
            for clause, punct in _CLAUSE.findall(text):
                phonemes = self._clause_phonemes(clause) if clause.strip() else ""
                tail = punct.translate(_PUNCT_ASCII).strip()
                pieces.append(phonemes + tail)
        return unicodedata.normalize("NFC", " ".join(p for p in pieces if p))

    def _clause_phonemes(self, clause: str) -> str:
        buffer = ctypes.c_char_p(clause.encode())
        pointer = ctypes.pointer(buffer)
        out: list[str] = []
        while buffer.value:
            result = self._lib.espeak_TextToPhonemes(pointer, _CHARS_UTF8, _PHONEMES_IPA)
            if result:
                out.append(result.decode().strip())
        return " ".join(p for p in out if p)

    def synthesize(self, text: str, voice: str, wpm: int = DEFAULT_WPM, pitch: int = 50,
                   cancel: CancelToken | None = None) -> Audio:
        """Speech for `text`; `cancel` stops it at the next block of samples (`Cancelled`)."""
        return self.synthesize_events(text, voice, wpm, pitch, cancel, events=False)[0]

    def synthesize_events(self, text: str, voice: str, wpm: int = DEFAULT_WPM, pitch: int = 50,
                          cancel: CancelToken | None = None, *, events: bool = True,
                          phonemes: bool = False) -> tuple[Audio, list[SpeechEvent]]:
        """`synthesize`, with the word and phoneme events of the speech when `events`;
        `phonemes`: `[[...]]` in `text` are eSpeak phoneme mnemonics."""
        data = text.encode()
        with self._lock:
            self._current_voice = b""  # set anew: setting a voice clears the echo buffer
            self._set_voice(voice)
            self._lib.espeak_SetParameter(_RATE, max(MIN_WPM, min(MAX_WPM, wpm)), 0)
            self._lib.espeak_SetParameter(_PITCH, pitch, 0)
            self._chunks, self._cancel = [], cancel
            self._events = [] if events else None
            for counter in self._carried or ():
                counter.value = 0
            if self._seed is not None:
                self._seed(ctypes.c_long(1))
            try:
                status = self._lib.espeak_Synth(
                    data, len(data) + 1, 0, _POS_CHARACTER, 0,
                    _CHARS_UTF8 | (_PHONEME_INPUT if phonemes else 0), None, None
                )
            finally:
                chunks, self._chunks, self._cancel = self._chunks, [], None
                found, self._events = self._events or [], None
        if cancel is not None:
            cancel.check()
        if status != 0:
            raise RuntimeError(f"espeak_Synth failed with status {status}")
        if not chunks:
            return np.zeros(0, dtype=np.float32), found
        return np.concatenate(chunks), found


_shared: EspeakLibrary | None = None
_shared_lock = threading.Lock()


def espeak() -> EspeakLibrary:
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = EspeakLibrary()
        return _shared
