// The batch view: a topic file as a job, its progress, metrics, per-topic chart, and two runs compared.
"use strict";

// ---- Batch view -----------------------------------------------------------------------------------------

let pollTimer = null;
let currentJob = null;

// Seconds as people say them: "40 s", "3 min", "2 h 5 min".
function duration(seconds) {
  const s = Math.round(seconds);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.round(s / 60)} min`;
  return `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min`;
}

// The measures researchers look at first; the rest are one click away.
const KEY_MEASURES = ["map", "recip_rank", "ndcg_cut_10", "P_10", "Rprec", "bpref", "recall_1000", "ndcg"];
const isKey = (m) => KEY_MEASURES.includes(m);
const byKeyOrder = (a, b) => KEY_MEASURES.indexOf(a) - KEY_MEASURES.indexOf(b);

// What a job ran: its pipeline, collection and run tag as recorded in its provenance (the defaults resolved).
function jobRan(job) {
  const prov = job.provenance || {};
  const p = job.params || {};
  const pipeline = (prov.options && prov.options.pipeline) || p.pipeline || "bm25";
  return {
    pipeline,
    collection: (prov.collection && prov.collection.name) || p.collection || "default",
    tag: prov.tag || p.tag || `longrank-${pipeline}`,
    when: job.created_at.replace("T", " ").slice(0, 19),
  };
}

function jobLabel(job) {
  const { pipeline, collection, tag, when } = jobRan(job);
  return `${tag} · ${pipeline} on ${collection} · ${when} · …${job.id.slice(-4)}`;
}

async function loadJobs() {
  const jobs = await api("/batch");
  const rows = jobs.map((job) => {
    const { pipeline, collection, tag, when } = jobRan(job);
    const open = el("a", { href: `/?view=batch&job=${encodeURIComponent(job.id)}`, textContent: tag, title: `run ${job.id}` });
    open.addEventListener("click", (event) => {
      event.preventDefault();
      navigate({ view: "batch", job: job.id });
    });
    const progress = el("progress", { max: Math.max(1, job.progress.total), value: job.progress.done });
    const map = job.metrics ? fmt(job.metrics.all.map, 4) : "–";
    const row = el("tr", {},
      el("td", {}, open),
      el("td", { textContent: pipeline }),
      el("td", { textContent: collection }),
      el("td", {}, el("time", { dateTime: job.created_at, textContent: when })),
      el("td", { textContent: job.status }),
      el("td", {}, progress, ` ${job.progress.done}/${job.progress.total}`),
      el("td", { textContent: map }));
    row.dataset.job = job.id;
    return row;
  });
  $("jobs").tBodies[0].replaceChildren(...rows);
  const done = jobs.filter((j) => j.metrics);
  // A and B default to two different runs: the older of the newest two as A, the newest as B.
  const byAge = [...done].sort((x, y) => x.created_at.localeCompare(y.created_at) || x.id.localeCompare(y.id));
  const defaults = { "compare-a": byAge[Math.max(0, byAge.length - 2)], "compare-b": byAge[byAge.length - 1] };
  for (const id of ["compare-a", "compare-b"]) {
    const current = $(id).value;
    $(id).replaceChildren(...done.map((j) => new Option(jobLabel(j), j.id)));
    $(id).value = done.some((j) => j.id === current) ? current : defaults[id] ? defaults[id].id : "";
  }
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
  const { pipeline, collection, tag, when } = jobRan(job);
  $("job-title").textContent = `Run ${tag} (${job.id})`;
  const k = (job.provenance && job.provenance.options && job.provenance.options.k) || (job.params || {}).k || 1000;
  $("job-meta").textContent = `${job.status} · ${pipeline} on ${collection} · k ${k} · created ${when}`;
  $("job-progress").max = Math.max(1, job.progress.total);
  $("job-progress").value = job.progress.done;
  const eta = job.progress.eta_s === undefined ? "" : ` · about ${duration(job.progress.eta_s)} left`;
  $("job-progress-text").textContent = `${job.progress.done} of ${job.progress.total} topics${eta}${job.error ? ` · ${job.error}` : ""}`;
  $("job-download").href = `/batch/${encodeURIComponent(job.id)}/run`;
  $("job-download").onclick = (event) => {
    event.preventDefault();
    download(`/batch/${encodeURIComponent(job.id)}/run`, `${job.id}.run`).catch((e) =>
      setStatus("batch-status", e.message, "error"));
  };
  $("job-download").hidden = job.status !== "done";
  $("job-warnings").replaceChildren(...(job.warnings || []).map((w) => el("li", { textContent: w.message })));
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
  form.append("field", $("batch-field").value);
  form.append("k", $("batch-k").value);
  // Depth and model only where they apply (the server refuses depth for a first-stage pipeline).
  if (!$("batch-depth-label").hidden) form.append("depth", $("batch-depth").value);
  if (!$("batch-model-label").hidden) form.append("model", $("batch-model").value);
  if ($("batch-tag").value.trim()) form.append("tag", $("batch-tag").value.trim());
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
      el("td", { textContent: fmtP(c.p_value) }),
      el("td", { textContent: `${c.wins} / ${c.ties} / ${c.losses}` }));
    const key = comparisons.filter((c) => isKey(c.measure)).sort((a, b) => byKeyOrder(a.measure, b.measure));
    $("compare-table").tBodies[0].replaceChildren(...key.map(row));
    $("compare-table-all").tBodies[0].replaceChildren(...comparisons.map(row));
    const chosen = comparisons.find((c) => c.measure === measure) || comparisons[0];
    $("compare-result").hidden = false;
    if (chosen) {
      $("compare-chart-title").textContent = `${chosen.measure}: B − A per topic, largest gain first`;
      barChart($("compare-chart"), chosen.per_topic_delta.map((d) => [d.qid, d.delta]), `${chosen.wins} wins, ${chosen.ties} ties, ${chosen.losses} losses over ${chosen.topics} topics`);
    }
  } catch (e) {
    setStatus("batch-status", e.message, "error");
  }
}
