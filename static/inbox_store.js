// inbox_store.js — what waits on you, kept for every view: the items of GET /api/inbox with
// their change notifications (onChange), the task IDs that wait on you per project, your read
// positions (per room and thread, kept on the server: markSeen) and the unread counts of
// GET /api/unread painted into every unread marker ([data-unread-project], with
// [data-unread-thread] for one thread). Kept live by your own stream (GET /api/stream: the
// outbox of every project of yours); with a pasted personal token (EventSource sends no bearer)
// it long-polls GET /api/events instead. It also keeps "(N) " in front of the tab title and, when
// you turn them on, shows browser notifications for items that are new. It draws no view: the
// inbox screen, the header's count, the board's "needs you" marks and the rooms read it.

import { get, post, seg, token } from "./api.js";
import { debounce } from "./ui.js";
import { plainText } from "./markdown.js";

/** Each kind of item in a few words (the inbox's cards and the notifications name it). */
export const LABEL = {
  step: "step", action: "make or spend", approval: "held handoff", final_acceptance: "final acceptance",
  question: "question", returned: "handed back", mention: "mention", paused_pair: "paused agents", run_failed: "failed run",
  agent_mention: "your agent mentioned", verify: "to verify",
};
const NOTIFY_KEY = "prickle.notify"; // "on" once the person turned notifications on
const FAR = 9007199254740991; // "after" beyond any seq: the events endpoint answers with the newest
const EVENTS = ["message.posted", "task.updated", "approval.updated", "action.updated", "member.joined", "project.created"];
const PROJECT_EVENTS = ["project.restored"]; // the person's list of projects changed: onProjectsChanged
const projectListeners = new Set();

const state = { items: [], unread: new Map(), loaded: false, me: null, source: null, offs: [], known: null, snoozed: 0 };
const LONGEST_TIMER = 2 ** 31 - 1; // setTimeout's limit (ms)
const listeners = new Set();
let serial = 0;
let baseTitle = document.title;
let titleWatch = null;

// ---- lifecycle -------------------------------------------------------------------------------------

/** Start keeping the inbox for the signed-in person: load it, listen, keep the tab title. */
export function start(me) {
  stop();
  state.me = me;
  state.known = null;
  watchTitle();
  const again = debounce(reload, 150);
  state.offs.push(() => again.cancel());
  if (!token() && "EventSource" in window) listen(again);
  else longPoll(again);
  const onVisible = () => {
    if (document.visibilityState !== "visible") return;
    flushSeen();
    again();
  };
  document.addEventListener("visibilitychange", onVisible);
  state.offs.push(() => document.removeEventListener("visibilitychange", onVisible));
  reload();
}

/** Stop listening (signed out). */
export function stop() {
  for (const off of state.offs.splice(0)) off();
  state.source?.close();
  state.source = null;
  state.items = [];
  state.unread = new Map();
  state.loaded = false;
  state.snoozed = 0;
  clearTimeout(returnTimer);
  serial += 1;
  changed();
}

// ---- actions ---------------------------------------------------------------------------------------

/** fn() whenever the inbox or the unread counts change; returns a function that stops it. */
export function onChange(fn) {
  listeners.add(fn);
  return () => listeners.delete(fn);
}

/** fn() when a project of yours came back (restored), so an open list of projects loads again; returns a
 *  function that stops it. */
export function onProjectsChanged(fn) {
  projectListeners.add(fn);
  return () => projectListeners.delete(fn);
}

/** The items waiting on you now, newest first. */
export function items() {
  return state.items;
}

/** Whether the first answer came. */
export function loaded() {
  return state.loaded;
}

/** How many items you snoozed are still away. */
export function snoozedCount() {
  return state.snoozed;
}

/** Mark one item ``done``, or ``snoozed`` until ``until`` (an ISO time): it leaves the list at once. */
export async function markItem(itemId, mark, until) {
  const out = await post("/api/inbox/mark", until ? { item_id: itemId, mark, until } : { item_id: itemId, mark });
  drop([itemId]);
  return out;
}

/** Mark every mention in your inbox done; returns the item IDs, for an undo. */
export async function markMentionsDone() {
  const out = await post("/api/inbox/mentions/done", {});
  drop(out.item_ids);
  return out.item_ids;
}

/** Take your marks off these items (undo, unsnooze): each is back while it waits. */
export async function unmark(itemIds) {
  const out = await post("/api/inbox/unmark", { item_ids: itemIds });
  await reload();
  return out;
}

/** Task IDs of one project that wait on you (a decision, an acceptance, a question, a step). */
export function tasksNeedingMe(slug) {
  return new Set(state.items.filter((i) => i.project === slug && i.task_id && i.kind !== "mention").map((i) => i.task_id));
}

/** Read the inbox and the unread counts again. */
export async function reload() {
  const mine = ++serial;
  try {
    const [inbox, unread] = await Promise.all([get("/api/inbox"), get("/api/unread")]);
    if (mine !== serial) return;
    const fresh = state.known ? inbox.items.filter((i) => !state.known.has(i.id)) : [];
    state.known = new Set(inbox.items.map((i) => i.id));
    state.items = inbox.items;
    state.snoozed = inbox.snoozed;
    wakeAt(inbox.next_return, reload);
    state.unread = new Map(unread.projects.map((p) => [p.project, p]));
    state.loaded = true;
    changed();
    notify(fresh);
  } catch (err) {
    if (err.status !== 401) console.warn("inbox not loaded", err.message);
  }
}

const seen = new Map(); // "slug|taskId" -> newest message id shown, not yet sent
const sendSeen = debounce(flushSeen, 400);

/** A room (taskId null) or a task's thread shows messages up to messageId: it is read once the tab is in view. */
export function markSeen(slug, taskId, messageId) {
  if (!slug || !messageId || !state.me) return;
  seen.set(`${slug}|${taskId || ""}`, { slug, taskId: taskId || null, messageId });
  sendSeen();
}

/** Whether browser notifications are on (asked once, kept in this browser). */
export function notificationsOn() {
  return localStorage.getItem(NOTIFY_KEY) === "on" && "Notification" in window && Notification.permission === "granted";
}

/** Keep (on) or forget (off) the person's wish for browser notifications in this browser. */
export function wantNotifications(on) {
  if (on) localStorage.setItem(NOTIFY_KEY, "on");
  else localStorage.removeItem(NOTIFY_KEY);
}

// ---- callbacks ---------------------------------------------------------------------------------------

async function flushSeen() {
  if (document.visibilityState !== "visible") return; // read when you come back to the tab
  const batch = [...seen.values()];
  seen.clear();
  let moved = false;
  for (const { slug, taskId, messageId } of batch) {
    try {
      await post(`/api/projects/${seg(slug)}/read`, taskId ? { message_id: messageId, task_id: taskId } : { message_id: messageId });
      moved = true;
    } catch (err) {
      if (err.status !== 404) console.warn("read position not saved", err.message);
    }
  }
  if (moved) reload();
}

function projectsChanged() {
  for (const fn of [...projectListeners]) fn();
}

function listen(again) {
  const source = new EventSource("/api/stream");
  state.source = source;
  for (const type of [...EVENTS, "resync"]) source.addEventListener(type, () => again());
  for (const type of PROJECT_EVENTS) source.addEventListener(type, projectsChanged);
  source.onerror = () => {
    if (source.readyState === EventSource.CLOSED && state.source === source) state.source = null; // refused: signed out
  };
}

async function longPoll(again) {
  const abort = new AbortController();
  state.offs.push(() => abort.abort());
  let after = FAR; // the first answer says where the outbox is now
  let delay = 1000;
  while (!abort.signal.aborted) {
    try {
      const page = await get(`/api/events?after=${after}&wait=${after === FAR ? 0 : 25}`, { signal: abort.signal });
      delay = 1000;
      if (page.resync && after !== FAR) again();
      if (page.events.some((e) => EVENTS.includes(e.type))) again();
      if (page.events.some((e) => PROJECT_EVENTS.includes(e.type))) projectsChanged();
      after = page.last_seq;
    } catch (err) {
      if (abort.signal.aborted || err.status === 401) return;
      await new Promise((resolve) => setTimeout(resolve, delay));
      delay = Math.min(delay * 2, 15000);
    }
  }
}

function changed() {
  applyTitle();
  paintUnread(document);
  for (const fn of [...listeners]) {
    try {
      fn();
    } catch (err) {
      console.error(err);
    }
  }
}

function notify(fresh) {
  if (!fresh.length || !notificationsOn()) return;
  for (const item of fresh.slice(0, 3)) {
    try {
      const label = LABEL[item.kind];
      const n = new Notification(`${label[0].toUpperCase()}${label.slice(1)} · ${item.project_name}`,
        { body: summary(item), tag: item.id });
      n.onclick = () => {
        window.focus();
        window.location.hash = itemHref(item);
        n.close();
      };
    } catch (err) {
      console.warn("notification not shown", err.message);
    }
  }
}

// ---- internal ----------------------------------------------------------------------------------------

let returnTimer = null;

/** Read the inbox again when the first snoozed item comes back (nothing on the server announces it). */
function wakeAt(iso, again) {
  clearTimeout(returnTimer);
  if (!iso) return;
  const wait = Math.max(0, new Date(iso).getTime() - Date.now()) + 500;
  returnTimer = setTimeout(again, Math.min(wait, LONGEST_TIMER));
}

/** Take items out of the list at once (the server has marked them; a reload follows). */
function drop(itemIds) {
  const gone = new Set(itemIds);
  state.items = state.items.filter((i) => !gone.has(i.id));
  changed();
  reload();
}

/** Keep "(N) " in front of whatever title the view sets. */
function watchTitle() {
  if (titleWatch) return;
  let el = document.querySelector("title");
  if (!el) {
    el = document.createElement("title");
    document.head.append(el);
  }
  titleWatch = new MutationObserver(() => {
    const m = /^\(\d+\) (.*)$/s.exec(document.title);
    baseTitle = m ? m[1] : document.title;
    applyTitle();
  });
  titleWatch.observe(el, { childList: true, characterData: true, subtree: true });
}

function applyTitle() {
  const n = state.items.length;
  const want = n ? `(${n}) ${baseTitle}` : baseTitle;
  if (document.title !== want) document.title = want;
}

/** Fill every unread marker under root: [data-unread-project] (and [data-unread-thread]: "" for general chat). */
export function paintUnread(root) {
  for (const el of root.querySelectorAll("[data-unread-project]")) {
    const counts = state.unread.get(el.dataset.unreadProject);
    const thread = el.dataset.unreadThread;
    const n = !counts ? 0 : thread === undefined ? counts.unread : thread === "" ? counts.general : counts.threads[thread] || 0;
    el.textContent = n ? String(n) : "";
    el.hidden = !n;
    el.setAttribute("aria-label", n === 1 ? "1 unread message" : `${n} unread messages`);
    el.title = el.getAttribute("aria-label");
  }
}

/** Where an item is on the page: its task (at the message, for one in a thread), the message in its
 *  room, the room, or the inbox (as the server's push notifications and digest link it). */
export function itemHref(item) {
  const p = `#/p/${item.project}`;
  if (item.task_id) return `${p}/tasks/${item.task_id}${item.message_id ? `/${item.message_id}` : ""}`;
  if (item.message_id) return `${p}/room/${item.message_id}`;
  return item.kind === "paused_pair" ? `${p}/room` : "#/inbox";
}

/** An item in one line of plain words (no Markdown): what the inbox's rows and the notifications say. */
export function summary(item) {
  const title = plainText(item.title || "");
  switch (item.kind) {
    case "mention":
    case "agent_mention": return `${item.message.author.display_name}: ${plainText(item.message.body).slice(0, 300)}`;
    // The question first (a phone cuts the line), then its task, without the title's own end mark.
    case "question": return `${plainText(item.questions.join(" "))} — ${title.replace(/[.!?:;]+$/, "")}`;
    case "step": return `${item.step.agent_id} asks to run ${item.step.tool_name}${title ? ` for ${title}` : ""}`;
    case "action": return `${item.action_card.agent_id}: ${plainText(item.action_card.action)}`;
    default: return title;
  }
}
