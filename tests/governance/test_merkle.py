"""The checkpoint's Merkle tree is RFC 6962's: the certificate-transparency reference vectors hold."""

from __future__ import annotations

import pytest

from ragwarden.governance.merkle import EMPTY_ROOT, leaf_hash, merkle_root, tree_root

# The reference leaves and roots of certificate-transparency's merkle tree tests (tree sizes 0..8).
CT_LEAVES = [b"", b"\x00", b"\x10", b"\x20\x21", b"\x30\x31", b"\x40\x41\x42\x43",
             bytes(range(0x50, 0x58)), bytes(range(0x60, 0x70))]  # fmt: skip
CT_ROOTS = [
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]


@pytest.mark.parametrize("size", range(len(CT_ROOTS)))
def test_the_tree_hash_matches_the_certificate_transparency_reference_roots(size: int) -> None:
    assert tree_root([leaf_hash(data) for data in CT_LEAVES[:size]]) == CT_ROOTS[size]


def test_a_root_over_chain_heads_changes_with_any_head_and_not_with_their_order() -> None:
    heads = [("a1", 3, "f" * 64), ("b2", 9, "e" * 64), ("", 40, "d" * 64)]
    root = merkle_root(heads)
    assert merkle_root(reversed(heads)) == root
    assert merkle_root(heads[:2]) != root  # a chain dropped
    assert merkle_root([("a1", 2, "f" * 64), *heads[1:]]) != root  # a head moved back
    assert merkle_root([("a1", 3, "0" * 64), *heads[1:]]) != root  # a head's hash changed
    assert merkle_root([]) == EMPTY_ROOT
