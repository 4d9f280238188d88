// The ragwarden compliance console: a client of the /v1 API with the signed-in person's token.
// Every page asks the API, so it shows what the policy lets that person see and nothing more.
// Text from the warehouse is only ever set as text (never as HTML).
"use strict";

const API_ROOT = new URL("../v1/", document.baseURI);
const TOKEN_KEY = "ragwarden.token";
const SVG_NS = "http://www.w3.org/2000/svg";
const RECEIPTS_SHOWN = 200;
const PAGES = { search: searchPage, lineage: lineagePage, receipts: receiptsPage, review: reviewPage, inventory: inventoryPage };

let identity = null; // {subject, tenant, actor, method} from /v1/whoami

// ------------------------------------------------------------------ building blocks

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

function badge(classification) {
  return el("span", { class: `classification ${classification}` }, classification);
}

function table(columns, rows, attrs = {}) {
  return el("table", attrs,
    el("thead", {}, el("tr", {}, columns.map((c) => el("th", {}, c)))),
    el("tbody", {}, rows.map((cells) => el("tr", {}, cells.map((c) => el("td", {}, c))))));
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

async function api(path, { method = "GET", body, params } = {}) {
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
  if (response.ok) return data;
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
  identity = null;
  renderSignIn(message);
}

function renderIdentity() {
  const who = document.getElementById("who");
  document.getElementById("nav").hidden = !identity;
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

// Who the stored credential names; on any failure, the sign-in form says why (false).
async function whoami() {
  try {
    identity = await api("whoami");
  } catch (error) {
    if (error.status !== 401) signOut(`Could not sign in: ${error.code}: ${error.message}`);
    return false; // a 401 has signed out already, with its reason
  }
  renderIdentity();
  return true;
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
    await PAGES[page](view, params);
  } catch (error) {
    if (error.status !== 401) view.append(problem(error));
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
    el("p", { id: "manifest", class: "manifest" }, `${answer.hits.length} results · labels: `, chips(manifest.labels),
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
      el("a", { href: `#/lineage?id=${encodeURIComponent(hit.doc_id)}`, class: "lineage-link" }, "lineage"), " ", explain),
    explanation);
}

async function lineagePage(view, params) {
  const item = el("input", { id: "item", name: "id", value: params.get("id") || "", required: true, size: 40, placeholder: "a document, chunk or derived row id" });
  view.append(el("h2", {}, "Lineage"),
    toolbar("lineage-form", [field("Document or row", item)], "Show lineage", "lineage", () => ({ id: item.value })));
  if (!params.get("id")) return;
  const lineage = await api(`lineage/${encodeURIComponent(params.get("id"))}`);
  view.append(
    el("p", { id: "lineage-summary" }, lineage.source ? `Source ${lineage.source.doc_id} (version ${lineage.source.version.slice(0, 12)}) · ` : "",
      `${lineage.chunks.length} chunks · ${lineage.derived.length} derived rows · ${lineage.receipts.length} receipts`),
    lineageGraph(lineage),
    ...lineage.tombstones.map((t) => el("p", { class: "tombstone" },
      `Erased ${localInput(t.time).replace("T", " ")} by ${t.subject}${t.actor ? ` (agent ${t.actor})` : ""}: ${t.reason} · `,
      `${t.erased.chunks.length} chunks, ${t.erased.derived.length} derived rows · ${Object.values(t.versions_left).join("/")} version(s) left after the purge`)));
}

// Four columns, left to right: source -> chunks -> derived rows -> receipts; an edge where a receipt returned a row.
function lineageGraph(lineage) {
  const columns = [
    lineage.source ? [{ id: lineage.source.doc_id, kind: "source", text: lineage.source.doc_id, title: `source ${lineage.source.doc_id}` }] : [],
    lineage.chunks.map((id) => ({ id, kind: "chunk", text: id.slice(0, 16), title: `chunk ${id}` })),
    lineage.derived.map((d) => ({ id: d.chunk_id, kind: "derived", text: `${d.kind} ${d.chunk_id.slice(0, 10)}`, title: `${d.kind} ${d.chunk_id}` })),
    lineage.receipts.map((r) => ({ id: `receipt-${r.seq}`, kind: "receipt", text: `#${r.seq} ${r.outcome} · ${r.subject}`,
      title: `receipt ${r.seq}: ${r.operation} (${r.outcome}) by ${r.subject}${r.actor ? ` for agent ${r.actor}` : ""} at ${r.time}` })),
  ];
  const width = 230, gap = 60, rowHeight = 44, boxHeight = 30, top = 30;
  const place = new Map();
  columns.forEach((nodes, c) => nodes.forEach((node, r) => place.set(node.id, { x: 10 + c * (width + gap), y: top + r * rowHeight, node })));
  const edges = [];
  if (lineage.source) for (const id of lineage.chunks) edges.push([lineage.source.doc_id, id]);
  for (const d of lineage.derived) for (const parent of d.parents) edges.push([parent, d.chunk_id]);
  for (const r of lineage.receipts) for (const id of r.returned) edges.push([id, `receipt-${r.seq}`]);
  const rows = Math.max(1, ...columns.map((nodes) => nodes.length));
  const graph = svg("svg", { id: "lineage-graph", width: 4 * width + 3 * gap + 20, height: top + rows * rowHeight + 10, role: "img",
    "aria-label": "lineage graph" });
  ["Source", "Chunks", "Derived", "Receipts"].forEach((title, c) =>
    graph.append(svg("text", { x: 10 + c * (width + gap), y: 16, class: "column-title" }, title)));
  for (const [from, to] of edges) {
    const a = place.get(from), b = place.get(to);
    if (!a || !b) continue; // a parent outside this lineage (another document's chunk)
    graph.append(svg("line", { class: "edge", "data-from": from, "data-to": to, x1: a.x + width, y1: a.y + boxHeight / 2, x2: b.x, y2: b.y + boxHeight / 2 }));
  }
  for (const { x, y, node } of place.values()) {
    graph.append(svg("g", { class: `node ${node.kind}`, "data-id": node.id, transform: `translate(${x},${y})` },
      svg("title", {}, node.title),
      svg("rect", { width, height: boxHeight, rx: 6 }),
      svg("text", { x: 8, y: 19 }, node.text.length > 32 ? `${node.text.slice(0, 31)}…` : node.text)));
  }
  return el("div", { class: "graph" }, graph);
}

async function receiptsPage(view, params) {
  const inputs = {
    subject: el("input", { id: "filter-subject", value: params.get("subject") || "", placeholder: "user:alice" }),
    label: el("input", { id: "filter-label", value: params.get("label") || "", placeholder: "finance" }),
    doc_id: el("input", { id: "filter-document", value: params.get("doc_id") || "", placeholder: "document id" }),
    since: el("input", { id: "filter-since", type: "datetime-local", step: 1, value: localInput(params.get("since")) }),
    until: el("input", { id: "filter-until", type: "datetime-local", step: 1, value: localInput(params.get("until")) }),
  };
  const fields = [field("Subject", inputs.subject), field("Label", inputs.label), field("Document", inputs.doc_id),
    field("Since (your time)", inputs.since), field("Before (your time)", inputs.until)];
  view.append(el("h2", {}, "Audit receipts"), toolbar("receipts-form", fields, "Filter", "receipts", () => ({
    subject: inputs.subject.value, label: inputs.label.value, doc_id: inputs.doc_id.value,
    since: isoInstant(inputs.since.value), until: isoInstant(inputs.until.value) })));
  const chain = await api("audit/verify");
  view.append(el("p", { id: "chain-status", class: chain.ok ? "ok" : "broken" },
    chain.ok ? `Chains verified: intact, ${chain.receipts} receipts in ${chain.chains} chains, checkpoint ${chain.checkpoint}`
      : `Chain BROKEN: ${chain.problems.join("; ")}`));
  const filters = Object.fromEntries(["subject", "label", "doc_id", "since", "until"].map((name) => [name, params.get(name)]));
  const found = await api("audit/receipts", { params: { ...filters, limit: RECEIPTS_SHOWN } });
  if (found.length === RECEIPTS_SHOWN) view.append(el("p", { id: "receipts-capped" }, `The ${RECEIPTS_SHOWN} newest matching receipts; narrow the filters for older ones.`));
  view.append(found.length
    ? table(["chain #", "time (yours)", "operation", "subject", "actor", "allowed", "reason", "documents", "labels"], found.map((r) => [
      `${r.chain.slice(0, 8)} #${r.seq}`, localInput(r.time).replace("T", " "), r.operation, r.subject, r.actor || "", r.allowed ? "yes" : "no", r.reason, r.doc_ids.join(", "),
      chips([...new Set(Object.values(r.chunk_labels).flat())].sort())]), { id: "receipts" })
    : el("p", { id: "receipts", class: "empty" }, "No receipts match these filters."));
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

async function reviewPage(view, params) {
  const subject = el("input", { id: "review-subject", value: params.get("subject") || identity.subject, size: 30 });
  view.append(el("h2", {}, "Access review"),
    toolbar("review-form", [field("Subject", subject)], "Review", "review", () => ({ subject: subject.value })));
  const review = await api("audit/access-review", { params: { subject: params.get("subject") || identity.subject } });
  view.append(
    el("p", { id: "review-summary" }, `${review.subject} can read ${review.rows} rows in ${review.tenant} (policy ${review.policy_version.slice(0, 12)})`),
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
  view.append(sources.length
    ? table(["source", "rows", "row ids"], sources.map(([doc, rows]) => [
      el("a", { href: `#/lineage?id=${encodeURIComponent(doc)}` }, doc), String(rows.length), rows.join(" ")]), { id: "inventory" })
    : el("p", { id: "inventory", class: "empty" }, `No rows carry ${found.label} in ${found.tenant}.`));
}

// ------------------------------------------------------------------ start

window.addEventListener("hashchange", route);
window.addEventListener("DOMContentLoaded", async () => {
  if (!sessionStorage.getItem(TOKEN_KEY)) return renderSignIn();
  if (await whoami()) route();
});
