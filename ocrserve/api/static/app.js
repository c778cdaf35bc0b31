// The ocrserve web page: upload documents, see their lines over the page, watch the lanes.
// Plain JavaScript, no build. Every URL is relative, so the page also works under a path prefix.

const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";
/** sessionStorage key of the API key: kept for this tab's session only. */
const KEY_STORAGE = "ocrserve.apiKey";
/** A single file above this many bytes becomes a job (with the mode "by size"). */
const SYNC_MAX_BYTES = 2 * 1024 * 1024;
/** Milliseconds between refreshes of the lanes panel. */
const STATS_EVERY_MS = 3000;
/** Images the browser shows itself; anything else (TIFF, PDF) is drawn by POST /v1/preview. */
const BROWSER_IMAGES = /^image\/(png|jpeg|gif|webp|bmp)$/;
const KEY_HINT = " Enter a valid API key above.";

const state = {
  result: null, // the result JSON shown (POST /v1/ocr, or GET /v1/jobs/{id}/result)
  files: [], // the File of each document in it
  page: 0, // index into result.pages
  images: new Map(), // "document:index" -> object URL promise of the page's image
  job: null, // the id of the job being followed
  fastMaxPages: 4, // router.fast.max_pages, from GET /v1/stats
};

/** A problem detail (RFC 9457) the gateway answered with, or a network failure. */
class Problem extends Error {
  constructor(title, detail, status = 0) {
    super(`${title}: ${detail}`);
    this.title = title;
    this.detail = detail;
    this.status = status;
  }
}

function authHeaders() {
  const key = sessionStorage.getItem(KEY_STORAGE);
  return key ? { Authorization: `Bearer ${key}` } : {};
}

/** fetch() with the API key; a response that is not 2xx throws its Problem. */
async function api(path, options = {}) {
  let response;
  try {
    response = await fetch(path, { ...options, headers: { ...authHeaders(), ...(options.headers || {}) } });
  } catch {
    throw new Problem("Network error", "the gateway did not answer");
  }
  if (response.ok) return response;
  let body = {};
  try {
    body = await response.json();
  } catch {
    // not a problem document: fall back to the status line
  }
  throw new Problem(body.title || `HTTP ${response.status}`, body.detail || response.statusText, response.status);
}

// ---- messages -------------------------------------------------------------------------------

function setStatus(text) {
  $("status").textContent = text;
}

/** Whether the gateway refused the API key (or its absence). */
function refusedKey(error) {
  return error.status === 401 || error.status === 403;
}

function showError(error) {
  $("error-title").textContent = error.title || "Error";
  $("error-detail").textContent = (error.detail || error.message || "") + (refusedKey(error) ? KEY_HINT : "");
  $("error").hidden = false;
  setStatus("");
}

function clearError() {
  $("error").hidden = true;
}

// ---- upload ---------------------------------------------------------------------------------

/** Pages of a TIFF by its chain of image file directories (1 for anything else). */
async function tiffPages(file) {
  const view = new DataView(await file.arrayBuffer());
  if (view.byteLength < 8) return 1;
  const order = view.getUint16(0);
  const little = order === 0x4949;
  if (!(little || order === 0x4d4d) || view.getUint16(2, little) !== 42) return 1;
  const seen = new Set();
  let offset = view.getUint32(4, little);
  while (offset && offset + 2 <= view.byteLength && !seen.has(offset)) {
    seen.add(offset);
    const next = offset + 2 + view.getUint16(offset, little) * 12;
    offset = next + 4 <= view.byteLength ? view.getUint32(next, little) : 0;
  }
  return Math.max(seen.size, 1);
}

/** Whether "by size" sends these files as a job: several, a large one, or more pages than the fast lane takes. */
async function wantsJob(files) {
  if (files.length > 1) return true;
  const [file] = files;
  return file.size > SYNC_MAX_BYTES || (await tiffPages(file)) > state.fastMaxPages;
}

async function send(files) {
  if (!files.length) return;
  clearError();
  const mode = $("mode").value;
  try {
    if (mode === "job" || files.length > 1 || (mode === "auto" && (await wantsJob(files)))) {
      await runJob(files);
    } else {
      await runSync(files[0]);
    }
  } catch (error) {
    showError(error);
  } finally {
    $("files").value = "";
  }
}

async function runSync(file) {
  setStatus(`Reading ${file.name}…`);
  const form = new FormData();
  form.append("file", file);
  const result = await (await api("v1/ocr", { method: "POST", body: form })).json();
  setStatus(`${file.name}: ${result.pages.length} page(s) read in ${result.usage.seconds} s (${result.lane} lane).`);
  showResult(result, [file]);
}

function showProgress(done, total) {
  $("progress").max = Math.max(total, 1);
  $("progress").value = done;
  setStatus(`Job: ${done} of ${total} pages done.`);
}

async function runJob(files) {
  setStatus(`Sending ${files.length} document(s) as a job…`);
  const form = new FormData();
  for (const file of files) form.append("file", file);
  const job = await (await api("v1/jobs", { method: "POST", body: form })).json();
  state.job = job.id;
  $("progress-box").hidden = false;
  $("cancel").hidden = false;
  $("cancel").disabled = false;
  showProgress(job.pages_done, job.pages_total);
  let final;
  try {
    final = await follow(job.id, (event) => showProgress(event.pages_done, event.pages_total));
  } finally {
    $("cancel").hidden = true;
    state.job = null;
  }
  showProgress(final.pages_done, final.pages_total);
  setStatus(`Job ${final.status}: ${final.pages_done} of ${final.pages_total} pages done, ${final.pages_failed} failed.`);
  const result = await (await api(`v1/jobs/${job.id}/result`)).json();
  showResult(result, files);
}

/**
 * Follow a job's Server-Sent Events (GET /v1/jobs/{id}/events) until its "done" event, calling
 * onPage with each "page" event's data. fetch() rather than EventSource, which cannot send the key.
 */
async function follow(jobId, onPage) {
  const response = await api(`v1/jobs/${jobId}/events`, { headers: { Accept: "text/event-stream" } });
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let event = { type: "message", data: [] };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    let text = buffer + value;
    const hold = text.endsWith("\r") ? "\r" : ""; // a CR whose LF may come in the next chunk
    text = hold ? text.slice(0, -1) : text;
    const lines = text.split(/\r\n|\r|\n/);
    buffer = lines.pop() + hold;
    for (const line of lines) {
      if (line === "") {
        const data = event.data.length ? JSON.parse(event.data.join("\n")) : null;
        if (event.type === "done") return data;
        if (event.type === "page") onPage(data);
        event = { type: "message", data: [] };
      } else if (line.startsWith("event:")) {
        event.type = line.slice(6).trim();
      } else if (line.startsWith("data:")) {
        event.data.push(line.slice(5).replace(/^ /, ""));
      }
    }
  }
  return (await api(`v1/jobs/${jobId}`)).json(); // the stream ended early: the status as it is
}

async function cancelJob() {
  if (!state.job) return;
  $("cancel").disabled = true;
  try {
    await api(`v1/jobs/${state.job}`, { method: "DELETE" });
    setStatus("Cancelling the job…");
  } catch (error) {
    showError(error);
  }
}

// ---- result ---------------------------------------------------------------------------------

function showResult(result, files) {
  for (const url of state.images.values()) url.then(URL.revokeObjectURL, () => {});
  state.images.clear();
  state.result = result;
  state.files = files;
  state.page = 0;
  $("empty").hidden = true;
  $("result-body").hidden = false;
  renderPage();
}

/** The image of a page as an object URL: the file itself where the browser can show it, else POST /v1/preview. */
function pageImage(doc, index) {
  const key = `${doc}:${index}`;
  if (!state.images.has(key)) {
    const file = state.files[doc];
    const image = BROWSER_IMAGES.test(file.type) && index === 0
      ? Promise.resolve(URL.createObjectURL(file))
      : previewImage(file, index);
    state.images.set(key, image);
  }
  return state.images.get(key);
}

async function previewImage(file, index) {
  const form = new FormData();
  form.append("file", file);
  const response = await api(`v1/preview?page=${index + 1}`, { method: "POST", body: form });
  return URL.createObjectURL(await response.blob());
}

/** The colour of a box of confidence score (0..1): red below 0.5, through amber, to green at 1. */
function scoreColour(score) {
  const hue = Math.round(120 * Math.min(Math.max((score - 0.5) / 0.5, 0), 1));
  return `hsl(${hue} 85% 38%)`;
}

function renderPage() {
  const { result } = state;
  const page = result.pages[state.page];
  const doc = page.document ?? 0;
  const total = result.pages.length;
  const name = state.files[doc]?.name ?? result.documents?.[doc]?.name ?? "document";
  $("page-label").textContent = `${name}, page ${page.index + 1} (${state.page + 1} of ${total})`;
  $("prev").disabled = state.page === 0;
  $("next").disabled = state.page === total - 1;
  $("page-error").hidden = !page.error;
  if (page.error) $("page-error").textContent = `This page failed: ${page.error.title}: ${page.error.detail}`;

  const sheet = $("sheet");
  sheet.hidden = !page.width;
  const boxes = $("boxes");
  const list = $("lines");
  boxes.replaceChildren();
  list.replaceChildren();
  if (!page.width) return;
  sheet.style.aspectRatio = `${page.width} / ${page.height}`;
  boxes.setAttribute("viewBox", `0 0 ${page.width} ${page.height}`);
  boxes.setAttribute("preserveAspectRatio", "none");
  const image = $("page-image");
  image.removeAttribute("src");
  image.alt = `Page ${page.index + 1} of ${name}`;
  const shown = state.page;
  pageImage(doc, page.index).then(
    (url) => {
      if (state.page === shown && state.result === result) image.src = url;
    },
    (error) => showError(error),
  );
  page.lines.forEach((line, n) => {
    const colour = scoreColour(line.score);
    const box = document.createElementNS(SVG, "polygon");
    box.setAttribute("points", line.box.map(([x, y]) => `${x},${y}`).join(" "));
    box.setAttribute("stroke", colour);
    box.dataset.line = n;
    boxes.append(box);
    const item = document.createElement("li");
    item.tabIndex = 0;
    item.dataset.line = n;
    item.style.setProperty("--score", colour);
    const text = document.createElement("span");
    text.className = "text";
    text.textContent = line.text;
    const score = document.createElement("span");
    score.className = "score";
    score.textContent = `${Math.round(line.score * 100)}%`;
    score.title = "the engine's confidence";
    item.append(text, score);
    list.append(item);
  });
}

/** Highlight line n (its box and its list item), or none with null. */
function highlight(n) {
  for (const element of document.querySelectorAll("#boxes .active, #lines .active")) element.classList.remove("active");
  if (n === null) return;
  const box = $("boxes").querySelector(`[data-line="${n}"]`);
  box?.classList.add("active");
  $("lines").querySelector(`[data-line="${n}"]`)?.classList.add("active");
}

function lineOf(event) {
  const target = event.target.closest("[data-line]");
  return target ? Number(target.dataset.line) : null;
}

// ---- downloads ------------------------------------------------------------------------------

/** The result as markdown: the same sections as the gateway's format=markdown (ocrserve.formats.render_markdown). */
function markdown(result) {
  const documents = result.documents || [];
  const sections = [];
  let current = null;
  for (const page of result.pages) {
    if (documents.length > 1 && page.document !== current) {
      current = page.document;
      sections.push(`# ${documents[current].name}\n`);
    }
    const body = page.error ? `> page failed: ${page.error.detail || ""}` : page.text || "";
    sections.push(`## Page ${page.index + 1}\n\n${body}\n`);
  }
  return sections.join("\n");
}

const DOWNLOADS = {
  text: { extension: "txt", type: "text/plain", body: (result) => result.text },
  markdown: { extension: "md", type: "text/markdown", body: markdown },
  json: { extension: "json", type: "application/json", body: (result) => JSON.stringify(result, null, 2) },
};

function download(kind) {
  const { extension, type, body } = DOWNLOADS[kind];
  const blob = new Blob([body(state.result)], { type: `${type};charset=utf-8` });
  const link = document.createElement("a");
  link.href = URL.createObjectURL(blob);
  const base = state.files.length === 1 ? state.files[0].name : `job-${state.result.id}`;
  link.download = `${base}.${extension}`;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 10000);
}

async function copyText() {
  try {
    await navigator.clipboard.writeText(state.result.text);
    setStatus(`Copied the text of ${state.result.pages.length} page(s).`);
  } catch {
    setStatus("The browser did not allow copying: use the Text download.");
  }
}

// ---- lanes ----------------------------------------------------------------------------------

function cell(row, text) {
  const td = document.createElement("td");
  td.textContent = text;
  row.append(td);
}

function renderStats(stats) {
  state.fastMaxPages = stats.fast_max_pages;
  $("window").textContent = stats.window_s;
  const rows = Object.entries(stats.lanes).map(([name, lane]) => {
    const row = document.createElement("tr");
    const head = document.createElement("th");
    head.scope = "row";
    head.textContent = name;
    row.append(head);
    cell(row, `${lane.queued_pages} of ${lane.queue_pages}`);
    cell(row, lane.in_engine);
    cell(row, lane.pages_per_s.toFixed(2));
    cell(row, lane.p95_s === null ? "–" : lane.p95_s.toFixed(2));
    return row;
  });
  $("lanes-table").tBodies[0].replaceChildren(...rows);
  const { engine, jobs } = stats;
  $("slots").textContent = `${engine.in_use} of ${engine.limit}${engine.ready ? "" : " (engine loading)"}`;
  $("jobs-queued").textContent = jobs ? jobs.queued : "–";
  $("jobs-running").textContent = jobs ? `${jobs.running} (${jobs.backlog_pages} pages to go)` : "–";
  $("lanes-status").textContent = jobs ? `Updated ${new Date().toLocaleTimeString()}.` : "The job store does not answer.";
}

let statsTimer = 0;

/**
 * Show GET /v1/stats now, then again every STATS_EVERY_MS while the tab is visible; refused for
 * its key, it waits for one (each refusal counts against the address's failed authentications).
 */
async function refreshStats() {
  clearTimeout(statsTimer);
  if (!document.hidden) {
    try {
      renderStats(await (await api("v1/stats")).json());
    } catch (error) {
      $("lanes-status").textContent = `${error.title}: ${error.detail}.${refusedKey(error) ? KEY_HINT : ""}`;
      if (refusedKey(error)) return;
    }
  }
  clearTimeout(statsTimer); // one schedule, however often it was called
  statsTimer = setTimeout(refreshStats, STATS_EVERY_MS);
}

// ---- wiring ---------------------------------------------------------------------------------

function wire() {
  $("api-key").value = sessionStorage.getItem(KEY_STORAGE) || "";
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const key = $("api-key").value.trim();
    if (key) sessionStorage.setItem(KEY_STORAGE, key);
    else sessionStorage.removeItem(KEY_STORAGE);
    $("key-note").textContent = key ? "Key set for this tab." : "No key: kept in this tab only.";
    refreshStats();
  });
  $("key-forget").addEventListener("click", () => {
    sessionStorage.removeItem(KEY_STORAGE);
    $("api-key").value = "";
    $("key-note").textContent = "Key forgotten.";
  });

  $("files").addEventListener("change", () => send([...$("files").files]));
  // files dropped anywhere on the page are taken (rather than opened by the browser)
  const drop = $("drop");
  window.addEventListener("dragover", (event) => {
    event.preventDefault();
    drop.classList.add("over");
  });
  window.addEventListener("dragleave", (event) => {
    if (!event.relatedTarget) drop.classList.remove("over");
  });
  window.addEventListener("drop", (event) => {
    event.preventDefault();
    drop.classList.remove("over");
    send([...event.dataTransfer.files]);
  });
  $("cancel").addEventListener("click", cancelJob);

  $("prev").addEventListener("click", () => {
    state.page -= 1;
    renderPage();
  });
  $("next").addEventListener("click", () => {
    state.page += 1;
    renderPage();
  });
  for (const button of document.querySelectorAll("[data-download]")) {
    button.addEventListener("click", () => download(button.dataset.download));
  }
  $("copy").addEventListener("click", copyText);

  const lines = $("lines");
  lines.addEventListener("mouseover", (event) => highlight(lineOf(event)));
  lines.addEventListener("focusin", (event) => highlight(lineOf(event)));
  lines.addEventListener("mouseleave", () => highlight(null));
  lines.addEventListener("focusout", () => highlight(null));
  const boxes = $("boxes");
  boxes.addEventListener("mouseover", (event) => {
    const n = lineOf(event);
    highlight(n);
    if (n !== null) lines.querySelector(`[data-line="${n}"]`)?.scrollIntoView({ block: "nearest" });
  });
  boxes.addEventListener("mouseleave", () => highlight(null));
  boxes.addEventListener("click", (event) => {
    const n = lineOf(event);
    if (n !== null) lines.querySelector(`[data-line="${n}"]`)?.focus();
  });
  refreshStats();
}

wire();
