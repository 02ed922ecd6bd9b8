// The search page: asks the server for collections, runs /search, shows results and documents.
"use strict";

const $ = (id) => document.getElementById(id);

function setStatus(text, isError) {
  $("status").textContent = text;
  $("status").className = isError ? "error" : "";
}

async function api(path, options) {
  const response = await fetch(path, options);
  const body = await response.json().catch(() => null);
  if (!response.ok) {
    throw new Error(body && body.error ? body.error.message : `HTTP ${response.status}`);
  }
  return body;
}

async function loadPipelines() {
  try {
    const { pipelines } = await api("/pipelines");
    const select = $("pipeline");
    select.replaceChildren(...pipelines.filter((p) => p.available).map((p) => new Option(p.name, p.name)));
    const wanted = new URLSearchParams(location.search).get("pipeline");
    if (wanted) select.value = wanted;
  } catch (e) {
    setStatus(`Could not list pipelines: ${e.message}`, true);
  }
}

async function loadCollections() {
  try {
    const collections = await api("/collections");
    const select = $("collection");
    select.replaceChildren(...collections.map((c) => new Option(`${c.name} (${c.documents})`, c.name)));
    const wanted = new URLSearchParams(location.search).get("collection");
    if (wanted) select.value = wanted;
  } catch (e) {
    setStatus(`Could not list collections: ${e.message}`, true);
  }
}

function renderResults(response) {
  const list = $("results");
  list.replaceChildren();
  if (response.results.length === 0) {
    setStatus("No results.");
    return;
  }
  setStatus(`${response.results.length} results in ${response.took_ms.toFixed(1)} ms (${response.pipeline}).`);
  for (const hit of response.results) {
    const item = document.createElement("li");
    item.dataset.docid = hit.docid;
    const title = document.createElement("button");
    title.className = "title";
    title.type = "button";
    title.textContent = hit.title || hit.docid;
    title.addEventListener("click", () => showDocument(hit.docid, response.collection));
    const meta = document.createElement("p");
    meta.className = "meta";
    const bm25 = hit.first_stage_score === undefined ? "" : ` · BM25 ${hit.first_stage_score.toFixed(3)}`;
    const best = hit.best_segment ? ` · best of ${hit.segments.length} segments: #${hit.best_segment.index + 1}` : "";
    meta.textContent = `${hit.docid} · score ${hit.score.toFixed(3)}${bm25}${best}`;
    const snippet = document.createElement("p");
    snippet.className = "snippet";
    snippet.textContent = hit.snippet;
    item.append(title, meta, snippet);
    list.append(item);
  }
}

async function search(pushState) {
  const q = $("q").value.trim();
  if (!q) return;
  const params = new URLSearchParams({
    q,
    k: $("k").value,
    depth: $("depth").value,
    pipeline: $("pipeline").value,
    collection: $("collection").value,
  });
  if (pushState) history.pushState(null, "", `?${params}`);
  $("document").hidden = true;
  setStatus("Searching…");
  try {
    renderResults(await api(`/search?${params}`));
  } catch (e) {
    $("results").replaceChildren();
    setStatus(e.message, true);
  }
}

async function showDocument(docid, collection) {
  try {
    const doc = await api(`/documents/${encodeURIComponent(docid)}?collection=${encodeURIComponent(collection)}`);
    $("doc-title").textContent = doc.title || doc.docid;
    $("doc-id").textContent = `${doc.docid} · ${doc.collection}`;
    $("doc-text").replaceChildren(...doc.text.split("\n\n").map((p) => Object.assign(document.createElement("p"), { textContent: p })));
    $("document").hidden = false;
    $("document").scrollIntoView();
  } catch (e) {
    setStatus(e.message, true);
  }
}

$("search").addEventListener("submit", (event) => {
  event.preventDefault();
  search(true);
});
$("close").addEventListener("click", () => { $("document").hidden = true; });
window.addEventListener("popstate", () => restore());

function restore() {
  const params = new URLSearchParams(location.search);
  if (params.get("q")) {
    $("q").value = params.get("q");
    if (params.get("k")) $("k").value = params.get("k");
    if (params.get("depth")) $("depth").value = params.get("depth");
    search(false);
  }
}

Promise.all([loadCollections(), loadPipelines()]).then(restore);
