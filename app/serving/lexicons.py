"""Where lexicons live: the deployment file, and each key's lexicons as JSON under the data dir.

A key's lexicons apply to every request made with that key (requests without a key share the
`open` owner). Files are written atomically. What a request applies is read and made once per
owner, language and the scopes its entries name (`lexicon()`), in threads of this store's own,
and reused until one of the owner's files or the deployment file changes: a request pays a
directory listing, never a file read or a compile. How many lexicons and entries an owner keeps
is bounded (the `lexicons_max_*` settings).

The file methods (`list`, `get`, `put`, `delete`) block: call them off the event loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from app.serving.budgets import OverBudget
from app.text.lexicon import Entry, Lexicon, check_entry, load_toml
from engines.base import InvalidParameter, VoxMuxError

log = logging.getLogger(__name__)

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
COMPILED_KEPT = 256
"""Owners' entries and compiled lexicons kept; the least recently used goes first."""

T = TypeVar("T")
Entries = dict[str, dict[str, list[Entry]]]
"""Language -> scope (`""`, a model, `model:voice`) -> entries, in the order they override."""
Version = tuple[object, ...]
"""What a compiled lexicon was made from: the files' names, sizes and times, and this store's
own count of writes (a file rewritten within the file system's clock tick keeps its time)."""


class LexiconNotFound(VoxMuxError):
    """No lexicon by that name for this key."""


@dataclass(frozen=True)
class LexiconLimits:
    lexicons: int = 32
    """Lexicons one owner keeps."""
    entries: int = 5000
    """Entries in one lexicon."""
    owner_entries: int = 20_000
    """Entries in all of one owner's lexicons."""


def owner_of(client: str) -> str:
    """The owner of a client's lexicons: its key's digest, or `open` without a key."""
    return "key-" + client[4:] if client.startswith("key:") else "open"


class LexiconStore:
    def __init__(self, folder: Path, deployment: Path | None,
                 limits: LexiconLimits | None = None) -> None:
        self.folder = folder
        self.deployment_path = deployment
        self.limits = limits or LexiconLimits()
        self._lock = threading.Lock()
        """Guards writes (a bound checked and the file written as one step) and the caches."""
        self._writes = 0
        self._deployment: tuple[Version, list[Entry]] = ((), [])
        self._made_for: OrderedDict[tuple[object, ...], Future[Any]] = OrderedDict()
        self._makers = ThreadPoolExecutor(max_workers=2, thread_name_prefix="lexicons")

    def close(self) -> None:
        self._makers.shutdown(wait=False, cancel_futures=True)

    # -- what a request applies ----------------------------------------------------------------

    async def lexicon(self, client: str, language: str, model: str, voice: str) -> Lexicon:
        """The entries that apply to a request of `client` in `language` to `model`'s `voice`,
        made once per owner, language and the scopes that apply (`model`, `model:voice`: only
        those the owner's entries name, so voices without entries of their own share one), and
        reused until a file they were made from changes."""
        owner = owner_of(client)
        version = await asyncio.to_thread(self._version, owner)
        entries = await self._made(("entries", owner, version), self._entries, owner)
        base = language.split("-")[0].lower()
        scopes = tuple(sorted({"", model, f"{model}:{voice}"} & entries.get(base, {}).keys()))
        return await self._made(("lexicon", owner, version, base, scopes), self._lexicon,
                                entries.get(base, {}), scopes)

    async def _made(self, key: tuple[object, ...], make: Callable[..., T], *args: Any) -> T:
        """`make(*args)` in the store's threads, once for `key` while it is kept (the
        requests asking meanwhile wait for the same one); a failure is made again next time."""
        with self._lock:
            future = self._made_for.get(key)
            if future is None:
                future = self._makers.submit(make, *args)
                self._made_for[key] = future
                while len(self._made_for) > COMPILED_KEPT:
                    self._made_for.popitem(last=False)
            else:
                self._made_for.move_to_end(key)
        try:
            made: T = await asyncio.wrap_future(future)
            return made
        except BaseException:
            with self._lock:
                if self._made_for.get(key) is future and future.done():
                    del self._made_for[key]
            raise

    def _entries(self, owner: str) -> Entries:
        """The deployment's entries and the owner's, by language and scope, in the order they
        override one another (the deployment first, then the owner's lexicons by name)."""
        found: Entries = {}
        sources = [*self._deployment_entries(), *(
            Entry(word, reading, str(item["language"]), str(item.get("scope") or ""))
            for item in self.list(owner)
            for word, reading in dict(item["entries"]).items())]  # type: ignore[call-overload]
        for entry in sources:
            base = entry.language.split("-")[0].lower()
            found.setdefault(base, {}).setdefault(entry.scope, []).append(entry)
        return found

    @staticmethod
    def _lexicon(scoped: dict[str, list[Entry]], scopes: tuple[str, ...]) -> Lexicon:
        return Lexicon([entry for scope in scopes for entry in scoped[scope]])

    def _version(self, owner: str) -> Version:
        files: list[tuple[str, int, int]] = []
        folder = self._dir(owner)
        if folder.is_dir():
            with os.scandir(folder) as listing:
                for item in listing:
                    if item.name.endswith(".json"):
                        stat = item.stat()
                        files.append((item.name, stat.st_size, stat.st_mtime_ns))
        return (self._writes, self._deployment_version(), tuple(sorted(files)))

    def _deployment_version(self) -> Version:
        path = self.deployment_path
        if path is None or not path.is_file():
            return ()
        stat = path.stat()
        return (stat.st_size, stat.st_mtime_ns)

    def _deployment_entries(self) -> list[Entry]:
        version = self._deployment_version()
        if version != self._deployment[0]:
            entries = load_toml(self.deployment_path) if version else []  # type: ignore[arg-type]
            self._deployment = (version, entries)
        return self._deployment[1]

    # -- an owner's files ------------------------------------------------------------------------

    def _dir(self, owner: str) -> Path:
        return self.folder / owner

    def _path(self, owner: str, name: str) -> Path:
        if not NAME.match(name):
            raise InvalidParameter("a lexicon name is 1-64 letters, digits, '_', '.' or '-'",
                                   param="name")
        return self._dir(owner) / f"{name}.json"

    def list(self, owner: str) -> list[dict[str, object]]:
        """The owner's lexicons, by name; a file that cannot be read is left out (and logged)."""
        folder = self._dir(owner)
        if not folder.is_dir():
            return []
        found = []
        for path in sorted(folder.glob("*.json")):
            try:
                found.append(json.loads(path.read_text(encoding="utf-8")))
            except (OSError, ValueError) as exc:
                log.warning("lexicons: %s cannot be read (%s); left out", path, exc)
        return found

    def get(self, owner: str, name: str) -> dict[str, object]:
        path = self._path(owner, name)
        if not path.is_file():
            raise LexiconNotFound(f"No lexicon named '{name}'", param="name")
        data: dict[str, object] = json.loads(path.read_text(encoding="utf-8"))
        return data

    def put(self, owner: str, name: str, language: str, entries: dict[str, str],
            scope: str = "") -> dict[str, object]:
        """Create or replace lexicon `name`; `OverBudget` past the owner's bounds."""
        limits = self.limits
        if len(entries) > limits.entries:
            raise OverBudget("The lexicon", f"{len(entries):,} entries",
                             f"{limits.entries:,} entries a lexicon",
                             "VOXMUX_LEXICON_MAX_ENTRIES", param="entries")
        for word, reading in entries.items():
            check_entry(word, reading)
        item: dict[str, object] = {"name": name, "language": language or "en",
                                   "scope": scope, "entries": dict(entries)}
        path = self._path(owner, name)
        with self._lock:
            self._check_owner(owner, name, len(entries))
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, temp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(item, out, ensure_ascii=False)
            os.replace(temp, path)
            self._writes += 1
        return item

    def _check_owner(self, owner: str, name: str, entries: int) -> None:
        others = [item for item in self.list(owner) if item.get("name") != name]
        limits = self.limits
        if len(others) + 1 > limits.lexicons:
            raise OverBudget("This key's lexicons", f"{len(others) + 1} with this one",
                             f"{limits.lexicons} lexicons", "VOXMUX_LEXICONS_MAX_PER_OWNER",
                             param="name", hint="delete one first")
        total = entries + sum(_count(item) for item in others)
        if total > limits.owner_entries:
            raise OverBudget("This key's lexicon entries", f"{total:,} with this lexicon",
                             f"{limits.owner_entries:,} entries",
                             "VOXMUX_LEXICONS_MAX_ENTRIES_PER_OWNER", param="entries")

    def delete(self, owner: str, name: str) -> None:
        path = self._path(owner, name)
        with self._lock:
            if not path.is_file():
                raise LexiconNotFound(f"No lexicon named '{name}'", param="name")
            path.unlink()
            self._writes += 1


def _count(item: dict[str, object]) -> int:
    entries = item.get("entries")
    return len(entries) if isinstance(entries, dict) else 0
