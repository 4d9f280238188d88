"""One typed settings object; environment variables are read here and nowhere else."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, get_args

from .errors import ConfigurationError

EmbedBackend = Literal["torch", "onnx", "onnx-int8"]
IngestEngineName = Literal["local", "ray"]
INGEST_ENGINES: tuple[str, ...] = get_args(IngestEngineName)
EMBED_BACKENDS: tuple[EmbedBackend, ...] = get_args(EmbedBackend)
DEFAULT_EMBED_BACKEND: EmbedBackend = "onnx-int8"
"""The fastest backend whose SciFact nDCG@10 is within 0.005 of PyTorch's, measured by ``make bench``
(figures: ``docs/performance.md``, the constants table)."""

DEFAULT_WAREHOUSE = ".ragwarden"
DEFAULT_DATA_DIR = "../shared/data"
JWT_ALGORITHMS = ("HS256", "RS256", "ES256")
MetricsAccess = Literal["off", "loopback", "open"]
METRICS_ACCESS: tuple[MetricsAccess, ...] = get_args(MetricsAccess)


def check_embed_backend(value: object) -> EmbedBackend:
    """``value`` as an embedding backend; anything else is refused naming it (RAGWARDEN_EMBED_BACKEND)."""
    if value not in EMBED_BACKENDS:
        raise ConfigurationError(
            f"unknown embedding backend {value!r} (RAGWARDEN_EMBED_BACKEND); use one of {', '.join(EMBED_BACKENDS)}"
        )
    return value  # type: ignore[return-value]


# A Host header value: a DNS name, an IPv4 address or a bracketed IPv6 one, then a port or ``*``.
_ALLOWED_HOST = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?)(:(?:[0-9]{1,5}|\*))?")


def check_allowed_hosts(hosts: object) -> tuple[str, ...]:
    """``hosts`` as public host names for ``/mcp`` (RAGWARDEN_ALLOWED_HOSTS). A value no ``Host``
    header could match (a URL, a path, a wildcard name) is refused at start, naming it, rather than
    leave ``/mcp`` answering 421 to the name it was meant to admit."""
    if not isinstance(hosts, tuple):
        raise ConfigurationError(f"setting allowed_hosts must be a tuple of host names, got {hosts!r}")
    for host in hosts:
        if not isinstance(host, str) or not _ALLOWED_HOST.fullmatch(host):
            raise ConfigurationError(
                f"RAGWARDEN_ALLOWED_HOSTS: {host!r} is not a host; give NAME, NAME:PORT or NAME:* "
                "(no scheme, path or wildcard name), comma-separated, e.g. rag.example.com,rag.example.com:*"
            )
    return hosts


@dataclass(frozen=True, kw_only=True)
class FilterLimits:
    """How large a search's narrowing filter may be (``retrieval.narrowing``): its bytes as JSON,
    its conditions (field-operator pairs), its nesting of ``$and``/``$or``, and the values of one
    ``$in``/``$nin``. Compiling and evaluating a filter is linear in its size, so these bound what
    one request can cost; a filter over one is refused naming the limit and its setting."""

    bytes: int = 64 * 1024
    terms: int = 256
    depth: int = 16
    values: int = 1024

    def __post_init__(self) -> None:
        for name in ("bytes", "terms", "depth", "values"):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"setting filter_max_{name} must be at least 1, got {getattr(self, name)}")


@dataclass(frozen=True, kw_only=True)
class AuthSettings:
    """How services verify bearer tokens; API keys need nothing here (their hashes live in the warehouse).

    ``jwt_secret`` enables HS256; ``jwt_jwks`` (a file path or an http(s) URL) enables RS256/ES256.
    ``jwt_previous_secret`` is the HS256 secret being rotated out: tokens it signed are still
    accepted beside those of ``jwt_secret``, for the overlap of a rotation (the identity provider
    goes on signing with it until every replica accepts the new one).
    With either, ``issuer`` and ``audience`` are required: a token is checked for both, and for
    ``exp`` and ``nbf``. ``tenant_claim`` names the claim that carries the caller's tenant.
    ``groups_claim`` (off by default) names a claim whose values become ``group:`` principals of
    the caller for that request, beside the policy's ``g`` lines: the issuer is then trusted to
    say who is in which group. ``groups_map`` maps a value's prefix to a group prefix
    (``{"okta-": "group:"}``); with a map, a value matching no prefix is ignored.
    ``token`` is the credential of a stdio MCP server (whoever launches it supplies the identity).
    ``leeway_seconds`` is how far a token's ``exp``, ``nbf`` and ``iat`` may be off the clock of
    the server checking them (clocks of issuer and server drift).
    """

    jwt_secret: bytes | None = field(default=None, repr=False)
    jwt_previous_secret: bytes | None = field(default=None, repr=False)
    jwt_jwks: str | None = None
    issuer: str | None = None
    audience: str | None = None
    tenant_claim: str = "tenant"
    groups_claim: str | None = None
    groups_map: Mapping[str, str] = field(default_factory=dict)
    leeway_seconds: int = 30
    token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if (self.jwt_secret or self.jwt_jwks) and not (self.issuer and self.audience):
            raise ConfigurationError(
                "JWT verification needs RAGWARDEN_JWT_ISSUER and RAGWARDEN_JWT_AUDIENCE as well as a key"
            )
        if self.jwt_secret is not None and len(self.jwt_secret) < 32:
            raise ConfigurationError("RAGWARDEN_JWT_SECRET must be at least 32 bytes (HS256 keys shorter than the hash are weak)")
        if self.jwt_previous_secret is not None:
            if self.jwt_secret is None:
                raise ConfigurationError("RAGWARDEN_JWT_PREVIOUS_SECRET is accepted beside RAGWARDEN_JWT_SECRET only: "
                                         "set the new secret in RAGWARDEN_JWT_SECRET")  # fmt: skip
            if len(self.jwt_previous_secret) < 32:
                raise ConfigurationError("RAGWARDEN_JWT_PREVIOUS_SECRET must be at least 32 bytes, as RAGWARDEN_JWT_SECRET")
        if not self.tenant_claim:
            raise ConfigurationError("RAGWARDEN_JWT_TENANT_CLAIM must name a claim")
        wrong = sorted(target for target in self.groups_map.values() if not str(target).startswith("group:"))
        if wrong:
            raise ConfigurationError(f"RAGWARDEN_JWT_GROUPS_MAP must map to group: prefixes, not {wrong}")
        if self.groups_map and not self.groups_claim:
            raise ConfigurationError("RAGWARDEN_JWT_GROUPS_MAP needs RAGWARDEN_JWT_GROUPS_CLAIM, the claim it maps")
        if self.leeway_seconds < 0:
            raise ConfigurationError(f"RAGWARDEN_JWT_LEEWAY_SECONDS must be at least 0, got {self.leeway_seconds}")

    @property
    def jwt_enabled(self) -> bool:
        return bool(self.jwt_secret or self.jwt_jwks)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> AuthSettings:
        values: dict[str, object] = {}
        if env.get("RAGWARDEN_JWT_SECRET"):
            values["jwt_secret"] = env["RAGWARDEN_JWT_SECRET"].encode("utf-8")
        if env.get("RAGWARDEN_JWT_PREVIOUS_SECRET"):
            values["jwt_previous_secret"] = env["RAGWARDEN_JWT_PREVIOUS_SECRET"].encode("utf-8")
        for name, key in (
            ("jwt_jwks", "RAGWARDEN_JWT_JWKS"),
            ("issuer", "RAGWARDEN_JWT_ISSUER"),
            ("audience", "RAGWARDEN_JWT_AUDIENCE"),
            ("tenant_claim", "RAGWARDEN_JWT_TENANT_CLAIM"),
            ("groups_claim", "RAGWARDEN_JWT_GROUPS_CLAIM"),
            ("token", "RAGWARDEN_TOKEN"),
        ):
            if env.get(key):
                values[name] = env[key]
        if env.get("RAGWARDEN_JWT_LEEWAY_SECONDS"):
            try:
                values["leeway_seconds"] = int(env["RAGWARDEN_JWT_LEEWAY_SECONDS"])
            except ValueError:
                raise ConfigurationError(
                    f"RAGWARDEN_JWT_LEEWAY_SECONDS must be a whole number of seconds, not {env['RAGWARDEN_JWT_LEEWAY_SECONDS']!r}"
                ) from None
        if env.get("RAGWARDEN_JWT_GROUPS_MAP"):
            try:
                mapped = json.loads(env["RAGWARDEN_JWT_GROUPS_MAP"])
            except json.JSONDecodeError as exc:
                raise ConfigurationError(f"RAGWARDEN_JWT_GROUPS_MAP is not JSON: {exc.msg}") from None
            if not isinstance(mapped, dict) or not all(isinstance(v, str) for v in [*mapped, *mapped.values()]):
                raise ConfigurationError('RAGWARDEN_JWT_GROUPS_MAP must be a JSON object of text, e.g. {"okta-": "group:"}')
            values["groups_map"] = mapped
        return cls(**values)  # type: ignore[arg-type]


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Where the warehouse and policy are, and the knobs of ingest.

    ``policy`` is a Casbin policy CSV; None means the warehouse's own installed policy.
    ``audit_key`` makes audit hashes HMACs; ``audit_retired_keys`` are keys rotated out, which
    only verify the chains written under them; ``audit_key_seal`` is the root of the checkpoint
    that fences them (``governance.audit.KeyRing``); ``audit_raw_queries`` keeps raw queries in receipts.
    ``openlineage_env`` is the ``OPENLINEAGE*`` environment (transport configuration);
    ``lineage_dir`` holds the lineage spool (default: ``_lineage`` in a local warehouse).
    ``auth`` is how the HTTP and MCP services verify credentials.
    ``embed_backend`` runs the embedding model in PyTorch or as an ONNX export (fp32 or int8),
    exported once into ``embed_cache_dir`` (default: see ``ragwarden.embedder.default_cache_dir``);
    ``embed_device`` is ``auto`` (a GPU when torch sees one), ``cpu`` or ``cuda``, and
    ``embed_batch_size`` None takes the device's batch size; ``embed_threads`` is how many threads
    one encoder call may use (None: every core; ``serve --workers N`` gives each process its share).
    ``max_in_flight`` and ``max_queued`` bound the HTTP requests at work and waiting; one more
    answers 503 with ``Retry-After`` (``api.admission``). A few at work per process is the fastest:
    beyond them, request threads only take turns at the interpreter lock, and the line no longer
    answers first come, first served (measured in ``docs/performance.md``); a warehouse on object
    storage, whose reads wait on round trips, may want more.
    ``server_timing`` makes HTTP answers carry ``Server-Timing`` (milliseconds in line, at work and
    by stage): for measuring a replica no untrusted caller reaches, since a caller could read in
    them what its request cost; off, they go to the access log alone.
    ``metrics`` says who may read ``/metrics`` (``api.metrics``): ``loopback`` (the default) serves
    it to clients on this host alone, ``open`` to any client that reaches the port (a network only
    the scraper reaches), ``off`` serves no ``/metrics`` and keeps no metrics.
    ``search_deadline_seconds`` is how long one search (or get) may work before it is stopped and
    answered 503 ``deadline_exceeded``; the work stops too when an HTTP client goes away.
    ``filter_max_bytes``, ``filter_max_terms``, ``filter_max_depth`` and ``filter_max_values``
    bound a search's narrowing filter (``FilterLimits``).
    ``flat_cache_mb`` bounds the vectors exact scans keep in memory per process (0: none).
    ``resident_index_mb`` bounds the resident serving index a process builds (``retrieval.serving``)
    for a table of 50,000 rows and more; a table whose index would not fit is searched through
    Lance (0: never build one).
    ``embed_window_docs`` is how many documents' new text an ingest embeds in one call before
    committing them ``write_batch_docs`` at a time (larger: fuller model batches, more memory).
    ``write_batch_brought`` is how many records that bring their own vectors (nothing to embed:
    a collection imported) an ingest commits at a time: one commit per 10,000 keeps a bulk load
    at storage speed, where 64 a commit spent most of its time committing.
    ``import_batch_rows`` is how many rows ``ragwarden import`` checks and commits at once: each
    commit also passes over the keys the table holds (to merge, not duplicate), so a 1M-row import
    in commits of 10,000 ran at half the rate of one in commits of 100,000.
    ``ingest_maintenance``: each ingest folds its rows into the indexes and merges small fragments
    once enough is due (False: leave that to ``ragwarden optimize`` on a schedule, so a connector
    committing every second never waits for it; rows not yet indexed are still searched).
    ``ray_actors`` is how many actors chunk and embed in a Ray ingest (None: one per GPU, else
    half the CPUs, at most 4).
    ``storage_options`` configure an object-store warehouse (``s3://bucket/prefix``...): Lance's
    storage options (``aws_endpoint``, ``aws_region``, ``allow_http``, credentials...).
    ``allowed_hosts`` are the public names (``Host`` values: ``NAME``, ``NAME:PORT``, or ``NAME:*``
    for any port) under which ``/mcp`` answers as well as loopback, e.g. behind a proxy at
    ``rag.example.com``; the MCP transport refuses every other ``Host`` (421) and ``Origin`` (403)
    against DNS rebinding (``api.mcp_server.transport_security``).
    """

    warehouse: str = DEFAULT_WAREHOUSE
    policy: str | None = None
    data_dir: Path = Path(DEFAULT_DATA_DIR)
    max_file_bytes: int = 20 * 1024 * 1024
    chunk_overlap: int = 32
    embed_batch_size: int | None = None
    embed_device: str = "auto"
    embed_backend: EmbedBackend = DEFAULT_EMBED_BACKEND
    embed_threads: int | None = None
    embed_cache_dir: Path | None = None
    write_batch_docs: int = 64
    write_batch_brought: int = 10_000
    import_batch_rows: int = 100_000
    embed_window_docs: int = 512
    ingest_maintenance: bool = True
    audit_key: bytes | None = field(default=None, repr=False)
    audit_retired_keys: tuple[bytes, ...] = field(default=(), repr=False)
    audit_key_seal: str | None = None
    audit_raw_queries: bool = False
    lineage_dir: Path | None = None
    openlineage_env: Mapping[str, str] = field(default_factory=dict)
    auth: AuthSettings = field(default_factory=lambda: AuthSettings())
    max_body_bytes: int = 1024 * 1024
    max_in_flight: int = 8
    max_queued: int = 96
    search_deadline_seconds: float = 10.0
    server_timing: bool = False
    metrics: MetricsAccess = "loopback"
    filter_max_bytes: int = FilterLimits.bytes
    filter_max_terms: int = FilterLimits.terms
    filter_max_depth: int = FilterLimits.depth
    filter_max_values: int = FilterLimits.values
    flat_cache_mb: int = 256
    resident_index_mb: int = 4096
    storage_options: Mapping[str, str] = field(default_factory=dict, repr=False)
    ray_actors: int | None = None
    allowed_hosts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("max_file_bytes", "embed_batch_size", "write_batch_docs", "write_batch_brought", "import_batch_rows", "embed_window_docs", "max_body_bytes",
                     "ray_actors", "max_in_flight", "embed_threads"):  # fmt: skip
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigurationError(f"setting {name} must be at least 1, got {getattr(self, name)}")
        for name in ("chunk_overlap", "flat_cache_mb", "max_queued", "resident_index_mb"):
            if getattr(self, name) < 0:
                raise ConfigurationError(f"setting {name} must be at least 0, got {getattr(self, name)}")
        if not self.search_deadline_seconds > 0:
            seconds = self.search_deadline_seconds
            raise ConfigurationError(f"setting search_deadline_seconds must be above 0, got {seconds}")
        _ = self.filter_limits  # building the limits refuses one below 1, naming its setting
        check_embed_backend(self.embed_backend)
        if self.metrics not in METRICS_ACCESS:
            raise ConfigurationError(f"unknown metrics access {self.metrics!r} (RAGWARDEN_METRICS); use one of "
                                     f"{', '.join(METRICS_ACCESS)}")  # fmt: skip
        check_allowed_hosts(self.allowed_hosts)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        """Settings from ``RAGWARDEN_*`` variables, then explicit (non-None) overrides."""
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        if env.get("RAGWARDEN_WAREHOUSE"):
            values["warehouse"] = env["RAGWARDEN_WAREHOUSE"]
        if env.get("RAGWARDEN_POLICY"):
            values["policy"] = env["RAGWARDEN_POLICY"]
        if env.get("RAGWARDEN_DATA"):
            values["data_dir"] = Path(env["RAGWARDEN_DATA"])
        if env.get("RAGWARDEN_AUDIT_KEY"):
            values["audit_key"] = env["RAGWARDEN_AUDIT_KEY"].encode("utf-8")
        if env.get("RAGWARDEN_AUDIT_RETIRED_KEYS"):
            try:
                retired = json.loads(env["RAGWARDEN_AUDIT_RETIRED_KEYS"])
            except json.JSONDecodeError as exc:
                raise ConfigurationError(f"RAGWARDEN_AUDIT_RETIRED_KEYS is not JSON: {exc.msg}") from None
            if not isinstance(retired, list) or not all(isinstance(key, str) and key for key in retired):
                raise ConfigurationError('RAGWARDEN_AUDIT_RETIRED_KEYS must be a JSON list of keys, e.g. ["the old key"]')
            values["audit_retired_keys"] = tuple(key.encode("utf-8") for key in retired)
        if env.get("RAGWARDEN_AUDIT_KEY_SEAL"):
            values["audit_key_seal"] = env["RAGWARDEN_AUDIT_KEY_SEAL"].strip()
        if env.get("RAGWARDEN_AUDIT_RAW_QUERIES"):
            values["audit_raw_queries"] = env["RAGWARDEN_AUDIT_RAW_QUERIES"].lower() in ("1", "true", "yes")
        if env.get("RAGWARDEN_INGEST_MAINTENANCE"):
            values["ingest_maintenance"] = env["RAGWARDEN_INGEST_MAINTENANCE"].lower() not in ("0", "false", "no")
        if env.get("RAGWARDEN_SERVER_TIMING"):
            values["server_timing"] = env["RAGWARDEN_SERVER_TIMING"].lower() in ("1", "true", "yes")
        if env.get("RAGWARDEN_METRICS"):
            values["metrics"] = env["RAGWARDEN_METRICS"].strip().lower()
        for name, unit in (("max_file_bytes", "bytes"), ("max_body_bytes", "bytes"), ("flat_cache_mb", "MiB"),
                           ("resident_index_mb", "MiB"), ("ray_actors", "actors"), ("embed_batch_size", "texts"), ("write_batch_docs", "documents"),
                           ("write_batch_brought", "records"), ("import_batch_rows", "rows"),
                           ("max_in_flight", "requests"), ("max_queued", "requests"), ("embed_threads", "threads"),
                           ("filter_max_bytes", "bytes"), ("filter_max_terms", "conditions"), ("filter_max_depth", "levels"),
                           ("filter_max_values", "values")):  # fmt: skip
            key = f"RAGWARDEN_{name.upper()}"
            if env.get(key):
                try:
                    values[name] = int(env[key])
                except ValueError:
                    raise ConfigurationError(f"{key} must be a whole number of {unit}, got {env[key]!r}") from None
        if env.get("RAGWARDEN_SEARCH_DEADLINE_SECONDS"):
            try:
                values["search_deadline_seconds"] = float(env["RAGWARDEN_SEARCH_DEADLINE_SECONDS"])
            except ValueError:
                given = env["RAGWARDEN_SEARCH_DEADLINE_SECONDS"]
                raise ConfigurationError(f"RAGWARDEN_SEARCH_DEADLINE_SECONDS must be a number of seconds, got {given!r}") from None
        if env.get("RAGWARDEN_EMBED_DEVICE"):
            values["embed_device"] = env["RAGWARDEN_EMBED_DEVICE"]
        if env.get("RAGWARDEN_EMBED_BACKEND"):
            values["embed_backend"] = env["RAGWARDEN_EMBED_BACKEND"]
        if env.get("RAGWARDEN_EMBED_CACHE"):
            values["embed_cache_dir"] = Path(env["RAGWARDEN_EMBED_CACHE"])
        if env.get("RAGWARDEN_LINEAGE_DIR"):
            values["lineage_dir"] = Path(env["RAGWARDEN_LINEAGE_DIR"])
        values["openlineage_env"] = {k: v for k, v in env.items() if k.startswith("OPENLINEAGE")}
        values["storage_options"] = storage_options_from_env(env)
        if env.get("RAGWARDEN_ALLOWED_HOSTS"):
            hosts = (host.strip() for host in env["RAGWARDEN_ALLOWED_HOSTS"].split(","))
            values["allowed_hosts"] = tuple(host for host in hosts if host)
        values["auth"] = AuthSettings.from_env(env)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]

    @property
    def filter_limits(self) -> FilterLimits:
        return FilterLimits(bytes=self.filter_max_bytes, terms=self.filter_max_terms, depth=self.filter_max_depth,
                            values=self.filter_max_values)  # fmt: skip

    @property
    def flat_cache_bytes(self) -> int:
        return self.flat_cache_mb * 1024 * 1024

    def with_(self, **changes: object) -> Settings:
        return replace(self, **changes)  # type: ignore[arg-type]


# The standard AWS variables, as Lance's storage option each sets.
AWS_VARIABLES = {
    "AWS_ENDPOINT_URL": "aws_endpoint",
    "AWS_ENDPOINT": "aws_endpoint",
    "AWS_DEFAULT_REGION": "aws_region",
    "AWS_REGION": "aws_region",
    "AWS_ACCESS_KEY_ID": "aws_access_key_id",
    "AWS_SECRET_ACCESS_KEY": "aws_secret_access_key",
    "AWS_SESSION_TOKEN": "aws_session_token",
    "AWS_ALLOW_HTTP": "allow_http",
}


def storage_options_from_env(env: Mapping[str, str]) -> dict[str, str]:
    """Object-store options: the standard AWS variables (later names in ``AWS_VARIABLES`` win),
    then ``RAGWARDEN_STORAGE_OPTIONS``, a JSON object of Lance storage options, over them."""
    options = {option: env[name] for name, option in AWS_VARIABLES.items() if env.get(name)}
    raw = env.get("RAGWARDEN_STORAGE_OPTIONS")
    if raw:
        try:
            extra = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigurationError(f"RAGWARDEN_STORAGE_OPTIONS is not JSON: {exc}") from None
        if not isinstance(extra, dict) or not all(isinstance(v, str | int | bool) for v in extra.values()):
            raise ConfigurationError(
                'RAGWARDEN_STORAGE_OPTIONS must be a JSON object of option names to text, e.g. {"allow_http": "true"}'
            )
        options.update({str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in extra.items()})
    return options
