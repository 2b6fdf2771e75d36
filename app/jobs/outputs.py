"""The outputs directory (AngeVoice's `/app/outputs`): HTTP results also kept as files.

Each result is `<UTC time>-<name>.<ext>` with `<same>.<ext>.json` beside it saying what made it
(route, model, voice, format, text length, duration, request or job id). Written to a temporary
name and renamed, so a reader never sees half a file; a write that fails is logged and the
response is unaffected.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


class Outputs:
    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def write(self, name: str, ext: str, data: bytes | Path | Iterable[bytes],
              sidecar: dict[str, Any]) -> Path | None:
        """Keep `data` (bytes, a file to copy, or pieces) as `<time>-<name>.<ext>`; blocking."""
        self.folder.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        path = self.folder / f"{stamp}-{_UNSAFE.sub('_', name)[:80]}.{ext}"
        try:
            tmp = path.with_name(f".{path.name}.tmp")
            if isinstance(data, Path):
                shutil.copyfile(data, tmp)
            elif isinstance(data, bytes):
                tmp.write_bytes(data)
            else:
                with open(tmp, "wb") as handle:
                    for piece in data:
                        handle.write(piece)
            meta = {"file": path.name, "bytes": tmp.stat().st_size,
                    "created_at": int(time.time()), **sidecar}
            side = path.with_name(path.name + ".json")
            side_tmp = side.with_name(f".{side.name}.tmp")
            side_tmp.write_text(json.dumps(meta, indent=2, ensure_ascii=False))
            os.replace(side_tmp, side)  # the sidecar first: a watcher that sees the audio
            os.replace(tmp, path)  # finds its sidecar (CI saw the audio alone for a moment)
        except OSError as exc:
            log.warning("outputs: could not write %s: %s", path, exc)
            return None
        return path


def keep_job(outputs: Outputs, store: Any, record: Any, pause_ms: int) -> None:
    """A finished job's result into the outputs directory: a book's whole audio, a batch's ZIP
    (the runner calls this in a thread, in the job's ZIP turn for a batch: `JobRunner._run`)."""
    from app.jobs.model import BOOK_FORMAT
    from app.jobs.results import encoded, job_book, job_zip, whole_chunks, whole_rate

    items = store.items(record.id)
    sidecar = {"route": "/v1/audio/jobs", "job_id": record.id, "kind": record.kind,
               **record.request,
               "chapters": [{"index": i.index + 1, "title": i.title, "chars": len(i.text),
                             "error": i.error} for i in items]}
    if record.kind == "batch":
        outputs.write(record.id, "zip", job_zip(store, record), sidecar)
        return
    fmt = str(record.request.get("response_format", "mp3"))
    if fmt == BOOK_FORMAT:
        outputs.write(record.id, fmt, job_book(store, record, pause_ms), sidecar)
        return
    outputs.write(record.id, fmt, encoded(whole_chunks(store, record.id, items, pause_ms), fmt,
                                          whole_rate(items)), sidecar)
