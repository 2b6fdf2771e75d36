"""Where lexicons live: the deployment file, and each key's lexicons as JSON under the data dir.

A key's lexicons apply to every request made with that key (requests without a key share the
`open` owner). Files are written atomically; the deployment file is read again when it changes.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import threading
from pathlib import Path

from app.text.lexicon import Entry, Lexicon, check_entry, load_toml
from engines.base import InvalidParameter, VoxMuxError

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
MAX_ENTRIES = 5000


class LexiconNotFound(VoxMuxError):
    """No lexicon by that name for this key."""


def owner_of(client: str) -> str:
    """The owner of a client's lexicons: its key's digest, or `open` without a key."""
    return "key-" + client[4:] if client.startswith("key:") else "open"


class LexiconStore:
    def __init__(self, folder: Path, deployment: Path | None) -> None:
        self.folder = folder
        self.deployment_path = deployment
        self._lock = threading.Lock()
        self._deployment: tuple[float, list[Entry]] = (-1.0, [])

    def _deployment_entries(self) -> list[Entry]:
        path = self.deployment_path
        if path is None or not path.is_file():
            return []
        mtime = path.stat().st_mtime
        if mtime != self._deployment[0]:
            self._deployment = (mtime, load_toml(path))
        return self._deployment[1]

    def for_request(self, client: str, language: str, model: str, voice: str) -> Lexicon:
        entries = [e for e in self._deployment_entries() if e.applies(language, model, voice)]
        for item in self.list(owner_of(client)):
            scope = str(item.get("scope") or "")
            for word, reading in dict(item["entries"]).items():  # type: ignore[call-overload]
                entry = Entry(word, reading, str(item["language"]), scope)
                if entry.applies(language, model, voice):
                    entries.append(entry)
        return Lexicon(entries)

    def _dir(self, owner: str) -> Path:
        return self.folder / owner

    def _path(self, owner: str, name: str) -> Path:
        if not NAME.match(name):
            raise InvalidParameter("a lexicon name is 1-64 letters, digits, '_', '.' or '-'",
                                   param="name")
        return self._dir(owner) / f"{name}.json"

    def list(self, owner: str) -> list[dict[str, object]]:
        folder = self._dir(owner)
        if not folder.is_dir():
            return []
        return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*.json"))]

    def get(self, owner: str, name: str) -> dict[str, object]:
        path = self._path(owner, name)
        if not path.is_file():
            raise LexiconNotFound(f"No lexicon named '{name}'", param="name")
        data: dict[str, object] = json.loads(path.read_text(encoding="utf-8"))
        return data

    def put(self, owner: str, name: str, language: str, entries: dict[str, str],
            scope: str = "") -> dict[str, object]:
        if len(entries) > MAX_ENTRIES:
            raise InvalidParameter(f"a lexicon holds at most {MAX_ENTRIES} entries",
                                   param="entries")
        for word, reading in entries.items():
            check_entry(word, reading)
        item: dict[str, object] = {"name": name, "language": language or "en",
                                   "scope": scope, "entries": dict(entries)}
        path = self._path(owner, name)
        with self._lock:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, temp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(item, out, ensure_ascii=False)
            os.replace(temp, path)
        return item

    def delete(self, owner: str, name: str) -> None:
        path = self._path(owner, name)
        with self._lock:
            if not path.is_file():
                raise LexiconNotFound(f"No lexicon named '{name}'", param="name")
            path.unlink()
