// The plgd page: reads the JSON API next to it (../api) and draws the chain of one ETL DAG.
"use strict";
const BASE = location.pathname.endsWith("/") ? location.pathname : location.pathname + "/";
const STATES = ["failed", "hole", "stale", "unfinished", "never_planned", "empty", "committed"];
const PAGE = 100;
const ui = { dagId: null, offset: 0, total: 0, states: new Set() };
const $ = (id) => document.getElementById(id);

async function getJson(path) {
  const resp = await fetch(BASE + path, { credentials: "same-origin", headers: { Accept: "application/json" } });
  const body = await resp.json().catch(() => ({}));
  if (!resp.ok) {
    const detail = typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail || body);
    throw new Error(`${resp.status}: ${detail}`);
  }
  return body;
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== null && v !== undefined) node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : String(c ?? ""));
  return node;
}

function chip(state) { return el("span", { class: `chip state-${state}`, "data-state": state }, state.replace("_", " ")); }

function say(text) { $("message").textContent = text || ""; }

async function loadPipelines() {
  const { pipelines } = await getJson("api/pipelines?summary=false");  // the chain is read once, below
  const select = $("pipeline");
  select.replaceChildren(...pipelines.map((p) => el("option", { value: p.dag_id }, `${p.dag_id} (${p.stream})`)));
  if (!pipelines.length) {
    say("No plgd ETL DAG that you may read.");
    $("pipeline-view").hidden = true;
    return;
  }
  const wanted = new URLSearchParams(location.search).get("dag_id");
  ui.dagId = pipelines.some((p) => p.dag_id === wanted) ? wanted : pipelines[0].dag_id;
  select.value = ui.dagId;
  await loadPipeline();
}

async function loadPipeline() {
  const p = await getJson(`api/pipelines/${encodeURIComponent(ui.dagId)}?lag=true`);
  $("pipeline-view").hidden = false;
  const health = $("health");
  health.className = p.healthy ? "ok" : "bad";
  health.textContent = p.healthy ? "healthy" : `NOT HEALTHY: ${p.problems_count} problem(s)`;
  $("problems").replaceChildren(...p.problems.map((text) => el("li", {}, text)));
  const c = p.chain;
  const lag = p.lag ? `${p.lag.messages} messages, ${p.lag.seconds} s (stream ${p.lag.stream}, last sequence ${p.lag.last_seq})`
    : (p.lag_error ? `unknown: ${p.lag_error}` : "-");
  const facts = [["DAG", el("a", { href: p.dag_url, target: "_top" }, p.dag_id)], ["Storage root", p.root],
    ["Stream", p.stream], ["Head", c.head || "-"],
    ["Latest snapshot", c.snapshot ? `${c.snapshot.version} (through ${c.snapshot.interval_id})` : "-"],
    ["Intervals", `planned ${c.planned}, committed ${c.committed}, empty ${c.empty}`], ["Lag", lag]];
  $("facts").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", { "data-fact": k }, v)]));
  $("legend").replaceChildren(...STATES.map((s) => {
    const box = el("input", { type: "checkbox", value: s });
    box.checked = ui.states.has(s);
    box.addEventListener("change", () => { box.checked ? ui.states.add(s) : ui.states.delete(s); ui.offset = 0; loadIntervals(); });
    return el("label", { "data-count": s }, box, chip(s), ` ${p.states[s]}`);
  }));
  $("overview-note").textContent = `(${p.overview.length} stretch(es) of ${c.planned} intervals and ${p.states.never_planned} never planned; the worst state of each)`;
  $("overview").replaceChildren(...p.overview.map((b) => el("span", {
    class: `state-${b.worst}`, "data-state": b.worst,
    title: `${b.start} .. ${b.end}: ` + Object.entries(b.counts).map(([s, n]) => `${n} ${s}`).join(", "),
  })));
  $("tables").querySelector("tbody").replaceChildren(...Object.entries(p.tables).map(([name, t]) => el("tr", { "data-table": name },
    el("td", {}, name), el("td", { class: "num" }, t.version ?? "-"), el("td", { class: "num" }, t.files),
    el("td", { class: "num" }, t.rows), el("td", { class: "num" }, t.intervals ?? ""))));
  await loadIntervals();
}

async function loadIntervals() {
  const q = new URLSearchParams({ offset: ui.offset, limit: PAGE, order: "desc" });
  for (const s of ui.states) q.append("state", s);
  const page = await getJson(`api/pipelines/${encodeURIComponent(ui.dagId)}/intervals?${q}`);
  ui.total = page.total;
  const oldestFirst = [...page.items].reverse();
  $("strip").replaceChildren(...oldestFirst.map((i) => el("span", {
    class: `state-${i.state}`, "data-state": i.state, title: `${i.interval_id}: ${i.state}`,
  })));
  $("intervals").querySelector("tbody").replaceChildren(...page.items.map((i) => el("tr",
    { "data-interval-id": i.interval_id, "data-state": i.state },
    el("td", {}, i.interval_id), el("td", {}, chip(i.state)),
    el("td", { class: "num" }, i.messages === null ? "" : i.messages), el("td", {}, i.detail || ""),
    el("td", {}, i.run_url ? el("a", { href: i.run_url, target: "_top" }, i.run_id) : "-"))));
  const last = Math.min(page.offset + page.items.length, page.total);
  $("page-info").textContent = page.total ? `${page.offset + 1}-${last} of ${page.total} (newest first)` : "no interval";
  $("newer").disabled = page.offset === 0;
  $("older").disabled = last >= page.total;
}

function run(action) { say(""); action().catch((err) => say(err.message)); }

$("pipeline").addEventListener("change", (e) => { ui.dagId = e.target.value; ui.offset = 0; run(loadPipeline); });
$("refresh").addEventListener("click", () => run(loadPipeline));
$("newer").addEventListener("click", () => { ui.offset = Math.max(0, ui.offset - PAGE); run(loadIntervals); });
$("older").addEventListener("click", () => { ui.offset += PAGE; run(loadIntervals); });
run(loadPipelines);
