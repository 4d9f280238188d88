"""A rolling upgrade from the previous tagged release, with every request counted.

The previous release (its git tag, installed into a virtual environment of its own) writes the
demo warehouse and serves it from two replicas under a looping client: searches by three people
and notes written. The new release starts on the same warehouse and is not ready until
``ragwarden migrate`` runs, which it does while the old replicas serve; then it serves, and the old
replicas are stopped one at a time (each taken out of the client's rotation first, as a load
balancer drains it). No request to a live replica fails, no answer holds a row its caller may not
read (the independent oracle over the final rows), every note acknowledged and every search
answered has its row and its receipt, and the audit chain verifies across both releases.
"""

from __future__ import annotations

import io
import json
import subprocess
import sysconfig
import tarfile
import threading
import time
import venv
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from support.demo_world import DEMO_CORPUS, REPO
from support.oracle import ORACLE_COLUMNS, oracle_visible, world_of_policy
from support.raw_tables import raw_table
from support.replicas import CLI, Balancer, Replica, ready_within, replica_env

from ragwarden.config import Settings
from ragwarden.governance.audit import fingerprint
from ragwarden.policies import policy_file
from ragwarden.state import WRITES
from ragwarden.warehouse import Warehouse

PREVIOUS = "v0.1"
"""The release before this one (CHANGELOG.md): the one a rolling upgrade starts from."""
PEOPLE = ("alice", "bob", "dave")

pytestmark = pytest.mark.slow  # installs the previous release and starts four server processes: about a minute


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's ``ragwarden``, installed from its tag into a virtual environment of
    its own; its dependencies (the same pins) are read from this environment's packages."""
    tagged = subprocess.run(["git", "-C", str(REPO), "tag", "--list", PREVIOUS], capture_output=True, text=True)
    if tagged.returncode != 0 or PREVIOUS not in tagged.stdout.split():
        pytest.skip(f"the tag {PREVIOUS} is not in this clone (git fetch --tags): the previous release cannot be installed")
    folder = tmp_path_factory.mktemp("previous-release")
    archive = subprocess.run(["git", "-C", str(REPO), "archive", PREVIOUS], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder / "src", filter="data")
    venv.EnvBuilder(with_pip=True).create(folder / "venv")
    python = folder / "venv" / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())  # fmt: skip
    (site / "shared_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8")
    for step in (["uninstall", "-q", "-y", "setuptools"],  # the shared one, which reads this pyproject's license
                 ["install", "-q", "--no-deps", "--no-build-isolation", "--no-index", str(folder / "src")]):  # fmt: skip
        subprocess.run([python, "-m", "pip", *step], check=True, capture_output=True)
    installed = subprocess.run([python, "-c", "import ragwarden, ragwarden.release as r; print(r.version(), ragwarden.__file__)"],
                               capture_output=True, text=True, check=True, cwd=folder).stdout.split()  # fmt: skip
    assert installed[0] == PREVIOUS.removeprefix("v") + ".0" and str(folder) in installed[1], installed
    return folder / "venv" / "bin" / "ragwarden"


class UpgradeClient(Balancer):
    """Loops over the replicas in rotation as a load balancer would (``Balancer``): searches by each
    person (each query its own text, to find its receipt) and notes written by alice. A request to
    a replica being drained may fail and goes to the next; any other failure counts."""

    def __init__(self, rotation: list[Replica], headers: Callable[[str], dict[str, str]], parent: str) -> None:
        super().__init__()
        self.rotation = rotation
        self.headers = {person: headers(person) for person in PEOPLE}
        self.parent = parent
        self.answered: list[tuple[str, str, list[str]]] = []  # (person, query, chunk ids)
        self.saved: list[str] = []
        self.served_by: dict[int, int] = {}

    def run(self) -> None:
        with httpx.Client(timeout=60, limits=httpx.Limits(max_keepalive_connections=0)) as client:
            n = 0
            while self.going():
                n += 1
                person = PEOPLE[n % len(PEOPLE)] if n % 4 else "alice"
                query = f"salary bands and the budget, request {n}"

                def request(replica: Replica) -> httpx.Response:
                    if n % 4:
                        return client.post(f"{replica.url}/v1/search", json={"query": query, "k": 5}, headers=self.headers[person])
                    return client.post(f"{replica.url}/v1/derive", headers=self.headers["alice"],
                                       json={"text": f"upgrade note {n}", "parents": [self.parent], "kind": "note"})  # fmt: skip

                rotation = list(self.rotation)
                turn = n % len(rotation)
                answered = self.send(rotation[turn:] + rotation[:turn], request, f"request {n}")
                if answered is None:
                    continue
                replica, response = answered
                if n % 4:
                    self.answered.append((person, query, [hit["chunk_id"] for hit in response.json()["hits"]]))
                else:
                    self.saved.append(response.json()["chunk_id"])
                self.served_by[replica.port] = self.served_by.get(replica.port, 0) + 1


def test_a_rolling_upgrade_from_the_previous_release_fails_no_request_leaks_nothing_and_keeps_every_write(
    previous_release: Path, tmp_path: Path, onnx_worker_env: dict[str, str], mint: Callable[..., str]
) -> None:
    uri, env, logs = str(tmp_path / "warehouse"), replica_env(onnx_worker_env), tmp_path / "logs"
    logs.mkdir()
    for command in (["policy", "install", str(policy_file("demo.csv"))], ["ingest", str(DEMO_CORPUS)]):
        done = subprocess.run([previous_release, *command, "--warehouse", uri], env={**env}, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
    old = [Replica(uri, env, logs, cli=previous_release) for _ in range(2)]
    for replica in old:
        replica.start()
    new = Replica(uri, env, logs)
    try:
        headers = lambda person: {"Authorization": f"Bearer {mint(person, exp=int(time.time()) + 3600)}"}  # noqa: E731
        first = httpx.post(f"{old[0].url}/v1/search", json={"query": "salary bands", "k": 1}, headers=headers("alice"), timeout=60)
        client = UpgradeClient(list(old), headers, parent=first.json()["hits"][0]["chunk_id"])
        loop = threading.Thread(target=client.run)
        loop.start()
        try:
            time.sleep(2)
            new.start(ready=False)  # alive, and not ready: the warehouse is at the previous release's format
            refused = httpx.get(f"{new.url}/readyz", timeout=10)
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "warehouse_format", refused.text
            migrated = subprocess.run([CLI, "migrate", "--json", "--warehouse", uri], env={**env}, capture_output=True, text=True)
            assert migrated.returncode == 0, migrated.stderr[-2000:]
            assert json.loads(migrated.stdout)["now"] == WRITES
            ready = ready_within(new.url, 30)
            assert ready.status_code == 200, ready.text
            after_migration = dict(client.served_by)
            client.rotation.append(new)
            time.sleep(2)
            for replica in old:  # drained one at a time: out of the rotation, then stopped
                client.stopping.add(replica.port)
                client.rotation.remove(replica)
                replica.stop()
                time.sleep(2)
        finally:
            client.done.set()
            loop.join(120)
    finally:
        for replica in (*old, new):
            replica.stop()

    assert not client.failures, client.failures[:5]
    assert len(client.saved) >= 5 and len(client.answered) >= 20, (len(client.saved), len(client.answered))
    assert all(client.served_by.get(r.port, 0) > after_migration.get(r.port, 0) for r in old), "the old replicas served on after the migration"
    assert client.served_by.get(new.port, 0) > 0

    upgraded = Warehouse(Settings(warehouse=uri))
    assert sorted(upgraded.store.chunks.rows(client.saved)) == sorted(set(client.saved)), "an acknowledged note is missing"
    rows = raw_table(upgraded.store).search().select(ORACLE_COLUMNS).limit(None).to_list()
    world = world_of_policy(policy_file("demo.csv").read_text(encoding="utf-8"))
    registry = upgraded.store.registries.clauses()
    visible = {person: oracle_visible(world, f"user:{person}", "acme", rows, registry) for person in PEOPLE}
    leaks = [(person, chunk) for person, _, chunks in client.answered for chunk in chunks if chunk not in visible[person]]
    assert not leaks, leaks[:5]
    recorded = {r.query_fingerprint for r in upgraded.audit.query(operation="search")}
    missing = [query for _, query, _ in client.answered if fingerprint(query) not in recorded]
    assert not missing, f"{len(missing)} answered searches have no receipt: {missing[:3]}"
    verified = subprocess.run([CLI, "audit", "verify", "--warehouse", uri], env={**env}, capture_output=True, text=True)
    assert verified.returncode == 0, verified.stdout[-2000:] + verified.stderr[-2000:]
    print(f"\nrolling upgrade {PREVIOUS} -> this release: {client.attempts} requests, {len(client.answered)} searches, "
          f"{len(client.saved)} notes, 0 failed, 0 leaked, every receipt present")  # fmt: skip
