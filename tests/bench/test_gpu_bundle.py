"""The air-gapped GPU check's bundle: fat binaries slimmed to one architecture, wheels rewritten
with a true RECORD, parts that join back into the same wheels."""

from __future__ import annotations

import hashlib
import shutil
import struct
import zipfile
from pathlib import Path

import pytest

from bench.gpu_bundle import (
    FATBIN_MAGIC,
    BundleError,
    dropped,
    elf_sections,
    fatbins,
    install,
    pack,
    part_status,
    record_hash,
    restore,
    rewrite_wheel,
    slim,
    unpack,
)

SECTION_ADDR = 0x10000


def entry(arch: int, payload: bytes, kind: int = 2) -> bytes:
    header = bytearray(64)
    struct.pack_into("<HHIQ", header, 0, kind, 0x101, 64, len(payload))
    struct.pack_into("<I", header, 28, arch)
    struct.pack_into("<Q", header, 40, 0x8011)
    return bytes(header) + payload


def fatbin(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, len(body)) + body


def elf(section: bytes, pointers: list[int]) -> bytes:
    """A minimal ELF64 file: .nv_fatbin (at SECTION_ADDR), .rela.dyn with R_X86_64_RELATIVE
    pointers to the given offsets of the section, and the section names."""
    names = b"\0.nv_fatbin\0.rela.dyn\0.shstrtab\0"
    rela = b"".join(struct.pack("<QQq", 0x20000 + 8 * i, 8, SECTION_ADDR + p)
                    for i, p in enumerate(pointers))
    fat_off = 64
    rela_off = fat_off + len(section)
    names_off = rela_off + len(rela)
    shoff = names_off + len(names) + (-(names_off + len(names)) % 8)
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", header, 0x28, shoff)
    struct.pack_into("<HHH", header, 0x3A, 64, 4, 3)

    def sh(name: int, addr: int, off: int, size: int) -> bytes:
        return struct.pack("<IIQQQQIIQQ", name, 1, 0, addr, off, size, 0, 0, 8, 0)

    table = (bytes(64) + sh(1, SECTION_ADDR, fat_off, len(section))
             + sh(12, 0, rela_off, len(rela)) + sh(22, 0, names_off, len(names)))
    body = bytes(header) + section + rela + names
    return body + bytes(shoff - len(body)) + table


def library() -> tuple[bytes, list[bytes]]:
    """Three fat binaries: sm_75+sm_90+sm_120 (slimmed), sm_90 alone (kept), sm_120 alone (kept:
    nothing to keep), with alignment padding between them."""
    kept = [entry(90, b"\x90" * 40), entry(90, b"\x91" * 24)]
    blobs = [fatbin(entry(75, b"\x75" * 100), kept[0], entry(120, b"\x12" * 60)),
             fatbin(kept[1]), fatbin(entry(120, b"\x20" * 32))]
    section, starts = b"", []
    for blob in blobs:
        starts.append(len(section))
        section += blob + bytes(-len(blob) % 16)
    return elf(section, starts), kept


def test_slim_keeps_each_fatbin_in_place_with_only_the_kept_entries() -> None:
    data, kept = library()
    slimmed, report = slim(data, {90})
    assert len(slimmed) == len(data)
    section = elf_sections(slimmed)[".nv_fatbin"]
    after = fatbins(slimmed, section)
    assert [f.offset for f in after] == [f.offset for f in fatbins(data, section)]
    assert [[e.arch for e in f.entries] for f in after] == [[90], [90], [120]]
    assert slimmed[after[0].entries[0].offset:after[0].end] == kept[0]
    assert (report.slimmed, report.pointers, report.freed) == (1, 3, 2 * 64 + 100 + 60)
    assert report.before == {"sm_75": 1, "sm_90": 2, "sm_120": 2}
    assert report.after == {"sm_90": 2, "sm_120": 1}
    assert slimmed[:section.offset] == data[:section.offset]


def test_restore_puts_the_dropped_entries_back_byte_for_byte() -> None:
    data, _ = library()
    slimmed, _ = slim(data, {90})
    index, spare = dropped(data, {90})
    assert len(index["fatbins"]) == 1 and len(spare) == 2 * 64 + 100 + 60
    assert restore(slimmed, index, spare) == data
    with pytest.raises(BundleError, match="sha256"):
        restore(slimmed, index, spare[:-1] + b"\0")


def test_slim_refuses_a_library_that_points_inside_a_fatbin() -> None:
    data, _ = library()
    section = elf_sections(data)[".nv_fatbin"]
    first = fatbins(data, section)[0]
    inner = first.entries[1].offset - section.offset
    with pytest.raises(BundleError, match="not fat binary starts"):
        slim(elf(data[section.offset:section.offset + section.size], [0, inner]), {90})


def test_slim_refuses_entries_that_overrun_their_fatbin() -> None:
    bad = bytearray(fatbin(entry(90, b"x" * 8)))
    struct.pack_into("<Q", bad, 8, 60)  # the header says less than its entries hold
    with pytest.raises(BundleError):
        slim(elf(bytes(bad) + bytes(16), [0]), {90})


def make_wheel(path: Path, members: dict[str, bytes]) -> Path:
    dist = "demo-1.0.dist-info"
    record = "".join(f"{name},{record_hash(data)},{len(data)}\n" for name, data in members.items())
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
        z.writestr(f"{dist}/RECORD", record + f"{dist}/RECORD,,\n")
    return path


def test_a_rewritten_wheel_has_a_record_true_to_its_members(tmp_path: Path) -> None:
    data, _ = library()
    source = make_wheel(tmp_path / "demo-1.0-py3-none-any.whl",
                        {"demo/libcuda_kernels.so": data, "demo/libunused.so.1": b"x" * 99,
                         "demo/__init__.py": b"VALUE = 1\n"})
    target = tmp_path / "out" / source.name
    notes = rewrite_wheel(source, target, keep={90}, drop=("demo/libunused.so.*",),
                          patches=tmp_path / "patches")
    assert any(n.startswith("slimmed demo/libcuda_kernels.so") for n in notes)
    assert sorted(p.name for p in (tmp_path / "patches").iterdir()) == [
        "libcuda_kernels.so.dropped", "libcuda_kernels.so.restore.json"]
    with zipfile.ZipFile(target) as z:
        names = z.namelist()
        assert "demo/libunused.so.1" not in names
        rows = [r.split(",") for r in z.read("demo-1.0.dist-info/RECORD").decode().splitlines()]
        for name, digest, size in rows:
            if digest:
                member = z.read(name)
                assert (digest, int(size)) == (record_hash(member), len(member))
        assert {r[0] for r in rows} == set(names)
        assert z.read("demo/libcuda_kernels.so") == slim(data, {90})[0]


def test_parts_join_back_into_the_same_wheels(tmp_path: Path) -> None:
    text = b"import this\n" * 20_000  # compresses: travels as xz
    noise = hashlib.shake_256(b"weights").digest(150_000)  # does not: travels as it is
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    make_wheel(wheels / "a-1.0-py3-none-any.whl", {"a/__init__.py": text})
    make_wheel(wheels / "b-1.0-py3-none-any.whl", {"b/weights.bin": noise})
    parts = pack(sorted(wheels.glob("*.whl")), tmp_path / "out", 0.05, tmp_path / "scratch")
    assert len(parts) >= 3 and all(p.stat().st_size <= 0.05 * 2**20 for p in parts)
    stage = tmp_path / "stage"
    stage.mkdir()
    for part in parts[:-1]:  # the calls before the last
        for path in part.parent.iterdir():
            shutil.copy(path, stage / path.name)
    good, bad = part_status(stage)
    assert bad == [parts[-1].name] and len(good) == len(parts) - 1
    with pytest.raises(BundleError, match="missing or damaged"):
        unpack(stage, tmp_path / "house")
    shutil.copy(parts[-1], stage)
    assert unpack(stage, tmp_path / "house") == sorted(w.name for w in wheels.glob("*.whl"))
    for wheel in wheels.glob("*.whl"):
        with zipfile.ZipFile(wheel) as was, zipfile.ZipFile(tmp_path / "house" / wheel.name) as now:
            assert [(i.filename, was.read(i)) for i in was.infolist()] == [
                (i.filename, now.read(i)) for i in now.infolist()]


def test_install_unzips_purelib_and_platlib_to_the_top(tmp_path: Path) -> None:
    house = tmp_path / "house"
    house.mkdir()
    make_wheel(house / "demo-1.0-py3-none-any.whl", {
        "demo/__init__.py": b"", "demo-1.0.data/platlib/demo_ext.so": b"\x7fELF",
        "demo-1.0.data/scripts/demo": b"#!python\n"})
    install(house, tmp_path / "site")
    assert (tmp_path / "site" / "demo" / "__init__.py").is_file()
    assert (tmp_path / "site" / "demo_ext.so").read_bytes() == b"\x7fELF"
    assert (tmp_path / "site" / "demo-1.0.dist-info" / "RECORD").is_file()
    assert not (tmp_path / "site" / "demo").joinpath("..", "demo-1.0.data").exists()
