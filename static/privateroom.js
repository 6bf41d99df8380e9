// privateroom.js — the controls of your private room (you and your own agents): how your
// agents answer you (the reply mode and the lead agent), the turn in progress ("waiting on
// oj/muse to draft, 3 replies left"), stopping it or the whole round, and how the last turn
// ended when it ran out of time.
//
// GET /api/room says where things stand; it is asked again when a message is posted in the
// room (a message starts, advances or ends a turn), when the turn's time is up, and after
// every change made here.

import { get, post, del, seg } from "./api.js";
import * as stream from "./stream.js";
import { h, field, select, errorSlot, act, fill, announce, debounce, loadFailed } from "./ui.js";

const MODES = [["review", "Review"], ["solo", "Solo"], ["named", "Named"]];

const MODE_HINT = {
  review: "One agent drafts (the lead, or the one you @mention); an agent on another client reviews it and may ask for a revision.",
  solo: "One agent answers alone: the lead, or the one you @mention.",
  named: "Only the agents you @mention answer, each once; when several draft, one of them combines the drafts into one answer.",
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
      clearTimeout(state.timer);
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

async function stop(state, button, error, what) {
  const out = await act(button, error, () => post(what === "round" ? "/api/room/round/stop" : "/api/room/stop", {}));
  if (!out) return;
  announce(what === "round" ? "Round stopped: your agents can't post here until you write again"
    : "Turn stopped: your agents' unused credentials ended");
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
  clearTimeout(state.timer);
  if (view.turn?.expires_at) { // the server ends the turn then: ask again to show how it ended
    const ms = Date.parse(view.turn.expires_at) - Date.now() + 1000;
    state.timer = setTimeout(() => load(state), Math.min(Math.max(ms, 1000), 2 ** 31 - 1));
  }
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

/** No turn in progress: say so only when the round is stopped or the last turn ran out of time. */
function drawEnded(state) {
  const { room, last_turn: last } = state.view;
  if (room.round?.stopped) {
    fill(state.turn, h("div", { class: "banner banner-warn turn-ended round-stopped" },
      h("p", {}, h("strong", { text: "You stopped this round. " }),
        h("span", { text: "Your agents can't post here until you write again." }))));
  } else if (last?.end_reason === "out_of_time") {
    const who = last.missed.length ? `${last.missed.join(" and ")} didn't answer in time.` : "";
    fill(state.turn, h("div", { class: "banner banner-warn turn-ended out-of-time", dataset: { turnId: last.id } },
      h("p", {}, h("strong", { text: "Your last turn ran out of time. " }),
        h("span", { text: `${who} Write again to start a new turn.`.trim() }))));
  } else {
    fill(state.turn);
  }
}

function drawTurn(state, turn) {
  if (!turn) {
    drawEnded(state);
    return;
  }
  const who = turn.waiting_on.length ? turn.waiting_on.join(" and ") : null;
  const left = `${turn.replies_left} ${turn.replies_left === 1 ? "reply" : "replies"} left`;
  const text = who ? `Waiting on ${who} ${STEP[turn.step] || turn.step}, ${left}.` : `A turn is in progress, ${left}.`;
  const error = errorSlot();
  const button = h("button", { type: "button", class: "small", text: "Stop this turn" });
  button.addEventListener("click", () => stop(state, button, error, "turn"));
  const round = h("button", { type: "button", class: "small", text: "Stop the round",
    title: "Your agents post nothing here (no reply, card or result) until you write again" });
  round.addEventListener("click", () => stop(state, round, error, "round"));
  const ends = turn.expires_at ? ` It ends at ${new Date(turn.expires_at).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" })} if nobody answers.` : "";
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
      h("p", { class: "small muted", text: `Writing again starts a new turn. Stopping ends your agents' unused credentials for this one; stopping the round also keeps them from posting until you write.${ends}` })),
    h("div", { class: "turn-actions" }, button, round), error));
}

async function again(state, button, error, path, body, said) {
  const out = await act(button, error, () => post(path, body));
  if (!out) return;
  announce(said);
  await load(state);
}
