// What every view of the page shares: DOM helpers, number formatting, the status line, and `api()`, the one
// way the page calls the server (it answers errors with the server's own message). Text from the server is
// only ever set as text, never as HTML.
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
// A p-value as the CLI prints it: four decimals, "<0.0001" below.
const fmtP = (p) => (typeof p !== "number" ? "–" : p < 0.0001 ? "<0.0001" : p.toFixed(4));
// "1 result", "2 results".
const counted = (n, noun) => `${n.toLocaleString()} ${noun}${n === 1 ? "" : "s"}`;

function setStatus(id, text, kind) {
  $(id).textContent = text;
  $(id).className = kind || "";
}

// The API key a server with keys asks for, kept for this browser session (sent as `Authorization: Bearer`).
const KEY = "longrank-key";
// The error codes that ask for a key (the key form opens).
const KEY_CODES = ["missing_key", "invalid_key", "insufficient_key"];

async function call(path, options = {}) {
  const key = sessionStorage.getItem(KEY);
  const headers = new Headers(options.headers || {});
  if (key) headers.set("Authorization", `Bearer ${key}`);
  let response;
  try {
    response = await fetch(path, { ...options, headers });
  } catch (e) {
    throw new Error(`The server did not answer (${e.message}).`);
  }
  if (!response.ok) {
    const body = await response.json().catch(() => null);
    const code = body && body.error ? body.error.code : "";
    if (KEY_CODES.includes(code)) $("key-form").hidden = false;
    throw Object.assign(new Error(body && body.error ? body.error.message : `HTTP ${response.status}`), { code });
  }
  return response;
}

async function api(path, options) {
  return (await call(path, options)).json();
}

// A file from the API saved by the browser (a link cannot send the key).
async function download(path, name) {
  const blob = await (await call(path)).blob();
  const link = el("a", { href: URL.createObjectURL(blob), download: name });
  document.body.append(link);
  link.click();
  link.remove();
  URL.revokeObjectURL(link.href);
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
