// The search view: a query through any pipeline, each result with its segments' scores as a strip, the best
// segment marked, and the document with that segment in view.
"use strict";

// ---- Search view ----------------------------------------------------------------------------------------

// name -> {needs_model, available, reason}, and model name -> source, from /pipelines.
let pipelineInfo = {};
let modelSources = {};
let lastSearch = null;
// Only the newest search may render: an older one answering late (after back, say) is dropped.
let searchSeq = 0;

async function loadOptions() {
  const [collections, available] = await Promise.all([api("/collections"), api("/pipelines")]);
  pipelineInfo = Object.fromEntries(available.pipelines.map((p) => [p.name, p]));
  modelSources = Object.fromEntries(available.models.map((m) => [m.name, m.source]));
  for (const id of ["collection", "batch-collection"]) {
    $(id).replaceChildren(...collections.map((c) => new Option(`${c.name} (${counted(c.documents, "doc")})`, c.name)));
  }
  // Every pipeline is listed; one that cannot run now is disabled and says why (a URL may still name it:
  // the search then answers with the server's reason).
  for (const id of ["pipeline", "batch-pipeline"]) {
    $(id).replaceChildren(...available.pipelines.map((p) => {
      const option = new Option(p.available ? p.name : `${p.name} (unavailable)`, p.name);
      option.disabled = !p.available;
      if (p.reason) option.title = p.reason;
      return option;
    }));
    $(id).value = "bm25";
  }
  // A model menu when the server has more than one model (`[model.named]`).
  for (const [select, label] of [["model", "model-label"], ["batch-model", "batch-model-label"]]) {
    $(select).replaceChildren(...available.models.map((m) => new Option(`${m.name} (${m.source})`, m.name)));
    $(label).hidden = available.models.length < 2;
  }
  syncDepth("pipeline", "depth-label", "model-label", available.models.length);
  syncDepth("batch-pipeline", "batch-depth-label", "batch-model-label", available.models.length);
  // A model that could not be loaded is one line (first-stage search works), the server's reasons a click away.
  const unavailable = available.models.filter((m) => m.state === "unavailable");
  $("model-notice").hidden = !unavailable.length;
  if (unavailable.length) {
    const why = unavailable.map((m) => `${m.name === "default" ? "the default model" : `model ${m.name}`} ${m.summary}`);
    $("model-summary").textContent = `Re-ranking off: ${why.join("; ")}. BM25 search works.`;
    $("model-details").textContent = unavailable.map((m) => `${m.name} (${m.source}): ${m.reason}`).join("\n\n");
  }
}

// Depth and the model menu only for pipelines that re-rank.
function syncDepth(pipeline, depthLabel, modelLabel, models = Object.keys(modelSources).length) {
  const info = pipelineInfo[$(pipeline).value];
  const reranks = Boolean(info && info.needs_model);
  $(depthLabel).hidden = !reranks;
  $(modelLabel).hidden = !reranks || models < 2;
  if (pipeline === "pipeline") syncRead();
}

// Which segments the model reads (the API's `preselect`), for pipelines that read more than the first: as
// configured, every one, or BM25's best per document (and the first, within a budget).
function syncRead() {
  const info = pipelineInfo[$("pipeline").value];
  const choosable = Boolean(info && info.needs_model) && $("pipeline").value !== "firstp";
  $("read-label").hidden = !choosable;
  const bm25 = choosable && $("read").value === "bm25";
  for (const label of ["per-doc-label", "keep-first-label", "budget-label"]) $(label).hidden = !bm25;
}

// The request's `preselect` for the page's choice (none: the server's configured default).
function preselectOf(params) {
  if (params.read === "every") return { selector: "none" };
  if (params.read !== "bm25") return undefined;
  const count = (v) => Number(v) || undefined;
  return { selector: "bm25", per_doc: count(params.per_doc), keep_first: params.keep_first === "1", budget: count(params.budget) };
}

function segmentColor(score, lo, hi) {
  const t = hi > lo ? (score - lo) / (hi - lo) : 1;
  // From pale to the accent colour; the best segment is the darkest.
  return `hsl(210 70% ${92 - 52 * t}%)`;
}

// Segments a strip shows one button each; a longer document's strip shows groups of neighbouring segments
// (each coloured by its best), and a second strip zooms into the chosen group.
const STRIP_BUTTONS = 40;

function renderEvidence(hit, pattern, passage) {
  const segments = hit.segments;
  // A preselection sends the model only some segments: the others show hatched, with the selector's score.
  const scores = segments.filter((s) => s.scored).map((s) => s.score);
  const lo = Math.min(...scores);
  const hi = Math.max(...scores);
  const rank = (s) => (s.scored ? s.score : -Infinity);
  const described = (s) => (s.scored ? `score ${fmt(s.score)}` : `not read by the model${s.selector_score === undefined ? "" : ` · selector ${fmt(s.selector_score)}`}`);
  const bestIndex = hit.best_segment ? hit.best_segment.index : -1;
  const everyRead = scores.length === segments.length;
  const strip = (label, className) => {
    const node = el("div", { className, role: "group" });
    node.setAttribute("aria-label", label);
    return node;
  };
  const button = (className, title, start, end, score) => {
    const scored = score !== -Infinity;
    const node = el("button", { type: "button", className: scored ? className : `${className} unscored`, title });
    node.style.flexGrow = String(Math.max(1, end - start));
    if (scored) node.style.background = segmentColor(score, lo, hi);
    node.setAttribute("aria-label", title);
    return node;
  };
  const show = (segment, pressed, within) => {
    within.querySelectorAll(".seg").forEach((b) => b.setAttribute("aria-pressed", String(b === pressed)));
    const label = segment.index !== bestIndex ? "Segment" : everyRead ? "Best segment" : "Best segment read";
    passage.replaceChildren(
      el("span", { className: "passage-label", textContent: `${label} ${segment.index + 1} of ${segments.length} · ${described(segment)}` }),
      el("span", {}, ...highlighted(segment.text, pattern)),
    );
  };
  // One button per segment of `part` into `container`; shows `first` (or the part's best).
  const fill = (container, part, first) => {
    container.replaceChildren();
    for (const segment of part) {
      const node = button("seg", `Segment ${segment.index + 1}: ${described(segment)}`, segment.start, segment.end, rank(segment));
      node.dataset.index = segment.index;
      node.addEventListener("click", () => show(segment, node, container));
      container.append(node);
    }
    const chosen = first || part.reduce((a, b) => (rank(b) > rank(a) ? b : a));
    show(chosen, container.children[part.indexOf(chosen)], container);
  };
  const best = segments.find((s) => s.index === bestIndex);
  if (segments.length <= STRIP_BUTTONS) {
    const flat = strip(`Scores of ${segments.length} segments across the document`, "strip");
    fill(flat, segments, best);
    return flat;
  }
  const size = Math.ceil(segments.length / STRIP_BUTTONS);
  const groups = [];
  for (let i = 0; i < segments.length; i += size) groups.push(segments.slice(i, i + size));
  const overview = strip(`Scores of ${segments.length} segments across the document, in ${groups.length} groups`, "strip overview");
  const zoom = strip("The chosen group's segments", "strip zoom");
  const open = (group, node, first) => {
    overview.querySelectorAll(".group").forEach((b) => b.setAttribute("aria-pressed", String(b === node)));
    fill(zoom, group, first);
  };
  groups.forEach((group) => {
    const top = Math.max(...group.map(rank));
    const last = group[group.length - 1];
    const what = top === -Infinity ? "none read by the model" : `best ${fmt(top)}`;
    const node = button("group", `Segments ${group[0].index + 1}–${last.index + 1}: ${what}`, group[0].start, last.end, top);
    node.addEventListener("click", () => open(group, node));
    overview.append(node);
  });
  const home = Math.max(0, groups.findIndex((g) => g.includes(best)));
  open(groups[home], overview.children[home], best);
  return el("div", { className: "strips" }, overview, zoom);
}

// How many of a hit's segments the model read and who chose them, worded as `longrank search` words it
// ("2 of 31 segments read, BM25 preselection").
function readNote(hit, response) {
  const read = hit.segments.filter((s) => s.scored).length;
  const total = hit.segments.length;
  const preselect = response.preselect || {};
  const active = preselect.selector && preselect.selector !== "none" && (preselect.per_doc !== undefined || preselect.budget !== undefined);
  let who = "";
  if (read < total && response.pipeline === "firstp") who = ", FirstP (the first)";
  else if (read < total && preselect.selector === "bm25") who = ", BM25 preselection";
  else if (read < total && active) who = `, preselection by ${preselect.selector}`;
  return `${read} of ${total} segments read${who}`;
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
  const expansion = response.expansion || [];
  $("expansion").hidden = expansion.length === 0;
  $("expansion").textContent = `RM3 searched with: ${expansion.map((t) => `${t.term} ${fmt(t.weight, 3)}`).join(" · ")}`;
  const model = response.model
    ? `, re-ranked by the model ${response.model}${modelSources[response.model] ? ` (${modelSources[response.model]})` : ""}`
    : "";
  const stage = { dense: "dense search", hybrid: "the hybrid first stage" }[request.first_stage] || "BM25";
  const depth = response.model && request.depth ? ` from ${stage}'s top ${request.depth}` : "";
  const summary = response.results.length === 0
    ? "No document matches this query."
    : `${counted(response.results.length, "result")} from ${response.collection}, ${response.pipeline}${model}${depth}.`;
  $("legend").hidden = !response.results.some((hit) => hit.segments);
  lastSearch = { response, request, summary };
  setStatus("status", summary);
  if (response.results.length === 0) return;
  const pattern = queryPattern(response.query);
  for (const hit of response.results) {
    const title = el("button", { type: "button", className: "title", textContent: hit.title || hit.docid });
    title.addEventListener("click", () => navigate({ ...request, doc: hit.docid }, false, { fromResults: true }));
    const scores = [`score ${fmt(hit.score)}`];
    scores.push(...firstStageNotes(hit, request.first_stage));
    if (hit.model_score !== undefined && hit.model_score !== hit.score) scores.push(`model ${fmt(hit.model_score)}`);
    if (hit.segments) scores.push(readNote(hit, response));
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
}

// A hit's first-stage score under its name, and with a hybrid first stage its rank in each list.
function firstStageNotes(hit, firstStage) {
  if (hit.first_stage_score === undefined) return [];
  if (firstStage !== "hybrid") return [`${firstStage === "dense" ? "dense" : "BM25"} ${fmt(hit.first_stage_score)}`];
  const lists = hit.first_stages || {};
  const ranks = ["bm25", "dense"].filter((l) => lists[l]).map((l) => `${l === "bm25" ? "BM25" : "dense"} #${lists[l].rank}`);
  return [`fused ${fmt(hit.first_stage_score, 4)} (${ranks.join(", ")})`];
}

// The search as URL parameters: depth and model only for pipelines that re-rank.
function searchParams() {
  const info = pipelineInfo[$("pipeline").value];
  const reranks = Boolean(info && info.needs_model);
  const readChosen = !$("read-label").hidden;
  const bm25 = readChosen && $("read").value === "bm25";
  return {
    q: $("q").value.trim(),
    collection: $("collection").value,
    pipeline: $("pipeline").value,
    model: reranks && !$("model-label").hidden ? $("model").value : undefined,
    first_stage: $("first_stage").value || undefined,
    k: $("k").value,
    depth: reranks ? $("depth").value : undefined,
    ...(readChosen ? { read: $("read").value || undefined } : {}),
    ...(bm25 ? { per_doc: $("per_doc").value, keep_first: $("keep_first").checked ? "1" : undefined, budget: $("budget").value || undefined } : {}),
  };
}

// The parameters that make a search (not the open document): equal keys, the same results.
const SEARCH_KEYS = ["q", "collection", "pipeline", "model", "first_stage", "k", "depth", "read", "per_doc", "keep_first", "budget"];
const searchKey = (params) => SEARCH_KEYS.map((k) => params[k] || "").join("\u0000");

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
    model: params.model || undefined,
    first_stage: params.first_stage || undefined,
    k: Number(params.k) || undefined,
    depth: Number(params.depth) || undefined,
    preselect: preselectOf(params),
    segment_text: true,
  };
  try {
    const response = await api("/search", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
    });
    if (seq === searchSeq) renderResults(response, Object.fromEntries(SEARCH_KEYS.map((k) => [k, params[k]])));
  } catch (e) {
    if (seq !== searchSeq) return;
    $("results").replaceChildren();
    setStatus("status", e.message, "error");
  } finally {
    if (seq === searchSeq) $("results").removeAttribute("aria-busy");
  }
}

// Drops a search still under way: the URL no longer asks for it (Back while it ran).
function abandonSearches() {
  searchSeq++;
  $("results").removeAttribute("aria-busy");
}

function closeDocument() {
  $("document").hidden = true;
  $("results").hidden = false;
  if (lastSearch) setStatus("status", lastSearch.summary);
}

// The document view of `docid` from the last search (its best segment marked when it is one of the results;
// a shared URL may name any document of the collection).
async function showDocument(docid) {
  const { response } = lastSearch;
  const collection = response.collection;
  const pattern = queryPattern(response.query);
  const hit = response.results.find((h) => h.docid === docid) || { docid };
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
      const everyRead = hit.segments.every((segment) => segment.scored);
      best.title = `Best segment${everyRead ? "" : " read"} (${hit.best_segment.index + 1} of ${hit.segments.length}), score ${fmt(hit.best_segment.score)}`;
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
