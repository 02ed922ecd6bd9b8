// The collections view: the collections with their sizes, and their writes over HTTP (create, upload a file of
// documents, delete), each followed through its task: the upload's bytes sent, then the task's bytes read,
// then what it indexed and skipped, with each problem's position.
"use strict";

// Bytes in the unit that fits, as `longrank collections` prints them.
function size(bytes) {
  const units = ["B", "kB", "MB", "GB", "TB"];
  const at = Math.min(units.length - 1, Math.max(0, Math.floor(Math.log10(Math.max(bytes, 1)) / 3)));
  return at === 0 ? `${bytes} B` : `${(bytes / 10 ** (3 * at)).toFixed(1)} ${units[at]}`;
}

// A problem of a task as a line: "upload line 3 (byte 77): message".
const problemText = (p) =>
  `${p.file}${p.line ? ` line ${p.line}` : ""}${p.offset !== undefined ? ` (byte ${p.offset})` : ""}` +
  `${p.docid ? ` ${JSON.stringify(p.docid)}` : ""}: ${p.message}`;

async function loadCollections() {
  const collections = await api("/collections");
  const rows = collections.map((c) => {
    const remove = el("button", { type: "button", className: "delete", textContent: "Delete" });
    remove.addEventListener("click", () => deleteCollection(c.name));
    const row = el("tr", {},
      el("th", { scope: "row", textContent: c.name }),
      el("td", { className: "documents", textContent: c.documents.toLocaleString() }),
      el("td", { textContent: fmt(c.average_length, 1) }),
      el("td", { textContent: size(c.size_bytes) }),
      el("td", {}, remove));
    row.dataset.collection = c.name;
    return row;
  });
  $("collections-table").tBodies[0].replaceChildren(...rows);
  const chosen = $("upload-collection").value;
  $("upload-collection").replaceChildren(...collections.map((c) => el("option", { value: c.name, textContent: c.name })));
  if (collections.some((c) => c.name === chosen)) $("upload-collection").value = chosen;
  await loadCluster();
}

// A cluster (several replicas, an object store) as `/cluster` shows it: the writer, the object store's state,
// and each replica with the version of each collection it serves. A single server shows none of it.
async function loadCluster() {
  const cluster = await api("/cluster").catch(() => null);
  const shown = Boolean(cluster && (cluster.objects || cluster.writer || cluster.replicas.length > 1));
  $("cluster").hidden = !shown;
  if (!shown) return;
  const parts = [cluster.writer ? `Writer: ${cluster.writer.replica} (${cluster.writer.url})` : "No writer at this moment"];
  const o = cluster.objects;
  if (o) {
    const newest = o.newest.map((v) => `${v.collection} v${v.version}`).join(", ") || "none";
    parts.push(`object store ${o.url}: ${counted(o.versions, "version")}, ${counted(o.objects, "object")}, ${size(o.bytes)}; newest: ${newest}`);
  }
  $("cluster-summary").textContent = `${parts.join(" · ")}.`;
  const rows = cluster.replicas.map((r) => {
    const writer = cluster.writer && cluster.writer.replica === r.id ? " (writer)" : "";
    const state = r.live ? "live" : `last seen ${duration(r.seen_ms_ago / 1000)} ago`;
    const serves = (r.versions || []).map((v) => `${v.collection} v${v.version}`).join(", ") || counted(r.fingerprints.length, "collection");
    const row = el("tr", {}, el("th", { scope: "row", textContent: `${r.id}${writer}` }), el("td", { textContent: state }), el("td", { textContent: serves }));
    row.dataset.replica = r.id;
    return row;
  });
  $("cluster-table").tBodies[0].replaceChildren(...rows);
}

function showProgress(fraction) {
  $("upload-progress").hidden = fraction === null;
  if (fraction !== null) $("upload-progress").value = fraction;
}

// Polls a task until it has finished; `running(task)` shows it meanwhile.
async function followTask(task, running) {
  while (task.status === "queued" || task.status === "running") {
    running(task);
    await new Promise((resolve) => setTimeout(resolve, 300));
    task = await api(`/tasks/${task.id}`);
  }
  if (task.status !== "succeeded") throw new Error(`Task ${task.id} ${task.status}: ${task.error || "see /tasks"}`);
  return task;
}

async function write(path, method, doing, done) {
  setStatus("collections-status", doing);
  try {
    const task = await api(path, { method });
    await followTask(task, () => setStatus("collections-status", `${doing} (task ${task.id} ${task.status})`));
    // The table first: a status that says done describes the table beside it.
    await loadCollections().catch(() => {});
    setStatus("collections-status", done, "done");
  } catch (e) {
    setStatus("collections-status", e.message, "error");
    await loadCollections().catch(() => {});
  }
}

function createCollection(name) {
  return write(`/collections/${encodeURIComponent(name)}`, "PUT", `Creating ${name}…`, `Created ${name}.`);
}

function deleteCollection(name) {
  if (!confirm(`Delete the collection ${name} and every document in it?`)) return Promise.resolve();
  return write(`/collections/${encodeURIComponent(name)}`, "DELETE", `Deleting ${name}…`, `Deleted ${name}.`);
}

// Sends a file with XMLHttpRequest (fetch reports no upload progress), then follows its task.
function sendFile(path, file) {
  return new Promise((resolve, reject) => {
    const request = new XMLHttpRequest();
    request.open("POST", path);
    const key = sessionStorage.getItem(KEY);
    if (key) request.setRequestHeader("Authorization", `Bearer ${key}`);
    request.setRequestHeader("Content-Type", "application/octet-stream");
    request.upload.addEventListener("progress", (event) => {
      if (!event.lengthComputable) return;
      showProgress(0.5 * (event.loaded / event.total));
      setStatus("collections-status", `Uploading ${file.name}: ${megabytes(event.loaded)} of ${megabytes(event.total)}`);
    });
    request.addEventListener("load", () => {
      const body = JSON.parse(request.responseText || "null");
      if (request.status === 202) resolve(body);
      else reject(new Error(body && body.error ? body.error.message : `HTTP ${request.status}`));
    });
    request.addEventListener("error", () => reject(new Error("The server did not answer the upload.")));
    request.send(file);
  });
}

async function uploadDocuments(collection, file, format) {
  const query = format ? `?format=${encodeURIComponent(format)}` : "";
  $("upload-errors").replaceChildren();
  showProgress(0);
  setStatus("collections-status", `Uploading ${file.name}…`);
  try {
    let task = await sendFile(`/collections/${encodeURIComponent(collection)}/documents${query}`, file);
    task = await followTask(task, (t) => {
      const p = t.progress;
      showProgress(p && p.bytes_total ? 0.5 + 0.5 * (p.bytes_read / p.bytes_total) : 0.5);
      setStatus("collections-status", `Indexing ${file.name} into ${collection} (task ${t.id} ${t.status})…`);
    });
    showProgress(1);
    await loadCollections().catch(() => {}); // before the status, as in `write`
    const d = task.documents;
    setStatus("collections-status",
      `Indexed ${counted(d.indexed, "document")} into ${collection}${d.skipped ? `, skipped ${d.skipped}` : ""}.`, "done");
    $("upload-errors").replaceChildren(...task.errors.map((e) => el("li", { textContent: problemText(e) })));
  } catch (e) {
    showProgress(null);
    setStatus("collections-status", e.message, "error");
    await loadCollections().catch(() => {});
  }
}
