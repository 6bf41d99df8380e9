// makeaction.js — a make-or-spend Approve card: what an agent proposes to make or spend
// (the action, its prompt, the cost it expects), where it stands, and Approve / Decline
// for its owner while it is proposed. The card redraws in place as it changes
// (card.updateAction(action), fed by the stream's action.updated events).

import { post, seg } from "./api.js";
import { h, badge, timeEl, errorSlot, act, fill, announce, words, ownerOf } from "./ui.js";

const STATUS = {
  proposed: ["waiting for your decision", "attention"],
  approved: ["approved", "ok"],
  declined: ["declined", "muted"],
  expired: ["expired", "muted"],
  running: ["running", "work"],
  done: ["done", "ok"],
  failed: ["failed", "danger"],
};

const TOOL = { image_gen: "image generation" };

const FAILURE = {
  not_allowed_here: "not allowed here", expired: "the approval lapsed", unavailable: "the tool was unavailable",
  stopped: "stopped", no_result: "it made nothing", error: "an error",
};

// ---- lifecycle ------------------------------------------------------------------------------------

/** The card for one action. me: the viewer's handle; owner: the proposing agent's owner (who decides);
 *  room: the room's slug; messageId: the message carrying the card, given when it is shown outside
 *  the room (the home page) to link back to it. onDecided(action) runs after a decision here. */
export function actionCard(action, { me, owner, room, messageId = null, onDecided = null } = {}) {
  const el = h("article", { class: "action-card", tabindex: "-1", dataset: { actionId: action.id } });
  const ctx = { el, me, owner: owner || ownerOf(action.agent_id), room, messageId, onDecided, note: null };
  el.updateAction = (next) => draw(ctx, next);
  draw(ctx, action);
  return el;
}

// ---- actions --------------------------------------------------------------------------------------

async function decide(ctx, action, decision, button, error) {
  const out = await act(button, error, () => post(`/api/actions/${seg(action.id)}`, { decision }));
  if (!out) return;
  ctx.note = decision === "approve"
    ? "Approved: the agent may run it once. Its result will be posted in your room."
    : "Declined: nothing will run.";
  ctx.noteFor = out.action.status; // the note says what just happened; it goes once the card moves on
  draw(ctx, out.action);
  announce(ctx.note);
  ctx.el.querySelector(".action-note")?.focus();
  ctx.onDecided?.(out.action);
}

// ---- rendering ------------------------------------------------------------------------------------

function draw(ctx, action) {
  const { el } = ctx;
  if (ctx.note && action.status !== ctx.noteFor) ctx.note = null;
  const hadFocus = el.contains(document.activeElement);
  const [label, kind] = STATUS[action.status] || [words(action.status), "muted"];
  el.dataset.status = action.status;
  el.setAttribute("aria-label", `Proposed action: ${action.action}`);
  el.classList.toggle("decided", action.status !== "proposed");
  const row = (term, ...value) => [h("dt", { text: term }), h("dd", {}, ...value)];
  const mine = ctx.me && ctx.me === ctx.owner;
  let buttons = null;
  const error = errorSlot();
  if (action.status === "proposed" && mine) {
    const approve = h("button", { type: "button", class: "primary", text: "Approve" });
    const decline = h("button", { type: "button", class: "danger-quiet", text: "Decline" });
    approve.addEventListener("click", () => decide(ctx, action, "approve", approve, error));
    decline.addEventListener("click", () => decide(ctx, action, "decline", decline, error));
    buttons = h("div", { class: "button-row" }, approve, decline);
  }
  const result = action.result_message_id ? messageLink(ctx.room, action.result_message_id, "see the result") : null;
  fill(el,
    h("div", { class: "action-head" },
      h("span", { class: "action-kicker", text: "Make-or-spend action" }),
      statusBadge(label, kind)),
    h("p", { class: "action-title", text: action.action }),
    h("dl", { class: "facts action-facts" },
      row("Tool", h("code", { text: action.tool }), TOOL[action.tool] ? h("span", { class: "muted", text: ` ${TOOL[action.tool]}` }) : null),
      row("Prompt", h("span", { class: "pre action-prompt", text: action.inputs?.prompt ?? "" })),
      row("Cost", action.cost_estimate ? h("span", { text: action.cost_estimate })
        : h("span", { class: "muted", text: "no estimate given" }),
      // the server set it when proposed: above the cost its owner set, approving asks "Confirm it's you"
      action.step_up ? h("span", { class: "muted step-up-note", text: " · approving asks you to confirm it's you" }) : null),
      row("Proposed by", h("span", { text: action.agent_id })),
      action.status === "proposed" ? row("Lapses", timeEl(action.expires_at, true)) : null,
      action.decided_by ? row(action.status === "declined" ? "Declined by" : "Approved by",
        h("span", { text: `@${action.decided_by} · ` }), timeEl(action.decided_at)) : null,
      action.failure ? row("Failure", h("span", { class: "warn-text", text: FAILURE[action.failure] || words(action.failure) })) : null,
      result ? row("Result", result) : null),
    action.status === "proposed" && !mine
      ? h("p", { class: "muted small", text: `Waiting for @${ctx.owner} to approve or decline.` }) : null,
    buttons,
    error,
    h("p", { class: "action-note notice ok", role: "status", tabindex: "-1", hidden: !ctx.note, text: ctx.note || "" }),
    ctx.messageId ? h("p", { class: "small action-where" }, messageLink(ctx.room, ctx.messageId, "Open it in your room")) : null);
  if (hadFocus && !el.contains(document.activeElement)) {
    (el.querySelector("button") || (ctx.note ? el.querySelector(".action-note") : el)).focus();
  }
}

function statusBadge(label, kind) {
  const el = badge(label, kind);
  el.classList.add("action-status");
  return el;
}

/** A link to a message of a room: scrolls to it when it is on this page, else opens the room there. */
function messageLink(room, messageId, text) {
  const a = h("a", { href: `#/p/${room}/room/${messageId}`, text });
  a.addEventListener("click", (e) => {
    const target = document.getElementById(`msg-${messageId}`);
    if (!target) return;
    e.preventDefault();
    target.scrollIntoView({ block: "center" });
    target.focus();
    target.classList.add("flash");
    setTimeout(() => target.classList.remove("flash"), 1500);
  });
  return a;
}
