// steps.js — a step one of your agents' runs asks to take before a destructive, spending or
// outbound call: the exact call (the tool and its input, as JSON text), what the run says
// it is (kind, target, amount, reason), and Allow / Refuse. Allowing lets exactly that call
// through once, within 15 minutes; the run is woken either way.

import { get, post, seg } from "./api.js";
import { h, badge, timeEl, errorSlot, act, settle, words } from "./ui.js";

const KIND = { destructive: "danger", spending: "warn", outbound: "info" };

// ---- actions ----------------------------------------------------------------------------------------

/** The steps waiting for the signed-in person's decision, oldest first. */
export async function pendingSteps() {
  return (await get("/api/steps")).steps || [];
}

const tasks = new Map(); // task id -> Promise of {project, title} | null (a step names only its task)

/** The project and title of a step's task (asked once per task). */
export function taskOf(taskId) {
  if (!tasks.has(taskId)) {
    tasks.set(taskId, get(`/api/tasks/${seg(taskId)}`)
      .then(({ task }) => ({ project: task.project, title: task.display_title || task.packet.task }))
      .catch(() => { tasks.delete(taskId); return null; }));
  }
  return tasks.get(taskId);
}

// ---- rendering ----------------------------------------------------------------------------------------

/** A step with Allow / Refuse. task: {project, title} to link to it (left out on the task's own page).
 *  onDecided(step) runs after a decision. */
export function stepCard(step, { task = null, onDecided = null, embedded = false } = {}) {
  const error = errorSlot();
  const allow = h("button", { type: "button", class: "primary", text: "Allow" });
  const refuse = h("button", { type: "button", class: "danger-quiet", text: "Refuse" });
  const result = h("p", { class: "notice ok", role: "status", tabindex: "-1", hidden: true });
  const input = JSON.stringify(step.input ?? {}, null, 2);
  const row = (term, value) => (value == null || value === "" ? null : [h("dt", { text: term }), h("dd", {}, value)]);
  const amount = step.amount ? `${step.amount.value} ${step.amount.unit}` : null;
  const card = h("article", {
    class: `step${embedded ? "" : " card"}`, dataset: { stepId: step.id, taskId: step.task_id },
    "aria-label": `Step asked by ${step.agent_id}: ${step.tool_name}`,
  },
  h("div", { class: "approval-head" },
    badge("asks before a step", "attention"),
    step.kind ? badge(words(step.kind), KIND[step.kind] || "muted") : null,
    task ? h("span", { class: "muted small", text: task.project }) : null,
    h("span", { class: "muted small" }, "asked ", timeEl(step.created_at, true))),
  task ? h("h3", { class: "approval-title" }, h("a", { href: `#/p/${task.project}/tasks/${step.task_id}`, text: task.title })) : null,
  h("p", { class: "muted", text: `${step.agent_id}'s run stopped before this call and asks you first:` }),
  h("div", { class: "step-call" },
    h("div", { class: "step-tool" }, h("span", { class: "muted small", text: "Tool " }), h("code", { class: "step-tool-name", text: step.tool_name })),
    h("pre", { class: "code step-input", "aria-label": `Input of ${step.tool_name}`, text: input })),
  h("dl", { class: "facts step-facts" },
    row("Kind", step.kind ? words(step.kind) : h("span", { class: "muted", text: "not said" })),
    row("Target", step.target),
    row("Amount", amount),
    row("Reason", step.reason ? h("span", { class: "pre", text: step.reason }) : h("span", { class: "muted", text: "not given" }))),
  h("div", { class: "button-row" }, allow, refuse),
  h("p", { class: "hint", text: "Allow lets exactly this call through once, within 15 minutes. Refuse, and the run goes on without it." }),
  error, result);

  const done = (out, text) => {
    if (!out) return;
    settle(result, text, [allow, refuse]);
    card.classList.add("decided");
    card.dataset.decision = out.step.status;
    onDecided?.(out.step);
  };
  const decide = (decision) => post(`/api/steps/${seg(step.id)}`, { decision });
  allow.addEventListener("click", async () => done(await act(allow, error, () => decide("allow")),
    "Allowed: the run may make exactly this call once, within 15 minutes."));
  refuse.addEventListener("click", async () => done(await act(refuse, error, () => decide("deny")),
    "Refused: the run will go on without this call."));
  return card;
}
