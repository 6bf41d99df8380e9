// project.js — the project the person is in: its view (people, agents, memory, pulse,
// paused pairs) kept fresh from the live stream, and the project's header with its tabs.

import { get, seg } from "./api.js";
import * as stream from "./stream.js";
import { h, badge, debounce } from "./ui.js";

const TABS = [
  ["room", "Room"], ["tasks", "Tasks"], ["pulse", "Team Pulse"], ["people", "Members"],
  ["memory", "Memory"], ["story", "Story"], ["audit", "Audit"],
];

let state = null; // { slug, data, listeners:Set, offs:[] }

// ---- lifecycle -----------------------------------------------------------------------

/** Enter a project: load its view and open its stream. Resolves to the project view. */
export async function enter(slug) {
  if (state && state.slug === slug) return state.data;
  leave();
  // Listen first: the stream says where it starts, and the view loaded after that misses nothing.
  const ready = stream.open(slug);
  const conn = stream.connection(); // a newer enter() may open its own meanwhile: leave that one alone
  await ready;
  let data;
  try {
    data = await get(`/api/projects/${seg(slug)}`);
  } catch (err) {
    if (stream.connection() === conn) stream.close();
    throw err;
  }
  if (stream.connection() !== conn) throw new Error("Another project was opened meanwhile.");
  state = { slug, data, listeners: new Set(), offs: [] };
  // The view stays as it was when the server cannot be reached; the next event tries again.
  const reload = debounce(() => refresh().catch(() => {}), 600);
  state.reload = reload;
  state.offs.push(
    stream.on("pulse.updated", (event) => patchPulse(event.pulse)),
    stream.on("member.joined", reload),
    stream.on("agent.added", reload),
    // A pause or a resume of an agent with open tasks comes as their task.updated.
    stream.on("task.updated", reload),
    // Any message may pause a pair (agents) or resume one (people).
    stream.on("message.posted", reload),
    stream.on("resync", reload),
  );
  return data;
}

export function leave() {
  if (state) {
    state.reload?.cancel();
    for (const off of state.offs) off();
    state = null;
  }
  stream.close(); // also a stream opened by an enter() still loading
}

// ---- actions -------------------------------------------------------------------------

export function slug() {
  return state?.slug ?? null;
}

/** Is this the person's private room (them and their own agents)? */
export function isPrivate() {
  return state?.data?.kind === "private";
}

/** The project view: {project, kind ("team" | "private"), role, people (with role), agents, memory, pulse, paused,
 *  paused_agents ({agent_id: {by, scope, since}})}. */
export function data() {
  return state?.data ?? null;
}

/** fn(data) whenever the project view changes; returns a function that stops it. */
export function onChange(fn) {
  if (!state) return () => {};
  const listeners = state.listeners;
  listeners.add(fn);
  return () => listeners.delete(fn);
}

/** Fetch the project view again now (after a change the stream does not carry). */
export async function refresh() {
  if (!state) return null;
  const mine = state;
  const data = await get(`/api/projects/${seg(mine.slug)}`);
  if (state !== mine) return null;
  mine.data = data;
  notify();
  return data;
}

/** Everyone the person can @mention here: people by handle, agents as owner/name. */
export function addresses() {
  const d = data();
  if (!d) return [];
  return [
    ...d.people.map((p) => ({ address: p.handle, name: p.display_name, kind: "person", color: p.color })),
    ...d.agents.map((a) => ({ address: a.agent_id, name: a.name, kind: "agent", role: a.role })),
  ];
}

/** The project header: name, team, live status and the tabs (current one marked). */
export function header(view) {
  const d = data();
  const live = h("span", { class: "live", role: "status" });
  const off = stream.onStatus((s) => {
    live.dataset.status = s;
    live.textContent = { live: "Live", connecting: "Connecting…", reconnecting: "Reconnecting…", off: "Not live" }[s]
      || s;
  });
  const nav = h("nav", { class: "tabs", "aria-label": "Project" },
    TABS.map(([key, label]) => h("a", {
      href: `#/p/${d.project.slug}/${key}`, "aria-current": key === view ? "page" : false, text: label,
    })));
  const name = h("span", { class: "project-name", text: d.project.name });
  // A rename shows at once; the address (slug) never changes.
  const offName = onChange((fresh) => { name.textContent = fresh.project.name; });
  const el = h("div", { class: "project-bar" },
    h("div", { class: "project-title" },
      name,
      d.kind === "private" ? badge("private room", "violet", "Only you and your own agents") : null,
      h("span", { class: "muted project-meta", text: `${d.project.team ? `${d.project.team} · ` : ""}${d.project.slug}` }),
      live),
    nav);
  return { el, destroy: () => { off(); offName(); } };
}

// ---- callbacks -----------------------------------------------------------------------

function patchPulse(pulse) {
  if (!state || !pulse) return;
  const list = state.data.pulse.filter((p) => p.agent_id !== pulse.agent_id);
  list.unshift(pulse);
  state.data.pulse = list;
  notify();
}

// ---- internal ------------------------------------------------------------------------

function notify() {
  for (const fn of [...(state?.listeners || [])]) {
    try {
      fn(state.data);
    } catch (err) {
      console.error(err);
    }
  }
}
