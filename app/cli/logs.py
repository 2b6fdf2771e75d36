"""Logging for `voxmux serve`: uvicorn's console lines, plus a rotating file under `log_dir`."""

from __future__ import annotations

import copy
import logging.config
from typing import Any

from uvicorn.config import LOGGING_CONFIG

from app.settings import Settings

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_FILE = "voxmux.log"
MAX_BYTES = 10 * 1024 * 1024
BACKUPS = 5


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
        settings.log_dir.mkdir(parents=True, exist_ok=True)
        config["handlers"]["file"] = {
            "class": "logging.handlers.RotatingFileHandler", "formatter": "plain",
            "filename": str(settings.log_dir / LOG_FILE), "maxBytes": MAX_BYTES,
            "backupCount": BACKUPS, "encoding": "utf-8",
        }
        config["root"]["handlers"].append("file")
        for name in ("uvicorn", "uvicorn.access"):  # they do not propagate to the root
            config["loggers"][name]["handlers"].append("file")
    return config


def configure_logging(settings: Settings) -> None:
    logging.config.dictConfig(logging_config(settings))
