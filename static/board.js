// board.js — a project's task board: its tasks by state in columns or as one list, the filters
// (FILTERS) and "Needs me", whose choices stay in the address (?view=…), the handoffs held for
// your decision, and asking one of your own agents for a task.

import { get, post, seg } from "./api.js";
import * as stream from "./stream.js";
import { onChange as onInboxChange, items as inboxItems, reload as reloadInbox, tasksNeedingMe } from "./inbox_store.js";
import { approvalCard } from "./decisions.js";
import { taskLists, taskState, titleOf, requesterText } from "./task_common.js";
import { h, heading, field, select, errorSlot, act, fill, badge, timeEl, ago, words, lines, debounce, loadFailed } from "./ui.js";

// ---- lifecycle --------------------------------------------------------------------------------

/** #/p/SLUG/tasks */
export function mount(el, ctx) {
  const state = { tasks: new Map(), columns: [], blocked: {} };
  const choice = boardChoice(ctx.query);
  const board = h("div", { class: "board" }, h("p", { class: "muted", text: "Loading tasks…" }));
  const filters = h("form", { class: "board-filters", "aria-label": "Filter the tasks" });
  const error = errorSlot();
  const approvals = h("div", { class: "stack" });
  const approvalsSection = h("section", { class: "section", "aria-labelledby": "board-approvals", hidden: true },
    h("h2", { id: "board-approvals", text: "Waiting for your decision" }), approvals);
  // "Needs me": only the cards the inbox lists as waiting on you.
  const needsMe = h("button", { type: "button", class: "chip needs-me-filter", "aria-pressed": "false", text: "Needs me" });
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

// ---- rendering --------------------------------------------------------------------------------

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

// ---- internal ---------------------------------------------------------------------------------

function upsert(map, task) {
  if (!task) return false;
  const have = map.get(task.id);
  if (have && (have.updated_at || "") > (task.updated_at || "")) return false;
  map.set(task.id, task);
  return true;
}
