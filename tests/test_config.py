"""Settings: read from the environment at the edge, overridden explicitly, validated."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragwarden.config import Settings
from ragwarden.errors import ConfigurationError


def test_defaults_need_no_environment():
    settings = Settings.from_env({})
    assert (settings.warehouse, settings.policy, settings.data_dir) == (".ragwarden", None, Path("../shared/data"))


def test_environment_then_explicit_overrides():
    env = {"RAGWARDEN_WAREHOUSE": "/tmp/wh", "RAGWARDEN_POLICY": "p.csv", "RAGWARDEN_DATA": "/data", "RAGWARDEN_MAX_FILE_BYTES": "10"}
    settings = Settings.from_env(env | {"RAGWARDEN_FLAT_CACHE_MB": "0"}, warehouse="s3://bucket/wh", policy=None)
    assert settings.flat_cache_mb == 0
    assert settings.warehouse == "s3://bucket/wh"
    assert (settings.policy, settings.data_dir, settings.max_file_bytes) == ("p.csv", Path("/data"), 10)


def test_ingest_and_embedding_knobs_come_from_the_environment():
    env = {"RAGWARDEN_EMBED_DEVICE": "cpu", "RAGWARDEN_EMBED_BATCH_SIZE": "64", "RAGWARDEN_WRITE_BATCH_DOCS": "8",
           "RAGWARDEN_RAY_ACTORS": "3"}  # fmt: skip
    settings = Settings.from_env(env)
    assert (settings.embed_device, settings.embed_batch_size, settings.write_batch_docs, settings.ray_actors) == ("cpu", 64, 8, 3)
    assert (Settings().embed_device, Settings().embed_batch_size, Settings().ray_actors) == ("auto", None, None)
    assert Settings().ingest_maintenance and not Settings.from_env({"RAGWARDEN_INGEST_MAINTENANCE": "0"}).ingest_maintenance


@pytest.mark.parametrize(
    ("env", "overrides", "message"),
    [
        ({"RAGWARDEN_MAX_FILE_BYTES": "lots"}, {}, "RAGWARDEN_MAX_FILE_BYTES must be a whole number"),
        ({}, {"embed_batch_size": 0}, "embed_batch_size must be at least 1"),
        ({}, {"chunk_overlap": -1}, "chunk_overlap must be at least 0"),
        ({"RAGWARDEN_FLAT_CACHE_MB": "big"}, {}, "RAGWARDEN_FLAT_CACHE_MB must be a whole number of MiB"),
        ({"RAGWARDEN_FLAT_CACHE_MB": "-1"}, {}, "flat_cache_mb must be at least 0"),
        ({"RAGWARDEN_RAY_ACTORS": "0"}, {}, "ray_actors must be at least 1"),
        ({"RAGWARDEN_EMBED_BATCH_SIZE": "many"}, {}, "RAGWARDEN_EMBED_BATCH_SIZE must be a whole number of texts"),
    ],
)
def test_bad_settings_are_refused_naming_the_setting(env, overrides, message):
    with pytest.raises(ConfigurationError, match=message):
        Settings.from_env(env, **overrides)
