"""``ragwarden demo``: one shared index, four people, the same questions, different answers."""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path
from typing import Any

import click
import yaml

from ..config import Settings
from ..governance.compiler import SubjectView
from ..policies import policy_file
from ..warehouse import Warehouse


def _demo_file(name: str) -> Path:
    return Path(str(files("ragwarden.examples").joinpath("demo", name)))


def run_demo(settings: Settings, *, as_json: bool = False) -> dict[str, Any]:
    """Ingest the demo corpus, install the demo policy (unless one is given), and show the answers."""
    warehouse = Warehouse(settings)
    if settings.policy is None:
        warehouse.install_policy(policy_file("demo.csv"))
    corpus = _demo_file("corpus.jsonl")
    report = warehouse.ingest(corpus, progress=None)
    scenario = yaml.safe_load(_demo_file("scenario.yaml").read_text(encoding="utf-8"))
    titles = {
        record["id"]: record.get("metadata", {}).get("title", record["id"])
        for record in map(json.loads, corpus.read_text(encoding="utf-8").splitlines())
    }
    policy = warehouse.policy
    assert policy is not None
    people = []
    for person in scenario["people"]:
        view = SubjectView.of(policy, person["subject"], person["tenant"])
        people.append(
            {
                **person,
                "groups": sorted(p for p in view.principals if p.startswith("group:")),
                "cleared_labels": sorted(view.cleared_labels),
                "clearance": policy.clearance_of(person["subject"], person["tenant"]).label,
            }
        )
    answers = []
    for question in scenario["questions"]:
        rows = []
        for person in people:
            hits = warehouse.search(
                question, subject=person["subject"], tenant=person["tenant"], k=scenario["k"], mode="hybrid"
            )
            rows.append({"subject": person["subject"], "hits": [{**h.as_dict(), "title": titles.get(h.doc_id)} for h in hits]})
        answers.append({"question": question, "answers": rows})
    result = {"warehouse": settings.warehouse, "ingest": report.summary(), "people": people, "questions": answers}
    if as_json:
        click.echo(json.dumps(result, indent=2, ensure_ascii=False))
    else:
        _print(result)
    return result


def _print(result: dict[str, Any]) -> None:
    click.echo(f"warehouse {result['warehouse']}: {result['ingest']}\n")
    click.secho("Who is asking", bold=True)
    for person in result["people"]:
        click.echo(
            f"  {person['who']} ({person['subject']}, tenant {person['tenant']}): groups {', '.join(person['groups']) or '-'}; "
            f"labels {', '.join(person['cleared_labels']) or '-'}; clearance {person['clearance']}"
        )
    whos = {p["subject"]: p["who"] for p in result["people"]}
    for block in result["questions"]:
        click.echo()
        click.secho(f"Q: {block['question']}", bold=True)
        for row in block["answers"]:
            click.secho(f"  {whos[row['subject']]}", fg="cyan")
            if not row["hits"]:
                click.echo("    (nothing this person may read matches)")
            for hit in row["hits"]:
                labels = ", ".join(hit["labels"]) or "no labels"
                click.echo(f"    - {hit['title']} [{hit['doc_id']}; {hit['classification']}; {labels}]")
                click.echo(f"      why: {hit['reason']}")
