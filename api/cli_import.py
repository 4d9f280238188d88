"""``ragwarden import``: a collection another store holds, brought in with its vectors and given
the ACLs it never had."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from ..config import Settings
from ..errors import InvalidValueError
from ..ingest.faiss_folder import faiss_langchain_rows
from ..ingest.importers import (
    AclFromMetadata,
    AclManifest,
    Collected,
    CollectedBatch,
    ImportReport,
    chroma_model,
    chroma_rows,
    lancedb_model,
    lancedb_rows,
    qdrant_rows,
)
from ..warehouse import Warehouse
from .cli_options import common_options

TAGS_HELP = ("Which metadata key holds each tag, e.g. 'allow=owner_groups,labels=tags,classification=level' "
             "(tags: allow, deny, labels, classification, tenant; a text value is split at commas).")  # fmt: skip


def _governance_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Where every importer's rows take their governance from."""
    for option in reversed([
        click.option("--acl-from-metadata", "acl_spec", help=TAGS_HELP),
        click.option("--manifest", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                     help='JSONL lines {"id": ...} or {"source": ...} with allow, deny, labels, classification, tenant.'),
        click.option("--tenant", help="Tenant for rows whose tags name none."),
        click.option("--classification", help="Classification for rows whose tags give none (else they are refused)."),
    ]):  # fmt: skip
        command = option(command)
    return command


@click.group(name="import")
def import_() -> None:
    """Bring a collection in from another store, its vectors as they are (never embedded again).

    Each row's ACL comes from its metadata (--acl-from-metadata) or a manifest (--manifest); a row
    with no ACL is refused and counted, never imported open. Run it again after a kill: rows
    already written are found unchanged and skipped."""


@import_.command(name="lancedb")
@click.argument("uri")
@click.option("--table", required=True, help="The table to import.")
@_governance_options
@click.option("--model", help="The model that made the vectors, when the table does not record it.")
@click.option("--id-column", default="id", show_default=True)
@click.option("--text-column", default="text", show_default=True)
@click.option("--vector-column", default="vector", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@common_options
def lancedb(uri: str, table: str, acl_spec: str | None, manifest: Path | None, tenant: str | None, classification: str | None,
            model: str | None, id_column: str, text_column: str, vector_column: str, as_json: bool, settings: Settings) -> None:  # fmt: skip
    """Import TABLE of the LanceDB database at URI: ids, texts, vectors; every other column is the row's metadata."""
    _imported(settings, lambda: lancedb_rows(uri, table, id_column=id_column, text_column=text_column, vector_column=vector_column),
              model=model, recorded=lambda: lancedb_model(uri, table), what=f"table {table!r}", origin=f"lancedb:{uri}/{table}",
              acl_spec=acl_spec, manifest=manifest, tenant=tenant, classification=classification, as_json=as_json)  # fmt: skip


@import_.command(name="chroma")
@click.argument("path", type=click.Path(exists=True, file_okay=False))
@click.option("--collection", required=True, help="The collection to import.")
@_governance_options
@click.option("--model", help="The model that made the vectors, when the collection does not record it.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@common_options
def chroma(path: str, collection: str, acl_spec: str | None, manifest: Path | None, tenant: str | None, classification: str | None,
           model: str | None, as_json: bool, settings: Settings) -> None:  # fmt: skip
    """Import COLLECTION of the Chroma database at PATH (a PersistentClient's folder): ids,
    documents, embeddings and metadatas."""
    _imported(settings, lambda: chroma_rows(path, collection), model=model, recorded=lambda: chroma_model(path, collection),
              what=f"collection {collection!r}", origin=f"chroma:{path}/{collection}", acl_spec=acl_spec, manifest=manifest,
              tenant=tenant, classification=classification, as_json=as_json)  # fmt: skip


@import_.command(name="qdrant")
@click.argument("path", type=click.Path(exists=True, file_okay=False))
@click.option("--collection", required=True, help="The collection to import.")
@_governance_options
@click.option("--model", required=True, help="The model that made the vectors (Qdrant records none).")
@click.option("--text-key", default="page_content", show_default=True, help="The payload key holding each point's text.")
@click.option("--vector-name", help="Which of a point's named vectors to import, when it has several.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@common_options
def qdrant(path: str, collection: str, acl_spec: str | None, manifest: Path | None, tenant: str | None, classification: str | None,
           model: str, text_key: str, vector_name: str | None, as_json: bool, settings: Settings) -> None:  # fmt: skip
    """Import COLLECTION of the Qdrant local storage at PATH (the folder QdrantClient(path=...)
    was given): ids, vectors, the payload's text and the rest of it as metadata."""
    _imported(settings, lambda: qdrant_rows(path, collection, text_key=text_key, vector_name=vector_name), model=model,
              recorded=lambda: None, what=f"collection {collection!r}", origin=f"qdrant:{path}/{collection}", acl_spec=acl_spec,
              manifest=manifest, tenant=tenant, classification=classification, as_json=as_json)  # fmt: skip


@import_.command(name="faiss-langchain")
@click.argument("folder", type=click.Path(exists=True, file_okay=False))
@_governance_options
@click.option("--model", required=True, help="The model that made the vectors (the folder records none).")
@click.option("--index-name", default="index", show_default=True, help="The index_name given to FAISS.save_local.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@common_options
def faiss_langchain(folder: str, acl_spec: str | None, manifest: Path | None, tenant: str | None, classification: str | None,
                    model: str, index_name: str, as_json: bool, settings: Settings) -> None:  # fmt: skip
    """Import the folder LangChain's FAISS.save_local wrote: each document's id, text and metadata
    with its vector. Its pickle is read without running it (only its docstore and documents)."""
    _imported(settings, lambda: faiss_langchain_rows(folder, index_name=index_name), model=model, recorded=lambda: None,
              what=f"folder {folder}", origin=f"faiss-langchain:{folder}", acl_spec=acl_spec, manifest=manifest,
              tenant=tenant, classification=classification, as_json=as_json)  # fmt: skip


def _imported(
    settings: Settings, read: Callable[[], tuple[int, Iterator[Collected] | Iterator[CollectedBatch]]], *, model: str | None,
    recorded: Callable[[], str | None], what: str, origin: str, acl_spec: str | None, manifest: Path | None,
    tenant: str | None, classification: str | None, as_json: bool,
) -> None:  # fmt: skip
    """Every importer's run: where the rows' governance comes from, the model that made the
    vectors (the one named, else the one ``what`` records), the rows ``read`` gives, imported."""
    tags = _tags(acl_spec, manifest)
    made_by = model or recorded()
    if made_by is None:
        raise click.UsageError(f"{what} does not record the model that made its vectors: name it with --model")
    total, rows = read()
    _said(Warehouse(settings).import_collection(rows, tags=tags, model=made_by, origin=origin, tenant=tenant,
                                                classification=classification, total=total), as_json)  # fmt: skip


def _tags(acl_spec: str | None, manifest: Path | None) -> AclFromMetadata | AclManifest:
    if (acl_spec is None) == (manifest is None):
        raise click.UsageError("say where the rows' ACLs come from: --acl-from-metadata or --manifest (one of them)")
    try:
        return AclFromMetadata.parse(acl_spec) if acl_spec is not None else AclManifest.read(manifest)  # type: ignore[arg-type]
    except InvalidValueError as exc:
        raise click.UsageError(str(exc)) from None


def _said(report: ImportReport, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"documents": report.documents, "unchanged": report.unchanged, "without_acl": report.without_acl,
                               "rejected": [{"source": s, "reason": r} for s, r in report.rejected],
                               "seconds": round(report.seconds, 3)}, indent=2))  # fmt: skip
    else:
        for source, reason in report.rejected[:20]:
            click.echo(f"refused {source}: {reason}", err=True)
        if len(report.rejected) > 20:
            click.echo(f"... and {len(report.rejected) - 20} more refused", err=True)
        click.echo(report.summary())
    if report.rejected:
        sys.exit(1)
