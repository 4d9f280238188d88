"""The policy: a Casbin RBAC-with-domains model plus rules, parsed strictly and versioned.

Rule files are CSV (``p, group:finance, acme, label:pii, read, allow``); values holding a
comma, a quote or `` #`` are double-quoted. Each line is validated before Casbin sees it, so a
bad line is refused with its number rather than silently ignored, and a role chain deeper than
Casbin's hierarchy limit (which Casbin would silently deny) is refused too.
"""

from __future__ import annotations

import csv
import hashlib
import io
from dataclasses import dataclass
from pathlib import Path

import casbin
from casbin import persist

from ..errors import InvalidPolicyError, PolicyError
from ..policies import policy_file
from .tags import EVERYONE, Classification, label_problem, principal_problem, tenant_problem

OPERATIONS = frozenset({"ingest", "derive", "sync", "forget", "explain", "audit", "admin"})
EFFECTS = frozenset({"allow", "deny"})
# Casbin's default hierarchy limit (10) resolves chains of at most 9 memberships; deeper ones
# would be silently denied, so they are refused when the policy is loaded.
MAX_ROLE_DEPTH = 9
MAX_REMEMBERED_ANSWERS = 100_000


@dataclass(frozen=True, kw_only=True)
class Rule:
    """One policy line: ``ptype`` is ``p`` or ``g``; ``line`` its number in the source."""

    ptype: str
    values: tuple[str, ...]
    line: int


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


def parse_rules(text: str, source: str = "<policy>") -> list[Rule]:
    """Parse and validate policy text; raise InvalidPolicyError naming the first bad line."""
    rules: list[Rule] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = _strip_comment(raw.strip())
        if not line:
            continue
        try:
            fields = next(csv.reader([line], skipinitialspace=True, strict=True))
        except csv.Error as exc:
            raise InvalidPolicyError(source, number, f"not valid CSV ({exc})") from None
        fields = [f.strip() for f in fields]
        problem = _rule_problem(fields[0], fields[1:])
        if problem:
            raise InvalidPolicyError(source, number, problem)
        rules.append(Rule(ptype=fields[0], values=tuple(_canonical(fields[1:])), line=number))
    _check_role_graph(rules, source)
    return rules


def _check_role_graph(rules: list[Rule], source: str) -> None:
    """Refuse membership cycles and chains deeper than Casbin resolves."""
    edges: dict[tuple[str, str], list[Rule]] = {}
    for rule in rules:
        if rule.ptype == "g":
            member, group, dom = rule.values
            edges.setdefault((dom, member), []).append(rule)

    def depth(dom: str, name: str, seen: tuple[str, ...]) -> int:
        best = 0
        for rule in edges.get((dom, name), []):
            group = rule.values[1]
            if group in seen:
                raise InvalidPolicyError(source, rule.line, f"membership cycle through {group!r} in tenant {dom!r}")
            level = 1 + depth(dom, group, (*seen, group))
            if level > MAX_ROLE_DEPTH:
                raise InvalidPolicyError(
                    source, rule.line, f"group nesting deeper than {MAX_ROLE_DEPTH} levels from {name!r} in {dom!r}"
                )
            best = max(best, level)
        return best

    for dom, member in list(edges):
        depth(dom, member, (member,))


class _RulesAdapter(persist.Adapter):
    """Feeds already-validated rules to Casbin (its own CSV reader would split quoted commas)."""

    def __init__(self, rules: list[Rule]) -> None:
        self._rules = rules

    def load_policy(self, model: casbin.Model) -> None:
        for rule in self._rules:
            model.model[rule.ptype][rule.ptype].policy.append(list(rule.values))


@dataclass(frozen=True, kw_only=True)
class Decision:
    """The outcome of one access question, always with the reason for it."""

    allowed: bool
    reason: str


class Policy:
    """A loaded, validated policy: the only place that decides.

    ``version`` is a content hash of model and rules, so a compiled filter can be cached by it.
    """

    def __init__(
        self, rules: list[Rule], *, source: str, source_text: str | None = None, model_text: str | None = None
    ) -> None:
        model_text = model_text if model_text is not None else policy_file("model.conf").read_text()
        self.source = source
        self.source_text = source_text
        self.rules = tuple(rules)
        digest = hashlib.sha256(model_text.encode("utf-8"))
        for rule in rules:
            digest.update(("\x1e" + rule.ptype + "\x1f" + "\x1f".join(rule.values)).encode("utf-8"))
        self.version = digest.hexdigest()[:16]
        model = casbin.Enforcer.new_model(text=model_text)
        self._enforcer = casbin.Enforcer(model, _RulesAdapter(rules))
        # pycasbin's domain role manager installs an equality "pattern" matcher by default, which
        # makes building a tenant's role graph quadratic in its memberships (minutes at 10k
        # lines). Names here are never patterns, so plain dictionary lookup is the same answer.
        self._enforcer.get_role_manager().add_matching_func(None)
        self.labels = frozenset(
            rule.values[2].partition(":")[2]
            for rule in rules
            if rule.ptype == "p" and rule.values[2].startswith("label:")
        )
        self._answers: dict[tuple[str, str, str, str], bool] = {}
        self._label_rules: dict[str, list[tuple[str, str, str]]] = {}
        for rule in rules:
            if rule.ptype == "p" and rule.values[2].startswith("label:") and rule.values[3] == "read":
                principal, tenant, obj, _, effect = rule.values
                self._label_rules.setdefault(tenant, []).append((principal, obj.partition(":")[2], effect))
        self.tenants = frozenset(rule.values[2] if rule.ptype == "g" else rule.values[1] for rule in rules)

    @classmethod
    def from_text(cls, text: str, source: str = "<policy>") -> Policy:
        return cls(parse_rules(text, source), source=source, source_text=text)

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
    def text(self) -> str:
        """The rules as canonical CSV, suitable for storing and re-loading."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n", quoting=csv.QUOTE_ALL)
        for rule in self.rules:
            writer.writerow([rule.ptype, *rule.values])
        return out.getvalue()

    # -- questions the rest of the system asks ---------------------------------------------

    def enforce(self, subject: str, tenant: str, obj: str, act: str) -> bool:
        """Casbin's answer for one request (deny overrides allow), remembered: a Policy never
        changes (a new policy is a new object), and the per-row check asks the same few questions
        of every row, each costing a pass over every rule."""
        key = (subject, tenant, obj, act)
        answer = self._answers.get(key)
        if answer is None:
            answer = bool(self._enforcer.enforce(subject, tenant, obj, act))
            if len(self._answers) >= MAX_REMEMBERED_ANSWERS:
                self._answers.clear()
            self._answers[key] = answer
        return answer

    def principals(self, subject: str, tenant: str) -> frozenset[str]:
        """{subject, everyone} and every group the subject holds in ``tenant``, transitively."""
        roles = self._enforcer.get_implicit_roles_for_user(subject, tenant)
        return frozenset({subject, EVERYONE, *roles})

    def holds(self, subject: str, principal: str, tenant: str) -> bool:
        """Whether ``subject`` is ``principal``, or a member of it in ``tenant`` (Casbin's role graph)."""
        if principal in (subject, EVERYONE):
            return True
        return bool(self._enforcer.get_role_manager().has_link(subject, principal, tenant))

    def membership_path(self, subject: str, principal: str, tenant: str) -> tuple[str, ...] | None:
        """The shortest chain subject -> group -> ... -> principal in ``tenant``, or None."""
        if principal in (subject, EVERYONE):
            return (subject,) if principal == subject else (subject, EVERYONE)
        paths: dict[str, tuple[str, ...]] = {subject: (subject,)}
        frontier = [subject]
        while frontier:
            following = []
            for name in frontier:
                for rule in self.rules:
                    member, group, dom = rule.values if rule.ptype == "g" else ("", "", "")
                    if member == name and dom == tenant and group not in paths:
                        paths[group] = (*paths[name], group)
                        following.append(group)
            frontier = following
        return paths.get(principal)

    def rules_for(self, subject: str, tenant: str, obj: str) -> list[Rule]:
        """The ``p`` rules on ``obj`` in ``tenant`` that reach ``subject`` (directly, by group, or via everyone)."""
        return [
            rule
            for rule in self.rules
            if rule.ptype == "p"
            and rule.values[1] == tenant
            and rule.values[2] == obj
            and self.holds(subject, rule.values[0], tenant)
        ]

    def label_allowed(self, subject: str, tenant: str, label: str) -> bool:
        return self.enforce(subject, tenant, f"label:{label}", "read")

    def cleared_labels(self, subject: str, tenant: str) -> frozenset[str]:
        """Every label ``subject`` may read in ``tenant``: the same answer as ``label_allowed`` for
        each label (the model's matcher, deny overriding allow), in one pass over the tenant's label
        rules instead of one Casbin evaluation of every rule per label."""
        principals = self.principals(subject, tenant)
        allowed: set[str] = set()
        denied: set[str] = set()
        for principal, label, effect in self._label_rules.get(tenant, ()):
            if principal in principals:
                (allowed if effect == "allow" else denied).add(label)
        return frozenset(allowed - denied)

    def clearance(self, subject: str, tenant: str) -> Classification:
        """The highest classification the policy lets ``subject`` read in ``tenant``."""
        granted = [level for level in Classification if self.enforce(subject, tenant, f"classification:{level.label}", "read")]
        return max(granted, default=Classification.PUBLIC)

    def allows_operation(self, subject: str, tenant: str, operation: str) -> Decision:
        if operation not in OPERATIONS:
            return Decision(allowed=False, reason=f"unknown operation {operation!r}")
        if self.enforce(subject, tenant, operation, "read") or self.enforce(subject, tenant, operation, "execute"):
            return Decision(allowed=True, reason=f"policy grants {operation} to {subject} in {tenant}")
        return Decision(allowed=False, reason=f"policy does not grant {operation} to {subject} in {tenant}")
