"""One typed settings object; environment variables are read here and nowhere else."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from .errors import ConfigurationError

DEFAULT_WAREHOUSE = ".ragwarden"
DEFAULT_DATA_DIR = "../shared/data"


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Where the warehouse and policy are, and the knobs of ingest.

    ``policy`` is a Casbin policy CSV; None means the warehouse's own installed policy.
    ``audit_key`` makes audit hashes HMACs; ``audit_raw_queries`` keeps raw queries in receipts.
    ``openlineage_env`` is the ``OPENLINEAGE*`` environment (transport configuration);
    ``lineage_dir`` holds the lineage spool (default: ``_lineage`` in a local warehouse).
    """

    warehouse: str = DEFAULT_WAREHOUSE
    policy: str | None = None
    data_dir: Path = Path(DEFAULT_DATA_DIR)
    max_file_bytes: int = 20 * 1024 * 1024
    chunk_overlap: int = 32
    embed_batch_size: int = 32
    write_batch_docs: int = 64
    audit_key: bytes | None = None
    audit_raw_queries: bool = False
    lineage_dir: Path | None = None
    openlineage_env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("max_file_bytes", "embed_batch_size", "write_batch_docs"):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"setting {name} must be at least 1, got {getattr(self, name)}")
        if self.chunk_overlap < 0:
            raise ConfigurationError(f"setting chunk_overlap must be at least 0, got {self.chunk_overlap}")

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
        if env.get("RAGWARDEN_AUDIT_RAW_QUERIES"):
            values["audit_raw_queries"] = env["RAGWARDEN_AUDIT_RAW_QUERIES"].lower() in ("1", "true", "yes")
        if env.get("RAGWARDEN_MAX_FILE_BYTES"):
            try:
                values["max_file_bytes"] = int(env["RAGWARDEN_MAX_FILE_BYTES"])
            except ValueError:
                raise ConfigurationError(
                    f"RAGWARDEN_MAX_FILE_BYTES must be a whole number of bytes, got {env['RAGWARDEN_MAX_FILE_BYTES']!r}"
                ) from None
        if env.get("RAGWARDEN_LINEAGE_DIR"):
            values["lineage_dir"] = Path(env["RAGWARDEN_LINEAGE_DIR"])
        values["openlineage_env"] = {k: v for k, v in env.items() if k.startswith("OPENLINEAGE")}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]

    def with_(self, **changes: object) -> Settings:
        return replace(self, **changes)  # type: ignore[arg-type]
