"""Opening the warehouse's LanceDB connection and tables, and the one place a Lance failure
becomes a ``WarehouseError``.

Every process opens the warehouse with ``read_consistency_interval=0`` so each read sees the
latest commit: a replica never serves a revoked ACL from a stale handle.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import lancedb
import pyarrow as pa

from ..errors import RagwardenError, StorageUnreachableError, WarehouseError
from ..governance.sql import sql_documents, sql_in_list
from .commit_retry import PlanOutlived, is_commit_conflict, retrying_conflicts

C = TypeVar("C", bound=type)
_OPERATION: ContextVar[str | None] = ContextVar("ragwarden_operation", default=None)

_LANCE_FAILURES = ("LanceError", "lance error", "External error", "Object at location")
_STORAGE_ERRNOS = {errno.ENOSPC, errno.EFBIG, errno.EIO, errno.EROFS, errno.EDQUOT}
_UNREACHABLE = ("error sending request", "Connection refused", "dns error", "tcp connect error", "operation timed out")
"""What the object store's client says when no answer came back: the store is unreachable, not damaged."""
_REQUEST = re.compile(r"Error performing (?P<method>[A-Z]+) (?P<url>[^\s?]+)")


def _request_in(text: str) -> str:
    """`` (GET http://host/bucket/key)``: the request that got no answer, when the error names it."""
    found = _REQUEST.search(text)
    return f" ({found['method']} {found['url']})" if found else ""


def storage_failure(
    uri: str, operation: str, exc: BaseException, damaged: Callable[[], list[str]] = list
) -> WarehouseError | None:
    """``exc`` as a WarehouseError naming the warehouse, the operation and the ``damaged()`` files
    when it is a failure to read or write the warehouse's files (a missing or damaged file, a full
    disk); None for any other exception."""
    text = str(exc)
    gone = missing_bucket(uri, exc)
    if gone is not None:
        return gone
    lance = isinstance(exc, (RuntimeError, OSError, pa.ArrowException)) and any(
        mark in text for mark in _LANCE_FAILURES
    )
    if not lance and not (isinstance(exc, OSError) and exc.errno in _STORAGE_ERRNOS):
        return None
    if any(mark in text for mark in _UNREACHABLE):
        return StorageUnreachableError(
            f"warehouse {uri!r}: {operation} could not reach the object store{_request_in(text)}; it changed nothing. "
            "Check that the endpoint answers and that this host reaches it, then retry"
        )
    detail = text.splitlines()[0] if text else type(exc).__name__
    if is_commit_conflict(exc):
        return WarehouseError(
            f"warehouse {uri!r}: {operation} lost a commit race to a concurrent writer ({detail}); try again"
        )
    files = damaged()
    named = f" Missing or damaged: {', '.join(files)}." if files else ""
    return WarehouseError(
        f"warehouse {uri!r}: {operation} failed reading or writing its files: {detail}.{named} "
        "Committed versions are untouched: free space or restore the damaged files from a backup, then retry"
    )


def names_storage_failures(cls: C) -> C:
    """Class decorator of the state layer's table classes: a failure of any public method to read or
    write the warehouse's files leaves as a WarehouseError naming the warehouse, the operation and
    (where Lance knows it) the damaged files, never as a bare Lance error. The class provides
    ``uri`` and ``damaged_files()``."""
    for name, method in list(vars(cls).items()):
        if name.startswith("_") or not callable(method) or isinstance(method, (staticmethod, classmethod, type)):
            continue
        setattr(cls, name, _naming(method))
    return cls


@contextlib.contextmanager
def operation_named(name: str) -> Iterator[None]:
    """Within this block a storage failure names ``name`` (the caller's operation, say ``search``)
    rather than the state method that met it."""
    token = _OPERATION.set(name)
    try:
        yield
    finally:
        _OPERATION.reset(token)


def _naming(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def run(self: Any, /, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except RagwardenError:
            raise
        except Exception as exc:
            failure = storage_failure(self.uri, _OPERATION.get() or method.__name__, exc, self.damaged_files)
            if failure is None:
                raise
            raise failure from exc

    return run


def is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


def local_path(uri: str) -> Path | None:
    """The warehouse folder, when the warehouse is on the local file system."""
    return Path(uri.removeprefix("file://")) if is_local(uri) else None


def connect(uri: str, storage_options: Mapping[str, str] | None = None, *, create: bool = True) -> Any:
    """A LanceDB connection to the warehouse that sees every commit at once; ``storage_options``
    configure an object store. A local folder is created when ``create``; else a warehouse that
    is not there (no folder, or one holding no table) is refused, naming the path, so a mistyped
    path never reads as an empty warehouse."""
    folder = local_path(uri)
    if folder is not None:
        if folder.exists() and not folder.is_dir():
            raise WarehouseError(f"warehouse {uri!r} is a file, not a warehouse folder; name the folder instead")
        if create:
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise WarehouseError(f"cannot create warehouse folder {uri!r}: {exc.strerror or exc}") from None
        elif not folder.is_dir():
            raise _no_warehouse(uri)
    try:
        db = lancedb.connect(uri, read_consistency_interval=timedelta(0), storage_options=dict(storage_options or {}) or None)
        if not create and not db.list_tables().tables:
            raise _no_warehouse(uri)
        return db
    except WarehouseError:
        raise
    except Exception as exc:  # lancedb raises plain exceptions for bad URIs
        raise missing_bucket(uri, exc, storage_options) or WarehouseError(f"cannot open warehouse {uri!r}: {exc}") from exc


def _no_warehouse(uri: str) -> WarehouseError:
    return WarehouseError(
        f"no warehouse at {uri!r}: check --warehouse (or RAGWARDEN_WAREHOUSE); only ingest, policy install "
        "and init create one"
    )


def missing_bucket(uri: str, exc: BaseException, storage_options: Mapping[str, str] | None = None) -> WarehouseError | None:
    """``exc`` as one line saying which bucket is missing and where it was looked for, when the
    object store answered NoSuchBucket (its own error is a thousand characters of retries); else None."""
    if "NoSuchBucket" not in str(exc):
        return None
    bucket = urlsplit(uri).netloc
    endpoint = (storage_options or {}).get("aws_endpoint")
    where = f"at AWS_ENDPOINT_URL={endpoint}" if endpoint else "in the object store"
    return WarehouseError(
        f"warehouse {uri!r}: bucket {bucket!r} not found {where}; create it, or name an existing bucket in the warehouse URI"
    )


def open_table(db: Any, name: str, schema: pa.Schema) -> Any:
    """Table ``name`` of the warehouse, created empty if absent; refused if its schema differs."""
    try:
        try:  # opened, not created with exist_ok: that compares field metadata such as a primary key
            table = db.open_table(name)
        except ValueError:  # not there yet
            try:
                table = db.create_table(name, schema=schema)
            except Exception:  # another process created it first
                table = db.open_table(name)
    except Exception as exc:
        raise WarehouseError(f"warehouse {db.uri!r}: table {name!r} cannot be opened: {exc}") from exc
    if not table.schema.equals(stored_form(schema), check_metadata=False):
        raise WarehouseError(
            f"warehouse {db.uri!r}: table {name!r} has schema {table.schema}, expected {schema}; "
            "it was written by another version or another embedding model"
        )
    return table


def stored_form(schema: pa.Schema) -> pa.Schema:
    """``schema`` as a Lance table reports it: a JSON column is kept as Lance's ``lance.json``
    extension of ``large_binary`` (and read back as JSON text)."""
    return pa.schema(
        [field.with_type(pa.large_binary()) if isinstance(field.type, pa.JsonType) else field for field in schema]
    )


def declare_primary_key(table: Any, column: str) -> None:
    """Declare ``column`` the table's unenforced primary key (once), so that Lance records the keys
    a commit inserts and refuses a concurrent commit inserting the same key."""
    metadata = table.schema.field(column).metadata or {}
    if any(key.startswith(b"lance-schema:unenforced-primary-key") for key in metadata):
        return
    retrying_conflicts(lambda: table.set_unenforced_primary_key(column), what=f"declaring the key of {table.name}")


VERSIONS_KEPT = timedelta(minutes=5)
"""How long an old version of an append-only table (``audit``, ``api_keys``) or of the
``directory`` is kept: long enough for any read begun on it, and twice ``PLAN_LIFETIME``."""

PLAN_LIFETIME = VERSIONS_KEPT / 2
"""The longest a write may take from reading its snapshot to committing on it: every table keeps
the records of its commits at least twice that long, so those of the commits made meanwhile are
there for Lance to check it against (with room for the writers' clocks to disagree)."""


def conditional_merge(dataset: Any, key: str, delete: Sequence[str] = (), *, planned_at: float, what: str) -> Any:
    """The merge that writes rows by ``key`` and deletes the rows whose key is in ``delete``,
    committing only on ``dataset``'s version: Lance refuses it when a commit since touched one of
    the same rows (``key`` is the table's unenforced primary key). A plan made at ``planned_at``
    (``time.monotonic()``) longer ago than ``PLAN_LIFETIME`` raises ``PlanOutlived`` (planned again
    by ``retrying_conflicts``): the records of the commits since may be gone."""
    age = time.monotonic() - planned_at
    if age > PLAN_LIFETIME.total_seconds():
        raise PlanOutlived(what, dataset.version, age)
    merge = dataset.merge_insert(key).when_matched_update_all().when_not_matched_insert_all()
    if delete:
        merge = merge.when_not_matched_by_source_delete(f"{key} IN {sql_in_list(sorted(delete))}")
    # use_index(False): the indexed route does not record inserted keys, so two concurrent inserts
    # of one key would both commit. conflict_retries(0): Lance's own retry would replay rows planned
    # from this version onto a newer one.
    return merge.use_index(False).conflict_retries(0)


FRAGMENT_ROWS = 10_000
"""Rows an append-only table's compaction gathers into one file. A file that holds this many is
left as it is: merging into one ever-growing file rewrote the whole audit log at each compaction,
and recent versions and failed compactions kept every copy."""


def compact_and_prune(table: Any, *, prune: bool = True, older_than: timedelta = VERSIONS_KEPT) -> int:
    """Merge an append-only table's small data files (into files of ``FRAGMENT_ROWS``) and, with
    ``prune``, drop its untagged versions older than ``older_than`` (each commit leaves one;
    pruning reads every version's manifest, so busy writers do it less often than they compact);
    rows are unchanged. Returns the versions dropped."""
    table.to_lance().optimize.compact_files(target_rows_per_fragment=FRAGMENT_ROWS)
    table.checkout_latest()
    if not prune:
        return 0
    cleaned = table.to_lance().cleanup_old_versions(older_than=older_than, error_if_tagged_old_versions=False)
    return int(cleaned.old_versions)


def damaged_files(root: Path | None, tables: Mapping[str, Any]) -> list[str]:
    """Data files a table's current version names that are missing or not the size it recorded
    (local warehouses; for diagnosis after a failed read, so it never raises)."""
    found: list[str] = []
    if root is None:
        return found
    for name, table in tables.items():
        folder = root / f"{name}.lance" / "data"
        try:
            for fragment in table.to_lance().get_fragments():
                for data in fragment.data_files():
                    path = folder / data.path
                    size = path.stat().st_size if path.exists() else None
                    if size is None or (data.file_size_bytes is not None and size != data.file_size_bytes):
                        found.append(str(path))
        except Exception as exc:  # a table whose manifest cannot be read is damaged as a whole
            found.append(f"{root / f'{name}.lance'} ({str(exc).splitlines()[0] if str(exc) else exc!r})")
    return found


def rows_where_in(table: Any, column: str, values: Iterable[str], columns: list[str]) -> list[dict[str, Any]]:
    """Rows of ``table`` whose ``column`` is one of ``values`` (quoted as data), with ``columns``
    only. A value holding a NUL character cannot be an id (nor an SQL literal): it matches no row."""
    wanted = sorted(v for v in set(values) if "\x00" not in v)
    if not wanted:
        return []
    return table.search().where(f"{column} IN {sql_in_list(wanted)}").select(columns).limit(None).to_list()


def documents_rows(table: Any, keys: Iterable[tuple[str, str]], columns: list[str]) -> list[dict[str, Any]]:
    """Rows of the documents ``keys`` ((tenant, doc id), quoted as data); a key holding a NUL
    matches nothing. Used on the small-columned tables (sources, erasures), never on chunks."""
    wanted = {(t, d) for t, d in keys if "\x00" not in t and "\x00" not in d}
    if not wanted:
        return []
    if len(wanted) > MANY_KEYS:
        return _joined(table, wanted, columns)
    return table.search().where(sql_documents(wanted)).select(columns).limit(None).to_list()


MANY_KEYS = 2_000
"""Above this many documents asked for, the table's columns asked for are scanned and joined with
the keys in Arrow: a filter of 100,000 quoted pairs took seconds to write and to run on a 1M-row
table (10 s of a 1M-row import), where the scan and the join take a tenth of one."""


def _joined(table: Any, wanted: set[tuple[str, str]], columns: list[str]) -> list[dict[str, Any]]:
    """The rows of ``table`` whose (tenant, doc_id) is one of ``wanted``, with ``columns``: the two
    key columns scanned and joined with ``wanted`` first (an import asks for 100,000 documents the
    table mostly does not hold), then the other columns only if they are needed."""
    dataset = table.to_lance()
    held = dataset.to_table(columns=["tenant", "doc_id"])
    asked = pa.table({"tenant": [t for t, _ in wanted], "doc_id": [d for _, d in wanted]}, schema=held.schema)
    found = held.join(asked, keys=["tenant", "doc_id"], join_type="left semi")
    if not found.num_rows:
        return []
    if set(columns) <= {"tenant", "doc_id"}:
        return found.select(columns).to_pylist()
    if found.num_rows <= MANY_KEYS:
        present = set(zip(found.column("tenant").to_pylist(), found.column("doc_id").to_pylist(), strict=True))
        return table.search().where(sql_documents(present)).select(columns).limit(None).to_list()
    read = dataset.to_table(columns=sorted({*columns, "tenant", "doc_id"}))
    return read.join(found, keys=["tenant", "doc_id"], join_type="left semi").select(columns).to_pylist()