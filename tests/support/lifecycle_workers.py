"""Spawned processes that run random lifecycle writes (ingest, sync, derive, forget, policy install)
on one warehouse in rounds, and an independent check of what they leave.

The check shares no code with the product's propagation: it reads the rows as stored and applies
DESIGN §4 ("visible only to a subject who could see every parent: clauses conjoined, denies and
labels unioned, the highest classification, one tenant") in plain Python.
"""

from __future__ import annotations

import json
import random
import traceback
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from support.raw_tables import raw_table

TENANT = "acme"
DOCUMENTS = ("d0", "d1", "d2", "d3")
ACTOR = "user:root"
PRINCIPALS = ("everyone", "group:g1", "group:g2", "group:g3", "user:u1", "user:u2", ACTOR)
DENIABLE = ("group:g3", "user:u1", "user:u2")
LABELS = ("l1", "l2", "l3")
LEVELS = ("public", "internal", "confidential", "restricted")
WORDS = "ledger audit forecast payroll invoice budget quarterly review vendor contract renewal margin".split()


def policy_text(variant: int) -> str:
    """The policy: root reads everything and may derive; ``variant`` moves u1 between groups, so
    installs change the policy without touching any row's tags."""
    home = ("group:g1", "group:g2")[variant % 2]
    lines = [
        *(f"g, {ACTOR}, group:{g}, {TENANT}" for g in ("g1", "g2", "g3")),
        f"g, user:u1, {home}, {TENANT}",
        f"g, user:u2, group:g2, {TENANT}",
        *(f"p, {ACTOR}, {TENANT}, label:{label}, read, allow" for label in LABELS),
        f"p, {ACTOR}, {TENANT}, classification:restricted, read, allow",
        f"p, {ACTOR}, {TENANT}, derive, execute, allow",
        f"p, {ACTOR}, {TENANT}, admin, execute, allow",
        f"p, group:g2, {TENANT}, label:l1, read, allow",
    ]
    return "\n".join(lines) + "\n"


def random_record(rng: random.Random, doc_id: str, *, text_variant: int | None = None) -> dict[str, Any]:
    """A record of ``doc_id`` with random tags (and, given ``text_variant``, that version of its text)."""
    variant = rng.randrange(3) if text_variant is None else text_variant
    words = " ".join(WORDS[(i + variant) % len(WORDS)] for i in range(24))
    return {
        "id": doc_id,
        "text": f"Document {doc_id}, version {variant}: {words}.",
        "tenant": TENANT,
        "acl": {
            "allow": rng.sample(PRINCIPALS, rng.randint(1, 3)),
            "deny": rng.sample(DENIABLE, rng.randint(0, 1)),
        },
        "labels": rng.sample(LABELS, rng.randint(0, 2)),
        "classification": rng.choice(LEVELS),
        "uri": f"test://{doc_id}",
    }


def _row_ids(warehouse: Any, *, derived: bool = False) -> list[str]:
    """The ids of the rows there are now (only derived ones, if ``derived``)."""
    rows = raw_table(warehouse.store).search().select(["chunk_id", "kind"]).limit(None).to_list()
    return sorted(row["chunk_id"] for row in rows if not derived or row["kind"] != "chunk")


def _one_operation(warehouse: Any, rng: random.Random, name: str, number: int) -> str:
    """Run one random lifecycle write; returns what it did (refusals of a missing row included)."""
    from ragwarden.errors import NotFoundError

    choice = rng.random()
    try:
        if choice < 0.45:
            warehouse.sync([{k: v for k, v in random_record(rng, rng.choice(DOCUMENTS)).items() if k != "text"}])
            return "sync"
        if choice < 0.72:
            ids = _row_ids(warehouse)
            if not ids:  # every document forgotten, none ingested again yet
                return "nothing to derive from"
            parents = rng.sample(ids, min(len(ids), rng.randint(1, 3)))
            warehouse.derive(f"note {name}-{number}", parents=parents, subject=ACTOR, tenant=TENANT, kind="note")
            return "derive"
        if choice < 0.87:
            warehouse.ingest_records([random_record(rng, rng.choice(DOCUMENTS))])
            return "ingest"
        if choice < 0.95:
            warehouse.install_policy_text(policy_text(rng.randrange(2)), subject=ACTOR, tenant=TENANT)
            return "policy"
        derived = _row_ids(warehouse, derived=True)
        if derived and rng.random() < 0.5:
            warehouse.forget(rng.choice(derived), reason=f"erasure by {name}")
            return "forget row"
        warehouse.forget(rng.choice(DOCUMENTS), reason=f"erasure by {name}", tenant=TENANT)
        return "forget document"
    except NotFoundError:
        return "not found"


def worker(uri: str, name: str, seed: int, rounds: int, operations: int, barrier: Any, start: Any, result: str) -> None:
    """``rounds`` rounds of ``operations`` random writes each; after each round, wait at ``barrier``
    twice (the test checks the warehouse between the two waits)."""
    from ragwarden.config import Settings
    from ragwarden.warehouse import Warehouse

    outcome: dict[str, Any] = {"errors": [], "done": []}
    rng = random.Random(seed)
    try:
        warehouse = Warehouse(Settings.from_env(warehouse=uri))
        start.wait(120)
        for round_ in range(rounds):
            for number in range(operations):
                try:
                    outcome["done"].append(_one_operation(warehouse, rng, name, round_ * operations + number))
                except Exception:
                    outcome["errors"].append(traceback.format_exc())
            barrier.wait(300)  # quiescent: the test checks
            barrier.wait(300)
    except Exception:
        outcome["errors"].append(traceback.format_exc())
        barrier.abort()
    Path(result).write_text(json.dumps(outcome), encoding="utf-8")


# -- the independent check ----------------------------------------------------------------------


def _clauses(row: Mapping[str, Any], registry: Mapping[str, Sequence[str]]) -> frozenset[frozenset[str]]:
    return frozenset(frozenset(registry[token]) for token in row["acl_clauses"])


def lineage_violations(rows: Iterable[Mapping[str, Any]], registry: Mapping[str, Sequence[str]]) -> list[str]:
    """Every derived row that is not exactly the propagation of its parents' tags in ``rows`` (one
    table version), or whose parent is missing there; duplicate ids; unknown clause tokens."""
    by_id: dict[str, Mapping[str, Any]] = {}
    problems: list[str] = []
    for row in rows:
        if row["chunk_id"] in by_id:
            problems.append(f"chunk id {row['chunk_id']} stored twice")
        by_id[row["chunk_id"]] = row
        if any(token not in registry for token in row["acl_clauses"]):
            problems.append(f"{row['chunk_id']} carries a clause token the registry lacks")
            return problems
    for chunk_id, row in sorted(by_id.items()):
        if row["kind"] == "chunk":
            continue
        parents = [by_id.get(p) for p in row["parents"]]
        if any(parent is None for parent in parents):
            problems.append(f"derived {chunk_id} outlived a parent ({row['parents']})")
            continue
        clauses = frozenset().union(*(_clauses(p, registry) for p in parents if p is not None))
        expected = {
            "tenant": {p["tenant"] for p in parents if p is not None},
            "clauses": clauses,
            "acl_allow": sorted(frozenset().union(*clauses)),
            "acl_deny": sorted({d for p in parents if p is not None for d in p["acl_deny"]}),
            "labels": sorted({label for p in parents if p is not None for label in p["labels"]}),
            "classification": max(p["classification"] for p in parents if p is not None),
        }
        found = {
            "tenant": {row["tenant"]},
            "clauses": _clauses(row, registry),
            "acl_allow": sorted(row["acl_allow"]),
            "acl_deny": sorted(row["acl_deny"]),
            "labels": sorted(row["labels"]),
            "classification": row["classification"],
        }
        for key, value in expected.items():
            if found[key] != value:
                problems.append(f"derived {chunk_id}: {key} is {found[key]!r}, its parents give {value!r}")
    return problems


def document_violations(chunks: Iterable[Mapping[str, Any]], sources: Iterable[Mapping[str, Any]]) -> list[str]:
    """Every document whose chunks disagree with each other or with its source record (tags, version)."""
    columns = ("acl_allow", "acl_deny", "acl_clauses", "labels", "classification", "doc_version")
    records = {(s["tenant"], s["doc_id"]): s for s in sources}
    problems: list[str] = []
    seen: dict[tuple[str, str], tuple[Any, ...]] = {}
    for row in chunks:
        if row["kind"] != "chunk":
            continue
        key = (row["tenant"], row["doc_id"])
        state = tuple(tuple(sorted(v)) if isinstance(v, list) else v for v in (row[c] for c in columns))
        if seen.setdefault(key, state) != state:
            problems.append(f"document {key} holds chunks of different tags or versions")
        record = records.get(key)
        if record is None:
            problems.append(f"document {key} has chunks but no source record")
            continue
        stored = tuple(tuple(sorted(v)) if isinstance(v, list) else v for v in (record[c] for c in columns))
        if stored != state:
            problems.append(f"document {key}: source record {stored} disagrees with its chunks {state}")
    return problems
