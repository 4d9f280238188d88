"""A warehouse's plain files on object storage: an object removed while it is being read (another
writer folded it) reads as gone, as one removed before, rather than failing the reader."""

from __future__ import annotations

from typing import Any

import pytest

from ragwarden.state.files import _ObjectFiles


class _RemovedBetweenOpenAndRead:
    """A stand-in for the store's filesystem at one instant of a race a real S3 server cannot be made
    to lose on cue: the object is there when opened and gone when read, as S3 then answers."""

    def __init__(self, message: str) -> None:
        self.message = message

    def open_input_stream(self, _: str) -> Any:
        owner = self

        class _Stream:
            def __enter__(self) -> _Stream:
                return self

            def __exit__(self, *_: object) -> None:
                return None

            def read(self) -> bytes:
                raise OSError(owner.message)

        return _Stream()


def test_an_object_removed_between_its_open_and_its_read_reads_as_gone():
    files = _ObjectFiles(_RemovedBetweenOpenAndRead("AWS Error RESOURCE_NOT_FOUND during GetObject operation: "), "p")  # type: ignore[arg-type]
    assert files.get("journal-1.arrow") is None


def test_any_other_storage_failure_while_reading_is_raised():
    files = _ObjectFiles(_RemovedBetweenOpenAndRead("AWS Error ACCESS_DENIED during GetObject operation"), "p")  # type: ignore[arg-type]
    with pytest.raises(OSError, match="ACCESS_DENIED"):
        files.get("journal-1.arrow")
