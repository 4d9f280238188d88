"""The propagation rule (DESIGN §4): the tags of a row derived from parents.

A derived row is visible only to a subject who could see every parent, so its ACL clauses are
the parents' clauses conjoined; denies and labels are unions, the classification the maximum,
and all parents must share one tenant.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import InvalidValueError
from .tags import GovernanceTags


def propagate(parents: Sequence[GovernanceTags]) -> GovernanceTags:
    """Tags of a row derived from ``parents``; ValueError if there are none or tenants differ."""
    if not parents:
        raise InvalidValueError("a derived row needs at least one parent")
    tenants = {p.tenant for p in parents}
    if len(tenants) != 1:
        raise InvalidValueError(f"parents span several tenants ({', '.join(sorted(tenants))}); derive within one tenant")
    clauses = {clause for parent in parents for clause in parent.acl_clauses}
    return GovernanceTags(
        tenant=parents[0].tenant,
        acl_clauses=tuple(clauses),
        acl_deny=frozenset().union(*(p.acl_deny for p in parents)),
        labels=frozenset().union(*(p.labels for p in parents)),
        classification=max(p.classification for p in parents),
    )
