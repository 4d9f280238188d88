"""The policy: a Casbin RBAC-with-domains model plus rules, parsed strictly and versioned.

Rule files are CSV (``p, group:finance, acme, label:pii, read, allow``); values holding a
comma, a quote or `` #`` are double-quoted. Each line is validated before Casbin sees it, so a
bad line is refused with its number rather than silently ignored, and a role chain deeper than
Casbin's hierarchy limit (which Casbin would silently deny) is refused too.

Policy work is linear in the policy's size, however its groups nest: a policy comes from callers
(``PUT /v1/policy``), so its cost must be bounded by its length. Line validation alone
(``parse_rules(..., check_graph=False)``, then ``tenants_of``) is enough to learn which tenants a
policy names, so that a caller's right to install it can be checked before anything costlier.
"""

from __future__ import annotations

import contextlib
import csv
import gc
import hashlib
import io
import logging
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

import casbin
from casbin.rbac import RoleManager

from ..errors import InvalidPolicyError, PolicyError
from ..policies import policy_file
from .operations import GRANTED_OPERATIONS
from .tags import EVERYONE, Classification, group_problem, label_problem, principal_problem, tenant_problem

OPERATIONS = GRANTED_OPERATIONS
EFFECTS = frozenset({"allow", "deny"})
# Casbin's default hierarchy limit (10) resolves chains of at most 9 memberships; deeper ones
# would be silently denied, so they are refused when the policy is loaded.
MAX_ROLE_DEPTH = 9
MAX_REMEMBERED_ANSWERS = 100_000
# A subject's reach is as big as the groups it holds (thousands, in a wide policy): fewer are kept.
MAX_REMEMBERED_REACHES = 1_000

Verdict = Literal["allow", "deny", "none"]
_K = TypeVar("_K", bound=Hashable)
_V = TypeVar("_V")


@dataclass(frozen=True, kw_only=True, slots=True)
class Rule:
    """One policy line: ``ptype`` is ``p`` or ``g``; ``line`` its number in the source;
    ``origin`` where it came from: ``POLICY`` (a line of the text), ``TOKEN`` (a membership the
    caller's token claimed), or else the provisioned group that made it (``with_provisioned``)."""

    ptype: str
    values: tuple[str, ...]
    line: int
    origin: str = "policy"


_UNLOGGED = logging.Logger("ragwarden.casbin-checks", level=logging.CRITICAL + 1)  # noqa: LOG001 - kept out of the registry on purpose
"""A logger outside logging's registry (so no ``dictConfig`` reaches it) that logs nothing."""

POLICY = "policy"
"""The origin of a line of the policy's text."""
TOKEN = "token"
"""The origin of a membership a token's groups claim named (``Policy.with_memberships``)."""


def _object_problem(obj: str, act: str) -> str | None:
    kind, sep, rest = obj.partition(":")
    if sep and kind == "label":
        problem = label_problem(rest)
        if problem:
            return problem
        return None if act == "read" else f"label rules take the action read, not {act!r}"
    if sep and kind == "classification":
        try:
            Classification.parse(rest)
        except ValueError as exc:
            return str(exc)
        return None if act == "read" else f"classification rules take the action read, not {act!r}"
    if obj in OPERATIONS:
        return None if act in ("read", "execute") else f"operation rules take the action read or execute, not {act!r}"
    return (
        f"object {obj!r} is neither label:NAME, classification:LEVEL nor an operation "
        f"({', '.join(sorted(OPERATIONS))})"
    )


def _strip_comment(line: str) -> str:
    """Drop a ``#`` comment that starts the line or follows a space, outside double quotes."""
    if "#" not in line:
        return line
    quoted = False
    for index, char in enumerate(line):
        if char == '"':
            quoted = not quoted
        elif char == "#" and not quoted and (index == 0 or line[index - 1].isspace()):
            return line[:index].rstrip()
    return line


def _canonical(values: list[str]) -> list[str]:
    """Write classification objects in the one spelling Casbin is asked for (lower case)."""
    if len(values) > 2 and values[2].startswith("classification:"):
        level = values[2].partition(":")[2]
        values = [*values[:2], f"classification:{Classification.parse(level).label}", *values[3:]]
    return values


def _rule_problem(ptype: str, values: list[str]) -> str | None:
    if ptype == "p":
        if len(values) != 5:
            return f"a p rule has 5 fields (subject, tenant, object, action, allow|deny), found {len(values)}"
        sub, dom, obj, act, eft = values
        problem = principal_problem(sub) or tenant_problem(dom) or _object_problem(obj, act)
        if problem:
            return problem
        if eft not in EFFECTS:
            return f"effect {eft!r} is neither allow nor deny"
        return None
    if ptype == "g":
        if len(values) != 3:
            return f"a g rule has 3 fields (member, group, tenant), found {len(values)}"
        member, group, dom = values
        problem = principal_problem(member) or principal_problem(group) or tenant_problem(dom)
        if problem:
            return problem
        if member == EVERYONE:
            return f"{EVERYONE} cannot join a group; grant rules to {EVERYONE} directly"
        if not group.startswith("group:"):
            return f"{group!r} is not a group; only group:NAME can have members"
        return None
    return f"unknown rule type {ptype!r}; use p (permission) or g (membership)"


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a policy's structures are built.

    They are acyclic and live as long as the policy, so the collector's passes over them during
    the build find nothing; yet in a small process they cost more than the build itself (a full
    pass over everything alive each time the heap grows by a quarter). Reference counting still
    frees what the build drops. The collector is left as it was found: an application that turned
    it off keeps it off.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _fields(line: str) -> list[str]:
    """One line's fields, stripped. A line with no quote (nearly every line) is split on its
    commas, which is what the CSV reader returns for it at a fraction of the cost; a line with a
    quote, or long enough for the reader's field size limit to matter, is read as CSV."""
    if '"' not in line and len(line) <= csv.field_size_limit():
        return [field.strip() for field in line.split(",")]
    return [field.strip() for field in next(csv.reader([line], skipinitialspace=True, strict=True))]


@_collector_paused()
def parse_rules(text: str, source: str = "<policy>", *, check_graph: bool = True) -> list[Rule]:
    """Parse and validate policy text; raise InvalidPolicyError naming every bad line at once.

    ``check_graph=False`` validates each line only (linear, and no more than a caller needs to
    learn the tenants the policy names, ``tenants_of``); the role graph is checked whenever a
    ``Policy`` is built from the rules, so skipping it here never lets a cycle into force.
    """
    rules: list[Rule] = []
    problems: list[tuple[int, str]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = _strip_comment(raw.strip())
        if not line:
            continue
        try:
            fields = _fields(line)
        except csv.Error as exc:
            problems.append((number, f"not valid CSV ({exc})"))
            continue
        problem = _rule_problem(fields[0], fields[1:])
        if problem:
            problems.append((number, problem))
            continue
        rules.append(Rule(ptype=fields[0], values=tuple(_canonical(fields[1:])), line=number))
    if problems:
        (line, reason), *more = problems
        raise InvalidPolicyError(source, line, reason, more=tuple(more))
    if check_graph:
        _check_role_graph(rules, source)
    return rules


def tenants_of(rules: Iterable[Rule]) -> frozenset[str]:
    """The tenants ``rules`` name: a membership's third field, a permission's second."""
    return frozenset(rule.values[2] if rule.ptype == "g" else rule.values[1] for rule in rules)


def _check_role_graph(rules: Iterable[Rule], source: str) -> None:
    """Refuse membership cycles and chains deeper than Casbin resolves, in O(rules).

    One depth-first walk over the (tenant, name) graph that remembers, for each name it has
    finished, the longest chain of memberships above it; a name is finished once, so each
    membership is followed once. The walk visits members and their groups in the order the policy
    first names them, so the membership it refuses is the one a walk along every path would meet
    first: the edge back into the path it is on (a cycle, named by the group it reaches), or the
    first membership, coming back down, with more than ``MAX_ROLE_DEPTH`` memberships from its
    member to the top (named by that member). Iterative, so a chain of any length is refused
    rather than overflowing the interpreter's stack.
    """
    groups_of: dict[tuple[str, str], list[Rule]] = {}
    for rule in rules:
        if rule.ptype == "g":
            member, _, dom = rule.values
            groups_of.setdefault((dom, member), []).append(rule)
    depth: dict[tuple[str, str], int] = {}  # finished names: the longest chain of memberships above them
    for start in list(groups_of):
        if start in depth:
            continue
        on_path = {start}
        stack = [_Walk(start)]
        while stack:
            walk = stack[-1]
            dom, name = walk.node
            memberships = groups_of.get(walk.node, [])
            if walk.next == len(memberships):
                depth[walk.node] = walk.deepest
                on_path.discard(walk.node)
                stack.pop()
                continue
            rule = memberships[walk.next]
            group = rule.values[1]
            above = (dom, group)
            if above in on_path:
                raise InvalidPolicyError(source, rule.line, f"membership cycle through {group!r} in tenant {dom!r}")
            if above not in depth:
                on_path.add(above)
                stack.append(_Walk(above))  # this membership is weighed when its group is finished
                continue
            level = 1 + depth[above]
            if level > MAX_ROLE_DEPTH:
                raise InvalidPolicyError(
                    source, rule.line, f"group nesting deeper than {MAX_ROLE_DEPTH} levels from {name!r} in {dom!r}"
                )
            walk.next, walk.deepest = walk.next + 1, max(walk.deepest, level)


@dataclass(slots=True)
class _Walk:
    """One name on the role graph walk's path: the next of its memberships to follow, and the
    longest chain of memberships above it found so far."""

    node: tuple[str, str]  # (tenant, name)
    next: int = 0
    deepest: int = 0


def _remember(answers: dict[_K, _V], key: _K, compute: Callable[[], _V], limit: int = MAX_REMEMBERED_ANSWERS) -> _V:
    """``answers[key]``, computed once; the memo is emptied when it holds ``limit`` answers, so
    that asking about ever new names (every request may name another subject) cannot grow it
    without bound."""
    if key in answers:
        return answers[key]
    value = compute()
    if len(answers) >= limit:
        answers.clear()
    answers[key] = value
    return value


class _RoleGraph(RoleManager):
    """The memberships as Casbin's role manager (its extension point for how ``g`` is answered).

    Casbin's matcher asks ``g(subject, p.sub, tenant)`` of every rule, and pycasbin's domain
    manager answers each by walking everything the subject reaches: a question cost rules x
    groups held (seconds, for a subject in a few thousand groups). Here a subject's reach is
    walked once and remembered, so ``g`` is a set lookup. Same answers: a name links to itself,
    and to every group within ``max_depth`` memberships (Casbin's hierarchy limit less one),
    which the role graph check makes every group it reaches at all.
    """

    def __init__(self, max_depth: int = MAX_ROLE_DEPTH) -> None:
        self.max_depth = max_depth
        self.clear()

    def clear(self) -> None:
        self._groups_of: dict[tuple[str, str], list[str]] = {}  # (tenant, member) -> its groups, in file order
        self._members_of: dict[tuple[str, str], list[str]] = {}  # (tenant, group) -> its members
        self._reach: dict[tuple[str, str], frozenset[str]] = {}

    def add_link(self, name1: str, name2: str, *domain: str) -> None:
        tenant = domain[0] if domain else ""
        self._groups_of.setdefault((tenant, name1), []).append(name2)
        self._members_of.setdefault((tenant, name2), []).append(name1)
        if self._reach:
            self._reach.clear()

    def delete_link(self, name1: str, name2: str, *domain: str) -> None:
        tenant = domain[0] if domain else ""
        self._groups_of.get((tenant, name1), []).remove(name2)
        self._members_of.get((tenant, name2), []).remove(name1)
        self._reach.clear()

    def has_link(self, name1: str, name2: str, *domain: str) -> bool:
        return name1 == name2 or name2 in self.reach(name1, domain[0] if domain else "")

    def get_roles(self, name: str, *domain: str) -> list[str]:
        return list(self._groups_of.get((domain[0] if domain else "", name), ()))

    def get_users(self, name: str, *domain: str) -> list[str]:
        return list(self._members_of.get((domain[0] if domain else "", name), ()))

    def reach(self, name: str, tenant: str) -> frozenset[str]:
        """Every group ``name`` holds in ``tenant`` within ``max_depth`` memberships."""

        def walk() -> frozenset[str]:
            held: set[str] = set()
            frontier = [name]
            for _ in range(self.max_depth):
                frontier = [group for member in frontier for group in self._groups_of.get((tenant, member), ())]
                frontier = [group for group in dict.fromkeys(frontier) if group not in held]
                if not frontier:
                    break
                held.update(frontier)
            return frozenset(held)

        return _remember(self._reach, (name, tenant), walk, MAX_REMEMBERED_REACHES)

    def path(self, name: str, group: str, tenant: str) -> tuple[str, ...] | None:
        """The shortest chain name -> ... -> group, or None; of several, the first found taking
        memberships in file order."""
        paths: dict[str, tuple[str, ...]] = {name: (name,)}
        frontier = [name]
        while frontier and group not in paths:
            following = []
            for member in frontier:
                for above in self._groups_of.get((tenant, member), ()):
                    if above not in paths:
                        paths[above] = (*paths[member], above)
                        following.append(above)
            frontier = following
        return paths.get(group)


@dataclass(frozen=True, kw_only=True)
class Decision:
    """The outcome of one access question, always with the reason for it."""

    allowed: bool
    reason: str


def _level_of(rule: Rule) -> Classification:
    """The level a (validated, canonical) ``classification:LEVEL`` rule names."""
    return Classification.parse(rule.values[2].partition(":")[2])


@dataclass(frozen=True, kw_only=True)
class Clearance:
    """A subject's clearance in one tenant, with the rules that set it.

    The rule (DESIGN §4, point 5): the highest level the policy grants (an allow reaching the
    subject and no deny on that level: deny overrides allow, as for labels), public by default,
    capped strictly below the lowest level the policy denies the subject. A deny on ``public``
    leaves nothing readable, not even public rows: ``level`` is then None, and every check
    treats None as below every row.
    """

    level: Classification | None  # the highest classification readable; None: nothing is
    granted: Classification  # the highest level granted, public by default
    grant: Rule | None  # the allow that granted it (the first line of several); None: the default
    cap: Rule | None  # the deny on the lowest denied level, when it lowered the clearance

    def reaches(self, level: Classification) -> bool:
        """Whether a row of ``level`` is within this clearance."""
        return self.level is not None and self.level >= level

    @property
    def label(self) -> str:
        return self.level.label if self.level is not None else "none"

    def describe(self, name: Callable[[Rule], str]) -> str:
        """The level and why, each rule written by ``name`` (a line number, or the whole line)."""
        reasons = [f"{self.granted.label} granted by {name(self.grant)}" if self.grant else "nothing granted"]
        if self.cap:
            reasons.append(f"capped below {_level_of(self.cap).label} by {name(self.cap)}")
        return f"{self.label} ({'; '.join(reasons)})"


class Policy:
    """A loaded, validated policy: the only place that decides.

    ``version`` is a content hash of model and rules, so a compiled filter can be cached by it.
    Building one is linear in the rules (the role graph check, Casbin's model, and the indexes
    below), and so is every question a search asks of it.
    """

    @_collector_paused()
    def __init__(
        self, rules: list[Rule], *, source: str, source_text: str | None = None, model_text: str | None = None
    ) -> None:
        # checked here, not only in parse_rules, so that no Policy ever holds a cycle or a chain
        # Casbin would silently cut, whoever built the rules
        _check_role_graph(rules, source)
        model_text = model_text if model_text is not None else policy_file("model.conf").read_text()
        self.source = source
        self.source_text = source_text
        self._model_text = model_text
        self.rules = tuple(rules)
        digest = hashlib.sha256(model_text.encode("utf-8"))
        canonical = "".join("\x1e" + rule.ptype + "\x1f" + "\x1f".join(rule.values) for rule in rules)
        digest.update(canonical.encode("utf-8"))
        self.version = digest.hexdigest()[:16]
        # The validated rules go straight into Casbin's model (its own CSV reader would split
        # quoted commas; its adapter path copies the model and formats every rule for a log).
        model = casbin.Enforcer.new_model(text=model_text)
        for rule in rules:
            model.model[rule.ptype][rule.ptype].policy.append(list(rule.values))
        self._enforcer = casbin.Enforcer(model)
        # Casbin logs every check ("Request: user:x, acme, label:pii, read ---> False"), subjects and
        # labels into the server's log, and only disables its named loggers, which any later logging
        # configuration (uvicorn's) enables again: its checks log to a logger no configuration reaches.
        self._enforcer.logger = model.logger = _UNLOGGED
        # pycasbin's own domain role manager is slow two ways: its default equality "pattern"
        # matcher makes building a tenant's graph quadratic in its memberships, and each g() in
        # the matcher walks the graph afresh. Names here are never patterns: see _RoleGraph.
        self._roles = _RoleGraph(MAX_ROLE_DEPTH)
        self._enforcer.set_role_manager(self._roles)
        self._enforcer.build_role_links()
        self.tenants = tenants_of(rules)
        # Indexes of the permission rules, in file order, so that no question scans every rule:
        # by (tenant, object), and by (tenant, principal) for read rules on labels and levels.
        self._rules_on: dict[tuple[str, str], list[Rule]] = {}
        self._label_rules: dict[tuple[str, str], list[tuple[str, str]]] = {}
        self._level_rules: dict[tuple[str, str], list[Rule]] = {}
        for rule in rules:
            if rule.ptype == "g":
                continue
            principal, tenant, obj, act, effect = rule.values
            self._rules_on.setdefault((tenant, obj), []).append(rule)
            kind, _, name = obj.partition(":")
            if act == "read" and kind == "label":
                self._label_rules.setdefault((tenant, principal), []).append((name, effect))
            elif act == "read" and kind == "classification":
                self._level_rules.setdefault((tenant, principal), []).append(rule)
        self.labels = frozenset(label for rules_of in self._label_rules.values() for label, _ in rules_of)
        self._edges: dict[tuple[str, ...], Rule] = {}
        for rule in rules:
            if rule.ptype == "g":
                self._edges.setdefault(rule.values, rule)  # the first line, as the role graph walks it
        self._answers: dict[tuple[str, str, str, str], Verdict] = {}
        self._clearances: dict[tuple[str, str], Clearance] = {}
        self.deactivated: frozenset[tuple[str, str]] = frozenset()
        """(subject, tenant) pairs the identity provider deactivated: refused everything there."""
        self.refused_tenants: dict[str, str] = {}
        """Tenants whose provisioned memberships could not be combined with this policy, and why:
        refused everything but provisioning and administration, which could put it right."""

    @classmethod
    def from_text(cls, text: str, source: str = "<policy>") -> Policy:
        return cls(parse_rules(text, source, check_graph=False), source=source, source_text=text)

    @classmethod
    def from_file(cls, path: str | Path) -> Policy:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise PolicyError(f"policy file {str(path)!r} does not exist") from None
        except UnicodeDecodeError as exc:
            raise PolicyError(f"policy file {str(path)!r} is not valid UTF-8 ({exc.reason})") from None
        return cls.from_text(text, source=str(path))

    @property
    def stored_text(self) -> str:
        """What the warehouse keeps of this policy: the text it was written as (comments and all),
        else its canonical CSV."""
        return self.source_text if self.source_text is not None else self.text

    @property
    def text(self) -> str:
        """The rules as canonical CSV, suitable for storing and re-loading."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n", quoting=csv.QUOTE_ALL)
        for rule in self.rules:
            writer.writerow([rule.ptype, *rule.values])
        return out.getvalue()

    # -- questions the rest of the system asks ---------------------------------------------

    def verdict(self, subject: str, tenant: str, obj: str, act: str) -> Verdict:
        """Casbin's decision on one request: ``allow``; ``deny`` (a deny rule reaches the subject,
        overriding any allow); or ``none`` (no rule does). Remembered: a Policy never changes (a
        new policy is a new object), and the per-row check asks the same few questions of every
        row, each costing a pass over every rule."""

        def ask() -> Verdict:
            allowed, matched = self._enforcer.enforce_ex(subject, tenant, obj, act)
            # refused with a matching rule: Casbin stops at the first deny that matches, and
            # names it; refused with none: no rule reaches the subject
            return "allow" if allowed else "deny" if matched else "none"

        return _remember(self._answers, (subject, tenant, obj, act), ask)

    def enforce(self, subject: str, tenant: str, obj: str, act: str) -> bool:
        """Casbin's answer for one request: some allow reaches the subject, and no deny does."""
        return self.verdict(subject, tenant, obj, act) == "allow"

    def denies(self, subject: str, tenant: str, obj: str, act: str) -> bool:
        """Whether some deny rule on this request reaches the subject (Casbin's answer)."""
        return self.verdict(subject, tenant, obj, act) == "deny"

    def principals(self, subject: str, tenant: str) -> frozenset[str]:
        """{subject, everyone} and every group the subject holds in ``tenant``, transitively
        (Casbin's role graph, walked once per subject: see ``_RoleGraph``)."""
        return frozenset({subject, EVERYONE, *self._roles.reach(subject, tenant)})

    def holds(self, subject: str, principal: str, tenant: str) -> bool:
        """Whether ``subject`` is ``principal``, or a member of it in ``tenant`` (Casbin's role graph)."""
        return principal in (subject, EVERYONE) or self._roles.has_link(subject, principal, tenant)

    def membership_path(self, subject: str, principal: str, tenant: str) -> tuple[str, ...] | None:
        """The shortest chain subject -> group -> ... -> principal in ``tenant``, or None."""
        if principal in (subject, EVERYONE):
            return (subject,) if principal == subject else (subject, EVERYONE)
        return self._roles.path(subject, principal, tenant)

    def membership_origin(self, member: str, group: str, tenant: str) -> str:
        """Where the membership ``member`` -> ``group`` in ``tenant`` comes from: its policy line,
        or the caller's token (a ``g`` line of ``everyone``'s is implicit)."""
        rule = self._edges.get((member, group, tenant))
        if rule is None:
            return "everyone" if group == EVERYONE else "unknown"
        if rule.origin == POLICY:
            return f"policy line {rule.line}"
        return "the token's groups claim" if rule.origin == TOKEN else rule.origin

    def with_memberships(self, subject: str, tenant: str, groups: frozenset[str]) -> Policy:
        """This policy with ``subject`` a member of ``groups`` in ``tenant`` besides its own ``g``
        lines (what a trusted token's groups claim says, for one request). Its version is this
        one's with the groups' digest, so views and filters compiled under it are its own."""
        wrong = [problem for problem in map(group_problem, sorted(groups, key=repr)) if problem]
        if isinstance(groups, str) or wrong:
            raise PolicyError(f"claimed memberships must be group: principals: {wrong[0] if wrong else repr(groups)}")
        extra = [Rule(ptype="g", values=(subject, group, tenant), line=0, origin=TOKEN) for group in sorted(groups)
                 if (subject, group, tenant) not in self._edges]  # fmt: skip
        if not extra:
            return self
        digest = hashlib.sha256("\x1f".join([subject, tenant, *sorted(groups)]).encode("utf-8")).hexdigest()[:32]
        try:
            return self._extended(extra, source="the token's groups claim", suffix=f"groups-{digest}")
        except PolicyError as exc:  # the claim would nest groups past the limit
            raise PolicyError(f"the token's groups cannot be honoured: {exc}") from None

    def with_provisioned(
        self, memberships: Sequence[Rule], *, deactivated: frozenset[tuple[str, str]], digest: str
    ) -> Policy:
        """This policy with the memberships an identity provider provisioned (``g`` rules whose
        origin names the provisioned group) and the subjects it deactivated. Its version is this
        one's with ``digest`` (of what was provisioned), so a change there is a new version."""
        extra = [rule for rule in memberships if rule.values not in self._edges]
        if not extra and not deactivated:
            return self
        try:
            derived = self._extended(extra, source="provisioned memberships", suffix=f"scim-{digest}")
        except PolicyError as exc:  # a provisioned membership would close a cycle or nest too deep
            raise PolicyError(f"the provisioned memberships cannot be combined with policy {self.version}: {exc}") from None
        derived.deactivated = deactivated | self.deactivated
        return derived

    def _extended(self, extra: Sequence[Rule], *, source: str, suffix: str) -> Policy:
        """This policy's rules and ``extra``, under version ``{this version}+{suffix}``."""
        derived = Policy([*self.rules, *extra], source=source, model_text=self._model_text)
        derived.version = f"{self.version}+{suffix}"
        derived.deactivated, derived.refused_tenants = self.deactivated, dict(self.refused_tenants)
        return derived

    def rules_for(self, subject: str, tenant: str, obj: str) -> list[Rule]:
        """The ``p`` rules on ``obj`` in ``tenant`` that reach ``subject`` (directly, by group, or via
        everyone), in file order."""
        return [rule for rule in self._rules_on.get((tenant, obj), ()) if self.holds(subject, rule.values[0], tenant)]

    def label_allowed(self, subject: str, tenant: str, label: str) -> bool:
        return self.enforce(subject, tenant, f"label:{label}", "read")

    def cleared_labels(self, subject: str, tenant: str) -> frozenset[str]:
        """Every label ``subject`` may read in ``tenant``: the same answer as ``label_allowed`` for
        each label (the model's matcher, deny overriding allow), from the label rules of the
        subject's principals only, instead of one Casbin evaluation of every rule per label."""
        allowed: set[str] = set()
        denied: set[str] = set()
        for principal in self.principals(subject, tenant):
            for label, effect in self._label_rules.get((tenant, principal), ()):
                (allowed if effect == "allow" else denied).add(label)
        return frozenset(allowed - denied)

    def clearance_of(self, subject: str, tenant: str) -> Clearance:
        """``subject``'s clearance in ``tenant`` and the rules that set it (see ``Clearance``),
        from the classification rules of the subject's principals."""

        def decide() -> Clearance:
            allows: dict[Classification, Rule] = {}
            denies: dict[Classification, Rule] = {}
            for principal in self.principals(subject, tenant):
                for rule in self._level_rules.get((tenant, principal), ()):
                    found = denies if rule.values[4] == "deny" else allows
                    level = _level_of(rule)
                    if level not in found or rule.line < found[level].line:
                        found[level] = rule
            granted = max((level for level in allows if level not in denies), default=Classification.PUBLIC)
            grant = allows.get(granted) if granted not in denies else None
            lowest = min(denies, default=None)
            if lowest is None or lowest > granted:
                return Clearance(level=granted, granted=granted, grant=grant, cap=None)
            capped = Classification(lowest - 1) if lowest > Classification.PUBLIC else None
            return Clearance(level=capped, granted=granted, grant=grant, cap=denies[lowest])

        return _remember(self._clearances, (subject, tenant), decide)

    def named(self) -> list[tuple[str, str]]:
        """Every (tenant, principal) a rule or membership names, sorted: the subjects a review of
        the policy is about (``ragwarden policy check`` prints each one's clearance)."""
        found = set()
        for rule in self.rules:
            if rule.ptype == "g":
                member, group, tenant = rule.values
                found.update({(tenant, member), (tenant, group)})
            else:
                found.add((rule.values[1], rule.values[0]))
        return sorted(found)

    def clearance(self, subject: str, tenant: str) -> Classification | None:
        """The highest classification ``subject`` may read in ``tenant``; None: not even public."""
        return self.clearance_of(subject, tenant).level

    def allows_operation(self, subject: str, tenant: str, operation: str) -> Decision:
        if operation not in OPERATIONS:
            return Decision(allowed=False, reason=f"unknown operation {operation!r}")
        if self.enforce(subject, tenant, operation, "read") or self.enforce(subject, tenant, operation, "execute"):
            return Decision(allowed=True, reason=f"policy grants {operation} to {subject} in {tenant}")
        return Decision(allowed=False, reason=f"policy does not grant {operation} to {subject} in {tenant}")
