"""The layout is the architecture: imports flow one way, and the public surface is declared."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

import ragwarden

REPO = Path(__file__).resolve().parents[1]

# subpackage -> ragwarden modules it must never import: the rules know no storage, the state layer
# no caller of it, and the interfaces reach storage only through the face.
FACE = ("ragwarden.warehouse", "ragwarden.gate", "ragwarden.credentials", "ragwarden.provisioning")
FORBIDDEN = {
    "governance": ("ragwarden.ingest", "ragwarden.retrieval", "ragwarden.api", "ragwarden.state", "ragwarden.embedder",
                   "ragwarden.integrations", *FACE),
    "state": ("ragwarden.ingest", "ragwarden.retrieval", "ragwarden.api", "ragwarden.embedder", "ragwarden.integrations",
              *FACE),
    "ingest": ("ragwarden.retrieval", "ragwarden.api", "ragwarden.integrations", *FACE),
    "retrieval": ("ragwarden.ingest", "ragwarden.api", "ragwarden.integrations", *FACE),
    "api": ("ragwarden.integrations", "ragwarden.state"),
    "integrations": ("ragwarden.api", "ragwarden.state"),
}  # fmt: skip
STORAGE_MODULES = ("lancedb", "lance")


def ragwarden_imports(path: Path) -> set[str]:
    """Absolute names of the ragwarden modules a file imports (relative imports resolved)."""
    package = ["ragwarden", *path.parent.relative_to(REPO).parts]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {name for name in names if name.startswith("ragwarden")}


@pytest.mark.parametrize("subpackage", sorted(FORBIDDEN))
def test_imports_flow_one_way(subpackage):
    for path in sorted((REPO / subpackage).rglob("*.py")):
        imported = ragwarden_imports(path)
        bad = sorted(name for name in imported for banned in FORBIDDEN[subpackage] if name == banned or name.startswith(banned + "."))
        assert not bad, f"{path.relative_to(REPO)} imports {bad}"


def test_only_the_state_layer_imports_lancedb():
    """LanceDB and Lance are reached through ``state`` alone: every other module asks it typed questions."""
    outside = [path for path in sorted(REPO.rglob("*.py")) if path.relative_to(REPO).parts[0] not in ("state", "tests", ".venv", "build")]
    offenders = []
    for path in outside:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            offenders += [f"{path.relative_to(REPO)}: {name}" for name in names if name.split(".")[0] in STORAGE_MODULES]
    assert not offenders, offenders
    assert any((REPO / "state").rglob("*.py")), "the state layer is missing"


def test_public_names_are_all_exported():
    assert "open" in ragwarden.__all__
    for name in ragwarden.__all__:
        assert hasattr(ragwarden, name), name
    assert all(issubclass(getattr(ragwarden, n), ragwarden.RagwardenError) for n in ragwarden.__all__ if n.endswith("Error"))


def test_policies_and_demo_data_ship_with_the_package():
    from ragwarden.policies import policy_file

    assert "[matchers]" in policy_file("model.conf").read_text()
    assert policy_file("demo.csv").is_file()


def test_the_wheel_ships_the_console_policies_facets_and_integrations(tmp_path):
    import subprocess
    import sys
    import zipfile

    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(REPO)],
                   check=True, capture_output=True, timeout=300)  # fmt: skip
    (wheel,) = tmp_path.glob("ragwarden_datalayer-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {f"ragwarden/api/console_static/{name}" for name in ("index.html", "console.js", "console.css")} | {
        "ragwarden/policies/model.conf", "ragwarden/policies/demo.csv", "ragwarden/integrations/langchain.py",
        "ragwarden/integrations/llamaindex.py", "ragwarden/examples/demo/corpus.jsonl",
    }  # fmt: skip
    assert shipped <= names, sorted(shipped - names)
    assert not [n for n in names if n.startswith(("ragwarden/tests/", "tests/"))], "tests must not ship"


IO_MODULES = ("threading", "fcntl", "atexit", "socket", "lancedb", "lance")


def test_the_rules_hold_no_io():
    """``governance/`` is the rules (tags, the policy, receipts and their hash rule, what lineage
    events say): no threads, locks on files, exit hooks, sockets or storage; the services that keep
    their results (the audit log's writer, the lineage spool and delivery) live elsewhere."""
    offenders = []
    for path in sorted((REPO / "governance").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            offenders += [f"{path.relative_to(REPO)}: {name}" for name in names if name.split(".")[0] in IO_MODULES]
    assert not offenders, offenders


def _product_modules() -> list[Path]:
    return [path for path in sorted(REPO.rglob("*.py")) if path.relative_to(REPO).parts[0] not in ("tests", ".venv", "build")]


def test_state_is_reached_through_its_package_alone():
    """Outside ``state/``, no module imports one of state's modules: what state offers is what
    ``state/__init__.py`` exports, so its rooms can be rearranged behind one surface."""
    offenders = []
    for path in _product_modules():
        if path.relative_to(REPO).parts[0] == "state":
            continue
        reached = {name.split(".")[2] for name in ragwarden_imports(path) if name.startswith("ragwarden.state.")}
        submodules = {module.stem for module in (REPO / "state").glob("*.py")}
        offenders += [f"{path.relative_to(REPO)}: ragwarden.state.{name}" for name in sorted(reached & submodules)]
    assert not offenders, offenders


# Each wing is handed the doors it uses (``Store.read_doors`` / ``write_doors``), never the store.
WING_DOORS = {
    "retrieval": {"ReadDoors", "ChunkReads", "RegistryReads", "Registries"},
    "ingest": {"WriteDoors", "ChunksSnapshot", "ChunkWrite", "DocumentKey"},
}
DOORS = {"Store", "ReadDoors", "WriteDoors", "ChunkReads", "Chunks", "RegistryReads", "RegistryTables", "Sources",
         "Policies", "Maintenance", "ChunksSnapshot", "ChunkWrite", "DocumentKey", "Registries"}  # fmt: skip


@pytest.mark.parametrize("wing", sorted(WING_DOORS))
def test_each_wing_names_only_the_doors_it_is_handed(wing):
    named = set()
    for path in sorted((REPO / wing).rglob("*.py")):
        named |= {name.removeprefix("ragwarden.state.") for name in ragwarden_imports(path) if name.startswith("ragwarden.state.")}
    assert named & DOORS <= WING_DOORS[wing], sorted(named & DOORS - WING_DOORS[wing])


def _calls_through(folder: str, door: str) -> dict[str, list[str]]:
    """Methods ``folder``'s modules call on a door named ``door`` (``x.door.m()`` or ``door.m()``), by module."""
    found: dict[str, list[str]] = {}
    for path in sorted((REPO / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                if (isinstance(owner, ast.Attribute) and owner.attr == door) or (isinstance(owner, ast.Name) and owner.id == door):
                    found.setdefault(node.func.attr, []).append(f"{path.relative_to(REPO)}:{node.lineno}")
    return found


def test_retrieval_never_writes_chunks_nor_registers_tokens():
    """What only the write doors offer (``Chunks`` beyond ``ChunkReads``, ``RegistryTables`` beyond
    ``RegistryReads``) is never called from ``retrieval/``."""
    from ragwarden.state import ChunkReads, Chunks, RegistryReads, RegistryTables

    for door, (reads, writes) in {"chunks": (ChunkReads, Chunks), "registries": (RegistryReads, RegistryTables)}.items():
        writing = {name for name in vars(writes) if not name.startswith("_")} - set(vars(reads))
        called = _calls_through("retrieval", door)
        assert called, f"no call through {door} found: the check would pass vacuously"
        assert not writing & called.keys(), {name: called[name] for name in writing & called.keys()}


def test_ingest_never_reads_through_the_serving_index():
    """Ingest plans from snapshots of the table, never from the serving index or its artifacts,
    which are derived and may lag the table."""
    reading = _calls_through("ingest", "chunks")
    assert reading and "read_latest" not in reading
    for path in sorted((REPO / "ingest").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        assert "RESIDENT_INDEX" not in text and "artifacts" not in text, path.relative_to(REPO)


BUILTIN_ERRORS = ("ValueError", "RuntimeError", "Exception")


def test_no_bare_builtin_error_reaches_a_caller():
    """What ragwarden raises on purpose is a ``RagwardenError`` (a malformed value is an
    ``InvalidValueError``, which is also a ``ValueError``), so one ``except`` catches it and the
    HTTP layer answers it with its status, not a 500."""
    offenders = []
    for path in sorted(REPO.rglob("*.py")):
        if path.relative_to(REPO).parts[0] in ("tests", "bench", ".venv", "build"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Raise) and node.exc is not None:
                raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                if isinstance(raised, ast.Name) and raised.id in BUILTIN_ERRORS:
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno} raises {raised.id}")
    assert not offenders, offenders


def test_identity_stands_apart_from_the_face_and_the_interfaces_reach_storage_through_it():
    """``credentials.py`` imports neither the face nor the state layer (the face hands it the API
    keys); ``gate.py`` nothing of retrieval; ``api/`` and ``integrations/`` never reach past the
    face into its storage (``.store``, ``.audit``, ``.openlineage``)."""
    assert not {name for name in ragwarden_imports(REPO / "credentials.py")
                if name.startswith(("ragwarden.warehouse", "ragwarden.state", "ragwarden.api_keys"))}  # fmt: skip
    assert not {name for name in ragwarden_imports(REPO / "gate.py") if name.startswith("ragwarden.retrieval")}
    reaching = []
    for folder in ("api", "integrations"):
        for path in sorted((REPO / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Attribute) and node.attr in ("store", "audit", "openlineage"):
                    reaching.append(f"{path.relative_to(REPO)}:{node.lineno} .{node.attr}")
    assert not reaching, reaching


def test_the_design_the_code_cites_is_in_the_repository_with_every_section_it_cites():
    """Code and docs cite "DESIGN §N": docs/design.md is that document, and holds each §N cited."""
    sections = set(re.findall(r"^## (\d+)\. ", (REPO / "docs" / "design.md").read_text(encoding="utf-8"), flags=re.MULTILINE))
    cited: dict[str, set[str]] = {}
    for folder, subfolders, files in os.walk(REPO):
        subfolders[:] = [name for name in subfolders if not name.startswith(".") and name not in {"build", "__pycache__"}]
        for path in (Path(folder) / name for name in files if name.endswith((".py", ".md", ".conf", ".csv"))):
            for number in re.findall(r"DESIGN (?:§|section )(\d+)", path.read_text(encoding="utf-8", errors="replace")):
                cited.setdefault(number, set()).add(str(path.relative_to(REPO)))
    assert cited, "nothing cites the design: the pattern is wrong"
    assert not {n: files for n, files in cited.items() if n not in sections}, sections
