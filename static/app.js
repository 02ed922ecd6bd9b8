// The longrank page: search with segment evidence (search.js), batch runs with progress, metrics and
// comparisons (batch.js), and collections created, fed and deleted over HTTP (collections.js), over common.js. Plain DOM code, no build step. The URL holds the state (?q=… for a
// search, ?view=batch&job=… for a run), so pages can be shared and the back button works.
"use strict";

// ---- Navigation -----------------------------------------------------------------------------------------

// `mark` is kept as the history entry's state (a document opened from the results says so, so that its
// "Back to results" can go back in history).
function navigate(state, replace, mark = null) {
  const params = new URLSearchParams(Object.entries(state).filter(([, v]) => v !== undefined && v !== ""));
  const url = `/?${params}`;
  if (replace) history.replaceState(mark, "", url);
  else history.pushState(mark, "", url);
  route();
}

const VIEWS = ["search", "batch", "collections"];

function showView(name) {
  for (const view of VIEWS) {
    $(`${view}-view`).hidden = view !== name;
    if (view === name) $(`tab-${view}`).setAttribute("aria-current", "page");
    else $(`tab-${view}`).removeAttribute("aria-current");
  }
}

async function route() {
  const params = new URLSearchParams(location.search);
  clearTimeout(pollTimer);
  if (params.get("view") === "collections") {
    showView("collections");
    await loadCollections().catch((e) => setStatus("collections-status", e.message, "error"));
    return;
  }
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
  for (const key of SEARCH_KEYS) {
    if (key === "keep_first") $(key).checked = params.get(key) === "1";
    else if (key === "read" || key === "first_stage") $(key).value = params.get(key) || "";
    else if (params.get(key)) $(key).value = params.get(key);
  }
  syncDepth("pipeline", "depth-label", "model-label");
  const wanted = Object.fromEntries(params);
  if (!wanted.q) return;
  // The same search as the one shown (back from a document, say) is not run again.
  const shown = () => lastSearch && searchKey(lastSearch.request) === searchKey(wanted);
  if (shown()) abandonSearches();
  else await search(wanted);
  if (!shown()) return;
  if (wanted.doc) await showDocument(wanted.doc);
  else closeDocument();
}

$("search").addEventListener("submit", (event) => {
  event.preventDefault();
  const params = searchParams();
  if (params.q) navigate(params);
});
$("close").addEventListener("click", () => {
  if (history.state && history.state.fromResults) history.back();
  else {
    const params = Object.fromEntries(new URLSearchParams(location.search));
    delete params.doc;
    navigate(params, true);
  }
});
$("pipeline").addEventListener("change", () => syncDepth("pipeline", "depth-label", "model-label"));
$("read").addEventListener("change", syncRead);
$("batch-pipeline").addEventListener("change", () => syncDepth("batch-pipeline", "batch-depth-label", "batch-model-label"));
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
for (const view of VIEWS) {
  $(`tab-${view}`).addEventListener("click", (event) => {
    event.preventDefault();
    navigate(view === "search" ? {} : { view });
  });
}
$("create-form").addEventListener("submit", (event) => {
  event.preventDefault();
  createCollection($("new-name").value);
});
$("upload-form").addEventListener("submit", (event) => {
  event.preventDefault();
  uploadDocuments($("upload-collection").value, $("upload-file").files[0], $("upload-format").value);
});
window.addEventListener("popstate", route);
$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(KEY, $("key").value);
  $("key-form").hidden = true;
  setStatus("status", "Type a query and press Enter.");
  loadOptions().then(route);
});

// The server answered when it asks for a key: that is what the status says then.
const unreachable = (e) =>
  KEY_CODES.includes(e.code) ? `This server needs a key: enter it above (${e.message}).` : `Could not reach the server: ${e.message}`;
loadOptions()
  .catch((e) => setStatus("status", unreachable(e), "error"))
  .then(route);
