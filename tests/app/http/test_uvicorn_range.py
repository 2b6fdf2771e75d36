"""app/http/connections.py subclasses uvicorn's private protocol classes: the uvicorn installed
must be in the range pyproject.toml declares, and every method the subclasses override must still
be one uvicorn calls. `make uvicorn-floor` runs these and the connection tests on the lowest
version of the range."""

from __future__ import annotations

import inspect
import tomllib
from pathlib import Path

import uvicorn
from packaging.requirements import Requirement
from packaging.version import Version

from app.http import connections

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"


def declared() -> Requirement:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    (requirement,) = [Requirement(r) for r in project["dependencies"]
                      if Requirement(r).name == "uvicorn"]
    return requirement


def test_the_declared_range_is_the_one_the_edge_is_written_for() -> None:
    requirement = declared()
    assert str(requirement.specifier) == connections.UVICORN_RANGE
    assert f"uvicorn{connections.UVICORN_RANGE} " in inspect.getsource(connections)
    assert Version(uvicorn.__version__) in requirement.specifier, (
        f"uvicorn {uvicorn.__version__} is installed; VoxMux is tested with "
        f"uvicorn{requirement.specifier} (pyproject.toml)"
    )


def test_every_override_is_a_method_uvicorn_has() -> None:
    """An override of a method uvicorn renamed or dropped would silently never run."""
    pairs = [(connections.HttpProtocol, connections.HttpToolsProtocol),
             (connections.WebSocketProtocol, connections.WebSocketsSansIOProtocol)]
    for ours, base in pairs:
        overrides = [name for name, value in vars(ours).items()
                     if inspect.isfunction(value) and not name.startswith("_")]
        assert overrides
        missing = [name for name in overrides if not hasattr(base, name)]
        assert not missing, (
            f"uvicorn {uvicorn.__version__}'s {base.__name__} has no {', '.join(missing)}, "
            f"which app/http/connections.py overrides; it is written for "
            f"uvicorn{connections.UVICORN_RANGE}"
        )
    assert connections.STATUS_LINE[431].startswith(b"HTTP/1.1 431")
