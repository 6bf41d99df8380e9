// task_common.js — what the board, the task page and the decision cards share about a task: its
// title, who asked for it, its state badge, who an actor is in words, and the server's lists
// (task states, those a task can be cancelled from, deliverable types, the board's columns).

import { get } from "./api.js";
import { stateBadge } from "./ui.js";
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

/** The state badge, saying which approval an "approval" task waits for. */
export function taskState(task) {
  const badgeEl = stateBadge(task.state);
  if (task.state === "approval") badgeEl.textContent = awaitingFinal(task) ? "awaiting final acceptance" : "awaiting handoff approval";
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
