"""Where VoxMux's own files are: the Studio's templates and static files, the model catalogue and
the deployment profiles.

They live at the repository's top level (`web/`, `config/`). A wheel carries them inside this
package (pyproject.toml maps them here), so a plain `pip install .` serves from any working
directory; a source checkout, such as the editable install `make` makes, reads them in place.
"""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent
_CHECKOUT = _HERE.parent.parent


def resource(top: str, *parts: str) -> Path:
    """`resource("web", "templates")`: the packaged copy if this is an installed wheel, else the
    repository's own directory."""
    packaged = _HERE / top
    base = packaged if packaged.is_dir() else _CHECKOUT / top
    return base.joinpath(*parts)


CONFIG = resource("config")
TEMPLATES = resource("web", "templates")
STATIC = resource("web", "static")
