"""How the suite runs in parallel (pytest-xdist; ``make test`` runs ``-n 2``).

The tests of one module go to one worker, in their order: a module's fixtures (an S3 server, a
compose stack, replicas, a warehouse built once) are then built once, not once per worker that
drew one of its tests, and a module whose last test stops what the others share keeps it last.
The crash, load and soak tests (``tests/reliability``) all go to one worker, one after another,
so no two of them fight over the same cores while they time kills and count failures.

The groups are made by a scheduler of our own rather than by ``xdist_group`` marks: xdist reads
those marks by rewriting each test's node id, which pytest 9 no longer lets it do, so with
``--dist loadgroup`` every test was silently sent on its own.
"""

from __future__ import annotations

import pytest
from xdist.scheduler import LoadScopeScheduling

SERIAL = "reliability"
"""The folder whose tests run one after another on one worker."""


def group_of(nodeid: str) -> str:
    """The worker group of a test, by its node id: its module's, or ``SERIAL``'s."""
    module = nodeid.split("::", 1)[0]
    return SERIAL if SERIAL in module.split("/")[:-1] else module


class GroupScheduling(LoadScopeScheduling):
    """xdist's scope scheduling (whole groups to one worker, the largest first) by ``group_of``."""

    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid)


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> GroupScheduling | None:
    """Every distributed run but ``--dist each`` is scheduled by group."""
    return None if config.getvalue("dist") == "each" else GroupScheduling(config, log)
