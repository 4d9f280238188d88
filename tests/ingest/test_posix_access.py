"""``--acl-from posix``: who the kernel lets read a file becomes its allow and deny lists.

Every tree here is real: folders and files made with ``chmod``, ``chown`` and ``setfacl``. They are
built under a fresh world-searchable folder in the system's temporary folder, not in ``tmp_path``:
pytest's base folder is 0700, so from inside it nobody but its owner may read anything, which the
code under test rightly reports. Tests that ``chown`` run only as root (as here); access is
computed from metadata, and one test checks the lists against the kernel itself by reading as
other users. Tests that need ``setfacl`` skip where it is absent, or fail with
RAGWARDEN_REQUIRE_ACL=1 (``make test``).
"""

from __future__ import annotations

import errno
import grp
import itertools
import os
import pwd
import random
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.raw_tables import raw_table

from ragwarden.ingest import records
from ragwarden.ingest.files import iter_file_sources
from ragwarden.ingest.posix_access import ACL_XATTR, NFS4_ACL_XATTR, AclEntry, Tag, parse_acl_xattr, posix_readers
from ragwarden.ingest.records import Rejected, SourceRecord

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving files to other users (chown) needs root")
UNUSED_ID = 54321  # a uid and gid with no account: checked by the fixture that uses it

Acl = tuple[set[str], set[str]]
ME = f"user:{pwd.getpwuid(os.geteuid()).pw_name}"  # who creates the trees: root where chown is needed
MY_GROUP = f"group:{grp.getgrgid(os.getegid()).gr_name}"
ROOT = {"user:root", "group:root"}  # owners of / and of the temporary folder, searchable by all


@pytest.fixture
def open_root() -> Iterator[Path]:
    """A fresh 0755 folder whose every ancestor lets everyone search it, removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="ragwarden-posix-"))
    try:
        root.chmod(0o755)
        closed = [str(p) for p in root.parents if not os.stat(p).st_mode & stat.S_IXOTH]
        if closed:
            pytest.fail(f"the temporary folder {root} sits under {closed}, which others may not search; set TMPDIR")
        yield root
    finally:
        shutil.rmtree(root)


@pytest.fixture
def setfacl() -> Callable[..., None]:
    """Run the real ``setfacl -m SPEC PATH``; skip where it is absent (fail with RAGWARDEN_REQUIRE_ACL=1)."""
    if shutil.which("setfacl") is None:
        message = "setfacl is not installed (Debian package acl; `make acl-tools` installs it)"
        if os.environ.get("RAGWARDEN_REQUIRE_ACL") == "1":
            pytest.fail(f"{message}, and RAGWARDEN_REQUIRE_ACL=1 requires it")
        pytest.skip(message)

    def run(path: Path, spec: str) -> None:
        subprocess.run(["setfacl", "-m", spec, str(path)], check=True, capture_output=True)

    return run


def make(path: Path, mode: int, *, owner: str | None = None, group: str | None = None, text: str | None = None) -> Path:
    """A folder (``text`` None) or a file at ``path`` with this mode, given to ``owner``/``group`` if named."""
    if text is None:
        path.mkdir()
    else:
        path.write_text(text)
    if owner is not None or group is not None:
        os.chown(path, pwd.getpwnam(owner).pw_uid if owner else -1, grp.getgrnam(group).gr_gid if group else -1)
    path.chmod(mode)
    return path


def outcome_of(path: Path) -> SourceRecord | Rejected:
    (outcome,) = iter_file_sources([path], acl_from="posix", default_tenant="acme")
    assert isinstance(outcome, SourceRecord | Rejected)
    return outcome


def acl_of(path: Path) -> Acl:
    """The (allow, deny) sets ``--acl-from posix`` gives the file; fails the test if it was refused."""
    outcome = outcome_of(path)
    assert isinstance(outcome, SourceRecord), outcome
    return set(outcome.tags.acl_allow), set(outcome.tags.acl_deny)


# --- the whole path counts ----------------------------------------------------------------------


def test_the_readers_stay_typed_from_the_permissions_to_the_row(open_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = make(make(open_root / "team", 0o755) / "plan.txt", 0o644, text="the team plan")
    readers = posix_readers(path)
    assert isinstance(readers, records.Acl) and isinstance(readers.allow, tuple) and readers.allow
    seen: list[object] = []
    parse = records.parse_tags

    def watched(**fields: object):
        seen.append(fields["acl"])
        return parse(**fields)

    monkeypatch.setattr(records, "parse_tags", watched)
    outcome = outcome_of(path)
    assert isinstance(outcome, SourceRecord) and seen == [readers]  # handed over typed, never as a JSON dict
    assert (sorted(outcome.tags.acl_allow), sorted(outcome.tags.acl_deny)) == (sorted(readers.allow), sorted(readers.deny))


def test_a_world_readable_file_in_a_private_folder_is_not_readable_by_everyone(open_root: Path) -> None:
    private = make(open_root / "home", 0o700)
    doc = make(private / "doc.txt", 0o644, text="private after all")
    assert acl_of(doc) == ({ME}, set())


def test_a_private_folder_above_the_folder_passed_in_still_counts(open_root: Path) -> None:
    inner = make(make(open_root / "outer", 0o700) / "inner", 0o755)
    make(inner / "doc.txt", 0o644, text="inner text")
    (record,) = iter_file_sources([inner], acl_from="posix", default_tenant="acme")
    assert isinstance(record, SourceRecord)
    assert (set(record.tags.acl_allow), set(record.tags.acl_deny)) == ({ME}, set())


def test_an_open_path_keeps_owner_group_and_everyone(open_root: Path) -> None:
    doc = make(open_root / "doc.txt", 0o644, text="open")
    assert acl_of(doc) == ({ME, MY_GROUP, "everyone"} | ROOT, set())


# --- extended ACLs ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "folder_entry, file_entry, let_in",
    [("x", "r", True), ("r", "r", False), ("x", "w", False), ("-", "r", False)],
    ids=["search-and-read", "folder-read-is-not-search", "file-write-is-not-read", "no-search"],
)
def test_a_named_user_needs_search_on_the_folder_and_read_on_the_file(
    open_root: Path, setfacl: Callable[..., None], folder_entry: str, file_entry: str, let_in: bool
) -> None:
    private = make(open_root / "home", 0o700)
    doc = make(private / "doc.txt", 0o600, text="shared with daemon by ACL")
    setfacl(private, f"u:daemon:{folder_entry}")
    setfacl(doc, f"u:daemon:{file_entry}")
    assert acl_of(doc) == ({ME, "user:daemon"} if let_in else {ME}, set())


@pytest.mark.parametrize("mask, daemon_reads", [("r", True), ("x", False)])
def test_the_mask_limits_a_named_user_entry_even_where_other_may_read(
    open_root: Path, setfacl: Callable[..., None], mask: str, daemon_reads: bool
) -> None:
    doc = make(open_root / "doc.txt", 0o604, text="masked")
    setfacl(doc, f"u:daemon:r,m::{mask}")
    allow, deny = acl_of(doc)
    assert "everyone" in allow
    assert ("user:daemon" in allow, "user:daemon" in deny) == (daemon_reads, not daemon_reads)


def test_a_named_group_entry_lets_its_members_in(open_root: Path, setfacl: Callable[..., None]) -> None:
    private = make(open_root / "home", 0o700)
    doc = make(private / "doc.txt", 0o600, text="shared with staff by ACL")
    setfacl(private, "g:staff:x")
    setfacl(doc, "g:staff:r")
    assert acl_of(doc) == ({ME, "group:staff"}, set())


def test_a_named_group_entry_that_refuses_is_denied_though_other_may_read(
    open_root: Path, setfacl: Callable[..., None]
) -> None:
    doc = make(open_root / "doc.txt", 0o644, text="not for staff")
    setfacl(doc, "g:staff:-")
    assert acl_of(doc) == ({ME, MY_GROUP, "everyone"} | ROOT, {"group:staff"})


# --- one class shadows the next -----------------------------------------------------------------


@needs_root
def test_an_owner_whose_owner_bits_refuse_is_denied_though_group_and_other_may_read(open_root: Path) -> None:
    doc = make(open_root / "doc.txt", 0o044, owner="daemon", group="daemon", text="owner locked out")
    allow, deny = acl_of(doc)
    assert {"everyone", "group:daemon"} <= allow and "user:daemon" not in allow
    assert deny == {"user:daemon"}


@needs_root
def test_the_owner_reads_by_the_owner_bits_while_the_owning_group_is_denied(open_root: Path) -> None:
    doc = make(open_root / "doc.txt", 0o604, owner="daemon", group="staff", text="owner and world, not staff")
    allow, deny = acl_of(doc)
    assert {"everyone", "user:daemon"} <= allow
    assert deny == {"group:staff"}


@needs_root
def test_a_private_folder_does_not_deny_the_owners_own_group_to_the_owner(open_root: Path) -> None:
    home = make(open_root / "daemon", 0o700, owner="daemon", group="daemon")
    doc = make(home / "doc.txt", 0o600, owner="daemon", group="daemon", text="mine")
    assert acl_of(doc) == ({"user:daemon"}, set())


# --- fail closed --------------------------------------------------------------------------------


@pytest.fixture
def unused_id() -> int:
    for lookup in (pwd.getpwuid, grp.getgrgid):
        with pytest.raises(KeyError):
            lookup(UNUSED_ID)
    return UNUSED_ID


@needs_root
def test_an_unresolvable_uid_fails_closed_naming_the_file(open_root: Path, unused_id: int) -> None:
    doc = make(open_root / "doc.txt", 0o644, text="whose?")
    os.chown(doc, unused_id, 0)
    outcome = outcome_of(doc)
    assert isinstance(outcome, Rejected) and outcome.source == str(doc)
    assert outcome.reason == f"POSIX permissions: uid {unused_id} (owner of {doc}) has no name in the account database"


@needs_root
def test_an_unresolvable_gid_of_a_folder_above_fails_closed(open_root: Path, unused_id: int) -> None:
    folder = make(open_root / "folder", 0o755)
    doc = make(folder / "doc.txt", 0o644, text="whose folder?")
    os.chown(folder, 0, unused_id)
    outcome = outcome_of(doc)
    assert isinstance(outcome, Rejected) and outcome.source == str(doc)
    assert f"gid {unused_id} (group of {folder})" in outcome.reason


def test_a_file_nobody_may_read_is_refused(open_root: Path) -> None:
    doc = make(open_root / "doc.txt", 0o000, text="nobody")
    outcome = outcome_of(doc)
    assert isinstance(outcome, Rejected) and outcome.source == str(doc)
    assert outcome.reason.startswith("POSIX permissions: no user, group or other may")


def test_an_unreadable_acl_attribute_fails_closed(open_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = make(open_root / "doc.txt", 0o644, text="unreadable ACL")

    def getxattr(path: str, name: str, *, follow_symlinks: bool = True) -> bytes:
        raise OSError(errno.EIO, os.strerror(errno.EIO), path)

    monkeypatch.setattr(os, "getxattr", getxattr)
    outcome = outcome_of(doc)
    assert isinstance(outcome, Rejected) and outcome.source == str(doc)
    assert outcome.reason == f"POSIX permissions: cannot read the ACL of {doc}: Input/output error"


def test_an_nfs4_acl_it_cannot_evaluate_fails_closed(open_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = make(open_root / "doc.txt", 0o644, text="NFSv4")

    def getxattr(path: str, name: str, *, follow_symlinks: bool = True) -> bytes:
        if name == NFS4_ACL_XATTR:
            return b"\0" * 8
        assert name == ACL_XATTR
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP), path)

    monkeypatch.setattr(os, "getxattr", getxattr)
    outcome = outcome_of(doc)
    assert isinstance(outcome, Rejected) and "NFSv4 ACL" in outcome.reason


# --- the attribute's format ---------------------------------------------------------------------


def test_the_parser_reads_what_setfacl_wrote_as_getfacl_reports_it(
    open_root: Path, setfacl: Callable[..., None]
) -> None:
    doc = make(open_root / "doc.txt", 0o640, text="parsed")
    setfacl(doc, "u:daemon:rx,u:bin:w,g:staff:r,g:nogroup:rwx,m::rx")
    entries = parse_acl_xattr(os.getxattr(doc, ACL_XATTR))
    names = {Tag.USER_OBJ: "user", Tag.USER: "user", Tag.GROUP_OBJ: "group", Tag.GROUP: "group",
             Tag.MASK: "mask", Tag.OTHER: "other"}  # fmt: skip
    ours = {f"{names[e.tag]}:{'' if e.qualifier is None else e.qualifier}:{_rwx(e.perms)}" for e in entries}
    listed = subprocess.run(["getfacl", "-n", "-c", "-E", str(doc)], check=True, capture_output=True, text=True)
    assert ours == {line for line in listed.stdout.splitlines() if line}


def _rwx(perms: int) -> str:
    return "".join(letter if perms & bit else "-" for letter, bit in (("r", 4), ("w", 2), ("x", 1)))


def _xattr(*entries: tuple[int, int, int], version: int = 2) -> bytes:
    return version.to_bytes(4, "little") + b"".join(
        t.to_bytes(2, "little") + p.to_bytes(2, "little") + i.to_bytes(4, "little") for t, p, i in entries
    )


NONE = 0xFFFFFFFF
BASE = ((Tag.USER_OBJ, 6, NONE), (Tag.GROUP_OBJ, 4, NONE), (Tag.OTHER, 4, NONE))


def test_a_minimal_attribute_parses_to_its_three_entries() -> None:
    assert parse_acl_xattr(_xattr(*BASE)) == tuple(
        AclEntry(tag=tag, perms=perms, qualifier=None) for tag, perms, _ in BASE
    )


@pytest.mark.parametrize(
    "data, problem",
    [
        (_xattr(*BASE)[:-1], "is not a 4-byte header followed by 8-byte entries"),
        (_xattr(*BASE, version=1), "version 1"),
        (_xattr(*BASE, (0x40, 4, NONE)), "unknown entry tag"),
        (_xattr(*BASE[:2]), "exactly one owner"),
        (_xattr(*BASE, (Tag.USER, 4, 1)), "without a mask"),
        (_xattr(*BASE, (Tag.USER, 4, 1), (Tag.USER, 0, 1), (Tag.MASK, 7, NONE)), "named twice"),
        (_xattr((Tag.USER_OBJ, 8, NONE), *BASE[1:]), "beyond rwx"),
    ],
    ids=["truncated", "version", "tag", "no-other", "no-mask", "twice", "perms"],
)
def test_a_malformed_attribute_is_refused_saying_why(data: bytes, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_acl_xattr(data)


# --- against the kernel -------------------------------------------------------------------------

USERS = ("daemon", "bin", "sys")
GROUPS = ("daemon", "bin", "staff")
FOLDER_BITS = (0, 1, 1, 5, 5, 7, 4)  # weighted towards search, so that many trees are readable
FILE_BITS = (0, 4, 4, 6, 2)


def _random_tree(rng: random.Random, root: Path, setfacl: Callable[..., None]) -> tuple[Path, bool]:
    """root/a/b/doc.txt, each with a random owner, group, mode and (half the time) extended ACL;
    and whether some step names users or groups under an empty mask (see the test below)."""
    path, empty_mask = root, False
    for name in ("a", "b", "doc.txt"):
        is_file = name == "doc.txt"
        bits = FILE_BITS if is_file else FOLDER_BITS
        mode = rng.choice(bits) << 6 | rng.choice(bits) << 3 | rng.choice(bits)
        owner, group = rng.choice(("root", *USERS)), rng.choice(("root", *GROUPS))
        path = make(path / name, mode, owner=owner, group=group, text="kernel check" if is_file else None)
        if rng.random() < 0.5:
            named = [f"u:{u}:{_rwx(rng.choice(bits))}" for u in rng.sample(USERS, rng.randint(0, 2))]
            named += [f"g:{g}:{_rwx(rng.choice(bits))}" for g in rng.sample(GROUPS, rng.randint(0, 2))]
            mask = rng.choice(bits)
            setfacl(path, ",".join([*named, f"m::{_rwx(mask)}"]))
            empty_mask |= bool(named) and mask == 0
    return path, empty_mask


def _kernel_reads(docs: list[Path], user: str, groups: tuple[str, ...]) -> list[bool]:
    """Whether a process of ``user`` in exactly ``groups`` can open each of ``docs`` for reading."""
    script = 'for f; do if true < "$f" 2>/dev/null; then echo 1; else echo 0; fi; done'
    result = subprocess.run(
        ["/bin/sh", "-c", script, "sh", *map(str, docs)],
        user=pwd.getpwnam(user).pw_uid,
        group=UNUSED_ID,  # a primary group no tree names, so the process's groups are exactly ``groups``
        extra_groups=[grp.getgrnam(g).gr_gid for g in groups],
        capture_output=True,
        text=True,
        check=True,
    )
    return [answer == "1" for answer in result.stdout.split()]


@needs_root
def test_the_lists_never_let_in_a_subject_the_kernel_refuses(
    open_root: Path, setfacl: Callable[..., None], unused_id: int
) -> None:
    """On random trees, every (user, groups) the lists admit can open the file as that user; with
    no groups the lists admit exactly whom the kernel lets in, except where a step names users or
    groups under an empty mask: POSIX.1e refuses them there, and so do the lists, while Linux skips
    the ACL when the group-class bits are all clear and lets them in as "other"."""
    rng = random.Random(20240501)
    trees = [_random_tree(rng, make(open_root / f"t{i}", 0o755), setfacl) for i in range(40)]
    docs = [doc for doc, _ in trees]
    lists = []
    for doc in docs:
        outcome = outcome_of(doc)
        ok = isinstance(outcome, SourceRecord)
        lists.append((set(outcome.tags.acl_allow), set(outcome.tags.acl_deny)) if ok else (set(), set()))
    group_sets = [s for n in range(len(GROUPS) + 1) for s in itertools.combinations(GROUPS, n)]
    admitted = granted = 0
    for user, groups in itertools.product(USERS, group_sets):
        held = {f"user:{user}", "everyone", *(f"group:{g}" for g in groups)}
        for (doc, empty_mask), (allow, deny), kernel in zip(
            trees, lists, _kernel_reads(docs, user, groups), strict=True
        ):
            visible = bool(held & allow) and not held & deny
            assert kernel or not visible, (doc, user, groups, allow, deny)
            if not groups and not empty_mask:
                assert visible == kernel, (doc, user, allow, deny)
            admitted += visible
            granted += kernel
    assert admitted > 0 and granted > admitted  # both answers, and the lists keep some readers out


# --- end to end ---------------------------------------------------------------------------------


def test_posix_ingest_stores_the_lists_and_search_honours_them(
    demo_policy_warehouse, open_root: Path, setfacl: Callable[..., None]
) -> None:
    sidecar = "tenant: acme\nclassification: public\n"  # tenant and level only: the ACL comes from POSIX
    shared = make(open_root / "shared", 0o755)
    team = make(shared / "team.txt", 0o644, text="the offsite plan for everyone but staff")
    setfacl(team, "g:staff:-")
    (shared / "team.txt.acl.yaml").write_text(sidecar)
    private = make(shared / "private", 0o700)
    make(private / "notes.txt", 0o644, text="root's private offsite notes")
    (private / "notes.txt.acl.yaml").write_text(sidecar)

    report = demo_policy_warehouse.ingest(shared, acl_from="posix", tenant="acme")
    assert (report.documents, report.rejected) == (2, ())
    rows = raw_table(demo_policy_warehouse.store).search().select(["doc_id", "acl_allow", "acl_deny"]).to_list()
    stored = {r["doc_id"]: (sorted(r["acl_allow"]), sorted(r["acl_deny"])) for r in rows}
    assert stored == {
        "team.txt": (sorted({"everyone", ME, MY_GROUP} | ROOT), ["group:staff"]),
        "private/notes.txt": ([ME], []),
    }

    def found(subject: str) -> set[str]:
        return {h.doc_id for h in demo_policy_warehouse.search("offsite", subject=subject, tenant="acme", k=5)}

    assert found("user:daemon") == {"team.txt"}  # everyone, and in no denied group
    assert found("user:dave") == set()  # dave -> interns -> staff in the demo policy: denied
    assert found(ME) == {"team.txt", "private/notes.txt"}
