// room.js — the room: general chat oldest first (paged), new messages live from the
// stream, replies, provenance and verdict badges, the task threads, and the pairs of
// agents the loop guard paused (with one click to resume them).
//
// MessageList is also used by the task page for a task's thread.

import { get, post, seg } from "./api.js";
import * as stream from "./stream.js";
import { createComposer } from "./composer.js";
import {
  h, tpl, slots, heading, avatar, badge, stateBadge, timeEl, errorSlot, showError, act, fill, empty, ago,
  announce, debounce,
} from "./ui.js";

const PAGE = 50; // messages shown per "show earlier"
const FETCH = 100; // messages fetched per request

// ---- lifecycle ---------------------------------------------------------------------------

export function mount(el, ctx) {
  const list = new MessageList(ctx, null);
  const composer = createComposer({ onPosted: (m) => list.add(m, { scroll: true }) });
  list.onReply = (m) => composer.replyTo(m);
  const paused = h("div", { class: "paused-list" });
  const threads = h("nav", { class: "threads", "aria-labelledby": "threads-heading" },
    h("h2", { id: "threads-heading", text: "Task threads" }), h("p", { class: "muted", text: "Loading…" }));

  el.append(h("div", { class: "room" },
    h("section", { class: "room-main", "aria-labelledby": "room-heading" },
      heading(1, "Room", { id: "room-heading", class: "sr-only" }),
      list.el,
      h("div", { class: "room-foot" }, paused, composer.el)), // the pause stays in view, beside where one speaks
    threads));

  const renderPaused = () => renderPausedPairs(paused, ctx);
  renderPaused();
  const offProject = ctx.project.onChange(renderPaused);
  const refreshThreads = debounce(() => loadThreads(threads, ctx), 500);
  const offTask = stream.on("task.updated", refreshThreads);
  const offMsg = stream.on("message.posted", (e) => {
    if (e.message?.task_id) refreshThreads();
  });
  list.load().then(() => {
    renderThreads(threads, ctx, list.threads || []);
    list.scrollToEnd();
  });
  return () => {
    list.destroy();
    composer.destroy();
    offProject();
    offTask();
    offMsg();
    refreshThreads.cancel();
  };
}

/** Messages of the room (taskId null) or of one task's thread, oldest first. */
export class MessageList {
  constructor(ctx, taskId) {
    this.ctx = ctx;
    this.taskId = taskId;
    this.messages = []; // oldest first
    this.byId = new Map();
    this.shown = PAGE;
    this.loaded = false;
    this.pending = [];
    this.onReply = null;
    this.threads = null;
    this.more = h("button", { type: "button", class: "more quiet", hidden: true, text: "Show earlier messages" });
    this.more.addEventListener("click", () => this.showEarlier());
    this.status = h("p", { class: "muted", text: "Loading messages…" });
    this.error = errorSlot();
    this.list = h("ol", { class: "messages", role: "log", "aria-label": taskId ? "Thread messages" : "Room messages" });
    this.el = h("div", { class: "message-area" }, this.more, this.status, this.error, this.list);
    this.off = stream.on("message.posted", (e) => this.receive(e.message));
  }

  // lifecycle

  /** Read every page (oldest first) until next_cursor is null; then apply what arrived meanwhile. */
  async load() {
    try {
      let cursor = null;
      const base = `/api/projects/${seg(this.ctx.slug)}/room?limit=${FETCH}`
        + (this.taskId ? `&task_id=${seg(this.taskId)}` : "");
      do {
        const page = await get(base + (cursor ? `&cursor=${seg(cursor)}` : ""));
        for (const m of page.messages) this.remember(m);
        if (page.threads) this.threads = page.threads;
        cursor = page.next_cursor;
      } while (cursor);
      this.status.hidden = true;
    } catch (err) {
      this.status.hidden = true;
      showError(this.error, err);
    }
    this.loaded = true;
    for (const m of this.pending.splice(0)) this.remember(m);
    this.render();
  }

  destroy() {
    this.off();
  }

  // actions

  /** Add one message (from the stream or just posted); a message already here is ignored. */
  add(message, { scroll = false } = {}) {
    if (!this.loaded) {
      this.pending.push(message);
      return;
    }
    if (this.byId.has(message.id)) return;
    const atEnd = scroll || nearBottom();
    this.remember(message);
    this.shown += 1;
    this.list.append(renderMessage(message, this));
    this.updateEmpty();
    if (atEnd) this.scrollToEnd();
  }

  showEarlier() {
    const before = document.documentElement.scrollHeight;
    this.shown += PAGE;
    this.render();
    window.scrollBy(0, document.documentElement.scrollHeight - before);
    this.list.querySelector(".msg")?.focus?.();
  }

  scrollToEnd() {
    const last = this.list.lastElementChild;
    if (last) last.scrollIntoView({ block: "end" });
  }

  // callbacks

  receive(message) {
    if (!message || (message.task_id || null) !== (this.taskId || null)) return;
    const fresh = !this.byId.has(message.id);
    this.add(message);
    if (fresh && this.loaded && message.author.handle !== this.ctx.me.handle) {
      announce(`New message from ${message.author.display_name}`);
    }
  }

  // internal

  remember(m) {
    if (this.byId.has(m.id)) return;
    this.byId.set(m.id, m);
    this.messages.push(m);
  }

  render() {
    const start = Math.max(0, this.messages.length - this.shown);
    this.more.hidden = start === 0;
    if (!this.more.hidden) this.more.textContent = `Show earlier messages (${start} more)`;
    this.list.replaceChildren(...this.messages.slice(start).map((m) => renderMessage(m, this)));
    this.updateEmpty();
  }

  updateEmpty() {
    if (this.messages.length || !this.loaded) {
      this.list.querySelector(".empty")?.remove();
      return;
    }
    if (!this.list.querySelector(".empty")) {
      this.list.append(h("li", { class: "empty", text: this.taskId
        ? "No messages in this thread yet." : "No messages yet. Say hello — @mention an agent to wake it." }));
    }
  }
}

// ---- rendering a message ------------------------------------------------------------------------

const VERDICT = {
  pass: ["pass", "ok"], approve: ["approved", "ok"], changes: ["changes requested", "warn"],
  ask_owner: ["asks the owner", "attention"], draft: ["draft", "muted"],
};

const PROVENANCE = {
  agent_generated: ["agent-written", "muted", "The agent wrote this itself."],
  from_approved_context: ["from approved context", "info", "The agent says this comes from context a person approved."],
  owner_instruction: ["owner's instruction", "info", "The agent says its owner instructed this."],
  owner_approved: ["owner-approved", "ok", "A person approved this."],
};

/** Provenance and verdict badges for a message (or a result). */
export function provenanceBadges(item) {
  const out = [];
  const p = PROVENANCE[item.provenance];
  if (p) out.push(badge(p[0], p[1], p[2]));
  if (item.provenance_status === "claimed") {
    out.push(badge("claimed", "warn", "Claimed by the agent; no person has confirmed it."));
  } else if (item.provenance_status === "attested") {
    out.push(badge("attested", "ok", "Confirmed."));
  }
  if (item.verdict && VERDICT[item.verdict]) {
    const [text, kind] = VERDICT[item.verdict];
    out.push(badge(`verdict: ${text}`, kind));
  }
  return out;
}

export function renderMessage(m, owner) {
  const el = tpl("tpl-message");
  const s = slots(el);
  const { ctx } = owner;
  el.id = `msg-${m.id}`;
  el.dataset.id = m.id;
  el.tabIndex = -1;
  const isAgent = m.author.kind === "agent";
  el.classList.toggle("msg-agent", isAgent);
  if (m.mentions?.includes(ctx.me.handle)) el.classList.add("msg-me");
  s.avatar.replaceWith(avatar(m.author.display_name, isAgent ? m.author.agent_id : colorFor(ctx, m.author.handle),
    isAgent ? "agent" : "person"));
  s.author.textContent = m.author.display_name;
  s.address.textContent = isAgent ? m.author.agent_id : `@${m.author.handle}`;
  s.badges.append(...provenanceBadges(m));
  s.time.append(timeEl(m.created_at));
  renderBody(s.body, m.body);
  if (m.in_reply_to) {
    const parent = owner.byId?.get(m.in_reply_to);
    s.replyto.hidden = false;
    s.replyto.href = `#msg-${m.in_reply_to}`;
    s.replyto.textContent = parent
      ? `↪ in reply to ${parent.author.display_name}: “${clip(parent.body, 70)}”`
      : "↪ in reply to an earlier message";
    s.replyto.addEventListener("click", (e) => {
      e.preventDefault();
      const target = document.getElementById(`msg-${m.in_reply_to}`);
      if (target) {
        target.scrollIntoView({ block: "center" });
        target.focus();
        target.classList.add("flash");
        setTimeout(() => target.classList.remove("flash"), 1500);
      }
    });
  }
  if (m.task_request?.task_id) {
    s.taskrequest.hidden = false;
    s.taskrequest.append("Task request · ",
      h("a", { href: `#/p/${m.project}/tasks/${m.task_request.task_id}`, text: "open the task" }));
  }
  s.reply.setAttribute("aria-label", `Reply to ${m.author.display_name}`);
  if (owner.onReply) s.reply.addEventListener("click", () => owner.onReply(m));
  else s.reply.hidden = true;
  return el;
}

/** The body as text, with @mentions marked (each piece is a text node). */
function renderBody(el, body) {
  const re = /@[A-Za-z0-9][A-Za-z0-9_-]*(?:\/[A-Za-z0-9][A-Za-z0-9_-]*)?/g;
  let last = 0;
  for (const match of body.matchAll(re)) {
    const at = match.index;
    if (at > 0 && /[A-Za-z0-9_.]/.test(body[at - 1])) continue; // an e-mail address, not a mention
    if (at > last) el.append(document.createTextNode(body.slice(last, at)));
    el.append(h("span", { class: "mention", text: match[0] }));
    last = at + match[0].length;
  }
  if (last < body.length) el.append(document.createTextNode(body.slice(last)));
  if (!body) el.append(h("span", { class: "muted", text: "(no text)" }));
}

function clip(text, n) {
  return text.length > n ? `${text.slice(0, n)}…` : text;
}

function colorFor(ctx, handle) {
  const person = ctx.project.data()?.people.find((p) => p.handle === handle);
  return person ? person.color : handle;
}

function nearBottom() {
  return window.innerHeight + window.scrollY >= document.documentElement.scrollHeight - 160;
}

// ---- threads and the loop guard -------------------------------------------------------------------

async function loadThreads(box, ctx) {
  try {
    const page = await get(`/api/projects/${seg(ctx.slug)}/room?limit=1`);
    renderThreads(box, ctx, page.threads || []);
  } catch {
    /* the list stays as it was */
  }
}

function renderThreads(box, ctx, threads) {
  fill(box, h("h2", { id: "threads-heading", text: "Task threads" }),
    threads.length
      ? h("ul", { class: "thread-list" }, threads.map((t) => h("li", {},
        h("a", { href: `#/p/${ctx.slug}/tasks/${t.task_id}`, class: "thread" },
          h("span", { class: "thread-title", text: t.title }),
          h("span", { class: "thread-meta" }, stateBadge(t.state),
            h("span", { class: "muted small", text: `${t.requester || "a person"} → ${t.assignee}` })),
          h("span", { class: "muted small",
            text: `${t.reply_count} ${t.reply_count === 1 ? "message" : "messages"} · ${ago(t.last_activity_at)}` })))))
      : empty("No task threads yet."),
    h("a", { href: `#/p/${ctx.slug}/tasks`, class: "small", text: "All tasks →" }));
}

function renderPausedPairs(box, ctx) {
  const pairs = ctx.project.data()?.paused || [];
  fill(box, pairs.map((pair) => {
    const [a, b] = pair.agents;
    const error = errorSlot();
    const button = h("button", { type: "button", class: "primary small", text: "Resume them" });
    button.addEventListener("click", () => act(button, error, async () => {
      await post(`/api/projects/${seg(ctx.slug)}/resume`, { agents: [a, b] });
      await ctx.project.refresh();
    }));
    return h("div", { class: "banner banner-warn paused", role: "status" },
      h("div", {},
        h("strong", { text: `${a} and ${b} are paused` }),
        h("p", { text: `The loop guard stopped them after ${pair.count} turns back and forth with no person in between. `
          + "Neither can reach the other until a person speaks." })),
      button, error);
  }));
}
