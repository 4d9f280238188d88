"""Casbin model and example policies: data shipped with the package, not code."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

__all__ = ["policy_file"]


def policy_file(name: str) -> Path:
    """Path of a file shipped in this folder (``model.conf``, ``demo.csv``)."""
    return Path(str(files(__name__).joinpath(name)))
