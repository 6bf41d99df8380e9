// markdown.js — text people and agents write (messages, packets, checkpoints, results) shown as
// Markdown: marked (static/vendor/marked.esm.js) turns it into HTML, DOMPurify
// (static/vendor/purify.es.mjs) keeps only the tags and attributes listed here, and the result is
// inserted as a DOM fragment, never as an HTML string. Raw HTML in the text stays text; links
// open in a new tab without the page's opener or referrer; only http(s), mailto and in-page
// links survive (no javascript:, data: or other schemes).

import { Marked } from "./vendor/marked.esm.js";
import DOMPurify from "./vendor/purify.es.mjs";
import { h } from "./ui.js";

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
const escapeHtml = (text) => String(text).replace(/[&<>"']/g, (c) => ESCAPES[c]);

// GitHub-flavoured Markdown with single newlines kept as line breaks (as chat is written).
// Raw HTML blocks and inline tags are shown as the text they are.
const marked = new Marked({ gfm: true, breaks: true, async: false }, {
  renderer: { html: ({ text }) => escapeHtml(text) },
});

const SANITIZE = {
  ALLOWED_TAGS: ["a", "p", "br", "strong", "em", "del", "code", "pre", "ul", "ol", "li", "blockquote", "hr",
    "h1", "h2", "h3", "h4", "h5", "h6", "table", "thead", "tbody", "tr", "th", "td"],
  ALLOWED_ATTR: ["href", "title", "start", "align"],
  ALLOWED_URI_REGEXP: /^(?:https?:|mailto:|#)/i,
  RETURN_DOM_FRAGMENT: true,
};

const purify = DOMPurify(window);
purify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName !== "A") return;
  if (!node.hasAttribute("href")) return; // a link whose scheme was removed is left as plain text
  if (node.getAttribute("href").startsWith("#")) return; // in the page: no new tab
  node.setAttribute("target", "_blank");
  node.setAttribute("rel", "noopener noreferrer");
});

const MENTION = /@[A-Za-z0-9][A-Za-z0-9_-]*(?:\/[A-Za-z0-9][A-Za-z0-9_-]*)?/g;

/** Markdown text as a sanitised DocumentFragment, @mentions marked outside code and links. Text the
 * renderer can't take (nesting past its stack, say) comes back as plain text: one message never hides
 * the others. */
export function renderMarkdown(text) {
  let fragment;
  try {
    fragment = purify.sanitize(marked.parse(String(text ?? "")), SANITIZE);
  } catch {
    fragment = document.createDocumentFragment();
    fragment.append(h("span", { class: "md-plain", text: String(text ?? "") }));
    return fragment;
  }
  for (const a of fragment.querySelectorAll("a:not([href])")) a.replaceWith(...a.childNodes);
  const blocks = [...fragment.childNodes].filter((n) => n.nodeType !== Node.TEXT_NODE || n.data.trim());
  if (blocks.length === 1 && blocks[0].nodeName === "P") fragment.replaceChildren(...blocks[0].childNodes); // a one-line chat message
  markMentions(fragment);
  return fragment;
}

/** A <div class="md"> with ``text`` rendered; ``props`` as ui.h takes them. */
export function markdown(text, props = {}) {
  const el = h("div", { ...props, class: `md${props.class ? ` ${props.class}` : ""}` });
  el.append(renderMarkdown(text));
  return el;
}

const BLOCKS = new Set(["P", "LI", "PRE", "BLOCKQUOTE", "TR", "TD", "TH", "H1", "H2", "H3", "H4", "H5", "H6", "HR"]);

/** Markdown text as the plain words a reader sees, on one line: no `**`, backticks, table pipes or
 * list marks; blocks and table cells are kept apart by a space. For summaries and snippets. */
export function plainText(text) {
  let fragment;
  try {
    fragment = purify.sanitize(marked.parse(String(text ?? "")), SANITIZE);
  } catch {
    return String(text ?? "").replace(/\s+/g, " ").trim();
  }
  const out = [];
  const walk = (node) => {
    if (node.nodeType === Node.TEXT_NODE) out.push(node.data);
    else if (node.nodeName === "BR") out.push(" ");
    for (const child of node.childNodes) walk(child);
    if (BLOCKS.has(node.nodeName)) out.push(" ");
  };
  walk(fragment);
  return out.join("").replace(/\s+/g, " ").trim();
}

/** Rendered text with a small "Raw" toggle that shows exactly what was written (and back). */
export function markdownWithRaw(text, props = {}) {
  const shown = markdown(text, props);
  const raw = h("pre", { class: "raw", hidden: true, text });
  const toggle = rawToggle(shown, raw);
  return h("div", { class: "md-block" }, toggle, shown, raw);
}

/** A button that swaps ``rendered`` and ``raw`` (a <pre> of the source text). */
export function rawToggle(rendered, raw) {
  const button = h("button", { type: "button", class: "link small raw-toggle", "aria-pressed": "false",
    title: "Show the text exactly as written", text: "Raw" });
  button.addEventListener("click", () => {
    const showRaw = raw.hidden;
    raw.hidden = !showRaw;
    rendered.hidden = showRaw;
    button.setAttribute("aria-pressed", String(showRaw));
    button.textContent = showRaw ? "Formatted" : "Raw";
  });
  return button;
}

// ---- internal -------------------------------------------------------------------------------

/** Wrap @name and @owner/agent in text nodes (not in code, pre or links) in span.mention. */
function markMentions(root) {
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT, {
    acceptNode: (node) => (node.parentElement?.closest("code, pre, a") ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT),
  });
  const nodes = [];
  while (walker.nextNode()) nodes.push(walker.currentNode);
  for (const node of nodes) {
    const text = node.data;
    const pieces = [];
    let last = 0;
    for (const match of text.matchAll(MENTION)) {
      const at = match.index;
      if (at > 0 && /[A-Za-z0-9_.]/.test(text[at - 1])) continue; // an e-mail address, not a mention
      if (at > last) pieces.push(document.createTextNode(text.slice(last, at)));
      pieces.push(h("span", { class: "mention", text: match[0] }));
      last = at + match[0].length;
    }
    if (!pieces.length) continue;
    if (last < text.length) pieces.push(document.createTextNode(text.slice(last)));
    node.replaceWith(...pieces);
  }
}
