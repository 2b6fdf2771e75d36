"""EPUBs for tests, written by EbookLib as a user's tools write them: a chapter per spine
document (an `<h1>` title, then paragraphs), a table of contents, and optionally an author and
a cover picture."""

from __future__ import annotations

import io


def make_epub(chapters: list[tuple[str, str]], *, title: str = "A Book",
              identifier: str = "voxmux-test", author: str | None = None,
              cover: bytes | None = None, nav_in_spine: bool = False) -> bytes:
    """`chapters` as (title, body HTML after the title) in reading order."""
    from ebooklib import epub

    book = epub.EpubBook()
    book.set_identifier(identifier)
    book.set_title(title)
    book.set_language("en")
    if author:
        book.add_author(author)
    if cover:
        book.set_cover("cover.png", cover)
    items = []
    for n, (heading, body) in enumerate(chapters):
        chapter = epub.EpubHtml(title=heading, file_name=f"c{n}.xhtml", lang="en")
        chapter.content = f"<h1>{heading}</h1>{body}"
        book.add_item(chapter)
        items.append(chapter)
    book.toc = items
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = ["nav", *items] if nav_in_spine else items
    buffer = io.BytesIO()
    epub.write_epub(buffer, book)
    return buffer.getvalue()
