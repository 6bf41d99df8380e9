// pauses.js — your paused agents: which are paused (GET /api/agents/paused), pausing one or
// all of them after a dialog that says what pausing does, resuming, the words every view
// uses for a paused agent, and the header's chip shown while any of yours are paused (a click
// lists them, each with Resume). Who may pause which agent, and what a pause holds, the
// server decides: this module only asks it and shows what it says.

import { get, post, seg } from "./api.js";
import { h, fill, errorSlot, act, announce, debounce, uid, modal } from "./ui.js";

const state = { data: { paused_by: null, agents: [] }, listeners: new Set() };
const reloadSoon = debounce(() => load(), 200);

// ---- lifecycle ----------------------------------------------------------------------------

/** Read your paused agents again; the chip and every listener follow. */
export async function load() {
  let fresh;
  try {
    fresh = await get("/api/agents/paused");
  } catch {
    return; // the chip keeps what it showed; the next event tries again
  }
  if (JSON.stringify(fresh) === JSON.stringify(state.data)) return; // most events change no pause
  state.data = fresh;
  for (const fn of state.listeners) fn(state.data);
}

/** Read again soon (a stream event said something changed). */
export function changed() {
  reloadSoon();
}

/** fn(data) whenever your paused agents change; returns a function that stops it. */
export function onChange(fn) {
  state.listeners.add(fn);
  return () => state.listeners.delete(fn);
}

// ---- words -------------------------------------------------------------------------------------

/** What pausing does, said before it is done. */
export const PAUSE_MEANS = "Its run in progress is refused at its next call and stops; its runner starts nothing new "
  + "(no task, no private-room turn). Messages and tasks for it wait, and it picks them up when you resume it.";
/** What pausing all your agents does. */
export const PAUSE_ALL_MEANS = "Each run of theirs in progress is refused at its next call and stops; their runners start "
  + "nothing new (no task, no private-room turn). Messages and tasks for them wait until you resume them.";

/** A paused agent in a few words: "Paused by ren", "Paused by the server's operator". */
export function pausedBy(agentId, pause) {
  return pause.by === "operator" ? "Paused by the server's operator" : `Paused by ${agentId.split("/")[0]}`;
}

/** One sentence for a paused agent, where its work shows (task, run, Pulse). */
export function pausedSentence(agentId, pause) {
  return pause.by === "operator"
    ? `${agentId} is paused: the server's operator paused every agent, and nothing runs until they resume.`
    : `${agentId} is paused by ${agentId.split("/")[0]}: nothing of it runs until it is resumed.`;
}

// ---- actions -------------------------------------------------------------------------------------

/** Ask first, then pause one agent ({agent_id, name}) or, with agent null, all of yours. Resolves true when paused. */
export function confirmPause(agent, opener) {
  const what = agent ? `${agent.name} (${agent.agent_id})` : "all your agents";
  const error = errorSlot();
  const titleId = uid("pause-title");
  const yes = h("button", { type: "button", class: "danger", text: agent ? `Pause ${agent.agent_id}` : "Pause all my agents" });
  const no = h("button", { type: "button", text: "Cancel" });
  const dialog = h("dialog", { class: "pause-dialog", "aria-labelledby": titleId },
    h("h2", { id: titleId, text: `Pause ${what}?` }),
    h("p", { class: "pause-means", text: agent ? PAUSE_MEANS : PAUSE_ALL_MEANS }),
    h("div", { class: "button-row" }, yes, no), error);
  return modal(dialog, { opener, cancel: no, focus: () => no }, (close) => {
    yes.addEventListener("click", async () => {
      const out = await act(yes, error, () => post(agent ? `/api/agents/${agentPath(agent.agent_id)}/pause` : "/api/agents/pause", {}));
      if (!out) return;
      announce(agent ? `${agent.agent_id} is paused` : "Your agents are paused");
      await load();
      close(true);
    });
  });
}

/** Resume one agent (its address) or, with null, all of yours. Throws the server's refusal. */
export async function resume(agentId) {
  const out = await post(agentId ? `/api/agents/${agentPath(agentId)}/resume` : "/api/agents/resume", {});
  announce(agentId ? (out.paused ? `${agentId} stays paused by the server's operator` : `${agentId} is resumed`)
    : "Your agents are resumed");
  await load();
  return out;
}

// ---- the header's chip ------------------------------------------------------------------------------

/** The chip: hidden while none of yours is paused; "N agents paused" opens the list with Resume on each. */
export function chip() {
  const count = h("span", { class: "pause-chip-count" });
  const button = h("button", { type: "button", class: "pause-chip", "aria-expanded": "false", "aria-controls": "pause-panel" },
    h("span", { class: "pause-icon", "aria-hidden": "true" }), count);
  const panel = h("div", { class: "pause-panel card", id: "pause-panel", hidden: true });
  const el = h("div", { class: "pause-chip-box", hidden: true }, button, panel);
  const open = (yes) => {
    panel.hidden = !yes;
    button.setAttribute("aria-expanded", String(yes));
  };
  button.addEventListener("click", () => open(panel.hidden));
  // It closes as a menu does: when the page goes elsewhere or a click lands outside it.
  window.addEventListener("hashchange", () => open(false));
  document.addEventListener("click", (e) => { if (!panel.hidden && !el.contains(e.target)) open(false); });
  el.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && !panel.hidden) {
      open(false);
      button.focus();
    }
  });
  const render = (data) => {
    const n = data.agents.length;
    el.hidden = n === 0;
    if (!n) open(false);
    fill(count, `${n} `, h("span", { class: "pause-chip-noun", text: n === 1 ? "agent " : "agents " }), "paused");
    const error = errorSlot();
    const all = data.paused_by === "owner" || data.agents.filter((a) => a.by === "owner").length > 1
      ? h("button", { type: "button", class: "small", text: "Resume all my agents" }) : null;
    all?.addEventListener("click", () => act(all, error, () => resume(null)));
    fill(panel, h("h2", { class: "pause-panel-title", text: "Your paused agents" }),
      h("ul", { class: "pause-list" }, data.agents.map((a) => {
        const again = a.by === "owner" ? h("button", { type: "button", class: "small", text: "Resume",
          "aria-label": `Resume ${a.agent_id}` }) : null;
        again?.addEventListener("click", () => act(again, error, () => resume(a.agent_id)));
        return h("li", { dataset: { agent: a.agent_id } },
          h("span", {}, h("strong", { text: a.name }), " ", h("span", { class: "muted small", text: a.agent_id })),
          h("span", { class: "muted small", text: pausedBy(a.agent_id, a) }), again);
      })),
      all, h("a", { href: "#/agents", class: "small", text: "Agents & keys" }), error);
  };
  render(state.data);
  onChange(render);
  return el;
}

// ---- internal ------------------------------------------------------------------------------------------

function agentPath(agentId) {
  return agentId.split("/").map(seg).join("/");
}
