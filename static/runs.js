// runs.js — a task's runs on its page: each attempt (state, started, the runner's device),
// and for the assignee's owner Start a run (after confirming it's them), Stop, hand the task
// back (with a reason if they like), and settling a run its runner couldn't vouch for.

import { post, seg } from "./api.js";
import { h, uid, errorSlot, act, badge, timeEl, confirmButton, announce, empty } from "./ui.js";
import { reasonedMove } from "./decisions.js";
import { pausedSentence } from "./pauses.js";

const RUN_KIND = { running: "work", finished: "ok", stopped: "warn", replaced: "muted", uncertain: "attention",
  abandoned: "muted", failed: "danger", waiting: "attention" };

/** What a run's state is, in words: a run waiting on its owner's step says so, a failed one why, a paused one that. */
function runState(run, paused) {
  if (paused && run.state === "running") return ["paused: stops at its next call", "waiting"];
  if (run.waiting_on_step) return ["waiting for your step", "waiting"];
  if (run.state === "failed") return [`failed: ${(run.failure || "see the runner's log").replaceAll("_", " ")}`, "failed"];
  return [run.state, run.state];
}

// ---- rendering ---------------------------------------------------------------------------

/** The Runs section of a task's page. */
export function runsSection(ctx, detail, reload) {
  const { task, runs = [], run_control: control, assignee_paused: paused } = detail;
  const rows = runs.map((run) => runRow(run, control, reload, run.agent_id && run.agent_id !== task.assignee ? null : paused));
  return h("section", { class: "section runs", "aria-labelledby": "runs-heading" },
    h("h2", { id: "runs-heading", text: "Runs" }),
    runs.length
      ? h("table", { class: "runs-table" },
        h("thead", {}, h("tr", {}, ["Attempt", "State", "Started", "Device", ""].map((t) => h("th", { scope: "col", text: t })))),
        h("tbody", {}, rows))
      : empty("No run yet."),
    paused && !control ? h("p", { class: "notice paused-note", text: pausedSentence(task.assignee, paused) }) : null,
    control ? controls(ctx, task, control, reload) : null);
}

function runRow(run, control, reload, paused) {
  const settle = control && run.state === "uncertain" ? settleButtons(run, reload) : null;
  return h("tr", { dataset: { attemptId: run.attempt_id, state: run.state } },
    h("td", { "data-label": "Attempt", text: run.purpose === "verify" ? `#${run.attempt}, verifying (${run.agent_id})` : `#${run.attempt}` }),
    h("td", { "data-label": "State" }, (([text, kind]) => badge(text, RUN_KIND[kind] || "muted"))(runState(run, paused))),
    h("td", { "data-label": "Started" }, timeEl(run.claimed_at, true)),
    h("td", { "data-label": "Device", text: run.device || "—" }),
    h("td", { "data-label": "" }, settle));
}

function settleButtons(run, reload) {
  const error = errorSlot();
  const make = (outcome, label) => {
    const b = h("button", { type: "button", class: "small", text: label });
    b.addEventListener("click", () => act(b, error, async () => {
      await post(`/api/attempts/${seg(run.attempt_id)}/settle`, { outcome });
      announce(`Run settled as ${outcome}`);
      reload();
    }));
    return b;
  };
  return h("div", { class: "settle" },
    h("span", { class: "muted small", text: "Its runner can't vouch for it: " }),
    make("finished", "It finished"), make("abandoned", "Abandon it"), error);
}

function controls(ctx, task, control, reload) {
  const error = errorSlot();
  const parts = [];
  if (control.paused) {
    parts.push(h("p", { class: "notice", text: control.paused === "operator"
      ? "The server's operator paused every agent: nothing runs until they resume."
      : control.pause_scope === "owner" ? "You paused all your agents: nothing runs until you resume them (Agents & keys)."
        : `You paused ${task.assignee}: nothing of it runs until you resume it (Agents & keys, or the paused chip at the top).` }));
  }
  if (control.run_approved) parts.push(h("p", { class: "muted", text: "A run was started: waiting for the runner to pick it up." }));
  if (control.can_stop) {
    parts.push(confirmButton("Stop", "Click again to stop the run", (button) => act(button, error, async () => {
      await post(`/api/tasks/${seg(task.id)}/stop`, {});
      announce("Run stopped");
      reload();
    }), { class: "danger-quiet", "aria-label": "Stop the run" }));
  }
  if (control.can_start) parts.push(startForm(ctx, task, control, error, reload));
  if (control.can_hand_back && !control.can_stop) {
    parts.push(reasonedMove({ summary: "Hand the task back…", label: "Hand the task back",
      confirmLabel: "Click again to hand it back", fieldLabel: "Why it goes back", className: "hand-back",
      run: async (reason) => {
        await post(`/api/tasks/${seg(task.id)}/hand-back`, reason ? { reason } : {});
        announce("Task handed back");
        reload();
      } }));
  }
  return h("div", { class: "run-controls" }, parts, error);
}

function startForm(ctx, task, control, error, reload) {
  // The server asks "Confirm it's you" first when this browser has not lately (the dialog, stepup.js).
  const start = h("button", { type: "submit", class: "primary", text: "Start a run", disabled: !control.runner_connected });
  const hintId = uid("start-hint");
  start.setAttribute("aria-describedby", hintId);
  const form = h("form", { class: "start-run" },
    h("p", { class: "hint", id: hintId, text: control.runner_connected
      ? `Starts one run of ${task.assignee}: its runner claims the task and launches the agent on your computer. `
        + "You confirm it's you first."
      : "No runner is connected for this agent: run prickle runner connect on the computer first." }),
    start);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    act(start, error, async () => {
      await post(`/api/tasks/${seg(task.id)}/runs`, {});
      announce("Run started");
      reload();
    });
  });
  return form;
}
