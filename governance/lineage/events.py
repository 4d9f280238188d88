"""OpenLineage RunEvents for ragwarden's jobs: dataset naming, and what each event carries.

Datasets are named by the OpenLineage naming conventions (https://openlineage.io/docs/spec/naming):

- a local path or ``file:///path``: namespace ``file``, name the absolute path
  (``file://host/path``: namespace ``file://host``);
- object storage (``s3://bucket/key``, ``gs://``, ``abfss://``...): namespace ``scheme://bucket``,
  name the key, without a leading slash;
- ``http(s)``, ``hdfs``, ``ftp``/``sftp``: namespace ``scheme://authority``, name the path;
- any other URI names a document, not a location (``doc:ID``, ``test://x``): namespace the
  scheme, name the rest (``doc``/``ID``, ``test``/``x``); a bare id ``ID`` is read as ``doc:ID``.

The warehouse's tables are the datasets ``<warehouse URI>/chunks`` and ``<warehouse URI>/sources``.
"""

from __future__ import annotations

import os
import traceback
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

import pyarrow as pa
from openlineage.client import event_v2
from openlineage.client.constants import __version__ as OPENLINEAGE_CLIENT_VERSION
from openlineage.client.facet_v2 import (
    DatasetFacet,
    OutputDatasetFacet,
    RunFacet,
    column_lineage_dataset,
    dataset_version_dataset,
    error_message_run,
    job_type_job,
    output_statistics_output_dataset,
    processing_engine_run,
    schema_dataset,
)

from .facets import PRODUCER, VERSION, ChunksOutput, RagwardenSourcesRunFacet

Job = Literal["ingest", "derive", "sync", "forget"]
JOBS: tuple[Job, ...] = ("ingest", "derive", "sync", "forget")
JOB_NAMESPACE = "ragwarden"
MAX_LISTED_INPUTS = 100
"""More distinct sources than this are listed as one input: the warehouse's ``sources`` table."""
MAX_STACK_TRACE = 16_000

_BUCKET_SCHEMES = frozenset({"s3", "s3a", "s3n", "gs", "gcs", "abfs", "abfss", "wasb", "wasbs"})
_HOST_SCHEMES = frozenset({"http", "https", "hdfs", "ftp", "sftp"})


@dataclass(frozen=True)
class DatasetId:
    namespace: str
    name: str


def location_dataset(uri: str) -> DatasetId:
    """The dataset at a storage location: a local path (relative ones made absolute) or a URI."""
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if not scheme:
        return DatasetId("file", os.path.abspath(uri))
    if scheme == "file":
        path = unquote(parts.path) or "/"
        host = parts.netloc if parts.netloc not in ("", "localhost") else ""
        return DatasetId(f"file://{host}" if host else "file", path)
    if scheme in _BUCKET_SCHEMES:
        return DatasetId(f"{scheme}://{parts.netloc}", parts.path.lstrip("/") or "/")
    if scheme in _HOST_SCHEMES:
        return DatasetId(f"{scheme}://{parts.netloc}", parts.path or "/")
    rest = uri[len(parts.scheme) + 1 :].removeprefix("//")
    return DatasetId(scheme, rest or "/")


def source_dataset(ref: str) -> DatasetId:
    """The dataset of one source: an absolute path, a URI, or a bare document id (``doc:<id>``)."""
    if ref.startswith("doc:"):  # what location_dataset makes of it, without parsing it twice: records bring millions
        return DatasetId("doc", _doc_name(ref))
    if not urlsplit(ref).scheme and not os.path.isabs(ref):
        return DatasetId("doc", ref)
    return location_dataset(ref)


def _doc_name(ref: str) -> str:
    """The dataset name of a bare document id ``doc:<id>``."""
    return ref[4:].removeprefix("//") or "/"


def _source_key(ref: str) -> tuple[str, str]:
    """``source_dataset(ref)`` as (namespace, name): counting a run's distinct sources builds no
    dataset for each of its (up to millions of) documents."""
    if ref.startswith("doc:"):
        return ("doc", _doc_name(ref))
    found = source_dataset(ref)
    return (found.namespace, found.name)


def table_dataset(warehouse_uri: str, table: str) -> DatasetId:
    return location_dataset(f"{warehouse_uri.rstrip('/')}/{table}")


@dataclass(frozen=True)
class LineageRun:
    """One run of a job: its id (stable across every event and re-send), and what it reads."""

    run_id: str
    job: Job
    warehouse_uri: str
    sources: tuple[str, ...]

    @property
    def chunks(self) -> DatasetId:
        return table_dataset(self.warehouse_uri, "chunks")

    @cached_property
    def _inputs(self) -> tuple[list[DatasetId], int]:
        distinct = dict.fromkeys(map(_source_key, dict.fromkeys(self.sources)))
        if len(distinct) > MAX_LISTED_INPUTS:
            return [table_dataset(self.warehouse_uri, "sources")], len(distinct)
        return [DatasetId(*key) for key in distinct], len(distinct)

    def inputs(self) -> tuple[list[DatasetId], int]:
        """The input datasets to list, and how many distinct sources there are in all (worked out
        once per run: every event of it lists them)."""
        return list(self._inputs[0]), self._inputs[1]


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


def run_event(
    run: LineageRun,
    state: event_v2.RunState,
    *,
    output: ChunksOutput | None = None,
    error: BaseException | None = None,
    event_time: str | None = None,
) -> event_v2.RunEvent:
    """The event for ``run`` entering ``state``: COMPLETE describes ``output``, FAIL ``error``."""
    inputs, source_count = run.inputs()
    run_facets: dict[str, RunFacet] = {
        "processing_engine": processing_engine_run.ProcessingEngineRunFacet(
            version=VERSION, name="ragwarden", openlineageAdapterVersion=OPENLINEAGE_CLIENT_VERSION, producer=PRODUCER
        ),
        "ragwarden_sources": RagwardenSourcesRunFacet(source_count, len(inputs), producer=PRODUCER),
    }
    if output is not None:
        for name, info in (
            ("ragwarden_chunking", output.chunking),
            ("ragwarden_embedding", output.embedding),
            ("ragwarden_governance", output.governance),
        ):
            if info is not None:
                run_facets[name] = info.facet()
    if error is not None:
        run_facets["errorMessage"] = _error_facet(error)
    return event_v2.RunEvent(
        eventType=state,
        eventTime=event_time or now_iso(),
        producer=PRODUCER,
        run=event_v2.Run(runId=run.run_id, facets=run_facets),
        job=event_v2.Job(
            namespace=JOB_NAMESPACE,
            name=f"ragwarden.{run.job}",
            facets={
                "jobType": job_type_job.JobTypeJobFacet(
                    processingType="BATCH", integration="RAGWARDEN", jobType="JOB", producer=PRODUCER
                )
            },
        ),
        inputs=[event_v2.InputDataset(namespace=d.namespace, name=d.name) for d in inputs],
        outputs=[_chunks_output(run, inputs, output)],
    )


def _error_facet(error: BaseException) -> error_message_run.ErrorMessageRunFacet:
    trace = "".join(traceback.format_exception(error))
    if len(trace) > MAX_STACK_TRACE:
        trace = "...\n" + trace[-MAX_STACK_TRACE:]
    return error_message_run.ErrorMessageRunFacet(
        message=str(error) or type(error).__name__, programmingLanguage="python", stackTrace=trace, producer=PRODUCER
    )


def _chunks_output(run: LineageRun, inputs: list[DatasetId], output: ChunksOutput | None) -> event_v2.OutputDataset:
    chunks = run.chunks
    if output is None:
        return event_v2.OutputDataset(namespace=chunks.namespace, name=chunks.name)
    facets: dict[str, DatasetFacet] = {
        "version": dataset_version_dataset.DatasetVersionDatasetFacet(
            datasetVersion=str(output.version), producer=PRODUCER
        )
    }
    if output.schema is not None:
        facets["schema"] = schema_dataset.SchemaDatasetFacet(
            fields=[_schema_field(f, position) for position, f in enumerate(output.schema, start=1)],
            producer=PRODUCER,
        )
    lineage = _column_lineage(chunks, inputs, output)
    if lineage:
        facets["columnLineage"] = column_lineage_dataset.ColumnLineageDatasetFacet(fields=lineage, producer=PRODUCER)
    output_facets: dict[str, OutputDatasetFacet] = {}
    if output.rows is not None:
        output_facets["outputStatistics"] = output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
            rowCount=output.rows, producer=PRODUCER
        )
    return event_v2.OutputDataset(
        namespace=chunks.namespace, name=chunks.name, facets=facets, outputFacets=output_facets
    )


def _schema_field(field: pa.Field, position: int | None = None) -> schema_dataset.SchemaDatasetFacetFields:
    nested = [_schema_field(child) for child in field.type] if pa.types.is_struct(field.type) else None
    description = (field.metadata or {}).get(b"description")
    return schema_dataset.SchemaDatasetFacetFields(
        name=field.name,
        type=str(field.type),
        description=description.decode() if description else None,
        ordinal_position=position,
        fields=nested,
    )


def _column_lineage(
    chunks: DatasetId, inputs: list[DatasetId], output: ChunksOutput
) -> dict[str, column_lineage_dataset.Fields]:
    """``text`` <- each input's ``text`` (chunking); ``vector`` <- the chunk's ``text`` (embedding)."""
    fields: dict[str, column_lineage_dataset.Fields] = {}
    if output.chunking is not None and inputs:
        chunking = output.chunking
        how = f"split into windows of {chunking.window} {chunking.tokenizer} tokens overlapping by {chunking.overlap}"
        fields["text"] = column_lineage_dataset.Fields(inputFields=[_input_field(d, "text", how) for d in inputs])
    if output.embedding is not None:
        how = f"embedded by {output.embedding.model} ({output.embedding.dimension} dimensions)"
        fields["vector"] = column_lineage_dataset.Fields(inputFields=[_input_field(chunks, "text", how)])
    return fields


def _input_field(dataset: DatasetId, field: str, description: str) -> column_lineage_dataset.InputField:
    return column_lineage_dataset.InputField(
        namespace=dataset.namespace,
        name=dataset.name,
        field=field,
        transformations=[
            column_lineage_dataset.Transformation(
                type="DIRECT", subtype="TRANSFORMATION", description=description, masking=False
            )
        ],
    )


def event_from_json(data: dict[str, Any]) -> event_v2.RunEvent:
    """A RunEvent whose facets are the spooled dictionaries, for transports that want an event
    object (the Kafka transport keys messages by job); it serializes back to ``data``."""
    run, job = data["run"], data["job"]
    event = event_v2.RunEvent(
        eventTime=data["eventTime"],
        producer=data["producer"],
        eventType=event_v2.RunState(data["eventType"]) if "eventType" in data else None,
        run=event_v2.Run(runId=run["runId"], facets=run.get("facets")),
        job=event_v2.Job(namespace=job["namespace"], name=job["name"], facets=job.get("facets")),
        inputs=_datasets(data, "inputs", event_v2.InputDataset, "inputFacets"),
        outputs=_datasets(data, "outputs", event_v2.OutputDataset, "outputFacets"),
    )
    event.schemaURL = data["schemaURL"]
    return event


def _datasets(data: dict[str, Any], key: str, kind: type, extra: str) -> list[Any] | None:
    if key not in data:
        return None
    return [
        kind(namespace=d["namespace"], name=d["name"], facets=d.get("facets"), **{extra: d.get(extra)})
        for d in data[key]
    ]
