"""Logging for `voxmux serve`: uvicorn's console lines, plus a rotating file under `log_dir`.

The files are created 0600 (and an existing one is tightened to it): a log names clients, paths
and requests, which are no business of other local users.
"""

from __future__ import annotations

import copy
import io
import logging.config
import logging.handlers
import os
from typing import Any

from uvicorn.config import LOGGING_CONFIG

from app.settings import Settings

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_FILE = "voxmux.log"
MAX_BYTES = 10 * 1024 * 1024
BACKUPS = 5


class PrivateRotatingFileHandler(logging.handlers.RotatingFileHandler):
    """`RotatingFileHandler` whose files (the first and each one after a rollover) are 0600."""

    def _open(self) -> io.TextIOWrapper:
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.fchmod(fd, 0o600)  # a file left by an older version, or made under another umask
        return io.TextIOWrapper(open(fd, "ab"), encoding=self.encoding, errors=self.errors)


def logging_config(settings: Settings) -> dict[str, Any]:
    """uvicorn's own config (its console lines stay as users know them), VoxMux's loggers on the
    root, and with `log_dir` one rotating file that gets every line, access log included."""
    config = copy.deepcopy(LOGGING_CONFIG)
    level = settings.log_level.upper()
    config["formatters"]["plain"] = {"format": FORMAT}
    config["handlers"]["app"] = {
        "class": "logging.StreamHandler", "formatter": "plain", "stream": "ext://sys.stderr",
    }
    config["root"] = {"handlers": ["app"], "level": level}
    if settings.log_dir is not None:
        settings.log_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        config["handlers"]["file"] = {
            "()": PrivateRotatingFileHandler, "formatter": "plain",
            "filename": str(settings.log_dir / LOG_FILE), "maxBytes": MAX_BYTES,
            "backupCount": BACKUPS, "encoding": "utf-8",
        }
        config["root"]["handlers"].append("file")
        for name in ("uvicorn", "uvicorn.access"):  # they do not propagate to the root
            config["loggers"][name]["handlers"].append("file")
    return config


def configure_logging(settings: Settings) -> None:
    logging.config.dictConfig(logging_config(settings))
