"""The suite's parallel run keeps its groups: a module's tests on one worker in their order, and
every test of ``tests/reliability`` on one worker (``support/parallel.py``). Checked on a small
suite of its own run by real pytest-xdist, since a grouping xdist ignores fails no test by itself:
it only builds each module's servers once per worker and lets the crash tests compete for cores."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from support.parallel import SERIAL, group_of

TESTS = Path(__file__).resolve().parent

WHERE = textwrap.dedent("""
    import os
    from pathlib import Path

    def test_{n}(request):
        with Path(os.environ["WHERE_LOG"]).open("a") as log:
            log.write(f"{{request.node.nodeid}} {{os.environ['PYTEST_XDIST_WORKER']}}\\n")
""")


def test_a_test_s_group_is_its_module_or_the_serial_folder() -> None:
    assert group_of("tests/api/test_http.py::test_x[a::b]") == "tests/api/test_http.py"
    assert group_of("tests/api/test_http.py::TestClass::test_x") == "tests/api/test_http.py"
    assert group_of(f"tests/{SERIAL}/test_load.py::test_x") == SERIAL
    assert group_of(f"tests/test_{SERIAL}.py::test_x") == f"tests/test_{SERIAL}.py"


def test_each_module_runs_on_one_worker_in_order_and_the_serial_folder_on_one(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    (suite / SERIAL).mkdir(parents=True)
    (suite / "conftest.py").write_text('pytest_plugins = ["support.parallel"]\n', encoding="utf-8")
    modules = [suite / f"test_{name}.py" for name in "abcdef"] + [suite / SERIAL / f"test_{name}.py" for name in "xyz"]
    for module in modules:
        module.write_text("".join(WHERE.format(n=n) for n in range(4)), encoding="utf-8")
    log = tmp_path / "where.log"
    # only xdist of the installed plugins: the others would add seconds to each of three processes
    env = os.environ | {"WHERE_LOG": str(log), "PYTHONPATH": str(TESTS), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "xdist", "-n", "2", "-q", "-p", "no:cacheprovider", str(suite)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr

    ran = [line.split() for line in log.read_text(encoding="utf-8").splitlines()]
    assert len(ran) == 4 * len(modules)
    workers: dict[str, set[str]] = {}
    order: dict[str, list[str]] = {}
    for nodeid, worker in ran:
        workers.setdefault(group_of(nodeid), set()).add(worker)
        order.setdefault(nodeid.split("::")[0], []).append(nodeid.rsplit("_", 1)[1])
    assert all(len(where) == 1 for where in workers.values()), workers
    assert len({next(iter(where)) for where in workers.values()}) == 2, "both workers had work"
    assert all(tests == ["0", "1", "2", "3"] for tests in order.values()), order
