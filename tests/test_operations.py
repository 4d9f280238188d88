"""The operating procedures of docs/operations.md, each run as the document gives it.

Backup and restore run the document's commands (``ragwarden backup``, ``ragwarden restore``,
``ragwarden audit verify``) against real warehouses, a folder and an S3 prefix on moto's S3 server
on 127.0.0.1, and check that several callers' searches answer byte for byte as before (a restore in
place moves version numbers forward, so there ``table_version`` is set aside; a warehouse rebuilt
from its backup keeps them, so there it is compared too). Key rotation runs against two live
``ragwarden serve`` replicas restarted one at a time while clients keep calling.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from click.testing import CliRunner, Result
from support.demo_world import DEMO_CORPUS, demo_world
from support.identity_provider import AUDIENCE, ISSUER
from support.moto_s3 import MotoS3, s3_holding
from support.published_keys import PublishedKeys, SigningKey
from support.replicas import Balancer, Replica
from test_object_storage import aws_env

from ragwarden.api.cli import main
from ragwarden.config import AuthSettings, Settings
from ragwarden.embedder import Embedder
from ragwarden.errors import AuthenticationError, ConfigurationError
from ragwarden.governance.audit import fingerprint
from ragwarden.policies import policy_file
from ragwarden.state import audit_log
from ragwarden.warehouse import Warehouse

BUCKET = "ragwarden-operations"
CALLERS = (("user:alice", "acme"), ("user:bob", "acme"), ("user:carol", "acme"), ("user:dave", "acme"),
           ("user:erin", "globex"))  # fmt: skip
QUERIES = (("salary bands and the pay review", "vector"), ("FY2027 operating budget", "hybrid"), ("contract", "fts"))
ARRIVAL = {"id": "acme-pub-099", "text": "Salary bands and the FY2027 operating budget contract were announced today.",
           "tenant": "acme", "acl": {"allow": ["everyone"]}, "labels": [], "classification": "public"}  # fmt: skip
TIGHTENED = {"id": "acme-fin-002", "tenant": "acme", "acl": {"allow": ["user:olivia"]}, "labels": ["finance"],
             "classification": "confidential"}  # fmt: skip


# -- places, commands and answers -----------------------------------------------------------------


@dataclass(frozen=True)
class Place:
    """Where a warehouse, its backup and an empty location to rebuild it in live, and the
    environment an operator sets to reach them."""

    warehouse: str
    backup: str
    elsewhere: str
    env: dict[str, str] = field(default_factory=dict)

    def settings(self, warehouse: str | None = None) -> Settings:
        return Settings.from_env(self.env, warehouse=warehouse or self.warehouse)


@pytest.fixture(scope="module")
def s3() -> Iterator[MotoS3]:
    """moto's S3 server, holding the bucket of the S3 warehouses and their backups."""
    with s3_holding(BUCKET) as server:
        yield server


@pytest.fixture(params=["folder", "s3"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Place:
    """A warehouse in a local folder, or under a prefix of the S3 bucket, with its backup beside
    (``s3, backup in a folder``: the backup of the S3 warehouse in a local folder)."""
    if request.param == "folder":
        return Place(str(tmp_path / "warehouse"), str(tmp_path / "backup"), str(tmp_path / "rebuilt"))
    root = f"s3://{BUCKET}/{uuid.uuid4().hex}"
    backup = str(tmp_path / "backup") if request.param == "s3, backup in a folder" else f"{root}/backup"
    return Place(f"{root}/warehouse", backup, f"{root}/rebuilt", aws_env(request.getfixturevalue("s3")))


@pytest.fixture
def folder(tmp_path: Path) -> Place:
    return Place(str(tmp_path / "warehouse"), str(tmp_path / "backup"), str(tmp_path / "rebuilt"))


def ragwarden(place: Place, *args: str, warehouse: str | None = None, ok: bool = True) -> Result:
    """Run a ``ragwarden`` command as the document gives it, on the place's warehouse (or another)."""
    result = CliRunner().invoke(main, [*args, "--warehouse", warehouse or place.warehouse], env=place.env)
    if ok:
        assert result.exit_code == 0, result.output
    return result


def built(place: Place, embedder: Embedder) -> Warehouse:
    """The demo corpus under the demo policy, in the place's warehouse."""
    warehouse = Warehouse(place.settings(), embedder=embedder)
    warehouse.install_policy(policy_file("demo.csv"))
    assert warehouse.ingest(DEMO_CORPUS).ok
    return warehouse


def answers(place: Place, embedder: Embedder, *, warehouse: str | None = None, versions: bool = False) -> dict[str, str]:
    """What every caller's searches answer, from a warehouse opened afresh (as a new process would):
    by caller, mode and query, the bytes of the answer (each hit's every field as JSON,
    ``table_version`` only with ``versions``)."""
    opened = Warehouse(place.settings(warehouse), embedder=embedder)
    found = {}
    for subject, tenant in CALLERS:
        for query, mode in QUERIES:
            hits = opened.search(query, subject=subject, tenant=tenant, k=5, mode=mode)
            shown = [{k: v for k, v in hit.as_dict().items() if versions or k != "table_version"} for hit in hits]
            found[f"{subject}@{tenant} {mode} {query!r}"] = json.dumps(shown, sort_keys=True, ensure_ascii=False)
    return found


def change_everything(warehouse: Warehouse) -> None:
    """What happens after a backup: a document arrives, a budget's ACL is tightened, a note is saved
    from a chunk, and the document that arrived is erased."""
    assert warehouse.ingest_records([ARRIVAL]).ok
    warehouse.sync([TIGHTENED])
    parent = warehouse.search("salary bands", subject="user:bob", tenant="acme", k=1)[0].chunk_id
    warehouse.derive("Pay review notes: salary bands to be revisited.", parents=[parent], subject="user:bob", tenant="acme")
    warehouse.forget(ARRIVAL["id"], reason="published by mistake")


def restore_receipts(warehouse: Warehouse, tenant: str) -> list[Any]:
    return [r for r in warehouse.receipts(caller=None, tenant=tenant, operation="admin") if r.reason.startswith("restored")]


# -- 1. backup and restore ------------------------------------------------------------------------


def test_a_restore_from_a_backup_answers_every_search_as_before_and_keeps_the_audit_log(place, embedder):
    warehouse = built(place, embedder)
    before = answers(place, embedder)
    ragwarden(place, "backup", place.backup)
    change_everything(warehouse)
    assert answers(place, embedder) != before, "positive control: the changes show in the answers"

    restored = ragwarden(place, "restore", "--from", place.backup)
    assert "chunks:" in restored.output and "sources:" in restored.output

    assert answers(place, embedder) == before
    verified = ragwarden(place, "audit", "verify")
    assert "intact" in verified.output
    kept = {r.operation for r in warehouse.receipts(caller=None, tenant="acme", doc_id=ARRIVAL["id"])}
    assert {"ingest", "forget"} <= kept, "the receipts of what the restore undid stay in the log"
    assert len(restore_receipts(warehouse, "acme")) == 1 and len(restore_receipts(warehouse, "globex")) == 1


def test_a_restore_from_a_backup_whose_version_the_history_still_holds_takes_it_from_there(folder, embedder):
    """With no erasure since the backup, the backup's versions are still whole in the warehouse's
    own history: they are made the latest again (indexes and all), nothing is copied back."""
    warehouse = built(folder, embedder)
    before = answers(folder, embedder)
    ragwarden(folder, "backup", folder.backup)
    assert warehouse.ingest_records([ARRIVAL]).ok
    warehouse.sync([TIGHTENED])

    restored = ragwarden(folder, "restore", "--from", folder.backup)

    assert "chunks: history" in restored.output and "sources: history" in restored.output
    assert answers(folder, embedder) == before


def test_a_restore_to_a_time_before_the_changes_answers_every_search_as_then(place, embedder):
    warehouse = built(place, embedder)
    before = answers(place, embedder)
    moment = datetime.now(timezone.utc)
    assert warehouse.ingest_records([ARRIVAL]).ok
    warehouse.sync([TIGHTENED])
    parent = warehouse.search("salary bands", subject="user:bob", tenant="acme", k=1)[0].chunk_id
    warehouse.derive("Pay review notes.", parents=[parent], subject="user:bob", tenant="acme")
    assert answers(place, embedder) != before, "positive control: the changes show in the answers"

    ragwarden(place, "restore", "--to-time", moment.isoformat())

    assert answers(place, embedder) == before
    assert "intact" in ragwarden(place, "audit", "verify").output
    assert restore_receipts(warehouse, "acme")


def test_a_restore_to_a_time_before_an_erasure_is_refused_naming_the_window_and_changes_nothing(folder, embedder):
    warehouse = built(folder, embedder)
    moment = datetime.now(timezone.utc)
    warehouse.forget("acme-hr-001", reason="erasure request 42")
    version = warehouse.table_version

    refused = ragwarden(folder, "restore", "--to-time", moment.isoformat(), ok=False)

    assert refused.exit_code == 1
    assert "emptied by an erasure" in refused.output and "restorable from" in refused.output
    assert "ragwarden restore --from BACKUP" in refused.output
    assert warehouse.table_version == version


def test_a_restore_from_a_backup_never_brings_back_a_document_erased_since(folder, embedder):
    warehouse = built(folder, embedder)
    ragwarden(folder, "backup", folder.backup)
    bob_sees = {h.doc_id for h in warehouse.search("salary bands", subject="user:bob", tenant="acme", k=32)}
    assert "acme-hr-001" in bob_sees, "positive control: bob reads the erased document before the erasure"
    warehouse.forget("acme-hr-001", reason="erasure request 42")

    restored = ragwarden(folder, "restore", "--from", folder.backup)

    assert "erased again: acme-hr-001 (acme)" in restored.output
    reopened = Warehouse(folder.settings(), embedder=embedder)
    after = {h.doc_id for h in reopened.search("salary bands", subject="user:bob", tenant="acme", k=32)}
    assert "acme-hr-001" not in after and after == bob_sees - {"acme-hr-001"}
    record = next(json.loads(line) for line in DEMO_CORPUS.read_text(encoding="utf-8").splitlines() if '"acme-hr-001"' in line)
    again = reopened.ingest_records([record])
    assert not again.ok and "was erased" in again.rejected[0].reason
    assert restore_receipts(reopened, "acme")[0].doc_ids == ("acme-hr-001",)
    assert restore_receipts(reopened, "globex")[0].doc_ids == ()


@pytest.mark.parametrize("place", ["folder", "s3", "s3, backup in a folder"], indirect=True)
def test_a_lost_warehouse_rebuilt_from_its_backup_answers_byte_for_byte_and_holds_every_receipt(
    place, embedder, monkeypatch
):
    """The backup is taken while a writer's receipts wait in the journal (folded by time every
    second; here never, so that they surely do): the copy holds them, and the rebuilt warehouse's log
    verifies against the checkpoint recorded before the backup."""
    monkeypatch.setattr(audit_log, "FOLD_AFTER_S", 3600.0)
    warehouse = built(place, embedder)
    root = ragwarden(place, "audit", "verify").output.rsplit("checkpoint ", 1)[1].strip()
    before = answers(place, embedder, versions=True)
    taken = json.loads(ragwarden(place, "backup", place.backup, "--json").output)
    assert taken["receipts_folded"] > 0, "the searches' receipts were still in the journal"

    ragwarden(place, "restore", "--from", place.backup, warehouse=place.elsewhere)

    assert answers(place, embedder, warehouse=place.elsewhere, versions=True) == before
    assert "intact" in ragwarden(place, "audit", "verify", "--expect-head", root, warehouse=place.elsewhere).output
    rebuilt = Warehouse(place.settings(place.elsewhere), embedder=embedder)
    searched = {r.query_fingerprint for r in rebuilt.receipts(caller=None, tenant="acme", operation="search")}
    assert {fingerprint(query) for query, _ in QUERIES} <= searched
    assert restore_receipts(rebuilt, "acme") and warehouse.document_count() == rebuilt.document_count()


def test_a_backup_refuses_a_destination_that_holds_something(folder, embedder):
    built(folder, embedder)
    ragwarden(folder, "backup", folder.backup)
    again = ragwarden(folder, "backup", folder.backup, ok=False)
    assert again.exit_code == 1 and "is not empty" in again.output
    nothing = ragwarden(folder, "restore", "--from", folder.elsewhere, ok=False)
    assert nothing.exit_code == 1 and "holds no complete backup" in nothing.output


# -- 2. key rotation ------------------------------------------------------------------------------


def test_the_previous_hs256_secret_is_accepted_beside_the_secret_and_nothing_else_is(fresh_warehouse):
    old, new, other = b"o" * 40, b"n" * 40, b"x" * 40
    auth = AuthSettings.from_env({"RAGWARDEN_JWT_SECRET": new.decode(), "RAGWARDEN_JWT_PREVIOUS_SECRET": old.decode(),
                                  "RAGWARDEN_JWT_ISSUER": ISSUER, "RAGWARDEN_JWT_AUDIENCE": AUDIENCE})  # fmt: skip
    assert "o" * 40 not in repr(auth)
    keys = fresh_warehouse.authenticator(auth)
    for secret in (new, old):
        token = IdentityProviderNow(secret=secret, key=SigningKey("unused")).hs256("alice")
        assert keys.verify(token).subject == "user:alice"
    with pytest.raises(AuthenticationError, match="signature does not verify"):
        keys.verify(IdentityProviderNow(secret=other, key=SigningKey("unused")).hs256("alice"))
    with pytest.raises(ConfigurationError, match="RAGWARDEN_JWT_PREVIOUS_SECRET is accepted beside RAGWARDEN_JWT_SECRET"):
        AuthSettings(jwt_previous_secret=old, issuer=ISSUER, audience=AUDIENCE)
    with pytest.raises(ConfigurationError, match="RAGWARDEN_JWT_PREVIOUS_SECRET must be at least 32 bytes"):
        AuthSettings(jwt_secret=new, jwt_previous_secret=b"short", issuer=ISSUER, audience=AUDIENCE)


@dataclass
class IdentityProviderNow:
    """What the identity provider signs with at this moment: an HS256 secret and an ES256 key."""

    secret: bytes
    key: SigningKey

    def claims(self, sub: str) -> dict[str, Any]:
        now = int(time.time())
        return {"sub": sub, "tenant": "acme", "iss": ISSUER, "aud": AUDIENCE, "iat": now, "nbf": now, "exp": now + 600}

    def hs256(self, sub: str) -> str:
        return jwt.encode(self.claims(sub), self.secret, algorithm="HS256")

    def es256(self, sub: str) -> str:
        return self.key.sign(self.claims(sub))


class KeepCalling(Balancer):
    """Clients searching through two replicas, one with HS256 tokens and one with ES256 tokens from
    the provider's current keys, as a load balancer would (``Balancer``): a request to a replica
    being restarted is sent to the other; any other failure (a refused token included) counts."""

    def __init__(self, replicas: tuple[Replica, Replica], provider: IdentityProviderNow) -> None:
        super().__init__()
        self.replicas = replicas
        self.provider = provider
        self.answered = 0
        self._threads = [threading.Thread(target=self._run, args=(token,)) for token in (provider.hs256, provider.es256)]

    def __enter__(self) -> KeepCalling:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        for thread in self._threads:
            thread.join(120)

    def _run(self, token: Callable[[str], str]) -> None:
        with httpx.Client(timeout=60, limits=httpx.Limits(max_keepalive_connections=0)) as client:
            n = 0
            while self.going():
                n += 1
                headers = {"Authorization": f"Bearer {token('alice')}"}

                def search(replica: Replica) -> httpx.Response:
                    return client.post(f"{replica.url}/v1/search", json={"query": "salary bands", "k": 3}, headers=headers)

                if self.send(self.replicas if n % 2 else self.replicas[::-1], search, f"search {n}") is not None:
                    self.answered += 1

    def calls(self, count: int, timeout: float = 120.0) -> None:
        """Wait until ``count`` more searches are answered (the clients are at work in this step)."""
        target, deadline = self.answered + count, time.monotonic() + timeout
        while self.answered < target and time.monotonic() < deadline and not self.failures:
            time.sleep(0.05)
        assert self.answered >= target or self.failures, f"the clients answered {self.answered} of {target} in {timeout} s"


def restart(replica: Replica, env: dict[str, str], clients: KeepCalling) -> None:
    """Restart one replica with new settings, as a rolling restart does (SIGTERM drains it first)."""
    clients.stopping.add(replica.port)
    replica.stop()
    replica.env = env
    replica.start()
    clients.stopping.discard(replica.port)


@pytest.mark.slow
def test_jwt_keys_rotate_under_load_without_a_failed_request(tmp_path_factory, embedder, onnx_worker_env):
    """The rotations of the document at once: the HS256 secret (the previous one accepted beside
    the new during the overlap), the JWKS key (the provider publishes both during the overlap) and
    the audit key (the old one retired, then sealed), in the same rolling restarts."""
    old_audit, new_audit = b"the audit key before the rotation", b"the audit key after the rotation"
    warehouse = demo_world(tmp_path_factory.mktemp("rotation"), embedder, audit_key=old_audit)
    old_secret, new_secret = b"old-secret-" + b"o" * 32, b"new-secret-" + b"n" * 32
    current, upcoming = SigningKey("2026-a"), SigningKey("2026-b")
    published = PublishedKeys()
    published.publish(current)
    provider = IdentityProviderNow(secret=old_secret, key=current)
    logs = tmp_path_factory.mktemp("rotation-logs")

    def env(audit: dict[str, str], **auth: bytes) -> dict[str, str]:
        return onnx_worker_env | audit | {"HF_HUB_OFFLINE": "1", "RAGWARDEN_POLICY": "", "RAGWARDEN_JWT_ISSUER": ISSUER,
                                          "RAGWARDEN_JWT_AUDIENCE": AUDIENCE, "RAGWARDEN_JWT_JWKS": published.url,
                                          **{f"RAGWARDEN_JWT_{name.upper()}": value.decode() for name, value in auth.items()}}  # fmt: skip

    before = {"RAGWARDEN_AUDIT_KEY": old_audit.decode()}
    ring = {"RAGWARDEN_AUDIT_KEY": new_audit.decode(), "RAGWARDEN_AUDIT_RETIRED_KEYS": json.dumps([old_audit.decode()])}
    replicas = (Replica(warehouse.uri, env(before, secret=old_secret), logs), Replica(warehouse.uri, env(before, secret=old_secret), logs))
    try:
        for replica in replicas:
            replica.start()
        with KeepCalling(replicas, provider) as clients:
            clients.calls(10)
            # 1. the provider publishes the next key beside the current one; each replica restarts
            #    with the new secret, the current one accepted as the previous
            published.publish(current, upcoming)
            for replica in replicas:
                restart(replica, env(ring, secret=new_secret, previous_secret=old_secret), clients)
                clients.calls(10)
            #    every writer runs the new audit key now: a checkpoint taken with the ring is the seal
            seal = Warehouse(Settings.from_env(ring, warehouse=warehouse.uri), embedder=embedder).verify_audit(caller=None)
            assert seal.ok, seal.problems[:5]
            sealed = ring | {"RAGWARDEN_AUDIT_KEY_SEAL": seal.checkpoint.root}
            # 2. the provider signs with the new secret and the next key
            provider.secret, provider.key = new_secret, upcoming
            clients.calls(20)
            # 3. once every token of the old ones has expired: the old key withdrawn, the previous secret dropped
            published.publish(upcoming)
            for replica in replicas:
                restart(replica, env(sealed, secret=new_secret), clients)
                clients.calls(10)
        assert not clients.failures, clients.failures[:5]
        audit = Warehouse(Settings.from_env(sealed, warehouse=warehouse.uri), embedder=embedder).verify_audit(caller=None)
        assert audit.ok and audit.chains >= 5, audit.problems[:5]  # the first writer, two old replicas, two new ones

        old = IdentityProviderNow(secret=old_secret, key=current)
        for replica in replicas:  # the old secret and key are refused now: the rotation happened
            for token in (old.hs256("alice"), old.es256("alice")):
                refused = httpx.get(f"{replica.url}/v1/whoami", headers={"Authorization": f"Bearer {token}"}, timeout=30)
                assert refused.status_code == 401, refused.text
    finally:
        for replica in replicas:
            replica.stop()
        published.stop()
