// inbox.js — everything waiting on you, across your projects: steps your agents' runs ask,
// make-or-spend cards, handoffs your gate holds, results for your final acceptance, questions
// your tasks' assignees ask you, and messages that mention you. One list, kept by the inbox's
// store (inbox_store.js): the #/inbox screen draws it as a triage list (triage.js) whose rows
// open into the cards drawn here; the header's link shows its count.

import { get, post, seg } from "./api.js";
import { items, onChange, reload, notificationsOn, wantNotifications } from "./inbox_store.js";
import { createTriage } from "./triage.js";
import { approvalCard } from "./decisions.js";
import { stepCard } from "./steps.js";
import { actionCard } from "./makeaction.js";
import { markdown, plainText } from "./markdown.js";
import { pushControl } from "./push.js";
import { criteriaEvidence } from "./evidence.js";
import { askToVerify } from "./task_common.js";
import { h, fill, heading, timeEl, errorSlot, act, announce, confirmButton, field, settle } from "./ui.js";

// ---- the #/inbox screen --------------------------------------------------------------------------------

/** #/inbox (?kind=…&project=… filter it) */
export function mount(el, ctx) {
  const triage = createTriage(ctx, { card: (item, actions) => itemCard(item, ctx, actions), query: ctx.query });
  const digest = h("div", { class: "digest-setting" });
  el.append(
    h("div", { class: "page-head" }, heading(1, "Inbox"), notifyToggle(), pushControl()),
    digest, triage.el);
  const drawDigest = (me) => fill(digest, digestForm(me, drawDigest));
  get("/api/me").then(drawDigest, () => { /* the setting shows on the next visit */ });
  return () => triage.destroy();
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
    h("label", { for: "notify-toggle" }, box, " Notify me while Prickle is open"), note);
}

function where(item) {
  const thread = item.task_id
    ? h("a", { href: `#/p/${item.project}/tasks/${item.task_id}`, text: plainText(item.title || "") || "its task" })
    : item.kind === "mention" ? h("span", { text: "general chat" }) : null;
  return h("p", { class: "inbox-where muted small" },
    h("a", { href: `#/p/${item.project}/room`, text: item.project_name }),
    thread ? [" · ", thread] : null, " · ", timeEl(item.since));
}

/** An item's full card (what its row opens into), with its inline action. ``actions.done()`` marks it done. */
export function itemCard(item, ctx, actions) {
  const inner = {
    step: () => stepCard(item.step, { task: { project: item.project, title: item.title }, onDecided: reload }),
    action: () => actionCard(item.action_card, { me: ctx.me.handle, room: item.project, messageId: item.message_id,
      onDecided: reload }),
    approval: () => approvalCard(item, { onDecided: reload }),
    final_acceptance: () => finalCard(item),
    question: () => questionCard(item),
    returned: () => returnedCard(item),
    mention: () => mentionCard(item, actions),
    paused_pair: () => pausedCard(item),
    run_failed: () => failedCard(item),
    agent_mention: () => mentionCard(item, actions),
    verify: () => verifyCard(item),
  }[item.kind]();
  return h("div", { class: "inbox-card", dataset: { kind: item.kind } }, where(item), inner);
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
    h("h3", {}, h("a", { href: `#/p/${task.project}/tasks/${task.id}`, text: plainText(item.title) })),
    h("p", { class: "muted", text: `${task.assignee} returned it${verifier ? ` and ${verifier} verified it` : ""}: ${task.result?.summary || ""}` }),
    h("p", { class: evidence.complete ? "muted small" : "warn-text small inbox-gaps",
      text: evidence.complete ? "Every criterion is covered by fresh evidence." : `Check first: ${gaps.join("; ")}.` }),
    h("div", { class: "button-row" }, button,
      h("a", { href: `#/p/${task.project}/tasks/${task.id}`, class: "small", text: "Open the task" })),
    error, result,
    // Each criterion with the evidence that covers it, right under the buttons and their outcome.
    h("div", { class: "inbox-evidence" }, criteriaEvidence(item.criteria_evidence, { anchor: `fa-${task.id}` })));
  return card;
}

/** The assignee's question, answered in the task's thread from here. */
/** A task handed back: its page has the picker that hands it to another agent. */
function returnedCard(item) {
  return h("article", { class: "card inbox-returned", dataset: { taskId: item.task_id } },
    h("h3", {}, h("a", { href: `#/p/${item.project}/tasks/${item.task_id}`, text: plainText(item.title) })),
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
  const open = h("a", { class: "button primary", href: `#/p/${item.project}/tasks/${item.task_id}`, text: "Open the task" });
  return h("article", { class: "card inbox-verify", dataset: { taskId: item.task_id } },
    h("h3", {}, h("a", { href: `#/p/${item.project}/tasks/${item.task_id}`, text: plainText(item.title) })),
    h("p", { text: item.listening
      ? `${item.agent}'s last verification failed. Start another from the task's page.`
      : `No runner of ${item.agent} is listening: start prickle runner on its computer, or ask it to verify in a session.` }),
    item.listening ? open : askToVerify(item.task_id, item.agent, open));
}

function failedCard(item) {
  return h("article", { class: "card inbox-run-failed", dataset: { taskId: item.task_id } },
    h("h3", {}, h("a", { href: `#/p/${item.project}/tasks/${item.task_id}`, text: plainText(item.title) })),
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
    h("h3", {}, h("a", { href: `#/p/${item.project}/tasks/${item.task_id}`, text: plainText(item.title) })),
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

/** A message that mentions you: open it where it is, or mark it read (done: this item only, no read position moves). */
function mentionCard(item, actions) {
  const m = item.message;
  const href = item.task_id ? `#/p/${item.project}/tasks/${item.task_id}` : `#/p/${item.project}/room/${m.id}`;
  const read = h("button", { type: "button", class: "quiet small", text: "Mark read" });
  read.addEventListener("click", () => actions?.done());
  return h("article", { class: "card inbox-mention", dataset: { messageId: m.id } },
    item.agents ? h("p", { class: "muted small", text: `For ${item.agents.join(" and ")}` }) : null,
    h("p", { class: "inbox-author" }, h("strong", { text: m.author.display_name }),
      h("span", { class: "muted small", text: ` ${m.author.kind === "agent" ? m.author.agent_id : `@${m.author.handle}`}` })),
    markdown(m.body, { class: "inbox-body" }),
    h("div", { class: "button-row" }, h("a", { href, class: "button-link", text: "Open" }), read));
}
