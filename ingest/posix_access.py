"""Who may read a file, by the POSIX permissions the kernel would check on the way to it.

``ingest --acl-from posix`` turns a file's metadata into an allow list and a deny list of
principals (``user:NAME``, ``group:NAME``, ``everyone``). Mode bits alone are not that answer: a
0644 file in a 0700 home folder is not world-readable, and an extended ACL (``setfacl``) can let
in or keep out users and groups the mode never names. So the reader here walks the whole path:

- **The whole path, up to ``/``.** Opening a file needs search (x) on every folder the kernel
  looks names up in, from ``/`` down, and read (r) on the file. Stopping at the folder the caller
  named would trust folders above it that may well be private (a 0700 home), so every ancestor
  of the file's real path (symbolic links resolved) counts. Other routes to the same inode (a hard
  link, a bind mount) are not searched: leaving them out can only keep readers out, never let
  one in.
- **Each step by the POSIX.1e access check.** Per file or folder, for a process of user ``u`` in
  groups ``G``: the owner entry if ``u`` owns it; else ``u``'s named-user entry, masked; else, if
  the owning group or a named group is in ``G``, access when any of those matching entries
  (masked) grants, refusal when none does; else the "other" entry. A class that matches decides:
  the owner gets only the owner bits and a matching group only the group bits, even where
  "other" would grant. One place where Linux differs, by granting more: when the group-class
  bits (the mask) are all clear it skips the ACL, so named users and groups fall to "other".
  POSIX.1e refuses them there, and so does this check: right under either reading.
- **The ACL from the ``system.posix_acl_access`` extended attribute, parsed here.** The format is
  small and documented (``linux/posix_acl_xattr.h``: a little-endian u32 version 2, then entries
  of tag u16, perm u16, id u32). The one library for it, ``pylibacl``, ships no wheels (it
  compiles against libacl's headers), and ``getfacl`` would be a process per file; neither is
  worth a build or run-time dependency for forty lines of ``struct``. Where the attribute and the
  mode disagree on the owner, group-class or other bits, the intersection is taken (they agree on
  Linux, which keeps them in sync).

**From per-process access to principal lists.** The product decides group membership from its
policy, not ``/etc/group``, so the rule must hold for a subject ``u`` with any groups ``G``. Let a
principal's *own class* at a step be the entry that names it (owner or named user for a user;
owning or named group for a group; "everyone" has none: it is the fallback, "other"). Then:

- **allow** = each user and group named at any step, and ``everyone``, that passes every step by
  its own class, or by "other" where it has none;
- **deny** = each principal whose own class refuses at some step, when an allowed principal could
  admit a subject that holds it and is decided there by that class: for a user, any allowed group
  or ``everyone`` (the user's own entry comes before every group); for a group, any allowed
  principal that has no class of its own at that step (a group entry that grants would win the
  "any matching group" test, and a user's own entry comes first).

This never admits a subject the kernel would refuse (case by case: a refusing user entry is
denied; a refusing group entry decides only when the user has none and no matching group grants,
so it is denied; "other" decides only when nothing matches, and then every allowed principal of
the subject passed by "other"; tests/ingest/test_posix_access.py checks it against the kernel on
random trees). It stays exact for a subject with no groups, and for the common
private case (a 0700 folder of ``alice:alice`` keeps ``user:alice`` allowed, ``group:alice`` off
the deny list). It keeps out more than the kernel where a principal list cannot say "unless": a
member of a denied group whom their own user entry, or another matching group, would have let in.
Root's capabilities (``CAP_DAC_OVERRIDE``) are not modelled: the lists say what the metadata grants.

Anything that cannot be read or named fails closed with ``InvalidSourceError`` naming the file: a
stat or ``getxattr`` failure, a malformed ACL, an NFSv4 ACL (which this check cannot evaluate), a
uid or gid with no name, two ids with one name, or nobody left to read it.
"""

from __future__ import annotations

import errno
import os
import stat
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Literal

from ..errors import InvalidSourceError, InvalidValueError
from ..governance.tags import EVERYONE, allows_nobody
from .records import Acl

ACL_XATTR = "system.posix_acl_access"
NFS4_ACL_XATTR = "system.nfs4_acl"
ACL_XATTR_VERSION = 2
READ, EXECUTE = 4, 1  # ACL permission bits, as in a mode's rwx triplets
_HEADER = struct.Struct("<I")
_ENTRY = struct.Struct("<HHI")
_NO_ACL_ERRNOS = frozenset({errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP})


class Tag(IntEnum):
    """ACL entry tags, as ``linux/posix_acl.h`` numbers them."""

    USER_OBJ = 0x01
    USER = 0x02
    GROUP_OBJ = 0x04
    GROUP = 0x08
    MASK = 0x10
    OTHER = 0x20


@dataclass(frozen=True, kw_only=True)
class AclEntry:
    """One ACL entry: its tag, its rwx bits, and the uid or gid of a named entry (else None)."""

    tag: Tag
    perms: int
    qualifier: int | None


@dataclass(frozen=True, kw_only=True)
class Principal:
    """A user or group by number, or ``everyone`` (POSIX "other"), before names are looked up."""

    kind: Literal["user", "group", "everyone"]
    number: int = -1


@dataclass(frozen=True, kw_only=True)
class Step:
    """One file or folder on the way to a document, with the entries the kernel checks there.

    ``needed`` is READ for the document and EXECUTE (search) for a folder. Named entries are
    ``(id, perms)`` pairs; ``mask`` is None for a file without an extended ACL.
    """

    path: str
    needed: int
    owner: int
    owner_perms: int
    named_users: tuple[tuple[int, int], ...]
    group: int
    group_perms: int
    named_groups: tuple[tuple[int, int], ...]
    mask: int | None
    other_perms: int

    def _grants(self, perms: int, *, masked: bool) -> bool:
        if masked and self.mask is not None:
            perms &= self.mask
        return perms & self.needed == self.needed

    def own_class(self, who: Principal) -> bool | None:
        """Whether the entries naming ``who`` here grant; None when none names it."""
        if who.kind == "user":
            if who.number == self.owner:
                return self._grants(self.owner_perms, masked=False)
            named = [p for uid, p in self.named_users if uid == who.number]
            return self._grants(named[0], masked=True) if named else None
        if who.kind == "group":
            matching = [p for gid, p in self.named_groups if gid == who.number]
            if who.number == self.group:
                matching.append(self.group_perms)
            return any(self._grants(p, masked=True) for p in matching) if matching else None
        return None

    def passes(self, who: Principal) -> bool:
        """``who``'s own class here, or the "other" entry where it has none."""
        verdict = self.own_class(who)
        return self._grants(self.other_perms, masked=False) if verdict is None else verdict

    def named(self) -> Iterable[tuple[Principal, str]]:
        """Every user and group this step names, with the role it names them in."""
        yield Principal(kind="user", number=self.owner), f"owner of {self.path}"
        yield Principal(kind="group", number=self.group), f"group of {self.path}"
        for uid, _ in self.named_users:
            yield Principal(kind="user", number=uid), f"named in the ACL of {self.path}"
        for gid, _ in self.named_groups:
            yield Principal(kind="group", number=gid), f"named in the ACL of {self.path}"


def posix_readers(path: Path, *, origin: str | None = None) -> Acl:
    """The principals ``path``'s POSIX permissions allow and deny (see the module docstring), typed
    through to the row; InvalidSourceError naming ``origin`` (default: the path) if unsure."""
    where = str(path) if origin is None else origin
    try:
        steps = read_steps(path)
        names = _names(steps)
        allow, deny = decide(steps)
        if allows_nobody([allow]):  # refused as any ACL that allows nobody is; said in POSIX's terms
            raise InvalidValueError("no user, group or other may both search every folder above it and read it")
    except ValueError as exc:
        raise InvalidSourceError(where, f"POSIX permissions: {exc}") from None
    return Acl(allow=_sorted_names(allow, names), deny=_sorted_names(deny, names))


def decide(steps: tuple[Step, ...]) -> tuple[frozenset[Principal], frozenset[Principal]]:
    """The allow and deny sets of the module docstring's rule, over every principal the steps name."""
    everyone = Principal(kind="everyone")
    candidates = {who for step in steps for who, _ in step.named()} | {everyone}
    allow = frozenset(who for who in candidates if all(step.passes(who) for step in steps))
    deny = frozenset(who for who in candidates - allow if any(_must_deny(who, step, allow) for step in steps))
    return allow, deny


def _must_deny(who: Principal, step: Step, allow: frozenset[Principal]) -> bool:
    """Whether ``who``'s own class refuses at ``step`` while an allowed principal could admit a
    subject holding ``who`` whom that class decides there (see the module docstring)."""
    if step.own_class(who) is not False:
        return False
    if who.kind == "user":  # a user's own entry comes first, whatever groups the subject holds
        return any(other.kind != "user" for other in allow)
    return any(step.own_class(other) is None for other in allow)


def read_steps(path: Path) -> tuple[Step, ...]:
    """The document, then each folder above its real path up to ``/``; ValueError if unreadable."""
    try:
        real = Path(os.path.realpath(path, strict=True))
    except OSError as exc:
        raise InvalidValueError(f"cannot resolve {path}: {exc.strerror or exc}") from None
    document = read_step(str(real), needed=READ)
    return (document, *(read_step(str(folder), needed=EXECUTE) for folder in real.parents))


def read_step(path: str, *, needed: int) -> Step:
    """One step from ``lstat`` and the ACL attribute; ValueError when either cannot be read."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        raise InvalidValueError(f"cannot stat {path}: {exc.strerror or exc}") from None
    expected = stat.S_ISREG if needed == READ else stat.S_ISDIR
    if not expected(info.st_mode):
        raise InvalidValueError(f"{path} is not a regular {'file' if needed == READ else 'folder'}")
    owner_bits, group_bits, other_bits = (info.st_mode >> 6) & 7, (info.st_mode >> 3) & 7, info.st_mode & 7
    entries = read_acl(path)
    if entries is None:
        return Step(
            path=path,
            needed=needed,
            owner=info.st_uid,
            owner_perms=owner_bits,
            named_users=(),
            group=info.st_gid,
            group_perms=group_bits,
            named_groups=(),
            mask=None,
            other_perms=other_bits,
        )
    base = {e.tag: e.perms for e in entries if e.qualifier is None}
    mask = base.get(Tag.MASK)
    return Step(
        path=path,
        needed=needed,
        owner=info.st_uid,
        owner_perms=base[Tag.USER_OBJ] & owner_bits,
        named_users=tuple((e.qualifier, e.perms) for e in entries if e.tag is Tag.USER and e.qualifier is not None),
        group=info.st_gid,
        group_perms=base[Tag.GROUP_OBJ] if mask is not None else base[Tag.GROUP_OBJ] & group_bits,
        named_groups=tuple((e.qualifier, e.perms) for e in entries if e.tag is Tag.GROUP and e.qualifier is not None),
        mask=None if mask is None else mask & group_bits,
        other_perms=base[Tag.OTHER] & other_bits,
    )


def read_acl(path: str) -> tuple[AclEntry, ...] | None:
    """The access ACL of ``path``, or None when it has none beyond its mode; ValueError otherwise.

    No attribute, or a file system without POSIX ACLs, means the mode is the whole story, unless
    the file system carries NFSv4 ACLs instead, which this check cannot evaluate (refused).
    """
    getxattr: Callable[..., bytes] | None = getattr(os, "getxattr", None)
    if getxattr is None:
        raise InvalidValueError("this platform offers no POSIX ACLs to read (os.getxattr is Linux-only)")
    try:
        return parse_acl_xattr(getxattr(path, ACL_XATTR, follow_symlinks=False))
    except OSError as exc:
        if exc.errno not in _NO_ACL_ERRNOS:
            raise InvalidValueError(f"cannot read the ACL of {path}: {exc.strerror or exc}") from None
        if exc.errno == errno.ENODATA:
            return None
    except ValueError as exc:
        raise InvalidValueError(f"the ACL of {path} is malformed: {exc}") from None
    try:
        getxattr(path, NFS4_ACL_XATTR, follow_symlinks=False)
    except OSError as exc:
        if exc.errno in _NO_ACL_ERRNOS:
            return None
        raise InvalidValueError(f"cannot tell whether {path} has an NFSv4 ACL: {exc.strerror or exc}") from None
    raise InvalidValueError(f"{path} has an NFSv4 ACL, which --acl-from posix cannot evaluate")


def parse_acl_xattr(data: bytes) -> tuple[AclEntry, ...]:
    """Decode a ``system.posix_acl_access`` value; ValueError if it is not a valid access ACL.

    Valid as ``posix_acl_valid`` has it: one owner, owning-group and other entry each, a mask
    whenever a named entry exists and at most one, no id named twice under one tag.
    """
    if len(data) < _HEADER.size or (len(data) - _HEADER.size) % _ENTRY.size:
        raise InvalidValueError(f"{len(data)} bytes is not a 4-byte header followed by 8-byte entries")
    (version,) = _HEADER.unpack_from(data)
    if version != ACL_XATTR_VERSION:
        raise InvalidValueError(f"version {version}, expected {ACL_XATTR_VERSION}")
    entries = []
    for tag, perms, number in _ENTRY.iter_unpack(data[_HEADER.size :]):
        if tag not in Tag._value2member_map_:
            raise InvalidValueError(f"unknown entry tag {tag:#x}")
        if perms & ~7:
            raise InvalidValueError(f"permission bits {perms:#o} beyond rwx")
        named = tag in (Tag.USER, Tag.GROUP)
        entries.append(AclEntry(tag=Tag(tag), perms=perms, qualifier=number if named else None))
    counts = {tag: sum(e.tag is tag for e in entries) for tag in Tag}
    if any(counts[tag] != 1 for tag in (Tag.USER_OBJ, Tag.GROUP_OBJ, Tag.OTHER)) or counts[Tag.MASK] > 1:
        raise InvalidValueError("needs exactly one owner, owning-group and other entry and at most one mask")
    if (counts[Tag.USER] or counts[Tag.GROUP]) and not counts[Tag.MASK]:
        raise InvalidValueError("named entries without a mask entry")
    named_ids = [(e.tag, e.qualifier) for e in entries if e.qualifier is not None]
    if len(set(named_ids)) != len(named_ids):
        raise InvalidValueError("an id named twice")
    return tuple(entries)


def _names(steps: tuple[Step, ...]) -> dict[Principal, str]:
    """The principal string of every user and group the steps name; ValueError if one has none.

    Every named id is looked up, not only those on the lists: an id the account database cannot
    name means the lists may not be what the kernel enforces, so the file is refused.
    """
    import grp  # POSIX-only modules, imported when asked for
    import pwd

    names: dict[Principal, str] = {Principal(kind="everyone"): EVERYONE}
    for step in steps:
        for who, role in step.named():
            if who in names:
                continue
            try:
                name = pwd.getpwuid(who.number).pw_name if who.kind == "user" else grp.getgrgid(who.number).gr_name
            except KeyError:
                kind = "uid" if who.kind == "user" else "gid"
                raise InvalidValueError(f"{kind} {who.number} ({role}) has no name in the account database") from None
            names[who] = f"{who.kind}:{name}"
    seen: dict[str, Principal] = {}
    for who, name in names.items():
        if (other := seen.setdefault(name, who)) != who:
            raise InvalidValueError(f"ids {other.number} and {who.number} are both named {name!r}")
    return names


def _sorted_names(principals: frozenset[Principal], names: dict[Principal, str]) -> tuple[str, ...]:
    return tuple(sorted(names[who] for who in principals))
