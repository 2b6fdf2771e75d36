"""`voxmux book BOOK.epub|BOOK.md|BOOK.txt -o BOOK.m4b`: a book into an audiobook, in this
process, on the job store and runner the server uses (`app.jobs`), so it can be stopped at any
moment and resumed: the same command again (same book, model, voice, speed and output format)
finds its job and renders only the segments not yet stored.

The command's jobs live in their own store, `<VOXMUX_DATA_DIR>/cli`, never the server's (whose
runner would resume them, and they its). Progress is a bar on a terminal (chapters, audio made,
time left) and one line per finished chapter otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import fcntl
import hashlib
import json
import logging
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from app.cli.local import FORMATS, Output, local_service
from app.jobs.model import BOOK_FORMAT, FINISHED, Job
from app.jobs.results import encoded, whole_chunks, whole_rate
from app.settings import Settings

if TYPE_CHECKING:  # imported by `book` when it runs: `say` and `voices` start without FastAPI,
    from app.jobs.runner import JobRunner  # which the runner's error bodies and the request's
    from app.protocols.schemas import JobRequest  # schema bring in (0.6 s of CPU a start)

OWNER = "cli"
INPUTS = {".epub": "epub", ".md": "markdown", ".markdown": "markdown", ".txt": "text"}
"""Input formats by the book's suffix."""
POLL_SECONDS = 1.0


class BookError(Exception):
    """One line for the user, exit status 2."""


def add_command(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    book = commands.add_parser(
        "book", help="turn a book (EPUB, Markdown, text) into an audiobook, resumably",
        description="Speak BOOK, a chapter at a time, into FILE: .m4b is one audiobook with "
        "chapter markers, title, author and cover; " + ", ".join(FORMATS) + " are the whole "
        "book in that format. Stopped (Ctrl-C, a kill), the same command resumes it.")
    book.add_argument("book", help="an .epub, .md or .txt file")
    book.add_argument("-o", "--output", required=True, metavar="FILE", help="the file to write")
    book.add_argument("-m", "--model", default="tts-1",
                      help="model id or alias (default tts-1: the model for the text's language)")
    book.add_argument("-v", "--voice", help="voice id (default: the model's)")
    book.add_argument("-s", "--speed", type=float, default=1.0, help="speed, 0.25 to 4")
    book.add_argument("--title", help="the book's title (default: the EPUB's, or none)")


def _request(args: argparse.Namespace) -> tuple[JobRequest, str]:
    """The job request for the command's book, and the key its job is found by again."""
    from app.protocols.schemas import JobRequest

    source = Path(args.book)
    kind = INPUTS.get(source.suffix.lower())
    if kind is None:
        raise BookError(f"cannot tell what '{source.name}' is: give an .epub, .md or .txt file")
    if not source.is_file():
        raise BookError(f"no such file: {source}")
    output = Path(args.output)
    suffix = output.suffix.lower()
    fmt = BOOK_FORMAT if suffix == ".m4b" else FORMATS.get(suffix)
    if fmt is None:
        raise BookError(f"cannot tell the format from '{output.name}': use .m4b or a suffix of "
                        + ", ".join(FORMATS))
    data = source.read_bytes()
    if kind == "epub":
        if not data.startswith(b"PK"):
            raise BookError(f"{source.name} is not an EPUB (an EPUB is a ZIP file)")
        text = base64.b64encode(data).decode()
    else:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise BookError(f"{source.name} is not UTF-8 text") from None
    try:
        request = JobRequest.model_validate({
            "model": args.model, "voice": args.voice, "speed": args.speed, "input": text,
            "input_format": kind, "response_format": fmt, "title": args.title})
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error.get("loc", ())) or "the book"
        raise BookError(f"{where}: {error['msg']}") from None
    asked = {"model": args.model, "voice": args.voice, "speed": args.speed, "format": fmt,
             "title": args.title}
    key = hashlib.sha256(data + json.dumps(asked, sort_keys=True).encode()).hexdigest()
    return request, key


def run(args: argparse.Namespace, settings: Settings) -> int:
    logging.basicConfig(level=logging.ERROR, format="voxmux: %(message)s")
    err = Console(stderr=True, highlight=False)
    try:
        request, key = _request(args)
        output = Output.of(args.output)
        settings = settings.model_copy(update={
            "data_dir": settings.data_dir / OWNER, "outputs_dir": None})
        try:
            with _alone(settings.data_dir, key):
                asyncio.run(_book(args, settings, request, key, output, err))
        except BaseException:
            output.drop()  # (its empty .part, made to check the place can be written)
            raise
        return 0
    except (BookError, ValueError) as exc:
        _fail(str(exc))
        return 2
    except OSError as exc:  # the output went (a full disk, a file size limit)
        _fail(f"cannot write the audio: {exc.strerror or exc}")
        return 1
    except KeyboardInterrupt:
        _fail("stopped; the same command resumes it")
        return 130


@contextmanager
def _alone(folder: Path, key: str) -> Iterator[None]:
    """One `voxmux book` per book and options at a time (a lock file in the command's store):
    a second would render the same job beside the first and race it to the output."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{key[:16]}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BookError("another voxmux book is making this book (same file and "
                            "options): wait for it, or stop it") from None
        yield


def _fail(message: str) -> None:
    sys.stderr.write(f"voxmux book: {' '.join(message.split())}\n")


async def _book(args: argparse.Namespace, settings: Settings, request: JobRequest, key: str,
                output: Output, err: Console) -> None:
    from app.jobs.front import start_job  # the jobs' front door: `say` starts without it
    from app.jobs.runner import JobRunner
    from engines.base import VoxMuxError

    async with local_service(settings) as service:
        runner = JobRunner(service, settings)
        await runner.start()
        try:
            store = runner.available().store
            job = await asyncio.to_thread(_found, store.jobs(owner=OWNER), key)
            if job is None:
                job = await start_job(runner, OWNER, request, OWNER, extra={"key": key})
            else:
                done, total, seconds = await asyncio.to_thread(store.counts, job.id)
                _say(err, f"resuming: {done} of {total} segments already made "
                          f"({seconds:.0f} s of audio)")
            job = await _follow(runner, job, err)
            if job.status != "done":
                raise BookError(f"the book failed: {(job.error or {}).get('message', job.status)}")
            await _write(runner, job, output)
            _, _, seconds = await asyncio.to_thread(store.counts, job.id)
        except VoxMuxError as exc:
            raise BookError(str(exc)) from None
        finally:
            await runner.stop()  # a job not done stays in the store, to be resumed
    _say(err, f"{args.output}: {seconds / 60:.1f} min of audio")


def _found(jobs: list[Job], key: str) -> Job | None:
    """The command's last job for this key that can still finish (a failed or cancelled one
    is started again)."""
    for job in sorted(jobs, key=lambda j: j.created, reverse=True):
        if job.request.get("key") == key and job.status not in ("failed", "cancelled"):
            return job
    return None


def _say(err: Console, line: str) -> None:
    err.print(line, markup=False, soft_wrap=True)


async def _follow(runner: JobRunner, job: Job, err: Console) -> Job:
    """Wait for the job to end, showing its progress."""
    store = runner.store
    progress = Progress(TextColumn("{task.description}"), BarColumn(),
                        TextColumn("{task.fields[audio]}"), TimeRemainingColumn(),
                        console=err, transient=True, disable=not err.is_terminal)
    task = progress.add_task("chapters", total=None, audio="")
    told = -1
    with progress:
        while True:
            current = await asyncio.to_thread(store.job, job.id)
            summaries = await asyncio.to_thread(store.summaries, job.id)
            if current is None:
                raise BookError("the job was deleted")
            chapters = sum(1 for s in summaries if s.done == s.segments or s.error)
            done = sum(s.done for s in summaries)
            total = sum(s.segments for s in summaries)
            seconds = sum(s.samples / s.sample_rate for s in summaries if s.sample_rate)
            progress.update(task, completed=done, total=total or None,
                            description=f"chapter {min(chapters + 1, len(summaries))}"
                                        f"/{len(summaries)}",
                            audio=f"{seconds / 60:.1f} min of audio")
            if chapters != told and not err.is_terminal:
                _say(err, f"chapters {chapters}/{len(summaries)} done, {done}/{total} "
                          f"segments, {seconds:.1f} s of audio")
                told = chapters
            if current.status in FINISHED:
                return current
            await runner.changed(job.id, POLL_SECONDS)


async def _write(runner: JobRunner, job: Job, output: Output) -> None:
    """The finished book into `output`, whole or not at all."""
    fmt = str(job.request.get("response_format"))
    try:
        if fmt == BOOK_FORMAT:
            made = await runner.result_book(job)
            await asyncio.to_thread(_copy, made, output.write)
        else:
            await asyncio.to_thread(_encode_whole, runner, job, fmt, output.write)
        output.done()
    except BaseException:
        output.drop()
        raise


def _copy(source: Path, target: Path) -> None:
    with open(source, "rb") as reading, open(target, "wb") as writing:
        shutil.copyfileobj(reading, writing)


def _encode_whole(runner: JobRunner, job: Job, fmt: str, target: Path) -> None:
    store = runner.store
    items = store.items(job.id)
    with open(target, "wb") as out:
        for piece in encoded(whole_chunks(store, job.id, items,
                                          runner.settings.chapter_pause_ms), fmt,
                             whole_rate(items)):
            out.write(piece)
