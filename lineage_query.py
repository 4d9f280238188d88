"""The lineage query: a source or row, its chunks and derived rows, their tags, the receipts that
touched them, and the tombstones of what was erased (ids, when, who, why, the purge's proof).

It reads the chunks, the source records and the audit log, and decides nothing: the face asks it
inside the gate, which has decided the caller may audit the tenant it names.
"""

from __future__ import annotations

from typing import Any

from .errors import NotFoundError
from .governance.audit import StoredReceipt
from .governance.operations import Operation
from .governance.tags import Classification
from .state import AuditLog, ChunkReads, Sources

__all__ = ["lineage_of"]


def lineage_of(
    item_id: str, tenant: str | None, *, chunks: ChunkReads, sources: Sources, audit: AuditLog
) -> tuple[dict[str, Any], str]:
    """The lineage of ``item_id`` within ``tenant`` (None: the operator, the item's own tenant),
    and the tenant it was found in.

    Receipts are the item's tenant's only, each saying what came of it: rows ``returned`` only
    by a retrieval that returned them; a refused probe listed as refused. An erased document
    or row leaves its tombstones (from the forget receipts: ids, when, who, why, the purge's
    proof), never its content."""
    if "\x00" in item_id:  # no id holds one: it names nothing, here as everywhere
        raise NotFoundError(f"no document or row {item_id!r}")
    try:
        owner: str | None = sources.tenant_of(item_id, tenant)
    except NotFoundError:
        owner = None
    chunk_ids = chunks.chunk_ids_of(item_id, owner) if owner is not None else []
    source = sources.states([(owner, item_id)]).get((owner, item_id)) if owner is not None else None
    scope = owner
    if not chunk_ids and source is None:
        row = chunks.rows([item_id]).get(item_id)
        if row is not None and tenant in (None, row["tenant"]):
            chunk_ids, scope = [item_id], row["tenant"]
    tombstones = [
        r for r in audit.query(operation="forget", doc_id=item_id, tenant=scope or tenant) if r.allowed
    ]
    if not chunk_ids and source is None and not tombstones:
        raise NotFoundError(f"no document or row {item_id!r}")
    scope = scope or tenant or tombstones[0].tenant
    derived = chunks.derived_from(chunk_ids)
    erased = {i for r in tombstones for part in ("chunks", "derived") for i in r.details.get("tombstone", {}).get("erased", {}).get(part, [])}
    touched = {*chunk_ids, *derived, *erased}
    found = {r.receipt_id: r for r in audit.query(any_chunk_ids=touched, tenant=scope)}
    found.update((r.receipt_id, r) for r in audit.query(doc_id=item_id, tenant=scope))
    tagged = chunks.rows([*chunk_ids, *derived], ["chunk_id", "labels", "classification"])
    return {
        "source": None if source is None else {"doc_id": source.doc_id, "tenant": source.tenant, "version": source.doc_version},
        "chunks": chunk_ids,
        "tags": {i: {"labels": sorted(r["labels"]), "classification": Classification(r["classification"]).label}
                 for i, r in sorted(tagged.items())},  # fmt: skip
        "derived": [{"chunk_id": i, "kind": r["kind"], "parents": r["parents"]} for i, r in sorted(derived.items())],
        "receipts": [
            _lineage_receipt(r, touched)
            for r in sorted(found.values(), key=lambda r: (r.time, r.chain, r.seq))
            if r.operation != Operation.AUDIT
        ],
        "tombstones": [
            {"chain": r.chain, "seq": r.seq, "time": r.time.isoformat(), "subject": r.subject, "actor": r.actor, "reason": r.reason,
             **r.details.get("tombstone", {})}  # fmt: skip
            for r in tombstones
        ],
    }, scope


_DONE = {Operation.SEARCH: "returned", Operation.GET: "returned", Operation.DERIVE: "derived",
         Operation.INGEST: "ingested", Operation.SYNC: "re-tagged", Operation.FORGET: "erased"}  # fmt: skip
"""What each operation did to the rows a lineage shows, in its receipts' words."""


def _lineage_receipt(receipt: StoredReceipt, touched: set[str]) -> dict[str, Any]:
    """One receipt as lineage shows it: what it did to the lineage's rows, refusals as refusals."""
    rows = sorted(set(receipt.chunk_ids) & touched)
    if not receipt.allowed:
        outcome = "refused"
    elif receipt.operation == Operation.EXPLAIN:
        visible = receipt.details.get("visible")
        outcome = "explained" if visible is None else f"explained: {'visible' if visible else 'not visible'}"
    else:
        outcome = _DONE.get(receipt.operation, receipt.operation)
    return {
        "chain": receipt.chain,
        "seq": receipt.seq,
        "time": receipt.time.isoformat(),
        "operation": receipt.operation,
        "subject": receipt.subject,
        "actor": receipt.actor,
        "purpose": receipt.purpose,
        "allowed": receipt.allowed,
        "outcome": outcome,
        "returned": rows if outcome == "returned" else [],
        "rows": rows,
    }
