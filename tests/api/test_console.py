"""The compliance console in headless Chromium: sign in, search as yourself, a lineage graph,
receipts with filters and the chain's status, access review and inventory, who can read and
comparisons, their exports, and the layout an auditor reads (no word broken across lines, wide
tables and graphs scrolled, not cut); each page is saved as a screenshot
(``build/console-screenshots/``, or ``RAGWARDEN_SCREENSHOTS``) and checked for what it shows.

The console is a client of the API with the signed-in person's token, so these tests also check
that it shows nothing that person may not read, and compare what it shows with what the API
answers the same caller.
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
from ragwarden.wording import plural

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

    def download(self, button: str) -> str:
        """Press an export button; the text of the file it saves."""
        with self.page.expect_download() as download:
            self.page.click(button)
        return Path(download.value.path()).read_text(encoding="utf-8")

    def attributes(self, selector: str, name: str) -> list[str | None]:
        """The attribute ``name`` of each element ``selector`` finds."""
        return [element.get_attribute(name) for element in self.page.locator(selector).all()]

    def offered(self) -> list[str]:
        """The pages the navigation offers, in its order."""
        return [link.get_attribute("data-page") for link in self.page.locator("#nav a").all() if link.is_visible()]

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


ALL_PAGES = ["search", "trends", "lineage", "receipts", "review", "inventory", "readers", "compare"]
AUDIT_SUMMARIES = "#readers-summary, #compare-summary, #trends-summary"
AUDIT_PAGES = {f"#/lineage?id={LEGAL_DOC}": "Lineage", "#/receipts": "Receipts", "#/inventory?label=legal-hold": "Inventory",
               f"#/readers?doc_id={LEGAL_DOC}": "Who can read", "#/compare?b=user:alice": "Compare", "#/trends": "Trends"}  # fmt: skip


def test_a_person_without_audit_is_offered_no_audit_page_and_told_each_needs_the_audit_right(
    console: Console, console_at: Callable[[str], Console], demo_service_url: str, mint, as_user, demo_oracle,
    demo_warehouse: Warehouse,
) -> None:  # fmt: skip
    # What the console reads: whoami's rights, from the policy alone. dave holds no audit, carol does.
    assert "audit" not in as_user("dave").get("/v1/whoami").json()["rights"]
    assert "audit" in as_user("carol").get("/v1/whoami").json()["rights"]

    def dave_receipts() -> int:
        return len(demo_warehouse.audit.query(subject="user:dave", operation="audit"))

    before = dave_receipts()
    console.sign_in(mint("dave"))
    assert console.offered() == ["search", "review"]
    console.submit("search-form", query=LEGAL_QUERY, k="50")
    shown = {c.get_attribute("data-chunk-id") for c in console.page.locator("li.hit").all()}
    assert shown == demo_oracle("user:dave", "acme")
    assert console.texts("li.hit .hit-head .label") == [] and console.page.locator("li.hit a.lineage-link").count() == 0
    for hash_, title in AUDIT_PAGES.items():
        console.open(hash_)
        told = console.page.locator("#needs-audit").inner_text()
        assert told == f"{title} needs the audit right in acme, which user:dave does not hold.", hash_
        assert console.page.locator(f".error, #lineage-graph, #receipts, #inventory, {AUDIT_SUMMARIES}").count() == 0
    console.open("#/review?subject=user:carol")
    assert console.page.locator("#needs-audit").inner_text().startswith("The access review of user:carol needs the audit right")
    console.shot("03-needs-audit-for-dave")
    console.open("#/review")  # one's own access needs no audit
    assert console.page.locator("#review-subject").get_attribute("readonly") == ""
    assert console.page.locator("#review-summary").inner_text().startswith("user:dave can read ")
    console.settled(lambda: console.page.reload())
    assert console.offered() == ["search", "review"]
    asked = [url.split("/v1/", 1)[1] for url in console.requested if "/v1/audit/" in url or "/v1/lineage" in url]
    assert [a for a in asked if a != "audit/access-review?subject=user%3Adave"] == [], asked  # no probe at all
    reviews = [a for a in asked if a == "audit/access-review?subject=user%3Adave"]
    assert reviews and dave_receipts() == before + len(reviews), "each review of his own leaves its receipt; signing in none"
    auditor = console_at(demo_service_url)
    auditor.sign_in(mint("carol"))
    assert auditor.offered() == ALL_PAGES


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
    assert "1 chunk · 1 derived row · " in console.page.locator("#lineage-summary").inner_text()  # counts read as English
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
    assert console.page.locator("#lineage-summary").inner_text().endswith(" · erased 1 time")
    console.shot("04b-lineage-erased")


def test_receipts_show_the_chain_status_and_filter_by_subject_label_document_and_time(
    console: Console, mint, demo_warehouse: Warehouse
) -> None:
    # Its own receipts of legal-hold rows, not those other tests happened to leave before it.
    assert demo_warehouse.search(LEGAL_QUERY, subject="user:carol", tenant="acme", k=8)
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


def test_receipts_reviews_and_inventories_export_as_csv_and_json(console: Console, mint) -> None:
    console.sign_in(mint("carol"))
    console.open(f"#/receipts?doc_id={LEGAL_DOC}")
    status = console.page.locator("#chain-status").inner_text()
    total = int(console.page.locator("#receipts-pager").inner_text().split(" of ")[1].split(" ")[0])
    downloaded = console.download
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
    assert console.page.locator("#review-summary").inner_text().startswith(f"user:dave can read {plural(review.rows, 'row')} in acme")
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


def test_receipts_show_the_policy_each_was_decided_under_as_the_api_does(console: Console, mint, as_user) -> None:
    console.sign_in(mint("carol"))
    console.open(f"#/receipts?doc_id={LEGAL_DOC}")
    header = console.texts("#receipts thead th")
    assert header[-1] == "policy" and header.index("labels") == 10
    answered = as_user("carol").get("/v1/audit/receipts", params={"doc_id": LEGAL_DOC, "limit": 1000}).json()
    by_place = {f"{r['chain'][:8]} #{r['seq']}": r for r in answered}
    rows = console.page.locator("#receipts tbody tr").all()
    assert rows and any(r["policy_version"] for r in answered)
    for row in rows:
        receipt = by_place[row.locator("td").nth(0).inner_text()]
        cell = row.locator("td").nth(11)
        version = receipt["policy_version"]
        shown = (cell.inner_text(), cell.locator("span").get_attribute("title"))
        assert shown == ((version[:12], version) if version else ("none", None))
        labels = sorted({label for labels in receipt["chunk_labels"].values() for label in labels})
        assert [t.strip() for t in row.locator(".label").all_inner_texts()] == labels
    console.shot("05c-receipts-policy")


# In the browser: each word (a run of non-space characters) of the elements' text whose glyphs fall
# on more than one line, i.e. broken inside; and how many of the elements span several lines (so
# that wrapping, between words, did happen where the check looked).
BROKEN_WORDS = """(selector) => {
  const broken = [];
  let wrapped = 0;
  const lines = (rects) => new Set([...rects].filter((r) => r.width > 0).map((r) => Math.round(r.top))).size;
  for (const element of document.querySelectorAll(selector)) {
    const walker = document.createTreeWalker(element, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (const match of node.data.matchAll(/\\S+/g)) {
        const range = document.createRange();
        range.setStart(node, match.index);
        range.setEnd(node, match.index + match[0].length);
        if (lines(range.getClientRects()) > 1) broken.push(match[0]);
      }
    }
    const whole = document.createRange();
    whole.selectNodeContents(element);
    if (lines(whole.getClientRects()) > 1) wrapped += 1;
  }
  return { broken, wrapped, checked: document.querySelectorAll(selector).length };
}"""


def test_no_word_in_a_table_or_label_chip_is_broken_across_lines_and_wide_tables_scroll(
    console: Console, mint, as_user, demo_warehouse: Warehouse
) -> None:
    demo_warehouse.search(LEGAL_QUERY, subject="user:carol", tenant="acme", k=8)  # receipts with labels, legal-hold among them
    console.page.set_viewport_size({"width": 820, "height": 900})  # narrow: tables wrap, and the widest overflow
    console.sign_in(mint("carol"))
    pages = [f"#/receipts?doc_id={LEGAL_DOC}", "#/inventory?label=legal-hold", "#/review?subject=user:dave",
             f"#/readers?doc_id={LEGAL_DOC}", "#/trends?days=7", f"#/lineage?id={LEGAL_DOC}"]  # fmt: skip
    for hash_ in pages:
        console.open(hash_)
        found = console.page.evaluate(BROKEN_WORDS, "td, th, .label, .classification")
        assert found["checked"] > 0 and found["broken"] == [], (hash_, found["broken"])
        chips = console.page.evaluate("() => [...document.querySelectorAll('.label')].map((c) => [c.textContent, "
                                      "c.getClientRects().length])")  # fmt: skip
        assert all(lines == 1 for _, lines in chips), (hash_, chips)
    console.open(f"#/receipts?doc_id={LEGAL_DOC}")
    found = console.page.evaluate(BROKEN_WORDS, "#receipts td")
    assert found["wrapped"] > 0, "the documents and reasons wrap, between words"
    chips = {t.strip() for t in console.page.locator("#receipts .label").all_inner_texts()}
    answered = as_user("carol").get("/v1/audit/receipts", params={"doc_id": LEGAL_DOC, "limit": 1000}).json()
    assert "legal-hold" in chips and chips <= {label for r in answered for labels in r["chunk_labels"].values() for label in labels}
    console.shot("11-receipts-narrow-whole-words")
    box = console.page.locator(".table-scroll:has(#receipts)")
    assert box.evaluate("b => getComputedStyle(b).overflowX") == "auto"
    assert box.evaluate("b => b.scrollWidth > b.clientWidth"), "the table is wider than the page: its box scrolls"
    _assert_reached_by_scrolling(box, console.page.locator("#receipts tbody tr").first.locator("td").last)


def _assert_reached_by_scrolling(box: Any, element: Any) -> None:
    """``element`` lies beyond the scrolling ``box``'s right edge, and scrolling the box shows it:
    what is drawn at its centre then is it (not cut off by the box or anything around it)."""
    right = box.evaluate("b => b.getBoundingClientRect().right")
    assert element.evaluate("e => e.getBoundingClientRect().left") >= right - 1, "out of sight until scrolled"
    box.evaluate("b => { b.scrollLeft = b.scrollWidth; }")
    seen = element.evaluate("""e => {
      const r = e.getBoundingClientRect(), b = e.closest('.table-scroll, .graph').getBoundingClientRect();
      const hit = document.elementFromPoint((r.left + r.right) / 2, (r.top + r.bottom) / 2);
      return { inside: r.left >= b.left - 1 && r.right <= b.right + 1, hit: !!hit && (e === hit || e.contains(hit)) };
    }""")
    assert seen == {"inside": True, "hit": True}, seen


def test_the_lineage_graph_shows_whole_subjects_and_scrolls_to_its_erased_column(
    console_at: Callable[[str], Console], serve, small_warehouse: Warehouse, mint
) -> None:
    agent = "agent:cafeteria-menu-digest-for-the-whole-office"
    small_warehouse.search("cafeteria menu soup", subject="user:alice", tenant="acme", actor=agent, purpose="weekly digest", k=1)
    small_warehouse.forget("acme-memo", reason="retention ended")
    url = serve(small_warehouse)
    console = console_at(url)
    console.page.set_viewport_size({"width": 820, "height": 900})
    console.sign_in(mint("carol"))
    console.open("#/lineage?id=acme-memo")
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {mint('carol')}"}) as api:
        lineage = api.get("/v1/lineage/acme-memo").json()  # what the API answers the same caller
    graph = console.page.locator("#lineage-graph")
    drawn = {node.get_attribute("data-id"): node.locator("text").text_content() for node in graph.locator("g.node").all()}
    for r in lineage["receipts"]:
        text = drawn[f"receipt-{r['chain']}-{r['seq']}"]
        assert f"{r['outcome']} · {r['subject']}" in text and "…" not in text, text
    search = next(r for r in lineage["receipts"] if r["operation"] == "search")
    assert f"user:alice (agent {agent}) · weekly digest" in drawn[f"receipt-{search['chain']}-{search['seq']}"]
    (tombstone,) = lineage["tombstones"]
    assert drawn[f"tombstone-{tombstone['chain']}-{tombstone['seq']}"].endswith(f"by {tombstone['subject']}")
    fits = graph.evaluate("g => [...g.querySelectorAll('g.node')].map((n) => n.querySelector('text').getComputedTextLength() <= "
                          "n.querySelector('rect').width.baseVal.value - 8)")  # fmt: skip
    assert fits and all(fits), "each node's text is drawn whole inside its box"
    box = console.page.locator("#lineage-graph-box")
    assert box.evaluate("b => getComputedStyle(b).overflowX") == "auto" and box.evaluate("b => b.scrollWidth > b.clientWidth")
    assert graph.evaluate("g => g.getBoundingClientRect().width") >= box.evaluate("b => b.scrollWidth") - 20, "the graph is not cut"
    erased = graph.locator("g.node.tombstone")
    _assert_reached_by_scrolling(box, erased)
    assert "retention ended" in erased.locator("title").text_content()
    console.shot("04c-lineage-scrolled-to-erased")


def test_who_can_read_compare_and_lineage_export_what_they_show(console: Console, mint, as_user) -> None:
    console.sign_in(mint("carol"))
    carol = as_user("carol")

    def cells(table: str) -> list[list[str]]:
        return [[cell.inner_text() for cell in row.locator("td").all()] for row in console.page.locator(f"{table} tbody tr").all()]

    console.open(f"#/readers?doc_id={LEGAL_DOC}")
    shown = [["subject", *row] for row in cells("#readers-subjects")] + [["group", *row] for row in cells("#readers-groups")]
    exported = list(csv.reader(io.StringIO(console.download("#export-readers-csv"))))
    assert exported[0] == ["kind", "who", "rows", "through"] and exported[1:] == shown and shown
    answered = carol.get("/v1/audit/readers", params={"doc_id": LEGAL_DOC}).json()
    readers = json.loads(console.download("#export-readers-json"))
    assert readers.pop("exported_by") == "user:carol" and readers.pop("exported_at") and readers == answered
    assert [r["principal"] for r in answered["subjects"]] == [row[1] for row in shown if row[0] == "subject"]

    console.open("#/compare?a=user:alice&b=user:dave")
    shown = [[table.split("-", 1)[1].replace("-", "_"), *row, "yes" if marked == "differs" else "no"]
             for table in ("compare-by-source", "compare-by-label", "compare-by-classification")
             for row, marked in zip(cells(f"#{table}"), console.attributes(f"#{table} tbody tr", "class"), strict=True)]  # fmt: skip
    exported = list(csv.reader(io.StringIO(console.download("#export-compare-csv"))))
    assert exported[0] == ["counted_by", "name", "user:alice", "user:dave", "differs"] and exported[1:] == shown
    assert any(row[-1] == "yes" for row in shown) and any(row[-1] == "no" for row in shown)
    compared = json.loads(console.download("#export-compare-json"))
    reviews = [carol.get("/v1/audit/access-review", params={"subject": s}).json() for s in ("user:alice", "user:dave")]
    assert compared["subjects"] == ["user:alice", "user:dave"] and compared["reviews"] == reviews

    console.open(f"#/lineage?id={LEGAL_DOC}")
    graph = console.page.locator("#lineage-graph")
    exported = list(csv.reader(io.StringIO(console.download("#export-lineage-csv"))))
    assert exported[0] == ["kind", "id", "from", "classification", "labels", "time", "subject", "agent", "detail"]
    total = int(console.page.locator("#lineage-receipts-pager").inner_text().split(" of ")[1].split(",")[0])
    rows, receipts = [r for r in exported[1:] if r[0] != "receipt"], [r for r in exported[1:] if r[0] == "receipt"]
    drawn = [(n.get_attribute("class").split()[1], n.get_attribute("data-id")) for n in graph.locator("g.node").all()]
    assert len(receipts) == total and [(r[0], r[1]) for r in rows + receipts[:20]] == [d for d in drawn if d[0] != "receipt"] + \
        [d for d in drawn if d[0] == "receipt"], "every node the graph draws, its receipts the newest of all exported"  # fmt: skip
    edges = {(e.get_attribute("data-from"), e.get_attribute("data-to")) for e in graph.locator("line.edge").all()}
    drawn_ids = {node_id for _, node_id in drawn}
    assert edges == {(a, r[1]) for r in rows + receipts[:20] for a in r[2].split() if a in drawn_ids} and edges
    lineage = json.loads(console.download("#export-lineage-json"))
    answered = carol.get(f"/v1/lineage/{LEGAL_DOC}").json()  # asked after the page: its receipts, and those since
    assert lineage["item"] == LEGAL_DOC and lineage["receipts"] == answered["receipts"][: len(lineage["receipts"])]
    assert {k: lineage[k] for k in ("source", "chunks", "tags", "derived", "tombstones")} == {
        k: answered[k] for k in ("source", "chunks", "tags", "derived", "tombstones")}  # fmt: skip
    newest = [f"receipt-{r['chain']}-{r['seq']}" for r in reversed(lineage["receipts"])]
    assert newest == [r[1] for r in receipts], "the exported receipts are the JSON's, newest first"
    console.shot("12-lineage-exported")
