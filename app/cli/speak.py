"""`voxmux say` and `voxmux voices`: speech and the catalogue from the command line, on the
speech service in this process (`app.cli.local`), no server needed.

Errors are one line on stderr and exit status 2 (bad input: a missing file, an unknown model or
voice, text over a budget) or 1 (the engine failed); never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from app.cli.local import FORMATS, Output, local_service, speak, voice_rows
from app.settings import Settings
from engines.base import SynthesisFailed, VoxMuxError

PLAYERS = (("ffplay", "-nodisp", "-autoexit", "-loglevel", "error"), ("paplay",), ("aplay", "-q"),
           ("afplay",))
"""Players `voxmux say --play` tries, in order, on a WAV file."""


class CliError(Exception):
    """A one-line error for the user; `status` is the exit status."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser],
                 add_profile: Callable[[argparse.ArgumentParser], None]) -> None:
    say = commands.add_parser("say", help="speak text into a file (no server needed)",
                              description="Speak TEXT (or stdin, with '-') into FILE; the "
                              "format is the file's suffix: " + ", ".join(FORMATS) + ".")
    say.add_argument("text", help="the text, SSML ('<speak>...'), or '-' for stdin")
    say.add_argument("-m", "--model", default="tts-1",
                     help="model id or alias (default tts-1: the model for the text's language)")
    say.add_argument("-v", "--voice", help="voice id (default: the model's)")
    say.add_argument("-s", "--speed", type=float, default=1.0, help="speed, 0.25 to 4")
    say.add_argument("-l", "--language", help="language of the text (default: detected)")
    say.add_argument("--ssml", action="store_true", help="the text is SSML without <speak>")
    where = say.add_mutually_exclusive_group(required=True)
    where.add_argument("-o", "--output", metavar="FILE",
                       help="file to write ('-' writes to stdout; then give --format)")
    where.add_argument("--play", action="store_true",
                       help="play it (ffplay, paplay, aplay or afplay)")
    say.add_argument("-f", "--format", choices=sorted(set(FORMATS.values())),
                     help="audio format (default: from the file's suffix)")
    voices = commands.add_parser("voices", help="list the models' voices")
    voices.add_argument("-m", "--model", help="only this model's voices")
    voices.add_argument("-l", "--language", help="only voices of this language (en: every en-*)")
    for command in (say, voices):
        add_profile(command)


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Run `say` or `voices`; the exit status."""
    logging.basicConfig(level=logging.ERROR, format="voxmux: %(message)s")
    err = Console(stderr=True, highlight=False)
    try:
        if args.command == "voices":
            asyncio.run(_voices(args, settings))
        else:
            asyncio.run(_say(args, settings, err))
        return 0
    except CliError as exc:
        _fail(args, exc)
        return exc.status
    except VoxMuxError as exc:
        _fail(args, exc)
        return 1 if isinstance(exc, SynthesisFailed) else 2
    except KeyboardInterrupt:
        _fail(args, "interrupted")
        return 130
    except OSError as exc:  # the output went (a full disk, a closed pipe, a file size limit)
        _fail(args, f"cannot write the audio: {exc.strerror or exc}")
        return 1


def _fail(args: argparse.Namespace, error: object) -> None:
    """One line, however long (a terminal may wrap it; nothing here does)."""
    message = " ".join(str(error).split())
    sys.stderr.write(f"voxmux {args.command}: {message}\n")


async def _voices(args: argparse.Namespace, settings: Settings) -> None:
    async with local_service(settings) as service:
        rows = voice_rows(service, args.model, args.language)
    if not rows:
        raise CliError("no voice matches" + (f" language '{args.language}'"
                                             if args.language else ""))
    table = Table("model", "voice", "name", "language", "gender", box=None)
    for row in rows:
        table.add_row(row.model, row.id, row.name, row.language, row.gender or "")
    Console(highlight=False, width=200 if not sys.stdout.isatty() else None).print(table)


def _text(args: argparse.Namespace) -> str:
    text: str = args.text
    if text == "-":
        try:
            text = sys.stdin.buffer.read().decode("utf-8")
        except UnicodeDecodeError:
            raise CliError("the text on stdin is not UTF-8") from None
    if not text.strip():
        raise CliError("there is no text to speak")
    return text


def _format(args: argparse.Namespace) -> str:
    if args.format:
        return str(args.format)
    if args.play:
        return "wav"
    if args.output == "-":
        raise CliError("writing to stdout needs --format")
    suffix = Path(args.output).suffix.lower()
    if suffix not in FORMATS:
        raise CliError(f"cannot tell the format from '{Path(args.output).name}': use a suffix "
                       f"of {', '.join(FORMATS)} or --format")
    return FORMATS[suffix]


async def _say(args: argparse.Namespace, settings: Settings, err: Console) -> None:
    text, fmt = _text(args), _format(args)
    input_format = "ssml" if args.ssml else None
    target: Output | None = None
    player: tuple[str, ...] | None = None
    if args.play:
        player = next((p for p in PLAYERS if shutil.which(p[0])), None)
        if player is None:
            raise CliError("--play needs ffplay, paplay, aplay or afplay; use -o FILE")
        handle, name = tempfile.mkstemp(suffix=".wav")
        os.close(handle)
        target = Output(Path(name), None)
    elif args.output != "-":
        try:
            target = Output.of(args.output)
        except ValueError as exc:
            raise CliError(str(exc)) from None
    progress = Progress(TextColumn("{task.description}"), BarColumn(),
                        TextColumn("{task.completed}/{task.total} segments"),
                        TimeRemainingColumn(), console=err, transient=True,
                        disable=not err.is_terminal)
    task = progress.add_task("speaking", total=None)
    try:
        with progress:
            async with local_service(settings) as service:
                out: BinaryIO
                with (open(target.write, "wb") if target else sys.stdout.buffer) as out:
                    said = await speak(service, out, text=text, fmt=fmt, model=args.model,
                                       voice=args.voice, speed=args.speed,
                                       language=args.language, input_format=input_format,
                                       progress=lambda done, total: progress.update(
                                           task, completed=done, total=total))
        if target is not None:
            target.done()  # a file is there whole or not at all
    except BaseException:
        if target is not None:
            target.drop()
        raise
    if player is not None and target is not None:
        try:
            subprocess.run([*player, str(target.write)], check=False)
        finally:
            target.write.unlink(missing_ok=True)
        return
    if target is not None:
        err.print(f"{args.output}: {said.seconds:.1f} s of {fmt}, {said.model} voice {said.voice}",
                  soft_wrap=True,
                  markup=False)
