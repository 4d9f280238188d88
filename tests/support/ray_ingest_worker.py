"""Run as a script inside the test's network namespace: ingest a corpus with the Ray engine while
one chunk-and-embed actor is killed with SIGKILL once the first batch is committed (Ray restarts
it and retries its work), then record every listening socket of the processes in this namespace and the
interfaces that are up.

    python ray_ingest_worker.py WAREHOUSE CORPUS OUT.json
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading

import psutil

from ragwarden.config import Settings
from ragwarden.warehouse import Warehouse


def listening_sockets() -> list[dict[str, object]]:
    """Every listening TCP or UDP socket of every process in this network namespace."""
    here = os.readlink("/proc/self/ns/net")
    found = []
    for process in psutil.process_iter(["pid", "name"]):
        try:
            if os.readlink(f"/proc/{process.pid}/ns/net") != here:
                continue
            for connection in process.net_connections(kind="inet"):
                if connection.status == psutil.CONN_LISTEN or not connection.raddr:
                    found.append({"process": process.info["name"], "address": connection.laddr.ip, "port": connection.laddr.port})
        except (psutil.Error, OSError):
            continue
    return found


def kill_one_actor(warehouse: Warehouse, killed: list[str], done: threading.Event) -> None:
    """SIGKILL one chunk-and-embed actor as soon as the ingest has committed its first batch."""
    while not done.wait(0.1):
        if warehouse.store.chunks.count() == 0:
            continue
        for process in psutil.process_iter(["pid", "cmdline"]):
            command = " ".join(process.info["cmdline"] or [])
            if "ChunkAndEmbed" in command:
                os.kill(process.pid, signal.SIGKILL)
                killed.append(command.split()[0])
                return


def main(warehouse: str, corpus: str, out: str) -> None:
    import ray

    target = Warehouse(Settings.from_env(warehouse=warehouse, ray_actors=2, write_batch_docs=4))
    killed: list[str] = []
    done = threading.Event()
    threading.Thread(target=kill_one_actor, args=(Warehouse(target.settings), killed, done), daemon=True).start()
    report = target.ingest(corpus, engine="ray")
    done.set()
    figures = {
        "killed": killed,
        "documents": report.documents,
        "chunks": report.chunks,
        "rejected": [r.reason for r in report.rejected],
        "sockets": listening_sockets(),
        "interfaces_up": sorted(name for name, stats in psutil.net_if_stats().items() if stats.isup),
        "ray_processes": sorted({p.info["name"] for p in psutil.process_iter(["name"]) if "ray" in (p.info["name"] or "")}),
    }
    ray.shutdown()
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(figures, handle)


if __name__ == "__main__":
    main(*sys.argv[1:4])
