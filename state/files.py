"""Plain files in a folder of the warehouse, beside the tables: the receipts' journal and the
resident index's artifacts. A local folder, or a prefix of an S3-compatible store configured from
the options Lance is given; other stores have none (their callers keep to the tables)."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

import pyarrow.fs as pafs

from .tables import local_path

RESIDENT_INDEX = "resident_index"
"""The serving index's artifacts (``retrieval.serving``): ``chunks-<version>.faiss`` and ``.rows``."""

LINEAGE_EVENTS = "_lineage/events"
"""Lineage events written as files when no backend is configured (``lineage_transport``)."""

PURGE_MARKS = "history"
"""Per table, the latest version at its last purge (``history.EmptiedMark``)."""


def warehouse_files(uri: str, storage_options: Mapping[str, str], folder: str) -> WarehouseFiles | None:
    """The files of ``folder`` in the warehouse at ``uri``; None on a store other than a local
    folder or S3."""
    root = local_path(uri)
    if root is not None:
        return _LocalFiles(root / folder)
    if urlparse(uri).scheme in ("s3", "s3a"):
        return _s3_files(uri, storage_options, folder)
    return None


def open_new(path: Path, flags: int) -> int:
    """A descriptor of a file made at ``path`` (refused if one is there), its folder made with the
    folder's first file: the usual case costs one system call (each one, under load, waits for the
    interpreter lock again)."""
    try:
        return os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)


class WarehouseFiles(Protocol):
    """Files in one folder of the warehouse, named by the caller; a put is whole or absent to readers."""

    def put(self, name: str, data: bytes) -> None: ...
    def names(self) -> list[str]: ...
    def get(self, name: str) -> bytes | None: ...
    def remove(self, name: str) -> None: ...
    def clear(self) -> None: ...
    def local(self, name: str) -> Path | None: ...


class _LocalFiles:
    """Files in a local folder: written to a temporary name, then renamed into place, so a
    reader sees a whole file or none. Durable as Lance's own commits to a local folder are: in the
    operating system's hands once written (a killed process loses nothing; neither flushes to the
    disk, which on this path would be a noticeable share of a search's time under load)."""

    def __init__(self, folder: Path) -> None:
        self._folder = folder

    def put(self, name: str, data: bytes) -> None:
        partial = self._folder / f".{name}.{uuid.uuid4().hex}.tmp"
        handle = open_new(partial, os.O_WRONLY)
        try:
            left = memoryview(data)
            while left:  # one call, but for a short write
                left = left[os.write(handle, left) :]
        finally:
            os.close(handle)
        os.replace(partial, self._folder / name)

    def names(self) -> list[str]:
        try:
            return os.listdir(self._folder)
        except FileNotFoundError:
            return []

    def get(self, name: str) -> bytes | None:
        try:
            return (self._folder / name).read_bytes()
        except FileNotFoundError:
            return None

    def remove(self, name: str) -> None:
        try:
            (self._folder / name).unlink()
        except FileNotFoundError:
            pass

    def clear(self) -> None:
        """Remove the folder and everything in it (nothing, if it is not there)."""
        try:
            shutil.rmtree(self._folder)
        except FileNotFoundError:
            pass

    def local(self, name: str) -> Path | None:
        """The file's path, for a reader that maps it into memory rather than copy it."""
        path = self._folder / name
        return path if path.is_file() else None


class _ObjectFiles:
    """Files under the warehouse's prefix of an S3-compatible store (one PUT per file)."""

    def __init__(self, fs: pafs.FileSystem, prefix: str) -> None:
        self._fs = fs
        self._prefix = prefix

    def put(self, name: str, data: bytes) -> None:
        with self._fs.open_output_stream(f"{self._prefix}/{name}") as out:
            out.write(data)

    def names(self) -> list[str]:
        found = self._fs.get_file_info(pafs.FileSelector(self._prefix, allow_not_found=True))
        return [info.base_name for info in found if info.type == pafs.FileType.File]

    def get(self, name: str) -> bytes | None:
        """The object's bytes; None if it is gone, also when it went between the open and the read
        (another writer folded and removed it): S3 then answers GetObject with a plain error."""
        try:
            with self._fs.open_input_stream(f"{self._prefix}/{name}") as source:
                return bytes(source.read())
        except FileNotFoundError:
            return None
        except OSError as exc:
            if "RESOURCE_NOT_FOUND" in str(exc) or "NoSuchKey" in str(exc):
                return None
            raise

    def remove(self, name: str) -> None:
        try:
            self._fs.delete_file(f"{self._prefix}/{name}")
        except FileNotFoundError:
            pass

    def clear(self) -> None:
        self._fs.delete_dir_contents(self._prefix, missing_dir_ok=True)

    def local(self, name: str) -> Path | None:
        return None


def _s3_files(uri: str, storage_options: Mapping[str, str], folder: str) -> _ObjectFiles:
    """Files of ``folder`` on S3, configured from the same options Lance is given."""
    parsed = urlparse(uri)
    endpoint = storage_options.get("aws_endpoint") or storage_options.get("endpoint")
    kwargs: dict[str, object] = {}
    if endpoint:
        target = urlparse(endpoint)
        kwargs["endpoint_override"] = target.netloc or target.path
        kwargs["scheme"] = target.scheme or "https"
    for option, name in (("aws_region", "region"), ("aws_access_key_id", "access_key"),
                         ("aws_secret_access_key", "secret_key"), ("aws_session_token", "session_token")):  # fmt: skip
        if storage_options.get(option):
            kwargs[name] = storage_options[option]
    fs = pafs.S3FileSystem(**kwargs)  # type: ignore[arg-type]
    return _ObjectFiles(fs, f"{parsed.netloc}{parsed.path.rstrip('/')}/{folder}")
