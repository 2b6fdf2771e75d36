"""What an engine's audio is made from, as short digests: the cache's guard against stale audio.

An engine that implements `Fingerprinted` names, for one voice, everything on disk and in its
dependencies that shapes that voice's audio: the weights, the voice data and the versions of the
packages that turn text into phonemes. The serving core puts that fingerprint in the cache key, so
a replaced voice file, an upgraded package or another model is a different key, in this process
and in a shared cache that outlives it. Digests are of content, not of paths or times, so two
machines with the same files agree on the key.
"""

from __future__ import annotations

import functools
import hashlib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

DIGEST_CHARS = 16


def digest(*parts: bytes | str) -> str:
    """A short sha256 of `parts`, each length-prefixed (so ("ab", "c") differs from ("a", "bc"))."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()[:DIGEST_CHARS]


def file_digest(path: Path) -> str:
    """The digest of a file's content, read once per (path, inode, size, mtime, ctime): a file
    replaced or rewritten in place is read again, even one given back its old size and mtime
    (`cp -p`, `rsync -a`): its ctime, which no user can set, moved. Blocking (large files): call
    it where voices are scanned, not on the event loop."""
    stat = path.stat()
    return _file_digest(str(path.resolve()), stat.st_ino, stat.st_size, stat.st_mtime_ns,
                        stat.st_ctime_ns)


@functools.lru_cache(maxsize=512)
def _file_digest(path: str, inode: int, size: int, mtime_ns: int, ctime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()[:DIGEST_CHARS]


@functools.cache
def package_versions(*names: str) -> str:
    """`name==version` of each installed distribution, `name==?` where it is missing."""
    found = []
    for name in names:
        try:
            found.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            found.append(f"{name}==?")
    return ",".join(found)
