"""The compliance console in headless Chromium: sign in, search as yourself, a lineage graph,
receipts with filters and the chain's status, access review and inventory; each page is saved as
a screenshot (``build/console-screenshots/``, or ``RAGWARDEN_SCREENSHOTS``) and checked for what it shows.

The console is a client of the API with the signed-in person's token, so these tests also check
that it shows nothing that person may not read.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image
from support.browser import chromium

from ragwarden.errors import NotFoundError
from ragwarden.warehouse import Warehouse

REPO = Path(__file__).resolve().parents[2]
LEGAL_QUERY = "Ruiz matter investigation legal hold"
LEGAL_DOC = "acme-legal-001"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as launched:
        yield launched


@pytest.fixture(scope="module")
def screenshots() -> Path:
    folder = Path(os.environ.get("RAGWARDEN_SCREENSHOTS") or REPO / "build" / "console-screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class Console:
    """One browser tab on the console, with every URL it asked for."""

    def __init__(self, page: Any, base: str, screenshots: Path) -> None:
        self.page, self.base, self.screenshots = page, base, screenshots
        self.requested: list[str] = []
        page.on("request", lambda request: self.requested.append(request.url))
        self.response = page.goto(f"{base}/console/")

    def sign_in(self, token: str) -> None:
        self.page.fill("#token", token)
        self.settled(lambda: self.page.click("#sign-in button[type=submit]"))

    def settled(self, action: Callable[[], Any]) -> Any:
        """Run ``action`` and wait until the page it leads to has loaded everything it shows."""
        self.page.evaluate("document.querySelector('section.page')?.removeAttribute('data-ready')")
        action()
        return self.page.wait_for_selector("section.page[data-ready=true]", timeout=60_000)

    def open(self, hash_: str) -> Any:
        return self.settled(lambda: self.page.evaluate("hash => { location.hash = hash; }", hash_))

    def submit(self, form: str, **fields: str) -> Any:
        for selector, value in fields.items():
            self.page.fill(f"#{selector.replace('_', '-')}", value)
        return self.settled(lambda: self.page.click(f"#{form} button[type=submit]"))

    def texts(self, selector: str) -> list[str]:
        return [t.strip() for t in self.page.locator(selector).all_inner_texts()]

    def shot(self, name: str) -> Image.Image:
        """Save the whole page as ``name``.png; the image, to check it holds a rendered page."""
        png = self.page.screenshot(path=str(self.screenshots / f"{name}.png"), full_page=True)
        image = Image.open(io.BytesIO(png)).convert("L")
        low, high = image.getextrema()
        assert image.width >= 800 and high - low > 100, f"{name}.png looks blank"
        return image


@pytest.fixture
def console_at(browser: Any, screenshots: Path) -> Iterator[Callable[[str], Console]]:
    """Open the console of the service at a base URL, in a tab of its own (own session storage)."""
    contexts: list[Any] = []

    def open_console(base: str) -> Console:
        contexts.append(browser.new_context(viewport={"width": 1280, "height": 900}))
        return Console(contexts[-1].new_page(), base, screenshots)

    yield open_console
    for context in contexts:
        context.close()


@pytest.fixture
def console(console_at: Callable[[str], Console], demo_service_url: str) -> Console:
    """The demo service's console, signed in as no one yet."""
    return console_at(demo_service_url)


def test_sign_in_refuses_a_bad_token_and_names_the_person_of_a_good_one(console: Console, mint) -> None:
    console.page.fill("#token", mint("alice", key=b"z" * 32))
    console.page.click("#sign-in button[type=submit]")
    refused = console.page.locator("#sign-in-error").inner_text()
    assert refused.startswith("Sign-in failed: ") and "signature does not verify" in refused, refused
    assert console.page.locator("#nav").is_hidden()
    console.shot("01-sign-in-refused")
    console.sign_in(mint("alice"))
    assert console.page.locator("#signed-in-as").inner_text() == "Signed in as user:alice in acme"
    assert console.page.locator("#nav").is_visible()


def test_a_deep_link_opens_its_page_once_signed_in(console_at: Callable[[str], Console], demo_service_url: str, mint) -> None:
    console = console_at(f"{demo_service_url}")
    console.page.goto(f"{demo_service_url}/console/#/inventory?label=legal-hold")
    console.sign_in(mint("carol"))
    assert console.page.locator("#inventory-label").input_value() == "legal-hold"
    assert console.page.locator("#inventory td").count() > 0


def test_search_shows_each_hit_with_its_labels_and_why_it_was_visible(
    console: Console, mint, demo_warehouse: Warehouse, demo_oracle
) -> None:
    console.sign_in(mint("carol"))
    console.submit("search-form", query=LEGAL_QUERY, k="8")
    cards = console.page.locator("li.hit")
    assert cards.count() == 8
    expected = {h.chunk_id: h for h in demo_warehouse.search(LEGAL_QUERY, subject="user:carol", tenant="acme", k=8, mode="hybrid")}
    shown = [cards.nth(i).get_attribute("data-chunk-id") for i in range(8)]
    assert set(shown) == set(expected) and set(shown) <= demo_oracle("user:carol", "acme")
    for i, chunk_id in enumerate(shown):
        card, hit = cards.nth(i), expected[chunk_id]
        assert [t.strip() for t in card.locator(".hit-head .label").all_inner_texts()] == list(hit.labels)
        assert card.locator(".hit-head .classification").inner_text() == hit.classification.label
        assert card.locator(".reason").inner_text() == hit.reason
    assert "legal-hold" in console.texts("#manifest .label")
    cards.nth(0).locator("button.explain").click()
    steps = cards.nth(0).locator(".steps li")
    steps.first.wait_for()
    assert steps.count() >= 3 and all(t.startswith("✓") for t in steps.all_inner_texts())
    console.shot("02-search")


def test_a_person_sees_only_what_they_may_read_and_no_audit_page(console: Console, mint, demo_oracle) -> None:
    console.sign_in(mint("dave"))
    console.submit("search-form", query=LEGAL_QUERY, k="50")
    shown = {c.get_attribute("data-chunk-id") for c in console.page.locator("li.hit").all()}
    assert shown == demo_oracle("user:dave", "acme")
    assert console.texts("li.hit .hit-head .label") == []
    for hash_ in (f"#/lineage?id={LEGAL_DOC}", "#/receipts", "#/inventory?label=legal-hold", "#/review?subject=user:carol"):
        console.open(hash_)
        assert console.page.locator(".error").inner_text().startswith("forbidden: user:dave"), hash_
        assert console.page.locator("#lineage-graph, #receipts, #inventory, #review-summary").count() == 0
    console.shot("03-forbidden-for-dave")


def test_a_documents_lineage_is_drawn_from_source_to_chunks_derived_rows_and_receipts(
    console_at: Callable[[str], Console], serve, small_warehouse: Warehouse, mint
) -> None:
    (chunk,) = small_warehouse.store.chunks.chunk_ids_of("acme-budget")
    note = small_warehouse.derive("Budget review moved to Thursday.", parents=[chunk], subject="user:alice", tenant="acme")
    small_warehouse.search("budget review Thursday", subject="user:alice", tenant="acme", k=3)  # returns chunk and note
    console = console_at(serve(small_warehouse))
    console.sign_in(mint("carol"))  # the auditor
    lineage = small_warehouse.lineage("acme-budget", tenant="acme")  # as the console will find it (its own receipt comes after)
    console.open("#/lineage?id=acme-budget")
    graph = console.page.locator("#lineage-graph")

    def nodes(kind: str) -> list[str]:
        return sorted(n.get_attribute("data-id") for n in graph.locator(f"g.node.{kind}").all())

    assert nodes("source") == ["acme-budget"] and nodes("chunk") == [chunk] and nodes("derived") == [note.chunk_id]
    assert nodes("receipt") == sorted(f"receipt-{r['chain']}-{r['seq']}" for r in lineage["receipts"]) and lineage["receipts"]
    edges = {(e.get_attribute("data-from"), e.get_attribute("data-to")) for e in graph.locator("line.edge").all()}
    search = next(r for r in lineage["receipts"] if r["operation"] == "search")
    returned = f"receipt-{search['chain']}-{search['seq']}"
    assert {("acme-budget", chunk), (chunk, note.chunk_id), (chunk, returned), (note.chunk_id, returned)} <= edges
    assert "1 chunks · 1 derived rows" in console.page.locator("#lineage-summary").inner_text()
    for row in (chunk, note.chunk_id):  # each row with its classification and labels
        node = graph.locator(f"g.node[data-id='{row}']")
        assert "confidential" in node.get_attribute("class") and node.locator("text").text_content().endswith("· confidential")
        assert "labels finance" in node.locator("title").text_content()
    told = graph.locator(f"g.node[data-id='{returned}'] title").text_content()
    assert "by user:alice" in told and search["time"] in told
    console.shot("04-lineage")


def test_a_lineage_with_many_receipts_pages_them_and_shows_its_erasures(
    console_at: Callable[[str], Console], serve, small_warehouse: Warehouse, mint
) -> None:
    for n in range(23):
        small_warehouse.search("budget review Thursday", subject="user:alice", tenant="acme", k=1, purpose=f"weekly {n}")
    small_warehouse.forget("acme-memo", reason="retention ended")
    console = console_at(serve(small_warehouse))
    console.sign_in(mint("carol"))
    console.open("#/lineage?id=acme-budget")
    total = len(small_warehouse.lineage("acme-budget", tenant="acme")["receipts"])
    assert console.page.locator("#lineage-receipts-pager").inner_text().startswith(f"Receipts 1–20 of {total}")
    newest = console.page.locator("#lineage-graph g.node.receipt title").first.text_content()
    assert newest.endswith("purpose: weekly 22"), newest
    assert console.page.locator("#lineage-graph g.node.receipt").count() == 20
    groups = console.page.locator("#lineage-receipt-groups tbody tr")
    counted = {(row.locator("td").nth(0).inner_text(), row.locator("td").nth(3).inner_text()): int(row.locator("td").nth(4).inner_text())
               for row in groups.all()}  # fmt: skip
    assert sum(counted.values()) == total and counted[("returned", "weekly 7")] == 1
    console.settled(lambda: console.page.click("#lineage-older"))
    assert console.page.locator("#lineage-graph g.node.receipt").count() == total - 20
    console.open("#/lineage?id=acme-memo")
    erased = console.page.locator("#lineage-graph g.node.tombstone")
    assert erased.count() == 1 and "retention ended" in erased.locator("title").text_content()
    console.shot("04b-lineage-erased")


def test_receipts_show_the_chain_status_and_filter_by_subject_label_document_and_time(console: Console, mint) -> None:
    console.sign_in(mint("carol"))
    console.open("#/receipts")
    assert "intact" in console.page.locator("#chain-status").inner_text()
    console.submit("receipts-form", filter_subject="user:carol")
    subjects = console.texts("#receipts tbody td:nth-child(4)")
    assert subjects and set(subjects) == {"user:carol"}
    console.submit("receipts-form", filter_subject="", filter_label="legal-hold")
    rows = console.page.locator("#receipts tbody tr")
    assert rows.count() > 0
    assert all("legal-hold" in row.locator(".label").all_inner_texts() for row in rows.all())
    console.submit("receipts-form", filter_label="", filter_document=LEGAL_DOC)
    documents = console.texts("#receipts tbody td:nth-child(10)")
    assert documents and all(LEGAL_DOC in d.split(", ") for d in documents)
    console.shot("05-receipts")
    console.submit("receipts-form", filter_document="", filter_since="2099-01-01T00:00:00")
    assert console.page.locator("#receipts").inner_text() == "No receipts match these filters."


def test_receipts_come_in_pages_with_their_total_and_filter_by_operation_and_outcome(
    console: Console, mint, demo_warehouse: Warehouse
) -> None:
    for n in range(60):  # more receipts than a page holds, whatever ran before
        demo_warehouse.search(f"cafeteria menu {n}", subject="user:dave", tenant="acme", k=1)
    with pytest.raises(NotFoundError):  # and a refusal: dave derives from a row he may not read
        demo_warehouse.derive("x", parents=demo_warehouse.store.chunks.chunk_ids_of(LEGAL_DOC)[:1], subject="user:dave", tenant="acme")
    console.sign_in(mint("carol"))
    console.open("#/receipts")
    pager = console.page.locator("#receipts-pager").inner_text()
    total = int(pager.split(" of ")[1].split(" ")[0])
    assert pager.startswith("Receipts 1–50 of ") and total > 50, pager
    assert console.page.locator("#receipts tbody tr").count() == 50
    first = console.texts("#receipts tbody td:nth-child(1)")
    console.settled(lambda: console.page.click("#receipts-older"))
    assert console.page.locator("#receipts-pager").inner_text().startswith("Receipts 51–")
    assert f" of {total}" in console.page.locator("#receipts-pager").inner_text(), "the pages stay on the log as it stood"
    console.settled(lambda: console.page.click("#receipts-newer"))
    assert console.texts("#receipts tbody td:nth-child(1)") == first, "no receipt written since shifts the pages"
    console.settled(lambda: (console.page.select_option("#filter-allowed", "false"), console.page.select_option("#filter-operation", "derive"),
                             console.page.click("#receipts-form button[type=submit]")))  # fmt: skip
    rows = console.page.locator("#receipts tbody tr")
    assert rows.count() > 0
    assert set(console.texts("#receipts tbody td:nth-child(3)")) == {"derive"}
    assert set(console.texts("#receipts tbody td:nth-child(7)")) == {"no"}
    assert {"purpose", "withheld"} <= set(console.texts("#receipts thead th"))
    options = console.page.locator("#known-labels option, #known-documents option, #known-subjects option")
    offered = {option.get_attribute("value") for option in options.all()}
    assert {"legal-hold", LEGAL_DOC, "user:carol"} <= offered
    console.shot("05b-receipts-paged")


def test_the_chains_are_verified_once_a_session_and_again_on_demand(console: Console, mint, demo_warehouse: Warehouse) -> None:
    def verifications() -> int:
        return sum(r.reason.startswith("audit verify") for r in demo_warehouse.audit.query(subject="user:carol", operation="audit"))

    before = verifications()
    console.sign_in(mint("carol"))
    for _ in range(2):
        console.open("#/search")
        console.open("#/receipts")
    assert verifications() == before + 1, "the second open showed the kept verification"
    with console.page.expect_response(lambda response: "/v1/audit/verify" in response.url):
        console.page.click("#verify-again")
    console.page.wait_for_function("() => !document.querySelector('#verify-again').disabled")
    assert verifications() == before + 2


def test_receipts_reviews_and_inventories_export_as_csv_and_json(console: Console, mint, tmp_path: Path) -> None:
    console.sign_in(mint("carol"))
    console.open(f"#/receipts?doc_id={LEGAL_DOC}")
    status = console.page.locator("#chain-status").inner_text()
    total = int(console.page.locator("#receipts-pager").inner_text().split(" of ")[1].split(" ")[0])

    def downloaded(button: str) -> str:
        with console.page.expect_download() as download:
            console.page.click(button)
        return Path(download.value.path()).read_text(encoding="utf-8")

    exported = json.loads(downloaded("#export-receipts-json"))
    assert exported["verified"]["checkpoint"] in status and exported["tenant"] == "acme"
    assert len(exported["receipts"]) == total and all(LEGAL_DOC in r["doc_ids"] for r in exported["receipts"])
    rows = list(csv.reader(io.StringIO(downloaded("#export-receipts-csv"))))
    assert rows[0][:5] == ["chain", "seq", "time", "operation", "subject"] and rows[0][-2:] == ["verified_checkpoint", "verified_at"]
    assert len(rows) - 1 == total and {row[-2] for row in rows[1:]} == {exported["verified"]["checkpoint"]}
    console.open("#/review?subject=user:dave")
    review = json.loads(downloaded("#export-review-json"))
    assert review["subject"] == "user:dave" and review["exported_by"] == "user:carol"
    assert list(csv.reader(io.StringIO(downloaded("#export-review-csv"))))[0] == ["counted_by", "name", "rows"]
    _assert_csv_cells_round_trip_and_start_no_formula(console)
    console.open("#/inventory?label=legal-hold")
    inventory = list(csv.reader(io.StringIO(downloaded("#export-inventory-csv"))))
    assert inventory[0] == ["label", "source", "row"] and {row[1] for row in inventory[1:]} >= {LEGAL_DOC}


HOSTILE_CELLS = ["=SUM(A1)", "-2+3", 'x,"y', "a;=1+1", "ok\n@cmd", "\tz", " =1", "a\r\n+b", "fine", "", "O'Neil",
                 'say "hi"', "x\t=HYPERLINK(1)"]  # fmt: skip


def _assert_csv_cells_round_trip_and_start_no_formula(console: Console) -> None:
    """The console's CSV, parsed as RFC 4180 says: every cell reads back as written but for an
    apostrophe before whatever a spreadsheet could run as a formula, wherever the cell could be
    split (a separator of any locale, a quote, a line break)."""
    exported = console.page.evaluate("(cells) => csv(['a', 'b'], cells.map((c) => [c, c]))", HOSTILE_CELLS)
    rows = list(csv.reader(io.StringIO(exported, newline="")))
    assert rows[0] == ["a", "b"] and len(rows) == len(HOSTILE_CELLS) + 1
    for given, (cell, again) in zip(HOSTILE_CELLS, rows[1:], strict=True):
        assert cell == again and re.sub(r"'(?=\s*[=+\-@]|[\t\r])", "", cell) == given, (given, cell)
        assert not any(part.lstrip().startswith(("=", "+", "-", "@")) for part in re.split(r'[,;\t\r\n"]', cell)), cell


def test_who_can_read_a_document_and_two_subjects_side_by_side(console: Console, mint, demo_warehouse: Warehouse) -> None:
    console.sign_in(mint("carol"))
    console.open("#/readers")
    console.submit("readers-form", readers_document=LEGAL_DOC)
    found = demo_warehouse.readers(caller="user:carol", tenant="acme", doc_id=LEGAL_DOC)
    assert console.texts("#readers-subjects td:nth-child(1)") == [r.principal for r in found.subjects]
    assert console.texts("#readers-subjects td:nth-child(3)") == [r.path for r in found.subjects]
    assert "user:bob" not in console.texts("#readers-subjects td:nth-child(1)"), "bob is walled off from the Ruiz matter"
    assert console.texts("#readers-groups td:nth-child(1)") == [r.principal for r in found.groups]
    console.shot("08-who-can-read")
    console.open("#/compare")
    console.submit("compare-form", compare_a="user:alice", compare_b="user:dave")
    alice = demo_warehouse.access_review(subject="user:alice", tenant="acme", caller="user:carol")
    dave = demo_warehouse.access_review(subject="user:dave", tenant="acme", caller="user:carol")
    rows = console.page.locator("#compare-by-source tbody tr")
    shown = {row.locator("td").nth(0).inner_text(): (row.locator("td").nth(1).inner_text(), row.locator("td").nth(2).inner_text(),
                                                       row.get_attribute("class")) for row in rows.all()}  # fmt: skip
    for source in set(alice.by_source) | set(dave.by_source):
        x, y = alice.by_source.get(source, 0), dave.by_source.get(source, 0)
        assert shown[source] == (str(x), str(y), "same" if x == y else "differs"), source
    console.shot("09-compare")


def test_trends_draw_the_receipts_days_labels_and_documents(console: Console, mint, demo_warehouse: Warehouse) -> None:
    for _ in range(2):
        demo_warehouse.search(LEGAL_QUERY, subject="user:carol", tenant="acme", k=3)
    console.sign_in(mint("carol"))
    console.open("#/trends?days=7")
    found = demo_warehouse.trends(caller="user:carol", tenant="acme", days=7)

    def drawn(chart: str, series: str) -> list[int]:
        bars = console.page.locator(f"#{chart} rect.bar[data-series='{series}'][data-day]")
        return [int(bar.get_attribute("data-value")) for bar in bars.all()]

    searches = drawn("trends-activity", "searches")
    assert len(searches) == 7 and searches[:-1] == list(found.searches[:-1]) and searches[-1] >= found.searches[-1] - 1
    assert drawn("trends-activity", "refusals")[:-1] == list(found.refusals[:-1])
    assert "legal-hold" in found.label_days and len(drawn("trends-labels", "legal-hold")) == 7
    assert console.texts("#trends-documents td:nth-child(1)")[0] in found.top_documents
    assert console.page.locator("#nav a[data-page=trends]").is_visible()
    console.shot("10-trends")


def test_access_review_and_inventory_agree_with_the_warehouse(console: Console, mint, demo_warehouse: Warehouse) -> None:
    console.sign_in(mint("carol"))
    console.open("#/review")
    assert console.page.locator("#review-subject").input_value() == "user:carol"
    console.submit("review-form", review_subject="user:dave")
    review = demo_warehouse.access_review(subject="user:dave", tenant="acme")
    assert console.page.locator("#review-summary").inner_text().startswith(f"user:dave can read {review.rows} rows in acme")
    by_source = dict(zip(console.texts("#review-by-source td:nth-child(1)"), console.texts("#review-by-source td:nth-child(2)"), strict=True))
    assert by_source == {doc: str(n) for doc, n in review.by_source.items()}
    console.shot("06-access-review")
    console.open("#/inventory")
    console.submit("inventory-form", inventory_label="legal-hold")
    found = demo_warehouse.inventory(label="legal-hold", tenant="acme", caller="user:carol")
    assert console.texts("#inventory td:nth-child(1)") == list(found)
    assert console.texts("#inventory td:nth-child(2)") == [str(len(rows)) for rows in found.values()]
    console.shot("07-inventory")


def test_the_console_loads_nothing_from_elsewhere_and_forbids_other_origins(console: Console, mint) -> None:
    console.sign_in(mint("alice"))
    console.submit("search-form", query="salary bands", k="3")
    assert console.requested and all(url.startswith(console.base + "/") for url in console.requested), console.requested
    headers = httpx.get(f"{console.base}/console/console.js").headers
    assert "script-src 'self'" in headers["content-security-policy"] and headers["x-content-type-options"] == "nosniff"
    assert console.response.headers["content-security-policy"] == headers["content-security-policy"]
