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


@pytest.mark.parametrize(
    ("env", "overrides", "message"),
    [
        ({"RAGWARDEN_MAX_FILE_BYTES": "lots"}, {}, "RAGWARDEN_MAX_FILE_BYTES must be a whole number"),
        ({}, {"embed_batch_size": 0}, "embed_batch_size must be at least 1"),
        ({}, {"chunk_overlap": -1}, "chunk_overlap must be at least 0"),
        ({"RAGWARDEN_FLAT_CACHE_MB": "big"}, {}, "RAGWARDEN_FLAT_CACHE_MB must be a whole number of MiB"),
        ({"RAGWARDEN_FLAT_CACHE_MB": "-1"}, {}, "flat_cache_mb must be at least 0"),
    ],
)
def test_bad_settings_are_refused_naming_the_setting(env, overrides, message):
    with pytest.raises(ConfigurationError, match=message):
        Settings.from_env(env, **overrides)
