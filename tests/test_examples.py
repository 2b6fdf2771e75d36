"""Every shell and Python example of README.md and docs/*.md runs against a real server.

Collected: each fenced block whose info string is `sh`, `bash`, `shell` or `python` is
one test, named by its file and the line of its opening fence (`docs/cli.md:16`); other blocks
(json, toml, text, none) are output or configuration and are not run. A block is skipped only
when the line right before its fence is

    <!-- example: skip REASON -->

with a reason (it needs a GPU, docker, a Ray cluster, a benchmark of minutes, or it starts a
server that runs until stopped); the reason is the skip's. Any other `<!-- example: ... -->` there
is an error. Everything else runs, as a user would run it:

- against one live server for the module (hibari, kokoro and piper preloaded, Wyoming on):
  `127.0.0.1:8100` and `localhost:8100` in the block become its address, and `"127.0.0.1",
  10200` its Wyoming port. A block that names `VOXMUX_KEY` runs against a second server that
  requires that key, with the key in `$VOXMUX_KEY`.
- in a fresh directory standing for the checkout a server runs from: `.venv` links to the
  project's virtualenv, `models` to the live server's models folder, and the user's files the
  examples read are there: `tests/examples/*` (book.md, notes.md), `town.epub` and
  `my_voice.npy` (a Kokoro voice, blended from two embedded ones).
- shell blocks with `bash -euo pipefail`, `.venv/bin` first on PATH (so `voxmux` is the
  project's command), the VOXMUX_* folders of the server's own temporary tree (the Kokoro cache
  shared with the suite's), and `curl` as `curl --fail-with-body`, so an HTTP error fails the
  block; Python blocks with the virtualenv's interpreter, as a script.

Each block must exit 0 within `TIMEOUT` seconds; then every audio file it left (by suffix, and
each one inside a `.zip` it left) must decode with PyAV (FFmpeg), last over 0.3 s and not be
silent; a `.pcm` file must be 16-bit samples, not silent. The last test prints how many examples
ran and how many were skipped, by reason.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import zipfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import CACHE_DIR, LiveServer, decode, free_port, start_server, test_settings
from tests.epubs import make_epub

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FILES = Path(__file__).resolve().parent / "examples"
LANGUAGES = {"sh": "shell", "bash": "shell", "shell": "shell", "python": "python"}
AUDIO = {".mp3", ".wav", ".flac", ".ogg", ".opus", ".aac", ".m4b", ".pcm"}
TIMEOUT = 180
KEY = "sk-examples-0123456789abcdef"
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
MARKER = re.compile(r"^\s*<!--\s*example:(.*?)-->\s*$")
SKIP = re.compile(r"^\s*skip\s+(\S.*?)\s*$")
ADDRESS = re.compile(r"\b(?:127\.0\.0\.1|localhost):8100\b")
WYOMING = re.compile(r"""(["']127\.0\.0\.1["'],\s*)10200\b""")
# A shell block runs after this: curl fails on an HTTP error (and prints the error's body).
PREAMBLE = 'curl() { command curl --fail-with-body "$@"; }\n'


@dataclass(frozen=True)
class Example:
    page: str  # relative to the root: README.md, docs/cli.md
    line: int  # of the opening fence, from 1
    language: str  # shell or python
    code: str
    skip: str | None  # the reason, when the page marks it skipped

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def collect(path: Path) -> list[Example]:
    """The runnable blocks of one Markdown page."""
    lines = path.read_text().splitlines()
    page = path.relative_to(ROOT).as_posix()
    found: list[Example] = []
    n = 0
    while n < len(lines):
        opening = FENCE.match(lines[n])
        if not opening:
            n += 1
            continue
        indent, fence, info = opening.groups()
        end = n + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        body = [line.removeprefix(indent) for line in lines[n + 1:end]]
        marker = MARKER.match(lines[n - 1]) if n else None
        skip = None
        if marker:
            reason = SKIP.match(marker.group(1))
            if reason is None:
                raise ValueError(f"{page}:{n}: an example marker is `<!-- example: skip "
                                 f"REASON -->`, not {lines[n - 1].strip()!r}")
            skip = reason.group(1)
        language = LANGUAGES.get(info.lower())
        if language is not None:
            found.append(Example(page, n + 1, language, "\n".join(body) + "\n", skip))
        elif marker:
            raise ValueError(f"{page}:{n}: a marker before a block that is never run")
        n = end + 1
    return found


EXAMPLES = [example for page in PAGES for example in collect(page)]
OUTCOMES: dict[str, str | None] = {}  # id -> None when it ran, else the reason it was skipped


@dataclass
class Servers:
    live: LiveServer
    keyed: LiveServer | None
    tmp: Path
    wyoming_port: int
    files: Path


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    tmp = tmp_path_factory.mktemp("examples")
    (tmp / "models").mkdir()
    wyoming = free_port()
    live = start_server(test_settings(tmp, preload=["hibari", "kokoro", "piper"], idle_ttl=-1,
                                      wyoming_port=wyoming))
    keyed = None
    try:
        if any("VOXMUX_KEY" in e.code and e.skip is None for e in EXAMPLES):
            keyed = start_server(test_settings(tmp / "keyed", preload=[], api_keys=[KEY]))
        yield Servers(live, keyed, tmp, wyoming, user_files(tmp / "files"))
    finally:
        if keyed is not None:
            keyed.stop()
        live.stop()


def user_files(folder: Path) -> Path:
    """The files the examples read, as a user would have them beside the commands."""
    shutil.copytree(FILES, folder)
    (folder / "town.epub").write_bytes(make_epub(
        [("Morning", "<p>The baker opened his shop before the sun was up.</p>"),
         ("Evening", "<p>The lamps were lit and the town went quiet.</p>")],
        title="A Day in Town", identifier="voxmux-examples-town", author="Tom Teller"))
    from engines.kokoro import _package_data

    with np.load(_package_data("voices_ja.npz")) as pack:
        np.save(folder / "my_voice.npy", (pack["jf_alpha"] + pack["jm_kumo"]) / 2)
    return folder


def prepare(example: Example, servers: Servers, tmp: Path) -> tuple[list[str], dict[str, str]]:
    """The command and environment that run `example` in `tmp / "cwd"`."""
    keyed = "VOXMUX_KEY" in example.code
    server = servers.keyed if keyed else servers.live
    assert server is not None
    address = server.url.removeprefix("http://")
    code = ADDRESS.sub(address, example.code)
    code = WYOMING.sub(lambda m: f"{m.group(1)}{servers.wyoming_port}", code)
    venv = ROOT / ".venv"
    env = {**os.environ,
           "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
           "VIRTUAL_ENV": str(venv),
           "VOXMUX_CACHE_DIR": str(CACHE_DIR),
           "VOXMUX_DATA_DIR": str(servers.tmp / "data"),
           "VOXMUX_LEXICONS_DIR": str(servers.tmp / "lexicons"),
           "VOXMUX_CREDENTIALS_DIR": str(servers.tmp / "credentials")}
    env.pop("PYTHONPATH", None)
    if keyed:
        env["VOXMUX_KEY"] = KEY
    if example.language == "python":
        script = tmp / "example.py"
        script.write_text(code)
        return [str(venv / "bin" / "python"), str(script)], env
    script = tmp / "example.sh"
    script.write_text(PREAMBLE + code)
    return ["bash", "-euo", "pipefail", str(script)], env


def check_audio(name: str, data: bytes) -> None:
    suffix = Path(name).suffix
    assert data, f"{name} is empty"
    if suffix == ".pcm":
        assert len(data) % 2 == 0, f"{name}: {len(data)} bytes, not 16-bit samples"
        decoded = decode(data, "pcm", 24_000)
        assert decoded.rms > 0.005, f"{name} is silent (RMS {decoded.rms:.4f})"
        return
    try:
        decoded = decode(data, suffix.removeprefix("."))
    except Exception as exc:  # name the file, whatever FFmpeg said
        raise AssertionError(f"{name} does not decode: {exc!r}; starts {data[:120]!r}") from exc
    assert decoded.duration > 0.3, f"{name} lasts {decoded.duration:.2f} s"
    assert decoded.rms > 0.005, f"{name} is silent (RMS {decoded.rms:.4f})"


def left_audio(cwd: Path) -> Iterator[tuple[str, bytes]]:
    """Every audio file under `cwd` (links not followed), and inside each ZIP there."""
    for folder, dirs, names in os.walk(cwd):
        dirs[:] = [d for d in dirs if not (Path(folder) / d).is_symlink()]
        for name in names:
            path = Path(folder) / name
            if path.is_symlink():
                continue
            relative = path.relative_to(cwd).as_posix()
            if path.suffix in AUDIO:
                yield relative, path.read_bytes()
            elif path.suffix == ".zip":
                with zipfile.ZipFile(io.BytesIO(path.read_bytes())) as archive:
                    for member in archive.namelist():
                        if Path(member).suffix in AUDIO:
                            yield f"{relative}!{member}", archive.read(member)


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.id for e in EXAMPLES])
def test_example(example: Example, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    if example.skip is not None:
        OUTCOMES[example.id] = example.skip
        pytest.skip(example.skip)
    OUTCOMES[example.id] = None
    servers: Servers = request.getfixturevalue("servers")
    cwd = tmp_path / "cwd"
    shutil.copytree(servers.files, cwd)
    (cwd / ".venv").symlink_to(ROOT / ".venv")
    (cwd / "models").symlink_to(servers.tmp / "models")
    command, env = prepare(example, servers, tmp_path)
    try:
        done = subprocess.run(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=TIMEOUT, check=False)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{example.id} ran over {TIMEOUT} s\n--- stdout\n{exc.stdout!r}\n"
                    f"--- stderr\n{exc.stderr!r}")
    assert done.returncode == 0, (
        f"{example.id} exited {done.returncode}\n--- code\n{Path(command[-1]).read_text()}"
        f"--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}")
    for name, data in left_audio(cwd):
        check_audio(name, data)


def test_examples_counted(request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
                          ) -> None:
    """Every example selected in this session ran or was skipped; how many of each, and why."""
    selected = [item.callspec.id for item in request.session.items
                if isinstance(item, pytest.Function) and item.path == Path(__file__)
                and item.originalname == "test_example"]
    assert sorted(OUTCOMES) == sorted(selected), set(selected) ^ set(OUTCOMES)
    reasons = Counter(reason for reason in OUTCOMES.values() if reason is not None)
    run = sum(1 for reason in OUTCOMES.values() if reason is None)
    why = ", ".join(f"{reason}: {count}" for reason, count in sorted(reasons.items()))
    with capsys.disabled():
        print(f"\nexamples: {run} run, {sum(reasons.values())} skipped"
              + (f" ({why})" if why else ""))
