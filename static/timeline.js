// timeline.js — one task's timeline, oldest first, as a code review page has it: its creation,
// its thread's messages, checkpoints, results, runs, decisions and state changes, each in words
// for people. The server gives the entries in order (the task detail's `timeline`); a state change
// made by the same hand within a second of the entry before it rides on that entry's line (one each).

import { actorText, approvalWords } from "./task_common.js";
import { anchorLink } from "./evidence.js";
import { markdown, markdownWithRaw } from "./markdown.js";
import { h, badge, timeEl, words, STATE_LABEL } from "./ui.js";

// ---- words ----------------------------------------------------------------------------------------

/** Why a task came back (the server's code), in words. */
export const WHY = {
  owner_handed_back: "its agent's owner handed it back",
  agent_removed: "its agent was taken out of the project",
  member_left: "its agent's owner left the project",
  member_removed: "its agent's owner was removed from the project",
  member_erased: "its agent's owner closed their account",
};

const DECISION = {
  approved: () => "approved the handoff",
  denied: () => "denied the handoff",
  verified: (e) => `verified revision ${e.revision}`,
  accepted: (e) => `gave final acceptance to revision ${e.revision}`,
  accepted_by_policy: (e) => `accepted revision ${e.revision} by the auto-accept policy`,
  rejected: (e) => `rejected revision ${e.revision}`,
  sent_back: (e) => `sent revision ${e.revision} back`,
};

const GATE = { approval_required: "The gate held it for the assignee's owner to approve",
  allow: "The gate let it through", deny: "The gate refused it" };

/** What a person's or an agent's own move is called; any other reads "moved it → state". */
const MOVE = { cancel: "cancelled the task", hand_back: "handed the task back", accept: "took the task on",
  reassign: "handed it to another agent" };

const RUN_END = { finished: "ended", stopped: "was stopped", failed: "failed", abandoned: "was abandoned",
  replaced: "was replaced by a newer run", uncertain: "ended, and its runner can't vouch for it" };

/** A task's state in words (the board's labels). */
export function stateWords(state) {
  return STATE_LABEL[state] || words(state);
}

/** Who, in words: "you" for the person reading. */
export function who(ref, me) {
  if (ref?.kind === "person" && ref.handle === me) return "you";
  return actorText(ref) || "Prickle";
}

// ---- rendering ------------------------------------------------------------------------------------

/**
 * The timeline as an <ol class="task-timeline">. `detail` is GET /api/tasks/ID's answer (its
 * `timeline`, and its `checkpoints`, drawn in full); `me` the reader's handle; `slug` the project.
 */
export function timeline(detail, me, slug) {
  const checkpoints = new Map((detail.checkpoints || []).map((cp) => [cp.id, cp]));
  const items = [];
  let last = null; // the entry drawn last, and its <li>
  for (const entry of detail.timeline || []) {
    if (entry.kind === "state" && last && !last.rode && rides(entry, last.entry)) {
      last.rode = true; // one state change per entry
      last.li.querySelector(".tl-line").append(" ", stateChip(entry));
      const told = entry.reason === last.entry.reason; // a send-back's words are on its decision already
      if ((entry.reason && !told) || entry.why) last.li.append(reasonBlock({ ...entry, reason: told ? null : entry.reason }));
      continue;
    }
    const li = entryItem(entry, { me, slug, task: detail.task, checkpoints });
    items.push(li);
    last = { entry, li };
  }
  return h("ol", { class: "task-timeline" }, items);
}

/** A state change made by the same hand within a second of the entry before it (one call made both). */
function rides(state, before) {
  return before.kind !== "state" && before.kind !== "message" && before.kind !== "created"
    && Math.abs(Date.parse(state.at) - Date.parse(before.at)) < 1000
    && JSON.stringify(state.by) === JSON.stringify(before.by);
}

function stateChip(entry) {
  // "approval" after a verification is the final acceptance; before any work, the gate's hold (as the badge says).
  const to = entry.to !== "approval" ? stateWords(entry.to) : approvalWords(entry.from === "verifying");
  return h("span", { class: "tl-to" }, "→ ", badge(to, "muted"));
}

function reasonBlock(entry) {
  return h("div", { class: "tl-reason" },
    entry.reason ? h("blockquote", { class: "tl-words", text: entry.reason }) : null,
    entry.why ? h("p", { class: "muted small", text: `Why: ${WHY[entry.why] || words(entry.why)}.` }) : null);
}

function entryItem(entry, { me, slug, task, checkpoints }) {
  const by = who(entry.by, me);
  const line = h("p", { class: "tl-line" }, h("strong", { class: "tl-who", text: by }), " ");
  const li = h("li", { class: `tl-entry tl-${entry.kind}`, dataset: { kind: entry.kind } },
    h("span", { class: "tl-time" }, timeEl(entry.at)), line);
  switch (entry.kind) {
    case "created":
      line.append(`asked ${task.assignee} for this task`);
      break;
    case "message":
      line.append("wrote ", h("a", { href: `#/p/${slug}/tasks/${task.id}/${entry.message_id}`, text: "in the thread" }));
      li.append(markdown(entry.excerpt, { class: "tl-excerpt" }));
      break;
    case "checkpoint": {
      line.append("noted progress", ...(entry.needs_answer ? [" ", badge("needs a person's answer", "attention")] : []));
      const cp = checkpoints.get(entry.checkpoint_id);
      li.append(cp ? checkpointBody(cp) : h("p", { class: "tl-excerpt", text: entry.excerpt }));
      break;
    }
    case "submission":
      line.append(`returned revision ${entry.revision}: `, anchorLink("subs-heading", "see the result"));
      li.append(markdown(entry.excerpt, { class: "tl-excerpt" }));
      break;
    case "decision":
      line.append(DECISION[entry.decision]?.(entry) || words(entry.decision));
      if (entry.reason) li.append(h("blockquote", { class: "tl-words", text: entry.reason }));
      break;
    case "run": {
      const run = entry.purpose === "verify" ? "verification run" : "run";
      line.lastChild.remove(); // "oj/muse's run", no space
      if (entry.event === "started") line.append(`'s ${run} started`);
      else {
        line.append(`'s ${run} ${RUN_END[entry.state] || words(entry.state)}`);
        if (entry.failure) li.append(h("p", { class: "muted small", text: `Why: ${words(entry.failure)}.` }));
      }
      break;
    }
    case "state":
      if (entry.by?.kind === "system" || !entry.by) {
        line.replaceChildren(GATE[entry.move] || "It moved", " ");
      } else line.append(MOVE[entry.move] ? `${MOVE[entry.move]} ` : "moved it ");
      line.append(stateChip(entry));
      if (entry.reason || entry.why) li.append(reasonBlock(entry));
      break;
    default:
      line.append(words(entry.kind));
  }
  return li;
}

function checkpointBody(cp) {
  const list = (title, values, code) => (values?.length
    ? [h("h4", { text: title }), h("ul", { class: code ? "code-list" : "" },
      values.map((x) => h("li", {}, code ? h("code", { text: x }) : x)))]
    : null);
  return h("div", { class: "tl-checkpoint-body" },
    markdownWithRaw(cp.progress || ""),
    list("Decisions", cp.decisions),
    list("Files touched", cp.files_touched, true),
    list("Next steps", cp.next_steps),
    list("Open questions", cp.open_questions));
}

/**
 * The last move's words for the task's current state, when it has any: why it was sent back,
 * cancelled or handed back. Null when the newest state change carries no reason.
 */
export function lastReason(detail, me) {
  const states = (detail.timeline || []).filter((e) => e.kind === "state");
  const move = states[states.length - 1];
  if (!move || move.to !== detail.task.state || !(move.reason || move.why)) return null;
  const by = who(move.by, me);
  const what = {
    send_back: `${by === "you" ? "You" : by} sent the result back`,
    reject: `${by} sent the result back`,
    cancel: `${by === "you" ? "You" : by} cancelled the task`,
    hand_back: `${by === "you" ? "You" : by} handed the task back`,
  }[move.move] || (move.to === "returned" ? "The task came back" : `Now ${stateWords(move.to)}`);
  return h("div", { class: "reason-line", role: "note" },
    h("p", {}, h("strong", { text: what }), " ", timeEl(move.at, true),
      move.why && !move.reason ? `: ${WHY[move.why] || words(move.why)}.` : ":"),
    move.reason ? h("blockquote", { class: "tl-words", text: move.reason }) : null);
}
