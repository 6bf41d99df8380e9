// privateroom.js — the controls of your private room (you and your own agents): how your
// agents answer you (the reply mode and the lead agent), the turn in progress ("waiting on
// oj/muse to draft, 3 replies left") and stopping it.
//
// GET /api/room says where things stand; it is asked again when a message is posted in the
// room (a message starts, advances or ends a turn) and after every change made here.

import { get, post, del, seg } from "./api.js";
import * as stream from "./stream.js";
import { h, field, select, errorSlot, act, fill, announce, debounce, loadFailed } from "./ui.js";

const MODES = [["review", "Review"], ["solo", "Solo"], ["named", "Named"]];

const MODE_HINT = {
  review: "One agent drafts (the lead, or the one you @mention); an agent on another client reviews it and may ask for a revision.",
  solo: "One agent answers alone: the lead, or the one you @mention.",
  named: "Only the agents you @mention answer, each once.",
};

const STEP = { draft: "to draft", review: "to review the draft", revise: "to revise the draft", combine: "to combine the drafts" };

// ---- lifecycle ---------------------------------------------------------------------------------

/** The room's controls: {settings, turn} elements for the room view, refresh() and destroy(). */
export function createRoomControls(ctx) {
  const state = { view: null, ctx };
  const mode = select(MODES, { name: "reply_mode" });
  const lead = h("select", { name: "lead" });
  const modeField = field("Reply mode", mode, MODE_HINT.review);
  const hint = modeField.querySelector(".hint");
  const save = h("button", { type: "submit", class: "small primary", text: "Save" });
  const saved = h("p", { class: "muted small", role: "status" });
  const error = errorSlot();
  const form = h("form", { class: "room-settings-form" },
    modeField, field("Lead agent", lead, "Answers first when you name no one."), save, saved, error);
  const settings = h("section", { class: "room-settings card", "aria-labelledby": "room-settings-heading", hidden: true },
    h("h2", { id: "room-settings-heading", text: "How your agents answer" }),
    h("p", { class: "muted small", text: "Only you and your own agents are in this room. Your message starts a turn." }),
    form);
  const turn = h("div", { class: "turn-slot", role: "status" });
  const members = h("div", { class: "room-agents" });
  settings.append(members);
  Object.assign(state, { mode, lead, hint, saved, settings, turn, members });

  mode.addEventListener("change", () => {
    hint.textContent = MODE_HINT[mode.value] || "";
    saved.textContent = "";
  });
  lead.addEventListener("change", () => { saved.textContent = ""; });
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const body = {};
    if (mode.value !== state.view?.room.reply_mode) body.reply_mode = mode.value;
    if (lead.value && lead.value !== state.view?.room.lead_agent) body.lead = lead.value;
    if (!Object.keys(body).length) {
      saved.textContent = "Nothing changed.";
      return;
    }
    const out = await act(save, error, () => post("/api/room", body));
    if (out) {
      show(state, out);
      saved.textContent = "Saved.";
      announce("Room settings saved");
    }
  });

  const refresh = debounce(() => load(state), 300);
  const offs = [
    stream.on("message.posted", (e) => { if (e.message?.project === ctx.slug) refresh(); }),
    ctx.project.onChange(() => drawLead(state)),
  ];
  load(state);
  return {
    settings,
    turn,
    refresh: () => load(state),
    destroy() {
      refresh.cancel();
      for (const off of offs) off();
    },
  };
}

// ---- actions ---------------------------------------------------------------------------------------

async function load(state) {
  try {
    show(state, await get("/api/room"));
  } catch (err) {
    fill(state.turn, loadFailed(err, () => load(state)));
  }
}

async function stop(state, button, error) {
  const out = await act(button, error, () => post("/api/room/stop", {}));
  if (!out) return;
  announce("Turn stopped: your agents' unused credentials ended");
  await load(state);
  document.querySelector(".room-foot .composer textarea")?.focus(); // the button is gone; back to writing
}

// ---- rendering ---------------------------------------------------------------------------------------

function show(state, view) {
  if (view.room.project !== state.ctx.slug) { // someone else's room (cannot happen: rooms are private)
    state.settings.hidden = true;
    fill(state.turn);
    return;
  }
  const first = !state.view;
  state.view = view;
  state.settings.hidden = false;
  if (first || !state.settings.contains(document.activeElement)) { // never move a control under the person's hands
    state.mode.value = view.room.reply_mode;
    state.hint.textContent = MODE_HINT[view.room.reply_mode] || "";
    drawLead(state);
  }
  drawMembers(state);
  drawTurn(state, view.turn);
}

/** Which of your agents are in the room: take one out, or add it back. */
function drawMembers(state) {
  const error = errorSlot();
  const rows = (state.view.agents || []).map((a) => {
    const verb = a.in_room ? "Take out" : "Add back";
    const button = h("button", { type: "button", class: "small", text: verb, "aria-label": `${verb} ${a.agent_id}` });
    button.addEventListener("click", async () => {
      const [owner, name] = a.agent_id.split("/");
      const out = await act(button, error, () => (a.in_room
        ? del(`/api/projects/${seg(state.ctx.slug)}/agents/${seg(owner)}/${seg(name)}`)
        : post(`/api/projects/${seg(state.ctx.slug)}/agents`, { agent_id: a.agent_id })));
      if (!out) return;
      announce(a.in_room ? `${a.agent_id} left this room` : `${a.agent_id} is back in this room`);
      await state.ctx.project.reload?.();
      await load(state);
    });
    return h("li", { class: "room-agent" }, h("span", { text: `${a.name} (${a.agent_id})` }),
      h("span", { class: "muted small", text: a.in_room ? " in this room " : " not in this room " }), button);
  });
  fill(state.members, rows.length ? [h("h3", { text: "Your agents here" }), h("ul", { class: "plain" }, rows), error] : []);
}

function drawLead(state) {
  if (!state.view) return;
  const agents = state.ctx.project.data()?.agents || [];
  const current = state.view.room.lead_agent;
  const options = agents.map((a) => [a.agent_id, `${a.name} (${a.agent_id})`]);
  if (!current) options.unshift(["", agents.length ? `Not chosen: ${agents[0].agent_id} leads` : "No agents yet"]);
  fill(state.lead, options.map(([value, text]) => h("option", { value, text })));
  state.lead.value = current || "";
}

function drawTurn(state, turn) {
  if (!turn) {
    fill(state.turn);
    return;
  }
  const who = turn.waiting_on.length ? turn.waiting_on.join(" and ") : null;
  const left = `${turn.replies_left} ${turn.replies_left === 1 ? "reply" : "replies"} left`;
  const text = who ? `Waiting on ${who} ${STEP[turn.step] || turn.step}, ${left}.` : `A turn is in progress, ${left}.`;
  const error = errorSlot();
  const button = h("button", { type: "button", class: "small", text: "Stop this turn" });
  button.addEventListener("click", () => stop(state, button, error));
  const skipped = turn.skipped || [];
  const missed = skipped.length ? h("div", { class: "skipped" },
    h("p", { class: "turn-skipped", text: `${skipped.join(" and ")} didn't review: ${skipped.length === 1 ? "its runner isn't" : "their runners aren't"} listening.` }),
    skipped.map((agent) => {
      const retry = h("button", { type: "button", class: "small primary", text: `Retry ${agent}` });
      retry.addEventListener("click", () => again(state, retry, error, "/api/room/retry", { agent }, `${agent} was woken again`));
      return retry;
    }),
    (() => {
      const go = h("button", { type: "button", class: "small", text: "Continue without them" });
      go.addEventListener("click", () => again(state, go, error, "/api/room/continue", {}, "The turn went on without them"));
      return go;
    })()) : null;
  fill(state.turn, h("div", { class: "banner banner-info turn", dataset: { turnId: turn.id } },
    h("div", {},
      h("strong", { class: "turn-text", text }),
      missed,
      h("p", { class: "small muted", text: "Writing again starts a new turn. Stopping ends your agents' unused credentials for this one." })),
    button, error));
}

async function again(state, button, error, path, body, said) {
  const out = await act(button, error, () => post(path, body));
  if (!out) return;
  announce(said);
  await load(state);
}
