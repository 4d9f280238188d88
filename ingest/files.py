"""Files as sources: text (with no extension too), Markdown, reStructuredText, CSV, JSON, HTML, PDF
and Word, each with its governance (DESIGN §6); JSONL record files found in folders.

A file's governance comes from a sidecar ``<file>.acl.yaml`` next to it, else from the first
matching rule of a manifest, or (``acl_from="posix"``) its ACL from the POSIX permissions and
ACLs on the way to it (``posix_access``). A file with no governance is refused, never given a
default ACL (fail closed, §4).
Every file yields exactly one outcome: a ``SourceRecord``, ``Skipped`` or ``Rejected``.
"""

from __future__ import annotations

import io
import logging
import os
import re
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import yaml
from bs4 import BeautifulSoup, MarkupResemblesLocatorWarning, XMLParsedAsHTMLWarning
from pypdf import PdfReader

from ..errors import InvalidSourceError, InvalidValueError
from .posix_access import posix_readers
from .records import Outcome, Rejected, Skipped, build_record, read_jsonl

# pypdf logs what it finds wrong in a file ("EOF marker not found") as well as raising: the
# rejection already says why, so its log lines go nowhere unless an application routes them.
logging.getLogger("pypdf").addHandler(logging.NullHandler())

MEDIA_TYPES = {
    ".txt": "text/plain",
    ".md": "text/markdown",
    ".markdown": "text/markdown",
    ".rst": "text/x-rst",
    ".csv": "text/csv",
    ".json": "application/json",
    ".html": "text/html",
    ".htm": "text/html",
    ".pdf": "application/pdf",
    ".docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
}
SNIFFED = "text/plain"
"""The type of a file with no extension (``README``, ``LICENSE``, ``copyright``) whose first bytes
are UTF-8 text: read as plain text."""
RECORD_SUFFIXES = (".jsonl", ".jsonl.gz")
"""Files of JSONL records, found in a folder as when named: each line a record with its own governance."""
SIDECAR_SUFFIX = ".acl.yaml"
DEFAULT_MAX_BYTES = 20 * 1024 * 1024
BINARY_PROBE_BYTES = 8 * 1024
POSIX_DEFAULT_CLASSIFICATION = "internal"
_GOVERNANCE_KEYS = frozenset({"tenant", "acl", "labels", "classification"})
RULE_KEYS = _GOVERNANCE_KEYS | {"glob"}
SIDECAR_KEYS = _GOVERNANCE_KEYS | {"id", "uri"}


def iter_file_sources(
    paths: Sequence[Path],
    *,
    manifest: Path | None = None,
    acl_from: str | None = None,
    default_tenant: str | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> Iterator[Outcome]:
    """One outcome per document file under ``paths`` (files, or folders walked recursively).

    Folders are walked depth-first with names sorted; hidden entries, ``*.acl.yaml`` sidecars
    and the manifest are not documents. A file of another type is ``Skipped`` inside a folder
    and ``Rejected`` when named. The id is the sidecar's ``id``, else the path relative to the
    folder argument (or the file name); a later file whose id is already taken is ``Rejected``.

    With ``acl_from="posix"`` the ACL is who the kernel lets read the file: the users, groups and
    ``everyone`` that may search every folder from ``/`` down and read the file, by mode bits and
    extended ACLs, with a deny list for those a matching POSIX class keeps out (the rule is in
    ``posix_access``); a file whose permissions cannot be read or named is rejected. Any ``acl``
    in a sidecar or rule is then ignored, and their tenant, labels and classification are used,
    defaulting to ``default_tenant``, no labels and ``internal``. ``default_tenant`` also fills a
    sidecar or rule without a tenant.

    Raises InvalidValueError for an unknown ``acl_from`` and InvalidSourceError for a malformed
    manifest, both before the first file is read: every file's governance depends on them.
    """
    if acl_from not in (None, "posix"):
        raise InvalidValueError(f"unknown acl_from {acl_from!r}; use 'posix' or leave it unset")
    loader = _Loader(
        manifest=_load_manifest(manifest) if manifest is not None else None,
        posix=acl_from == "posix",
        default_tenant=default_tenant,
        max_bytes=max_bytes,
    )
    return loader.outcomes([Path(p) for p in paths])


@dataclass(frozen=True)
class _Rule:
    glob: tuple[str, ...]
    fields: Mapping[str, Any]


@dataclass(frozen=True)
class _Manifest:
    path: Path
    root: Path
    rules: tuple[_Rule, ...]

    def match(self, path: Path) -> Mapping[str, Any] | None:
        """The first rule whose glob matches ``path`` relative to the manifest's folder."""
        try:
            parts = Path(os.path.abspath(path)).relative_to(self.root).parts
        except ValueError:
            return None
        return next((rule.fields for rule in self.rules if _glob_match(rule.glob, parts)), None)


def _glob_match(glob: tuple[str, ...], parts: tuple[str, ...]) -> bool:
    """Whole-path glob match by segment, as 3.13's ``PurePath.full_match``: ``*``, ``?`` and
    ``[..]`` stay within a segment; ``**`` spans zero or more segments (one or more at the end,
    so ``docs/**`` is what is inside ``docs``)."""
    if not glob:
        return not parts
    head, rest = glob[0], glob[1:]
    if head == "**":
        if not rest:
            return bool(parts)
        return any(_glob_match(rest, parts[i:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatchcase(parts[0], head) and _glob_match(rest, parts[1:])


def _read_yaml_mapping(path: Path, allowed: frozenset[str]) -> dict[str, Any]:
    """A YAML file holding one mapping with only ``allowed`` keys; ValueError says what is wrong."""
    try:
        data = yaml.safe_load(path.read_bytes())
    except OSError as exc:
        raise InvalidValueError(f"cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise InvalidValueError(f"not valid YAML ({getattr(exc, 'problem', None) or exc}{where})") from None
    _check_mapping(data, allowed)
    return data


def _check_mapping(data: object, allowed: frozenset[str]) -> None:
    if not isinstance(data, dict):
        raise InvalidValueError(f"must be a mapping, not {type(data).__name__}")
    unknown = set(data) - allowed
    if unknown:
        raise InvalidValueError(f"has unknown keys {sorted(map(str, unknown))}; use {sorted(allowed)}")


def _load_manifest(path: Path) -> _Manifest:
    """Parse and check a manifest; raise InvalidSourceError naming it (and the rule) if malformed."""
    try:
        rules = _read_yaml_mapping(path, frozenset({"rules"})).get("rules")
        if rules is None:
            raise InvalidValueError("has no rules list")
        if not isinstance(rules, list):
            raise InvalidValueError(f"rules must be a list, not {type(rules).__name__}")
        parsed = []
        for index, rule in enumerate(rules):
            try:
                _check_mapping(rule, RULE_KEYS)
                glob = rule.get("glob")
                if not isinstance(glob, str) or not glob.strip() or glob.startswith("/"):
                    raise InvalidValueError("needs a glob: a path pattern relative to the manifest's folder")
            except ValueError as exc:
                raise InvalidValueError(f"rules[{index}]: {exc}") from None
            segments = tuple(s for s in glob.split("/") if s not in ("", "."))
            fields = {key: value for key, value in rule.items() if key != "glob"}
            parsed.append(_Rule(glob=segments, fields=fields))
    except ValueError as exc:
        raise InvalidSourceError(str(path), str(exc)) from None
    return _Manifest(path=path, root=Path(os.path.abspath(path.parent)), rules=tuple(parsed))


def _extract_text(data: bytes, media_type: str, origin: str) -> str:
    """The text of a file's bytes; InvalidSourceError for binary, non-UTF-8 or unreadable PDF or DOCX."""
    if media_type == "application/pdf":
        return _pdf_text(data, origin)
    if media_type == MEDIA_TYPES[".docx"]:
        return _docx_text(data, origin)
    if b"\0" in data[:BINARY_PROBE_BYTES]:
        raise InvalidSourceError(origin, "binary content (a NUL byte in the first 8 KiB)")
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise InvalidSourceError(origin, f"invalid UTF-8 at byte {exc.start}") from None
    return _html_text(text) if media_type == "text/html" else text


def _html_text(html: str) -> str:
    """Visible text of an HTML page: no script or style, one blank line at most between blocks."""
    with warnings.catch_warnings():  # a page that merely looks like a URL or XML is still a page
        warnings.simplefilter("ignore", MarkupResemblesLocatorWarning)
        warnings.simplefilter("ignore", XMLParsedAsHTMLWarning)
        soup = BeautifulSoup(html, "html.parser")
    for element in soup(["script", "style"]):
        element.decompose()
    lines = (line.strip() for line in soup.get_text("\n").splitlines())
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def _pdf_text(data: bytes, origin: str) -> str:
    """Text of every page, pages joined by a blank line."""
    try:
        pages = PdfReader(io.BytesIO(data)).pages
        texts = [(page.extract_text() or "").strip() for page in pages]
    except Exception as exc:  # noqa: BLE001 - an untrusted file can break the parser in any way
        raise InvalidSourceError(origin, f"unreadable PDF ({type(exc).__name__}: {exc})") from None
    return "\n\n".join(text for text in texts if text)


def _docx_text(data: bytes, origin: str) -> str:
    """The paragraphs of a Word document, then its tables' rows (cells joined by tabs), in order."""
    import docx  # here: only a Word document needs it, and commands that never read one start faster

    try:
        document = docx.Document(io.BytesIO(data))
        paragraphs = [paragraph.text for paragraph in document.paragraphs]
        rows = ["\t".join(cell.text for cell in row.cells) for table in document.tables for row in table.rows]
    except Exception as exc:  # noqa: BLE001 - an untrusted file can break the parser in any way
        raise InvalidSourceError(origin, f"unreadable DOCX ({type(exc).__name__}: {exc})") from None
    return "\n".join(line for line in (*paragraphs, *rows) if line.strip())


def _media_type(path: Path) -> str | None:
    """A document's media type by its extension; a file with none is plain text when its first
    bytes are UTF-8 text (content sniffing), else no document."""
    if path.suffix:
        return MEDIA_TYPES.get(path.suffix.lower())
    try:
        with path.open("rb") as handle:
            probe = handle.read(BINARY_PROBE_BYTES)
    except OSError:
        return SNIFFED  # unreadable: reading it again says why, as for any other file
    if b"\0" in probe:
        return None
    try:
        probe.decode("utf-8")
    except UnicodeDecodeError as exc:
        cut = len(probe) == BINARY_PROBE_BYTES and exc.start >= len(probe) - 3  # a character the probe cut in two
        if not cut:
            return None
    return SNIFFED


def walk_documents(folder: Path, excluded: Path | None) -> Iterator[tuple[Path, str] | Rejected]:
    """Candidate documents under ``folder`` with their relative POSIX paths, in a fixed order;
    a sub-folder that cannot be listed is ``Rejected`` rather than silently left out."""
    errors: list[OSError] = []
    for dirpath, dirnames, filenames in os.walk(folder, onerror=errors.append):
        yield from _unlistable(errors)
        dirnames[:] = sorted(name for name in dirnames if not name.startswith("."))
        for name in sorted(filenames):
            path = Path(dirpath, name)
            if name.startswith(".") or name.endswith(SIDECAR_SUFFIX) or Path(os.path.abspath(path)) == excluded:
                continue
            yield path, path.relative_to(folder).as_posix()
    yield from _unlistable(errors)


def _unlistable(errors: list[OSError]) -> Iterator[Rejected]:
    """Drain the folders ``os.walk`` could not list, as refusals."""
    while errors:
        error = errors.pop(0)
        yield Rejected(source=str(error.filename), reason=f"cannot list: {error.strerror or error}")


def distinct_inputs(paths: Iterable[Path | str]) -> list[Path]:
    """The inputs as absolute paths, in order, each once: an input given twice is read once."""
    return list(dict.fromkeys(Path(os.path.abspath(p)) for p in paths))


@dataclass(frozen=True)
class _Loader:
    manifest: _Manifest | None
    posix: bool
    default_tenant: str | None
    max_bytes: int

    def outcomes(self, paths: list[Path]) -> Iterator[Outcome]:
        excluded = Path(os.path.abspath(self.manifest.path)) if self.manifest else None
        for given in distinct_inputs(paths):
            if given == excluded:
                continue  # the manifest governs, it is not a document
            named = not given.is_dir()
            if not named:
                candidates: Iterator[tuple[Path, str] | Rejected] = walk_documents(given, excluded)
            elif given.is_file():
                candidates = iter([(given, given.name)])
            else:
                yield Rejected(source=str(given), reason="no such file or folder")
                continue
            for candidate in candidates:
                if isinstance(candidate, Rejected):
                    yield candidate
                elif candidate[0].name.lower().endswith(RECORD_SUFFIXES):
                    yield from self.records(candidate[0])
                else:
                    yield self.outcome(*candidate, named=named)

    def records(self, path: Path) -> Iterator[Outcome]:
        """A JSONL file found in a folder: its records, each with the governance it names. Under
        ``acl_from="posix"`` it is refused, since its records would not carry the file's own
        permissions (a record in an owner-only file could say ``everyone``): name it to ingest it."""
        if self.posix:
            yield Rejected(source=str(path), reason="records carry their own ACL, not the file's permissions (--acl-from "
                                                    "posix); name the file to ingest its records")  # fmt: skip
            return
        yield from read_jsonl(path, max_line_bytes=self.max_bytes)

    def outcome(self, path: Path, relative: str, *, named: bool) -> Outcome:
        """The one outcome of one file."""
        origin = str(path)
        media_type = _media_type(path)
        if media_type is None:
            reason = f"unsupported file type {path.suffix}" if path.suffix else "not text (a file with no extension)"
            return Rejected(source=origin, reason=reason) if named else Skipped(source=origin, reason=reason)
        try:
            size = path.stat().st_size
            if size > self.max_bytes:
                raise InvalidSourceError(origin, f"file is {size} bytes, over the cap of {self.max_bytes} bytes "
                                                 "(RAGWARDEN_MAX_FILE_BYTES raises it)")  # fmt: skip
            fields = self.governance(path, origin)
            return build_record(
                doc_id=relative if fields.get("id") is None else fields["id"],
                text=_extract_text(path.read_bytes(), media_type, origin),
                tenant=fields.get("tenant"),
                acl=fields.get("acl"),
                labels=fields.get("labels"),
                classification=fields.get("classification"),
                uri=fields.get("uri") or path.resolve().as_uri(),
                metadata={"path": relative, "media_type": media_type},
                origin=origin,
            )
        except InvalidSourceError as exc:
            return Rejected(source=exc.source, reason=exc.reason)
        except OSError as exc:
            return Rejected(source=origin, reason=f"cannot read: {exc.strerror or exc}")

    def governance(self, path: Path, origin: str) -> dict[str, Any]:
        """The governance fields of one file: sidecar, else first manifest rule, else POSIX."""
        sidecar = path.with_name(path.name + SIDECAR_SUFFIX)
        if sidecar.is_file():
            try:
                fields = _read_yaml_mapping(sidecar, SIDECAR_KEYS)
            except ValueError as exc:
                raise InvalidSourceError(origin, f"sidecar {sidecar}: {exc}") from None
        elif self.manifest and (rule := self.manifest.match(path)) is not None:
            fields = dict(rule)
        elif self.posix:
            fields = {}
        else:
            where = f"no rule of {self.manifest.path} matches it" if self.manifest else "no manifest"
            raise InvalidSourceError(origin, f"no governance: no sidecar {sidecar.name} and {where} "
                                             "(or take the ACL from the file's permissions: --acl-from posix)")  # fmt: skip
        if self.posix:
            fields["acl"] = posix_readers(path, origin=origin)  # typed: parse_tags takes it as it is
            if fields.get("classification") is None:
                fields["classification"] = POSIX_DEFAULT_CLASSIFICATION
        if fields.get("tenant") is None:
            if self.default_tenant is None:
                raise InvalidSourceError(origin, "no tenant: pass --tenant or a manifest (or set it in a sidecar)")
            fields["tenant"] = self.default_tenant
        return fields
