// composer.js — writing to the room or a task thread as yourself: @mention completion
// from the project's people and agents, replies, and errors shown under the box. In your
// private room it also attaches images and files (attachments.js): picked, pasted or dropped.
//
// Keyboard: Enter sends, Shift+Enter adds a line. While the mention list is open,
// Up/Down choose, Enter or Tab insert, Escape closes it.

import { post, seg } from "./api.js";
import * as project from "./project.js";
import * as stream from "./stream.js";
import { createAttachments } from "./attachments.js";
import { h, uid, errorSlot, clearError, showError, avatar } from "./ui.js";

const MAX_OPTIONS = 8;

// ---- lifecycle -------------------------------------------------------------------------

/** A composer for the current project; taskId posts into that task's thread; attachments offers
 *  images and files (your private room only: the server takes them nowhere else).
 *  onSending(body) may show the message on its way and return {done()}; onPosted(message)
 *  runs with the server's copy of each posted message. */
export function createComposer({ taskId = null, onSending, onPosted, label = "Message", attachments = false } = {}) {
  const listId = uid("mentions");
  const hintId = uid("hint");
  const input = h("textarea", {
    id: uid("composer"), rows: "2", maxlength: "8000", autocomplete: "off",
    role: "combobox", "aria-autocomplete": "list", "aria-expanded": "false", "aria-controls": listId,
    "aria-describedby": hintId,
  });
  // On a phone the full words don't fit the short box: the hint below already says "@ to mention".
  const where = taskId ? "Write in this thread…" : "Write to the room…";
  const narrow = window.matchMedia("(max-width: 560px)");
  const placeholder = () => { input.placeholder = narrow.matches ? where : `${where} (@ to mention)`; };
  placeholder();
  narrow.addEventListener("change", placeholder);
  const list = h("ul", { id: listId, class: "mention-list", role: "listbox", "aria-label": "People and agents", hidden: true });
  const send = h("button", { type: "submit", class: "primary", text: "Send" });
  const replyText = h("span", { class: "reply-target" });
  const replyCancel = h("button", { type: "button", class: "link", text: "Cancel reply" });
  const reply = h("p", { class: "composer-reply", hidden: true }, replyText, " ", replyCancel);
  const error = errorSlot();
  const form = h("form", { class: "composer", "aria-label": taskId ? "Post in this thread" : "Post to the room" });
  const files = attachments ? createAttachments({ slug: project.slug(), error, dropTarget: form, textarea: input }) : null;
  form.append(reply, files?.strip || "",
    h("label", { for: input.id, class: "sr-only", text: label }),
    h("div", { class: "composer-row" }, files?.button || "", files?.input || "",
      h("div", { class: "composer-input" }, input, list), send),
    error,
    h("p", { class: "hint", id: hintId, text: "Enter sends · Shift+Enter for a new line · @ to mention someone"
      + (files ? " · attach, paste or drop images and files" : "") }));

  const state = { taskId, replyTo: null, options: [], active: -1, token: null, input, list, send, error, reply,
    replyText, onSending, onPosted, files };

  form.addEventListener("submit", (e) => {
    e.preventDefault();
    submit(state);
  });
  // "Could not reach the server" stops being true once the live stream is back.
  const offStatus = stream.onStatus((status) => {
    if (status === "live" && state.offline) {
      state.offline = false;
      clearError(state.error);
    }
  });
  input.addEventListener("keydown", (e) => onKey(state, e));
  input.addEventListener("input", () => refreshMentions(state));
  input.addEventListener("click", () => refreshMentions(state));
  input.addEventListener("blur", () => setTimeout(() => closeMentions(state), 150));
  replyCancel.addEventListener("click", () => {
    setReply(state, null);
    input.focus();
  });

  return {
    el: form,
    /** Reply to a message: the post carries in_reply_to. */
    replyTo(message) {
      setReply(state, message);
      input.focus();
    },
    focus() {
      input.focus();
    },
    destroy() {
      offStatus();
    },
  };
}

// ---- actions ---------------------------------------------------------------------------------

async function submit(state) {
  const body = state.input.value.trim();
  const { files } = state;
  if (!body && !files?.count()) {
    showError(state.error, files ? "Write something or attach a file first." : "Write something first.");
    state.input.focus();
    return;
  }
  clearError(state.error);
  state.send.disabled = true;
  state.send.setAttribute("aria-busy", "true");
  const payload = { body };
  if (state.taskId) payload.task_id = state.taskId;
  if (state.replyTo) payload.in_reply_to = state.replyTo.id;
  if (files?.count()) {
    if (files.uploading()) state.send.textContent = "Uploading…";
    const ids = await files.ready();
    state.send.textContent = "Send";
    if (!ids) { // an upload failed while we waited: its reason is shown, and nothing is sent
      state.send.disabled = false;
      state.send.removeAttribute("aria-busy");
      return;
    }
    if (ids.length) payload.attachments = ids;
    if (!body && !ids.length) { // every file was removed meanwhile
      state.send.disabled = false;
      state.send.removeAttribute("aria-busy");
      return;
    }
  }
  const sending = state.onSending?.(body);
  try {
    const { message } = await post(`/api/projects/${seg(project.slug())}/messages`, payload);
    state.input.value = "";
    files?.clear();
    setReply(state, null);
    closeMentions(state);
    sending?.done();
    state.onPosted?.(message);
  } catch (err) {
    sending?.done(); // not sent: the words stay in the box, with the reason under it
    showError(state.error, err);
    state.offline = err?.code === "network"; // cleared once the live stream is back
  } finally {
    state.send.disabled = false;
    state.send.removeAttribute("aria-busy");
    state.input.focus();
  }
}

// ---- callbacks --------------------------------------------------------------------------------

function onKey(state, e) {
  const open = !state.list.hidden && state.options.length > 0;
  if (open) {
    if (e.key === "ArrowDown" || e.key === "ArrowUp") {
      e.preventDefault();
      const step = e.key === "ArrowDown" ? 1 : -1;
      setActive(state, (state.active + step + state.options.length) % state.options.length);
      return;
    }
    if ((e.key === "Enter" || e.key === "Tab") && !e.shiftKey && state.active >= 0) {
      e.preventDefault();
      pick(state, state.options[state.active]);
      return;
    }
    if (e.key === "Escape") {
      e.preventDefault();
      closeMentions(state);
      return;
    }
  }
  if (e.key === "Escape" && state.replyTo) {
    setReply(state, null);
    return;
  }
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    state.input.form.requestSubmit();
  }
}

function refreshMentions(state) {
  const token = mentionAtCaret(state.input);
  state.token = token;
  if (!token) return closeMentions(state);
  const q = token.query.toLowerCase();
  state.options = project.addresses().filter((c) => matches(c, q)).slice(0, MAX_OPTIONS);
  if (!state.options.length) return closeMentions(state);
  state.list.replaceChildren(...state.options.map((c, i) => {
    const option = h("li", { id: `${state.list.id}-${i}`, role: "option", "aria-selected": "false", class: "mention-option" },
      avatar(c.name, c.kind === "agent" ? c.address : c.color, c.kind),
      h("span", { class: "mention-name", text: c.name }),
      h("span", { class: "mention-address", text: `@${c.address}` }),
      c.kind === "agent" ? h("span", { class: "muted small", text: "agent" }) : null);
    option.addEventListener("mousedown", (e) => {
      e.preventDefault();
      pick(state, c);
    });
    return option;
  }));
  state.list.hidden = false;
  state.input.setAttribute("aria-expanded", "true");
  setActive(state, 0);
}

// ---- internal ----------------------------------------------------------------------------------

/** The "@partial" just before the caret, or null. */
function mentionAtCaret(input) {
  const pos = input.selectionStart;
  if (pos !== input.selectionEnd) return null;
  const before = input.value.slice(0, pos);
  const m = /(^|[\s(,;:])@([A-Za-z0-9/_-]*)$/.exec(before);
  return m ? { start: pos - m[2].length - 1, end: pos, query: m[2] } : null;
}

function matches(c, q) {
  if (!q) return true;
  const name = c.address.includes("/") ? c.address.split("/")[1] : c.address;
  return c.address.startsWith(q) || name.startsWith(q) || c.name.toLowerCase().startsWith(q);
}

function pick(state, c) {
  const { input } = state;
  const token = state.token || mentionAtCaret(input);
  if (!token) return;
  const insert = `@${c.address} `;
  input.value = input.value.slice(0, token.start) + insert + input.value.slice(token.end);
  const caret = token.start + insert.length;
  input.setSelectionRange(caret, caret);
  closeMentions(state);
  input.focus();
}

function setActive(state, index) {
  state.active = index;
  [...state.list.children].forEach((li, i) => li.setAttribute("aria-selected", i === index ? "true" : "false"));
  const active = state.list.children[index];
  if (active) {
    state.input.setAttribute("aria-activedescendant", active.id);
    active.scrollIntoView({ block: "nearest" });
  }
}

function closeMentions(state) {
  state.list.hidden = true;
  state.options = [];
  state.active = -1;
  state.input.setAttribute("aria-expanded", "false");
  state.input.removeAttribute("aria-activedescendant");
}

function setReply(state, message) {
  state.replyTo = message;
  state.reply.hidden = !message;
  if (message) {
    const snippet = message.body.length > 80 ? `${message.body.slice(0, 80)}…` : message.body;
    state.replyText.textContent = `Replying to ${message.author.display_name}: “${snippet}”`;
  }
}
