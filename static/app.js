// The longrank page: search with segment evidence (search.js), and batch runs with progress, metrics and
// comparisons (batch.js), over common.js. Plain DOM code, no build step. The URL holds the state (?q=… for a
// search, ?view=batch&job=… for a run), so pages can be shared and the back button works.
"use strict";

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
$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(KEY, $("key").value);
  $("key-form").hidden = true;
  loadOptions().then(route);
});

loadOptions()
  .catch((e) => setStatus("status", `Could not reach the server: ${e.message}`, "error"))
  .then(route);
