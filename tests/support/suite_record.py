"""Records what a whole run of the suite did (how many tests passed, skipped and failed, in how
long, on how many cores and test processes, when) to the JSON file ``RAGWARDEN_RECORD_SUITE``
names: ``make test`` sets it, and the README's figures are rendered from the record
(``bench/figures.py``)."""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

RECORD = "RAGWARDEN_RECORD_SUITE"
_started: list[float] = []


def pytest_sessionstart(session: pytest.Session) -> None:
    _started.append(time.monotonic())


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    target = os.environ.get(RECORD)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    worker = hasattr(session.config, "workerinput")  # a pytest-xdist worker: the controller counts every worker's tests
    if not target or reporter is None or not _started or worker:
        return
    counts = {outcome: len(reporter.stats.get(outcome, [])) for outcome in ("passed", "skipped", "failed", "error")}
    workers = getattr(session.config.option, "numprocesses", None) or 0
    record = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "cpus": os.cpu_count(), "workers": workers,
              "seconds": round(time.monotonic() - _started[0], 1), "exit_status": int(exitstatus),
              "passed": counts["passed"], "skipped": counts["skipped"], "failed": counts["failed"] + counts["error"]}  # fmt: skip
    Path(target).parent.mkdir(parents=True, exist_ok=True)
    Path(target).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
