"""Where lineage events go: the OpenLineage client's own configuration when the environment
gives one, else one JSON file per event in the warehouse: under a local warehouse's
``_lineage/events/``, or objects of an object-store warehouse's (``WarehouseFilesTransport``).

The environment is the caller's mapping (``os.environ`` at the edges), read the way
openlineage-python 1.54 reads its own: an ``openlineage.yml`` (``OPENLINEAGE_CONFIG``, else the
working directory, else ``$HOME/.openlineage/``), which wins over ``OPENLINEAGE__*`` variables
(``OPENLINEAGE__TRANSPORT__TYPE=http`` -> ``{"transport": {"type": "http"}}``, values parsed as
JSON where they can be), and ``OPENLINEAGE_URL`` (+ ``OPENLINEAGE_ENDPOINT``,
``OPENLINEAGE_API_KEY``) when no transport type is set. ``OPENLINEAGE_DISABLED=true`` turns
lineage off. The rest of the configuration (filters, tags) applies either way.

HTTP transports the configuration leaves untuned get a short timeout and a single retry
(:data:`HTTP_BOUNDS`), so a backend that is down costs a run about a second, not the
client's default of five retries with back-off; an explicit ``timeout`` or ``retry`` is kept.
"""

from __future__ import annotations

import copy
import json
import logging
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from openlineage.client import OpenLineageClient
from openlineage.client.serde import Serde
from openlineage.client.transport import Transport
from openlineage.client.utils import deep_merge_dicts

from .errors import ConfigurationError
from .state import WarehouseFiles, sortable_now

log = logging.getLogger(__name__)

ENV_PREFIX = "OPENLINEAGE__"
CONFIG_FILE = "openlineage.yml"
HTTP_BOUNDS: dict[str, Any] = {
    "timeout": 1.0,
    "retry": {"total": 1, "connect": 1, "read": 0, "status": 1, "backoff_factor": 0.1},
}


def lineage_disabled(env: Mapping[str, str]) -> bool:
    return env.get("OPENLINEAGE_DISABLED", "").strip().lower() == "true"


def environment_config(env: Mapping[str, str], *, cwd: Path | None = None) -> dict[str, Any]:
    """The client configuration ``env`` gives (empty when it gives none)."""
    config = _variables_config(env)
    path = _config_file(env, cwd or Path.cwd())
    if path is not None:
        config = deep_merge_dicts(config, _read_yaml(path))
    transport = config.get("transport")
    if not (isinstance(transport, dict) and transport.get("type")) and env.get("OPENLINEAGE_URL"):
        http: dict[str, Any] = {
            "type": "http",
            "url": env["OPENLINEAGE_URL"],
            "endpoint": env.get("OPENLINEAGE_ENDPOINT", "api/v1/lineage"),
        }
        if env.get("OPENLINEAGE_API_KEY"):
            http["auth"] = {"type": "api_key", "apiKey": env["OPENLINEAGE_API_KEY"]}
        config["transport"] = http
    return config


def make_client(env: Mapping[str, str], events: Path | Transport, *, cwd: Path | None = None) -> OpenLineageClient:
    """A client sending where ``env`` says, else to ``events``: a folder of
    ``openlineage-<time>.json`` files, or a transport of the caller's."""
    config = environment_config(env, cwd=cwd)
    transport = config.get("transport")
    given: Transport | None = None
    if isinstance(transport, dict) and transport.get("type"):
        config["transport"] = bounded(transport)
    elif isinstance(events, Transport):
        config.pop("transport", None)
        given = events
    else:
        events.mkdir(parents=True, exist_ok=True)
        config["transport"] = {"type": "file", "log_file_path": str(events / "openlineage"), "append": False}
    try:
        return OpenLineageClient(transport=given, config=copy.deepcopy(config))
    except Exception as exc:
        raise ConfigurationError(f"the OpenLineage configuration is not usable: {exc}") from exc


class WarehouseFilesTransport(Transport):
    """Each event as one JSON object in a folder of the warehouse (``state.WarehouseFiles``): where
    an object-store warehouse's events go when no backend is configured, so that they stay with
    the warehouse rather than on the host that emitted them."""

    kind = "ragwarden_warehouse_files"

    def __init__(self, files: WarehouseFiles) -> None:
        self._files = files

    def emit(self, event: Any) -> None:
        self._files.put(f"openlineage-{sortable_now()}-{uuid.uuid4()}.json", Serde.to_json(event).encode("utf-8"))


def bounded(transport: dict[str, Any]) -> dict[str, Any]:
    """``transport`` with :data:`HTTP_BOUNDS` under every HTTP transport in it (composites included)."""
    kind = transport.get("type")
    if kind == "http":
        return {**HTTP_BOUNDS, **transport}
    members = transport.get("transports")
    if kind == "composite" and isinstance(members, dict):
        return {**transport, "transports": {k: bounded(v) if isinstance(v, dict) else v for k, v in members.items()}}
    if kind == "composite" and isinstance(members, list):
        return {**transport, "transports": [bounded(v) if isinstance(v, dict) else v for v in members]}
    return transport


def _variables_config(env: Mapping[str, str]) -> dict[str, Any]:
    """``OPENLINEAGE__A__B=v`` -> ``{"a": {"b": v}}``; shorter keys win, as in the client."""
    config: dict[str, Any] = {}
    for key, raw in sorted(((k, v) for k, v in env.items() if k.startswith(ENV_PREFIX)), reverse=True):
        path = [part.lower() for part in key[len(ENV_PREFIX) :].split("__")]
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        node = config
        for part in path[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[path[-1]] = value
    return config


def _config_file(env: Mapping[str, str], cwd: Path) -> Path | None:
    home = env.get("HOME")
    candidates = [
        Path(env["OPENLINEAGE_CONFIG"]) if env.get("OPENLINEAGE_CONFIG") else None,
        cwd / CONFIG_FILE,
        Path(home) / ".openlineage" / CONFIG_FILE if home else None,
    ]
    return next((path for path in candidates if path is not None and path.is_file()), None)


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        content = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigurationError(f"cannot read the OpenLineage config file {path}: {exc}") from exc
    if content is None:
        return {}
    if not isinstance(content, dict):
        raise ConfigurationError(f"the OpenLineage config file {path} does not hold a mapping")
    return content
