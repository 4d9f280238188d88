"""The timing oracle: can a caller tell, by the clock alone, whether its filter matches rows it
cannot read?

    python -m ragwarden.bench.sidechannel [--rows 20000] [--samples 30] [--cases 48] [--out bench/results]

A world of ``--rows`` rows (``hidden_world``) served by a real ``ragwarden serve`` replica on
127.0.0.1, with the service's defaults (no ``Server-Timing``): the prober reads about 1% of the
rows, all salaried below 90,000; the rest, salaried from 150,000, he cannot read. Each
calibration case is a pair of filters whose answers to him are byte for byte the same (nothing he
may read matches either): one matches rows he cannot read (``{"salary": {"$gt": 100000 + x}}``,
``{"team": {"$in": ["hr", ...]}}``), the other matches no row at all (``900000 + x``, ``"zz"``:
the same length, so the two requests differ in nothing else). Every search sends a filter
never sent before (its values moved by a fraction, or a value no row holds added), as an attacker
would to defeat any cache. For each mode (vector, fts, hybrid) and case, ``--samples`` searches of
each side, interleaved at random, timed end to end over HTTP.

The classifier is calibrated as an attacker would: the first half of each case's samples says
which of a pair is slower when it matches hidden rows (pooled over the cases); the second half
is then read case by case. Its accuracy, over the cases, is what the side channel gives away:
chance is 50% (a leak, such as a filter evaluated over the whole table before the access check,
gives 100%). A bisection on ``$gt`` for the highest hidden salary, reading each step by the same
rule, shows what such an oracle would recover (a random walk, without one).
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from . import hidden_world
from .serve import free_port, serve_replica, token_for

MODES = ("vector", "fts", "hybrid")
NOTHING = 900_000  # a salary above every row's, written with as many digits as the probes
Filter = Callable[[int], dict[str, Any]]
"""A side of a case: the filter of its ``i``-th search, each one new."""


def _cases(count: int) -> list[tuple[Filter, Filter]]:
    """(matches rows the prober cannot read, matches no row), ``count`` pairs of sides."""
    pairs: list[tuple[Filter, Filter]] = []
    for j in range(count):
        if j % 2:
            pairs.append((lambda i, j=j: {"team": {"$in": ["hr", f"none-{j}-{i}"]}},
                          lambda i, j=j: {"team": {"$in": ["zz", f"none-{j}-{i}"]}}))  # fmt: skip
        else:
            pairs.append((lambda i, j=j: {"salary": {"$gt": 100_000 + j + i / 10**12}},
                          lambda i, j=j: {"salary": {"$gt": NOTHING + j + i / 10**12}}))  # fmt: skip
    return pairs


def _timed(http: httpx.Client, mode: str, narrow: dict[str, Any]) -> tuple[float, bytes]:
    began = time.perf_counter()
    answer = http.post("/v1/search", json={"query": "salary review", "k": 10, "mode": mode, "filter": narrow})
    took = (time.perf_counter() - began) * 1000
    if answer.status_code != 200:
        raise RuntimeError(f"search failed: {answer.status_code} {answer.text}")
    return took, answer.content


def _samples(http: httpx.Client, mode: str, pair: tuple[Filter, Filter], samples: int,
             rng: random.Random) -> tuple[list[float], list[float]]:  # fmt: skip
    """Timings of each side of ``pair``, interleaved at random; the answers must be identical."""
    order = [0] * samples + [1] * samples
    rng.shuffle(order)
    timings: tuple[list[float], list[float]] = ([], [])
    bodies: set[bytes] = set()
    for which in order:
        took, body = _timed(http, mode, pair[which](rng.randrange(10**9)))
        timings[which].append(took)
        bodies.add(body)
    if len(bodies) != 1:
        raise RuntimeError("the two filters of a case answered differently: the case is not a side channel")
    return timings


def classify(cases: list[tuple[list[float], list[float]]]) -> dict[str, Any]:
    """Calibrate on each case's first half (does matching hidden rows make a search slower or
    faster?), then read each case's second half by that rule: the accuracy over the cases."""
    halves = [(hit[: len(hit) // 2], miss[: len(miss) // 2], hit[len(hit) // 2 :], miss[len(miss) // 2 :])
              for hit, miss in cases]  # fmt: skip
    slower = statistics.median(statistics.median(a) - statistics.median(b) for a, b, _, _ in halves) > 0
    correct = [(statistics.median(c) > statistics.median(d)) == slower for _, _, c, d in halves]
    difference = statistics.median(statistics.median(hit) - statistics.median(miss) for hit, miss in cases)
    return {"accuracy": sum(correct) / len(correct), "cases": len(correct), "calibrated_slower_when_hidden": slower,
            "median_difference_ms": round(difference, 3)}  # fmt: skip


def bisect(http: httpx.Client, mode: str, samples: int, slower: bool, rng: random.Random) -> int:
    """The highest hidden salary as a timing oracle would read it, by bisection on ``$gt`` above the
    prober's own salaries (which he reads: above them every probe answers him alike)."""
    low, high = 100_000, NOTHING
    while high - low > 1_000:
        middle = (low + high) // 2
        sides = (lambda i, at=middle: {"salary": {"$gt": at + i / 10**10}},
                 lambda i: {"salary": {"$gt": NOTHING + i / 10**10}})  # fmt: skip
        probe, nothing = _samples(http, mode, sides, samples, rng)
        above = (statistics.median(probe) > statistics.median(nothing)) == slower
        low, high = (middle, high) if above else (low, middle)
    return low


def run(rows: int, samples: int, cases: int, workdir: Path, seed: int = 5) -> dict[str, Any]:
    built = hidden_world.build(workdir / "warehouse", rows)
    port = free_port()
    replica = serve_replica(str(built.folder), port, workdir / "replica.log", RAGWARDEN_SERVER_TIMING="0")
    rng = random.Random(seed)
    results: dict[str, Any] = {}
    try:
        headers = {"Authorization": f"Bearer {token_for(built.reader.removeprefix('user:'), built.tenant)}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=60) as http:
            for mode in MODES:
                for pair in _cases(2):  # warm: the prober's own rows held, as after his first searches
                    _samples(http, mode, pair, 3, rng)
                measured = [_samples(http, mode, pair, samples, rng) for pair in _cases(cases)]
                results[mode] = classify(measured)
                slower = results[mode]["calibrated_slower_when_hidden"]
                results[mode]["bisection"] = bisect(http, mode, max(6, samples // 3), slower, rng)
                print(mode, json.dumps(results[mode]), flush=True)
    finally:
        replica.terminate()
        replica.wait(30)
    return {"rows": rows, "readable_by_prober": built.readable, "samples_per_filter": samples, "cases": cases,
            "highest_hidden_salary": built.highest_hidden_salary, "chance": 0.5, "modes": results,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = hidden_world.arguments("python -m ragwarden.bench.sidechannel", __doc__)
    parser.add_argument("--samples", type=int, default=30, help="searches of each filter of a case")
    parser.add_argument("--cases", type=int, default=48)
    args = parser.parse_args(argv)
    hidden_world.recorded("sidechannel.json", args.out, lambda workdir: run(args.rows, args.samples, args.cases, workdir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
