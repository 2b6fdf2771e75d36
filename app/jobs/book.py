"""A long text as chapters: plain text, Markdown (a chapter per top-level heading) or EPUB (a
chapter per spine document, read with EbookLib). Each chapter's spoken text starts with its title,
so a listener hears where a chapter begins.

An EPUB is a ZIP, and a small one can inflate to gigabytes: its size and entry count are checked
against their budgets from the ZIP's directory before anything is inflated (zipfile never reads
an entry past the size the directory states, so the directory is a real bound), and files a
book's text never needs (images, fonts, audio, video, styles) are never inflated at all.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
import zipfile
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Literal

from app.serving.budgets import OverBudget, env_name
from engines.base import InvalidParameter

InputFormat = Literal["text", "markdown", "epub"]

_BLOCKS = ("p", "h1", "h2", "h3", "h4", "h5", "h6", "li", "blockquote", "pre", "dd", "dt",
           "td", "th", "figcaption")


_NEVER_READ = frozenset((
    ".jpg", ".jpeg", ".png", ".gif", ".webp", ".bmp", ".tif", ".tiff", ".svg", ".avif",  # images
    ".ico", ".ttf", ".otf", ".woff", ".woff2", ".eot",  # icons, fonts
    ".mp3", ".m4a", ".m4b", ".aac", ".ogg", ".oga", ".opus", ".wav", ".flac",  # audio
    ".mp4", ".m4v", ".webm", ".ogv", ".mov", ".mkv",  # video
    ".css", ".js"))
"""Extensions of an EPUB's files that its spoken text never needs: never inflated."""


@dataclass(frozen=True)
class Chapter:
    title: str
    text: str
    """What is spoken: the title first (when there is one), then the body."""


@dataclass(frozen=True)
class ArchiveBudget:
    """What an EPUB's ZIP may hold: bytes once inflated, all files together, and files."""

    max_bytes: int
    max_entries: int


def chapters(source: str, fmt: InputFormat, title: str | None = None, *,
             budget: ArchiveBudget) -> list[Chapter]:
    if fmt == "markdown":
        found = markdown_chapters(source)
    elif fmt == "epub":
        found = epub_chapters(_epub_bytes(source), budget)
    else:
        found = [Chapter(title or "", _tidy(source))]
    found = [c for c in found if any(ch.isalnum() for ch in c.text)]
    if not found:
        raise InvalidParameter("'input' has no text to speak (letters or digits)", param="input")
    return found


def _tidy(text: str) -> str:
    """Paragraphs kept apart, runs of blank lines and spaces folded."""
    paragraphs = (" ".join(p.split()) for p in re.split(r"\n\s*\n", text))
    return "\n\n".join(p for p in paragraphs if p)


def titled(title: str, body: str) -> str:
    """`body` spoken after its title (closed with a full stop so it is heard as one)."""
    title = " ".join(title.split())
    if not title:
        return _tidy(body)
    mark = "" if title[-1] in ".!?。！？:" else "."
    return _tidy(f"{title}{mark}\n\n{body}")


def markdown_chapters(source: str) -> list[Chapter]:
    """A chapter per heading of the highest level used; text before the first is its own."""
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("commonmark").parse(source)
    headings = [t for t in tokens if t.type == "heading_open"]
    top = min((t.tag for t in headings), default=None)
    out: list[Chapter] = []
    title, body = "", list[str]()
    for i, token in enumerate(tokens):
        if token.type == "heading_open" and token.tag == top:
            if title or body:
                out.append(Chapter(title, titled(title, "\n\n".join(body))))
            title, body = _inline_text(tokens[i + 1]), []
        elif token.type == "inline" and not (i and tokens[i - 1].type == "heading_open"
                                             and tokens[i - 1].tag == top):
            body.append(_inline_text(token))
        elif token.type in ("code_block", "fence"):
            body.append(token.content)
    if title or body:
        out.append(Chapter(title, titled(title, "\n\n".join(body))))
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


def _epub_bytes(source: str) -> bytes:
    try:
        return base64.b64decode(source, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidParameter("An EPUB 'input' must be the file in base64",
                               param="input") from None


def check_archive(data: bytes, budget: ArchiveBudget) -> None:
    """`OverBudget` when the ZIP's directory lists more files, or more bytes once inflated,
    than `budget` allows; read from the directory alone, nothing inflated."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise InvalidParameter(f"The EPUB could not be read: {exc}", param="input") from None
    if len(entries) > budget.max_entries:
        raise OverBudget("The EPUB's file count", f"{len(entries):,}",
                         f"{budget.max_entries:,}", env_name("epub_max_entries"))
    size = sum(entry.file_size for entry in entries)
    if size > budget.max_bytes:
        raise OverBudget("The EPUB's uncompressed size", f"{size:,} bytes",
                         f"{budget.max_bytes:,} bytes", env_name("epub_max_bytes"))


def _reader(data: bytes) -> Any:
    """EbookLib's reader on `data`; the files in `_NEVER_READ` read as empty, uninflated."""
    from ebooklib import epub

    class TextReader(epub.EpubReader):  # type: ignore[misc]
        def read_file(self, name: str) -> bytes:
            if PurePosixPath(name).suffix.lower() in _NEVER_READ:
                return b""
            content: bytes = super().read_file(name)
            return content

    return TextReader(io.BytesIO(data), options={"ignore_ncx": True})


def epub_chapters(data: bytes, budget: ArchiveBudget) -> list[Chapter]:
    """A chapter per document of the spine, in reading order, titled by its first heading (or
    the table of contents' name for it)."""
    import ebooklib
    import lxml.html

    check_archive(data, budget)
    try:
        reader = _reader(data)
        book = reader.load()
        reader.process()
    except Exception as exc:  # EbookLib raises many kinds on a damaged file
        raise InvalidParameter(f"The EPUB could not be read: {exc}", param="input") from None
    names: dict[str, str] = {}
    for link in _toc_links(book.toc):
        names.setdefault(link.href.split("#")[0], link.title)
    out: list[Chapter] = []
    for idref, _linear in book.spine:
        item = book.get_item_with_id(idref)
        if item is None or item.get_type() != ebooklib.ITEM_DOCUMENT:
            continue
        content = item.get_content()
        if not content.strip():
            continue
        root = lxml.html.fromstring(content)
        for junk in root.xpath("//script|//style|//nav"):
            junk.drop_tree()
        blocks = [" ".join(e.text_content().split()) for e in root.iter(*_BLOCKS)]
        heading = next((" ".join(h.text_content().split())
                        for h in root.iter("h1", "h2", "h3")), "")
        body = [b for b in blocks if b and b != heading]
        title = heading or names.get(item.get_name(), "")
        if body or title:
            out.append(Chapter(title, titled(title, "\n\n".join(body))))
    return out


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
