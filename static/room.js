// room.js — the room: general chat opening at the newest page ("Show older messages"
// pages back), new messages live from the stream, replies, provenance and verdict badges,
// make-or-spend cards decided in place, the task threads, the pairs of agents the loop
// guard paused (with one click to resume them) and, in your private room, its controls and
// images and files sent with your messages (attachments.js).
//
// Bodies are Markdown (markdown.js), with a "Raw" toggle for the text as written; a day
// separator stands before each day's first message; a message's time links to it; one
// author's messages in a row share one header.
//
// Read = seen: your read position moves only over messages that were on screen while the tab was
// in view (an IntersectionObserver); a "New messages" line stands where your unread messages
// start, a bar above says how many when that line is out of view (Jump, Mark read), a "N new"
// pill says so when messages arrive below while you read higher up, and "Mark unread" on a
// message takes your read position back to it.
//
// MessageList is also used by the task page for a task's thread.

import { get, post, seg } from "./api.js";
import * as stream from "./stream.js";
import { createComposer } from "./composer.js";
import { createRoomControls } from "./privateroom.js";
import { createSchedules } from "./schedules.js";
import { actionCard } from "./makeaction.js";
import { markSeen, paintUnread, reload as reloadInbox } from "./inbox_store.js";
import { renderMarkdown, rawToggle, plainText } from "./markdown.js";
import { renderAttachments } from "./attachments.js";
import { markDialog, localDay } from "./story.js";
import { requesterText } from "./task_common.js";
import {
  h, tpl, slots, heading, avatar, badge, stateBadge, timeEl, errorSlot, showError, clearError, act, fill, empty, ago,
  announce, debounce, loadFailed,
} from "./ui.js";

const PAGE = 50; // messages per page, newest page first
const REVEAL_PAGES = 20; // how far back a link to a message pages to find it
const GROUP_MS = 5 * 60 * 1000; // one author's messages this close together share one header
const DAY_LABEL = new Intl.DateTimeFormat(undefined, { weekday: "long", day: "numeric", month: "long", year: "numeric" });

// ---- lifecycle ---------------------------------------------------------------------------

export function mount(el, ctx) {
  const paused = h("div", { class: "paused-list" });
  const threads = h("nav", { class: "threads", "aria-labelledby": "threads-heading" },
    h("h2", { id: "threads-heading", text: "Task threads" }), h("p", { class: "muted", text: "Loading…" }));
  const own = ctx.project.isPrivate() ? createRoomControls(ctx) : null;
  const schedules = own ? createSchedules(ctx) : null;

  const list = new MessageList(ctx, null);
  const composer = createComposer({ onSending: (body) => list.sending(body), onPosted: (m) => list.add(m, { scroll: true }),
    attachments: !!own });
  list.onReply = (m) => composer.replyTo(m);
  // beside the composer: on a phone the header with its "Live" marker has scrolled away
  const dropped = h("p", { class: "notice warn room-offline", role: "status", hidden: true,
    text: "Reconnecting… New messages show here once the connection is back." });
  const offStatus = stream.onStatus((s) => { dropped.hidden = s !== "reconnecting"; });
  const foot = h("div", { class: "room-foot" }, dropped, paused, own?.turn, composer.el);
  list.coveredBy(foot);
  el.append(h("div", { class: `room${own ? " private" : ""}` },
    h("section", { class: "room-main", "aria-labelledby": "room-heading" },
      heading(1, own ? "Your room" : "Room", { id: "room-heading", class: "sr-only" }),
      list.el,
      // the pause and the turn stay in view, beside where one speaks
      foot),
    h("div", { class: "room-side" }, own?.settings, schedules?.el, threads)));

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
    const settle = () => {
      list.openAtUnread();
      requestAnimationFrame(() => list.openAtUnread()); // once the side column and the foot are laid out
    };
    if (!ctx.id) settle();
    else list.revealDeep(ctx.id).then((shown) => { if (!shown) settle(); });
  });
  return () => {
    list.destroy();
    composer.destroy();
    own?.destroy();
    schedules?.destroy();
    offProject();
    offTask();
    offMsg();
    offStatus();
    refreshThreads.cancel();
  };
}

/** Messages of the room (taskId null) or of one task's thread, oldest first: the newest
 *  page, older pages on request, new ones from the stream. */
export class MessageList {
  constructor(ctx, taskId) {
    this.ctx = ctx;
    this.taskId = taskId;
    this.messages = []; // oldest first
    this.byId = new Map();
    this.previous = null; // previous_cursor: the page before the oldest shown, null at the start
    this.loaded = false;
    this.loadingOlder = false;
    this.pending = [];
    this.onReply = null;
    this.threads = null;
    this.more = h("button", { type: "button", class: "more quiet", hidden: true, text: "Show older messages" });
    this.more.addEventListener("click", () => this.loadOlder());
    this.start = h("p", { class: "room-start muted small", hidden: true,
      text: taskId ? "The start of this thread." : "The start of the room." });
    this.status = h("div", { class: "muted", text: "Loading messages…" });
    this.error = errorSlot();
    this.list = h("ol", { class: "messages" });
    // The live region wraps the list, so each message stays a list item of a list.
    this.log = h("div", { role: "log", "aria-label": taskId ? "Thread messages" : "Room messages" }, this.list);
    this.foot = null; // a sticky element over the bottom of the view (the room's composer), if any
    this.sent = 0;
    this.inFlight = []; // [{el, body}] of your messages shown as "Sending…"
    this.read = null; // {unread, first_unread}: where your unread messages started when the page was read
    this.holdRead = false; // after "Mark unread", nothing more is marked read until you open the room again
    this.seenIndex = -1; // the newest message (index in messages) that was on screen
    this.onScreen = new Set(); // message elements in view now
    this.divider = h("li", { class: "unread-divider" },
      h("span", { text: "New messages" }));
    this.jump = h("button", { type: "button", class: "link", text: "Jump" });
    this.jump.addEventListener("click", () => this.jumpToUnread());
    this.readAll = h("button", { type: "button", class: "link", text: "Mark read" });
    this.readAll.addEventListener("click", () => this.markAllRead());
    this.unreadCount = h("span");
    this.unreadBar = h("div", { class: "unread-bar", role: "status", hidden: true }, this.unreadCount, this.jump,
      this.readAll);
    this.pill = h("button", { type: "button", class: "new-pill", hidden: true });
    this.pill.addEventListener("click", () => this.scrollToEnd());
    this.newBelow = 0;
    this.watch = new IntersectionObserver((entries) => this.seeing(entries), { threshold: [0, 0.5, 1] });
    this.onVisible = () => this.noteSeen();
    document.addEventListener("visibilitychange", this.onVisible);
    this.onScroll = () => this.placeBar();
    window.addEventListener("scroll", this.onScroll, { passive: true });
    this.el = h("div", { class: "message-area" }, this.unreadBar, this.more, this.start, this.status, this.error,
      this.log, this.pill);
    this.offs = [
      stream.on("message.posted", (e) => this.receive(e.message)),
      stream.on("action.updated", (e) => this.updateAction(e.action)),
      // the stream could not continue where it was (a restore, say): read the newest page again
      stream.on("resync", () => { if (this.loaded) this.load(); }),
    ];
  }

  // lifecycle

  /** Read the newest page; then apply what arrived meanwhile. */
  async load() {
    try {
      const page = await get(`${this.base()}&latest=1`);
      for (const m of page.messages) this.remember(m);
      if (page.threads) this.threads = page.threads;
      if (page.read) this.read = page.read;
      this.previous = page.previous_cursor ?? null;
      this.status.hidden = true;
    } catch (err) {
      fill(this.status, loadFailed(err, () => this.load()));
      this.status.hidden = false;
      return; // not loaded: what the stream brings waits in pending for the retry
    }
    this.loaded = true;
    for (const m of this.pending.splice(0)) this.remember(m);
    this.render();
  }

  destroy() {
    for (const off of this.offs) off();
    this.watch.disconnect();
    document.removeEventListener("visibilitychange", this.onVisible);
    window.removeEventListener("scroll", this.onScroll);
  }

  // actions

  /** Add one message (from the stream or just posted); a message already here is ignored. */
  add(message, { scroll = false } = {}) {
    if (!this.loaded) {
      this.pending.push(message);
      return;
    }
    if (this.byId.has(message.id)) {
      if (scroll) this.scrollToEnd(); // your own message, already here from the stream: show it
      return;
    }
    const atEnd = scroll || this.nearEnd();
    this.landed(message);
    this.remember(message);
    const el = renderMessage(message, this);
    this.list.append(el);
    this.watch.observe(el);
    const others = !mine(message, this.ctx);
    if (others && !this.read?.first_unread && (!atEnd || document.visibilityState !== "visible")) {
      this.read = { unread: 1, first_unread: message.id }; // arrived unseen: unread starts here
    } else if (others && this.read?.first_unread) {
      this.read.unread += 1;
    }
    this.markDays();
    this.updateEmpty();
    if (atEnd) this.scrollToEnd();
    else if (others) this.newBelow += 1;
    this.placeBar();
  }

  /** Fetch the page before the oldest message shown and put it on top, keeping the view still. */
  async loadOlder() {
    if (!this.previous || this.loadingOlder) return;
    this.loadingOlder = true;
    this.more.setAttribute("aria-busy", "true");
    this.more.textContent = "Loading older messages…";
    clearError(this.error);
    try {
      const page = await get(`${this.base()}&before=${seg(this.previous)}`);
      const older = page.messages.filter((m) => !this.byId.has(m.id));
      for (const m of older) this.byId.set(m.id, m);
      this.messages = [...older, ...this.messages];
      this.previous = page.previous_cursor ?? null;
      const anchor = this.list.querySelector(".msg");
      const top = anchor?.getBoundingClientRect().top;
      const shown = older.map((m) => renderMessage(m, this));
      this.list.prepend(...shown);
      for (const el of shown) this.watch.observe(el);
      this.seenIndex += older.length;
      // Replies whose parent just arrived can now quote it.
      const arrived = new Set(older.map((m) => m.id));
      for (const m of this.messages) {
        if (m.in_reply_to && arrived.has(m.in_reply_to) && !arrived.has(m.id)) {
          const again = renderMessage(m, this);
          document.getElementById(`msg-${m.id}`)?.replaceWith(again);
          this.watch.observe(again);
        }
      }
      this.markDays();
      if (anchor) window.scrollBy(0, anchor.getBoundingClientRect().top - top);
      this.updateEmpty();
      announce(older.length === 1 ? "1 older message shown" : `${older.length} older messages shown`);
    } catch (err) {
      showError(this.error, err);
    } finally {
      this.loadingOlder = false;
      this.more.removeAttribute("aria-busy");
      this.more.textContent = "Show older messages";
      this.more.hidden = !this.previous;
      this.start.hidden = !!this.previous; // paged all the way back
      if (this.more.hidden && (document.activeElement === this.more || document.activeElement === document.body)) {
        this.list.querySelector(".msg")?.focus(); // the start of the room: focus its first message
      }
    }
  }

  // reading: what was on screen is read

  /** The observer's news: which messages are in view now (half of one, or its end, counts). */
  seeing(entries) {
    for (const e of entries) {
      const edge = this.foot ? this.foot.getBoundingClientRect().top : window.innerHeight;
      const seen = e.isIntersecting && (e.intersectionRatio >= 0.5 || e.boundingClientRect.bottom <= edge);
      if (seen) this.onScreen.add(e.target);
      else this.onScreen.delete(e.target);
    }
    this.noteSeen();
  }

  /** Move your read position to the newest message on screen, while the tab is in view. */
  noteSeen() {
    if (document.visibilityState !== "visible" || this.holdRead || !this.onScreen.size) return;
    let newest = -1;
    for (const el of this.onScreen) {
      if (el.isConnected) newest = Math.max(newest, this.messages.findIndex((m) => m.id === el.dataset.id));
    }
    if (newest <= this.seenIndex) return;
    this.seenIndex = newest;
    markSeen(this.ctx.slug, this.taskId, this.messages[newest].id);
    if (newest === this.messages.length - 1) this.newBelow = 0;
    this.placeBar();
  }

  /** Open at the "New messages" line when it is here and something is unread; else at the end. */
  openAtUnread() {
    this.placeDivider();
    if (this.divider.isConnected && this.read?.unread) this.divider.scrollIntoView({ block: "start" });
    else this.scrollToEnd();
    this.placeBar();
  }

  /** The bar above (unread out of view above) and the pill below (new messages out of view below). */
  placeBar() {
    this.placeDivider();
    const unread = this.read?.unread || 0;
    const first = this.read?.first_unread ? this.messages.findIndex((m) => m.id === this.read.first_unread) : -1;
    const seenSome = first >= 0 && this.seenIndex >= first; // you have read from the line on
    const above = unread > 0 && !seenSome && (!this.divider.isConnected || this.divider.getBoundingClientRect().bottom < 0);
    this.unreadBar.hidden = !above;
    this.unreadCount.textContent = unread === 1 ? "1 unread message" : `${unread} unread messages`;
    this.pill.hidden = !this.newBelow;
    this.pill.textContent = `${this.newBelow} new ↓`;
    this.pill.setAttribute("aria-label", this.newBelow === 1 ? "1 new message below" : `${this.newBelow} new messages below`);
  }

  /** The "New messages" line before the first unread message, when that message is on the page. */
  placeDivider() {
    const at = this.read?.first_unread && document.getElementById(`msg-${this.read.first_unread}`);
    if (!at || !this.list.contains(at)) {
      this.divider.remove();
      return;
    }
    if (at.previousElementSibling !== this.divider) at.before(this.divider);
  }

  /** Scroll to where your unread messages start, paging back to it if needed. */
  async jumpToUnread() {
    const id = this.read?.first_unread;
    if (!id) return;
    await this.revealDeep(id);
    this.placeDivider();
    this.divider.scrollIntoView({ block: "start" });
  }

  /** "Mark read": everything here is read (the newest message), though not all of it was seen. */
  async markAllRead() {
    const last = this.messages[this.messages.length - 1];
    if (!last) return;
    try {
      const body = this.taskId ? { message_id: last.id, task_id: this.taskId } : { message_id: last.id };
      this.read = await post(`/api/projects/${seg(this.ctx.slug)}/read`, body);
      this.seenIndex = this.messages.length - 1;
      this.newBelow = 0;
      this.placeBar();
      reloadInbox();
      announce("Marked read");
    } catch (err) {
      showError(this.error, err);
    }
  }

  /** "Mark as a moment" on a message: the story's dialog, its day and first line filled in, linked to it. */
  markMoment(message, opener) {
    const first = (message.body || "").split("\n").map((line) => line.replace(/^[#>*\-\s]+/, "").trim()).find(Boolean) || "";
    return markDialog(this.ctx, { message_id: message.id, day: localDay(new Date(message.created_at)),
      title: first.length > 140 ? `${first.slice(0, 139)}…` : first }, opener);
  }

  /** "Mark unread" on a message: unread from it on; nothing more is marked read during this visit. */
  async markUnread(message) {
    try {
      const body = this.taskId ? { message_id: message.id, task_id: this.taskId } : { message_id: message.id };
      this.read = await post(`/api/projects/${seg(this.ctx.slug)}/unread`, body);
      this.holdRead = true;
      this.seenIndex = this.messages.findIndex((m) => m.id === message.id) - 1;
      this.placeBar();
      reloadInbox();
      announce("Marked unread from this message");
    } catch (err) {
      showError(this.error, err);
    }
  }

  /** Your message on its way: shown at the end as "Sending…" until the server has it.
   *  Returns {done()}, which takes it away (the server's copy takes its place). */
  sending(body) {
    this.sent += 1;
    const { me } = this.ctx;
    const el = renderMessage({ id: `sending-${this.sent}`, author: { kind: "person", handle: me.handle,
      display_name: me.display_name }, body, mentions: [], created_at: null }, { ctx: this.ctx });
    el.classList.add("msg-sending");
    el.setAttribute("aria-busy", "true");
    fill(el.querySelector(".msg-time"), "Sending…");
    el.querySelector(".msg-reply").hidden = true;
    this.list.querySelector(".empty")?.remove();
    this.list.append(el);
    this.scrollToEnd();
    const item = { el, body };
    this.inFlight.push(item);
    return { done: () => this.drop(item) };
  }

  /** The server's copy of one of your messages is here (from the stream or the answer): its "Sending…" goes. */
  landed(message) {
    if (message.author?.kind !== "person" || message.author.handle !== this.ctx.me.handle) return;
    const item = this.inFlight.find((i) => i.body === message.body);
    if (item) this.drop(item);
  }

  drop(item) {
    item.el.remove();
    this.inFlight = this.inFlight.filter((i) => i !== item);
  }

  /** Keep the end of the list clear of `el`, a sticky element over the bottom of the view. */
  coveredBy(el) {
    this.foot = el;
  }

  /** True when the end of the list is in view, or close below it (measured from the list, not the
   *  page: on a phone the task threads sit below the room and make the page longer). */
  nearEnd() {
    const last = this.list.lastElementChild;
    if (!last) return true;
    const edge = this.foot ? this.foot.getBoundingClientRect().top : window.innerHeight;
    return last.getBoundingClientRect().bottom <= edge + 160;
  }

  /** Scroll so the newest message sits in full above the composer. */
  scrollToEnd() {
    const last = this.list.lastElementChild;
    if (!last) return;
    last.scrollIntoView({ block: "end" });
    if (!this.foot) return;
    const hidden = last.getBoundingClientRect().bottom - this.foot.getBoundingClientRect().top;
    if (hidden > 0) window.scrollBy(0, hidden + 8);
  }

  /** Scroll to one message and flash it; it stays marked as the linked one. False if it is not on the page. */
  reveal(messageId) {
    const target = document.getElementById(`msg-${messageId}`);
    if (!target || !this.list.contains(target)) return false;
    for (const other of this.list.querySelectorAll(".msg-linked")) other.classList.remove("msg-linked");
    target.classList.add("msg-linked");
    target.scrollIntoView({ block: "center" });
    target.focus({ preventScroll: true });
    target.classList.add("flash");
    setTimeout(() => target.classList.remove("flash"), 1500);
    return true;
  }

  /** reveal(), paging back through older messages (up to REVEAL_PAGES pages) until it is found. */
  async revealDeep(messageId) {
    for (let page = 0; page < REVEAL_PAGES; page += 1) {
      if (this.reveal(messageId)) return true;
      if (!this.previous) return false;
      await this.loadOlder();
    }
    return this.reveal(messageId);
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

  /** An Approve card changed (decided, running, done…): redraw it where it is. */
  updateAction(action) {
    if (!action) return;
    for (const m of this.messages) {
      if (m.make_action?.id !== action.id) continue;
      m.make_action = action;
      document.querySelector(`#msg-${CSS.escape(m.id)} .action-card`)?.updateAction?.(action);
    }
    for (const m of this.pending) if (m.make_action?.id === action.id) m.make_action = action;
  }

  // internal

  base() {
    return `/api/projects/${seg(this.ctx.slug)}/room?limit=${PAGE}${this.taskId ? `&task_id=${seg(this.taskId)}` : ""}`;
  }

  remember(m) {
    if (this.byId.has(m.id)) return;
    this.byId.set(m.id, m);
    this.messages.push(m);
  }

  render() {
    this.more.hidden = !this.previous;
    const shown = this.messages.map((m) => renderMessage(m, this));
    this.list.replaceChildren(...shown);
    this.watch.disconnect();
    this.onScreen.clear();
    for (const el of shown) this.watch.observe(el);
    this.markDays();
    this.updateEmpty();
    this.placeBar();
  }

  /** A separator before the first message of each day shown (the day in the reader's time zone). */
  markDays() {
    for (const sep of this.list.querySelectorAll(".day-sep")) sep.remove();
    let day = null;
    let before = null; // the message shown just above
    for (const el of this.list.querySelectorAll(".msg")) {
      const m = this.byId.get(el.dataset.id);
      const at = m?.created_at;
      el.classList.toggle("msg-grouped", !!(at && before && follows(before, m)));
      before = m || null;
      if (!at) continue;
      const d = new Date(at);
      if (d.toDateString() === day) continue;
      day = d.toDateString();
      el.classList.remove("msg-grouped");
      el.before(h("li", { class: "day-sep", dataset: { day } },
        h("time", { datetime: at.slice(0, 10), text: dayLabel(d) })));
    }
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
  const href = messageHref(m);
  const permalink = h("a", { href, class: "msg-link", title: "Link to this message" }, timeEl(m.created_at));
  permalink.addEventListener("click", (e) => {
    if (!owner.reveal || !document.getElementById(el.id)) return;
    e.preventDefault(); // already on the page: mark it here and keep the address
    history.replaceState(null, "", href);
    owner.reveal(m.id);
  });
  s.time.append(permalink);
  renderBody(s.body, m.body, !!m.attachments?.length);
  if (m.attachments?.length) s.body.after(renderAttachments(m.attachments));
  if (m.body) {
    const raw = h("pre", { class: "raw", hidden: true, text: m.body });
    s.body.after(raw);
    s.reply.before(rawToggle(s.body, raw));
  }
  if (m.in_reply_to) {
    const parent = owner.byId?.get(m.in_reply_to);
    s.replyto.hidden = false;
    s.replyto.href = `#msg-${m.in_reply_to}`;
    s.replyto.textContent = parent
      ? `↪ in reply to ${parent.author.display_name}: “${clip(plainText(parent.body), 70)}”`
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
  if (m.make_action) {
    s.card.hidden = false;
    s.card.append(actionCard(m.make_action, { me: ctx.me.handle, owner: m.author.owner, room: m.project }));
  }
  if (m.made_by_action) {
    s.badges.append(badge("made by an approved action", "info", "The result of a make-or-spend action you approved."));
  }
  if (m.task_request?.task_id) {
    s.taskrequest.hidden = false;
    s.taskrequest.append("Task request · ",
      h("a", { href: `#/p/${m.project}/tasks/${m.task_request.task_id}`, text: "open the task" }));
  }
  s.reply.setAttribute("aria-label", `Reply to ${m.author.display_name}`);
  if (owner.onReply) s.reply.addEventListener("click", () => owner.onReply(m));
  else s.reply.hidden = true;
  if (owner.markMoment && m.created_at && !String(m.id).startsWith("sending-")) {
    const mark = h("button", { type: "button", class: "link small msg-moment", text: "Moment",
      title: "Mark it as a moment in the project story",
      "aria-label": `Mark ${m.author.display_name}'s message as a moment in the story` });
    mark.addEventListener("click", () => owner.markMoment(m, mark));
    s.reply.after(mark);
  }
  if (owner.markUnread && m.created_at && !mine(m, ctx)) { // your own messages are never unread to you
    const unread = h("button", { type: "button", class: "link small msg-unread", text: "Mark unread" });
    unread.addEventListener("click", () => owner.markUnread(m));
    s.reply.after(unread);
  }
  return el;
}

/** Whether message m, just below `before`, continues it: same author, no reply or card, minutes apart. */
function follows(before, m) {
  const who = (x) => (x.author.kind === "agent" ? x.author.agent_id : `@${x.author.handle}`);
  return who(before) === who(m) && !m.in_reply_to && !m.make_action && !m.task_request && !!before.created_at
    && new Date(m.created_at) - new Date(before.created_at) < GROUP_MS;
}

/** Whether a message is the signed-in person's own. */
function mine(m, ctx) {
  return m.author?.kind === "person" && m.author.handle === ctx.me.handle;
}

/** The body as Markdown, with @mentions marked (see markdown.js). */
function renderBody(el, body, attached = false) {
  el.classList.add("md");
  if (body) el.append(renderMarkdown(body));
  else if (attached) el.hidden = true; // its attachments speak for it
  else el.append(h("span", { class: "muted", text: "(no text)" }));
}

/** The page's address of a message: in the room, or in its task's thread. */
export function messageHref(m) {
  return m.task_id ? `#/p/${m.project}/tasks/${m.task_id}/${m.id}` : `#/p/${m.project}/room/${m.id}`;
}

/** "Today", "Yesterday", else the full day. */
function dayLabel(d) {
  const today = new Date();
  const yesterday = new Date(today.getFullYear(), today.getMonth(), today.getDate() - 1);
  if (d.toDateString() === today.toDateString()) return "Today";
  if (d.toDateString() === yesterday.toDateString()) return "Yesterday";
  return DAY_LABEL.format(d);
}

function clip(text, n) {
  return text.length > n ? `${text.slice(0, n)}…` : text;
}

function colorFor(ctx, handle) {
  const person = ctx.project.data()?.people.find((p) => p.handle === handle);
  return person ? person.color : handle;
}

// ---- threads and the loop guard -------------------------------------------------------------------

async function loadThreads(box, ctx) {
  try {
    const page = await get(`/api/projects/${seg(ctx.slug)}/room?latest=1&limit=1`);
    renderThreads(box, ctx, page.threads || []);
  } catch {
    /* the list stays as it was */
  }
}

function renderThreads(box, ctx, threads) {
  box.hidden = ctx.project.isPrivate() && !threads.length; // a private room seldom has tasks
  fill(box, h("h2", { id: "threads-heading", text: "Task threads" }),
    threads.length
      ? h("ul", { class: "thread-list" }, threads.map((t) => h("li", {},
        h("a", { href: `#/p/${ctx.slug}/tasks/${t.task_id}`, class: "thread" },
          h("span", { class: "thread-title" }, plainText(t.title),
            h("span", { class: "unread-badge", hidden: true, dataset: { unreadProject: ctx.slug, unreadThread: t.task_id } })),
          h("span", { class: "thread-meta" }, stateBadge(t.state),
            h("span", { class: "muted small", text: `${requesterText(t)} → ${t.assignee}` })),
          h("span", { class: "muted small",
            text: `${t.reply_count} ${t.reply_count === 1 ? "message" : "messages"} · ${ago(t.last_activity_at)}` })))))
      : empty("No task threads yet."),
    h("a", { href: `#/p/${ctx.slug}/tasks`, class: "small", text: "All tasks →" }));
  paintUnread(box);
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
