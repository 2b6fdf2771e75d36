"""Carry VoxMux's GPU check to an air-gapped GPU machine: slim, pack, unpack, install wheels.

    python bench/gpu_bundle.py slim-wheel WHEEL OUT_DIR [--arch 90] [--drop GLOB] [--patches DIR]
    python bench/gpu_bundle.py restore LIBRARY PATCHES  # undo slim-wheel on an installed library
    python bench/gpu_bundle.py pack DIR|FILE OUT_DIR [--chunk-mib 58] [--prefix c]
    python bench/gpu_bundle.py status STAGE           # which parts of a pack have arrived
    python bench/gpu_bundle.py unpack STAGE WHEELHOUSE
    python bench/gpu_bundle.py install WHEELHOUSE TARGET   # without pip: unzip each wheel
    python bench/gpu_bundle.py cuda-libs              # nvidia-* wheel lib dirs of this Python

`slim-wheel` keeps, in every CUDA fat binary of a wheel's shared libraries, only the entries for
the GPU architectures asked for (onnxruntime-gpu 1.31's CUDA provider holds 208 MiB of cubins for
sm_75 to sm_120a, of which an sm_90 card runs the 73 MiB for sm_90a). Each fat binary keeps its
place and its kept entries stay byte for byte what they were, moved up to follow the header; the
header's size shrinks to match and the freed bytes are zeros, so the result is what nvcc writes
for those architectures alone. Nothing outside the `.nv_fatbin` section changes; `verify` proves
it, and that every pointer the loader relocates into the section is the start of a fat binary.

`pack` turns a folder of wheels (or one file) into parts of at most `--chunk-mib` MiB (one tar
of the files, each xz-compressed when that pays, cut in equal parts) in folders c1, c2, ..., each
with a manifest; `unpack` checks every part's sha256, joins them and writes the files back,
decompressing in parallel. `bench/gpu_check.sh` installs such a wheelhouse with WHEELHOUSE=DIR.
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import fnmatch
import hashlib
import io
import json
import lzma
import os
import shutil
import site
import struct
import sys
import tarfile
import zipfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

FATBIN_MAGIC = 0xBA55ED50
FATBIN_SECTION = ".nv_fatbin"
R_X86_64_RELATIVE = 8
MANIFEST = "parts.json"
PART = "voxmux-bundle.part{:02d}"
XZ_MIN_GAIN = 0.03
"""A wheel travels xz-compressed only when that saves at least this share of its size (Kokoro's
and Piper's weights do not compress; xz would only cost time on both ends)."""


class BundleError(Exception):
    pass


# ELF and CUDA fat binaries ---------------------------------------------------------------------

@dataclass(frozen=True)
class Section:
    name: str
    addr: int
    offset: int
    size: int


def elf_sections(data: bytes | bytearray) -> dict[str, Section]:
    """The named sections of a little-endian ELF64 file (a Linux x86-64 shared library)."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise BundleError("not a little-endian 64-bit ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    raw = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names_at = raw[shstrndx][4]

    def name(at: int) -> str:
        start = names_at + at
        return bytes(data[start:data.index(b"\0", start)]).decode()

    return {name(n): Section(name(n), addr, off, size) for n, _, _, addr, off, size in raw if n}


@dataclass(frozen=True)
class Entry:
    """One image of a fat binary: a cubin (kind 2) or PTX (kind 1) for one architecture."""
    offset: int
    header_size: int
    payload_size: int
    kind: int
    arch: int
    flags: int

    @property
    def end(self) -> int:
        return self.offset + self.header_size + self.payload_size

    @property
    def label(self) -> str:
        return f"{'ptx' if self.kind == 1 else 'sm'}_{self.arch}"


@dataclass(frozen=True)
class Fatbin:
    offset: int
    header_size: int
    entries: tuple[Entry, ...]

    @property
    def end(self) -> int:
        return self.entries[-1].end if self.entries else self.offset + self.header_size


def read_entries(data: bytes | bytearray, start: int, end: int) -> tuple[Entry, ...]:
    entries = []
    pos = start
    while pos < end:
        kind, _, header_size, payload_size = struct.unpack_from("<HHIQ", data, pos)
        if header_size < 40 or kind not in (1, 2):
            raise BundleError(f"fat binary entry at {pos:#x}: kind {kind}, header {header_size}")
        arch, = struct.unpack_from("<I", data, pos + 28)
        flags, = struct.unpack_from("<Q", data, pos + 40) if header_size >= 48 else (0,)
        entries.append(Entry(pos, header_size, payload_size, kind, arch, flags))
        pos += header_size + payload_size
    if pos != end:
        raise BundleError(f"fat binary entries at {start:#x} overrun their size by {pos - end}")
    return tuple(entries)


def _zeros(data: bytes | bytearray, start: int, end: int) -> bool:
    return bytes(data[start:end]).count(0) == end - start


def fatbins(data: bytes | bytearray, section: Section) -> list[Fatbin]:
    """Every fat binary in the section, in order; only zero bytes may lie between them."""
    found = []
    magic_bytes = FATBIN_MAGIC.to_bytes(4, "little")
    pos, end = section.offset, section.offset + section.size
    while pos < end:
        start = data.find(magic_bytes, pos, end)
        if not _zeros(data, pos, end if start < 0 else start):
            raise BundleError(f"no fat binary header at {pos:#x}")
        if start < 0:
            break
        _, _, header_size, size = struct.unpack_from("<IHHQ", data, start)
        if header_size < 16:
            raise BundleError(f"fat binary header at {start:#x} is {header_size} bytes")
        pos = start
        body = pos + header_size
        if body + size > end:
            raise BundleError(f"fat binary at {pos:#x} runs past its section")
        found.append(Fatbin(pos, header_size, read_entries(data, body, body + size)))
        pos = body + size
    return found


def relocated_pointers(data: bytes | bytearray, sections: dict[str, Section]) -> list[int]:
    """Addresses the dynamic loader writes into the library (R_X86_64_RELATIVE addends)."""
    rela = sections.get(".rela.dyn")
    if rela is None:
        return []
    return [addend for _, info, addend in struct.iter_unpack("<QQq", data[rela.offset:rela.offset
                                                                            + rela.size])
            if info & 0xFFFFFFFF == R_X86_64_RELATIVE]


@dataclass
class SlimReport:
    fatbins: int = 0
    slimmed: int = 0
    """Fat binaries that lost entries; the others (all kept, or none to keep) are untouched."""
    before: Counter[str] = field(default_factory=Counter)
    after: Counter[str] = field(default_factory=Counter)
    freed: int = 0
    pointers: int = 0
    """Relocated pointers into the section, every one the start of a fat binary."""

    def text(self) -> str:
        counts = ", ".join(f"{arch} {self.before[arch]}->{self.after[arch]}"
                           for arch in sorted(self.before))
        return (f"{self.fatbins} fat binaries ({self.slimmed} slimmed, {self.pointers} pointers "
                f"checked), entries {counts}, {self.freed / 2**20:.1f} MiB freed")


def slim(data: bytes, keep: set[int]) -> tuple[bytes, SlimReport]:
    """`data` (an ELF shared library) with only the fat binary entries of the architectures in
    `keep` (cubin or PTX); a fat binary with none of them is left whole. Verified before return."""
    sections = elf_sections(data)
    section = sections.get(FATBIN_SECTION)
    if section is None:
        return data, SlimReport()
    out = bytearray(data)
    for fb in fatbins(data, section):
        kept = [e for e in fb.entries if e.arch in keep]
        if not kept or len(kept) == len(fb.entries):
            continue
        body = b"".join(data[e.offset:e.end] for e in kept)
        header = bytearray(data[fb.offset:fb.offset + fb.header_size])
        struct.pack_into("<Q", header, 8, len(body))
        new = bytes(header) + body
        out[fb.offset:fb.end] = new + bytes(fb.end - fb.offset - len(new))
    slimmed = bytes(out)
    return slimmed, verify(data, slimmed, keep)


def verify(original: bytes, slimmed: bytes, keep: set[int]) -> SlimReport:
    """Check `slimmed` is `original` with exactly the entries `slim` drops taken out: same length,
    the same bytes outside `.nv_fatbin`, the same fat binaries at the same offsets, each kept entry
    byte-identical, zeros after each slimmed one, and every relocated pointer into the section the
    start of a fat binary. Raises BundleError on any difference."""
    if len(original) != len(slimmed):
        raise BundleError("the slimmed library changed length")
    sections = elf_sections(original)
    section = sections[FATBIN_SECTION]
    lo, hi = section.offset, section.offset + section.size
    if original[:lo] != slimmed[:lo] or original[hi:] != slimmed[hi:]:
        raise BundleError("bytes outside .nv_fatbin changed")
    if elf_sections(slimmed) != sections:
        raise BundleError("the section table changed")
    before, after = fatbins(original, section), fatbins(slimmed, section)
    if [f.offset for f in before] != [f.offset for f in after]:
        raise BundleError("fat binaries moved")
    report = SlimReport(fatbins=len(before))
    for old, new in zip(before, after, strict=True):
        wanted = [e for e in old.entries if e.arch in keep] or list(old.entries)
        if len(wanted) != len(old.entries):
            report.slimmed += 1
        if len(wanted) != len(new.entries):
            raise BundleError(f"fat binary at {old.offset:#x} kept the wrong entries")
        header = slice(old.offset, old.offset + old.header_size)
        if (original[header][:8] + original[header][16:]
                != slimmed[header][:8] + slimmed[header][16:]):
            raise BundleError(f"fat binary header at {old.offset:#x} changed")
        for was, now in zip(wanted, new.entries, strict=True):
            if original[was.offset:was.end] != slimmed[now.offset:now.end]:
                raise BundleError(f"entry {was.label} at {was.offset:#x} changed")
        if not _zeros(slimmed, new.end, old.end):
            raise BundleError(f"bytes after the fat binary at {new.offset:#x} are not zeros")
        report.before.update(e.label for e in old.entries)
        report.after.update(e.label for e in new.entries)
        report.freed += old.end - new.end
    starts = {section.addr + f.offset - section.offset for f in before}
    inside = [p for p in relocated_pointers(original, sections)
              if section.addr <= p < section.addr + section.size]
    stray = [p for p in inside if p not in starts]
    if stray:
        raise BundleError(f"{len(stray)} pointers into .nv_fatbin are not fat binary starts")
    report.pointers = len(inside)
    return report


def dropped(data: bytes, keep: set[int]) -> tuple[dict[str, Any], bytes]:
    """What `slim(data, keep)` leaves out, for `restore`: an index (the library's sha256 and
    size, and per slimmed fat binary its offset, size and which entries it kept, in order) and the
    dropped entries' bytes, one after the other."""
    section = elf_sections(data)[FATBIN_SECTION]
    index: dict[str, Any] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
                             "fatbins": []}
    chunks = []
    for fb in fatbins(data, section):
        kept = [e.arch in keep for e in fb.entries]
        if any(kept) and not all(kept):
            index["fatbins"].append({"offset": fb.offset, "size": fb.end - fb.offset,
                                     "kept": kept})
            chunks += [data[e.offset:e.end] for e in fb.entries if e.arch not in keep]
    return index, b"".join(chunks)


def restore(slimmed: bytes, index: dict[str, Any], dropped_bytes: bytes) -> bytes:
    """The library `slim` started from: each slimmed fat binary's entries put back in their
    order, checked against the original's sha256."""
    if len(slimmed) != index["size"]:
        raise BundleError("this is not the slimmed library the patch was made for (size)")
    out = bytearray(slimmed)
    spare = io.BytesIO(dropped_bytes)
    for fb in index["fatbins"]:
        start = fb["offset"]
        _, _, header_size, size = struct.unpack_from("<IHHQ", slimmed, start)
        kept = iter(read_entries(slimmed, start + header_size, start + header_size + size))
        body = bytearray()
        for was_kept in fb["kept"]:
            if was_kept:
                e = next(kept)
                body += slimmed[e.offset:e.end]
            else:
                head = spare.read(16)
                _, _, entry_header, payload = struct.unpack("<HHIQ", head)
                body += head + spare.read(entry_header - 16 + payload)
        header = bytearray(slimmed[start:start + header_size])
        struct.pack_into("<Q", header, 8, len(body))
        if header_size + len(body) != fb["size"]:
            raise BundleError(f"fat binary at {start:#x} does not come back to its size")
        out[start:start + fb["size"]] = bytes(header) + body
    data = bytes(out)
    if hashlib.sha256(data).hexdigest() != index["sha256"]:
        raise BundleError("the restored library differs from the original (sha256)")
    return data


# Wheels --------------------------------------------------------------------------------------

def record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def rewrite_wheel(source: Path, target: Path, *, keep: set[int] | None = None,
                  drop: tuple[str, ...] = (), stored: bool = False,
                  patches: Path | None = None) -> list[str]:
    """Copy a wheel, slimming the fat binaries of its shared libraries to `keep` (None: no
    slimming), leaving out members matching a `drop` glob and updating RECORD to match; `stored`
    writes the members uncompressed (for xz to compress better). `patches` gets, per slimmed
    library, what `restore` needs to undo it (NAME.restore.json and NAME.dropped). Returns what
    it did."""
    notes: list[str] = []
    changed: dict[str, bytes | None] = {}
    with zipfile.ZipFile(source) as zin:
        infos = zin.infolist()
        record_name = next(i.filename for i in infos if i.filename.endswith(".dist-info/RECORD"))
        for info in infos:
            if any(fnmatch.fnmatch(info.filename, pattern) for pattern in drop):
                changed[info.filename] = None
                notes.append(f"dropped {info.filename} ({info.file_size / 2**20:.1f} MiB)")
            elif keep is not None and (info.filename.endswith(".so") or ".so." in info.filename):
                data = zin.read(info)
                if data[:4] == b"\x7fELF" and FATBIN_SECTION in elf_sections(data):
                    slimmed, report = slim(data, keep)
                    changed[info.filename] = slimmed
                    notes.append(f"slimmed {info.filename}: {report.text()}")
                    if patches is not None:
                        index, spare = dropped(data, keep)
                        base = patches / Path(info.filename).name
                        patches.mkdir(parents=True, exist_ok=True)
                        (base.parent / (base.name + ".restore.json")).write_text(json.dumps(index))
                        (base.parent / (base.name + ".dropped")).write_bytes(spare)
        record = zin.read(record_name).decode()
        lines = []
        for line in record.splitlines():
            path = line.rsplit(",", 2)[0]
            if path in changed and changed[path] is None:
                continue
            new = changed.get(path)
            lines.append(f"{path},{record_hash(new)},{len(new)}" if new is not None else line)
        changed[record_name] = ("\n".join(lines) + "\n").encode()
        target.parent.mkdir(parents=True, exist_ok=True)
        mode = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
        with zipfile.ZipFile(target, "w", mode) as zout:
            for info in infos:
                if info.filename in changed and changed[info.filename] is None:
                    continue
                copy = zipfile.ZipInfo(info.filename, info.date_time)
                copy.external_attr = info.external_attr
                copy.compress_type = mode
                zout.writestr(copy, changed.get(info.filename) or zin.read(info))
    return notes


# Parts -----------------------------------------------------------------------------------------

def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _travel_form(path: Path, scratch: Path) -> Path:
    """A file as it travels: xz (over an uncompressed copy of a wheel) when that pays, else
    itself."""
    raw = path
    if path.suffix == ".whl":
        raw = scratch / path.name
        rewrite_wheel(path, raw, stored=True)
    packed = scratch / (path.name + ".xz")
    with raw.open("rb") as src, lzma.open(packed, "wb", preset=6) as dst:
        shutil.copyfileobj(src, dst, 1 << 22)
    if raw != path:
        raw.unlink()
    if packed.stat().st_size <= path.stat().st_size * (1 - XZ_MIN_GAIN):
        return packed
    packed.unlink()
    return path


def pack(files: list[Path], out: Path, chunk_mib: float, scratch: Path,
         prefix: str = "c") -> list[Path]:
    """One tar of the files (wheels, mostly; xz where it pays) cut into equal parts under
    `out`/c1, c2, ...; each folder holds its part and the manifest of all parts."""
    scratch.mkdir(parents=True, exist_ok=True)
    with concurrent.futures.ProcessPoolExecutor() as pool:
        members = list(pool.map(_travel_form, files, [scratch] * len(files)))
    tar_path = scratch / "bundle.tar"
    with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as tar:
        for member in sorted(members, key=lambda p: p.name):
            tar.add(member, arcname=member.name)
    total = tar_path.stat().st_size
    limit = int(chunk_mib * 2**20)
    count = -(-total // limit)
    size = -(-total // count)
    parts = []
    with tar_path.open("rb") as src:
        for i in range(1, count + 1):
            folder = out / f"{prefix}{i}"
            folder.mkdir(parents=True, exist_ok=True)
            part = folder / PART.format(i)
            with part.open("wb") as dst:
                dst.write(src.read(size))
            parts.append(part)
    manifest = {"parts": [{"name": p.name, "size": p.stat().st_size, "sha256": sha256_of(p)}
                          for p in parts],
                "members": sorted(p.name for p in members)}
    for part in parts:
        (part.parent / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    tar_path.unlink()
    for member in members:
        if member.parent == scratch:
            member.unlink()
    return parts


def _manifest(stage: Path) -> Any:
    path = stage / MANIFEST
    if not path.is_file():
        raise BundleError(f"no {MANIFEST} in {stage}: no part has arrived")
    return json.loads(path.read_text())


def part_status(stage: Path) -> tuple[list[str], list[str]]:
    """(parts present and sound, parts missing or damaged) of the pack staged in `stage` (the
    parts and the manifest side by side)."""
    good, bad = [], []
    for part in _manifest(stage)["parts"]:
        path = stage / part["name"]
        ok = (path.is_file() and path.stat().st_size == part["size"]
              and sha256_of(path) == part["sha256"])
        (good if ok else bad).append(part["name"])
    return good, bad


class _Joined(io.RawIOBase):
    """The parts read one after the other as one stream."""

    def __init__(self, paths: list[Path]) -> None:
        self._paths = iter(paths)
        self._file: IO[bytes] | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while True:
            if self._file is None:
                path = next(self._paths, None)
                if path is None:
                    return 0
                self._file = path.open("rb")
            n = self._file.readinto(buffer)
            if n:
                return n
            self._file.close()
            self._file = None


def _write_member(name: str, data: bytes, wheelhouse: Path) -> str:
    if name.endswith(".xz"):
        data, name = lzma.decompress(data), name[:-3]
    (wheelhouse / name).write_bytes(data)
    return name


def unpack(stage: Path, wheelhouse: Path) -> list[str]:
    """The files (wheels) of the pack staged in `stage`, written to `wheelhouse`; every part is
    checked first."""
    good, bad = part_status(stage)
    if bad:
        raise BundleError(f"parts missing or damaged: {', '.join(bad)} (present: "
                          f"{', '.join(good) or 'none'})")
    paths = [stage / part["name"] for part in _manifest(stage)["parts"]]
    wheelhouse.mkdir(parents=True, exist_ok=True)
    jobs = []
    with concurrent.futures.ThreadPoolExecutor(os.cpu_count()) as pool, tarfile.open(
            fileobj=io.BufferedReader(_Joined(paths), 1 << 22), mode="r|") as tar:
        for member in tar:
            source = tar.extractfile(member)
            if source is None or "/" in member.name:
                raise BundleError(f"unexpected member {member.name!r}")
            jobs.append(pool.submit(_write_member, member.name, source.read(), wheelhouse))
    return sorted(job.result() for job in jobs)


def install(wheelhouse: Path, target: Path) -> list[str]:
    """Every wheel of `wheelhouse` unzipped into `target`, for a Python without pip: what pip
    install --target does for the import path (purelib and platlib land at the top, scripts and
    other .data are left out)."""
    names = []
    for wheel in sorted(wheelhouse.glob("*.whl")):
        with zipfile.ZipFile(wheel) as z:
            for info in z.infolist():
                parts = info.filename.split("/")
                if parts[0].endswith(".data"):
                    if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                        continue
                    parts = parts[2:]
                dest = target.joinpath(*parts)
                if info.is_dir():
                    dest.mkdir(parents=True, exist_ok=True)
                    continue
                dest.parent.mkdir(parents=True, exist_ok=True)
                with z.open(info) as src, dest.open("wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 22)
                mode = (info.external_attr >> 16) & 0o777
                if mode:
                    dest.chmod(mode)
        names.append(wheel.name)
    return names


def cuda_lib_dirs(exclude: tuple[Path, ...] = ()) -> list[str]:
    """The lib folders of the nvidia-* wheels (CUDA, cuBLAS, cuDNN, ...) this Python has."""
    roots = [*site.getsitepackages(), site.getusersitepackages(), *sys.path]
    seen: list[str] = []
    for root in roots:
        base = Path(root)
        if not base.is_dir() or any(base.resolve() == e.resolve() for e in exclude):
            continue
        for lib in sorted(base.glob("nvidia/*/lib")):
            if lib.is_dir() and str(lib) not in seen:
                seen.append(str(lib))
    return seen


def _sizes(paths: Iterator[Path] | list[Path]) -> str:
    return ", ".join(f"{p.parent.name}/{p.name} {p.stat().st_size / 2**20:.1f} MiB" for p in paths)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("slim-wheel", help="keep only some GPU architectures' cubins")
    p.add_argument("wheel", type=Path)
    p.add_argument("out_dir", type=Path)
    p.add_argument("--arch", type=int, action="append", help="architecture to keep (90 = sm_90 "
                   "and sm_90a); repeat for more; default 90")
    p.add_argument("--drop", action="append", default=[], help="glob of members to leave out")
    p.add_argument("--patches", type=Path, help="folder for what `restore` needs to undo it")
    p = sub.add_parser("restore", help="put a slimmed library back as it was")
    p.add_argument("library", type=Path, help="the slimmed library, rewritten in place")
    p.add_argument("patches", type=Path, help="the folder with its .restore.json and .dropped")
    p = sub.add_parser("pack", help="wheels -> parts in OUT/c1, c2, ...")
    p.add_argument("source", type=Path, help="a folder (every file in it), or one file")
    p.add_argument("out_dir", type=Path)
    p.add_argument("--chunk-mib", type=float, default=58)
    p.add_argument("--prefix", default="c", help="of the part folders (default c: c1, c2, ...)")
    p.add_argument("--scratch", type=Path, help="work folder (default OUT/.scratch)")
    p = sub.add_parser("status", help="which parts have arrived under STAGE")
    p.add_argument("stage", type=Path)
    p = sub.add_parser("unpack", help="parts under STAGE -> wheels in WHEELHOUSE")
    p.add_argument("stage", type=Path)
    p.add_argument("wheelhouse", type=Path)
    p = sub.add_parser("install", help="unzip every wheel of WHEELHOUSE into TARGET (no pip)")
    p.add_argument("wheelhouse", type=Path)
    p.add_argument("target", type=Path)
    p = sub.add_parser("cuda-libs", help="print the nvidia-* lib dirs, ':'-joined")
    p.add_argument("--exclude", type=Path, action="append", default=[])
    args = parser.parse_args(argv)
    try:
        if args.command == "slim-wheel":
            out = args.out_dir / args.wheel.name
            for note in rewrite_wheel(args.wheel, out, keep=set(args.arch or [90]),
                                      drop=tuple(args.drop), patches=args.patches):
                print(note)
            print(f"{out}: {out.stat().st_size / 2**20:.1f} MiB "
                  f"(was {args.wheel.stat().st_size / 2**20:.1f} MiB)")
        elif args.command == "pack":
            files = (sorted(p for p in args.source.iterdir() if p.is_file())
                     if args.source.is_dir() else [args.source])
            parts = pack(files, args.out_dir, args.chunk_mib,
                         args.scratch or args.out_dir / ".scratch", args.prefix)
            print(f"{len(files)} files in {len(parts)} parts: {_sizes(parts)}")
        elif args.command == "restore":
            base = args.patches / args.library.name
            index = json.loads((base.parent / (base.name + ".restore.json")).read_text())
            spare = (base.parent / (base.name + ".dropped")).read_bytes()
            data = restore(args.library.read_bytes(), index, spare)
            partial = args.library.with_name(args.library.name + ".restoring")
            partial.write_bytes(data)
            partial.replace(args.library)
            print(f"{args.library}: restored, sha256 {index['sha256'][:16]}... as the original")
        elif args.command == "status":
            good, bad = part_status(args.stage)
            print(f"parts present: {', '.join(good) or 'none'}; "
                  f"missing: {', '.join(bad) or 'none'}")
            return 0 if not bad else 3
        elif args.command == "unpack":
            names = unpack(args.stage, args.wheelhouse)
            print(f"{len(names)} files in {args.wheelhouse}")
        elif args.command == "install":
            names = install(args.wheelhouse, args.target)
            print(f"{len(names)} wheels unzipped into {args.target}")
        else:
            print(":".join(cuda_lib_dirs(tuple(args.exclude))))
    except BundleError as exc:
        print(f"gpu_bundle: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
