// ui.js — small DOM helpers every view shares.
//
// Text is only ever set with textContent or text nodes: nothing here takes HTML, so a
// message body or a name can never become markup.

// ---- building ---------------------------------------------------------------

/** Make an element. props: class, text, on<event> handlers, dataset, booleans
 *  (hidden, disabled, checked…), anything else as an attribute. Children: nodes,
 *  strings (as text), arrays, or null/false (skipped). */
export function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value == null || value === false) continue;
    if (key === "innerHTML" || key === "outerHTML") throw new Error("ui.h never sets HTML");
    if (key === "class") el.className = value;
    else if (key === "text") el.textContent = String(value);
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
    else if (typeof value === "boolean") el.toggleAttribute(key, value);
    else if (key === "value" && "value" in el) el.value = String(value);
    else el.setAttribute(key, String(value));
  }
  append(el, children);
  return el;
}

/** Append children (nodes, strings as text, nested arrays; null/false skipped). */
export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child == null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** Replace an element's children. */
export function fill(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

/** A copy of a <template>'s first element. */
export function tpl(id) {
  return document.getElementById(id).content.firstElementChild.cloneNode(true);
}

/** The [data-slot] elements of a cloned template, by name. */
export function slots(root) {
  const found = {};
  if (root.dataset.slot) found[root.dataset.slot] = root;
  for (const el of root.querySelectorAll("[data-slot]")) found[el.dataset.slot] = el;
  return found;
}

let counter = 0;
/** A fresh element id. */
export function uid(prefix = "id") {
  counter += 1;
  return `${prefix}-${counter}`;
}

/** A labelled form control: <div class="field"><label>…</label>control<p hint></div>. */
export function field(labelText, control, hint) {
  if (!control.id) control.id = uid("f");
  const wrap = h("div", { class: "field" }, h("label", { for: control.id, text: labelText }), control);
  if (hint) {
    const hintId = uid("hint");
    control.setAttribute("aria-describedby", hintId);
    wrap.append(h("p", { class: "hint", id: hintId, text: hint }));
  }
  return wrap;
}

/** A <select> from [value, label] pairs (or plain strings). */
export function select(options, props = {}) {
  return h("select", props, options.map((o) => {
    const [value, label] = Array.isArray(o) ? o : [o, o];
    return h("option", { value, text: label });
  }));
}

/** A heading the router can move focus to. */
export function heading(level, text, props = {}) {
  return h(`h${level}`, { tabindex: "-1", ...props, text });
}

/** An in-page link (hash routes only). */
export function link(hash, text, props = {}) {
  return h("a", { href: hash, ...props }, text);
}

/** Lines of a textarea, trimmed, empty ones dropped. */
export function lines(text) {
  return text.split("\n").map((s) => s.trim()).filter(Boolean);
}

// ---- errors and busy buttons ------------------------------------------------

/** A hidden error line, announced when it shows. */
export function errorSlot() {
  return h("p", { class: "error", role: "alert", hidden: true });
}

export function showError(slot, err) {
  slot.textContent = err && err.message ? err.message : String(err);
  slot.hidden = false;
}

export function clearError(slot) {
  slot.textContent = "";
  slot.hidden = true;
}

/** What a screen shows when its data could not be loaded: the reason and a Retry button
 *  that runs retry() (which draws the screen again, or this line again if it fails). */
export function loadFailed(err, retry) {
  const button = h("button", { type: "button", class: "small", text: "Retry" });
  button.addEventListener("click", () => {
    button.disabled = true;
    button.setAttribute("aria-busy", "true");
    button.textContent = "Retrying…";
    Promise.resolve().then(retry).catch((e) => console.error(e));
  });
  return h("div", { class: "load-failed", role: "alert" },
    h("p", { text: err && err.message ? err.message : String(err) }), button);
}

/** Run fn with the button busy and errors shown in slot; resolve to its value, or undefined on error. */
export async function act(button, slot, fn) {
  if (slot) clearError(slot);
  const buttons = button ? [button] : [];
  const focused = buttons.includes(document.activeElement) ? document.activeElement : null;
  for (const b of buttons) {
    b.disabled = true;
    b.setAttribute("aria-busy", "true");
  }
  try {
    return await fn();
  } catch (err) {
    if (slot) showError(slot, err);
    else console.error(err);
    return undefined;
  } finally {
    for (const b of buttons) {
      b.disabled = false;
      b.removeAttribute("aria-busy");
    }
    // a disabled button drops the focus; give it back unless the person moved on meanwhile
    if (focused?.isConnected && nothingFocused()) focused.focus();
  }
}

/** A card's decision made: show ``text`` in its ``result`` status, disable the spent ``buttons`` and
 *  hand the focus they held (or the page's, when it fell back to the page) to the outcome. */
export function settle(result, text, buttons) {
  result.textContent = text;
  result.hidden = false;
  const hadFocus = buttons.includes(document.activeElement);
  for (const b of buttons) b.disabled = true;
  if (hadFocus || nothingFocused()) {
    result.tabIndex = -1;
    result.focus();
  }
  announce(text);
}

/** Show ``dialog`` modally until it settles. ``wire(close)`` hooks its buttons up before it shows;
 *  Escape, and the ``cancel`` button if given, settle it with false. Settled, it is removed and the
 *  focus goes back to ``opener``; ``focus()`` names what takes the focus when it opens. Resolves
 *  what ``close`` was given. */
export function modal(dialog, { opener, cancel, focus } = {}, wire = () => {}) {
  document.body.append(dialog);
  return new Promise((resolve) => {
    let done = false;
    const close = (result) => {
      if (done) return;
      done = true;
      dialog.close();
      dialog.remove();
      if (opener?.isConnected) opener.focus();
      resolve(result);
    };
    cancel?.addEventListener("click", () => close(false));
    dialog.addEventListener("cancel", (e) => { e.preventDefault(); close(false); });
    wire(close);
    dialog.showModal();
    focus?.()?.focus();
  });
}

/** True when the focus fell back to the page itself (the focused element was disabled or removed). */
export function nothingFocused() {
  return !document.activeElement || document.activeElement === document.body;
}

/** A two-click "Revoke" button: run() with the button busy and its errors shown in slot. */
export function revokeButton(slot, ariaLabel, run) {
  return confirmButton("Revoke", "Click again to revoke", (button) => act(button, slot, run),
    { class: "danger-quiet small", "aria-label": ariaLabel });
}

/** A button that asks "again to confirm" before running fn. */
export function confirmButton(label, confirmLabel, fn, props = {}) {
  let armed = false;
  let timer = null;
  const button = h("button", { type: "button", ...props, text: label });
  const aria = props["aria-label"]; // names what it acts on; the confirm step must be heard too
  button.addEventListener("click", () => {
    if (!armed) {
      armed = true;
      button.textContent = confirmLabel;
      if (aria) button.setAttribute("aria-label", `${confirmLabel} — ${aria}`);
      button.classList.add("armed");
      timer = setTimeout(disarm, 5000);
      return;
    }
    disarm();
    fn(button);
  });
  button.addEventListener("blur", () => setTimeout(() => { if (armed && document.activeElement !== button) disarm(); }, 200));
  function disarm() {
    armed = false;
    clearTimeout(timer);
    button.textContent = label;
    if (aria) button.setAttribute("aria-label", aria);
    button.classList.remove("armed");
  }
  return button;
}

// ---- time -------------------------------------------------------------------

const TIME = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit" });
const DAY = new Intl.DateTimeFormat(undefined, { day: "numeric", month: "short" });
const FULL = new Intl.DateTimeFormat(undefined, { dateStyle: "medium", timeStyle: "short" });

/** "14:05" today, "3 Mar, 14:05" this year, else the date. */
export function when(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  const now = new Date();
  if (d.toDateString() === now.toDateString()) return TIME.format(d);
  if (d.getFullYear() === now.getFullYear()) return `${DAY.format(d)}, ${TIME.format(d)}`;
  return FULL.format(d);
}

/** "just now", "5 min ago", "3 h ago", else when(). Future times: "in 20 min". */
export function ago(iso) {
  if (!iso) return "";
  const seconds = Math.round((Date.now() - new Date(iso).getTime()) / 1000);
  const future = seconds < 0;
  const s = Math.abs(seconds);
  let text;
  if (s < 45) return future ? "in a moment" : "just now";
  if (s < 3600) text = `${Math.round(s / 60)} min`;
  else if (s < 86400) text = `${Math.round(s / 3600)} h`;
  else if (s < 86400 * 14) text = `${Math.round(s / 86400)} d`;
  else return when(iso);
  return future ? `in ${text}` : `${text} ago`;
}

/** A <time> element with the full date as its title. */
export function timeEl(iso, relative = false) {
  if (!iso) return h("span", { class: "muted", text: "—" });
  return h("time", { datetime: iso, title: FULL.format(new Date(iso)), text: relative ? ago(iso) : when(iso) });
}

// ---- badges, avatars, people ---------------------------------------------------

/** A small coloured label. kind: ok, warn, danger, info, violet, work, attention, muted. */
export function badge(text, kind = "muted", title) {
  return h("span", { class: `badge badge-${kind}`, title, text });
}

export const STATE_KIND = {
  requested: "info", routed: "info", accepted: "work", working: "work", waiting: "warn",
  verifying: "violet", approval: "attention", completed: "ok", rejected: "danger",
  cancelled: "muted", returned: "attention",
};

export const STATE_LABEL = {
  requested: "requested", routed: "routed", accepted: "accepted", working: "working", waiting: "waiting",
  verifying: "verifying", approval: "awaiting approval", completed: "completed", rejected: "rejected",
  cancelled: "cancelled", returned: "returned",
};

export function stateBadge(state) {
  return h("span", { class: `badge badge-${STATE_KIND[state] || "muted"} state`, dataset: { state },
    text: STATE_LABEL[state] || state });
}

export const AVAILABILITY_KIND = {
  online: "ok", working: "work", idle: "info", asleep: "muted", away: "warn", offline: "muted",
};

export function availabilityBadge(availability) {
  return h("span", { class: `badge badge-${AVAILABILITY_KIND[availability] || "muted"} availability`,
    text: availability || "unknown" });
}

/** Colour slot 0-7 for a person (from the server) or an agent (from its ID). */
export function colorOf(value) {
  if (typeof value === "number") return value & 7;
  let n = 0;
  for (const ch of String(value)) n = (n * 31 + ch.codePointAt(0)) >>> 0;
  return n % 8;
}

/** A round (person) or square (agent) initial. */
export function avatar(name, color, kind = "person") {
  const initial = (String(name || "?").trim()[0] || "?").toUpperCase();
  return h("span", { class: `avatar c${colorOf(color)}${kind === "agent" ? " agent" : ""}`, "aria-hidden": "true",
    text: initial });
}

/** Plain words for a code-like value: "approval_required" -> "approval required". */
export function words(value) {
  return String(value ?? "").replaceAll("_", " ");
}

/** The person who owns an agent ("oj/muse" → "oj"). */
export function ownerOf(agentId) {
  return String(agentId).split("/")[0];
}

/** A URL safe to link to (http or https only), else null. */
export function safeUrl(value) {
  try {
    const url = new URL(value, window.location.href);
    return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
  } catch {
    return null;
  }
}

/** A "Copy" button for text produced by getText(); says when it worked. */
export function copyButton(getText, label = "Copy") {
  const button = h("button", { type: "button", class: "small", text: label });
  button.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(getText());
      button.textContent = "Copied";
    } catch {
      button.textContent = "Select and copy it by hand";
    }
    setTimeout(() => { button.textContent = label; }, 2000);
  });
  return button;
}

/** An empty-state line. */
export function empty(text) {
  return h("p", { class: "empty", text });
}

let announcing = null;

/** Announce something to screen readers (the shell's polite live region). */
export function announce(text) {
  const region = document.getElementById("announcer");
  if (!region) return;
  clearTimeout(announcing); // the latest word wins; announce("") silences one still pending
  region.textContent = "";
  if (text) announcing = setTimeout(() => { region.textContent = text; }, 30);
}

/** Call fn at most once per wait ms, after the last call. */
export function debounce(fn, wait) {
  let timer = null;
  const run = (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), wait);
  };
  run.cancel = () => clearTimeout(timer);
  return run;
}
