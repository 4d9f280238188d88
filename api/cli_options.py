"""Options every command takes, and the one place CLI errors become clean exits."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

import click

from ..config import Settings
from ..errors import RagwardenError
from ..warehouse import Warehouse


def common_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--warehouse and --policy, taken by every command."""

    @click.option(
        "--warehouse",
        envvar="RAGWARDEN_WAREHOUSE",
        help="Warehouse URI: a local folder (default ./.ragwarden) or object storage.",
    )
    @click.option(
        "--policy",
        envvar="RAGWARDEN_POLICY",
        type=click.Path(dir_okay=False),
        help="Casbin policy CSV to decide with (default: the warehouse's installed policy).",
    )
    @functools.wraps(command)
    def wrapper(*args: Any, warehouse: str | None, policy: str | None, **kwargs: Any) -> Any:
        settings = Settings.from_env(warehouse=warehouse, policy=policy)
        try:
            return command(*args, settings=settings, **kwargs)
        except RagwardenError as exc:
            raise click.ClickException(str(exc)) from exc

    return wrapper


def existing(settings: Settings) -> Warehouse:
    """The warehouse ``settings`` name, refused (naming the path) if it is not there: what every
    command but ingest, policy install and init opens, so a mistyped path never reads as empty."""
    return Warehouse(settings, create=False)


class JsonObject(click.ParamType):
    """An option whose value is a JSON object (a search's ``--filter``)."""

    name = "json"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> dict[str, Any]:
        if isinstance(value, dict):
            return value
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as exc:
            self.fail(f"{value!r} is not JSON: {exc.msg} at character {exc.pos}", param, ctx)
        if not isinstance(parsed, dict):
            self.fail(f"{value!r} is JSON but not an object such as '{{\"year\": 2020}}'", param, ctx)
        return parsed
