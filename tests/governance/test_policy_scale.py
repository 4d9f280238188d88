"""Big policies: the role graph check and the questions a search asks, by behaviour, at scale.

The check walks each membership once (``_check_role_graph``), where it used to walk every path:
on small random graphs its accept/refuse decision, line and message are those of a brute-force
walk along every chain; on big graphs of every shape (deep nesting to the limit, wide diamonds,
many tenants, long chains, a cycle at the end), the depth limit and cycle refusal hold. The
indexed questions (principals, membership paths, rules on an object) answer as the rule-scanning
definitions do. How long all this takes is measured by ``bench/policy_scale.py``, not here.
"""

from __future__ import annotations

import contextlib
import io
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from support.oracle import oracle_principals, world_of_policy
from support.policy_worlds import look_alike_worlds

from ragwarden.bench import policy_scale
from ragwarden.bench.policy_scale import LAYERS, chains, cycle_at_end, diamonds, long_chain, nested, tenants
from ragwarden.errors import InvalidPolicyError
from ragwarden.governance import policy as policy_module
from ragwarden.governance.policy import MAX_ROLE_DEPTH, Policy, Rule, parse_rules, tenants_of

POLICIES = Path(__file__).parent / "policies"

# -- the brute-force reference -------------------------------------------------------------


class Refused(Exception):
    def __init__(self, line: int, reason: str) -> None:
        super().__init__(line, reason)
        self.line, self.reason = line, reason


def brute_force_refusal(rules: list[Rule]) -> tuple[int, str] | None:
    """The role graph rule, walked along every chain: from each member in the order the policy
    first names one, depth first, memberships in file order (each found by scanning every rule),
    the first membership whose group is already on the chain is a cycle, and, coming back, the
    first whose member has more than MAX_ROLE_DEPTH memberships above it is too deep."""
    memberships = [(rule.values, rule.line) for rule in rules if rule.ptype == "g"]

    def longest(tenant: str, name: str, chain: tuple[str, ...]) -> int:
        best = 0
        for (member, group, where), line in memberships:
            if (where, member) != (tenant, name):
                continue
            if group in chain:
                raise Refused(line, f"membership cycle through {group!r} in tenant {tenant!r}")
            above = 1 + longest(tenant, group, (*chain, group))
            if above > MAX_ROLE_DEPTH:
                raise Refused(line, f"group nesting deeper than {MAX_ROLE_DEPTH} levels from {name!r} in {tenant!r}")
            best = max(best, above)
        return best

    try:
        for tenant, member in dict.fromkeys((where, member) for (member, _, where), _ in memberships):
            longest(tenant, member, (member,))
    except Refused as refused:
        return refused.line, refused.reason
    return None


def refusal(text: str) -> tuple[int, str] | None:
    """What ``parse_rules`` says of ``text``: None, or the refused line and its reason."""
    try:
        parse_rules(text)
    except InvalidPolicyError as exc:
        return exc.line, exc.reason
    return None


# Two users then twenty-four groups. Memberships come in runs, each following one name (among the
# first five half the time) up a name or a few at a time, so chains deeper than the limit are
# common, now and then stepping back, so cycles are common too; the runs cross, in one tenant or two.
NAMES = ["user:u0", "user:u1", *(f"group:g{index}" for index in range(24))]
STEPS = [*[1] * 11, 2, 2, 3, -3]


@st.composite
def random_graphs(draw: st.DrawFn) -> str:
    lines = []
    for _ in range(draw(st.integers(min_value=1, max_value=5))):
        member = draw(st.integers(min_value=0, max_value=4) | st.integers(min_value=0, max_value=len(NAMES) - 2))
        tenant = draw(st.sampled_from(["acme", "acme", "globex"]))
        for step in draw(st.lists(st.sampled_from(STEPS), min_size=1, max_size=16)):
            group = max(2, member + step)
            if group >= len(NAMES):
                break
            lines.append(f"g, {NAMES[member]}, {NAMES[group]}, {tenant}")
            if draw(st.integers(min_value=0, max_value=5)) == 0:  # other lines shift the line numbers
                other = ["", "# a comment", f"p, {NAMES[group]}, {tenant}, label:x, read, allow"]
                lines.append(draw(st.sampled_from(other)))
            member = group
    return "\n".join(lines) + "\n"


@settings(max_examples=400, deadline=None, database=None)
@given(text=random_graphs())
def test_the_check_refuses_exactly_what_and_where_a_walk_along_every_chain_does(text: str) -> None:
    expected = brute_force_refusal(parse_rules(text, check_graph=False))
    event("accepted" if expected is None else expected[1].partition(" ")[0] + " refused")
    assert refusal(text) == expected
    if expected is None:
        Policy.from_text(text)  # and whatever it accepts loads
    else:
        with pytest.raises(InvalidPolicyError) as refused:
            Policy(parse_rules(text, check_graph=False), source="<policy>")  # the check is Policy's own too
        assert (refused.value.line, refused.value.reason) == expected


def test_the_reference_refuses_the_policies_kept_as_examples_where_the_check_does() -> None:
    """A check of the reference itself, on the two refusals the policy fixtures hold."""
    cycle = (POLICIES / "cycle.csv").read_text(encoding="utf-8")
    expected = (5, "membership cycle through 'group:a' in tenant 'acme'")
    assert brute_force_refusal(parse_rules(cycle, check_graph=False)) == refusal(cycle) == expected
    deep = (POLICIES / "too_deep.csv").read_text(encoding="utf-8")
    expected = (2, f"group nesting deeper than {MAX_ROLE_DEPTH} levels from 'user:deep' in 'acme'")
    assert brute_force_refusal(parse_rules(deep, check_graph=False)) == refusal(deep) == expected


# -- big graphs ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape",
    [nested(120), diamonds(600), tenants(400), chains(600)],
    ids=["nested", "diamonds", "tenants", "chains"],
)
def test_big_policies_of_every_shape_nested_to_the_limit_are_accepted(shape: policy_scale.Shape) -> None:
    policy = Policy.from_text(shape.text)
    assert len(policy.rules) == shape.text.count("\n")
    assert policy.holds(shape.subject, shape.group, shape.tenant)
    path = policy.membership_path(shape.subject, shape.group, shape.tenant)
    assert path is not None and path[0] == shape.subject and path[-1] == shape.group
    assert all(policy.holds(member, group, shape.tenant) for member, group in itertools.pairwise(path))
    assert shape.label in policy.cleared_labels(shape.subject, shape.tenant)


def test_a_nesting_one_layer_deeper_than_the_limit_is_refused_at_the_first_member_reaching_past_it() -> None:
    text = nested(120, layers=LAYERS + 1).text
    with pytest.raises(InvalidPolicyError) as refused:
        Policy.from_text(text)
    # user:u0 is named first; its first group has exactly the limit above it, so it is too deep
    assert (refused.value.line, refused.value.reason) == (
        1,
        f"group nesting deeper than {MAX_ROLE_DEPTH} levels from 'user:u0' in 'acme'",
    )


@pytest.mark.parametrize("length", [MAX_ROLE_DEPTH + 1, 50_000])
def test_a_chain_longer_than_the_limit_is_refused_at_the_membership_ten_from_its_end(length: int) -> None:
    """However long (the old recursive walk overflowed the stack past about a thousand)."""
    step = length - MAX_ROLE_DEPTH  # its group has MAX_ROLE_DEPTH memberships above it
    with pytest.raises(InvalidPolicyError) as refused:
        Policy.from_text(long_chain(length).text)
    member = "user:x" if step == 1 else f"group:x{step - 1}"
    assert (refused.value.line, refused.value.reason) == (
        step,
        f"group nesting deeper than {MAX_ROLE_DEPTH} levels from {member!r} in 'acme'",
    )


def test_a_cycle_closed_on_the_last_line_of_a_big_policy_is_refused_there() -> None:
    text = cycle_at_end(120).text
    with pytest.raises(InvalidPolicyError) as refused:
        Policy.from_text(text)
    assert (refused.value.line, refused.value.reason) == (
        text.count("\n"),
        "membership cycle through 'group:ring0' in tenant 'acme'",
    )


def test_a_cycle_through_a_big_nesting_is_refused_at_a_membership_that_closes_it() -> None:
    shape = nested(120)
    text = shape.text + f"g, group:l{LAYERS - 1}g0, group:l0g0, acme\n"
    with pytest.raises(InvalidPolicyError) as refused:
        parse_rules(text)
    assert refused.value.reason.startswith("membership cycle through ")
    rules = parse_rules(text, check_graph=False)
    member, group, _ = next(rule.values for rule in rules if rule.line == refused.value.line)
    unchecked = _unchecked(rules)
    assert unchecked.holds(group, member, "acme")  # the group named reaches back to the member


def test_many_tenants_keep_their_memberships_apart() -> None:
    policy = Policy.from_text(tenants(2000).text)
    assert len(policy.tenants) == 2000
    for tenant in ("t0", "t1999"):
        assert policy.principals("user:u0", tenant) == {"user:u0", "everyone", "group:sub", "group:team", "group:staff"}
        assert policy.cleared_labels("user:u1", tenant) == {"news"}  # plans denied to him
    path = policy.membership_path("user:u0", "group:staff", "t7")
    assert path == ("user:u0", "group:sub", "group:team", "group:staff")


# -- the indexed questions answer as the rule-scanning definitions do ---------------------


def _unchecked(rules: list[Rule]) -> Policy:
    """A Policy of ``rules`` without the role graph check (to ask questions of a refused graph)."""
    with _graph_check_skipped():
        return Policy(rules, source="<policy>")


@contextlib.contextmanager
def _graph_check_skipped() -> Iterator[None]:
    original = policy_module._check_role_graph
    policy_module._check_role_graph = lambda *_: None
    try:
        yield
    finally:
        policy_module._check_role_graph = original


def scanned_path(policy: Policy, subject: str, principal: str, tenant: str) -> tuple[str, ...] | None:
    """The shortest membership chain, breadth first, scanning every rule at every step."""
    paths = {subject: (subject,)}
    frontier = [subject]
    while frontier:
        following = []
        for name in frontier:
            for rule in policy.rules:
                member, group, where = rule.values if rule.ptype == "g" else ("", "", "")
                if (member, where) == (name, tenant) and group not in paths:
                    paths[group] = (*paths[name], group)
                    following.append(group)
        frontier = following
    return paths.get(principal)


@settings(max_examples=150, deadline=None, database=None)
@given(world=look_alike_worlds(min_tenants=1))
def test_indexed_questions_answer_as_scanning_every_rule_does(world) -> None:
    text = world.csv_text()
    policy = Policy.from_text(text)
    assert policy.tenants == tenants_of(policy.rules) == set(world_of_policy(text).tenants)
    for tenant in world.tenants:
        for subject in [*world.users, "user:stranger"]:
            assert policy.principals(subject, tenant) == oracle_principals(world, subject, tenant)
            for principal in world.groups:
                path = policy.membership_path(subject, principal, tenant)
                assert path == scanned_path(policy, subject, principal, tenant)
            for obj in {rule.values[2] for rule in policy.rules if rule.ptype == "p"}:
                assert policy.rules_for(subject, tenant, obj) == [
                    rule
                    for rule in policy.rules
                    if rule.ptype == "p"
                    and rule.values[1:3] == (tenant, obj)
                    and policy.holds(subject, rule.values[0], tenant)
                ]


def test_the_benchmark_runs_on_small_policies_and_against_another_copy_of_the_module() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        policy_scale.main(["--size", "20000", "--against", policy_module.__file__, "--budget", "30"])
    printed = out.getvalue()
    for name in ["nested-9kb", *policy_scale.SHAPES]:
        assert f"\n{name}: " in printed
    assert "refused: <policy>:" in printed and "membership cycle" in printed and "deeper than 9" in printed
