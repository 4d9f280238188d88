"""The ``ragwarden`` command line: ingest, search, policy and demo over one warehouse."""

from __future__ import annotations

import dataclasses
import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import click

from ..config import INGEST_ENGINES, Settings
from ..governance.policy import Policy
from ..ingest.lifecycle import DERIVED_KINDS
from ..release import DISTRIBUTION
from ..retrieval.collapse import GROUP_BYS
from ..retrieval.narrowing import FILTER_DESCRIPTION
from ..retrieval.search import MAX_K, MODES
from ..warehouse import Warehouse
from ..wording import plural
from .cli_options import JsonObject, existing
from .cli_options import common_options as _common_options


@click.group()
@click.version_option(package_name=DISTRIBUTION)
def main() -> None:
    """ragwarden: governed retrieval. Every chunk carries its source's ACL and labels, and
    every search is filtered inside the data layer by the policy."""


@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option("--manifest", type=click.Path(exists=True, dir_okay=False), help="YAML rules: glob -> tenant, acl, labels, classification.")
@click.option("--acl-from", type=click.Choice(["posix"]), help="Take each file's ACL from the POSIX permissions and ACLs on the path to it.")
@click.option("--tenant", help="Tenant for files whose governance names none (with --acl-from posix).")
@click.option("--skip-invalid", is_flag=True, help="Exit 0 even if some inputs were rejected (they are listed).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--engine", type=click.Choice(INGEST_ENGINES), default="local", show_default=True,
              help="Chunk and embed in this process, or on a Ray cluster (RAY_ADDRESS, else a local one).")  # fmt: skip
@click.option("--allow-move", is_flag=True,
              help="Let an id held by a document of another source move to this input, replacing that document.")  # fmt: skip
@click.option("--restore-erased", is_flag=True, help="Ingest documents that were erased (forget) again; the receipt says so.")
@_common_options
def ingest(
    paths: tuple[str, ...],
    manifest: str | None,
    acl_from: str | None,
    tenant: str | None,
    skip_invalid: bool,
    as_json: bool,
    engine: str,
    allow_move: bool,
    restore_erased: bool,
    settings: Settings,
) -> None:
    """Ingest JSONL records, files and folders (txt, md, rst, csv, json, html, pdf, docx, text with
    no extension) with their governance.

    A file's id is its path relative to the folder named (a file named alone: its name), unless
    its sidecar or the manifest gives an id. Unchanged documents are not rewritten; a changed one
    replaces its old chunks atomically. An input whose id a document of another source holds, and
    an erased document, are rejected (naming why) unless --allow-move or --restore-erased.
    Any rejected input makes the exit status non-zero unless --skip-invalid is given.
    """
    warehouse = Warehouse(settings)
    report = warehouse.ingest(
        list(paths), manifest=manifest, acl_from=acl_from, tenant=tenant, progress=None, engine=engine,  # type: ignore[arg-type]
        allow_move=allow_move, restore_erased=restore_erased,
    )
    if as_json:
        click.echo(
            json.dumps(
                {
                    "run_id": report.run_id,
                    "documents": report.documents,
                    "unchanged": report.unchanged,
                    "chunks": report.chunks,
                    "skipped": [{"source": s.source, "reason": s.reason} for s in report.skipped],
                    "rejected": [{"source": r.source, "reason": r.reason} for r in report.rejected],
                    "restored": [{"tenant": t, "id": d} for t, d in report.restored],
                    "seconds": round(report.seconds, 3),
                },
                indent=2,
            )
        )
    else:
        for item in report.skipped:
            click.echo(f"skipped  {item.source}: {item.reason}", err=True)
        for item in report.rejected:
            click.echo(f"rejected {item.source}: {item.reason}", err=True)
        click.echo(report.summary())
    if report.rejected and not skip_invalid:
        sys.exit(1)


@main.command()
@click.argument("query")
@click.option("--as", "subject", required=True, help="The subject searching, e.g. user:alice.")
@click.option("--tenant", required=True, help="The tenant to search in.")
@click.option("-k", "k", default=10, show_default=True, type=click.IntRange(1, MAX_K), help="How many results.")
@click.option("--mode", type=click.Choice(MODES), default="vector", show_default=True, help="Vector, full-text or hybrid (RRF).")
@click.option("--group-by", type=click.Choice(GROUP_BYS), default=None, help="doc: at most --per-group chunks of one document.")
@click.option("--per-group", default=1, show_default=True, type=click.IntRange(1, MAX_K), help="With --group-by: chunks per document.")
@click.option("--distinct", is_flag=True, help="One chunk of each text: byte-identical copies collapse to the best.")
@click.option("--filter", "narrow", type=JsonObject(), default=None, help=f"JSON. {FILTER_DESCRIPTION}")
@click.option("--json", "as_json", is_flag=True, help="Print results as JSON.")
@_common_options
def search(
    query: str, subject: str, tenant: str, k: int, mode: str, group_by: str | None, per_group: int, distinct: bool,
    narrow: dict[str, Any] | None, as_json: bool, settings: Settings,
) -> None:  # fmt: skip
    """Search as SUBJECT in TENANT: the best k chunks that subject may read."""
    warehouse = existing(settings)
    hits = warehouse.search(
        query, subject=subject, tenant=tenant, k=k, mode=mode, group_by=group_by, per_group=per_group, distinct=distinct,
        filter=narrow,
    )  # fmt: skip
    if not hits:  # why, when the configuration says (never the rows: those a caller cannot read are not its business)
        for note in warehouse.configuration_notes(tenant):
            click.echo(f"note: {note}", err=True)
    if as_json:
        click.echo(json.dumps([hit.as_dict() for hit in hits], indent=2, ensure_ascii=False))
        return
    if not hits:
        click.echo("no results")
    for rank, hit in enumerate(hits, start=1):
        labels = ",".join(hit.labels) or "-"
        click.echo(f"{rank:>2}. {hit.score:.3f}  {hit.doc_id}  [{hit.classification.label}; {labels}]")
        click.echo(f"    {' '.join(hit.text.split())[:200]}")


@main.command()
@click.argument("text")
@click.option("--parent", "parents", multiple=True, required=True, help="A chunk id the text derives from (repeat).")
@click.option("--as", "subject", required=True, help="The subject deriving; it must be able to read every parent.")
@click.option("--tenant", required=True, help="The tenant of the parents.")
@click.option("--kind", type=click.Choice(DERIVED_KINDS), default="summary", show_default=True, help="What the row is.")
@click.option("--json", "as_json", is_flag=True, help="Print the new row as JSON.")
@_common_options
def derive(
    text: str, parents: tuple[str, ...], subject: str, tenant: str, kind: str, as_json: bool, settings: Settings
) -> None:
    """Save TEXT as a row derived from chunks: its tags come from its parents by the propagation
    rule, so it is visible only to whoever could read every parent."""
    row = existing(settings).derive(text, parents=list(parents), subject=subject, tenant=tenant, kind=kind)
    summary = {
        "chunk_id": row.chunk_id,
        "kind": row.kind,
        "parents": list(row.parents),
        "labels": sorted(row.tags.labels),
        "classification": row.tags.classification.label,
        "acl_clauses": [sorted(c) for c in row.tags.acl_clauses],
        "table_version": row.table_version,
    }
    click.echo(json.dumps(summary, indent=2) if as_json else f"derived {row.chunk_id} ({kind}) from {len(row.parents)} parents")


@main.command()
@_common_options
def optimize(settings: Settings) -> None:
    """Build the tables' indexes, compact them, and store the serving index (the vectors and graph
    replicas load at start) when the table has a vector index and it fits RAGWARDEN_RESIDENT_INDEX_MB."""
    done = existing(settings).optimize()
    served = done["serving_index"]
    stored = f"serving index of {plural(served['rows'], 'row')} at version {served['version']} stored" if served else "no serving index stored"
    click.echo(f"optimized {plural(done['rows'], 'row')}; vector index: {done['vector_index'] or 'none'}; {stored}")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print what was done as JSON.")
@_common_options
def migrate(as_json: bool, settings: Settings) -> None:
    """Bring the warehouse to the format this release writes: once per upgrade, before the new
    release's replicas serve. Receipted, idempotent (a warehouse at that format is left as it is),
    and safe while replicas of the release before serve it: each step only adds."""
    done = Warehouse.migrate(settings)
    if as_json:
        click.echo(json.dumps({"found": done.found, "now": done.now, "steps": list(done.steps)}, indent=2))
    else:
        click.echo(done.summary())


@main.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@_common_options
def sync(file: str, settings: Settings) -> None:
    """Apply changed ACLs, labels or classifications from a JSONL FILE (records as for ingest; text
    is ignored) to the documents' chunks and every row derived from them, in one commit."""
    report = existing(settings).sync(Path(file))
    click.echo(f"re-tagged {plural(len(report.documents), 'document')}: {plural(report.chunks, 'chunk')}, "
               f"{plural(report.derived, 'derived row')}")


@main.command()
@click.argument("doc_id")
@click.option("--reason", required=True, help="Why (kept in the audit receipt).")
@click.option("--tenant", help="The document's tenant; needed when several tenants use the id.")
@_common_options
def forget(doc_id: str, reason: str, tenant: str | None, settings: Settings) -> None:
    """Erase document DOC_ID (or a derived row, a summary, note or agent memory, by its own id) and
    every row derived from it, then purge old table versions and index files so its text is in no
    file under the warehouse; the audit receipt is its tombstone."""
    report = existing(settings).forget(doc_id, reason=reason, tenant=tenant)
    click.echo(
        f"forgot {report.doc_id}: {plural(report.chunks, 'chunk')}, {plural(report.derived, 'derived row')}; "
        f"old versions purged: {sum(report.versions_purged.values())}"
    )


@main.command()
@click.argument("chunk_id")
@click.option("--as", "subject", required=True, help="The subject whose access is explained.")
@click.option("--tenant", required=True, help="The tenant asked in.")
@click.option("--caller", help="Who is asking (default: the subject); asking about others needs audit.")
@click.option("--json", "as_json", is_flag=True, help="Print the explanation as JSON.")
@_common_options
def explain(chunk_id: str, subject: str, tenant: str, caller: str | None, as_json: bool, settings: Settings) -> None:
    """Explain whether SUBJECT may read CHUNK_ID and why: tenant, the group path that matched, the
    rule that cleared each label, clearance against classification, any deny."""
    result = existing(settings).explain(chunk_id, subject=subject, tenant=tenant, caller=caller)
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2))
        return
    verdict = "visible" if result.allowed else "not visible"
    click.echo(verdict if result.reason == verdict else f"{verdict}: {result.reason}")  # never "not visible: not visible"
    for step in result.steps:
        click.echo(f"  [{'ok' if step.passed else 'NO'}] {step.check}: {step.detail}")


@main.command("access-review")
@click.option("--as", "subject", required=True, help="The subject whose access is reviewed.")
@click.option("--tenant", required=True, help="The tenant reviewed.")
@click.option("--caller", help="Who is asking (default: the subject); reviewing others needs audit.")
@click.option("--json", "as_json", is_flag=True, help="Print the review as JSON.")
@_common_options
def access_review_command(subject: str, tenant: str, caller: str | None, as_json: bool, settings: Settings) -> None:
    """What SUBJECT can read in TENANT, counted by source, label and classification."""
    review = existing(settings).access_review(subject=subject, tenant=tenant, caller=caller)
    if as_json:
        click.echo(json.dumps(review.as_dict(), indent=2))
        return
    click.echo(f"{subject} in {tenant}: {review.rows} readable rows (table version {review.table_version})")
    for title, counts in (
        ("by source", review.by_source),
        ("by label", review.by_label),
        ("by classification", review.by_classification),
        ("derived rows", review.derived_by_kind),
    ):
        click.echo(f"  {title}: " + (", ".join(f"{k} {v}" for k, v in counts.items()) or "-"))


@main.command()
@click.option("--label", required=True, help="The label to look for.")
@click.option("--tenant", required=True, help="The tenant to look in.")
@click.option("--caller", required=True, help="Who is asking; needs audit in the tenant.")
@click.option("--json", "as_json", is_flag=True, help="Print the inventory as JSON.")
@_common_options
def inventory(label: str, tenant: str, caller: str, as_json: bool, settings: Settings) -> None:
    """Every row (chunk or derived) carrying LABEL in TENANT, grouped by the source it comes from."""
    found = existing(settings).inventory(label=label, tenant=tenant, caller=caller)
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    for source, ids in found.items():
        click.echo(f"{source}: {plural(len(ids), 'row')}")
    if not found:
        click.echo(f"no row carries {label!r} in {tenant}")


@main.group()
def audit() -> None:
    """Verify and query the hash-chained audit receipts."""


def _head(_: click.Context, __: click.Parameter, value: str | None) -> str | tuple[int, str] | None:
    """A checkpoint root, or the SEQ:HASH head a verify printed before per-writer chains."""
    if value is None or (len(value) == 64 and all(c in "0123456789abcdef" for c in value)):
        return value
    seq, _, digest = value.partition(":")
    if not seq.isdigit() or len(digest) != 64:
        raise click.BadParameter(f"{value!r} is not a checkpoint root (64 hex digits) as printed by an earlier audit verify")
    return int(seq), digest


@audit.command("verify")
@click.option("--expect-head", callback=_head, metavar="CHECKPOINT",
              help="A checkpoint printed by an earlier verify and kept elsewhere: every chain must still hold its head.")  # fmt: skip
@_common_options
def audit_verify(expect_head: str | tuple[int, str] | None, settings: Settings) -> None:
    """Check every receipt chain: any edited, deleted, inserted or reordered receipt is reported
    (exit 1). A cut-off tail is visible only against a checkpoint taken before: keep the printed
    checkpoint and pass it back with --expect-head."""
    report = existing(settings).verify_audit(caller=None, expect_head=expect_head)
    for problem in report.problems:
        click.echo(problem, err=True)
    verdict = f"{plural(report.receipts, 'receipt')} in {plural(report.chains, 'chain')}, {'intact' if report.ok else 'TAMPERED'}"
    click.echo(f"{verdict}; checkpoint {report.checkpoint.root}" if report.checkpoint else verdict)
    if not report.ok:
        sys.exit(1)


@audit.command("archive")
@click.option("--before", required=True, type=click.DateTime(formats=["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M:%S%z"]),
              help="Archive the receipts written before this time (UTC unless it names an offset).")  # fmt: skip
@click.option("--to", "folder", required=True, type=click.Path(file_okay=False), help="A new or empty folder for the archive.")
@_common_options
def audit_archive(before: datetime, folder: str, settings: Settings) -> None:
    """Seal the receipts written before --before and move them to FOLDER (receipts.parquet and
    seal.json): the log verifies on from the seal, and the archive verifies alone against it.
    Refused unless the whole log verifies first. Record the printed seal outside the warehouse."""
    moment = before if before.tzinfo else before.replace(tzinfo=timezone.utc)
    done = existing(settings).archive_audit(before=moment, folder=Path(folder))
    click.echo(f"archived {plural(done.receipts, 'receipt')} of {plural(done.chains, 'chain')} to {folder}; seal {done.seal.root}")


@audit.command("verify-archive")
@click.argument("folder", type=click.Path(exists=True, file_okay=False))
@_common_options
def audit_verify_archive(folder: str, settings: Settings) -> None:
    """Check an archive made by `audit archive`: every receipt's hash, each chain linked up to the
    head its seal binds, and the seal among this warehouse's (exit 1 on any problem)."""
    report = existing(settings).verify_audit_archive(Path(folder))
    for problem in report.problems:
        click.echo(problem, err=True)
    click.echo(f"{plural(report.receipts, 'receipt')} in {plural(report.chains, 'chain')}, {'intact' if report.ok else 'TAMPERED'}")
    if not report.ok:
        sys.exit(1)


@audit.command("query")
@click.option("--chunk", "chunk_id", help="Receipts that returned or touched this chunk id.")
@click.option("--doc", "doc_id", help="Receipts about this document id.")
@click.option("--subject", help="Receipts of this subject.")
@click.option("--label", help="Receipts that returned a row carrying this label.")
@click.option("--tenant", help="Receipts in this tenant.")
@click.option("--since", type=click.DateTime(), help="From this time (UTC), inclusive.")
@click.option("--until", type=click.DateTime(), help="Up to this time (UTC), exclusive.")
@click.option("--limit", type=click.IntRange(1), help="At most this many, newest first.")
@_common_options
def audit_query(
    chunk_id: str | None,
    doc_id: str | None,
    subject: str | None,
    label: str | None,
    tenant: str | None,
    since: datetime | None,
    until: datetime | None,
    limit: int | None,
    settings: Settings,
) -> None:
    """Find receipts by chunk, document, subject, label and time range; prints JSON lines."""
    utc = {k: v.replace(tzinfo=timezone.utc) for k, v in {"since": since, "until": until}.items() if v}
    receipts = existing(settings).receipts(
        caller=None, chunk_id=chunk_id, doc_id=doc_id, subject=subject, label=label, tenant=tenant, limit=limit, **utc
    )
    for receipt in receipts:
        click.echo(json.dumps(_receipt_json(receipt), ensure_ascii=False))


def _receipt_json(receipt: Any) -> dict[str, Any]:
    data = {field.name: getattr(receipt, field.name) for field in dataclasses.fields(receipt)}
    data["chunk_ids"], data["doc_ids"] = list(receipt.chunk_ids), list(receipt.doc_ids)
    data["time"] = receipt.time.isoformat()
    data["chunk_labels"] = {k: list(v) for k, v in receipt.chunk_labels.items()}
    data["details"] = dict(receipt.details)
    return data


class _LineageGroup(click.Group):
    """``lineage ID`` means ``lineage show ID``; ``lineage flush`` is its own command."""

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["show", *args]
        return super().resolve_command(ctx, args)


@main.group(cls=_LineageGroup)
def lineage() -> None:
    """A document's lineage (`lineage ID`), and delivery of OpenLineage events (`lineage flush`)."""


@lineage.command("show")
@click.argument("item_id")
@click.option("--tenant", help="The document's tenant; needed when several tenants use the id.")
@_common_options
def lineage_show(item_id: str, tenant: str | None, settings: Settings) -> None:
    """Show ITEM_ID's lineage (a document or row id): source -> chunks -> derived rows -> the
    receipts that returned them, as JSON. `ragwarden lineage ID` is the same."""
    click.echo(json.dumps(existing(settings).lineage(item_id, tenant=tenant), indent=2, ensure_ascii=False))


@lineage.command("flush")
@_common_options
def lineage_flush(settings: Settings) -> None:
    """Send the OpenLineage events spooled while the lineage backend was down, oldest first
    (each run also does this as it starts). Exit 1 if some are still pending."""
    report = existing(settings).flush_lineage()
    click.echo(f"sent {report.sent}, set aside {report.rejected}, still pending {report.pending}")
    if report.pending:
        sys.exit(1)


@main.group()
def policy() -> None:
    """Validate and install Casbin policies."""


@policy.command("check")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the result and the clearances as JSON.")
@_common_options
def policy_check(file: str, as_json: bool, settings: Settings) -> None:
    """Validate a policy file; a bad line is named with its number and the reason. A valid one is
    summed up with the clearance it gives each subject it names, in each tenant, and the lines
    that set it (a deny on a level caps the clearance below that level)."""
    loaded = Policy.from_file(file)
    clearances = [(tenant, subject, loaded.clearance_of(subject, tenant)) for tenant, subject in loaded.named()]
    if as_json:
        summary = {
            "file": file,
            "rules": len(loaded.rules),
            "version": loaded.version,
            "clearances": [
                {
                    "tenant": tenant,
                    "subject": subject,
                    "clearance": None if clearance.level is None else clearance.level.label,
                    "granted": clearance.granted.label,
                    "granted_by": clearance.grant.line if clearance.grant else None,
                    "capped_by": clearance.cap.line if clearance.cap else None,
                }
                for tenant, subject, clearance in clearances
            ],
        }
        click.echo(json.dumps(summary, indent=2, ensure_ascii=False))
        return
    click.echo(f"{file}: {len(loaded.rules)} rules, valid (version {loaded.version})")
    if clearances:
        click.echo("clearance of each subject named, by tenant (and the lines that set it):")
    for tenant, subject, clearance in clearances:
        click.echo(f"  {tenant}  {subject}: {clearance.describe(lambda rule: f'line {rule.line}')}")


@policy.command("install")
@click.argument("file", type=click.Path(dir_okay=False))
@_common_options
def policy_install(file: str, settings: Settings) -> None:
    """Make a policy file the warehouse's own; searches use it from their next call."""
    installed = Warehouse(settings.with_(policy=None)).install_policy(Path(file))
    click.echo(f"installed {file} as policy version {installed.version} in {settings.warehouse}")


@main.command()
@_common_options
def init(settings: Settings) -> None:
    """Create an empty warehouse at --warehouse (or say that one is there): with ingest and policy
    install, the only commands that create one; every other command refuses a missing warehouse."""
    warehouse = Warehouse(settings)
    documents = warehouse.document_count()
    click.echo(f"warehouse ready at {settings.warehouse} ({plural(documents, 'document')})")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@_common_options
def demo(as_json: bool, settings: Settings) -> None:
    """Ingest the sample corpus under the example policy and show what four people get."""
    from .demo import run_demo

    run_demo(settings, as_json=as_json)


from .cli_service import apikey, mcp, serve, token  # noqa: E402 - they register on main, defined above

for _command in (serve, mcp, token, apikey):
    main.add_command(_command)

from .cli_backup import backup, restore  # noqa: E402 - they register on main, defined above

for _command in (backup, restore):
    main.add_command(_command)

from .cli_import import import_  # noqa: E402 - it registers on main, defined above

main.add_command(import_)
