// deliverables.js — the files a task's runs delivered with their results, on the task page: each
// with its name (its path in the run's workspace), size and sha256, a preview of what the page can
// show safely (an image, Markdown, text, a CSV table, a PDF's first pages) and a download. The bytes are fetched with the
// page's own credentials and their sha256 is checked in the browser before anything is shown or
// saved; a file whose bytes do not match says so and is neither previewed nor offered.

import { token } from "./api.js";
import { markdown } from "./markdown.js";
import { h, badge, empty, timeEl } from "./ui.js";

const PREVIEW_ROWS = 50;
const PREVIEW_TEXT = 20000;
const PDF_PAGES = 3;  // the server draws a PDF's first three pages (PDF_PREVIEW_PAGES)

/** The "Delivered files" section of a task page (detail.deliverables, newest first). */
export function deliverablesSection(deliverables) {
  return h("section", { class: "section", "aria-labelledby": "files-heading" },
    h("h2", { id: "files-heading", text: "Delivered files" }),
    deliverables?.length ? h("ul", { class: "deliverables" }, deliverables.map(deliverableCard))
      : empty("No files delivered yet."));
}

function deliverableCard(d) {
  const name = d.ref.split("/").pop();
  const status = h("span", { class: "small muted", text: "checking…" });
  const preview = h("div", { class: "deliverable-preview" });
  const download = h("a", { class: "button small", href: d.url + "?download=1", download: name,
    "aria-label": `Download ${d.ref}`, text: "Download" });
  const card = h("li", { class: "deliverable", dataset: { ref: d.ref } },
    h("div", { class: "deliverable-head" },
      h("code", { class: "deliverable-name", text: d.ref }),
      h("span", { class: "muted small", text: `${size(d.byte_size)} · ${d.content_type}` }),
      h("span", { class: "muted small", title: d.sha256, text: `sha256 ${d.sha256.slice(0, 12)}…` }),
      h("span", { class: "muted small" }, "from ", d.uploaded_by, " · ", timeEl(d.created_at)),
      status, download),
    preview);
  load(d, name, status, preview, download);
  return card;
}

async function load(d, name, status, preview, download) {
  let bytes;
  try {
    const headers = token() ? { Authorization: `Bearer ${token()}` } : {};
    const response = await fetch(d.url, { headers, credentials: "same-origin", cache: "no-store" });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    bytes = await response.arrayBuffer();
  } catch (err) {
    status.replaceWith(badge("could not be fetched", "warn", String(err.message || err)));
    return;
  }
  const digest = [...new Uint8Array(await crypto.subtle.digest("SHA-256", bytes))]
    .map((b) => b.toString(16).padStart(2, "0")).join("");
  if (digest !== d.sha256) {
    status.replaceWith(badge("sha256 does not match", "danger", `got ${digest}`));
    download.remove();
    return;
  }
  status.replaceWith(badge("sha256 checked", "ok", d.sha256));
  const blob = new Blob([bytes], { type: d.preview ? d.content_type : "application/octet-stream" });
  download.href = URL.createObjectURL(blob);  // what was checked is what is saved
  if (d.preview) preview.append(render(d, bytes, blob, name));
}

function render(d, bytes, blob, name) {
  if (d.content_type.startsWith("image/")) {
    return h("img", { src: URL.createObjectURL(blob), alt: `Preview of ${name}`, class: "deliverable-image" });
  }
  if (d.content_type === "application/pdf") return pdfPages(d.url, name);
  const text = new TextDecoder().decode(bytes).slice(0, PREVIEW_TEXT);
  if (d.content_type === "text/markdown") return markdown(text, { class: "deliverable-md" });
  if (d.content_type === "text/csv") return csvTable(text, name);
  return h("pre", { class: "code small deliverable-text", text });
}

/** A PDF's first pages as pictures the server draws (GET …/pages/N; X-Page-Count says how many there are). */
function pdfPages(url, name) {
  const box = h("div", { class: "deliverable-pdf" });
  const note = h("p", { class: "muted small", text: "Drawing the first pages…" });
  box.append(note);
  (async () => {
    const headers = token() ? { Authorization: `Bearer ${token()}` } : {};
    let pages = 1;
    for (let n = 1; n <= Math.min(pages, PDF_PAGES); n++) {
      const response = await fetch(`${url}/pages/${n}`, { headers, credentials: "same-origin" });
      if (!response.ok) {
        const problem = await response.json().catch(() => ({}));
        note.textContent = `No preview: ${problem.error?.message || `HTTP ${response.status}`}`;
        return;
      }
      pages = Number(response.headers.get("X-Page-Count")) || 1;
      const src = URL.createObjectURL(await response.blob());
      box.insertBefore(h("img", { src, class: "deliverable-page", alt: `Page ${n} of ${pages} of ${name}` }), note);
    }
    note.textContent = pages > PDF_PAGES ? `The first ${PDF_PAGES} of ${pages} pages; download the PDF for the rest.`
      : `${pages} ${pages === 1 ? "page" : "pages"}.`;
  })().catch((err) => { note.textContent = `No preview: ${err.message || err}`; });
  return box;
}

/** A CSV's first rows as a table (quoted fields with commas and doubled quotes read as CSV reads them). */
function csvTable(text, name) {
  const rows = parseCsv(text).slice(0, PREVIEW_ROWS + 1);
  const [head, ...rest] = rows;
  return h("div", { class: "deliverable-table" },
    h("table", {},
      h("caption", { class: "muted small", text: `${name}: the first ${Math.min(rest.length, PREVIEW_ROWS)} rows` }),
      h("thead", {}, h("tr", {}, (head || []).map((c) => h("th", { scope: "col", text: c })))),
      h("tbody", {}, rest.map((r) => h("tr", {}, r.map((c) => h("td", { text: c })))))));
}

function parseCsv(text) {
  const rows = [];
  let row = [], field = "", quoted = false;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (quoted) {
      if (c === '"' && text[i + 1] === '"') { field += '"'; i++; }
      else if (c === '"') quoted = false;
      else field += c;
    } else if (c === '"' && field === "") quoted = true;  // a quote opens quoting only at a field's start
    else if (c === ",") { row.push(field); field = ""; }
    else if (c === "\n" || c === "\r") {
      if (c === "\r" && text[i + 1] === "\n") i++;
      row.push(field); rows.push(row); row = []; field = "";
    } else field += c;
  }
  if (field || row.length) { row.push(field); rows.push(row); }
  return rows;
}

function size(n) {
  return n < 1024 ? `${n} B` : n < 1048576 ? `${(n / 1024).toFixed(1)} KiB` : `${(n / 1048576).toFixed(1)} MiB`;
}
