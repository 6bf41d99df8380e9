// inbox.js — everything waiting on you, across your projects: steps your agents' runs ask,
// make-or-spend cards, handoffs your gate holds, results for your final acceptance, questions
// your tasks' assignees ask you, and messages that mention you. One list, kept by the inbox's
// store (inbox_store.js), drawn here for the #/inbox screen and the home page's "Waiting for
// your decision", with the header's link and its count.

import { get, post, seg } from "./api.js";
import { items, loaded, onChange, reload, notificationsOn, wantNotifications, LABEL } from "./inbox_store.js";
import { approvalCard } from "./decisions.js";
import { stepCard } from "./steps.js";
import { actionCard } from "./makeaction.js";
import { markdown } from "./markdown.js";
import { pushControl } from "./push.js";
import { h, fill, heading, badge, timeEl, errorSlot, act, announce, empty, confirmButton, field, settle } from "./ui.js";

// Each kind of item: the group's title and lead, in the order the page shows them.
const KINDS = {
  step: ["Steps your agents' runs ask to take",
    "A run stopped before a destructive, spending or outbound call. Check the exact call before you allow it."],
  action: ["Things your agents want to make or spend", "Proposed in your room. Nothing runs until you approve."],
  approval: ["Handoffs held by your gate",
    "Agents of your teammates asked your agents for work. Your gate holds it until you decide."],
  final_acceptance: ["Results for your final acceptance", "Verified results of tasks you asked for. The task completes when you accept."],
  question: ["Questions for you", "An agent working on a task you asked for stopped until you answer. Answer in the task's thread."],
  returned: ["Tasks handed back to you",
    "Their agent left the project or handed them back. Hand each to another agent from its page."],
  mention: ["Messages that mention you", "They leave this list once you have read the room or thread they are in."],
  agent_mention: ["Messages that mention your agents",
    "Your agents haven't heard these yet (a runner only notes a mention). Each stays here until the agent's next session hears it or you read it."],
  verify: ["Results your agents asked for, waiting to be verified",
    "Nothing is verifying them: no runner of the agent is listening, or its last verification failed."],
  run_failed: ["Runs of your agents that failed",
    "The last run of each task below failed before it could finish. Fix what it says, then start a run from the task's page."],
  paused_pair: ["Agents paused for answering each other",
    "Two agents, one of them yours, went back and forth ten times with no person in between. Any person's message in the project resumes them."],
};
// ---- the list (the #/inbox screen and the home page's panel) -----------------------------------------

/** The items grouped by kind, live: {el, count(), destroy}. onCount(n) runs when what waits changes. */
export function createInboxList(ctx, { onCount } = {}) {
  const groups = Object.fromEntries(Object.entries(KINDS).map(([kind, [title, lead]]) => [kind, group(kind, title, lead)]));
  const el = h("div", { class: "inbox-list" }, Object.values(groups).map((g) => g.el));
  const render = () => {
    for (const [kind, g] of Object.entries(groups)) reconcile(g, items().filter((i) => i.kind === kind), (item) => itemCard(item, ctx));
    onCount?.(items().length, loaded());
  };
  const off = onChange(render);
  render();
  return {
    el,
    destroy() {
      off();
    },
  };
}

/** #/inbox */
export function mount(el, ctx) {
  const count = h("p", { class: "muted inbox-count", role: "status" });
  const nothing = empty("Nothing waits on you. New items appear here as they arrive.");
  nothing.hidden = true;
  const list = createInboxList(ctx, {
    onCount: (n, ready) => {
      count.textContent = !ready ? "Loading…" : n === 1 ? "1 thing waits on you." : `${n} things wait on you.`;
      nothing.hidden = !ready || n > 0 || !!el.querySelector(".inbox-item"); // acted-on cards stay with their outcome
    },
  });
  const digest = h("div", { class: "digest-setting" });
  el.append(
    h("div", { class: "page-head" }, heading(1, "Inbox"), notifyToggle(), pushControl()),
    digest, count, nothing, list.el);
  const drawDigest = (me) => fill(digest, digestForm(me, drawDigest));
  get("/api/me").then(drawDigest, () => { /* the setting shows on the next visit */ });
  return () => list.destroy();
}

/** The email digest: what waited on you longer than N minutes, mailed once (off by default). Shown
 *  only where the server sends mail; without an address on file it asks for one first, and
 *  ``redraw(me)`` shows the digest once it is saved. */
function digestForm(me, redraw) {
  if (!me.mail) return null;
  if (!me.email) return emailForm(me, redraw);
  const on = h("input", { type: "checkbox", id: "digest-on", checked: me.digest_minutes != null });
  const minutes = h("input", { type: "number", id: "digest-minutes", min: "1", max: "10080", step: "1",
    value: String(me.digest_minutes ?? 30), "aria-label": "Minutes" });
  const save = h("button", { type: "submit", class: "small", text: "Save" });
  const error = errorSlot();
  const form = h("form", { class: "row-form digest-form" },
    h("label", { for: "digest-on" }, on, ` Email ${me.email} what has waited on me more than `), minutes,
    " minutes", save, error);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    act(save, error, async () => {
      const out = await post("/api/me/digest", { minutes: on.checked ? Number(minutes.value) : null,
        timezone: Intl.DateTimeFormat().resolvedOptions().timeZone || null });
      announce(out.digest_minutes == null ? "Email digest off" : `Email digest on: after ${out.digest_minutes} minutes`);
    });
  });
  return form;
}

/** Your address for the digest and for sign-in links by email (POST /api/me/email). */
function emailForm(me, redraw) {
  const address = h("input", { type: "email", id: "my-email", name: "email", required: true, maxlength: "254",
    autocomplete: "email" });
  const save = h("button", { type: "submit", class: "small", text: "Save address" });
  const error = errorSlot();
  const form = h("form", { class: "row-form email-form" },
    h("label", { for: "my-email", id: "my-email-label", text: "Your email address, for a digest of what waits on you" }),
    address, save, error);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    act(save, error, async () => {
      const out = await post("/api/me/email", { email: address.value.trim() });
      announce(`Address saved: ${out.email}`);
      redraw({ ...me, email: out.email });
    });
  });
  return form;
}

/** The header's link to the inbox, with the count of what waits. */
export function headerLink() {
  const count = h("span", { class: "count-badge inbox-badge", hidden: true });
  const a = h("a", { href: "#/inbox", dataset: { nav: "inbox" } }, "Inbox ", count);
  const paint = () => {
    const n = items().length;
    count.textContent = n ? String(n) : "";
    count.hidden = !n;
    a.setAttribute("aria-label", n ? `Inbox, ${n} waiting` : "Inbox");
  };
  onChange(paint);
  paint();
  return a;
}

function notifyToggle() {
  const box = h("input", { type: "checkbox", id: "notify-toggle" });
  const note = h("p", { class: "muted small", role: "status" });
  const supported = "Notification" in window;
  box.checked = notificationsOn();
  box.disabled = !supported || Notification.permission === "denied";
  if (!supported) note.textContent = "This browser has no notifications.";
  else if (Notification.permission === "denied") note.textContent = "Notifications are blocked for this site in your browser's settings.";
  box.addEventListener("change", async () => {
    if (!box.checked) {
      wantNotifications(false);
      note.textContent = "Notifications are off.";
      return;
    }
    const answer = Notification.permission === "granted" ? "granted" : await Notification.requestPermission();
    if (answer === "granted") {
      wantNotifications(true);
      note.textContent = "You will be notified of new items (never of your own actions).";
    } else {
      box.checked = false;
      note.textContent = "The browser did not allow notifications.";
    }
  });
  return h("div", { class: "notify-toggle" },
    h("label", { for: "notify-toggle" }, box, " Notify me of new items"), note);
}

function group(kind, title, lead) {
  const id = `inbox-${kind}`;
  const list = h("div", { class: "stack" });
  const el = h("div", { class: `waiting-group waiting-${kind}`, hidden: true, "aria-labelledby": id, role: "group" },
    h("h3", { id, text: title }), h("p", { class: "muted small", text: lead }), list);
  return { el, list, shown: new Map() };
}

function isDecided(card) {
  return card.classList.contains("decided") || !!card.querySelector(".decided");
}

/** Keep the cards of items still waiting (and acted-on ones, with their outcome); add new ones in order. */
function reconcile(g, list, render) {
  const keys = new Set(list.map((i) => i.id));
  for (const [key, card] of g.shown) {
    if (!keys.has(key) && !isDecided(card) && !card.contains(document.activeElement)) {
      card.remove();
      g.shown.delete(key);
    }
  }
  for (const item of list) {
    if (!g.shown.has(item.id)) {
      const card = render(item);
      g.shown.set(item.id, card);
      g.list.append(card);
    }
  }
  g.el.hidden = g.shown.size === 0;
}

function where(item) {
  const thread = item.task_id
    ? h("a", { href: `#/p/${item.project}/tasks/${item.task_id}`, text: item.title || "its task" })
    : item.kind === "mention" ? h("span", { text: "general chat" }) : null;
  return h("p", { class: "inbox-where muted small" },
    h("a", { href: `#/p/${item.project}/room`, text: item.project_name }),
    thread ? [" · ", thread] : null, " · ", timeEl(item.since, true));
}

function itemCard(item, ctx) {
  const inner = {
    step: () => stepCard(item.step, { task: { project: item.project, title: item.title }, onDecided: reload }),
    action: () => actionCard(item.action_card, { me: ctx.me.handle, room: item.project, messageId: item.message_id,
      onDecided: reload }),
    approval: () => approvalCard(item, { onDecided: reload }),
    final_acceptance: () => finalCard(item),
    question: () => questionCard(item),
    returned: () => returnedCard(item),
    mention: () => mentionCard(item),
    paused_pair: () => pausedCard(item),
    run_failed: () => failedCard(item),
    agent_mention: () => mentionCard(item),
    verify: () => verifyCard(item),
  }[item.kind]();
  return h("div", { class: `inbox-item inbox-${item.kind}`, dataset: { itemId: item.id, kind: item.kind } },
    h("div", { class: "inbox-item-head" }, badge(LABEL[item.kind], "attention"), where(item)), inner);
}

function done(card, result, text, buttons) {
  settle(result, text, buttons);
  card.classList.add("decided");
  reload();
}

/** Final acceptance in one click; with uncovered or stale criteria, a second click confirms. */
function finalCard(item) {
  const { task, evidence } = item;
  const error = errorSlot();
  const result = h("p", { class: "notice ok", role: "status", hidden: true });
  const criteria = (list) => `${list.length === 1 ? "criterion" : "criteria"} ${list.map((c) => c + 1).join(", ")}`;
  const gaps = [
    evidence.uncovered.length ? `no evidence for ${criteria(evidence.uncovered)}` : null,
    evidence.stale.length ? `only stale evidence for ${criteria(evidence.stale)}` : null,
  ].filter(Boolean);
  const accept = async (button) => {
    const out = await act(button, error, () => post(`/api/tasks/${seg(task.id)}/accept`, {}));
    if (out) done(card, result, "Accepted: the task is completed.", [button]);
  };
  const button = evidence.complete
    ? h("button", { type: "button", class: "primary", text: "Give final acceptance", onclick: (e) => accept(e.currentTarget) })
    : confirmButton("Give final acceptance", "Accept with gaps? Click again", accept, { class: "primary" });
  const verifier = task.result?.verified_by?.agent_id;
  const card = h("article", { class: "card inbox-final", dataset: { taskId: task.id } },
    h("h3", {}, h("a", { href: `#/p/${task.project}/tasks/${task.id}`, text: item.title })),
    h("p", { class: "muted", text: `${task.assignee} returned it${verifier ? ` and ${verifier} verified it` : ""}: ${task.result?.summary || ""}` }),
    h("p", { class: evidence.complete ? "muted small" : "warn-text small inbox-gaps",
      text: evidence.complete ? "Every criterion is covered by fresh evidence." : `Check first: ${gaps.join("; ")}.` }),
    h("div", { class: "button-row" }, button,
      h("a", { href: `#/p/${task.project}/tasks/${task.id}`, class: "small", text: "Open the task" })),
    error, result);
  return card;
}

/** The assignee's question, answered in the task's thread from here. */
/** A task handed back: its page has the picker that hands it to another agent. */
function returnedCard(item) {
  return h("article", { class: "card inbox-returned", dataset: { taskId: item.task_id } },
    h("h3", {}, h("a", { href: `#/p/${item.project}/tasks/${item.task_id}`, text: item.title })),
    h("p", { class: "muted small", text: `Returned by ${item.task.assignee}.` }),
    h("a", { class: "button primary", href: `#/p/${item.project}/tasks/${item.task_id}`, text: "Hand it on" }));
}

/** What a run failure's step means, for the person who can fix it. */
const FAILURE_TEXT = {
  claude_code_not_found: "Claude Code is not installed on the runner's computer (or cli_path is wrong).",
  codex_not_found: "Codex is not installed on the runner's computer (or cli_path is wrong).",
  cli_not_found: "The command the runner's config names was not found.",
  cli_did_not_start: "The agent's program did not start.",
  cli_crashed: "The agent's program stopped with an error.",
  task_time_limit: "The run went past its time limit.",
  worktree_failed: "The runner could not make a git worktree for the task.",
  agent_error: "The agent ended without a result.",
  see_runner_log: "Something went wrong: the runner's log says what.",
};

function verifyCard(item) {
  return h("article", { class: "card inbox-verify", dataset: { taskId: item.task_id } },
    h("h3", {}, h("a", { href: `#/p/${item.project}/tasks/${item.task_id}`, text: item.title })),
    h("p", { text: item.listening
      ? `${item.agent}'s last verification failed. Start another from the task's page.`
      : `No runner of ${item.agent} is listening: start prickle runner on its computer, or ask it to verify in a session.` }),
    h("a", { class: "button primary", href: `#/p/${item.project}/tasks/${item.task_id}`, text: "Open the task" }));
}

function failedCard(item) {
  return h("article", { class: "card inbox-run-failed", dataset: { taskId: item.task_id } },
    h("h3", {}, h("a", { href: `#/p/${item.project}/tasks/${item.task_id}`, text: item.title })),
    h("p", { text: `${item.agent}: ${FAILURE_TEXT[item.failure] || item.failure}` }),
    h("a", { class: "button primary", href: `#/p/${item.project}/tasks/${item.task_id}`, text: "Open the task" }));
}

function pausedCard(item) {
  const error = errorSlot();
  const resume = h("button", { type: "button", class: "primary", text: "Resume them" });
  resume.addEventListener("click", () => act(resume, error, async () => {
    await post(`/api/projects/${seg(item.project)}/resume`, { agents: item.agents });
    announce(`${item.agents.join(" and ")} resumed`);
    reload();
  }));
  return h("article", { class: "card inbox-paused" },
    h("h3", {}, h("a", { href: `#/p/${item.project}/room`, text: item.title })),
    h("p", { class: "muted small", text: `They answered each other ${item.count} times with no person in between.` }),
    h("div", { class: "button-row" }, resume), error);
}

function questionCard(item) {
  const error = errorSlot();
  const result = h("p", { class: "notice ok", role: "status", hidden: true });
  const text = h("textarea", { rows: "2", maxlength: "20000", required: true });
  const send = h("button", { type: "submit", class: "primary", text: "Send answer" });
  const form = h("form", { class: "inbox-answer" }, field(`Your answer to ${item.task.assignee}`, text), send, error);
  const card = h("article", { class: "card inbox-question", dataset: { taskId: item.task_id } },
    h("h3", {}, h("a", { href: `#/p/${item.project}/tasks/${item.task_id}`, text: item.title })),
    h("ul", { class: "inbox-questions" }, item.questions.map((q) => h("li", { text: q }))),
    item.progress ? h("p", { class: "muted small", text: `Progress: ${item.progress}` }) : null,
    form, result);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const out = await act(send, error, async () => {
      if (!text.value.trim()) throw new Error("Write your answer first.");
      return post(`/api/projects/${seg(item.project)}/messages`, { body: text.value.trim(), task_id: item.task_id });
    });
    if (out) {
      text.disabled = true;
      done(card, result, "Answered in the task's thread.", [send]);
    }
  });
  return card;
}

/** A message that mentions you: open it where it is, or mark its room or thread read. */
function mentionCard(item) {
  const m = item.message;
  const error = errorSlot();
  const result = h("p", { class: "notice ok", role: "status", hidden: true });
  const href = item.task_id ? `#/p/${item.project}/tasks/${item.task_id}` : `#/p/${item.project}/room/${m.id}`;
  const read = h("button", { type: "button", class: "quiet small", text: "Mark read" });
  read.addEventListener("click", async () => {
    const out = await act(read, error, () => post(`/api/projects/${seg(item.project)}/read`,
      item.task_id ? { message_id: m.id, task_id: item.task_id } : { message_id: m.id }));
    if (out) done(card, result, "Marked read.", [read]);
  });
  const card = h("article", { class: "card inbox-mention", dataset: { messageId: m.id } },
    item.agents ? h("p", { class: "muted small", text: `For ${item.agents.join(" and ")}` }) : null,
    h("p", { class: "inbox-author" }, h("strong", { text: m.author.display_name }),
      h("span", { class: "muted small", text: ` ${m.author.kind === "agent" ? m.author.agent_id : `@${m.author.handle}`}` })),
    markdown(m.body, { class: "inbox-body" }),
    h("div", { class: "button-row" }, h("a", { href, class: "button-link", text: "Open" }), read),
    error, result);
  return card;
}
