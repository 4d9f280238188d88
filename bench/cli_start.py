"""How long a command that never embeds takes, end to end, as a shell runs it.

Such commands (``policy check``, ``audit verify``, ``lineage``, ...) never import PyTorch or an
ONNX runtime: their time is the interpreter's start, the CLI's imports (LanceDB most of it) and
the work. Each is run ``--runs`` times in a fresh process on a small warehouse; the median is
recorded in ``bench/results/cli_start.json`` with the date and machine, which the README quotes
(``python -m ragwarden.bench.figures``).

    python -m ragwarden.bench.cli_start [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from ..policies import policy_file

RESULTS = Path(__file__).resolve().parent / "results"


def timed(command: list[str], env: dict[str, str]) -> float:
    """Seconds ``command`` takes from its start to its exit (which must be 0)."""
    started = time.perf_counter()
    subprocess.run(command, env=env, check=True, capture_output=True, timeout=300)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS / "cli_start.json")
    args = parser.parse_args(argv)
    script = str(Path(sys.executable).with_name("ragwarden"))
    with tempfile.TemporaryDirectory() as folder:
        warehouse = str(Path(folder) / "warehouse")
        env = {**os.environ, "RAGWARDEN_WAREHOUSE": warehouse, "HF_HUB_OFFLINE": "1"}
        subprocess.run([script, "policy", "install", str(policy_file("demo.csv"))], env=env, check=True, capture_output=True)
        commands = {"--help": ["--help"], "policy check": ["policy", "check", str(policy_file("demo.csv"))],
                    "audit verify": ["audit", "verify"]}  # fmt: skip
        medians = {name: round(statistics.median(timed([script, *words], env) for _ in range(args.runs)), 2)
                   for name, words in commands.items()}  # fmt: skip
    record = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "cpus": os.cpu_count(),
              "runs": args.runs, "median_seconds": medians}  # fmt: skip
    args.out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
