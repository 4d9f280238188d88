"""Can one reader stall everyone? Another caller's latency while eight clients send the worst filter
the limits admit.

    python -m ragwarden.bench.stall [--rows 20000] [--seconds 10] [--attackers 8] [--out bench/results]

A world of ``--rows`` rows (``hidden_world``) served by one ``ragwarden serve`` replica on
127.0.0.1 with its default settings. The other caller (who reads about half the rows) searches
alone, one search in flight, for ``--seconds``: its idle p50. Then ``--attackers`` clients, in a
process of their own and all holding the prober's token, send the most expensive search the
default limits admit (a hybrid search, k = 1,000, under a filter of 256 conditions filling the
64 KiB limit), while the other caller searches as before: its p99 under attack. Target: that p99
stays at most 3x the idle p50, and no accepted search works past its deadline (each search's time
at work, from the replica's access log, against ``search_deadline_seconds``).
"""

from __future__ import annotations

import json
import multiprocessing
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from ..config import FilterLimits, Settings
from ..retrieval.narrowing import narrowing
from . import hidden_world
from .serve import free_port, serve_replica, token_for

QUERIES = ["salary review", "ops band", "hr salary", "band review for ops"]
TARGET_RATIO = 3.0


def worst_filter(limits: FilterLimits | None = None) -> dict[str, Any]:
    """A filter at the limits: as many conditions as allowed, each a ``$in``/``$nin`` over a field
    every row holds, filled with values until the bytes limit is reached."""
    limits = limits or FilterLimits()
    fields = [("salary", lambda i: 40_000 + i), ("team", lambda i: f"team-{i}"), ("year", lambda i: 1900 + i)]
    terms: list[dict[str, Any]] = []
    for t in range(limits.terms):
        name, value = fields[t % len(fields)]
        terms.append({name: {"$in" if t % 2 else "$nin": [value(t * 7 + j) for j in range(2)]}})
    expression: dict[str, Any] = {"$or": terms}
    per_term = 2
    while True:  # grow every list by one value until the next step would pass the bytes limit
        grown = {"$or": [{name: {op: [*values, values[-1] + 1 if isinstance(values[-1], int) else values[-1] + "x"]}
                          for name, condition in term.items() for op, values in condition.items()}
                         for term in expression["$or"]]}  # fmt: skip
        if per_term >= limits.values or len(json.dumps(grown, separators=(",", ":"))) > limits.bytes:
            break
        expression, per_term = grown, per_term + 1
    assert narrowing(expression, limits) is not None
    return expression


def _drive(url: str, token: str, seconds: float, body: dict[str, Any] | None, stop: Any = None) -> list[float]:
    """One client: searches back to back for ``seconds`` (or until ``stop`` is set); their latencies."""
    took: list[float] = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120) as http:
        ends = time.monotonic() + seconds
        n = 0
        while time.monotonic() < ends and not (stop is not None and stop.is_set()):
            n += 1
            began = time.perf_counter()
            answer = http.post("/v1/search", json=body or {"query": QUERIES[n % len(QUERIES)], "k": 10})
            took.append((time.perf_counter() - began) * 1000)
            if answer.status_code not in (200, 503):
                raise RuntimeError(f"search failed: {answer.status_code} {answer.text[:200]}")
    return took


def _attackers(url: str, token: str, clients: int, body: dict[str, Any], ready: Any, stop: Any, counts: Any) -> None:
    """The attacking process: ``clients`` threads sending ``body`` until ``stop``."""
    results: list[list[float]] = []

    def client() -> None:
        results.append(_drive(url, token, 3600, body, stop))

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    ready.set()
    for thread in threads:
        thread.join()
    counts.value = sum(len(r) for r in results)


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))], 1)


def _work_times(log: Path) -> list[dict[str, Any]]:
    lines = []
    for raw in log.read_text(encoding="utf-8", errors="replace").splitlines():
        if raw.startswith("{") and '"path":"/v1/search"' in raw:
            lines.append(json.loads(raw))
    return lines


def run(rows: int, seconds: float, attackers: int, workdir: Path) -> dict[str, Any]:
    built = hidden_world.build(workdir / "warehouse", rows)
    port, log = free_port(), workdir / "replica.log"
    replica = serve_replica(str(built.folder), port, log, RAGWARDEN_SERVER_TIMING="0")
    url = f"http://127.0.0.1:{port}"
    other = token_for(built.other.removeprefix("user:"), built.tenant)
    prober = token_for(built.reader.removeprefix("user:"), built.tenant)
    attack = {"query": "salary review for ops", "k": 1000, "mode": "hybrid", "filter": worst_filter()}
    deadline = Settings().search_deadline_seconds
    try:
        _drive(url, other, 2, None)  # warm: the other caller's rows held
        _drive(url, prober, 2, attack)  # and the prober's
        idle = _drive(url, other, seconds, None)
        context = multiprocessing.get_context("spawn")
        ready, stop, counts = context.Event(), context.Event(), context.Value("i", 0)
        process = context.Process(target=_attackers, args=(url, prober, attackers, attack, ready, stop, counts))
        process.start()
        ready.wait(60)
        time.sleep(1.0)  # the attack under way
        attacked = _drive(url, other, seconds, None)
        stop.set()
        process.join(120)
    finally:
        replica.terminate()
        replica.wait(30)
    lines = _work_times(log)
    accepted = [line for line in lines if line["status"] == 200]
    stopped = [line for line in lines if line["status"] == 503]
    idle_p50 = _pct(idle, 0.5)
    result = {
        "rows": rows, "attackers": attackers, "seconds": seconds, "filter_bytes": len(json.dumps(attack["filter"], separators=(",", ":"))),
        "filter_conditions": len(attack["filter"]["$or"]),
        "other_idle": {"searches": len(idle), "p50_ms": idle_p50, "p99_ms": _pct(idle, 0.99)},
        "other_attacked": {"searches": len(attacked), "p50_ms": _pct(attacked, 0.5), "p99_ms": _pct(attacked, 0.99)},
        "p99_over_idle_p50": round(_pct(attacked, 0.99) / idle_p50, 2), "target_ratio": TARGET_RATIO,
        "attack_searches": int(counts.value), "deadline_s": deadline,
        "longest_accepted_work_ms": max((line["app_ms"] for line in accepted), default=0.0),
        "stopped_at_deadline_or_refused": len(stopped),
        "median_attack_work_ms": statistics.median([line["app_ms"] for line in accepted if line.get("work", {}).get("filter_rows")] or [0.0]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }  # fmt: skip
    result["met"] = result["p99_over_idle_p50"] <= TARGET_RATIO and result["longest_accepted_work_ms"] <= deadline * 1000
    return result


def main(argv: list[str] | None = None) -> int:
    parser = hidden_world.arguments("python -m ragwarden.bench.stall", __doc__)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--attackers", type=int, default=8)
    args = parser.parse_args(argv)
    hidden_world.recorded("stall.json", args.out, lambda workdir: run(args.rows, args.seconds, args.attackers, workdir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
