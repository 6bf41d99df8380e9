// tasks.js — the task board by state, one task's page (packet, checkpoints, submissions,
// evidence report per criterion, artifacts and its thread), the decisions a person
// makes (allow or refuse a step its run asks, approve or deny a held handoff, final
// acceptance, send back, cancel, hand a returned task to another agent), and asking one of your
// own agents for a task. The board filters (FILTERS) and shows columns or a list; its choices stay
// in the address (?view=…).

import { get, post, seg } from "./api.js";
import * as stream from "./stream.js";
import { MessageList, provenanceBadges } from "./room.js";
import { createComposer } from "./composer.js";
import { stepCard, pendingSteps } from "./steps.js";
import { runsSection } from "./runs.js";
import { onChange as onInboxChange, items as inboxItems, reload as reloadInbox, tasksNeedingMe } from "./inbox_store.js";
import { markdownWithRaw } from "./markdown.js";
import {
  h, heading, field, select, errorSlot, act, fill, empty, badge, stateBadge, timeEl, ago, words, safeUrl,
  confirmButton, lines, debounce, announce, settle, ownerOf, loadFailed, uid,
} from "./ui.js";

// The server's lists (GET /api/meta): task states, those a task can be cancelled from, deliverable types,
// the board's columns.
let lists = null;
const taskLists = () => (lists ??= get("/api/meta").then((out) => out.tasks, (err) => { lists = null; throw err; }));

// ---- lifecycle ---------------------------------------------------------------------------------

/** #/p/SLUG/tasks (the board) or #/p/SLUG/tasks/ID (one task). */
export function mount(el, ctx) {
  return ctx.id ? mountTask(el, ctx) : mountBoard(el, ctx);
}

function mountBoard(el, ctx) {
  const state = { tasks: new Map(), columns: [], blocked: {} };
  const choice = boardChoice(ctx.query);
  const board = h("div", { class: "board" }, h("p", { class: "muted", text: "Loading tasks…" }));
  const filters = h("form", { class: "board-filters", "aria-label": "Filter the tasks" });
  const error = errorSlot();
  const approvals = h("div", { class: "stack" });
  const approvalsSection = h("section", { class: "section", "aria-labelledby": "board-approvals", hidden: true },
    h("h2", { id: "board-approvals", text: "Waiting for your decision" }), approvals);
  // "Needs me": only the cards the inbox lists as waiting on you.
  const needsMe = h("button", { type: "button", class: "quiet small needs-me-filter", "aria-pressed": "false", text: "Needs me" });
  needsMe.addEventListener("click", () => {
    needsMe.setAttribute("aria-pressed", String(needsMe.getAttribute("aria-pressed") !== "true"));
    render();
  });
  el.append(
    h("div", { class: "page-head" }, heading(1, "Tasks"), needsMe),
    approvalsSection,
    askForm(ctx),
    error,
    filters,
    h("section", { "aria-label": "Task board" }, board));

  const render = () => {
    if (!state.columns.length) return; // the lists have not come yet
    const all = [...state.tasks.values()];
    // What waits on you comes from the inbox: one home for it.
    const needs = { held: tasksNeedingMe(ctx.slug), columns: state.columns };
    const onlyMine = needsMe.getAttribute("aria-pressed") === "true";
    renderFilters(filters, ctx, all, choice, needs, () => {
      keepChoice(ctx, choice);
      render();
    });
    const shown = all.filter((t) => (!onlyMine || needs.held.has(t.id))
      && FILTERS.every((f) => !choice[f.key] || f.match(t, choice[f.key], ctx, needs)));
    if (choice.view === "list") renderList(board, ctx, shown, needs.held);
    else renderBoard(board, ctx, shown, state.columns, needs.held, state.blocked);
  };
  // The held handoffs of this project come from the inbox too.
  let shownApprovals = null;
  const showApprovals = () => {
    const held = inboxItems().filter((i) => i.kind === "approval" && i.project === ctx.slug);
    const key = held.map((i) => i.id).join(" ");
    if (key !== shownApprovals) {
      shownApprovals = key;
      approvalsSection.hidden = !held.length;
      fill(approvals, held.map((item) => approvalCard(item, { onDecided: reloadInbox })));
    }
    render();
  };
  const offInbox = onInboxChange(showApprovals);
  const loadTasks = async () => {
    const { tasks, blocked } = await get(`/api/projects/${seg(ctx.slug)}/tasks`);
    for (const t of tasks) upsert(state.tasks, t);
    state.blocked = blocked || {}; // which sub-tasks wait on open siblings: any task's move may end a wait
    render();
  };
  // Live events carry the reference's Task without where it stands (lifecycle, final_by): fetch again.
  const reloadTasks = debounce(() => loadTasks().catch(() => { /* the board stays as it was */ }), 300);
  const offTask = stream.on("task.updated", (e) => {
    if (e.task) reloadTasks();
  });
  const loadBoard = async () => {
    try {
      state.columns = (await taskLists()).board;
      await loadTasks();
    } catch (err) {
      fill(board, loadFailed(err, loadBoard));
      return;
    }
    showApprovals();
  };
  loadBoard();
  return () => {
    offInbox();
    offTask();
    reloadTasks.cancel();
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
        if (!ctx.sub) top.querySelector("h1")?.focus(); // a link to a message keeps the focus there
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
  list.load().then(() => { if (ctx.sub) list.revealDeep(ctx.sub); });
  return () => {
    offTask();
    offApproval();
    reload.cancel();
    list.destroy();
    composer.destroy();
  };
}

// ---- actions -------------------------------------------------------------------------------------

// Where a task stands comes from the server with the task (task_for_page): `lifecycle`, `final_by`,
// `awaiting_final`. Live task.updated events carry the reference's Task object without them, so the
// board and the task page fetch the task again when one arrives.

/** Who gives final acceptance: the person who asked, or the requesting agent's owner. */
export function requestingPerson(task) {
  return task.final_by;
}

/** A verified result waiting for the requesting person's final acceptance. */
export function awaitingFinal(task) {
  return task.awaiting_final === true;
}

/** The state badge, saying which approval an "approval" task waits for. */
export function taskState(task) {
  const badgeEl = stateBadge(task.state);
  if (task.state === "approval") badgeEl.textContent = awaitingFinal(task) ? "awaiting final acceptance" : "awaiting handoff approval";
  return badgeEl;
}

/** A handoff held by the gate for the assignee's owner. */
export function heldByGate(task) {
  return task.lifecycle === "approval_gate";
}

async function decide(approvalId, decision, standing) {
  const body = { decision };
  if (standing) body.standing = standing;
  return post(`/api/approvals/${seg(approvalId)}`, body);
}

// ---- callbacks / rendering -------------------------------------------------------------------------

function renderBoard(board, ctx, tasks, columns, held, blocked = {}) {
  board.classList.remove("board-list");
  fill(board, columns.map(({ title, states }) => {
    const cards = tasks.filter((t) => states.includes(t.state))
      .sort((a, b) => (b.updated_at || "").localeCompare(a.updated_at || ""));
    const id = `col-${states[0]}`;
    return h("section", { class: "column", id, "aria-labelledby": `${id}-title` },
      h("h2", { id: `${id}-title`, class: "column-title" }, title, h("span", { class: "count", text: String(cards.length) })),
      cards.length ? h("ul", { class: "cards" }, cards.map((t) => h("li", {}, taskCard(t, ctx, held, blocked[t.id]))))
        : h("p", { class: "empty small", text: "Nothing here." }));
  }));
}

/** The board as one table, newest activity first (the same tasks the columns show). */
function renderList(board, ctx, tasks, held) {
  board.classList.add("board-list");
  const rows = [...tasks].sort((a, b) => (b.updated_at || "").localeCompare(a.updated_at || ""));
  if (!rows.length) return fill(board, h("p", { class: "empty", text: "No task matches these filters." }));
  return fill(board, h("div", { class: "table-wrap" }, h("table", { class: "task-table" },
    h("thead", {}, h("tr", {}, ["Task", "State", "Requester", "Assignee", "Updated"].map((t) => h("th", { scope: "col", text: t })))),
    h("tbody", {}, rows.map((t) => h("tr", { dataset: { taskId: t.id, state: t.state } },
      h("td", {}, h("a", { href: `#/p/${ctx.slug}/tasks/${t.id}`, text: titleOf(t) }),
        held.has(t.id) ? [" ", badge("needs you", "attention")] : null),
      h("td", {}, taskState(t)),
      h("td", { text: requesterText(t) }),
      h("td", { text: t.assignee }),
      h("td", {}, timeEl(t.updated_at, true))))))));
}

// ---- board filters -------------------------------------------------------------------------------
// One entry per filter: its key in the address, its label, the choices the board's tasks offer
// ([value, text]) and whether a task matches a chosen value. ``needs`` holds what the board knows
// about the person's part (``held``: the tasks the inbox lists as waiting on them) and the board's
// ``columns`` (from the server). Add a filter
// by adding an entry.

const FILTERS = [
  { key: "assignee", label: "Assignee", options: (tasks) => distinct(tasks.map((t) => t.assignee)),
    match: (t, value) => t.assignee === value },
  { key: "requester", label: "Requester", options: (tasks) => distinct(tasks.map(requesterText)),
    match: (t, value) => requesterText(t) === value },
  { key: "state", label: "State", options: (tasks, ctx, { columns }) => columns.flatMap(({ states }) => states)
    .filter((st) => tasks.some((t) => t.state === st)).map((st) => [st, words(st)]),
  match: (t, value) => t.state === value },
];

function distinct(values) {
  return [...new Set(values.filter(Boolean))].sort().map((v) => [v, v]);
}

/** The board's view and filters from the address's query (?view=list&assignee=…). */
function boardChoice(query) {
  const choice = { view: query?.get("view") === "list" ? "list" : "columns" };
  for (const f of FILTERS) choice[f.key] = query?.get(f.key) || "";
  return choice;
}

/** Keep the choice in the address without reloading the view (a reload or a shared link keeps it). */
function keepChoice(ctx, choice) {
  const q = new URLSearchParams();
  if (choice.view === "list") q.set("view", "list");
  for (const f of FILTERS) if (choice[f.key]) q.set(f.key, choice[f.key]);
  const text = q.toString();
  history.replaceState(null, "", `#/p/${ctx.slug}/tasks${text ? `?${text}` : ""}`);
}

function renderFilters(form, ctx, tasks, choice, needs, onChange) {
  // Redrawn on every change; the control that had the focus gets it back.
  const active = form.contains(document.activeElement) ? document.activeElement : null;
  const focusKey = active && (active.name || active.dataset.view || active.dataset.clear);
  const controls = FILTERS.map((f) => {
    const control = h("select", { name: f.key });
    fillOptions(control, f, tasks, choice, ctx, needs);
    control.addEventListener("change", () => {
      choice[f.key] = control.value;
      onChange();
    });
    return field(f.label, control);
  });
  const views = h("div", { class: "view-switch", role: "group", "aria-label": "Show the tasks as" },
    [["columns", "Columns"], ["list", "List"]].map(([value, text]) => {
      const button = h("button", { type: "button", class: "small", "aria-pressed": String(choice.view === value),
        dataset: { view: value }, text });
      button.addEventListener("click", () => {
        choice.view = value;
        onChange();
      });
      return button;
    }));
  const filtered = FILTERS.some((f) => choice[f.key]);
  const clear = h("button", { type: "button", class: "link small", dataset: { clear: "clear" }, text: "Clear filters",
    hidden: !filtered });
  clear.addEventListener("click", () => {
    for (const f of FILTERS) choice[f.key] = "";
    onChange();
  });
  fill(form, controls, clear, views);
  if (focusKey) {
    const again = [...form.querySelectorAll("select, button")].find((c) =>
      (c.name || c.dataset.view || c.dataset.clear) === focusKey && !c.hidden);
    (again || form.querySelector("select"))?.focus();
  }
}

function fillOptions(control, filter, tasks, choice, ctx, needs) {
  const options = filter.options(tasks, ctx, needs);
  const value = choice[filter.key];
  if (value && !options.some(([v]) => v === value)) options.push([value, value]); // chosen, though none match now
  fill(control, h("option", { value: "", text: "Any" }), options.map(([v, text]) => h("option", { value: v, text })));
  control.value = value;
}

function taskCard(task, ctx, held, waitsOn) {
  const mine = held.has(task.id);
  return h("a", { class: `card task-card${mine ? " needs-you" : ""}`, href: `#/p/${ctx.slug}/tasks/${task.id}`,
    dataset: { taskId: task.id, state: task.state } },
  h("span", { class: "task-card-title", text: titleOf(task) }),
  h("span", { class: "task-card-meta" }, taskState(task),
    mine ? badge("needs you", "attention") : null,
    waitsOn?.length ? badge("blocked", "warn", `Waits on ${waitsOn.length} other sub-task${waitsOn.length > 1 ? "s" : ""}`) : null,
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
      task.parent_task_id ? h("a", { href: `#/p/${ctx.slug}/tasks/${task.parent_task_id}`, text: "parent task" }) : null,
      detail.blocked?.length ? h("span", { class: "task-blocked" }, badge("blocked", "warn"), " waits on ",
        detail.blocked.map((id, i) => [i ? ", " : "", h("a", { href: `#/p/${ctx.slug}/tasks/${id}`, text: siblingTitle(detail, id) })]))
        : null),
    renderActions(ctx, task, approval, stepCards, reload, known),
    detail.can_rename ? namesBox(ctx, detail, reload, known) : null);

  const latest = task.result;
  fill(body,
    h("section", { class: "section", "aria-labelledby": "packet-heading" },
      h("h2", { id: "packet-heading", text: "What was asked" }),
      markdownWithRaw(task.packet.task, { class: "packet-task" }),
      h("h3", { text: "Acceptance criteria" }),
      criteriaList(task.packet.acceptance_criteria, latest),
      task.packet.context ? [h("h3", { text: "Context" }), markdownWithRaw(task.packet.context)] : null,
      task.packet.files?.length ? [h("h3", { text: "Files" }), codeList(task.packet.files)] : null,
      task.packet.depends_on?.length ? [h("h3", { text: "Depends on" }), codeList(task.packet.depends_on)] : null),
    detail.subtasks?.length ? subtasksSection(ctx, detail.subtasks) : null,
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
  const owner = ownerOf(task.assignee);
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
  if (task.state === "returned" && (requester === ctx.me.handle || isOwner)) parts.push(reassignForm(ctx, task, reload));
  box.classList.toggle("done", task.state === "completed");
  box.append(...parts);
  return box;
}

/** Rename the task (its display title; the packet stays) and, for a sub-task, pick the siblings it waits on. */
function namesBox(ctx, detail, reload, known) {
  const { task } = detail;
  const input = h("input", { id: "task-title-input", name: "title", maxlength: "500", autocomplete: "off",
    value: task.display_title || "", placeholder: task.packet.task });
  const save = h("button", { type: "submit", class: "small primary", text: "Rename" });
  const error = errorSlot();
  const setTitle = (title) => act(save, error, async () => {
    await post(`/api/tasks/${seg(task.id)}/title`, { title });
    announce(title ? `Renamed to ${title}` : "The task shows its own words again");
    reload();
  });
  const form = h("form", { class: "row-form title-form" }, field("Display title", input, "Only the name people and agents see changes: the packet stays as it was."),
    h("div", { class: "button-row" }, save,
      task.display_title ? h("button", { type: "button", class: "small", text: "Use the task's own words", onclick: () => setTitle(null) }) : null),
    error);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    setTitle(input.value.trim() || null);
  });
  const open = !known.cancellable.includes(task.state) ? null : detail.siblings;
  let waits = null;
  if (task.parent_task_id && open?.length) {
    const checks = open.map((s) => h("label", { class: "check" },
      h("input", { type: "checkbox", value: s.id, checked: detail.blocked_by.includes(s.id) }),
      ` ${s.title} `, stateBadge(s.state)));
    const saveWaits = h("button", { type: "submit", class: "small", text: "Save what it waits on" });
    const waitsError = errorSlot();
    waits = h("form", { class: "waits-form" },
      h("fieldset", { class: "checks" }, h("legend", { text: "Waits on (other sub-tasks of the same parent)" }), checks),
      saveWaits, waitsError);
    waits.addEventListener("submit", (e) => {
      e.preventDefault();
      const blocked_by = [...waits.querySelectorAll("input:checked")].map((i) => i.value);
      act(saveWaits, waitsError, async () => {
        await post(`/api/tasks/${seg(task.id)}/blocked-by`, { blocked_by });
        announce(blocked_by.length ? `Waits on ${blocked_by.length} sub-task${blocked_by.length > 1 ? "s" : ""}` : "Waits on nothing");
        reload();
      });
    });
  }
  return h("details", { class: "card names-box" }, h("summary", { text: task.parent_task_id ? "Rename the task, or set what it waits on" : "Rename the task" }),
    form, waits);
}

/** The parent's own sub-tasks, each with its state and whether it is blocked. */
function subtasksSection(ctx, subtasks) {
  return h("section", { class: "section", "aria-labelledby": "subtasks-heading" },
    h("h2", { id: "subtasks-heading", text: `Sub-tasks (${subtasks.length})` }),
    h("ul", { class: "subtask-list" }, subtasks.map((s) => h("li", { dataset: { taskId: s.id } },
      h("a", { href: `#/p/${ctx.slug}/tasks/${s.id}`, text: s.title }), " ", stateBadge(s.state),
      s.blocked.length ? [" ", badge("blocked", "warn", `Waits on ${s.blocked.length} other sub-task${s.blocked.length > 1 ? "s" : ""}`)] : null,
      h("span", { class: "muted small", text: ` → ${s.assignee}` })))));
}

function siblingTitle(detail, id) {
  return detail.siblings?.find((s) => s.id === id)?.title || id;
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
    case "returned":
      return `Returned by ${task.assignee}: it waits for ${you(requester)} to hand it to another agent.`;
    default:
      return `This task is ${task.state}.`;
  }
}

/** A returned task goes on to another agent of the project, through that agent's owner's gate. */
function reassignForm(ctx, task, reload) {
  const others = (ctx.project.data()?.agents || []).filter((a) => a.agent_id !== task.assignee && a.agent_id !== task.requester);
  if (!others.length) return h("p", { class: "muted small", text: "No other agent in the project can take it yet." });
  const to = select(others.map((a) => [a.agent_id, `${a.name} (${a.agent_id})`]), { name: "to" });
  const submit = h("button", { type: "submit", class: "primary", text: "Hand to this agent" });
  const error = errorSlot();
  const form = h("form", { class: "inline-form reassign-form" },
    h("p", { text: `It came back from ${task.assignee}. Hand it to another agent; its owner's gate decides.` }),
    field("Agent", to), submit, error);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const out = await act(submit, error, () => post(`/api/tasks/${seg(task.id)}/reassign`, { to: to.value }));
    if (out) {
      announce(`Handed to ${to.value}: ${out.gate.decision === "allow" ? "routed" : words(out.gate.decision)}`);
      reload();
    }
  });
  return form;
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
    settle(result, text, [approve, deny, standing]);
    card.classList.add("decided");
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
    markdownWithRaw(sub.summary, { class: "submission-summary" }),
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
    markdownWithRaw(cp.progress || ""),
    list("Decisions", cp.decisions),
    list("Files touched", cp.files_touched, "code-list"),
    list("Next steps", cp.next_steps),
    list("Open questions", cp.open_questions));
}
