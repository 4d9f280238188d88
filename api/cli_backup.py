"""Backup and restore commands: a copy of the warehouse, and its rows brought back to a backup or a time."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

import click

from ..config import Settings
from ..warehouse import Warehouse
from .cli_options import common_options, existing


class Moment(click.ParamType):
    """An ISO 8601 time (``2026-12-07T10:41:00Z``, ``2026-12-07 10:41:00.123456+01:00``); UTC when it names no zone."""

    name = "time"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> datetime:
        if isinstance(value, datetime):
            moment = value
        else:
            try:
                moment = datetime.fromisoformat(str(value))
            except ValueError:
                self.fail(f"{value!r} is not an ISO 8601 time such as 2026-12-07T10:41:00Z", param, ctx)
        return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


@click.command()
@click.argument("destination")
@click.option("--json", "as_json", is_flag=True, help="Print what was copied as JSON.")
@common_options
def backup(destination: str, as_json: bool, settings: Settings) -> None:
    """Copy the warehouse to DESTINATION, an empty folder or s3://bucket/prefix: every table at one
    version each (pinned while it is copied, so serving and writing may go on), the receipts still
    in the audit journal folded into the copy, and the lineage files. The backup is receipted."""
    taken = existing(settings).backup(destination)
    if as_json:
        click.echo(json.dumps(taken.as_dict(), indent=2))
        return
    for table in taken.tables:
        click.echo(f"  {table.name}: version {table.version} ({table.rows} rows, committed {table.committed_at.isoformat()})")
    click.echo(f"backed up {settings.warehouse} to {taken.uri} at {taken.taken_at.isoformat()} "
               f"({len(taken.tables)} tables, {taken.receipts_folded} journaled receipts folded, {taken.files} files)")  # fmt: skip


@click.command()
@click.option("--from", "source", metavar="BACKUP", help="A backup `ragwarden backup` made (a folder or S3 prefix).")
@click.option("--to-time", "moment", type=Moment(), help="Bring rows back to how they stood at this time (ISO 8601; UTC if no zone).")
@click.option("--json", "as_json", is_flag=True, help="Print what was restored as JSON.")
@common_options
def restore(source: str | None, moment: datetime | None, as_json: bool, settings: Settings) -> None:
    """Bring the warehouse's rows and source records back to a backup (--from) or to a time
    (--to-time), as new versions, then apply again every erasure receipted since. The audit log,
    policies, API keys and directory are kept as they are; the restore is receipted. Into an empty
    --warehouse, --from copies every table of the backup (a warehouse lost and rebuilt)."""
    if (source is None) == (moment is None):
        raise click.UsageError("give --from BACKUP or --to-time TIME (one of them)")
    if source is not None:
        _, report = Warehouse.restore_backup(settings, source)
    else:
        report = existing(settings).restore(at=moment)
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
        return
    for table in report.tables:
        click.echo(f"  {table.name}: {table.how} (version {table.before} -> {table.after}, restored {table.point})")
    for tenant, item in report.erasures:
        click.echo(f"  erased again: {item} ({tenant})")
    click.echo(f"restored {settings.warehouse} to {report.point}")
