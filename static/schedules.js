// schedules.js — your schedules, in your private room: each asks one of your agents for a task at
// its times (its next run, its last run and how that went), and the form that makes or edits one.
//
// GET /api/room/schedules says where things stand and what you may do with each schedule (`can`);
// the server checks every rule. The form only turns its choices into a recurrence
// ({freq, byweekday, bymonthday, interval, hour, minute}); the server says it back in words (`says`).

import { get, post, del, seg } from "./api.js";
import * as stream from "./stream.js";
import { h, field, select, errorSlot, act, fill, announce, debounce, loadFailed, timeEl, badge, stateBadge,
  confirmButton } from "./ui.js";

const DAYS = [["mo", "Mon"], ["tu", "Tue"], ["we", "Wed"], ["th", "Thu"], ["fr", "Fri"], ["sa", "Sat"], ["su", "Sun"]];

const OFTEN = [["weekdays", "Every weekday"], ["daily", "Every day"], ["weekly", "Every week on…"],
  ["monthly", "Every month on day…"], ["hours", "Every few hours"]];

const STATE_KIND = { active: "ok", paused: "warn", stopped: "danger" };

const OUTCOME = {
  agent_paused: "not asked: the agent was paused",
  limit: "not asked: a runs-a-day limit was reached",
  failed: "not asked: it failed",
  stopped: "stopped",
};

// ---- lifecycle ---------------------------------------------------------------------------------

/** The schedules card for your room: {el, destroy()}. */
export function createSchedules(ctx) {
  const state = { view: null, editing: null };
  const list = h("ul", { class: "plain schedule-list" });
  const status = h("p", { class: "muted small", role: "status" });
  const add = h("button", { type: "button", class: "small primary", text: "New schedule" });
  const slot = h("div", { class: "schedule-form-slot" });
  const el = h("section", { class: "schedules card", "aria-labelledby": "schedules-heading" },
    h("div", { class: "schedules-head" }, h("h2", { id: "schedules-heading", text: "Schedules" }), add),
    h("p", { class: "muted small", text: "Ask one of your agents for a task at set times. Making one, and a bigger change, asks you to confirm it's you." }),
    status, list, slot);
  Object.assign(state, { list, status, slot, add });
  add.addEventListener("click", () => openForm(state, null));

  const refresh = debounce(() => load(state), 300);
  const offs = [stream.on("schedule.updated", refresh), stream.on("task.updated", refresh)];
  load(state);
  return {
    el,
    destroy() {
      refresh.cancel();
      for (const off of offs) off();
    },
  };
}

// ---- actions -----------------------------------------------------------------------------------

async function load(state) {
  try {
    show(state, await get("/api/room/schedules"));
  } catch (err) {
    fill(state.list, h("li", {}, loadFailed(err, () => load(state))));
  }
}

async function change(state, button, error, run, said) {
  const out = await act(button, error, run);
  if (!out) return;
  announce(said);
  await load(state);
}

// ---- rendering ---------------------------------------------------------------------------------

function show(state, view) {
  state.view = view;
  const { limits } = view;
  state.status.textContent = `${limits.runs_a_day_used} of ${limits.runs_a_day_per_owner} runs a day in use; one schedule may have up to ${limits.runs_a_day_per_schedule}.`;
  fill(state.list, view.schedules.length ? view.schedules.map((s) => item(state, s))
    : h("li", { class: "muted", text: "No schedules yet." }));
}

function item(state, s) {
  const error = errorSlot();
  const buttons = [];
  if (s.can.includes("edit")) {
    const edit = h("button", { type: "button", class: "small", text: "Edit", "aria-label": `Edit schedule: ${s.text}` });
    edit.addEventListener("click", () => openForm(state, s));
    buttons.push(edit);
  }
  for (const [verb, label, said] of [["pause", "Pause", "Schedule paused"], ["resume", "Resume", "Schedule resumed"]]) {
    if (!s.can.includes(verb)) continue;
    const b = h("button", { type: "button", class: "small", text: label, "aria-label": `${label} schedule: ${s.text}` });
    b.addEventListener("click", () => change(state, b, error,
      () => post(`/api/room/schedules/${seg(s.id)}/${verb}`, { version: s.version }), said));
    buttons.push(b);
  }
  buttons.push(confirmButton("Delete", "Click again to delete", (b) => change(state, b, error,
    () => del(`/api/room/schedules/${seg(s.id)}?version=${s.version}`), "Schedule deleted"),
  { class: "danger-quiet small", "aria-label": `Delete schedule: ${s.text}` }));
  return h("li", { class: "schedule", dataset: { scheduleId: s.id, state: s.state } },
    h("div", { class: "schedule-top" }, h("strong", { class: "schedule-text", text: s.text }),
      badge(s.state, STATE_KIND[s.state] || "muted")),
    h("p", { class: "small schedule-when", text: `${s.says} (${s.timezone})` }),
    h("p", { class: "small muted", text: `${s.agent} in ${s.project}` }),
    next(s), last(s),
    h("div", { class: "schedule-actions" }, buttons), error);
}

function next(s) {
  if (s.state === "stopped") {
    const why = { agent_left: "its agent is no longer in its project", owner_removed: "you are no longer a member of its project",
      project_deleted: "its project was deleted" };
    return h("p", { class: "small schedule-next warn-text", text: `Stopped: ${why[s.stop_reason] || s.stop_reason}. Fix that, then resume it.` });
  }
  if (s.state === "paused") return h("p", { class: "small schedule-next", text: "Paused: nothing runs until you resume it." });
  return h("p", { class: "small schedule-next" }, "Next run: ", zoned(s.next_run_at, s.timezone));
}

/** A run's time in the schedule's own zone, the zone named (as its recurrence is said); the
 *  browser's own time in its title. A zone this browser does not know falls back to its own time. */
function zoned(iso, zone) {
  if (!iso) return timeEl(iso);
  let text;
  try {
    text = new Intl.DateTimeFormat(undefined, { timeZone: zone, weekday: "short", day: "numeric", month: "short",
      hour: "2-digit", minute: "2-digit", hourCycle: "h23" }).format(new Date(iso));
  } catch {
    return timeEl(iso);
  }
  const yours = new Intl.DateTimeFormat(undefined, { day: "numeric", month: "short", year: "numeric",
    hour: "2-digit", minute: "2-digit", timeZoneName: "short" });
  return h("time", { datetime: iso, title: `Your time: ${yours.format(new Date(iso))}`, text: `${text} (${zone})` });
}

function last(s) {
  const run = s.last_run;
  if (!run) return h("p", { class: "small muted schedule-last", text: "Last run: not yet." });
  const parts = ["Last run: ", zoned(run.at, s.timezone), " — "];
  if (run.outcome === "asked") {
    parts.push("asked ", h("a", { href: `#/p/${encodeURIComponent(s.project)}/tasks/${encodeURIComponent(run.task_id)}`, text: "its task" }),
      " ", stateBadge(run.task_state));
  } else {
    parts.push(OUTCOME[run.outcome] || run.outcome, run.detail ? ` (${run.detail})` : "");
  }
  if (run.missed) parts.push(h("span", { class: "muted" }, ` · ran late after downtime, once for ${run.missed} missed time${run.missed === 1 ? "" : "s"}`));
  return h("p", { class: "small schedule-last" }, parts);
}

// ---- the form: make or edit --------------------------------------------------------------------

function openForm(state, s) {
  const agents = state.view?.agents || [];
  const zone = Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC";
  const agent = select(agents.map((a) => [a.agent_id, a.projects.length ? `${a.name} (${a.agent_id})` : `${a.name} (${a.agent_id}): in no team project`]), { name: "agent" });
  const project = h("select", { name: "project" });
  const text = h("textarea", { name: "text", rows: 3, maxlength: 500, required: true, placeholder: "What should the agent do each time?" });
  const often = select(s ? [["keep", `As it is: ${s.says}`], ...OFTEN] : OFTEN, { name: "often" });
  const at = h("input", { type: "time", name: "at", value: "09:00", required: true });
  const days = h("fieldset", { class: "schedule-days" }, h("legend", { text: "On" }),
    DAYS.map(([value, label]) => h("label", { class: "day" }, h("input", { type: "checkbox", name: "day", value }), ` ${label}`)));
  const monthday = h("input", { type: "number", name: "monthday", min: 1, max: 31, value: 1 });
  const hours = h("input", { type: "number", name: "hours", min: 1, max: 24, value: 2 });
  const timezone = h("input", { name: "timezone", value: s ? s.timezone : zone, list: "schedule-zones", autocomplete: "off", spellcheck: "false" });
  const zones = h("datalist", { id: "schedule-zones" },
    (Intl.supportedValuesOf ? Intl.supportedValuesOf("timeZone") : [zone]).map((z) => h("option", { value: z })));
  const fields = {
    at: field("At", at), days, monthday: field("Day of the month", monthday),
    hours: field("Every how many hours", hours),
  };
  const error = errorSlot();
  const save = h("button", { type: "submit", class: "small primary", text: s ? "Save changes" : "Make schedule" });
  const cancel = h("button", { type: "button", class: "small", text: "Cancel" });
  const form = h("form", { class: "schedule-form", "aria-label": s ? "Edit schedule" : "New schedule" },
    field("Agent", agent), field("Asked in", project, "The team project where the task is asked and worked."),
    field("What to do", text), field("How often", often), fields.at, days, fields.monthday, fields.hours,
    field("Time zone", timezone, "Times are kept in this zone, daylight saving included."), zones,
    h("div", { class: "schedule-actions" }, save, cancel), error);

  const drawProjects = () => {
    const a = agents.find((x) => x.agent_id === agent.value);
    fill(project, (a?.projects || []).map((p) => h("option", { value: p, text: p })));
  };
  const drawOften = () => {
    const v = often.value;
    fields.at.hidden = v === "hours" || v === "keep";
    days.hidden = v !== "weekly";
    fields.monthday.hidden = v !== "monthly";
    fields.hours.hidden = v !== "hours";
  };
  agent.addEventListener("change", drawProjects);
  often.addEventListener("change", drawOften);
  if (s) {
    agent.value = s.agent;
    drawProjects();
    project.value = s.project;
    text.value = s.text;
  } else {
    agent.value = (agents.find((a) => a.projects.length) || agents[0] || {}).agent_id || "";
    drawProjects();
  }
  drawOften();
  cancel.addEventListener("click", () => { fill(state.slot); state.add.focus(); });
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const body = { agent: agent.value, project: project.value, text: text.value, timezone: timezone.value };
    const recurrence = recurrenceOf(often.value, at.value, [...days.querySelectorAll("input:checked")].map((c) => c.value),
      Number(monthday.value), Number(hours.value));
    if (recurrence) body.recurrence = recurrence;
    const run = s
      ? () => post(`/api/room/schedules/${seg(s.id)}`, { version: s.version, ...changed(s, body) })
      : () => post("/api/room/schedules", body);
    const out = await act(save, error, run);
    if (!out) return;
    fill(state.slot);
    announce(s ? "Schedule saved" : "Schedule made");
    await load(state);
  });
  fill(state.slot, form);
  text.focus();
}

/** The form's choice as a recurrence (null: keep the schedule's own). */
function recurrenceOf(often, at, days, monthday, hours) {
  const [hour, minute] = (at || "09:00").split(":").map(Number);
  switch (often) {
    case "keep": return null;
    case "weekdays": return { freq: "weekly", byweekday: ["mo", "tu", "we", "th", "fr"], hour, minute };
    case "daily": return { freq: "daily", hour, minute };
    case "weekly": return { freq: "weekly", byweekday: days, hour, minute };
    case "monthly": return { freq: "monthly", bymonthday: [monthday], hour, minute };
    default: return { freq: "hourly", interval: hours };
  }
}

/** Only what the edit changes (the server asks to confirm it's you for some changes, not others). */
function changed(s, body) {
  const out = {};
  for (const key of ["agent", "project", "text", "timezone"]) if (body[key] !== s[key]) out[key] = body[key];
  if (body.recurrence) out.recurrence = body.recurrence;
  return out;
}
