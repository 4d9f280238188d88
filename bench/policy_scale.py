"""How long policy work takes on big policies: parse, validate, load, and the per-search questions.

    python -m ragwarden.bench.policy_scale [--size BYTES] [--shapes nested,diamonds,...]
                                           [--against OLD_POLICY_PY] [--budget SECONDS]

Each shape is a policy text generated here (``SHAPES``), grown to about ``--size`` bytes (1 MiB by
default); ``nested-9kb`` is always the 9 KB case that took about 20 s to validate when the role
graph check walked every path. For each shape it prints the size, the outcome (accepted, or the
refusal with its line), the seconds to parse and validate the text (``parse_rules``), to load it
into a ``Policy`` (the enforcer build included), and then the questions a search (and explain)
asks for one subject: its principals, cleared labels and clearance, one Casbin decision, the rules
on one label, and one membership path.

``--against FILE`` times another ``policy.py`` (an older copy of ``governance/policy.py``) in
place of the installed one, each step stopped after ``--budget`` seconds; the per-search questions
are then asked of a policy built without that module's role graph check, so that they can be
timed even where the check does not finish.

The generators are also the big-policy fixtures of ``tests/governance/test_policy_scale.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import itertools
import random
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

from ragwarden.errors import PolicyError

MIB = 1 << 20
LAYERS = 9  # groups per chain from a user's first group to the top: the depth limit, exactly
FAN = 5  # groups of the next layer each member joins in the nested shape


@dataclass(frozen=True, kw_only=True)
class Shape:
    """A generated policy, and what the per-search questions ask of it."""

    name: str
    text: str
    subject: str  # who searches
    tenant: str
    label: str  # a label the subject is cleared for through its groups
    group: str  # a group the subject holds at the far end of its memberships

    @property
    def size(self) -> int:
        return len(self.text.encode("utf-8"))


def _policy(lines: list[str]) -> str:
    return "\n".join(lines) + "\n"


def _level_rules(tenant: str, top: str, denied: str) -> list[str]:
    """Classification rules every shape carries: public for everyone, confidential for ``top``,
    and a deny on internal for ``denied`` (which caps that subject at public)."""
    return [
        f"p, everyone, {tenant}, classification:public, read, allow",
        f"p, {top}, {tenant}, classification:confidential, read, allow",
        f"p, {denied}, {tenant}, classification:internal, read, deny",
    ]


def nested(width: int, *, layers: int = LAYERS, fan: int = FAN, tenant: str = "acme", seed: int = 0) -> Shape:
    """Groups in ``layers`` layers of ``width``; each user joins ``fan`` groups of the first layer
    and each group ``fan`` groups of the next, so a user reaches the top by ``fan ** layers`` paths,
    each exactly ``layers`` memberships long (the depth limit). Every top group clears a label."""
    rng = random.Random(seed)
    lines = [f"g, user:u{user}, group:l0g{g}, {tenant}" for user in range(width) for g in rng.sample(range(width), fan)]
    for layer in range(layers - 1):
        for group in range(width):
            for up in rng.sample(range(width), fan):
                lines.append(f"g, group:l{layer}g{group}, group:l{layer + 1}g{up}, {tenant}")
    top = layers - 1
    lines += [f"p, group:l{top}g{group}, {tenant}, label:top{group}, read, allow" for group in range(width)]
    lines += _level_rules(tenant, f"group:l{top}g0", "user:u1")
    held = _reached(lines, "user:u0")
    label = next(f"top{group}" for group in range(width) if f"group:l{top}g{group}" in held)
    group = f"group:l{top}g{label.removeprefix('top')}"
    return Shape(name="nested", text=_policy(lines), subject="user:u0", tenant=tenant, label=label, group=group)


def diamonds(width: int, *, tenant: str = "acme") -> Shape:
    """Diamonds stacked to the depth limit: a hub, ``width`` groups that all join it (fan-out from
    the hub below, fan-in to the next), another hub, and so on; ``width`` users join the first hub.
    A user holds about ``4 * width`` groups and reaches the top by ``width ** 4`` paths."""
    lines = [f"g, user:u{user}, group:hub0, {tenant}" for user in range(width)]
    for layer in range(1, LAYERS - 1, 2):
        for group in range(width):
            lines.append(f"g, group:hub{layer - 1}, group:w{layer}g{group}, {tenant}")
            lines.append(f"g, group:w{layer}g{group}, group:hub{layer + 1}, {tenant}")
    top = f"group:hub{LAYERS - 1}"
    lines += [f"p, group:w{LAYERS - 2}g{group}, {tenant}, label:wide{group}, read, allow" for group in range(width)]
    lines += _level_rules(tenant, top, "user:u1")
    return Shape(name="diamonds", text=_policy(lines), subject="user:u0", tenant=tenant, label="wide0", group=top)


def tenants(count: int) -> Shape:
    """``count`` tenants, each a small organisation: three users, three nested groups, label rules
    with a deny, and classification rules with a deny."""
    lines = []
    for index in range(count):
        tenant = f"t{index}"
        lines += [
            f"g, user:u0, group:sub, {tenant}",
            f"g, user:u1, group:team, {tenant}",
            f"g, user:u2, group:staff, {tenant}",
            f"g, group:sub, group:team, {tenant}",
            f"g, group:team, group:staff, {tenant}",
            f"p, group:team, {tenant}, label:plans, read, allow",
            f"p, user:u1, {tenant}, label:plans, read, deny",
            f"p, group:staff, {tenant}, label:news, read, allow",
            f"p, group:staff, {tenant}, classification:internal, read, allow",
            *_level_rules(tenant, "group:team", "user:u2"),
        ]
    last = f"t{count - 1}"  # its rules come after every other tenant's
    return Shape(name="tenants", text=_policy(lines), subject="user:u0", tenant=last, label="plans", group="group:staff")


def chains(count: int, *, tenant: str = "acme") -> Shape:
    """``count`` separate chains of exactly ``LAYERS`` memberships (the depth limit): user:cK ->
    group:cK.1 -> ... -> group:cK.9, whose top clears a label."""
    lines = []
    for chain in range(count):
        names = [f"user:c{chain}", *(f"group:c{chain}.{step}" for step in range(1, LAYERS + 1))]
        lines += [f"g, {member}, {group}, {tenant}" for member, group in itertools.pairwise(names)]
        lines.append(f"p, {names[-1]}, {tenant}, label:chain{chain}, read, allow")
    lines += _level_rules(tenant, f"group:c0.{LAYERS}", "user:c1")
    top = f"group:c0.{LAYERS}"
    return Shape(name="chains", text=_policy(lines), subject="user:c0", tenant=tenant, label="chain0", group=top)


def long_chain(length: int, *, tenant: str = "acme") -> Shape:
    """One chain of ``length`` memberships: deeper than the limit, so refused. The refusal names
    the membership ``LAYERS + 1`` from the end: the first whose group has a chain of ``LAYERS``
    memberships above it (the check meets it first, coming back down the chain)."""
    names = ["user:x", *(f"group:x{step}" for step in range(1, length + 1))]
    lines = [f"g, {member}, {group}, {tenant}" for member, group in itertools.pairwise(names)]
    return Shape(name="long-chain", text=_policy(lines), subject="user:x", tenant=tenant, label="-", group="group:x1")


def cycle_at_end(width: int, *, tenant: str = "acme", loop: int = 5) -> Shape:
    """The nested shape, then a ring of ``loop`` groups closed on the last line: refused there."""
    shape = nested(width, tenant=tenant)
    ring = [f"group:ring{step}" for step in range(loop)]
    lines = [f"g, {member}, {group}, {tenant}" for member, group in zip(ring, [*ring[1:], ring[0]], strict=True)]
    return replace(shape, name="cycle-at-end", text=shape.text + _policy(lines))


def nested_9kb() -> Shape:
    """The old worst case: 9 layers of 6 groups, each member of 5 groups of the next (8.6 KB)."""
    return replace(nested(6), name="nested-9kb")


# shape name -> generator of one size parameter (width, count or length), grown by ``sized``
SHAPES: dict[str, Callable[[int], Shape]] = {
    "nested": nested,
    "diamonds": diamonds,
    "tenants": tenants,
    "chains": chains,
    "long-chain": long_chain,
    "cycle-at-end": cycle_at_end,
}


def sized(make: Callable[[int], Shape], target: int) -> Shape:
    """``make``'s shape with its size parameter scaled so that the text is about ``target`` bytes
    (every generator's size grows linearly with its parameter)."""
    probe = make(20)
    return make(max(20, round(20 * target / probe.size)))


def _reached(lines: list[str], subject: str) -> set[str]:
    """The groups ``subject`` reaches through the g lines (one tenant), breadth first."""
    groups_of: dict[str, list[str]] = {}
    for line in lines:
        kind, member, group, _ = (field.strip() for field in (line.split(",") + ["", "", ""])[:4])
        if kind == "g":
            groups_of.setdefault(member, []).append(group)
    held, frontier = {subject}, [subject]
    while frontier:
        frontier = [group for member in frontier for group in groups_of.get(member, ()) if group not in held]
        held.update(frontier)
    return held


# -- timing ----------------------------------------------------------------------------------


class _OverBudget(Exception):
    pass


@contextlib.contextmanager
def _budget(seconds: float) -> Iterator[None]:
    """Stop the step after ``seconds`` (SIGALRM interrupts pure-Python loops between bytecodes)."""

    def stop(_: int, __: FrameType | None) -> None:
        raise _OverBudget

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _timed(step: Callable[[], Any], budget: float) -> tuple[str, Any]:
    """(the seconds it took, wall clock and this process's CPU, or what stopped it; the step's
    result, a refusal, or None). CPU seconds are printed too: on a machine shared with other
    work they say what the step costs better than the wall clock does."""
    started, cpu = time.perf_counter(), time.process_time()

    def took() -> str:
        return f"{time.perf_counter() - started:.3f} s (cpu {time.process_time() - cpu:.3f})"

    try:
        with _budget(budget):
            result = step()
    except _OverBudget:
        return f">{budget:g} s (stopped)", None
    except RecursionError:
        return f"RecursionError after {took()}", None
    except PolicyError as exc:  # a refusal is an outcome to report, not a failure of the bench
        return took(), exc
    return took(), result


def _load_module(path: Path | None) -> ModuleType:
    """The installed ``governance.policy``, or another copy of it loaded under the same package."""
    if path is None:
        from ragwarden.governance import policy

        return policy
    name = "ragwarden.governance._policy_under_test"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _outcome(result: Any) -> str:
    if isinstance(result, Exception):
        return f"refused: {result}"[:110]
    return "accepted" if result is not None else "-"


def _unchecked_policy(module: ModuleType, text: str) -> Any:
    """``module``'s Policy of ``text`` without its role graph check, for the per-search timings."""
    checker = next(name for name in ("_check_role_graph", "check_role_graph") if hasattr(module, name))
    original = getattr(module, checker)
    setattr(module, checker, lambda *_: None)
    try:
        return module.Policy.from_text(text)
    finally:
        setattr(module, checker, original)


def measure(shape: Shape, module: ModuleType, budget: float) -> dict[str, str]:
    """Seconds for each step on ``shape`` (a string: a time, or why it has none)."""
    row = {"shape": shape.name, "bytes": str(shape.size), "lines": str(shape.text.count("\n"))}
    row["parse+validate"], parsed = _timed(lambda: module.parse_rules(shape.text), budget)
    row["outcome"] = _outcome(parsed)
    row["load Policy"], loaded = _timed(lambda: module.Policy.from_text(shape.text), budget)
    policy = loaded if isinstance(loaded, module.Policy) else _unchecked_policy(module, shape.text)
    subject, tenant = shape.subject, shape.tenant
    questions: dict[str, Callable[[], Any]] = {
        "principals": lambda: policy.principals(subject, tenant),
        "cleared_labels": lambda: policy.cleared_labels(subject, tenant),
        "clearance": lambda: policy.clearance(subject, tenant),
        "enforce": lambda: policy.label_allowed(subject, tenant, shape.label),
        "rules_for": lambda: policy.rules_for(subject, tenant, f"label:{shape.label}"),
        "membership_path": lambda: policy.membership_path(subject, shape.group, tenant),
    }
    for name, ask in questions.items():
        row[name], _ = _timed(ask, budget)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ragwarden.bench.policy_scale", description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=MIB, help="bytes of each big policy (default 1 MiB)")
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of: {', '.join(SHAPES)}")
    parser.add_argument("--against", type=Path, default=None, help="time this copy of governance/policy.py instead")
    parser.add_argument("--budget", type=float, default=60.0, help="seconds after which one step is stopped")
    args = parser.parse_args(argv)
    module = _load_module(args.against)
    print(f"policy module: {module.__file__}; big policies of about {args.size} bytes;", end=" ")
    print(f"steps stopped after {args.budget:g} s")
    shapes = [nested_9kb(), *(sized(SHAPES[name], args.size) for name in args.shapes.split(",") if name)]
    for shape in shapes:
        row = measure(shape, module, args.budget)
        print(f"\n{row.pop('shape')}: {row.pop('bytes')} bytes, {row.pop('lines')} lines; {row.pop('outcome')}")
        print("  " + "; ".join(f"{step} {seconds}" for step, seconds in row.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
