// The longrank page: search with segment evidence, and batch runs with progress, metrics and comparisons.
// Plain DOM code, no build step. The URL holds the state (?q=… for a search, ?view=batch&job=… for a run), so
// pages can be shared and the back button works. Text from the server is only ever set as text, never as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
const el = (tag, props = {}, ...children) => {
  const node = Object.assign(document.createElement(tag), props);
  node.append(...children);
  return node;
};
const svgEl = (tag, attrs = {}) => {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
};
const fmt = (x, digits = 3) => (typeof x === "number" ? x.toFixed(digits) : "–");

function setStatus(id, text, kind) {
  $(id).textContent = text;
  $(id).className = kind || "";
}

async function api(path, options) {
  let response;
  try {
    response = await fetch(path, options);
  } catch (e) {
    throw new Error(`The server did not answer (${e.message}).`);
  }
  const body = await response.json().catch(() => null);
  if (!response.ok) {
    throw new Error(body && body.error ? body.error.message : `HTTP ${response.status}`);
  }
  return body;
}

// ---- Text helpers -------------------------------------------------------------------------------------

// Evidence offsets are UTF-8 byte offsets; JavaScript strings index UTF-16 code units.
function byteToIndex(text, byteOffset) {
  let bytes = 0;
  let i = 0;
  while (i < text.length && bytes < byteOffset) {
    const cp = text.codePointAt(i);
    bytes += cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    i += cp > 0xffff ? 2 : 1;
  }
  return i;
}

const STOP = new Set("a an and are as at be but by for if in into is it no not of on or such that the their then there these they this to was will with what which who how why when where".split(" "));

// Query words as patterns matching their inflections (the index stems; a prefix is close enough to show).
function queryPattern(query) {
  const words = query.toLowerCase().match(/[\p{L}\p{N}]+/gu) || [];
  const stems = [...new Set(words.filter((w) => w.length > 1 && !STOP.has(w)))].map((w) =>
    (w.length > 5 ? w.slice(0, w.length - 2) : w).replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
  return stems.length ? new RegExp(`(?<![\\p{L}\\p{N}])(?:${stems.join("|")})[\\p{L}\\p{N}]*`, "giu") : null;
}

// Text with the query's words in <mark>, as DOM nodes.
function highlighted(text, pattern) {
  if (!pattern) return [document.createTextNode(text)];
  const out = [];
  let last = 0;
  for (const m of text.matchAll(pattern)) {
    out.push(document.createTextNode(text.slice(last, m.index)), el("mark", { textContent: m[0] }));
    last = m.index + m[0].length;
  }
  out.push(document.createTextNode(text.slice(last)));
  return out;
}

// ---- Search view ----------------------------------------------------------------------------------------

let pipelines = [];
let lastSearch = null;
// Only the newest search may render: an older one answering late (after back, say) is dropped.
let searchSeq = 0;

async function loadOptions() {
  const [collections, available] = await Promise.all([api("/collections"), api("/pipelines")]);
  pipelines = available.pipelines.filter((p) => p.available).map((p) => p.name);
  for (const id of ["collection", "batch-collection"]) {
    $(id).replaceChildren(...collections.map((c) => new Option(`${c.name} (${c.documents.toLocaleString()} docs)`, c.name)));
  }
  for (const id of ["pipeline", "batch-pipeline"]) {
    $(id).replaceChildren(...pipelines.map((p) => new Option(p, p)));
  }
  const unavailable = available.models.filter((m) => m.state === "unavailable");
  if (unavailable.length) {
    setStatus("status", `Re-ranking is unavailable: ${unavailable.map((m) => `${m.name}: ${m.reason}`).join("; ")}`, "error");
  }
}

function segmentColor(score, lo, hi) {
  const t = hi > lo ? (score - lo) / (hi - lo) : 1;
  // From pale to the accent colour; the best segment is the darkest.
  return `hsl(210 70% ${92 - 52 * t}%)`;
}

function renderEvidence(hit, pattern, passage) {
  const segments = hit.segments;
  const scores = segments.map((s) => s.score);
  const lo = Math.min(...scores);
  const hi = Math.max(...scores);
  const strip = el("div", { className: "strip", role: "group" });
  strip.setAttribute("aria-label", `Scores of ${segments.length} segments across the document`);
  const show = (segment, button) => {
    strip.querySelectorAll(".seg").forEach((b) => b.setAttribute("aria-pressed", String(b === button)));
    const label = segment.index === hit.best_segment.index ? "Best segment" : "Segment";
    passage.replaceChildren(
      el("span", { className: "passage-label", textContent: `${label} ${segment.index + 1} of ${segments.length} · score ${fmt(segment.score)}` }),
      el("span", {}, ...highlighted(segment.text, pattern)),
    );
  };
  for (const segment of segments) {
    const button = el("button", { type: "button", className: "seg" });
    button.style.flexGrow = String(Math.max(1, segment.end - segment.start));
    button.style.background = segmentColor(segment.score, lo, hi);
    button.dataset.index = segment.index;
    button.title = `Segment ${segment.index + 1}: ${fmt(segment.score)}`;
    button.setAttribute("aria-label", button.title);
    button.addEventListener("click", () => show(segment, button));
    strip.append(button);
  }
  const best = segments.find((s) => s.index === hit.best_segment.index);
  show(best, strip.children[segments.indexOf(best)]);
  return strip;
}

function renderResults(response, request) {
  const list = $("results");
  list.replaceChildren();
  const t = response.timing;
  const parts = [`retrieve ${fmt(t.retrieve_ms, 1)} ms`];
  if (t.rerank_ms !== undefined) {
    parts.push(`re-rank ${fmt(t.rerank_ms, 1)} ms (queue ${fmt(t.queue_ms, 1)}, inference ${fmt(t.inference_ms, 1)}; ${t.computed} of ${t.pairs} pairs computed)`);
  }
  parts.push(`total ${fmt(t.total_ms, 1)} ms`);
  $("timing").textContent = parts.join(" · ");
  if (response.results.length === 0) {
    setStatus("status", "No document matches this query.");
    return;
  }
  const model = response.model ? ` re-ranked by ${response.model}` : "";
  setStatus("status", `${response.results.length} results from ${response.collection}, ${response.pipeline}${model}.`);
  const pattern = queryPattern(response.query);
  for (const hit of response.results) {
    const title = el("button", { type: "button", className: "title", textContent: hit.title || hit.docid });
    title.addEventListener("click", () => showDocument(hit, response.collection, pattern));
    const scores = [`score ${fmt(hit.score)}`];
    if (hit.first_stage_score !== undefined) scores.push(`BM25 ${fmt(hit.first_stage_score)}`);
    if (hit.model_score !== undefined && hit.model_score !== hit.score) scores.push(`model ${fmt(hit.model_score)}`);
    const meta = el("p", { className: "meta" }, el("span", { className: "docid", textContent: hit.docid }), ` · ${scores.join(" · ")}`);
    const body = el("div", { className: "hit" }, title, meta);
    if (hit.segments) {
      const passage = el("blockquote", { className: "passage" });
      body.append(renderEvidence(hit, pattern, passage), passage);
    } else {
      body.append(el("p", { className: "snippet" }, ...highlighted(hit.snippet, pattern)));
    }
    const item = el("li", {}, el("span", { className: "rank", textContent: hit.rank }), body);
    item.dataset.docid = hit.docid;
    list.append(item);
  }
  lastSearch = { response, request };
}

function searchParams() {
  return {
    q: $("q").value.trim(),
    collection: $("collection").value,
    pipeline: $("pipeline").value,
    k: $("k").value,
    depth: $("depth").value,
  };
}

async function search(params) {
  const seq = ++searchSeq;
  $("document").hidden = true;
  $("results").hidden = false;
  $("results").setAttribute("aria-busy", "true");
  setStatus("status", "Searching…", "loading");
  $("timing").textContent = "";
  const body = {
    query: params.q,
    collection: params.collection || undefined,
    pipeline: params.pipeline || undefined,
    k: Number(params.k) || undefined,
    depth: Number(params.depth) || undefined,
    segment_text: true,
  };
  try {
    const response = await api("/search", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
    });
    if (seq === searchSeq) renderResults(response, params);
  } catch (e) {
    if (seq !== searchSeq) return;
    $("results").replaceChildren();
    setStatus("status", e.message, "error");
  } finally {
    if (seq === searchSeq) $("results").removeAttribute("aria-busy");
  }
}

async function showDocument(hit, collection, pattern) {
  setStatus("status", "Opening the document…", "loading");
  try {
    const doc = await api(`/documents/${encodeURIComponent(hit.docid)}?collection=${encodeURIComponent(collection)}`);
    $("doc-title").textContent = doc.title || doc.docid;
    $("doc-id").textContent = `${doc.docid} · ${doc.collection}`;
    const text = $("doc-text");
    if (hit.best_segment) {
      const start = byteToIndex(doc.text, hit.best_segment.start);
      const end = byteToIndex(doc.text, hit.best_segment.end);
      const best = el("mark", { className: "best", id: "best-segment", tabIndex: -1 }, ...highlighted(doc.text.slice(start, end), pattern));
      best.title = `Best segment (${hit.best_segment.index + 1} of ${hit.segments.length}), score ${fmt(hit.best_segment.score)}`;
      text.replaceChildren(...highlighted(doc.text.slice(0, start), pattern), best, ...highlighted(doc.text.slice(end), pattern));
    } else {
      text.replaceChildren(...highlighted(doc.text, pattern));
    }
    $("results").hidden = true;
    $("document").hidden = false;
    setStatus("status", `${doc.title || doc.docid}`);
    const target = $("best-segment") || $("document");
    target.scrollIntoView({ block: "center" });
    if (target.focus) target.focus({ preventScroll: true });
  } catch (e) {
    setStatus("status", e.message, "error");
  }
}

// ---- Batch view -----------------------------------------------------------------------------------------

let pollTimer = null;
let currentJob = null;

// The measures researchers look at first; the rest are one click away.
const KEY_MEASURES = ["map", "recip_rank", "ndcg_cut_10", "P_10", "Rprec", "bpref", "recall_1000", "ndcg"];
const isKey = (m) => KEY_MEASURES.includes(m);
const byKeyOrder = (a, b) => KEY_MEASURES.indexOf(a) - KEY_MEASURES.indexOf(b);

function jobLabel(job) {
  const p = job.params || {};
  const when = job.created_at.replace("T", " ").slice(0, 19);
  return `${p.pipeline || "bm25"} on ${p.collection || "default"} · ${when} · …${job.id.slice(-4)}`;
}

async function loadJobs() {
  const jobs = await api("/batch");
  const rows = jobs.map((job) => {
    const open = el("a", { href: `/?view=batch&job=${encodeURIComponent(job.id)}`, textContent: job.id.slice(-8) });
    open.addEventListener("click", (event) => {
      event.preventDefault();
      navigate({ view: "batch", job: job.id });
    });
    const progress = el("progress", { max: Math.max(1, job.progress.total), value: job.progress.done });
    const map = job.metrics ? fmt(job.metrics.all.map, 4) : "–";
    const row = el("tr", {},
      el("td", {}, open),
      el("td", { textContent: (job.params && job.params.pipeline) || "bm25" }),
      el("td", { textContent: job.status }),
      el("td", {}, progress, ` ${job.progress.done}/${job.progress.total}`),
      el("td", { textContent: map }));
    row.dataset.job = job.id;
    return row;
  });
  $("jobs").tBodies[0].replaceChildren(...rows);
  const done = jobs.filter((j) => j.metrics);
  for (const id of ["compare-a", "compare-b"]) {
    const current = $(id).value;
    $(id).replaceChildren(...done.map((j) => new Option(jobLabel(j), j.id)));
    if (current) $(id).value = current;
  }
  if (!$("compare-b").value && done.length > 1) $("compare-b").value = done[1].id;
  const measures = done.length ? Object.keys(done[0].metrics.all) : [];
  fillMeasures($("compare-measure"), measures);
}

function fillMeasures(select, measures) {
  const current = select.value;
  select.replaceChildren(...measures.map((m) => new Option(m, m)));
  select.value = measures.includes(current) ? current : measures.includes("map") ? "map" : measures[0] || "";
}

// A bar per (label, value); negative values go below the axis.
function barChart(container, pairs, title) {
  container.replaceChildren();
  if (!pairs.length) return;
  const width = 640;
  const height = 200;
  const values = pairs.map(([, v]) => v);
  const max = Math.max(0, ...values);
  const min = Math.min(0, ...values);
  const span = max - min || 1;
  const zero = height * (max / span);
  const bar = width / pairs.length;
  const svg = svgEl("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": title, preserveAspectRatio: "none" });
  pairs.forEach(([label, value], i) => {
    const h = Math.max(1, (Math.abs(value) / span) * height);
    const rect = svgEl("rect", {
      x: i * bar + bar * 0.1,
      width: Math.max(1, bar * 0.8),
      y: value >= 0 ? zero - h : zero,
      height: h,
      class: value >= 0 ? "up" : "down",
    });
    const tip = svgEl("title");
    tip.textContent = `${label}: ${fmt(value, 4)}`;
    rect.append(tip);
    svg.append(rect);
  });
  svg.append(svgEl("line", { x1: 0, x2: width, y1: zero, y2: zero, class: "axis" }));
  container.append(svg, el("p", { className: "meta", textContent: title }));
}

function renderJob(job) {
  currentJob = job;
  $("job").hidden = false;
  $("job-title").textContent = `Run ${job.id}`;
  const p = job.params || {};
  $("job-meta").textContent = `${job.status} · ${p.pipeline || "bm25"} on ${p.collection || "the default collection"} · k ${p.k || 1000} · created ${job.created_at}`;
  $("job-progress").max = Math.max(1, job.progress.total);
  $("job-progress").value = job.progress.done;
  $("job-progress-text").textContent = `${job.progress.done} of ${job.progress.total} topics${job.error ? ` · ${job.error}` : ""}`;
  $("job-download").href = `/batch/${encodeURIComponent(job.id)}/run`;
  $("job-download").hidden = job.status !== "done";
  if (!job.metrics) {
    $("job-results").hidden = true;
    $("job-metrics").tBodies[0].replaceChildren();
    $("job-chart").replaceChildren();
    return;
  }
  $("job-results").hidden = false;
  const row = ([m, v]) => {
    const tr = el("tr", {}, el("th", { scope: "row", textContent: m }), el("td", { textContent: fmt(v, 4) }));
    tr.dataset.measure = m;
    return tr;
  };
  const all = Object.entries(job.metrics.all);
  $("job-metrics").tBodies[0].replaceChildren(...all.filter(([m]) => isKey(m)).sort((a, b) => byKeyOrder(a[0], b[0])).map(row));
  $("job-metrics-all").tBodies[0].replaceChildren(...all.map(row));
  fillMeasures($("job-measure"), Object.keys(job.metrics.all));
  drawJobChart(job);
}

function drawJobChart(job) {
  const measure = $("job-measure").value;
  const pairs = Object.entries(job.metrics.per_topic)
    .map(([qid, values]) => [qid, values[measure]])
    .filter(([, v]) => typeof v === "number")
    .sort((a, b) => b[1] - a[1]);
  barChart($("job-chart"), pairs, `${measure} per topic, ${pairs.length} topics, best first`);
}

async function followJob(id) {
  clearTimeout(pollTimer);
  try {
    const job = await api(`/batch/${encodeURIComponent(id)}`);
    renderJob(job);
    if (job.status === "queued" || job.status === "running") {
      pollTimer = setTimeout(() => followJob(id), 500);
    } else {
      setStatus("batch-status", job.status === "done" ? "The run is done." : `The run is ${job.status}.`, job.status === "failed" ? "error" : "");
      await loadJobs();
    }
  } catch (e) {
    setStatus("batch-status", e.message, "error");
  }
}

async function startBatch() {
  const form = new FormData();
  form.append("topics", $("topics-file").files[0]);
  if ($("qrels-file").files[0]) form.append("qrels", $("qrels-file").files[0]);
  form.append("collection", $("batch-collection").value);
  form.append("pipeline", $("batch-pipeline").value);
  form.append("k", $("batch-k").value);
  form.append("depth", $("batch-depth").value);
  setStatus("batch-status", "Starting…", "loading");
  try {
    const job = await api("/batch", { method: "POST", body: form });
    setStatus("batch-status", `Run ${job.id} started.`);
    navigate({ view: "batch", job: job.id });
  } catch (e) {
    setStatus("batch-status", e.message, "error");
  }
}

async function compareRuns(a, b, measure) {
  try {
    const comparisons = await api(`/batch/compare?a=${encodeURIComponent(a)}&b=${encodeURIComponent(b)}`);
    const row = (c) => el("tr", {},
      el("th", { scope: "row", textContent: c.measure }),
      el("td", { textContent: fmt(c.mean_a, 4) }),
      el("td", { textContent: fmt(c.mean_b, 4) }),
      el("td", { className: c.delta > 0 ? "gain" : c.delta < 0 ? "loss" : "", textContent: (c.delta > 0 ? "+" : "") + fmt(c.delta, 4) }),
      el("td", { textContent: c.p_value === null ? "–" : fmt(c.p_value, 4) }),
      el("td", { textContent: `${c.wins} / ${c.ties} / ${c.losses}` }));
    const key = comparisons.filter((c) => isKey(c.measure)).sort((a, b) => byKeyOrder(a.measure, b.measure));
    $("compare-table").tBodies[0].replaceChildren(...key.map(row));
    $("compare-table-all").tBodies[0].replaceChildren(...comparisons.map(row));
    const chosen = comparisons.find((c) => c.measure === measure) || comparisons[0];
    $("compare-result").hidden = false;
    if (chosen) {
      $("compare-chart-title").textContent = `${chosen.measure}: B − A per topic, largest gain first`;
      barChart($("compare-chart"), chosen.per_topic_delta, `${chosen.wins} wins, ${chosen.ties} ties, ${chosen.losses} losses over ${chosen.topics} topics`);
    }
  } catch (e) {
    setStatus("batch-status", e.message, "error");
  }
}

// ---- Navigation -----------------------------------------------------------------------------------------

function navigate(state, replace) {
  const params = new URLSearchParams(Object.entries(state).filter(([, v]) => v !== undefined && v !== ""));
  const url = `/?${params}`;
  if (replace) history.replaceState(null, "", url);
  else history.pushState(null, "", url);
  route();
}

function showView(name) {
  $("search-view").hidden = name !== "search";
  $("batch-view").hidden = name !== "batch";
  $("tab-search").toggleAttribute("aria-current", name === "search");
  $("tab-batch").toggleAttribute("aria-current", name === "batch");
  if (name === "search") $("tab-search").setAttribute("aria-current", "page");
  else $("tab-batch").setAttribute("aria-current", "page");
}

async function route() {
  const params = new URLSearchParams(location.search);
  clearTimeout(pollTimer);
  if (params.get("view") === "batch") {
    showView("batch");
    await loadJobs().catch((e) => setStatus("batch-status", e.message, "error"));
    if (params.get("job")) await followJob(params.get("job"));
    else $("job").hidden = true;
    if (params.get("a") && params.get("b")) {
      $("compare-a").value = params.get("a");
      $("compare-b").value = params.get("b");
      if (params.get("measure")) $("compare-measure").value = params.get("measure");
      await compareRuns(params.get("a"), params.get("b"), params.get("measure"));
    }
    return;
  }
  showView("search");
  for (const key of ["q", "collection", "pipeline", "k", "depth"]) {
    if (params.get(key)) $(key).value = params.get(key);
  }
  if (params.get("q")) await search(Object.fromEntries(params));
}

$("search").addEventListener("submit", (event) => {
  event.preventDefault();
  const params = searchParams();
  if (params.q) navigate(params);
});
$("close").addEventListener("click", () => {
  $("document").hidden = true;
  $("results").hidden = false;
  const item = lastSearch && document.querySelector("#results li");
  if (item) item.querySelector(".title").focus();
});
$("batch-form").addEventListener("submit", (event) => {
  event.preventDefault();
  startBatch();
});
$("compare-form").addEventListener("submit", (event) => {
  event.preventDefault();
  navigate({ view: "batch", a: $("compare-a").value, b: $("compare-b").value, measure: $("compare-measure").value });
});
$("job-measure").addEventListener("change", () => {
  if (currentJob && currentJob.metrics) drawJobChart(currentJob);
});
for (const [id, view] of [["tab-search", "search"], ["tab-batch", "batch"]]) {
  $(id).addEventListener("click", (event) => {
    event.preventDefault();
    navigate(view === "batch" ? { view } : {});
  });
}
window.addEventListener("popstate", route);

loadOptions()
  .catch((e) => setStatus("status", `Could not reach the server: ${e.message}`, "error"))
  .then(route);
