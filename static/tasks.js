// tasks.js — the task board by state, one task's page (packet, checkpoints, submissions,
// evidence report per criterion, artifacts and its thread), the decisions a person
// makes (allow or refuse a step its run asks, approve or deny a held handoff, final
// acceptance, send back, cancel), and asking one of your own agents for a task.

import { get, post, seg } from "./api.js";
import * as stream from "./stream.js";
import { MessageList, provenanceBadges } from "./room.js";
import { createComposer } from "./composer.js";
import { stepCard, pendingSteps } from "./steps.js";
import { runsSection } from "./runs.js";
import {
  h, heading, field, select, errorSlot, act, fill, empty, badge, stateBadge, timeEl, ago, words, safeUrl,
  confirmButton, lines, debounce, announce, loadFailed, uid,
} from "./ui.js";

const COLUMNS = [
  ["Needs a person", ["approval", "waiting"]],
  ["Queued", ["requested", "routed"]],
  ["In progress", ["accepted", "working"]],
  ["Verifying", ["verifying"]],
  ["Done", ["completed"]],
  ["Closed", ["rejected", "cancelled", "returned"]],
];
// The server's lists (GET /api/meta): task states, those a task can be cancelled from, deliverable types.
let lists = null;
const taskLists = () => (lists ??= get("/api/meta").then((out) => out.tasks, (err) => { lists = null; throw err; }));

// ---- lifecycle ---------------------------------------------------------------------------------

/** #/p/SLUG/tasks (the board) or #/p/SLUG/tasks/ID (one task). */
export function mount(el, ctx) {
  return ctx.id ? mountTask(el, ctx) : mountBoard(el, ctx);
}

function mountBoard(el, ctx) {
  const state = { tasks: new Map(), approvals: [], stepTasks: new Set() };
  const board = h("div", { class: "board" }, h("p", { class: "muted", text: "Loading tasks…" }));
  const error = errorSlot();
  const approvals = h("div", { class: "stack" });
  const approvalsSection = h("section", { class: "section", "aria-labelledby": "board-approvals", hidden: true },
    h("h2", { id: "board-approvals", text: "Waiting for your decision" }), approvals);
  el.append(
    h("div", { class: "page-head" }, heading(1, "Tasks")),
    approvalsSection,
    askForm(ctx),
    error,
    h("section", { "aria-label": "Task board" }, board));

  const render = () => renderBoard(board, ctx, [...state.tasks.values()], state.approvals, state.stepTasks);
  const loadApprovals = async () => {
    try {
      const out = await get("/api/approvals");
      state.approvals = out.approvals.filter((a) => a.approval.project === ctx.slug);
      approvalsSection.hidden = !state.approvals.length;
      fill(approvals, state.approvals.map((item) => approvalCard(item, { onDecided: render })));
      render();
    } catch {
      approvalsSection.hidden = true;
    }
  };
  const loadSteps = async () => {
    try {
      state.stepTasks = new Set((await pendingSteps()).map((step) => step.task_id));
      render();
    } catch { /* the marks stay as they were */ }
  };
  const reloadSteps = debounce(loadSteps, 300);
  const offTask = stream.on("task.updated", (e) => {
    if (upsert(state.tasks, e.task)) render();
    reloadSteps(); // a run may have asked a step, or had one decided
  });
  const reloadApprovals = debounce(loadApprovals, 300);
  const offApproval = stream.on("approval.updated", reloadApprovals);
  const loadBoard = async () => {
    try {
      const { tasks } = await get(`/api/projects/${seg(ctx.slug)}/tasks`);
      for (const t of tasks) upsert(state.tasks, t);
      render();
    } catch (err) {
      fill(board, loadFailed(err, loadBoard));
      return;
    }
    loadApprovals();
    loadSteps();
  };
  loadBoard();
  return () => {
    offTask();
    offApproval();
    reloadApprovals.cancel();
    reloadSteps.cancel();
  };
}

function mountTask(el, ctx) {
  const taskId = ctx.id;
  const top = h("div", { class: "task-top" }, h("p", { class: "muted", text: "Loading the task…" }));
  const body = h("div", { class: "task-body" });
  const list = new MessageList(ctx, taskId);
  const composer = createComposer({ taskId, onSending: (body) => list.sending(body),
    onPosted: (m) => list.add(m, { scroll: true }) });
  list.onReply = (m) => composer.replyTo(m);
  const thread = h("section", { class: "section thread-section", "aria-labelledby": "thread-heading" },
    h("h2", { id: "thread-heading", text: "Thread" }), list.el, composer.el);
  el.append(h("p", { class: "back" }, h("a", { href: `#/p/${ctx.slug}/tasks`, text: "← All tasks" })), top, body, thread);

  let shown = null; // what is on screen, so an unchanged answer does not redraw (and drop focus)
  let first = true;
  const decided = new Map(); // step id -> its card, decided here: it stays with its outcome
  const load = async () => {
    try {
      const [detail, steps, known] = await Promise.all([
        get(`/api/tasks/${seg(taskId)}`),
        pendingSteps().catch(() => []),
        taskLists(),
      ]);
      if (detail.task.project !== ctx.slug) {
        ctx.go(`#/p/${detail.task.project}/tasks/${taskId}`);
        return;
      }
      // The held handoff's approval, when it is this person's to decide.
      const approval = detail.approval?.owner === ctx.me.handle ? { approval: detail.approval, task: detail.task } : null;
      const mine = steps.filter((step) => step.task_id === taskId && !decided.has(step.id));
      const key = JSON.stringify([detail, approval, mine, [...decided.keys()]]);
      if (key === shown) return;
      shown = key;
      const stepCards = [...decided.values(), ...mine.map((step) => {
        const card = stepCard(step, { embedded: true, onDecided: () => decided.set(step.id, card) });
        return card;
      })];
      const focused = document.activeElement;
      renderTask(top, body, ctx, detail, approval, stepCards, load, known);
      if (focused !== document.activeElement && top.contains(focused)) focused.focus({ preventScroll: true });
      if (first) {
        first = false;
        top.querySelector("h1")?.focus();
      }
    } catch (err) {
      if (err.status !== 404) {
        if (shown !== null) return; // the task on screen stays; the next event tries again
        fill(top, heading(1, "This task could not be loaded"), loadFailed(err, load));
        return;
      }
      fill(top, heading(1, "Task not found"),
        h("p", { class: "error", role: "alert", text: err.message }),
        h("a", { href: `#/p/${ctx.slug}/tasks`, text: "Back to the tasks" }));
      thread.hidden = true;
    }
  };
  const reload = debounce(load, 250);
  const offTask = stream.on("task.updated", (e) => {
    if (e.task?.id === taskId) reload();
  });
  const offApproval = stream.on("approval.updated", (e) => {
    if (e.approval?.task_id === taskId) reload();
  });
  load();
  list.load();
  return () => {
    offTask();
    offApproval();
    reload.cancel();
    list.destroy();
    composer.destroy();
  };
}

// ---- actions -------------------------------------------------------------------------------------

/** Who gives final acceptance: the person who asked, or the requesting agent's owner. */
export function requestingPerson(task) {
  if (task.requested_by?.kind === "person") return task.requested_by.handle;
  return task.requester ? task.requester.split("/")[0] : null;
}

/** A verified result waiting for the requesting person's final acceptance. */
export function awaitingFinal(task) {
  if (!task.result) return false;
  if (task.state === "approval" && task.result.verified_by) return true;
  return task.requested_by?.kind === "person" && task.state === "verifying";
}

/** The state badge, saying which approval an "approval" task waits for. */
export function taskState(task) {
  const badgeEl = stateBadge(task.state);
  if (task.state === "approval") badgeEl.textContent = awaitingFinal(task) ? "awaiting final acceptance" : "awaiting handoff approval";
  return badgeEl;
}

/** A handoff held by the gate for the assignee's owner. */
export function heldByGate(task) {
  return task.state === "approval" && !task.result?.verified_by;
}

async function decide(approvalId, decision, standing) {
  const body = { decision };
  if (standing) body.standing = standing;
  return post(`/api/approvals/${seg(approvalId)}`, body);
}

// ---- callbacks / rendering -------------------------------------------------------------------------

function renderBoard(board, ctx, tasks, approvals, stepTasks) {
  const held = new Set([...approvals.map((a) => a.task.id), ...stepTasks]);
  fill(board, COLUMNS.map(([title, states]) => {
    const cards = tasks.filter((t) => states.includes(t.state))
      .sort((a, b) => (b.updated_at || "").localeCompare(a.updated_at || ""));
    const id = `col-${states[0]}`;
    return h("section", { class: "column", id, "aria-labelledby": `${id}-title` },
      h("h2", { id: `${id}-title`, class: "column-title" }, title, h("span", { class: "count", text: String(cards.length) })),
      cards.length ? h("ul", { class: "cards" }, cards.map((t) => h("li", {}, taskCard(t, ctx, held))))
        : h("p", { class: "empty small", text: "Nothing here." }));
  }));
}

function taskCard(task, ctx, held) {
  const mine = held.has(task.id) || (awaitingFinal(task) && requestingPerson(task) === ctx.me.handle);
  return h("a", { class: `card task-card${mine ? " needs-you" : ""}`, href: `#/p/${ctx.slug}/tasks/${task.id}`,
    dataset: { taskId: task.id, state: task.state } },
  h("span", { class: "task-card-title", text: titleOf(task) }),
  h("span", { class: "task-card-meta" }, taskState(task),
    mine ? badge("needs you", "attention") : null,
    task.waiting_on ? h("span", { class: "muted small", text: `waiting on ${words(task.waiting_on)}` }) : null),
  h("span", { class: "muted small", text: `${requesterText(task)} → ${task.assignee}` }),
  h("span", { class: "muted small", text: `${words(task.packet.deliverable_type)} · ${ago(task.updated_at)}` }));
}

function renderTask(top, body, ctx, detail, approval, stepCards, reload, known) {
  const { task, checkpoints, submissions } = detail;
  fill(top,
    heading(1, titleOf(task), { class: "task-title" }),
    h("div", { class: "task-meta" },
      taskState(task),
      task.waiting_on ? badge(`waiting on ${words(task.waiting_on)}`, "muted") : null,
      h("span", { text: `${requesterText(task)} → ${task.assignee}` }),
      h("span", { class: "muted", text: words(task.packet.deliverable_type) }),
      h("span", { class: "muted" }, "created ", timeEl(task.created_at)),
      h("span", { class: "muted" }, "updated ", timeEl(task.updated_at, true)),
      task.parent_task_id ? h("a", { href: `#/p/${ctx.slug}/tasks/${task.parent_task_id}`, text: "parent task" }) : null),
    renderActions(ctx, task, approval, stepCards, reload, known));

  const latest = task.result;
  fill(body,
    h("section", { class: "section", "aria-labelledby": "packet-heading" },
      h("h2", { id: "packet-heading", text: "What was asked" }),
      h("p", { class: "packet-task", text: task.packet.task }),
      h("h3", { text: "Acceptance criteria" }),
      criteriaList(task.packet.acceptance_criteria, latest),
      task.packet.context ? [h("h3", { text: "Context" }), h("p", { class: "pre", text: task.packet.context })] : null,
      task.packet.files?.length ? [h("h3", { text: "Files" }), codeList(task.packet.files)] : null,
      task.packet.depends_on?.length ? [h("h3", { text: "Depends on" }), codeList(task.packet.depends_on)] : null),
    runsSection(ctx, detail, reload),
    h("section", { class: "section", "aria-labelledby": "subs-heading" },
      h("h2", { id: "subs-heading", text: submissions.length > 1 ? `Results (${submissions.length} revisions)` : "Result" }),
      submissions.length
        ? [...submissions].reverse().map((s, i) => (i === 0 ? renderSubmission(s, task)
          : h("details", { class: "older" }, h("summary", { text: `Revision ${s.revision} · ${s.status}` }),
            renderSubmission(s, task))))
        : empty("No result yet.")),
    h("section", { class: "section", "aria-labelledby": "cp-heading" },
      h("h2", { id: "cp-heading", text: "Checkpoints" }),
      checkpoints.length ? h("ol", { class: "timeline" }, [...checkpoints].reverse().map(renderCheckpoint))
        : empty("No checkpoints yet.")));
}

function renderActions(ctx, task, approval, stepCards, reload, known) {
  const box = h("section", { class: "actions card", "aria-labelledby": "actions-heading" },
    h("h2", { id: "actions-heading", class: "sr-only", text: "Whose turn, and your decisions" }));
  const requester = requestingPerson(task);
  const owner = task.assignee.split("/")[0];
  const parts = [h("p", { class: "status-line", text: statusLine(task, requester, owner, ctx.me.handle) })];

  const asking = stepCards.filter((card) => !card.classList.contains("decided")).length;
  if (stepCards.length) {
    parts.push(h("div", { class: "step-box" },
      asking ? h("p", { class: "step-lead", text: `${task.assignee}'s run is waiting for you: allow or refuse ${asking === 1 ? "this step" : "these steps"}.` }) : null,
      stepCards));
  }

  if (approval) parts.push(approvalCard(approval, { onDecided: reload, embedded: true }));
  if (awaitingFinal(task) && requester === ctx.me.handle) parts.push(finalDecision(ctx, task, reload));

  const isOwner = ctx.project.data()?.role === "owner";
  if (known.cancellable.includes(task.state) && (requester === ctx.me.handle || isOwner)) {
    const error = errorSlot();
    const cancel = confirmButton("Cancel task", "Click again to cancel the task", (button) => act(button, error, async () => {
      await post(`/api/tasks/${seg(task.id)}/cancel`, {});
      announce("Task cancelled");
      reload();
    }), { class: "danger-quiet" });
    parts.push(h("div", { class: "cancel-row" }, cancel, error));
  }
  box.classList.toggle("done", task.state === "completed");
  box.append(...parts);
  return box;
}

/** One sentence: where the task stands and whose turn it is. */
function statusLine(task, requester, owner, me) {
  const you = (handle) => (handle === me ? "you" : handle);
  switch (task.state) {
    case "approval":
      if (awaitingFinal(task)) {
        return requester === me ? "The result was verified. Your final decision:"
          : `The result was verified. Waiting for ${requester}'s final acceptance.`;
      }
      return owner === me ? "Your gate is holding this handoff. Approve or deny it:"
        : `Held by the gate until ${owner} approves or denies it.`;
    case "requested":
    case "routed":
      return `Handed to ${task.assignee}; it has not accepted the task yet.`;
    case "accepted":
    case "working":
      return `${task.assignee} is working on it.`;
    case "waiting":
      return task.waiting_on === "human"
        ? `${task.assignee} has a question for a person: answer it in the thread below.`
        : `${task.assignee} is waiting on ${words(task.waiting_on || "something")}.`;
    case "verifying":
      if (task.requester) return `${task.requester} is checking the result.`;
      return requester === me ? "The result is back. Your final decision:" : `Waiting for ${you(requester)} to check the result.`;
    case "completed":
      return "Completed: the result was accepted.";
    default:
      return `This task is ${task.state}.`;
  }
}

function finalDecision(ctx, task, reload) {
  const error = errorSlot();
  const accept = h("button", { type: "button", class: "primary", text: "Give final acceptance" });
  const { lead, items, extra, gaps } = coverage(task.result, task.packet.acceptance_criteria);
  const give = (button) => act(button, error, async () => {
    await post(`/api/tasks/${seg(task.id)}/accept`, {});
    announce("Accepted: the task is completed");
    reload();
  });
  // With anything uncovered or stale, accepting asks once more, naming the gaps.
  const anyway = h("button", { type: "button", class: "primary", text: "Accept anyway" });
  const notYet = h("button", { type: "button", text: "Not yet" });
  const confirmId = uid("confirm-accept");
  const confirm = h("div", { class: "banner banner-warn confirm-accept", role: "group", hidden: true,
    "aria-labelledby": confirmId },
  h("p", { id: confirmId, tabindex: "-1", text: `Accept with gaps? ${gaps.join(" ")} `
    + "Accepting makes this result owner-approved as it is." }),
  h("div", { class: "button-row" }, anyway, notYet));
  accept.addEventListener("click", () => {
    if (!gaps.length) return give(accept);
    confirm.hidden = false;
    accept.hidden = true;
    confirm.querySelector("p").focus();
    return undefined;
  });
  anyway.addEventListener("click", () => give(anyway));
  notYet.addEventListener("click", () => {
    confirm.hidden = true;
    accept.hidden = false;
    accept.focus();
  });
  const reason = h("textarea", { rows: "2", maxlength: "1000", required: true });
  const back = h("button", { type: "submit", text: "Send back" });
  const backError = errorSlot();
  const form = h("form", { class: "send-back" }, field("Why it goes back (the assignee reads this)", reason),
    back, backError);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    act(back, backError, async () => {
      if (!reason.value.trim()) throw new Error("Say what needs to change before sending it back.");
      await post(`/api/tasks/${seg(task.id)}/send-back`, { reason: reason.value.trim() });
      announce("Sent back to the assignee");
      reload();
    });
  });
  const verifier = task.result?.verified_by ? actorText(task.result.verified_by) : null;
  return h("div", { class: "decision" },
    h("p", { class: "decision-lead muted", text: `${verifier ? `${verifier} verified it. ` : ""}${lead}` }),
    items.length ? h("ul", { class: "decision-coverage" }, items) : null,
    extra,
    h("div", { class: "button-row" }, accept), confirm, error,
    h("details", { class: "send-back-box" }, h("summary", { text: "Send it back with a reason" }), form));
}

/**
 * What the final decision rests on, criterion by criterion: which evidence covers each one
 * (kind and summary), which have none, and which only stale evidence covers. The lead names
 * the count; it says every criterion is covered only when the evidence report is complete.
 * `extra` names general and stale evidence no criterion line shows; `gaps` holds one
 * sentence per gap (uncovered criteria, stale evidence, no report), empty when complete.
 */
function coverage(result, criteria) {
  if (!result?.evidence_report) {
    const none = "No evidence report came with this result: read the evidence yourself before you accept.";
    return { lead: none, items: [], extra: null, gaps: ["There is no evidence report."] };
  }
  const report = result.evidence_report;
  const evidence = result?.evidence || [];
  const stale = new Map((report.stale || []).map((s) => [s.evidence, s.why]));
  let fresh = 0;
  const items = criteria.map((text, i) => {
    const covering = report.coverage?.find((c) => c.criterion === i)?.evidence || [];
    const good = covering.filter((n) => !stale.has(n));
    if (good.length) fresh += 1;
    const kind = !covering.length ? "uncovered" : good.length ? "covered" : "stale";
    const by = covering.map((n) => {
      const ev = evidence[n] || {};
      return `#${n + 1} ${words(ev.kind || "evidence")} “${ev.summary || ""}”${stale.has(n) ? ` (stale: ${words(stale.get(n))})` : ""}`;
    });
    const said = kind === "uncovered" ? "no evidence covers it"
      : `${kind === "stale" ? "only stale evidence: " : "covered by "}${by.join("; ")}`;
    return h("li", { class: `coverage-${kind}`, dataset: { criterion: String(i) } },
      h("strong", { text: `Criterion ${i + 1}` }), ` (${text}): ${said}`);
  });
  const n = criteria.length;
  const lead = report.complete
    ? `Every criterion is covered by fresh evidence:`
    : fresh === n ? `Every criterion is covered by fresh evidence, but some evidence is stale; check it before you accept:`
      : `${fresh} of ${n} ${n === 1 ? "criterion is" : "criteria are"} covered by fresh evidence; check the gaps before you accept:`;
  const general = report.general || [];
  const staleGeneral = general.filter((g) => stale.has(g));
  const extra = general.length ? h("p", { class: "decision-general muted small",
    text: `Evidence ${general.map((g) => `#${g + 1}${stale.has(g) ? ` (stale: ${words(stale.get(g))})` : ""}`).join(", ")} `
      + "is tagged to no criterion, so it covers none." }) : null;
  const label = (list) => list.map((c) => c + 1).join(", ");
  const uncovered = report.uncovered || [];
  const staleOnly = criteria.map((_, i) => i).filter((i) => {
    const covering = report.coverage?.find((c) => c.criterion === i)?.evidence || [];
    return covering.length && covering.every((e) => stale.has(e));
  });
  const gaps = [];
  if (uncovered.length) gaps.push(`No evidence covers criterion ${label(uncovered)}.`);
  if (staleOnly.length) gaps.push(`Only stale evidence covers criterion ${label(staleOnly)}.`);
  const staleRest = [...stale.keys()].filter((e) => !staleGeneral.includes(e)
    && !staleOnly.some((i) => report.coverage?.find((c) => c.criterion === i)?.evidence.includes(e)));
  if (staleRest.length || staleGeneral.length) {
    gaps.push(`Evidence ${[...staleRest, ...staleGeneral].sort((a, b) => a - b).map((e) => `#${e + 1}`).join(", ")} is stale.`);
  }
  if (!report.complete && !gaps.length) gaps.push("The evidence report is not complete.");
  return { lead, items, extra, gaps };
}

/** A held handoff with Approve / Deny (and an optional standing approval). */
export function approvalCard(item, { showProject = false, onDecided, embedded = false } = {}) {
  const { approval, task } = item;
  const error = errorSlot();
  const approve = h("button", { type: "button", class: "primary", text: "Approve" });
  const deny = h("button", { type: "button", class: "danger-quiet", text: "Deny" });
  const uses = h("input", { type: "number", min: "1", max: "100", value: "5", inputmode: "numeric" });
  const days = h("input", { type: "number", min: "1", max: "90", value: "7", inputmode: "numeric" });
  const standing = h("button", { type: "button", text: "Approve and allow more like it" });
  const result = h("p", { class: "notice ok", role: "status", hidden: true });
  const card = h("article", { class: `approval${embedded ? "" : " card"}`, dataset: { approvalId: approval.id, taskId: task.id } },
    h("div", { class: "approval-head" },
      badge("held by your gate", "attention"),
      showProject ? h("span", { class: "muted small", text: approval.project }) : null,
      h("span", { class: "muted small" }, "expires ", timeEl(approval.expires_at, true))),
    h("h3", { class: "approval-title" },
      h("a", { href: `#/p/${task.project}/tasks/${task.id}`, text: approval.summary || titleOf(task) })),
    h("p", { class: "muted", text: `${requesterText(task)} asks your agent ${task.assignee} for ${words(task.packet.deliverable_type)} work.` }),
    h("ul", { class: "criteria-brief" }, task.packet.acceptance_criteria.map((c) => h("li", { text: c }))),
    h("div", { class: "button-row" }, approve, deny),
    h("details", { class: "standing" },
      h("summary", { text: "Let similar requests through without asking" }),
      h("p", { class: "muted small", text: `Later ${words(task.packet.deliverable_type)} requests from ${task.requester || "this person"} to ${task.assignee} pass the gate.` }),
      h("div", { class: "inline-fields" }, field("Up to (uses)", uses), field("For (days)", days)),
      standing),
    error, result);
  const done = (out, text) => {
    if (!out) return;
    result.textContent = text;
    result.hidden = false;
    for (const b of [approve, deny, standing]) b.disabled = true;
    card.classList.add("decided");
    announce(text);
    onDecided?.(out);
  };
  approve.addEventListener("click", async () => done(await act(approve, error, () => decide(approval.id, "approve")),
    "Approved: the task went to the agent."));
  deny.addEventListener("click", async () => done(await act(deny, error, () => decide(approval.id, "deny")),
    "Denied: the task was rejected."));
  standing.addEventListener("click", async () => done(await act(standing, error, () => decide(approval.id, "approve",
    { uses: Number(uses.value), days: Number(days.value) })), "Approved, with a standing approval for more like it."));
  return card;
}

function askForm(ctx) {
  const mine = (ctx.project.data()?.agents || []).filter((a) => a.owner === ctx.me.handle);
  const details = h("details", { class: "section disclosure ask" },
    h("summary", {}, h("h2", { text: "Ask one of your agents" })));
  if (!mine.length) {
    details.append(h("p", { class: "muted" }, "You have no agents in this project. ",
      h("a", { href: "#/agents", text: "Add one on Agents & keys" }), "."));
    return details;
  }
  const agent = select(mine.map((a) => [a.agent_id, `${a.name} (${a.agent_id})`]), { name: "agent" });
  const what = h("textarea", { rows: "2", maxlength: "500", required: true, name: "task" });
  const kind = select([], { name: "deliverable" });
  taskLists().then((known) => fill(kind, known.deliverable_types.map((d) => h("option", { value: d, text: words(d) }))),
    () => {});
  const criteria = h("textarea", { rows: "3", required: true, name: "criteria" });
  const context = h("textarea", { rows: "2", maxlength: "4000", name: "context" });
  const files = h("textarea", { rows: "2", name: "files" });
  const submit = h("button", { type: "submit", class: "primary", text: "Ask the agent" });
  const error = errorSlot();
  const form = h("form", { class: "grid-form" },
    field("Agent", agent), field("Deliverable", kind),
    h("div", { class: "wide" }, field("What to do", what)),
    h("div", { class: "wide" }, field("Acceptance criteria", criteria, "One per line. The result is checked against each.")),
    field("Context (optional)", context), field("Files (optional)", files, "One path per line."),
    h("div", { class: "form-actions" }, submit), error);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const packet = { task: what.value.trim(), deliverable_type: kind.value, acceptance_criteria: lines(criteria.value) };
    if (context.value.trim()) packet.context = context.value.trim();
    if (lines(files.value).length) packet.files = lines(files.value);
    const out = await act(submit, error, () => {
      if (!packet.task) throw new Error("Say what the agent should do.");
      if (!packet.acceptance_criteria.length) throw new Error("Add at least one acceptance criterion.");
      return post(`/api/projects/${seg(ctx.slug)}/task-requests`, { agent: agent.value, packet });
    });
    if (out) ctx.go(`#/p/${ctx.slug}/tasks/${out.task.id}`);
  });
  details.append(h("p", { class: "muted", text: "Your own agents need no gate: the task goes straight to the agent." }), form);
  return details;
}

// ---- internal -------------------------------------------------------------------------------------------

function upsert(map, task) {
  if (!task) return false;
  const have = map.get(task.id);
  if (have && (have.updated_at || "") > (task.updated_at || "")) return false;
  map.set(task.id, task);
  return true;
}

function titleOf(task) {
  return task.display_title || task.packet.task;
}

function requesterText(task) {
  if (task.requester) return task.requester;
  return task.requested_by?.kind === "person" ? `@${task.requested_by.handle}` : "someone";
}

export function actorText(ref) {
  if (!ref) return "";
  if (ref.kind === "person") return `@${ref.handle}`;
  if (ref.kind === "agent") return ref.agent_id;
  return "Prickle";
}

function codeList(items) {
  return h("ul", { class: "code-list" }, items.map((f) => h("li", {}, h("code", { text: f }))));
}

/** Criteria with what the latest result's evidence report and verdicts say about each. */
function criteriaList(criteria, result) {
  const report = result?.evidence_report;
  const staleSet = new Set((report?.stale || []).map((s) => s.evidence));
  return h("ol", { class: "criteria" }, criteria.map((text, i) => {
    const covering = report?.coverage?.find((c) => c.criterion === i)?.evidence || [];
    const verdict = result?.verdicts?.find((v) => v.criterion === i);
    let status = null;
    if (report) {
      if (!covering.length) status = badge("uncovered", "danger", "No evidence covers this criterion.");
      else if (covering.every((n) => staleSet.has(n))) status = badge("stale evidence", "warn", "Only stale evidence covers it.");
      else status = badge(`covered by ${covering.map((n) => `#${n + 1}`).join(", ")}`, "ok");
    }
    return h("li", { class: "criterion", dataset: { criterion: String(i) } },
      h("span", { class: "criterion-text", text }),
      h("span", { class: "criterion-status" }, status,
        verdict ? badge(verdict.accepted ? "accepted" : "not accepted", verdict.accepted ? "ok" : "danger",
          verdict.note || undefined) : null,
        verdict?.note ? h("span", { class: "muted small", text: verdict.note }) : null));
  }));
}

const SUBMISSION_KIND = { submitted: "info", accepted: "ok", rejected: "danger", superseded: "muted", cancelled: "muted" };

function renderSubmission(sub, task) {
  const report = sub.evidence_report || {};
  const stale = new Map((report.stale || []).map((s) => [s.evidence, s.why]));
  return h("article", { class: "submission", dataset: { revision: String(sub.revision) } },
    h("div", { class: "submission-head" },
      h("strong", { text: `Revision ${sub.revision}` }),
      badge(sub.status, SUBMISSION_KIND[sub.status] || "muted"),
      ...provenanceBadges(sub),
      h("span", { class: "muted small" }, `returned by ${sub.returned_by} · `, timeEl(sub.returned_at))),
    h("p", { class: "pre submission-summary", text: sub.summary }),
    h("h3", { text: "Evidence" }),
    h("ol", { class: "evidence" }, sub.evidence.map((ev, n) => {
      const url = ev.url ? safeUrl(ev.url) : null;
      return h("li", { class: "evidence-item" },
        h("div", { class: "evidence-head" },
          h("span", { class: "evidence-n", text: `#${n + 1}` }), badge(words(ev.kind), "muted"),
          h("span", { text: ev.summary }),
          stale.has(n) ? badge(`stale: ${words(stale.get(n))}`, "warn") : null),
        ev.criteria?.length ? h("p", { class: "muted small",
          text: `for criterion ${ev.criteria.map((c) => c + 1).join(", ")}` }) : null,
        url ? h("a", { href: url, target: "_blank", rel: "noopener noreferrer nofollow", class: "small", text: ev.url })
          : ev.url ? h("code", { class: "small", text: ev.url }) : null,
        ev.content ? h("pre", { class: "code small", text: ev.content }) : null,
        ev.artifact != null && sub.artifacts?.[ev.artifact]
          ? h("p", { class: "muted small", text: `artifact: ${sub.artifacts[ev.artifact].ref}` }) : null,
        ev.observed_at || ev.verifier ? h("p", { class: "muted small" },
          ev.observed_at ? ["observed ", timeEl(ev.observed_at)] : null, ev.verifier ? ` · checked by ${ev.verifier}` : null)
          : null);
    })),
    h("h3", { text: "Evidence report" }),
    evidenceReport(report, task.packet.acceptance_criteria),
    sub.artifacts?.length ? [h("h3", { text: "Artifacts" }), h("ul", { class: "artifacts" }, sub.artifacts.map((a) =>
      h("li", {}, h("code", { text: a.ref }),
        a.commit_sha ? h("span", { class: "muted small", title: a.commit_sha, text: ` commit ${a.commit_sha.slice(0, 12)}` }) : null,
        a.sha256 ? h("span", { class: "muted small", title: a.sha256, text: ` sha256 ${a.sha256.slice(0, 12)}…` }) : null)))]
      : null,
    h("dl", { class: "facts" },
      sub.verified_by ? [h("dt", { text: "Verified by" }), h("dd", { text: actorText(sub.verified_by) })] : null,
      sub.decided_by ? [h("dt", { text: "Decided by" }), h("dd", { text: actorText(sub.decided_by) })] : null,
      sub.decided_by_policy ? [h("dt", { text: "Policy" }), h("dd", { text: words(sub.decided_by_policy) })] : null,
      sub.reason ? [h("dt", { text: "Reason" }), h("dd", { class: "pre", text: sub.reason })] : null));
}

function evidenceReport(report, criteria) {
  if (!report.coverage) return empty("No report.");
  const staleSet = new Set((report.stale || []).map((s) => s.evidence));
  // Covered only by stale evidence is not covered: it gets its own mark.
  const standing = (c) => (!c.evidence.length ? "uncovered" : c.evidence.every((n) => staleSet.has(n)) ? "stale" : "covered");
  const MARK = { covered: "✓", stale: "!", uncovered: "✗" };
  return h("div", { class: "report" },
    report.complete ? badge("complete: every criterion covered, nothing stale", "ok")
      : badge("incomplete", "warn"),
    h("ul", { class: "report-list" },
      report.coverage.map((c) => h("li", { class: standing(c) },
        h("span", { class: "report-mark", "aria-hidden": "true", text: MARK[standing(c)] }),
        h("span", { text: `Criterion ${c.criterion + 1}: ${criteria[c.criterion] ?? ""}` }),
        h("span", { class: "muted small", text: {
          covered: ` — evidence ${c.evidence.map((n) => `#${n + 1}`).join(", ")}`,
          stale: ` — only stale evidence ${c.evidence.map((n) => `#${n + 1}`).join(", ")}`,
          uncovered: " — uncovered" }[standing(c)] })))),
    report.general?.length ? h("p", { class: "muted small",
      text: `General evidence (covers no one criterion): ${report.general.map((n) => `#${n + 1}`).join(", ")}` }) : null,
    report.stale?.length ? h("p", { class: "warn-text small",
      text: `Stale: ${report.stale.map((s) => `#${s.evidence + 1} (${words(s.why)})`).join(", ")}` }) : null);
}

function renderCheckpoint(cp) {
  const list = (title, items, cls) => (items?.length
    ? [h("h4", { text: title }), h("ul", { class: cls }, items.map((x) => h("li", {}, cls === "code-list" ? h("code", { text: x }) : x)))]
    : null);
  return h("li", { class: `checkpoint${cp.needs_answer ? " needs-answer" : ""}` },
    h("div", { class: "checkpoint-head" }, h("strong", { text: cp.agent }), " · ", timeEl(cp.created_at),
      cp.needs_answer ? badge("needs a person's answer", "attention") : null),
    h("p", { class: "pre", text: cp.progress }),
    list("Decisions", cp.decisions),
    list("Files touched", cp.files_touched, "code-list"),
    list("Next steps", cp.next_steps),
    list("Open questions", cp.open_questions));
}
