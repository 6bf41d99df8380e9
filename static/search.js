// search.js — #/search?q=…: what GET /api/search finds in your projects (messages, task
// titles and packets), best match first. A message links to its place in the room or its
// task's thread, where it is scrolled to and marked; a task links to its page.

import { get } from "./api.js";
import { messageHref } from "./room.js";
import { plainText } from "./markdown.js";
import { h, heading, errorSlot, showError, fill, empty, badge, timeEl, announce } from "./ui.js";

// ---- lifecycle ---------------------------------------------------------------------------------

export function mount(el, ctx) {
  const q = (ctx.query?.get("q") || "").trim();
  const box = document.getElementById("search");
  if (box && box.value !== q) box.value = q;
  const status = h("p", { class: "muted", role: "status" });
  const error = errorSlot();
  const results = h("ol", { class: "search-results" });
  el.append(h("div", { class: "page-head" }, heading(1, q ? `Search: ${q}` : "Search")), status, error, results);
  if (!q) {
    status.textContent = "Type in the search box above: words, \"a phrase\", prefix* or OR between words.";
    return undefined;
  }
  let live = true;
  status.textContent = "Searching…";
  get(`/api/search?q=${encodeURIComponent(q)}&limit=50`).then((out) => {
    if (!live) return;
    status.textContent = out.results.length
      ? `${out.results.length === 50 ? "The best 50" : out.results.length} ${out.results.length === 1 ? "result" : "results"}`
      : "";
    fill(results, out.results.map(resultItem));
    if (!out.results.length) results.replaceWith(empty(`Nothing found for “${q}” in your projects.`));
    announce(status.textContent || "Nothing found");
  }, (err) => {
    if (!live) return;
    status.textContent = "";
    showError(error, err);
  });
  return () => { live = false; };
}

// ---- rendering -----------------------------------------------------------------------------------

// A task's state in the words a person reads (never the code the server keeps).
const STATE_WORDS = {
  requested: "asked for", routed: "with its agent", accepted: "taken on", working: "in progress",
  waiting: "waiting for an answer", verifying: "being checked", approval: "waiting for a decision",
  completed: "done", rejected: "turned down", cancelled: "cancelled", returned: "handed back",
};

// Where a snippet's matches begin and end while its Markdown is taken out (private-use characters).
const OPEN = "\uE000";
const CLOSE = "\uE001";

// Marks a snippet cut mid-way leaves unpaired (Markdown reads them as text): "**", "__", backticks, and the
// pipes of a table cut from its header.
const STRAY = /\*\*+|__+|`+|\|/g;

/** A snippet's pieces with their Markdown taken out, the matches still marked. */
export function plainSnippet(pieces) {
  const joined = pieces.map((p) => (p.match ? `${OPEN}${p.text}${CLOSE}` : p.text)).join("");
  return plainText(joined).replace(STRAY, " ").replace(/\s{2,}/g, " ").split(/(\uE000[^\uE001]*\uE001?)/).filter(Boolean)
    .map((text) => (text.startsWith(OPEN) ? { text: text.replace(/[\uE000\uE001]/g, ""), match: true }
      : { text: text.replace(/[\uE000\uE001]/g, ""), match: false }))
    .filter((p) => p.text);
}

function resultItem(r) {
  const isMessage = r.kind === "message";
  const href = isMessage ? messageHref(r.message) : `#/p/${r.project}/tasks/${r.task_id}`;
  const where = isMessage ? (r.task_id ? `in the task “${plainText(r.title)}”` : "in the room")
    : `task, ${STATE_WORDS[r.task.state] || "open"}`;
  return h("li", { class: "search-result", dataset: { kind: r.kind } },
    h("a", { href, class: "search-hit" },
      h("span", { class: "search-head" },
        badge(isMessage ? "message" : "task", isMessage ? "info" : "violet"),
        h("span", { class: "search-title", text: isMessage ? r.message.author.display_name : plainText(r.title) }),
        h("span", { class: "muted small search-where", text: `${r.project_name} · ${where}` }),
        h("span", { class: "muted small" }, timeEl(r.at))),
      h("span", { class: "search-snippet" },
        plainSnippet(r.snippet).map((piece) => (piece.match ? h("mark", { text: piece.text }) : piece.text)))));
}
