// The search view: a query through any pipeline, each result with its segments' scores as a strip, the best
// segment marked, and the document with that segment in view.
"use strict";

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
