// decisions.js — the decisions a person makes on a task: approve or deny a handoff their gate
// holds (or approve it and let more like it through), give final acceptance to a verified result
// next to each criterion's evidence (with gaps in it, an armed confirm names them first), send it
// back with a reason, cancel it (with a reason if they like), and hand a returned task to another
// agent of the project.

import { post, seg } from "./api.js";
import { titleOf, requesterText, actorText } from "./task_common.js";
import { plainText } from "./markdown.js";
import { criteriaEvidence } from "./evidence.js";
import { h, field, select, errorSlot, act, badge, timeEl, words, confirmButton, announce, settle, uid } from "./ui.js";

// ---- actions ----------------------------------------------------------------------------------

async function decide(approvalId, decision, standing) {
  const body = { decision };
  if (standing) body.standing = standing;
  return post(`/api/approvals/${seg(approvalId)}`, body);
}

// ---- rendering --------------------------------------------------------------------------------

/** A held handoff with Approve / Deny (and an optional standing approval). */
export function approvalCard(item, { showProject = false, onDecided, embedded = false } = {}) {
  const { approval, task } = item;
  const error = errorSlot();
  const approve = h("button", { type: "button", class: "primary", text: "Approve" });
  // Denying rejects the task for good: the button asks once more (a second click within 5 s).
  const deny = confirmButton("Deny", "Deny: reject the task?", async (button) => done(
    await act(button, error, () => decide(approval.id, "deny")), "Denied: the task was rejected.", "denied"),
  { class: "danger-quiet" });
  const uses = h("input", { type: "number", min: "1", max: "100", value: "5", inputmode: "numeric" });
  const days = h("input", { type: "number", min: "1", max: "90", value: "7", inputmode: "numeric" });
  const standing = h("button", { type: "button", text: "Approve and allow more like it" });
  const result = h("p", { class: "notice ok", role: "status", hidden: true });
  const held = badge("held by your gate", "attention");
  const expires = h("span", { class: "muted small" }, "expires ", timeEl(approval.expires_at, true));
  const head = h("div", { class: "approval-head" }, held,
    showProject ? h("span", { class: "muted small", text: approval.project }) : null, expires);
  const card = h("article", { class: `approval${embedded ? "" : " card"}`, dataset: { approvalId: approval.id, taskId: task.id } },
    head,
    h("h3", { class: "approval-title" },
      h("a", { href: `#/p/${task.project}/tasks/${task.id}`, text: plainText(approval.summary || titleOf(task)) })),
    h("p", { class: "muted", text: `${requesterText(task)} asks your agent ${task.assignee} for ${words(task.packet.deliverable_type)} work.` }),
    h("ul", { class: "criteria-brief" }, task.packet.acceptance_criteria.map((c) => h("li", { text: plainText(c) }))),
    h("div", { class: "button-row" }, approve, deny),
    h("details", { class: "standing" },
      h("summary", { text: "Let similar requests through without asking" }),
      h("p", { class: "muted small", text: `Later ${words(task.packet.deliverable_type)} requests from ${task.requester || "this person"} to ${task.assignee} pass the gate.` }),
      h("div", { class: "inline-fields" }, field("Up to (uses)", uses), field("For (days)", days)),
      standing),
    error, result);
  function done(out, text, status = "approved") {
    if (!out) return;
    settle(result, text, [approve, deny, standing]);
    held.replaceWith(badge(status, status === "approved" ? "ok" : "muted")); // no longer held, nor expiring
    expires.remove();
    card.classList.add("decided");
    onDecided?.(out, text);
  }
  approve.addEventListener("click", async () => done(await act(approve, error, () => decide(approval.id, "approve")),
    "Approved: the task went to the agent."));
  standing.addEventListener("click", async () => done(await act(standing, error, () => decide(approval.id, "approve",
    { uses: Number(uses.value), days: Number(days.value) })), "Approved, with a standing approval for more like it."));
  return card;
}

/**
 * Final acceptance of a verified result, or sending it back with a reason; right under the buttons,
 * each criterion with the evidence covering it (`view`: the task detail's criteria_evidence, drawn
 * by evidence.js under the ids `anchor`-c1…, `anchor`-e1…). `onDone(text)` hears what was done, so
 * the page can keep saying it once the panel is gone.
 */
export function finalDecision(ctx, task, reload, { view = null, anchor = "decide", onDone } = {}) {
  const error = errorSlot();
  const accept = h("button", { type: "button", class: "primary", text: "Give final acceptance" });
  const { lead, gaps } = coverage(task.result, task.packet.acceptance_criteria);
  const give = (button) => act(button, error, async () => {
    await post(`/api/tasks/${seg(task.id)}/accept`, {});
    announce("Accepted: the task is completed");
    onDone?.("You gave final acceptance: the task is completed.");
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
      announce(`Sent back to ${task.assignee}`);
      onDone?.(`Sent back to ${task.assignee} with your reason: it works on it again.`);
      reload();
    });
  });
  const verifier = task.result?.verified_by ? actorText(task.result.verified_by) : null;
  return h("div", { class: "decision" },
    h("p", { class: "decision-lead muted", text: `${verifier ? `${verifier} verified it. ` : ""}${lead}` }),
    h("div", { class: "button-row" }, accept), confirm, error,
    h("details", { class: "send-back-box" }, h("summary", { text: "Send it back with a reason" }), form),
    h("h3", { class: "decision-evidence-heading", text: "Each criterion and its evidence" }),
    criteriaEvidence(view, { anchor }) || h("p", { class: "muted", text: "Read the result's evidence below." }));
}

/**
 * What the final decision rests on: the lead names how many criteria fresh evidence covers (it
 * says every criterion is covered only when the evidence report is complete); `gaps` holds one
 * sentence per gap (uncovered criteria, stale evidence, no report), empty when complete. Which
 * evidence covers which criterion, the panel shows under its buttons (evidence.js).
 */
function coverage(result, criteria) {
  if (!result?.evidence_report) {
    const none = "No evidence report came with this result: read the evidence yourself before you accept.";
    return { lead: none, gaps: ["There is no evidence report."] };
  }
  const report = result.evidence_report;
  const stale = new Map((report.stale || []).map((s) => [s.evidence, s.why]));
  const fresh = criteria.filter((_, i) => (report.coverage?.find((c) => c.criterion === i)?.evidence || [])
    .some((e) => !stale.has(e))).length;
  const n = criteria.length;
  const lead = report.complete
    ? `Every criterion is covered by fresh evidence:`
    : fresh === n ? `Every criterion is covered by fresh evidence, but some evidence is stale; check it before you accept:`
      : `${fresh} of ${n} ${n === 1 ? "criterion is" : "criteria are"} covered by fresh evidence; check the gaps before you accept:`;
  const general = report.general || [];
  const staleGeneral = general.filter((g) => stale.has(g));
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
  return { lead, gaps };
}

/**
 * A move made with an optional reason: under `summary`, a field for why (shown on the task's page
 * with the move) and a button that asks once more. `run(reason)` posts it (reason: text or null).
 */
export function reasonedMove({ summary, label, confirmLabel, fieldLabel, run, className = "" }) {
  const error = errorSlot();
  const reason = h("input", { type: "text", maxlength: "1000", autocomplete: "off" });
  const button = confirmButton(label, confirmLabel, (b) => act(b, error, () => run(reason.value.trim() || null)),
    { class: "danger-quiet" });
  return h("details", { class: `reasoned-move ${className}`.trim() }, h("summary", { text: summary }),
    field(fieldLabel, reason, "Optional. Everyone who sees the task reads it."), button, error);
}

/** Cancel the task, with a reason if you like; the button asks once more before it does. */
export function cancelRow(task, reload, onDone) {
  return reasonedMove({ summary: "Cancel the task…", label: "Cancel task", confirmLabel: "Click again to cancel the task",
    fieldLabel: "Why it is cancelled", className: "cancel-row",
    run: async (reason) => {
      await post(`/api/tasks/${seg(task.id)}/cancel`, reason ? { reason } : {});
      announce("Task cancelled");
      onDone?.("You cancelled the task.");
      reload();
    } });
}

/** A returned task goes on to another agent of the project, through that agent's owner's gate. */
export function reassignForm(ctx, task, reload) {
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
