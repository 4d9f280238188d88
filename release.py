"""This release: the name its distribution has on the package index, and its version.

The import name is ``ragwarden``; the distribution is ``ragwarden-datalayer``, because the name
``ragwarden`` on the package index belongs to an unrelated project. Install from a checkout
(``pip install -e .``, as ``make demo`` does) or by this name.
"""

from __future__ import annotations

from importlib import metadata

DISTRIBUTION = "ragwarden-datalayer"


def version(unknown: str = "0+unknown") -> str:
    """The installed release's version; ``unknown`` when run from a checkout never installed."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return unknown
