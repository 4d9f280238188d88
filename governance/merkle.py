"""A Merkle tree hash over audit chain heads, as RFC 6962 (certificate transparency) defines it.

Leaves and inner nodes are hashed under different prefixes (0x00, 0x01), so no inner node can be
passed off as a leaf; the tree splits at the largest power of two below its size. A checkpoint's
root thus commits to every chain's head at once: changing, adding or dropping one changes it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence

EMPTY_ROOT = hashlib.sha256(b"").hexdigest()
"""The root of a tree without leaves (RFC 6962: the hash of the empty string)."""


def leaf_hash(data: bytes) -> bytes:
    """RFC 6962's leaf hash: sha256 of 0x00 and the leaf's bytes."""
    return hashlib.sha256(b"\x00" + data).digest()


def tree_root(leaves: Sequence[bytes]) -> str:
    """RFC 6962's Merkle tree hash (hex) over leaf hashes, in the order given."""
    if not leaves:
        return EMPTY_ROOT
    return _tree_hash(leaves).hex()


def _tree_hash(nodes: Sequence[bytes]) -> bytes:
    if len(nodes) == 1:
        return nodes[0]
    split = 1 << ((len(nodes) - 1).bit_length() - 1)
    return hashlib.sha256(b"\x01" + _tree_hash(nodes[:split]) + _tree_hash(nodes[split:])).digest()


def merkle_root(heads: Iterable[tuple[str, int, str]]) -> str:
    """The root over chain ``heads`` ((chain, seq, hash) each, a leaf of canonical JSON apiece),
    taken in chain order."""
    leaves = [
        leaf_hash(json.dumps(list(head), separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass"))
        for head in sorted(heads)
    ]
    return tree_root(leaves)
