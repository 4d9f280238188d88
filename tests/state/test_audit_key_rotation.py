"""Rotating the audit key: writers under the new key and writers still under the old one share one
log that verifies whole under the key ring (the new key, the old one retired); a log opened with
the new key alone refuses to write; and a seal taken once every writer runs the new key fences
the retired key, so whoever still holds it can neither start a chain nor extend one unnoticed."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.audit_writers import journaled_log, receipt

from ragwarden.config import Settings
from ragwarden.errors import ConfigurationError
from ragwarden.state import AuditLog

OLD, NEW = b"the audit key of 2025, rotated out", b"the audit key of 2026"


def write(log: AuditLog, *numbers: int) -> None:
    for n in numbers:
        log.append(receipt(n))


@pytest.fixture
def rotated(tmp_path: Path) -> tuple[Path, AuditLog, AuditLog]:
    """A log begun under the old key, then written by a writer under the new key (the old one
    retired) while the old writer still writes, as during a rolling restart."""
    old = journaled_log(tmp_path, key=OLD)
    write(old, 1, 2, 3)
    new = journaled_log(tmp_path, key=NEW, retired_keys=[OLD])
    write(new, 4, 5, 6)
    write(old, 7, 8)  # a replica not restarted yet
    return tmp_path, old, new


def test_chains_under_the_old_and_the_new_key_verify_as_one_log_under_the_ring(rotated) -> None:
    folder, _, new = rotated
    report = new.verify()
    assert report.ok and (report.receipts, report.chains) == (8, 2), report.problems
    assert journaled_log(folder, key=NEW, retired_keys=[OLD]).verify(checkpoint=False).ok  # any process with the ring


def test_without_the_retired_key_the_old_chain_is_reported_and_the_log_refuses_writes(rotated) -> None:
    folder, _, _ = rotated
    alone = journaled_log(folder, key=NEW)
    report = alone.verify(checkpoint=False)
    assert not report.ok
    assert any("created with a different HMAC key" in problem for problem in report.problems)
    assert sum("edited or forged" in problem for problem in report.problems) == 5  # the old chain's receipts
    with pytest.raises(ConfigurationError, match="different HMAC key"):
        alone.append(receipt(9))


def test_the_seal_fences_the_retired_key_against_a_new_chain_and_against_growth(rotated) -> None:
    folder, old, new = rotated
    root = new.verify().checkpoint.root  # every writer runs the new key now: this checkpoint is the seal
    sealed = journaled_log(folder, key=NEW, retired_keys=[OLD], seal=root)
    assert sealed.verify(checkpoint=False).ok
    write(sealed, 9)  # the new key writes on after the seal
    assert sealed.verify(checkpoint=False).ok

    leaked = journaled_log(folder, key=OLD)  # whoever kept the old key starts a chain of their own
    write(leaked, 10)
    write(old, 11)  # and the old writer's chain grows past the seal
    problems = sealed.verify(checkpoint=False).problems
    assert any("not bound by the seal" in problem for problem in problems), problems
    assert any("changed since the seal (the seal binds seq 5, the chain ends at seq 6)" in problem for problem in problems)
    assert journaled_log(folder, key=NEW, retired_keys=[OLD]).verify(checkpoint=False).ok  # unsealed, the ring alone cannot tell


def test_a_seal_no_checkpoint_of_the_log_has_is_reported(rotated) -> None:
    folder, _, _ = rotated
    report = journaled_log(folder, key=NEW, retired_keys=[OLD], seal="ab" * 32).verify(checkpoint=False)
    assert not report.ok and any("no checkpoint of that root is in the log" in p for p in report.problems)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RAGWARDEN_AUDIT_RETIRED_KEYS": "old"}, "RAGWARDEN_AUDIT_RETIRED_KEYS is not JSON"),
        ({"RAGWARDEN_AUDIT_RETIRED_KEYS": '["old", 7]'}, "must be a JSON list of keys"),
    ],
)
def test_retired_keys_come_from_the_environment_as_a_json_list(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Settings.from_env(env)
    settings = Settings.from_env({"RAGWARDEN_AUDIT_KEY": "new", "RAGWARDEN_AUDIT_RETIRED_KEYS": '["old", "older"]'})
    assert (settings.audit_key, settings.audit_retired_keys) == (b"new", (b"old", b"older"))


def test_a_key_listed_twice_or_a_malformed_seal_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="listed twice"):
        journaled_log(tmp_path, key=NEW, retired_keys=[NEW])
    with pytest.raises(ConfigurationError, match="is not a checkpoint root"):
        journaled_log(tmp_path, key=NEW, retired_keys=[OLD], seal="not-a-root")
