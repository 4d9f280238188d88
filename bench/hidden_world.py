"""A world for the filter benchmarks: one reader may read about 1% of the rows; the others carry
metadata he may name in a filter but never read (salaries above any of his own, another team).

Built from the synthetic permission world of ``make bench`` (``world.generate``), written straight
into a warehouse with its scalar indexes, and served by real ``ragwarden serve`` replicas.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..governance.policy import Policy
from ..state import Store
from . import world
from .peer_data import visible_mask

READER_SELECTIVITY = 0.01
BROAD_SELECTIVITY = 0.5
VISIBLE_SALARIES = range(40_000, 90_000, 1_000)
HIDDEN_SALARIES = range(150_000, 230_000, 1_000)


@dataclass(frozen=True, kw_only=True)
class HiddenWorld:
    folder: Path
    reader: str  # the caller probing (``user:`` + name), who reads about 1% of the rows
    other: str  # another caller, who reads about half of them
    tenant: str
    rows: int
    readable: int  # rows the reader may read
    highest_hidden_salary: int


def build(folder: Path, rows: int, *, seed: int = 17) -> HiddenWorld:
    """The world of ``rows`` rows in ``folder``: each row's metadata a salary and a team, the
    reader's own rows ``VISIBLE_SALARIES`` of team ops, every other row ``HIDDEN_SALARIES`` of team hr."""
    generated = world.generate(rows, seed=seed)
    policy = Policy.from_text(generated.policy_text, source="hidden world")
    reader, other = generated.subjects[READER_SELECTIVITY], generated.subjects[BROAD_SELECTIVITY]
    readable = visible_mask(generated.rows, world.caller_of(generated, reader, policy)).tolist()
    metadata, texts = [], []
    for i, visible in enumerate(readable):
        salaries, team = (VISIBLE_SALARIES, "ops") if visible else (HIDDEN_SALARIES, "hr")
        metadata.append(json.dumps({"salary": salaries[i % len(salaries)], "team": team, "year": 2020 + i % 6}))
        texts.append(f"{team} salary review, band {i % 12}: row {generated.rows.ids[i]}")
    store = Store(str(folder), dimension=world.DIMENSION)
    world.append_rows(store, generated.rows, metadata=metadata, texts=texts)
    store.policies.install(policy)
    store.maintenance.optimize()
    return HiddenWorld(folder=folder, reader=reader, other=other, tenant=world.TENANT, rows=rows,
                       readable=sum(readable), highest_hidden_salary=max(HIDDEN_SALARIES))  # fmt: skip


def arguments(prog: str, description: str | None) -> argparse.ArgumentParser:
    """The options every benchmark over this world takes (``--rows``, ``--out``); add its own."""
    parser = argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    return parser


def recorded(name: str, out: Path, run: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    """``run(workdir)`` in a folder of its own, its result written to ``out/name`` and printed."""
    with tempfile.TemporaryDirectory() as workdir:
        result = run(Path(workdir))
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))
    return result
