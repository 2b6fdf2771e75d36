"""Jinja2 pages whose named blocks double as htmx fragments: one source for page and fragment."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape


class UnknownBlock(LookupError):
    """The template has no block of that name."""


class Pages:
    def __init__(self, directory: Path) -> None:
        self.env = Environment(
            loader=FileSystemLoader(directory),
            autoescape=select_autoescape(("html",)),
            trim_blocks=True,
            lstrip_blocks=True,
        )

    def page(self, name: str, context: Mapping[str, Any]) -> str:
        return self.env.get_template(name).render(context)

    def block(self, name: str, block: str, context: Mapping[str, Any]) -> str:
        """Render one `{% block %}` of `name` alone, with the same context the page gets."""
        template = self.env.get_template(name)
        render = template.blocks.get(block)
        if render is None:
            raise UnknownBlock(f"{name} has no block '{block}'")
        return "".join(render(template.new_context(dict(context))))

    def blocks(self, name: str) -> tuple[str, ...]:
        return tuple(self.env.get_template(name).blocks)
