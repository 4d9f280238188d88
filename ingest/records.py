"""Source records: one document with its governance, validated before anything is written.

Every loader (JSONL, files with a manifest or sidecar, POSIX permissions) produces the same
three outcomes: a ``SourceRecord`` to ingest, a ``Skipped`` input (empty text) or a ``Rejected``
one (bad governance or bad bytes), each naming where it came from and why.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import zlib
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..errors import InvalidSourceError, InvalidValueError
from ..governance.tags import (
    ALLOWS_NOBODY,
    Classification,
    GovernanceTags,
    allows_nobody,
    label_problem,
    principal_problem,
    tenant_problem,
)

MAX_ID_LENGTH = 512
MAX_LINE_BYTES = 20 * 1024 * 1024
MAX_METADATA_BYTES = 65_536
RECORD_FIELDS = frozenset({"id", "text", "tenant", "acl", "labels", "classification", "uri", "metadata", "vector", "model"})
MAX_MODEL_CHARS = 256


@dataclass(frozen=True, kw_only=True)
class SourceRecord:
    """A document ready to ingest: its text, its tags, where it came from."""

    doc_id: str
    text: str
    tags: GovernanceTags
    uri: str
    origin: str
    metadata: Mapping[str, Any] = field(default_factory=dict)
    vector: np.ndarray | None = field(default=None, compare=False)  # brought in (float32, read-only): one chunk, not embedded here
    model: str | None = None  # the model that made ``vector``

    @cached_property
    def version(self) -> str:
        """Content hash of the text: a new version whenever the text changes."""
        return document_version(self.text)

    @cached_property
    def key(self) -> tuple[str, str]:
        """(tenant, doc id): the id names the document within its tenant only."""
        return (self.tags.tenant, self.doc_id)

    @cached_property
    def metadata_json(self) -> str:
        """The metadata as stored on the source and on each of its chunks."""
        return metadata_json(self.metadata)


_METADATA_ENCODER = json.JSONEncoder(sort_keys=True, allow_nan=False, default=str, ensure_ascii=False)
"""What ``json.dumps`` with these options builds on every call, built once: imports encode millions."""


def metadata_json(metadata: Mapping[str, Any]) -> str:
    """Metadata as canonical JSON text (keys sorted; a value JSON cannot hold, such as a date,
    as its text); ValueError for NaN or infinity, which JSON cannot carry."""
    return _METADATA_ENCODER.encode(dict(metadata))


def document_version(text: str) -> str:
    """A document's version: the content hash of its text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


@dataclass(frozen=True, kw_only=True)
class Skipped:
    """An input that holds nothing to index (empty text); not an error."""

    source: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class Rejected:
    """An input refused at ingest; nothing was written for it."""

    source: str
    reason: str


Outcome = SourceRecord | Skipped | Rejected


def _string_list(value: object, what: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidValueError(f"{what} must be a list of strings, not {type(value).__name__}")
    return value


@dataclass(frozen=True, kw_only=True)
class Acl:
    """An ACL a reader of permissions made (``posix_access``): principals, typed, with no JSON
    shape to check; ``GovernanceTags`` checks the principals, as it does any ACL's."""

    allow: tuple[str, ...]
    deny: tuple[str, ...] = ()


NO_ACL = "no ACL; every source needs acl.allow (fail closed)"
"""Why a source with no ACL is refused (an importer counts these)."""
TAG_SETS_KEPT = 4_096
"""Distinct tag sets whose parsed tags are kept: a bulk load's rows share a few sets, and each set
is checked once, not once per row."""
_parsed: dict[Hashable, GovernanceTags] = {}


def parse_tags(*, tenant: object, acl: object, labels: object, classification: object) -> GovernanceTags:
    """A source's governance from its JSON fields (or an ``Acl`` a reader typed); ValueError says
    everything that is wrong, at once (fail closed: nothing is defaulted). Tags parsed once are
    kept by their fields' value (``TAG_SETS_KEPT``); a refusal is never kept."""
    key = _plain_key(tenant, acl, labels, classification) or _frozen((tenant, acl, labels, classification))
    tags = _parsed.get(key)
    if tags is None:
        tags = _parse_tags(tenant=tenant, acl=acl, labels=labels, classification=classification)
        if len(_parsed) >= TAG_SETS_KEPT:
            _parsed.clear()
        _parsed[key] = tags
    return tags


def _plain_key(tenant: object, acl: object, labels: object, classification: object) -> Hashable | None:
    """The key of tags made only of text, lists of text and an acl object of them (what nearly
    every record and imported row holds), worked out without ``_frozen``'s walk (a fifth of an
    import's checking); None for anything else. Its first element keeps it apart from every
    ``_frozen`` key."""
    if not (_text_or_none(tenant) and _text_or_none(classification) and (labels is None or _texts(labels))):
        return None
    if acl is None:
        held = None
    elif type(acl) is dict and set(acl) <= {"allow", "deny"} and all(_texts(v) for v in acl.values()):
        held = tuple(sorted((name, tuple(value)) for name, value in acl.items()))
    else:
        return None
    return ("plain", tenant, held, None if labels is None else tuple(labels), classification)


def _text_or_none(value: object) -> bool:
    return value is None or type(value) is str


def _texts(value: object) -> bool:
    return type(value) is list and all(type(item) is str for item in value)


def _frozen(value: object) -> Hashable:
    """``value`` (JSON-shaped, or an ``Acl``) as a hashable key that keeps types apart (1, 1.0
    and True are three keys)."""
    if type(value) is str:  # the most of what a key holds, so asked first
        return ("str", value)
    if isinstance(value, Mapping):
        return ("{}", tuple(sorted(((str(k), type(k).__name__), _frozen(v)) for k, v in value.items())))
    if isinstance(value, (list, tuple)):
        return ("[]", tuple(_frozen(v) for v in value))
    if isinstance(value, (str, int, float, type(None), Acl)):
        return (type(value).__name__, value)
    return ("?", id(value))  # anything else: parsed again each time (and refused there)


def _parse_tags(*, tenant: object, acl: object, labels: object, classification: object) -> GovernanceTags:
    problems: list[str] = []
    allow: list[str] = []
    deny: list[str] = []
    if isinstance(acl, Acl):
        allow, deny = list(acl.allow), list(acl.deny)
    elif acl is None:
        problems.append(NO_ACL)
    elif not isinstance(acl, Mapping):
        problems.append(f"acl must be an object with allow and deny lists, not {type(acl).__name__}")
    else:
        unknown = set(acl) - {"allow", "deny"}
        if unknown:
            problems.append(f"acl has unknown keys {sorted(unknown)}; use allow and deny")
        allow = _collected(problems, lambda: _string_list(acl.get("allow"), "acl.allow"))
        deny = _collected(problems, lambda: _string_list(acl.get("deny"), "acl.deny"))
        if isinstance(acl.get("allow", []), list) and allows_nobody([allow]):  # (a list of the wrong type is said above)
            problems.append(ALLOWS_NOBODY)
    named = _collected(problems, lambda: _string_list(labels, "labels"))
    if classification is None:
        problems.append("no classification; use public, internal, confidential or restricted")
    else:
        _collected(problems, lambda: [Classification.parse(classification)])
    if tenant is None:
        problems.append("no tenant; every source names the tenant it belongs to")
    if not problems:
        return GovernanceTags.for_source(tenant=tenant, allow=allow, deny=deny, labels=named,  # type: ignore[arg-type]
                                         classification=classification)  # fmt: skip
    # the rest of what is wrong, said with the rest: the tenant, principals and labels as given
    found = [tenant_problem(tenant)] if tenant is not None else []
    found += [principal_problem(p) for p in (*allow, *deny)] + [label_problem(label) for label in named]
    raise InvalidValueError("; ".join([*problems, *(problem for problem in found if problem)]))


def _collected(problems: list[str], step: Callable[[], list[Any]]) -> list[Any]:
    """``step()``, or an empty list with its ValueError's message added to ``problems``."""
    try:
        return step()
    except ValueError as exc:
        problems.append(str(exc))
        return []


def build_record(
    *,
    doc_id: object,
    text: object,
    tenant: object,
    acl: object,
    labels: object = None,
    classification: object = None,
    uri: object = None,
    metadata: object = None,
    vector: object = None,
    model: object = None,
    origin: str,
) -> SourceRecord | Skipped:
    """Validate one document's fields; raise InvalidSourceError naming ``origin`` and the reason.

    A missing ACL is refused (fail closed), never defaulted. Empty text is ``Skipped``.
    """
    problems = [problem for problem in (id_problem(doc_id), text_problem(text)) if problem]
    stored = _collected(problems, lambda: [check_metadata(metadata)])
    if uri is not None and not isinstance(uri, str):
        problems.append(f"uri must be a string, not {type(uri).__name__}")
    tags = _collected(problems, lambda: [parse_tags(tenant=tenant, acl=acl, labels=labels, classification=classification)])
    brought = _collected(problems, lambda: [checked_vector(vector, model)])
    if problems:  # every one at once: fixing a record takes one round, not one per fault
        raise InvalidSourceError(origin, "; ".join(problems))
    assert isinstance(doc_id, str) and isinstance(text, str)
    if not text.strip():
        return Skipped(source=origin, reason="empty text")
    record = SourceRecord(
        doc_id=doc_id,
        text=text,
        tags=tags[0],
        uri=uri or f"doc:{doc_id}",  # type: ignore[has-type]
        origin=origin,
        metadata=dict(metadata or {}),  # type: ignore[call-overload]
        vector=brought[0],
        model=model if brought[0] is not None else None,  # type: ignore[arg-type] - checked in checked_vector
    )
    record.__dict__["metadata_json"] = stored[0]  # the cached property, filled by the check that made it: made once
    return record


def id_problem(doc_id: object) -> str | None:
    """What is wrong with a source's id, or None."""
    if doc_id is None:
        return "no id; every source needs an id, unique in its tenant"
    if not isinstance(doc_id, str) or not doc_id.strip() or len(doc_id) > MAX_ID_LENGTH or not doc_id.isprintable():
        return f"id {doc_id!r} must be printable text of 1 to {MAX_ID_LENGTH} characters"
    return None


def text_problem(text: object) -> str | None:
    """What is wrong with a source's text, or None (empty text is no fault: it is skipped)."""
    if text is None:
        return "no text"
    if not isinstance(text, str):
        return f"text must be a string, not {type(text).__name__}"
    return None


def check_metadata(metadata: object) -> str:
    """``metadata`` as stored (its JSON), unless it is not an object with text keys that JSON can
    hold within the limit: ValueError."""
    if metadata is None:
        return metadata_json({})
    if not isinstance(metadata, Mapping):
        raise InvalidValueError(f"metadata must be an object, not {type(metadata).__name__}")
    if not all(isinstance(key, str) for key in metadata):
        raise InvalidValueError("metadata keys must be strings")
    try:
        stored = metadata_json(metadata)
    except ValueError:
        raise InvalidValueError("metadata holds NaN or infinity, which JSON cannot carry") from None
    if len(stored.encode("utf-8")) > MAX_METADATA_BYTES:
        raise InvalidValueError(f"metadata is {len(stored.encode('utf-8'))} bytes as JSON; the limit is {MAX_METADATA_BYTES}")
    return stored


def checked_vector(vector: object, model: object) -> np.ndarray | None:
    """A record's own vector as the warehouse keeps it (float32, read-only), checked for what any
    model's vector must be (its dimension and model are checked against the warehouse's when it is
    written); ValueError naming the fault. The numbers are checked at once (numpy), not one by one:
    a bulk load brings millions."""
    if vector is None:
        if model is not None:
            raise InvalidValueError("model names the model that made a vector; give the record's vector too")
        return None
    if not isinstance(model, str) or not model.strip() or len(model) > MAX_MODEL_CHARS:
        raise InvalidValueError(f"a vector needs model: the name of the model that made it (1 to {MAX_MODEL_CHARS} characters)")
    if isinstance(vector, (str, bytes, Mapping)) or not hasattr(vector, "__len__") or not len(vector):  # type: ignore[arg-type]
        raise InvalidValueError("vector must be a non-empty list of numbers")
    if isinstance(vector, np.ndarray):
        numbers = vector
    elif not {type(n) for n in vector} <= {float, int}:  # type: ignore[attr-defined]  # a bool is an int to numpy
        raise InvalidValueError("vector must hold numbers only")
    else:
        try:
            numbers = np.asarray(vector, dtype=np.float64)
        except OverflowError:
            raise InvalidValueError("vector holds a number too large for a float; pass finite numbers") from None
    if numbers.ndim != 1 or numbers.dtype.kind not in "fiu":
        raise InvalidValueError("vector must hold numbers only")
    if not np.isfinite(numbers).all():
        raise InvalidValueError("vector holds NaN or infinity; pass finite numbers")
    with np.errstate(over="ignore"):
        kept = numbers.astype(np.float32)
    if not np.isfinite(kept).all():
        raise InvalidValueError("vector holds a number too large for float32, as vectors are kept; pass smaller numbers")
    if not kept.any():
        raise InvalidValueError("vector is all zeros: it has no direction to rank by")
    kept.flags.writeable = False
    return kept


def open_jsonl(path: Path) -> BinaryIO:
    """A JSONL file's bytes, unzipped when it is gzipped (``.gz``, in any case)."""
    return gzip.open(path, "rb") if path.suffix.lower() == ".gz" else open(path, "rb")


def read_jsonl(path: Path, *, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[Outcome]:
    """Records of a JSONL file (``.jsonl`` or ``.jsonl.gz``), one outcome per non-blank line. A
    line over ``max_line_bytes`` is refused without being held in memory; a damaged gzip stream
    refuses the rest of the file, naming the line where it broke."""
    number = 0
    try:
        with open_jsonl(path) as handle:
            while raw := handle.readline(max_line_bytes + 1):
                number += 1
                origin = f"{path}:{number}"
                if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
                    while (rest := handle.readline(1 << 20)) and not rest.endswith(b"\n"):
                        pass
                    yield Rejected(source=origin, reason=f"the line is over the limit of {max_line_bytes} bytes")
                    continue
                if raw.strip():
                    yield from _line_outcome(raw, origin)
    except (OSError, EOFError, zlib.error) as exc:
        yield Rejected(source=f"{path}:{number + 1}", reason=f"the file cannot be read from here on ({exc})")


def _line_outcome(raw: bytes, origin: str) -> Iterator[Outcome]:
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        yield Rejected(source=origin, reason=f"invalid UTF-8 at byte {exc.start}")
        return
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        yield Rejected(source=origin, reason=f"not valid JSON ({exc.msg} at column {exc.colno})")
        return
    except (ValueError, RecursionError) as exc:  # an integer of thousands of digits, nesting too deep
        yield Rejected(source=origin, reason=f"not valid JSON ({type(exc).__name__}: {str(exc)[:200]})")
        return
    if not isinstance(obj, dict):
        yield Rejected(source=origin, reason=f"a record must be a JSON object, not {type(obj).__name__}")
        return
    yield from record_outcome(obj, origin)


def record_outcome(obj: Mapping[str, Any], origin: str) -> Iterator[Outcome]:
    """The outcome of one JSONL-shaped object (DESIGN §6), errors turned into ``Rejected``."""
    unknown = set(obj) - RECORD_FIELDS
    if unknown:
        yield Rejected(source=origin, reason=f"unknown fields {sorted(unknown)}")
        return
    try:
        yield build_record(
            doc_id=obj.get("id"),
            text=obj.get("text"),
            tenant=obj.get("tenant"),
            acl=obj.get("acl"),
            labels=obj.get("labels"),
            classification=obj.get("classification"),
            uri=obj.get("uri"),
            metadata=obj.get("metadata"),
            vector=obj.get("vector"),
            model=obj.get("model"),
            origin=origin if "id" not in obj else f"{origin} (id {obj.get('id')!r})",
        )
    except InvalidSourceError as exc:
        yield Rejected(source=exc.source, reason=exc.reason)


def confined_outcomes(records: Iterable[object], *, tenant: str | None) -> Iterator[Outcome]:
    """The outcome of each record (``record N``), confined to ``tenant`` when a named caller
    ingests: a record naming no tenant takes the caller's, one naming another is rejected
    (nothing written for it). ``tenant`` None: the operator's records, as they are."""
    for number, record in enumerate(records, start=1):
        yield from _confined(record, f"record {number}", tenant)


def _confined(record: object, origin: str, tenant: str | None) -> Iterable[Outcome]:
    """A record's outcomes, confined to ``tenant`` when a named caller ingests: a record naming no
    tenant takes the caller's, one naming another is rejected."""
    if tenant is not None and isinstance(record, Mapping):
        named = record.get("tenant", tenant)
        if named != tenant:
            return [Rejected(source=f"{origin} (id {record.get('id')!r})", reason=f"tenant {named!r} is not the caller's tenant {tenant!r}")]
        record = {**record, "tenant": tenant}
    if not isinstance(record, Mapping):
        return [Rejected(source=origin, reason=f"a record must be an object, not {type(record).__name__}")]
    return record_outcome(record, origin)
