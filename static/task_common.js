// task_common.js — what the board, the task page and the decision cards share about a task: its
// title, who asked for it, its state badge, who an actor is in words, the server's lists
// (task states, those a task can be cancelled from, deliverable types, the board's columns), and
// asking the requesting agent in the thread to verify a result nothing verifies.

import { get, post, seg } from "./api.js";
import { h, stateBadge, errorSlot, act, settle } from "./ui.js";
import { plainText } from "./markdown.js";

// The server's lists (GET /api/meta): task states, those a task can be cancelled from, deliverable types,
// the board's columns.
let lists = null;
export const taskLists = () => (lists ??= get("/api/meta").then((out) => out.tasks, (err) => { lists = null; throw err; }));

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

/** Which approval an "approval" task waits for, in words: the final acceptance of a verified result, or the gate's. */
export function approvalWords(final) {
  return final ? "awaiting final acceptance" : "awaiting handoff approval";
}

/** The state badge, saying which approval an "approval" task waits for. */
export function taskState(task) {
  const badgeEl = stateBadge(task.state);
  if (task.state === "approval") badgeEl.textContent = approvalWords(awaitingFinal(task));
  return badgeEl;
}

/** The task's name: its display title, or the packet's own words, as plain words (no Markdown marks). */
export function titleOf(task) {
  return plainText(task.display_title || task.packet.task);
}

/** Who asked for the task, in words. */
export function requesterText(task) {
  if (task.requester) return task.requested_by?.erased ? actorText(task.requested_by) : task.requester;
  return task.requested_by?.kind === "person" ? actorText(task.requested_by) : "someone";
}

/** An actor reference (person, agent or Prickle itself) in words; one whose person closed their
 *  account (erased: true) says so. */
export function actorText(ref) {
  if (!ref) return "";
  if (ref.kind === "person") return ref.erased ? `an erased person (@${ref.handle})` : `@${ref.handle}`;
  if (ref.kind === "agent") return ref.erased ? `${ref.agent_id} (erased)` : ref.agent_id;
  return "Prickle";
}

/** A result no runner of its requesting agent verifies: a button that asks the agent in the task's thread
 *  (POST /api/tasks/ID/ask-to-verify, a message mentioning it, which a session of it waiting hears); `before`
 *  goes in the same row of buttons, first. */
export function askToVerify(taskId, agent, ...before) {
  const error = errorSlot();
  const button = h("button", { type: "button", text: `Ask ${agent} in the thread` });
  const result = h("p", { class: "notice ok", role: "status", hidden: true });
  button.addEventListener("click", async () => {
    const out = await act(button, error, () => post(`/api/tasks/${seg(taskId)}/ask-to-verify`, {}));
    if (out) settle(result, `Asked ${agent} in the thread: a session of it waiting for mentions hears it.`, [button]);
  });
  return h("div", { class: "ask-to-verify" }, h("div", { class: "button-row" }, ...before, button), error, result);
}
