"""Ingest on a GPU against the CPU: SciFact documents/s end to end (chunk, embed, govern, write)
with the embedder on ``cuda`` and on ``cpu``, each at its device's batch size, in one run.

    python -m ragwarden.bench.gpu_ingest [--limit N] [--cpu-limit N] [--out FILE.json]

Run it on a machine with a CUDA GPU (``make bench-gpu``); without one it says so and exits 2.
The CPU leg ingests ``--cpu-limit`` documents (1,000 by default) to keep the run short; the
rates are per document, so they compare.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ragwarden.config import Settings
from ragwarden.embedder import Embedder
from ragwarden.warehouse import Warehouse

from . import scifact


def ingest_rate(device: str, corpus: Path, policy: Path, work: Path) -> dict[str, Any]:
    """Documents per second of one end-to-end ingest with the embedder on ``device``."""
    embedder = Embedder(device=device)
    embedder.encode(["warm up the model on the device"])
    warehouse = Warehouse(Settings(warehouse=str(work / f"wh-{device}"), policy=str(policy)), embedder=embedder)
    started = time.perf_counter()
    report = warehouse.ingest(corpus)
    seconds = time.perf_counter() - started
    return {"device": embedder.device, "batch_size": embedder.batch_size, "documents": report.documents,
            "chunks": report.chunks, "seconds": round(seconds, 2), "documents_per_s": round(report.documents / seconds, 1)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ragwarden.bench.gpu_ingest", description=__doc__)
    parser.add_argument("--limit", type=int, default=None, help="SciFact documents on the GPU (all by default)")
    parser.add_argument("--cpu-limit", type=int, default=1000, help="SciFact documents on the CPU")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures here as JSON")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU is visible to torch: run this on a GPU machine", file=sys.stderr)
        return 2
    folder = Settings.from_env().data_dir / "scifact"
    figures: dict[str, Any] = {"gpu": torch.cuda.get_device_name(0)}
    with tempfile.TemporaryDirectory(prefix="ragwarden-gpu-ingest-") as tmp:
        work = Path(tmp)
        policy = work / "policy.csv"
        policy.write_text(scifact.POLICY, encoding="utf-8")
        for device, limit in (("cuda", args.limit), ("cpu", args.cpu_limit)):
            corpus = work / f"scifact-{device}.jsonl"
            scifact.write_records_jsonl(folder, corpus, limit)
            figures[device] = ingest_rate(device, corpus, policy, work)
            print(f"{device}: {figures[device]}", flush=True)
    figures["speedup"] = round(figures["cuda"]["documents_per_s"] / figures["cpu"]["documents_per_s"], 2)
    print(f"GPU ({figures['gpu']}) / CPU: {figures['speedup']}x documents/s")
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
