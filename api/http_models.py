"""Request and response bodies of the HTTP API.

Requests forbid unknown fields: a body that names a subject, tenant or actor is refused, because
identity comes from the credential alone.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator

from ..errors import InvalidValueError
from ..governance.audit import StoredReceipt
from ..governance.explain import Explanation
from ..ingest.lifecycle import DERIVED_KINDS, DerivedRow, ForgetReport, SyncReport
from ..ingest.pipeline import IngestReport
from ..retrieval.collapse import GroupBy
from ..retrieval.hits import Hit
from ..retrieval.manifest import ContextManifest
from ..retrieval.narrowing import FILTER_DESCRIPTION
from ..retrieval.review import AccessReview
from ..retrieval.search import MAX_K, MAX_QUERY_CHARS, Mode

MAX_RECORDS = 1000
MAX_PARENTS = 100
MAX_ID_CHARS = 512
Level = Literal["public", "internal", "confidential", "restricted"]
DerivedKind = Literal[DERIVED_KINDS]  # type: ignore[valid-type]


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SearchRequest(Request):
    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS, description="What to search for.")
    k: int = Field(10, ge=1, le=MAX_K, description=f"How many chunks (1 to {MAX_K}).")
    mode: Mode = "vector"
    purpose: str | None = Field(None, max_length=256, description="Why the caller searches; kept in the receipt.")
    min_version: int | None = Field(None, ge=0, description="Refuse to answer from an older table version.")
    group_by: GroupBy | None = Field(None, description='"doc": at most per_group chunks of one document.')
    per_group: int = Field(1, ge=1, le=MAX_K, description="With group_by: how many chunks of one document at most.")
    distinct: StrictBool = Field(False, description="One chunk of each text: byte-identical copies collapse to the best.")
    filter: dict[str, Any] | None = Field(None, description=FILTER_DESCRIPTION)

    @field_validator("k", "min_version", "per_group", mode="before")
    @classmethod
    def _a_json_number(cls, value: object) -> object:
        """Refuse true/false and numeric strings where the schema says integer (pydantic would coerce them)."""
        if isinstance(value, bool | str):
            raise InvalidValueError("must be a whole number")  # noqa: TRY004 - pydantic reports only ValueError
        return value


class DeriveRequest(Request):
    text: str = Field(min_length=1, max_length=20_000)
    parents: list[str] = Field(min_length=1, max_length=MAX_PARENTS)
    kind: DerivedKind = "summary"


class RecordsRequest(Request):
    records: list[dict[str, Any]] = Field(
        min_length=1, max_length=MAX_RECORDS, description="Source records in the JSONL shape of DESIGN §6."
    )


class IngestRequest(RecordsRequest):
    allow_move: StrictBool = Field(False, description="Let an id another source's document holds move to this record.")
    restore_erased: StrictBool = Field(False, description="Ingest erased documents again (the receipt says so).")


class SyncRequest(RecordsRequest):
    pass


class ForgetRequest(Request):
    doc_id: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    reason: str = Field(min_length=1, max_length=1000)


class PolicyRequest(Request):
    text: str = Field(min_length=1, max_length=1_000_000, description="The whole policy CSV.")


class HitModel(BaseModel):
    chunk_id: str
    doc_id: str
    source_uri: str
    text: str
    score: float
    labels: list[str]
    classification: Level
    doc_version: str
    position: int | None
    reason: str
    kind: str
    parents: list[str]
    table_version: int
    policy_version: str
    metadata: dict[str, Any] = Field(default_factory=dict, description="the source record's metadata")

    @classmethod
    def of(cls, hit: Hit) -> HitModel:
        return cls.model_validate(hit.as_dict())


class ManifestModel(BaseModel):
    chunk_ids: list[str]
    labels: list[str]
    classification: Level
    table_versions: list[int]
    policy_versions: list[str]
    doc_versions: list[str]

    @classmethod
    def of(cls, manifest: ContextManifest) -> ManifestModel:
        return cls.model_validate(manifest.as_dict())


class SearchResponse(BaseModel):
    hits: list[HitModel]
    manifest: ManifestModel


class IdentityModel(BaseModel):
    subject: str
    tenant: str
    actor: str | None
    method: str
    groups: list[str] = Field(default_factory=list, description="groups the token's groups claim named")
    rights: list[str] = Field(
        default_factory=list,
        description="operations the policy in force grants the caller in its tenant (its token's groups included); "
        "reading them leaves no receipt, and each operation is still decided when called",
    )


class RefusalModel(BaseModel):
    source: str
    reason: str


class IngestResponse(BaseModel):
    run_id: str
    written: list[str]
    documents: int
    unchanged: int
    chunks: int
    skipped: list[RefusalModel]
    rejected: list[RefusalModel]
    restored: list[str]
    table_version: int

    @classmethod
    def of(cls, report: IngestReport, table_version: int) -> IngestResponse:
        return cls(
            run_id=report.run_id,
            written=list(report.written),
            documents=report.documents,
            unchanged=report.unchanged,
            chunks=report.chunks,
            skipped=[RefusalModel(source=s.source, reason=s.reason) for s in report.skipped],
            rejected=[RefusalModel(source=r.source, reason=r.reason) for r in report.rejected],
            restored=[doc_id for _, doc_id in report.restored],
            table_version=table_version,
        )


class DerivedModel(BaseModel):
    chunk_id: str
    kind: str
    parents: list[str]
    labels: list[str]
    classification: Level
    table_version: int

    @classmethod
    def of(cls, row: DerivedRow) -> DerivedModel:
        return cls(
            chunk_id=row.chunk_id,
            kind=row.kind,
            parents=list(row.parents),
            labels=sorted(row.tags.labels),
            classification=row.tags.classification.label,  # type: ignore[arg-type]
            table_version=row.table_version,
        )


class SyncResponse(BaseModel):
    documents: list[str]
    chunks: int
    derived: int
    table_version: int

    @classmethod
    def of(cls, report: SyncReport) -> SyncResponse:
        return cls(documents=list(report.documents), chunks=report.chunks, derived=report.derived, table_version=report.table_version)


class ForgetResponse(BaseModel):
    doc_id: str
    chunks: int
    derived: int
    versions_purged: dict[str, int]

    @classmethod
    def of(cls, report: ForgetReport) -> ForgetResponse:
        return cls(doc_id=report.doc_id, chunks=report.chunks, derived=report.derived, versions_purged=dict(report.versions_purged))


class StepModel(BaseModel):
    check: str
    passed: bool
    detail: str


class ExplanationModel(BaseModel):
    chunk_id: str
    subject: str
    tenant: str
    allowed: bool
    reason: str
    steps: list[StepModel]

    @classmethod
    def of(cls, explanation: Explanation) -> ExplanationModel:
        return cls.model_validate(explanation.as_dict())


ChainId = Annotated[str, Field(description="The writer's chain the receipt belongs to (empty: the legacy chain).")]


class LineageReceiptModel(BaseModel):
    chain: ChainId
    seq: int
    time: str
    operation: str
    subject: str
    actor: str | None
    purpose: str | None
    allowed: bool
    outcome: str = Field(description="returned, refused, explained: visible / not visible, derived, ingested, re-tagged or erased")
    returned: list[str] = Field(description="rows of this lineage the receipt's retrieval returned (only those)")
    rows: list[str] = Field(description="rows of this lineage the receipt names, whatever came of it")


class LineageTombstoneModel(BaseModel):
    chain: ChainId
    seq: int
    time: str
    subject: str
    actor: str | None
    reason: str
    item: str
    erased: dict[str, list[str]]
    table_version: int
    versions_purged: dict[str, int]
    versions_left: dict[str, int]


class LineageDerivedModel(BaseModel):
    chunk_id: str
    kind: str
    parents: list[str]


class LineageSourceModel(BaseModel):
    doc_id: str
    tenant: str
    version: str


class LineageTagsModel(BaseModel):
    labels: list[str]
    classification: str


class LineageModel(BaseModel):
    source: LineageSourceModel | None
    chunks: list[str]
    tags: dict[str, LineageTagsModel] = Field(description="each chunk's and derived row's labels and classification, now")
    derived: list[LineageDerivedModel]
    receipts: list[LineageReceiptModel]
    tombstones: list[LineageTombstoneModel]


class ReceiptModel(BaseModel):
    chain: ChainId
    seq: int
    receipt_id: str
    time: str
    kind: str
    operation: str
    subject: str
    actor: str | None
    tenant: str
    purpose: str | None
    allowed: bool
    reason: str
    query_fingerprint: str | None
    query: str | None
    chunk_ids: list[str]
    doc_ids: list[str]
    chunk_labels: dict[str, list[str]]
    withheld: int
    policy_version: str | None
    table_version: int | None
    details: dict[str, Any]
    prev_hash: str
    hash: str

    @classmethod
    def of(cls, receipt: StoredReceipt) -> ReceiptModel:
        values = {name: getattr(receipt, name) for name in cls.model_fields if name != "time"}
        values["chunk_labels"] = {k: list(v) for k, v in receipt.chunk_labels.items()}
        values["details"] = dict(receipt.details)
        return cls(time=receipt.time.isoformat(), **values)


class AccessReviewModel(BaseModel):
    subject: str
    tenant: str
    policy_version: str
    table_version: int
    rows: int
    by_source: dict[str, int]
    by_label: dict[str, int]
    by_classification: dict[str, int]
    derived_by_kind: dict[str, int]

    @classmethod
    def of(cls, review: AccessReview) -> AccessReviewModel:
        return cls.model_validate(review.as_dict())


class InventoryModel(BaseModel):
    label: str
    tenant: str
    sources: dict[str, list[str]] = Field(description="Source document id -> the rows carrying the label that derive from it.")


class ChainModel(BaseModel):
    ok: bool
    receipts: int
    chains: int
    problems: list[str]
    checkpoint: str | None = Field(description="The root of a checkpoint of exactly what was verified (when ok): keep it elsewhere, pass it to a later verify.")


class PolicyResponse(BaseModel):
    version: str
    rules: int
    tenants: list[str]


class Health(BaseModel):
    status: str


class ServingIndexModel(BaseModel):
    """This replica's resident serving index: its state, the table version and rows it holds,
    and why it is not in use when it is not (over budget, failed)."""

    state: str
    version: int | None = None
    rows: int = 0
    bytes: int = 0
    reason: str = ""
    warm: bool = False


class Readiness(BaseModel):
    status: str
    policy_version: str | None
    table_version: int
    policy_problem: str | None = None  # a newer policy did not load; the one named above stays in force
    serving_index: ServingIndexModel | None = None


class VocabularyModel(BaseModel):
    """What the caller's tenant's receipts can be filtered by (a picker's suggestions)."""

    tenant: str
    labels: list[str]
    subjects: list[str]
    documents: list[str]


class ReaderModel(BaseModel):
    principal: str
    rows: int
    path: str


class ReadersModel(BaseModel):
    """Who can read a document (and what derives from it) or a label's rows, and how."""

    tenant: str
    item: str
    rows: int
    truncated: bool = Field(description="true: the item has more rows than the first 1,000 weighed")
    policy_version: str
    subjects: list[ReaderModel]
    groups: list[ReaderModel]


class TrendsModel(BaseModel):
    """A tenant's last days from its receipts, oldest first."""

    tenant: str
    days: list[str]
    searches: list[int]
    refusals: list[int]
    labels: dict[str, int]
    label_days: dict[str, list[int]]
    top_documents: dict[str, int]
