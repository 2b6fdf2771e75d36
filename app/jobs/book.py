"""A long text as chapters: plain text, Markdown (a chapter per top-level heading) or EPUB (a
chapter per spine document, its structure read with EbookLib). Each chapter's spoken text starts
with its title, so a listener hears where a chapter begins.

What reading a book costs is bounded by what it is, not by what it claims: its text is counted
against `jobs_max_chars` as it is read and reading stops as soon as it passes (plain text and
Markdown are counted as sent, markup included, before anything is parsed); Markdown is parsed in
slices of `MARKDOWN_SLICE_CHARS`, each slice's tokens dropped before the next; an EPUB's documents
are read in one streaming pass through a parser target that keeps nothing but the text taken.

An EPUB is a ZIP, and a small one can inflate to gigabytes: its entry count and the size of the
files that would be inflated are checked against their budgets from the ZIP's directory before
anything is inflated (zipfile never reads an entry past the size the directory states, so the
directory is a real bound). Files a book's text never needs (images, fonts, audio, video, styles)
are never inflated and do not count; of the rest, only the package, its navigation and the spine's
documents are read, the first whole (`STRUCTURE_MAX_BYTES` each), the documents as streams.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import io
import posixpath
import re
import zipfile
import zlib
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import IO, Any, Literal
from urllib.parse import unquote

from app.serving.budgets import OverBudget, env_name
from engines.base import InvalidParameter

InputFormat = Literal["text", "markdown", "epub"]

_BLOCKS = frozenset((
    "p", "h1", "h2", "h3", "h4", "h5", "h6", "li", "blockquote", "pre", "dd", "dt", "td", "th",
    "figcaption", "caption", "div", "section", "article", "aside", "header", "footer", "main",
    "ul", "ol", "dl", "table", "tr", "figure", "hr", "body"))
"""Elements whose start and end part paragraphs: a block's own text is one paragraph, ended
where a block nested in it begins (so nested blocks never repeat their text)."""
_HEADINGS = frozenset(("h1", "h2", "h3"))
_SKIPPED = frozenset(("script", "style", "nav", "head", "title", "template"))
"""Elements whose text is never spoken."""

_NEVER_READ = frozenset((
    ".jpg", ".jpeg", ".png", ".gif", ".webp", ".bmp", ".tif", ".tiff", ".svg", ".avif",  # images
    ".ico", ".ttf", ".otf", ".woff", ".woff2", ".eot",  # icons, fonts
    ".mp3", ".m4a", ".m4b", ".aac", ".ogg", ".oga", ".opus", ".wav", ".flac",  # audio
    ".mp4", ".m4v", ".webm", ".ogv", ".mov", ".mkv",  # video
    ".css", ".js"))
"""Extensions of an EPUB's files that its spoken text never needs: never inflated, not counted
against `epub_max_bytes`."""

STRUCTURE_MAX_BYTES = 2 * 1024 * 1024
"""Largest container, package (OPF), NCX or navigation document of an EPUB: these are parsed
whole, as trees (a package of ten thousand files is about 1.5 MB)."""
CHUNK_BYTES = 64 * 1024
"""An EPUB document is fed to its parser this many bytes at a time."""
MARKDOWN_SLICE_CHARS = 32 * 1024
"""Markdown is parsed this many characters at a time, or a little more to end at a blank line
(markdown-it's tokens take about 500 bytes per character of a dense list)."""
_PENDING_CHARS = 64 * 1024
"""Text of an EPUB document before its heading held back, to drop what repeats the heading (a
running head); past it, written out as it comes."""
_HELD_CHARS = 64 * 1024
"""Text of one unfinished paragraph held as the parser gave it; past it, its whitespace is folded
and it is counted (a paragraph of 200 MB is refused before it is whole)."""


@dataclass(frozen=True)
class Chapter:
    title: str
    text: str
    """What is spoken: the title first (when there is one), then the body."""


@dataclass(frozen=True)
class ArchiveBudget:
    """What an EPUB's ZIP may hold: bytes once inflated, all files read together, and files."""

    max_bytes: int
    max_entries: int


def too_long(limit: int, chars: int | None = None) -> OverBudget:
    """The budget of a job's text passed: by `chars`, or (read until it passed) by more."""
    amount = f"{chars:,} characters" if chars is not None else f"over {limit:,} characters"
    return OverBudget("The job's text", amount, f"{limit:,} characters",
                      env_name("jobs_max_chars"),
                      hint="split the book into several jobs, or raise the budget")


class _Count:
    """The text read so far, against `limit`: `OverBudget` as soon as it passes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.chars = 0

    def add(self, chars: int) -> None:
        self.chars += chars
        if self.chars > self.limit:
            raise too_long(self.limit)


def chapters(source: str, fmt: InputFormat, title: str | None = None, *,
             budget: ArchiveBudget, max_chars: int) -> list[Chapter]:
    """The chapters of `source`; `OverBudget` once its text passes `max_chars` (text and
    Markdown as sent, before anything is parsed or tidied)."""
    if fmt != "epub" and len(source) > max_chars:
        raise too_long(max_chars, len(source))
    if fmt == "markdown":
        found = markdown_chapters(source, max_chars)
    elif fmt == "epub":
        found = epub_chapters(_epub_bytes(source), budget, max_chars)
    else:
        found = [Chapter(title or "", _tidy(source))]
    found = [c for c in found if any(ch.isalnum() for ch in c.text)]
    if not found:
        raise InvalidParameter("'input' has no text to speak (letters or digits)", param="input")
    return found


_PARAGRAPH_BREAK = re.compile(r"[^\S\n]*\n\s*\n\s*")
_SPACES = re.compile(r"(?:[^\S\n]|(?<!\n)\n(?!\n))+")


_NOT_SPACE = re.compile(r"\S")
TIDY_PIECE = 1 << 16
"""`_tidy` runs its expressions over pieces of about this many characters: one over two
million held the interpreter's lock, and with it the event loop, 140 ms."""


def _tidy(text: str) -> str:
    """Paragraphs kept apart, runs of blank lines and spaces folded, by regular expressions
    (no list of its words or paragraphs is ever made) over pieces cut before a character that
    is not a space, where none of them can match or look."""
    text = text.strip()
    pieces, start = [], 0
    while start < len(text):
        cut = _NOT_SPACE.search(text, start + TIDY_PIECE)
        end = cut.start() if cut else len(text)
        pieces.append(_SPACES.sub(" ", _PARAGRAPH_BREAK.sub("\n\n", text[start:end])))
        start = end
    return "".join(pieces)


def titled(title: str, body: str) -> str:
    """`body` spoken after its title (closed with a full stop so it is heard as one)."""
    title = " ".join(title.split())
    if not title:
        return _tidy(body)
    mark = "" if title[-1] in ".!?。！？:" else "."
    return _tidy(f"{title}{mark}\n\n{body}")


# -- Markdown ------------------------------------------------------------------------------------

def markdown_chapters(source: str, max_chars: int) -> list[Chapter]:
    """A chapter per heading of the highest level used; text before the first is its own.

    Parsed slice by slice (`_slices`: cut at blank lines outside code fences), each slice's
    tokens dropped before the next, link references carried from one slice to the next. What is
    read goes into one buffer, paragraphs parted by blank lines, and each heading's place and
    level into an array: the chapters are cut from it once the highest level is known."""
    from markdown_it import MarkdownIt

    parser = MarkdownIt("commonmark")
    env: dict[str, Any] = {}
    count = _Count(max_chars)
    read = io.StringIO()
    headings = array("q")  # (where its text starts in `read`, its length, its level), flat
    at = 0

    def put(text: str, level: int = 0) -> None:
        nonlocal at
        if level:
            headings.extend((at, len(text), level))
        elif not text:
            return
        read.write(text)
        read.write("\n\n")
        at += len(text) + 2
        count.add(len(text) + 2)

    for piece in _slices(source.replace("\r\n", "\n").replace("\r", "\n"),
                         MARKDOWN_SLICE_CHARS):
        tokens = parser.parse(piece, env)
        for i, token in enumerate(tokens):
            if token.type == "heading_open":
                put(" ".join(_inline_text(tokens[i + 1]).split()), int(token.tag[1:]))
            elif token.type == "inline" and tokens[i - 1].type != "heading_open":
                put(" ".join(_inline_text(token).split()))
            elif token.type in ("code_block", "fence"):
                put(_tidy(token.content))
        del tokens
    return _cut_chapters(read.getvalue(), headings)


def _cut_chapters(text: str, headings: array[int]) -> list[Chapter]:
    """`text` cut at its headings of the highest level (`headings`: start, length, level)."""
    top = min(headings[2::3], default=None)
    out: list[Chapter] = []
    title, start = "", 0
    for n in range(0, len(headings), 3):
        where, length, level = headings[n:n + 3]
        if level != top:
            continue
        if title or text[start:where].strip():
            out.append(Chapter(title, titled(title, text[start:where])))
        title, start = text[where:where + length], where + length + 2
    if title or text[start:].strip():
        out.append(Chapter(title, titled(title, text[start:])))
    return out


def _inline_text(token: object) -> str:
    """The words of an inline token, markup (emphasis, links, images' syntax) left out."""
    children = getattr(token, "children", None) or []
    parts = []
    for child in children:
        if child.type in ("text", "code_inline"):
            parts.append(child.content)
        elif child.type in ("softbreak", "hardbreak"):
            parts.append(" ")
        elif child.type == "image":
            parts.append(child.content)
    return "".join(parts)


_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$", re.MULTILINE)

Fence = tuple[int, int, str]
"""A fenced code block: where it starts, where it ends, its opening line."""


def _fences(source: str) -> list[Fence]:
    """The fenced code blocks of `source` (at its top level, as CommonMark opens and closes
    them); one left open runs to the end."""
    found: list[Fence] = []
    opened: re.Match[str] | None = None
    for line in _FENCE.finditer(source):
        marker, rest = line.group(1), line.group(2)
        if opened is None:
            if not (marker[0] == "`" and "`" in rest):  # (else an inline code span)
                opened = line
        elif (marker[0] == opened.group(1)[0] and len(marker) >= len(opened.group(1))
              and not rest.strip()):
            found.append((opened.start(), line.end(), opened.group(0)))
            opened = None
    if opened is not None:
        found.append((opened.start(), len(source), opened.group(0)))
    return found


def _slices(source: str, size: int) -> Iterator[str]:
    """`source` in slices of about `size` characters, each cut at a blank line outside code
    fences: the last before `size`, else the first within four times `size`. A text with no
    such blank line is cut at a line break likewise (a paragraph or a list parts in two), a
    longer line at a space; a fence cut through is closed at the end of its slice and opened
    again at the start of the next, so code is never read as Markdown."""
    fences = _fences(source)
    starts = [f[0] for f in fences]

    def fence_at(position: int) -> Fence | None:
        n = bisect.bisect_right(starts, position) - 1
        return fences[n] if n >= 0 and fences[n][0] < position < fences[n][1] else None

    def blank(low: int, high: int, backwards: bool) -> int:
        while low < high:
            found = (source.rfind if backwards else source.find)("\n\n", low, high)
            fence = fence_at(found) if found >= 0 else None
            if fence is None:
                return found
            low, high = (low, fence[0]) if backwards else (fence[1], high)
        return -1

    start, end, reopen = 0, len(source), ""
    while end - start > size:
        found = blank(start + 1, start + size, True)
        if found < 0:
            found = blank(start + size, start + 4 * size, False)
        if found < 0:
            found = source.rfind("\n", start + 1, start + size)
        if found < 0:
            found = source.find("\n", start + size, start + 4 * size)
        if found < 0:
            found = source.rfind(" ", start + 1, start + size)
        cut = found + 1 if found >= 0 else start + size
        fence = fence_at(cut)
        if fence is not None and cut > fence[0] + len(fence[2]):
            marker = _FENCE.match(fence[2])
            close = marker.group(1) if marker is not None else "```"
            yield f"{reopen}{source[start:cut]}\n{close}\n"
            reopen = fence[2] + "\n"
        else:
            yield reopen + source[start:cut]
            reopen = ""
        start = cut
    if start < end:
        yield reopen + source[start:]


# -- EPUB ----------------------------------------------------------------------------------------

def _epub_bytes(source: str) -> bytes:
    try:
        return base64.b64decode(source, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidParameter("An EPUB 'input' must be the file in base64",
                               param="input") from None


def check_archive(data: bytes, budget: ArchiveBudget) -> None:
    """`OverBudget` when the ZIP's directory lists more files than `budget` allows, or more
    bytes once inflated in the files that may be read (media never is); read from the directory
    alone, nothing inflated."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise InvalidParameter(f"The EPUB could not be read: {exc}", param="input") from None
    if len(entries) > budget.max_entries:
        raise OverBudget("The EPUB's file count", f"{len(entries):,}",
                         f"{budget.max_entries:,}", env_name("epub_max_entries"))
    size = sum(entry.file_size for entry in entries if not _media(entry.filename))
    if size > budget.max_bytes:
        raise OverBudget("The EPUB's uncompressed size", f"{size:,} bytes",
                         f"{budget.max_bytes:,} bytes", env_name("epub_max_bytes"),
                         hint="pictures, fonts and other media are not counted")


def _media(name: str) -> bool:
    return PurePosixPath(name).suffix.lower() in _NEVER_READ


def _reader(data: bytes) -> Any:
    """EbookLib's reader on `data`, reading the book's structure only: the container, the
    package and its navigation (NCX, nav document) whole, at most `STRUCTURE_MAX_BYTES` each;
    every other file reads as empty, uninflated (the spine's documents are streamed later)."""
    from ebooklib import epub

    opf = "{http://www.idpf.org/2007/opf}"

    class StructureReader(epub.EpubReader):  # type: ignore[misc]
        def __init__(self, source: IO[bytes]) -> None:
            super().__init__(source, options={"ignore_ncx": True})
            self.structure: set[str] = set()

        def _load_manifest(self) -> None:
            manifest = self.container.find(f"{opf}manifest")
            for entry in manifest if manifest is not None else ():
                href = entry.get("href") or ""
                if (entry.get("media-type") == "application/x-dtbncx+xml"
                        or "nav" in (entry.get("properties") or "").split()):
                    self.structure |= {posixpath.normpath(posixpath.join(self.opf_dir, name))
                                       for name in (href, unquote(href))}
            super()._load_manifest()

        def read_file(self, name: str) -> bytes:
            name = posixpath.normpath(name)
            if name not in self.structure | {"META-INF/container.xml",
                                             posixpath.normpath(self.opf_file or ".")}:
                return b""
            size = self.zf.getinfo(name).file_size
            if size > STRUCTURE_MAX_BYTES:
                raise InvalidParameter(
                    f"The EPUB's {name} is {size:,} bytes: a package, container or navigation "
                    f"file is read whole, at most {STRUCTURE_MAX_BYTES:,} bytes", param="input")
            content: bytes = super().read_file(name)
            return content

    return StructureReader(io.BytesIO(data))


COVER_MAX_BYTES = 5 * 1024 * 1024
"""Largest cover picture taken from an EPUB into its audiobook; a larger one is left out."""


@dataclass(frozen=True)
class BookDetails:
    """What an audiobook shows of its book: from the EPUB's package (OPF)."""

    title: str | None = None
    author: str | None = None
    cover: bytes | None = None
    """The cover picture (JPEG or PNG) when the package names one."""


def epub_details(source: str, budget: ArchiveBudget, cover: bool = True) -> BookDetails:
    """The title, author and (with `cover`) cover of an EPUB sent in base64 (structure files
    only, and the cover, at most `COVER_MAX_BYTES` inflated); empty details from a package that
    names none or cannot be read (its chapters are read, and refused, on their own)."""
    data = _epub_bytes(source)
    check_archive(data, budget)
    reader = _reader(data)
    try:
        book = reader.load()
    except Exception:  # EbookLib raises many kinds on a damaged file
        return BookDetails()

    def first(field: str) -> str | None:
        values = book.get_metadata("DC", field)
        text = " ".join(str(values[0][0]).split()) if values and values[0][0] else ""
        return text[:500] or None

    return BookDetails(first("title"), first("creator"),
                       _cover(book, reader, data) if cover else None)


def _cover(book: Any, reader: Any, data: bytes) -> bytes | None:
    """The picture the package marks as its cover (`properties="cover-image"`, or EPUB 2's
    `<meta name="cover">` naming a manifest item); None without one, or past the cap."""
    import ebooklib

    named = {str(value) for _, attrs in book.get_metadata("OPF", "cover")
             for value in [attrs.get("content")] if value}
    for item in book.get_items():
        if item.get_type() not in (ebooklib.ITEM_COVER, ebooklib.ITEM_IMAGE):
            continue
        if item.get_type() != ebooklib.ITEM_COVER and item.get_id() not in named:
            continue
        path = posixpath.normpath(posixpath.join(reader.opf_dir, item.get_name()))
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                if archive.getinfo(path).file_size > COVER_MAX_BYTES:
                    return None
                picture = archive.read(path)
        except Exception:  # missing, damaged, encrypted, an unknown compression: no cover
            return None
        return picture if picture.startswith((b"\xff\xd8", b"\x89PNG")) else None
    return None


def epub_chapters(data: bytes, budget: ArchiveBudget, max_chars: int) -> list[Chapter]:
    """A chapter per document of the spine, in reading order, titled by its first heading (or
    the table of contents' name for it); `OverBudget` as soon as the text read passes
    `max_chars`."""
    import ebooklib

    check_archive(data, budget)
    reader = _reader(data)
    try:
        book = reader.load()
        reader.process()
    except InvalidParameter:
        raise
    except Exception as exc:  # EbookLib raises many kinds on a damaged file
        raise InvalidParameter(f"The EPUB could not be read: {exc}", param="input") from None
    names: dict[str, str] = {}
    for link in _toc_links(book.toc):
        names.setdefault(link.href.split("#")[0], link.title)
    count = _Count(max_chars)
    out: list[Chapter] = []
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for idref, _linear in book.spine:
            item = book.get_item_with_id(idref)
            if item is None or item.get_type() != ebooklib.ITEM_DOCUMENT:
                continue
            path = posixpath.normpath(posixpath.join(reader.opf_dir, item.get_name()))
            try:
                with archive.open(path) as stream:
                    document = _read_document(stream, count)
            except KeyError:
                raise InvalidParameter(f"The EPUB could not be read: it has no {path}",
                                       param="input") from None
            except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:
                raise InvalidParameter(f"The EPUB could not be read: {exc}",
                                       param="input") from None
            if document is None:
                continue
            title = document.heading or names.get(item.get_name(), "")
            body = document.body()
            if body or title:
                out.append(Chapter(title, titled(title, body)))
    return out


class _Document:
    """An lxml parser target taking one (X)HTML document's spoken text as it is parsed: its
    paragraphs in reading order, each block's own text once (a paragraph ends wherever a block
    starts or ends, so text around and inside a nested block is read once, in order), and its
    first h1-h3 as its heading. Nothing of the document is kept but the text taken; each
    paragraph is counted against the job's budget as it ends."""

    def __init__(self, count: _Count) -> None:
        self.heading: str | None = None
        self._count = count
        self._out = io.StringIO()
        self._pending: list[str] = []
        self._pending_chars = 0
        self._words: list[str] = []
        self._held = 0
        self._skipped = 0
        self._in_heading: str | None = None

    def start(self, tag: str, attrib: object) -> None:
        if self._skipped or tag in _SKIPPED:
            self._skipped += 1
        elif tag == "br":
            self._words.append(" ")
        elif tag in _BLOCKS and self._in_heading is None:
            self._flush()
            if tag in _HEADINGS and self.heading is None:
                self._in_heading = tag

    def end(self, tag: str) -> None:
        if self._skipped:
            self._skipped -= 1
        elif tag == self._in_heading:
            self._in_heading = None
            self.heading = self._paragraph()
            self._count.add(len(self.heading) + 2)
            for paragraph in self._pending:
                if paragraph != self.heading:
                    self._write(paragraph)
            self._pending.clear()
        elif tag in _BLOCKS and self._in_heading is None:
            self._flush()

    def data(self, text: str) -> None:
        if self._skipped:
            return
        self._words.append(text)
        self._held += len(text)
        if self._held > _HELD_CHARS:
            self._fold()

    def _fold(self) -> None:
        """The unfinished paragraph's whitespace folded (kept at its ends, where the text that
        follows joins it), and `OverBudget` if it alone passes the budget."""
        joined = "".join(self._words)
        folded = " ".join(joined.split())
        if self._count.chars + len(folded) > self._count.limit:
            raise too_long(self._count.limit)
        lead = " " if joined[:1].isspace() else ""
        tail = " " if joined[-1:].isspace() and folded else ""
        self._words = [lead + folded + tail]
        self._held = len(self._words[0])

    def close(self) -> None:
        self._flush()
        for paragraph in self._pending:
            self._write(paragraph)
        self._pending.clear()

    def body(self) -> str:
        return self._out.getvalue()

    def _paragraph(self) -> str:
        paragraph = " ".join("".join(self._words).split())
        self._words.clear()
        self._held = 0
        return paragraph

    def _flush(self) -> None:
        paragraph = self._paragraph()
        if not paragraph or paragraph == self.heading:
            return
        self._count.add(len(paragraph) + 2)
        if self.heading is None and self._pending_chars < _PENDING_CHARS:
            self._pending.append(paragraph)
            self._pending_chars += len(paragraph)
        else:
            self._write(paragraph)

    def _write(self, paragraph: str) -> None:
        if self._out.tell():
            self._out.write("\n\n")
        self._out.write(paragraph)


def _read_document(stream: IO[bytes], count: _Count) -> _Document | None:
    """One spine document's text, fed to lxml's HTML parser `CHUNK_BYTES` at a time (as EbookLib
    read documents: UTF-8 unless a UTF-16 byte order mark says otherwise); None when it is
    empty."""
    from lxml import etree

    first = stream.read(CHUNK_BYTES)
    if not first.strip():
        return None
    document = _Document(count)
    utf16 = first.startswith((b"\xff\xfe", b"\xfe\xff"))
    parser = etree.HTMLParser(target=document, encoding="utf-16" if utf16 else "utf-8",
                              no_network=True)
    chunk = first
    while chunk:
        parser.feed(chunk)
        chunk = stream.read(CHUNK_BYTES)
    parser.close()
    return document


def _toc_links(toc: Any) -> list[Any]:
    from ebooklib import epub

    found: list[Any] = []
    for entry in toc if isinstance(toc, list | tuple) else [toc]:
        if isinstance(entry, epub.Link):
            found.append(entry)
        elif isinstance(entry, tuple) and len(entry) == 2:
            section, children = entry
            if isinstance(section, epub.Link):
                found.append(section)
            found += _toc_links(children)
    return found


def upload(name: str, data: bytes) -> tuple[str, InputFormat]:
    """An uploaded book file as a job's `input` and `input_format`, by its name."""
    lower = name.lower()
    if lower.endswith(".epub"):
        return base64.b64encode(data).decode(), "epub"
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InvalidParameter(f"{name} is not UTF-8 text, Markdown or an EPUB",
                               param="file") from None
    return text, "markdown" if lower.endswith((".md", ".markdown")) else "text"
