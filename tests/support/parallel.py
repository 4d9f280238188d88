"""How the suite runs in parallel (pytest-xdist; ``make test`` runs ``-n 3 --dist loadgroup``).

The tests of one module go to one worker, in their order: a module's fixtures (an S3 server, a
compose stack, replicas, a warehouse built once) are then built once, not once per worker that
drew one of its tests, and a module whose last test stops what the others share keeps it last.
The crash, load and soak tests (``tests/reliability``) all go to one worker, one after another,
so no two of them fight over the same cores while they time kills and count failures.
"""

from __future__ import annotations

import pytest

SERIAL = "reliability"
"""The folder whose tests run one after another on one worker."""


def group_of(item: pytest.Item) -> str:
    """The worker group of a test: its module's, or ``SERIAL``'s."""
    return SERIAL if SERIAL in item.path.parts else item.nodeid.split("::")[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        item.add_marker(pytest.mark.xdist_group(group_of(item)))
