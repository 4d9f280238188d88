"""The layout is the architecture: imports flow one way, and the public surface is declared."""

from __future__ import annotations

import ast
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
    (wheel,) = tmp_path.glob("ragwarden-*.whl")
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
