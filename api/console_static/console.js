// The ragwarden compliance console: a client of the /v1 API with the signed-in person's token.
// Every page asks the API, so it shows what the policy lets that person see and nothing more.
// Text from the warehouse is only ever set as text (never as HTML).
"use strict";

const API_ROOT = new URL("../v1/", document.baseURI);
const TOKEN_KEY = "ragwarden.token";
const SVG_NS = "http://www.w3.org/2000/svg";
const RECEIPTS_PAGE = 50;
const EXPORT_PAGE = 1000; // the most receipts the API gives per request
const VERIFIED_KEY = "ragwarden.verified"; // the last chain verification, kept for the session
const OPERATIONS = ["search", "get", "ingest", "derive", "sync", "forget", "explain", "audit", "admin", "provision"];
const PAGES = { search: searchPage, lineage: lineagePage, receipts: receiptsPage, review: reviewPage, inventory: inventoryPage,
  readers: readersPage, compare: comparePage, trends: trendsPage };
// The pages that need the audit right (the access review needs it only for another's access).
const AUDIT_PAGES = new Set(["trends", "lineage", "receipts", "inventory", "readers", "compare"]);

let identity = null; // {subject, tenant, actor, method} from /v1/whoami
let mayAudit = false; // whether that caller holds audit in its tenant (holdsAudit)

// ------------------------------------------------------------------ building blocks

// A count with its noun in the number it takes: "1 result", "2 results".
function plural(count, noun, nouns = `${noun}s`) {
  return `${count} ${count === 1 ? noun : nouns}`;
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  setAttributes(node, attrs);
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  setAttributes(node, attrs);
  for (const child of children.flat()) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return node;
}

function setAttributes(node, attrs) {
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
}

function field(label, input) {
  return el("label", { class: "field" }, el("span", {}, label), input);
}

// A page's form: submitting it moves to `page` with what `values()` reads off the inputs.
function toolbar(id, fields, button, page, values) {
  const form = el("form", { id, class: "toolbar" }, fields, el("button", { type: "submit" }, button));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    go(page, values());
  });
  return form;
}

function problem(error) {
  return el("p", { class: "error", role: "alert" }, error.code ? `${error.code}: ${error.message}` : String(error.message || error));
}

function chips(labels) {
  return el("span", { class: "labels" }, labels.length ? labels.map((l) => el("span", { class: "label" }, l)) : el("span", { class: "none" }, "no labels"));
}

// Text as its words, each kept whole (a hyphenated id too): a line wraps at spaces only, and a word
// wider than its cell widens the table, which then scrolls.
function words(text) {
  return String(text).split(/( +)/).filter(Boolean).map((part) => (part.trim() ? el("span", { class: "word" }, part) : part));
}

function badge(classification) {
  return el("span", { class: `classification ${classification}` }, classification);
}

// A table in a box that scrolls sideways when its words are wider than the page; ``rowClass(i)``
// classes the i-th row. Text cells wrap between words only (``words``).
function table(columns, rows, attrs = {}, rowClass = () => null) {
  const cell = (tag, content) => el(tag, {}, content instanceof Node ? content : words(content));
  return el("div", { class: "table-scroll" }, el("table", attrs,
    el("thead", {}, el("tr", {}, columns.map((c) => cell("th", c)))),
    el("tbody", {}, rows.map((cells, i) => el("tr", { class: rowClass(i) }, cells.map((c) => cell("td", c)))))));
}

function counts(title, key, entries, id) {
  const rows = Object.entries(entries).map(([name, n]) => [name, String(n)]);
  return el("section", { class: "counts", id },
    el("h3", {}, title),
    rows.length ? table([key, "rows"], rows) : el("p", { class: "empty" }, "none"));
}

// ------------------------------------------------------------------ the API and the session

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

async function api(path, { method = "GET", body, params, withTotal = false } = {}) {
  const url = new URL(path, API_ROOT);
  for (const [name, value] of Object.entries(params || {})) if (value) url.searchParams.set(name, value);
  const token = sessionStorage.getItem(TOKEN_KEY) || "";
  const headers = { Authorization: `Bearer ${token}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(url, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (error) {
    throw new ApiError(0, "unreachable", `the service did not answer (${error.message})`);
  }
  const data = await response.json().catch(() => null);
  if (response.ok) return withTotal ? { data, total: Number(response.headers.get("X-Total-Count")) } : data;
  const error = (data && data.error) || {};
  // Only the credential this request carried is dropped: a newer sign-in stays. Refused before
  // anyone was signed in, it is a failed sign-in; after, a sign-out (an expired token, say).
  if (response.status === 401 && sessionStorage.getItem(TOKEN_KEY) === token) {
    signOut(`${identity ? "Signed out" : "Sign-in failed"}: ${error.message || "the credential was refused"}`);
  }
  throw new ApiError(response.status, error.code || "http_error", error.message || `HTTP ${response.status}`);
}

function signOut(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  sessionStorage.removeItem(VERIFIED_KEY);
  identity = null;
  mayAudit = false;
  renderSignIn(message);
}

function renderIdentity() {
  const who = document.getElementById("who");
  document.getElementById("nav").hidden = !identity;
  for (const link of document.querySelectorAll("#nav a")) link.hidden = AUDIT_PAGES.has(link.dataset.page) && !mayAudit;
  if (!identity) {
    who.replaceChildren();
    return;
  }
  who.replaceChildren(
    el("span", { id: "signed-in-as" }, "Signed in as ", el("strong", {}, identity.subject), " in ", el("strong", {}, identity.tenant),
      identity.actor ? ` (agent ${identity.actor})` : ""),
    el("button", { id: "sign-out", type: "button", onclick: () => signOut("Signed out.") }, "Sign out"));
}

function renderSignIn(message) {
  renderIdentity();
  const token = el("textarea", { id: "token", rows: 4, required: true, autocomplete: "off", spellcheck: "false",
    placeholder: "A token from your identity provider, or an API key (rwk_...)" });
  const form = el("form", { id: "sign-in", class: "card" },
    el("h2", {}, "Sign in"),
    el("p", {}, "The console acts as the person the credential names, with exactly that person's access."),
    field("Token or API key", token),
    el("button", { type: "submit" }, "Sign in"));
  const note = message ? el("p", { class: "error", role: "alert", id: "sign-in-error" }, message) : null;
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, token.value.trim());
    if (await whoami()) route(); // the page that was asked for, deep links included
  });
  document.getElementById("main").replaceChildren(form, note || "");
  token.focus();
}

// Who the stored credential names, and whether it holds audit; on any failure, the sign-in form says why (false).
async function whoami() {
  try {
    identity = await api("whoami");
    mayAudit = holdsAudit();
  } catch (error) {
    if (error.status !== 401) signOut(`Could not sign in: ${error.code}: ${error.message}`);
    return false; // a 401 has signed out already, with its reason
  }
  renderIdentity();
  return true;
}

// Whether the signed-in caller holds audit, so that the console offers the audit pages only to an
// auditor: whoami says the caller's rights (read from the policy, with no receipt). A page that
// still meets a 403 (the right was taken away since) hides the audit pages (keepAudit).
function holdsAudit() {
  return Array.isArray(identity.rights) && identity.rights.includes("audit");
}

function keepAudit(audit) {
  mayAudit = audit;
}

// What a page that needs audit says to a caller without it, in place of the page.
function needsAudit(what) {
  return el("p", { id: "needs-audit", class: "needs-audit card", role: "note" },
    `${what} needs the audit right in ${identity.tenant}, which ${identity.subject} does not hold.`);
}

function pageTitle(page) {
  return document.querySelector(`#nav a[data-page="${page}"]`).textContent;
}

// ------------------------------------------------------------------ pages

function parseHash() {
  const rest = location.hash.replace(/^#\/?/, "");
  const cut = rest.indexOf("?");
  const [page, query] = cut < 0 ? [rest, ""] : [rest.slice(0, cut), rest.slice(cut + 1)];
  return { page: PAGES[page] ? page : "search", params: new URLSearchParams(query || "") };
}

function go(page, params) {
  const query = new URLSearchParams(Object.entries(params).filter(([, v]) => v)).toString();
  const hash = `#/${page}${query ? `?${query}` : ""}`;
  if (location.hash === hash) route();
  else location.hash = hash;
}

async function route() {
  if (!identity) return;
  const { page, params } = parseHash();
  for (const link of document.querySelectorAll("#nav a")) link.classList.toggle("active", link.dataset.page === page);
  const main = document.getElementById("main");
  const view = el("section", { id: `page-${page}`, class: "page" });
  main.replaceChildren(view);
  try {
    if (AUDIT_PAGES.has(page) && !mayAudit) view.append(needsAudit(pageTitle(page)));
    else await PAGES[page](view, params);
  } catch (error) {
    if (error.status === 403 && AUDIT_PAGES.has(page)) { // audit was taken away since it was learned
      keepAudit(false);
      renderIdentity();
      view.replaceChildren(needsAudit(pageTitle(page)));
    } else if (error.status !== 401) view.append(problem(error));
  }
  view.dataset.ready = "true";
}

async function searchPage(view, params) {
  const query = el("input", { id: "query", name: "query", value: params.get("query") || "", required: true, size: 50 });
  const k = el("input", { id: "k", name: "k", type: "number", min: 1, max: 100, value: params.get("k") || 10 });
  const mode = el("select", { id: "mode", name: "mode" }, ["hybrid", "vector", "fts"].map((m) =>
    el("option", { value: m, selected: (params.get("mode") || "hybrid") === m }, m)));
  view.append(el("h2", {}, "Search"), toolbar("search-form", [field("Search as yourself", query), field("k", k), field("mode", mode)],
    "Search", "search", () => ({ query: query.value, k: k.value, mode: mode.value })));
  if (!params.get("query")) return;
  const answer = await api("search", { method: "POST", body: { query: params.get("query"), k: Number(params.get("k") || 10), mode: params.get("mode") || "hybrid", purpose: "console search" } });
  const manifest = answer.manifest;
  view.append(
    el("p", { id: "manifest", class: "manifest" }, `${plural(answer.hits.length, "result")} · labels: `, chips(manifest.labels),
      " · highest classification: ", badge(manifest.classification)),
    el("ol", { id: "results" }, answer.hits.map(hitCard)));
}

function hitCard(hit) {
  const explanation = el("div", { class: "explanation" });
  const explain = el("button", { type: "button", class: "explain", onclick: async () => {
    explain.disabled = true;
    try {
      const found = await api(`chunks/${encodeURIComponent(hit.chunk_id)}/explain`);
      explanation.replaceChildren(el("ol", { class: "steps" }, found.steps.map((s) =>
        el("li", { class: s.passed ? "passed" : "failed" }, `${s.passed ? "✓" : "✗"} ${s.check}: ${s.detail}`))));
    } catch (error) {
      explanation.replaceChildren(problem(error));
      explain.disabled = false;
    }
  } }, "Why, step by step");
  return el("li", { class: "hit card", "data-chunk-id": hit.chunk_id, "data-doc-id": hit.doc_id },
    el("div", { class: "hit-head" },
      el("span", { class: "doc" }, hit.doc_id), " ", badge(hit.classification), " ", chips(hit.labels),
      el("span", { class: "score" }, `score ${hit.score.toFixed(4)}`)),
    el("p", { class: "text" }, hit.text),
    el("p", { class: "why" }, el("strong", {}, "Visible because: "), el("span", { class: "reason" }, hit.reason)),
    el("p", { class: "meta" }, `${hit.kind} ${hit.chunk_id} · ${hit.source_uri} · version ${hit.doc_version.slice(0, 12)}`, " · ",
      mayAudit ? [el("a", { href: `#/lineage?id=${encodeURIComponent(hit.doc_id)}`, class: "lineage-link" }, "lineage"), " "] : "", explain),
    explanation);
}

const LINEAGE_RECEIPTS = 20; // receipt nodes drawn at once; the rest a page away

async function lineagePage(view, params) {
  const item = el("input", { id: "item", name: "id", value: params.get("id") || "", required: true, size: 40, placeholder: "a document, chunk or derived row id" });
  view.append(el("h2", {}, "Lineage"),
    toolbar("lineage-form", [field("Document or row", item)], "Show lineage", "lineage", () => ({ id: item.value })));
  if (!params.get("id")) return;
  const lineage = await api(`lineage/${encodeURIComponent(params.get("id"))}`);
  const newest = [...lineage.receipts].reverse();
  const offset = Math.min(Math.max(0, Number(params.get("offset")) || 0), Math.max(0, newest.length - 1));
  const shown = newest.slice(offset, offset + LINEAGE_RECEIPTS);
  const link = (to, text, id) => el("a", { id, href: `#/lineage?${new URLSearchParams({ id: params.get("id"), offset: String(to) })}` }, text);
  view.append(
    el("p", { id: "lineage-summary" }, lineage.source ? `Source ${lineage.source.doc_id} (version ${lineage.source.version.slice(0, 12)}) · ` : "",
      `${plural(lineage.chunks.length, "chunk")} · ${plural(lineage.derived.length, "derived row")} · ` +
      plural(lineage.receipts.length, "receipt") +
      (lineage.tombstones.length ? ` · erased ${plural(lineage.tombstones.length, "time")}` : "")),
    el("p", { id: "lineage-receipts-pager", class: "pager" },
      shown.length ? `Receipts ${offset + 1}–${offset + shown.length} of ${newest.length}, newest first` : "No receipts",
      offset > 0 ? [" · ", link(Math.max(0, offset - LINEAGE_RECEIPTS), "newer", "lineage-newer")] : "",
      offset + shown.length < newest.length ? [" · ", link(offset + LINEAGE_RECEIPTS, "older", "lineage-older")] : ""),
    lineageGraph(lineageNodes(lineage, shown)),
    exportButtons("export-lineage", `lineage-${params.get("id")}-${identity.tenant}`, LINEAGE_COLUMNS,
      () => lineageRows(lineageNodes(lineage, newest)), () => ({ item: params.get("id"), tenant: identity.tenant, ...lineage })),
    receiptGroups(lineage.receipts),
    ...lineage.tombstones.map((t) => el("p", { class: "tombstone" },
      `Erased ${localInput(t.time).replace("T", " ")} by ${t.subject}${t.actor ? ` (agent ${t.actor})` : ""}: ${t.reason} · `,
      `${plural(t.erased.chunks.length, "chunk")}, ${plural(t.erased.derived.length, "derived row")} · ` +
      `${Object.values(t.versions_left).join("/")} ${Object.values(t.versions_left).every((n) => n === 1) ? "version" : "versions"} left after the purge`)));
}

// Every receipt of a lineage grouped by what came of it and for whom: who was returned what, how often, first and last.
function receiptGroups(receipts) {
  const groups = new Map();
  for (const r of receipts) {
    const key = [r.outcome, r.subject, r.actor || "", r.purpose || ""].join("\u001f");
    const group = groups.get(key) || { r, count: 0, first: r.time, last: r.time };
    group.count += 1;
    group.first = r.time < group.first ? r.time : group.first;
    group.last = r.time > group.last ? r.time : group.last;
    groups.set(key, group);
  }
  const rows = [...groups.values()].sort((a, b) => b.count - a.count || (a.last < b.last ? 1 : -1));
  return rows.length
    ? table(["outcome", "subject", "agent", "purpose", "receipts", "first (yours)", "last (yours)"], rows.map(({ r, count, first, last }) =>
      [r.outcome, r.subject, r.actor || "", r.purpose || "", String(count), localInput(first).replace("T", " "), localInput(last).replace("T", " ")]),
    { id: "lineage-receipt-groups" })
    : el("p", { id: "lineage-receipt-groups", class: "empty" }, "No receipts concern it.");
}

// The lineage as nodes, each with the ids its edges come from: the source, its chunks, the rows
// derived from them, the given receipts (each from the rows it returned) and the erasures. The graph
// draws them and the export writes them, so the two say the same.
function lineageNodes(lineage, receipts) {
  const source = lineage.source ? [lineage.source.doc_id] : [];
  const tags = (id) => lineage.tags[id] || { labels: [], classification: "erased" };
  const when = (iso) => localInput(iso).replace("T", " ").slice(5, 16);
  const agent = (actor) => (actor ? ` (agent ${actor})` : "");
  const row = (kind, id, from, detail, text) => {
    const { labels, classification } = tags(id);
    return { kind, id, from, classification, labels, time: "", subject: "", actor: "", detail, class: `${kind} ${classification}`,
      text: `${text} · ${classification}`, title: `${kind} ${id}: ${classification}; labels ${labels.join(", ") || "none"}` };
  };
  const event = (kind, id, from, r, detail, css, text, title) => ({ kind, id, from, classification: "", labels: [], time: r.time,
    subject: r.subject, actor: r.actor || "", detail, class: css, text: `${when(r.time)} ${text}`, title });
  const purpose = (r) => (!r.purpose ? "" : r.purpose.length > 40 ? ` · ${r.purpose.slice(0, 39)}…` : ` · ${r.purpose}`);
  return [
    ["Source", lineage.source ? [{ kind: "source", id: lineage.source.doc_id, from: [], classification: "", labels: [], time: "",
      subject: "", actor: "", detail: `version ${lineage.source.version}`, class: "source", text: lineage.source.doc_id,
      title: `source ${lineage.source.doc_id}, version ${lineage.source.version}` }] : []],
    ["Chunks", lineage.chunks.map((id) => row("chunk", id, source, "", id))],
    ["Derived", lineage.derived.map((d) => row("derived", d.chunk_id, d.parents, d.kind, `${d.kind} ${d.chunk_id}`))],
    ["Receipts", receipts.map((r) => event("receipt", `receipt-${r.chain}-${r.seq}`, r.returned, r,
      `${r.operation} ${r.outcome}${r.purpose ? `, purpose: ${r.purpose}` : ""}`, `receipt ${r.allowed ? "allowed" : "refused"}`,
      `${r.outcome} · ${r.subject}${agent(r.actor)}${purpose(r)}`,
      `receipt ${r.seq}: ${r.operation} (${r.outcome}) by ${r.subject}${r.actor ? ` for agent ${r.actor}` : ""} at ${r.time}` +
        `${r.purpose ? `, purpose: ${r.purpose}` : ""}`))],
    ["Erased", lineage.tombstones.map((t) => event("tombstone", `tombstone-${t.chain}-${t.seq}`, source, t, t.reason, "tombstone",
      `by ${t.subject}${agent(t.actor)}`, `erased at ${t.time} by ${t.subject}: ${t.reason}`))],
  ].filter(([title, nodes]) => title !== "Erased" || nodes.length);
}

const LINEAGE_COLUMNS = ["kind", "id", "from", "classification", "labels", "time", "subject", "agent", "detail"];

function lineageRows(columns) {
  return columns.flatMap(([, nodes]) => nodes.map((n) => [n.kind, n.id, n.from.join(" "), n.classification, n.labels.join(" "),
    n.time, n.subject, n.actor, n.detail]));
}

// The graph's fonts, as console.css sets them: the nodes' text, and the columns' titles.
const NODE_FONT = "12px ui-monospace, monospace";
const TITLE_FONT = "600 13px system-ui, -apple-system, \"Segoe UI\", sans-serif";
let textMeasure = null;

// How wide ``text`` is drawn in ``font``, to size each column of the graph to its whole texts.
function textWidth(text, font = NODE_FONT) {
  textMeasure = textMeasure || document.createElement("canvas").getContext("2d");
  textMeasure.font = font;
  return textMeasure.measureText(text).width;
}

// Columns, left to right, each as wide as its widest text (nothing is cut): source -> chunks ->
// derived rows -> receipts (this page of them) -> erasures; an edge where a row derives from
// another, where a receipt returned a row, and to each erasure. Rows are annotated with their
// classification and labels; receipts with when, who and why. Wider than the page, it scrolls.
function lineageGraph(columns) {
  const gap = 50, rowHeight = 44, boxHeight = 30, top = 30, pad = 8;
  const widths = columns.map(([title, nodes]) => Math.ceil(Math.max(textWidth(title, TITLE_FONT) + pad, ...nodes.map((n) => textWidth(n.text) + 2 * pad))));
  const lefts = widths.map((_, c) => 10 + widths.slice(0, c).reduce((sum, w) => sum + w + gap, 0));
  const place = new Map();
  columns.forEach(([, nodes], c) => nodes.forEach((node, r) => place.set(node.id, { x: lefts[c], y: top + r * rowHeight, width: widths[c], node })));
  const rows = Math.max(1, ...columns.map(([, nodes]) => nodes.length));
  const graph = svg("svg", { id: "lineage-graph", width: lefts[lefts.length - 1] + widths[widths.length - 1] + 10,
    height: top + rows * rowHeight + 10, role: "img", "aria-label": "lineage graph" });
  columns.forEach(([title], c) => graph.append(svg("text", { x: lefts[c], y: 16, class: "column-title" }, title)));
  for (const { x, y, node } of place.values()) {
    for (const from of node.from) {
      const a = place.get(from);
      if (!a) continue; // a parent outside this lineage (another document's chunk)
      graph.append(svg("line", { class: "edge", "data-from": from, "data-to": node.id, x1: a.x + a.width, y1: a.y + boxHeight / 2, x2: x, y2: y + boxHeight / 2 }));
    }
  }
  for (const { x, y, width, node } of place.values()) {
    graph.append(svg("g", { class: `node ${node.class}`, "data-id": node.id, transform: `translate(${x},${y})` },
      svg("title", {}, node.title),
      svg("rect", { width, height: boxHeight, rx: 6 }),
      svg("text", { x: pad, y: 19 }, node.text)));
  }
  return el("div", { class: "graph", id: "lineage-graph-box" }, graph);
}

const RECEIPT_FILTERS = ["subject", "label", "doc_id", "operation", "allowed", "since", "until"];
const RECEIPT_COLUMNS = ["chain", "seq", "time", "operation", "subject", "actor", "purpose", "allowed", "reason", "withheld",
  "doc_ids", "labels", "policy_version", "hash"];

async function receiptsPage(view, params) {
  const vocabulary = await api("audit/vocabulary");
  const inputs = {
    subject: el("input", { id: "filter-subject", value: params.get("subject") || "", placeholder: "user:alice", list: "known-subjects" }),
    label: el("input", { id: "filter-label", value: params.get("label") || "", placeholder: "finance", list: "known-labels" }),
    doc_id: el("input", { id: "filter-document", value: params.get("doc_id") || "", placeholder: "document id", list: "known-documents" }),
    operation: el("select", { id: "filter-operation" }, ["", ...OPERATIONS].map((o) =>
      el("option", { value: o, selected: (params.get("operation") || "") === o }, o || "any"))),
    allowed: el("select", { id: "filter-allowed" }, [["", "any"], ["true", "allowed"], ["false", "refused"]].map(([v, text]) =>
      el("option", { value: v, selected: (params.get("allowed") || "") === v }, text))),
    since: el("input", { id: "filter-since", type: "datetime-local", step: 1, value: localInput(params.get("since")) }),
    until: el("input", { id: "filter-until", type: "datetime-local", step: 1, value: localInput(params.get("until")) }),
  };
  const fields = [field("Subject", inputs.subject), field("Label", inputs.label), field("Document", inputs.doc_id),
    field("Operation", inputs.operation), field("Outcome", inputs.allowed),
    field("Since (your time)", inputs.since), field("Before (your time)", inputs.until)];
  view.append(el("h2", {}, "Audit receipts"),
    datalist("known-subjects", vocabulary.subjects), datalist("known-labels", vocabulary.labels),
    datalist("known-documents", vocabulary.documents),
    toolbar("receipts-form", fields, "Filter", "receipts", () => ({
      subject: inputs.subject.value, label: inputs.label.value, doc_id: inputs.doc_id.value, operation: inputs.operation.value,
      allowed: inputs.allowed.value, since: isoInstant(inputs.since.value), until: isoInstant(inputs.until.value) })));
  const status = el("p", { id: "chain-status" });
  const again = el("button", { id: "verify-again", type: "button", onclick: async () => {
    again.disabled = true;
    showChain(status, await verifiedChain(true));
    again.disabled = false;
  } }, "Verify again");
  view.append(el("div", { class: "chain" }, status, again));
  showChain(status, await verifiedChain(false));
  const filters = Object.fromEntries(RECEIPT_FILTERS.map((name) => [name, params.get(name)]));
  const offset = Math.max(0, Number(params.get("offset")) || 0);
  const until = filters.until || params.get("pinned") || "";
  const { data: found, total } = await api("audit/receipts", { params: { ...filters, until, limit: RECEIPTS_PAGE, offset }, withTotal: true });
  // Pages after the first, and the export, stay on the log as it stood (receipts written since,
  // these pages' own included, would shift them): up to just after the newest the first page showed.
  const pinned = until || (found.length ? justAfter(found[0].time) : "");
  const pageLink = (to, text, id) => el("a", { id, href: `#/receipts?${new URLSearchParams(
    Object.entries({ ...filters, pinned, offset: String(to) }).filter(([, v]) => v))}` }, text);
  view.append(el("p", { id: "receipts-pager", class: "pager" },
    found.length ? `Receipts ${offset + 1}–${offset + found.length} of ${total}` : `0 of ${total}`,
    offset > 0 ? [" · ", pageLink(Math.max(0, offset - RECEIPTS_PAGE), "newer", "receipts-newer")] : "",
    offset + found.length < total ? [" · ", pageLink(offset + RECEIPTS_PAGE, "older", "receipts-older")] : ""));
  const exported = { ...filters, until: pinned };
  view.append(exportButtons("export-receipts", `receipts-${identity.tenant}`, [...RECEIPT_COLUMNS, "verified_checkpoint", "verified_at"],
    async () => {
      const { chain, receipts } = await everyReceipt(exported);
      return receipts.map((r) => [...RECEIPT_COLUMNS.map((c) => receiptField(r, c)), chain.checkpoint, chain.at]);
    },
    async () => {
      const { chain, receipts } = await everyReceipt(exported);
      return { tenant: identity.tenant, filters: Object.fromEntries(Object.entries(exported).filter(([, v]) => v)),
        verified: { ok: chain.ok, at: chain.at, checkpoint: chain.checkpoint, receipts: chain.receipts, chains: chain.chains }, receipts };
    }));
  view.append(found.length
    ? table(["chain #", "time (yours)", "operation", "subject", "actor", "purpose", "allowed", "reason", "withheld", "documents", "labels", "policy"],
      found.map((r) => [`${r.chain.slice(0, 8)} #${r.seq}`, localInput(r.time).replace("T", " "), r.operation, r.subject, r.actor || "",
        r.purpose || "", r.allowed ? "yes" : "no", r.reason, String(r.withheld), r.doc_ids.join(", "), chips(receiptLabels(r)),
        policyVersion(r.policy_version)]), { id: "receipts" })
    : el("p", { id: "receipts", class: "empty" }, "No receipts match these filters."));
}

// The policy a receipt was decided under, by the start of its version (the whole on hover, and in the exports).
function policyVersion(version) {
  return version ? el("span", { class: "policy-version", title: version }, version.slice(0, 12)) : el("span", { class: "none" }, "none");
}

function receiptField(receipt, column) {
  if (column === "labels") return receiptLabels(receipt).join(" ");
  if (column === "doc_ids") return receipt.doc_ids.join(" ");
  return receipt[column];
}

// The instant just after ``iso`` (a millisecond later), to bound a query to what had been written by then.
function justAfter(iso) {
  return new Date(Date.parse(iso) + 1).toISOString();
}

function datalist(id, values) {
  return el("datalist", { id }, values.map((value) => el("option", { value })));
}

function receiptLabels(receipt) {
  return [...new Set(Object.values(receipt.chunk_labels).flat())].sort();
}

// The chains' state: verified once a session and kept (with the checkpoint it reached), not on every open.
async function verifiedChain(again) {
  const kept = sessionStorage.getItem(VERIFIED_KEY);
  if (kept && !again) return JSON.parse(kept);
  const chain = { ...(await api("audit/verify")), at: new Date().toISOString() };
  sessionStorage.setItem(VERIFIED_KEY, JSON.stringify(chain));
  return chain;
}

function showChain(status, chain) {
  status.className = chain.ok ? "ok" : "broken";
  status.textContent = chain.ok
    ? `Chains verified ${localInput(chain.at).replace("T", " ")}: intact, ${plural(chain.receipts, "receipt")} in ${plural(chain.chains, "chain")}, checkpoint ${chain.checkpoint}`
    : `Chain BROKEN (verified ${localInput(chain.at).replace("T", " ")}): ${chain.problems.join("; ")}`;
}

// Every receipt the filters match (page after page), to attach to an audit record, with the
// verification it was read under.
async function everyReceipt(filters) {
  const chain = await verifiedChain(false);
  const receipts = [];
  for (let offset = 0; ; offset += EXPORT_PAGE) {
    const { data, total } = await api("audit/receipts", { params: { ...filters, limit: EXPORT_PAGE, offset }, withTotal: true });
    receipts.push(...data);
    if (!data.length || receipts.length >= total) break;
  }
  return { chain, receipts };
}

// A CSV file as RFC 4180 writes it, that no spreadsheet runs as formulas: wherever a spreadsheet
// could start reading a value (a cell's start, or the start of what follows a separator, a quote or
// a line break, should a program split the cell there: a semicolon is the separator in many locales),
// a formula's first character (= + - @) is preceded by an apostrophe, as is a leading tab or carriage
// return; a cell holding a separator, a quote, a line break or an edge space is quoted, quotes doubled.
function csv(header, rows) {
  const cell = (value) => {
    const raw = value === null || value === undefined ? "" : String(value);
    const text = raw.replace(/(^|[,;\t\r\n"])(\s*)(?=[=+\-@])/g, "$1$2'").replace(/^(?=[\t\r])/, "'");
    return /[",;\t\n\r]|^\s|\s$/.test(text) ? `"${text.replace(/"/g, '""')}"` : text;
  };
  return [header, ...rows].map((row) => row.map(cell).join(",")).join("\r\n") + "\r\n";
}

function download(name, type, text) {
  const link = el("a", { href: URL.createObjectURL(new Blob([text], { type })), download: name });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 10_000);
}

// What a page shows, as CSV (``header``, then ``rows()``) and as JSON (``json()``, stamped with when
// and by whom): the one way every page exports. ``rows`` and ``json`` are asked when a button is
// pressed and may ask the API first (the receipts' export reads every page its filters match).
function exportButtons(id, name, header, rows, json) {
  const trouble = el("div", { class: "export-problem" });
  const save = (extension) => async () => {
    const stamp = new Date().toISOString();
    const file = `${name}-${stamp}`.replace(/[^\w@.-]+/g, "-");
    try {
      if (extension === "csv") download(`${file}.csv`, "text/csv", csv(header, await rows()));
      else download(`${file}.json`, "application/json", JSON.stringify({ ...(await json()), exported_at: stamp, exported_by: identity.subject }, null, 2));
      trouble.replaceChildren();
    } catch (error) {
      if (error.status !== 401) trouble.replaceChildren(problem(error));
    }
  };
  return el("div", { class: "exports", id },
    el("button", { id: `${id}-csv`, type: "button", onclick: save("csv") }, "Export CSV"), " ",
    el("button", { id: `${id}-json`, type: "button", onclick: save("json") }, "Export JSON"), trouble);
}

// An ISO instant as the browser's local "YYYY-MM-DDTHH:MM:SS" (what datetime-local shows); "" if none or unreadable.
function localInput(iso) {
  const date = new Date(iso || NaN);
  if (Number.isNaN(date.getTime())) return "";
  return new Date(date.getTime() - date.getTimezoneOffset() * 60000).toISOString().slice(0, 19);
}

function isoInstant(local) {
  return local ? new Date(local).toISOString() : "";
}

// A subject's access: one's own for anyone, another's for an auditor.
async function reviewPage(view, params) {
  const asked = params.get("subject") || identity.subject;
  const subject = el("input", { id: "review-subject", value: mayAudit ? asked : identity.subject, size: 30, readonly: !mayAudit });
  view.append(el("h2", {}, "Access review"),
    toolbar("review-form", [field(mayAudit ? "Subject" : "Subject (yourself: another needs the audit right)", subject)], "Review", "review",
      () => ({ subject: subject.value })));
  if (asked !== identity.subject && !mayAudit) return view.append(needsAudit(`The access review of ${asked}`));
  const review = await api("audit/access-review", { params: { subject: asked } });
  view.append(
    el("p", { id: "review-summary" }, `${review.subject} can read ${plural(review.rows, "row")} in ${review.tenant} (policy ${review.policy_version.slice(0, 12)})`),
    exportButtons("export-review", `access-review-${review.subject}-${review.tenant}`, ["counted_by", "name", "rows"],
      () => ["by_source", "by_label", "by_classification", "derived_by_kind"].flatMap((by) => Object.entries(review[by]).map(([name, n]) => [by, name, n])),
      () => review),
    el("div", { class: "columns" },
      counts("By source", "source", review.by_source, "review-by-source"),
      counts("By label", "label", review.by_label, "review-by-label"),
      counts("By classification", "classification", review.by_classification, "review-by-classification"),
      counts("Derived rows by kind", "kind", review.derived_by_kind, "review-derived")));
}

async function inventoryPage(view, params) {
  const label = el("input", { id: "inventory-label", value: params.get("label") || "", required: true, placeholder: "finance" });
  view.append(el("h2", {}, "Inventory by label"),
    toolbar("inventory-form", [field("Label", label)], "List", "inventory", () => ({ label: label.value })));
  if (!params.get("label")) return;
  const found = await api("audit/inventory", { params: { label: params.get("label") } });
  const sources = Object.entries(found.sources);
  view.append(exportButtons("export-inventory", `inventory-${found.label}-${found.tenant}`, ["label", "source", "row"],
    () => sources.flatMap(([doc, rows]) => rows.map((row) => [found.label, doc, row])), () => found));
  view.append(sources.length
    ? table(["source", "rows", "row ids"], sources.map(([doc, rows]) => [
      el("a", { href: `#/lineage?id=${encodeURIComponent(doc)}` }, doc), String(rows.length), rows.join(" ")]), { id: "inventory" })
    : el("p", { id: "inventory", class: "empty" }, `No rows carry ${found.label} in ${found.tenant}.`));
}

// The tenant's last days, from its receipts, drawn inline (no charting library, no CDN).
async function trendsPage(view, params) {
  const days = el("select", { id: "trends-days" }, [7, 30, 90, 365].map((d) =>
    el("option", { value: d, selected: String(d) === (params.get("days") || "30") }, `${d} days`)));
  view.append(el("h2", {}, "Trends"), toolbar("trends-form", [field("Over the last", days)], "Show", "trends", () => ({ days: days.value })));
  const found = await api("audit/trends", { params: { days: params.get("days") || "30" } });
  const total = (values) => values.reduce((a, b) => a + b, 0);
  view.append(
    el("p", { id: "trends-summary" }, `${total(found.searches)} searches and ${total(found.refusals)} refusals in ${found.tenant} ` +
      `from ${found.days[0]} to ${found.days[found.days.length - 1]} (UTC days)`),
    el("h3", {}, "Searches, and refusals of any operation, a day"),
    dayChart("trends-activity", found.days, [["searches", found.searches], ["refusals", found.refusals]]),
    el("h3", {}, "Labels returned a day (the most returned)"),
    dayChart("trends-labels", found.days, Object.entries(found.label_days)),
    el("div", { class: "columns" },
      el("section", {}, el("h3", {}, "Labels returned"), Object.keys(found.labels).length
        ? table(["label", "times returned"], Object.entries(found.labels).map(([l, n]) => [chips([l]), String(n)]), { id: "trends-label-totals" })
        : el("p", { id: "trends-label-totals", class: "empty" }, "none")),
      el("section", {}, el("h3", {}, "Documents returned most"), Object.keys(found.top_documents).length
        ? table(["document", "answers"], Object.entries(found.top_documents).map(([doc, n]) =>
          [el("a", { href: `#/lineage?id=${encodeURIComponent(doc)}` }, doc), String(n)]), { id: "trends-documents" })
        : el("p", { id: "trends-documents", class: "empty" }, "none"))));
}

// Bars a day for each series, side by side, with each bar's day and value in its title.
function dayChart(id, days, series) {
  const width = 960, height = 180, left = 40, bottom = 24, top = 10;
  const most = Math.max(1, ...series.flatMap(([, values]) => values));
  const slot = (width - left) / days.length, bar = Math.max(1, (slot - 2) / Math.max(1, series.length));
  const chart = svg("svg", { id, class: "chart", width, height: height + 10 + 20 * Math.ceil(series.length / 4), role: "img",
    "aria-label": series.map(([name]) => name).join(", ") });
  chart.append(svg("line", { x1: left, y1: height - bottom, x2: width, y2: height - bottom, class: "axis" }),
    svg("text", { x: left - 6, y: top + 10, class: "tick", "text-anchor": "end" }, String(most)),
    svg("text", { x: left - 6, y: height - bottom, class: "tick", "text-anchor": "end" }, "0"));
  series.forEach(([name, values], s) => {
    values.forEach((value, d) => {
      const h = (height - bottom - top) * value / most;
      chart.append(svg("rect", { x: left + d * slot + 1 + s * bar, y: height - bottom - h, width: bar, height: h,
        class: `bar series-${s}`, "data-series": name, "data-day": days[d], "data-value": value },
      svg("title", {}, `${days[d]}: ${value} ${name}`)));
    });
    const legend = s % 4, row = Math.floor(s / 4);
    chart.append(svg("rect", { x: left + legend * 220, y: height + 4 + row * 20, width: 10, height: 10, class: `bar series-${s}` }),
      svg("text", { x: left + legend * 220 + 14, y: height + 13 + row * 20, class: "legend" }, name));
  });
  [0, days.length - 1].forEach((d) => chart.append(svg("text", { x: left + d * slot, y: height - 6, class: "tick" }, days[d])));
  return el("div", { class: "graph" }, chart);
}

// Who can read a document (and what derives from it) or a label's rows, and through which path.
async function readersPage(view, params) {
  const vocabulary = await api("audit/vocabulary");
  const doc = el("input", { id: "readers-document", value: params.get("doc_id") || "", list: "known-documents", placeholder: "document id" });
  const label = el("input", { id: "readers-label", value: params.get("label") || "", list: "known-labels", placeholder: "or a label" });
  view.append(el("h2", {}, "Who can read this?"), datalist("known-documents", vocabulary.documents), datalist("known-labels", vocabulary.labels),
    toolbar("readers-form", [field("Document", doc), field("Label", label)], "Who can read", "readers",
      () => (doc.value ? { doc_id: doc.value } : { label: label.value })));
  if (!params.get("doc_id") && !params.get("label")) return;
  const found = await api("audit/readers", { params: { doc_id: params.get("doc_id"), label: params.get("label") } });
  const rows = (readers) => readers.map((r) => [r.principal, String(r.rows), r.path]);
  view.append(
    el("p", { id: "readers-summary" }, `${found.subjects.length} users and services and ${found.groups.length} groups can read ` +
      `${found.item} in ${found.tenant} (${plural(found.rows, "row")}${found.truncated ? ", the first of more: narrow it for the rest" : ""}; ` +
      `policy ${found.policy_version.slice(0, 12)})`),
    exportButtons("export-readers", `readers-${found.item}-${found.tenant}`, ["kind", "who", "rows", "through"],
      () => [...rows(found.subjects).map((row) => ["subject", ...row]), ...rows(found.groups).map((row) => ["group", ...row])], () => found),
    el("h3", {}, "Users and services"),
    found.subjects.length ? table(["who", "rows", "through"], rows(found.subjects), { id: "readers-subjects" }) : el("p", { id: "readers-subjects", class: "empty" }, "none"),
    el("h3", {}, "Groups (a member holding that group alone)"),
    found.groups.length ? table(["group", "rows", "through"], rows(found.groups), { id: "readers-groups" }) : el("p", { id: "readers-groups", class: "empty" }, "none"));
}

const COMPARED = [["by_source", "By source"], ["by_label", "By label"], ["by_classification", "By classification"]];

// Two subjects' access side by side, what differs marked.
async function comparePage(view, params) {
  const a = el("input", { id: "compare-a", value: params.get("a") || identity.subject, size: 24 });
  const b = el("input", { id: "compare-b", value: params.get("b") || "", size: 24, required: true, placeholder: "user:dave" });
  view.append(el("h2", {}, "Compare two subjects"),
    toolbar("compare-form", [field("Subject", a), field("with", b)], "Compare", "compare", () => ({ a: a.value, b: b.value })));
  if (!params.get("b")) return;
  const [left, right] = await Promise.all([params.get("a") || identity.subject, params.get("b")].map((subject) =>
    api("audit/access-review", { params: { subject } })));
  const compared = COMPARED.map(([by, title]) => [by, title, [...new Set([...Object.keys(left[by]), ...Object.keys(right[by])])].sort()
    .map((name) => [name, left[by][name] || 0, right[by][name] || 0])]);
  view.append(el("p", { id: "compare-summary" }, `${left.subject} can read ${plural(left.rows, "row")}, ${right.subject} ${right.rows}, in ${left.tenant}`),
    exportButtons("export-compare", `compare-${left.subject}-${right.subject}-${left.tenant}`, ["counted_by", "name", left.subject, right.subject, "differs"],
      () => compared.flatMap(([by, , rows]) => rows.map(([name, x, y]) => [by, name, x, y, x === y ? "no" : "yes"])),
      () => ({ tenant: left.tenant, subjects: [left.subject, right.subject], reviews: [left, right] })));
  for (const [by, title, rows] of compared) {
    view.append(el("h3", {}, title), table([by.slice(3), left.subject, right.subject], rows.map(([name, x, y]) => [name, String(x), String(y)]),
      { id: `compare-${by.replace("_", "-")}` }, (i) => (rows[i][1] === rows[i][2] ? "same" : "differs")));
  }
}

// ------------------------------------------------------------------ start

window.addEventListener("hashchange", route);
window.addEventListener("DOMContentLoaded", async () => {
  if (!sessionStorage.getItem(TOKEN_KEY)) return renderSignIn();
  if (await whoami()) route();
});
