// pulse.js — Team Pulse: what each agent reports (availability, doing, task, branch,
// files, last decision, run failure, edit intent), and a warning wherever two agents'
// intents touch the same paths or areas.

import { h, heading, fill, empty, avatar, availabilityBadge, badge, timeEl, ago, words } from "./ui.js";
import { pausedBy, pausedSentence } from "./pauses.js";

// ---- lifecycle ----------------------------------------------------------------------------

export function mount(el, ctx) {
  const warnings = h("div", { class: "overlaps" });
  const grid = h("div", { class: "pulse-grid" });
  el.append(
    h("div", { class: "page-head" }, heading(1, "Team Pulse"),
      h("p", { class: "muted", text: "What each agent says it is doing and about to edit. Updates live." })),
    warnings, grid);
  const render = () => renderPulse(warnings, grid, ctx);
  render();
  const off = ctx.project.onChange(render);
  const tick = setInterval(render, 60000); // "5 min ago" stays true; lapsed intents drop out
  return () => {
    off();
    clearInterval(tick);
  };
}

// ---- actions (pure, exported for reuse) ---------------------------------------------------------

/** A RegExp for a simple glob: `**` any characters, `*` any but "/", `?` one; a trailing "/" a folder. */
export function globToRegExp(glob) {
  let g = normalise(glob);
  if (g.endsWith("/")) g += "**";
  let out = "";
  for (let i = 0; i < g.length; i += 1) {
    const ch = g[i];
    if (ch === "*") {
      if (g[i + 1] === "*") {
        const slash = g[i + 2] === "/";
        out += slash ? "(?:.*/)?" : ".*";
        i += slash ? 2 : 1;
      } else {
        out += "[^/]*";
      }
    } else if (ch === "?") {
      out += "[^/]";
    } else {
      out += ch.replace(/[.+^${}()|[\]\\]/g, "\\$&");
    }
  }
  return new RegExp(`^${out}$`);
}

/** Do two paths (or globs) touch: the same, or one glob matching the other? */
export function pathsTouch(a, b) {
  const x = normalise(a);
  const y = normalise(b);
  return x === y || globToRegExp(x).test(y) || globToRegExp(y).test(x);
}

/** Pairs of pulses whose live intents touch: [{a, b, paths:[[pa, pb]], areas:[…]}]. */
export function findOverlaps(pulses) {
  const withIntent = pulses.filter((p) => p.intent && new Date(p.intent.expires_at) > new Date());
  const out = [];
  for (let i = 0; i < withIntent.length; i += 1) {
    for (let j = i + 1; j < withIntent.length; j += 1) {
      const a = withIntent[i];
      const b = withIntent[j];
      const paths = [];
      for (const pa of a.intent.paths || []) {
        for (const pb of b.intent.paths || []) if (pathsTouch(pa, pb)) paths.push([pa, pb]);
      }
      const areas = (a.intent.areas || []).filter((x) => (b.intent.areas || []).includes(x));
      if (paths.length || areas.length) out.push({ a: a.agent_id, b: b.agent_id, paths, areas });
    }
  }
  return out;
}

// ---- callbacks ----------------------------------------------------------------------------------

function renderPulse(warnings, grid, ctx) {
  const data = ctx.project.data();
  if (!data) return;
  const overlaps = findOverlaps(data.pulse);
  const flagged = new Set(overlaps.flatMap((o) => [o.a, o.b]));
  fill(warnings, overlaps.map((o) => h("div", { class: "banner banner-danger overlap", role: "alert" },
    h("div", {},
      h("strong", { text: `${o.a} and ${o.b} intend to edit the same things` }),
      o.paths.length ? h("p", {}, "Paths: ", o.paths.map(([pa, pb], i) => [i ? ", " : "",
        h("code", { text: pa }), pa === pb ? "" : [" / ", h("code", { text: pb })]])) : null,
      o.areas.length ? h("p", { text: `Areas: ${o.areas.join(", ")}` }) : null,
      h("p", { class: "small", text: "Tell one of them to wait, or split the work, before they collide." })))));

  const reported = new Set(data.pulse.map((p) => p.agent_id));
  const cards = data.pulse.map((p) => pulseCard(p, data, ctx, flagged.has(p.agent_id)));
  const paused = data.paused_agents || {};
  const quiet = data.agents.filter((a) => !reported.has(a.agent_id)).map((a) => h("article", {
    class: `card pulse-card quiet-card${paused[a.agent_id] ? " paused-agent" : ""}`, dataset: { agent: a.agent_id } },
    h("div", { class: "pulse-head" }, avatar(a.name, a.agent_id, "agent"),
      h("div", {}, h("strong", { text: a.name }), h("div", { class: "muted small", text: a.agent_id })),
      pulseState(a.availability, paused[a.agent_id], a.agent_id)),
    pausedLine(a.agent_id, paused[a.agent_id]),
    h("p", { class: "muted", text: "No report yet." })));
  fill(grid, cards.length || quiet.length ? [...cards, ...quiet] : empty("No agents in this project yet."));
}

// ---- internal -------------------------------------------------------------------------------------

function normalise(path) {
  return String(path).trim().replace(/^\.\//, "").replace(/^\/+/, "");
}

/** An agent's availability, or "paused" while it is: a paused agent is not working, whatever it last said. */
function pulseState(availability, pause, agentId) {
  return pause ? badge("paused", "warn", pausedBy(agentId, pause)) : availabilityBadge(availability);
}

function pausedLine(agentId, pause) {
  return pause ? h("p", { class: "banner banner-warn inline small paused-note", role: "status",
    text: pausedSentence(agentId, pause) }) : null;
}

function pulseCard(p, data, ctx, clash) {
  const agent = data.agents.find((a) => a.agent_id === p.agent_id);
  const name = agent?.name || p.agent_id;
  const pause = (data.paused_agents || {})[p.agent_id];
  const row = (label, value) => (value ? [h("dt", { text: label }), h("dd", {}, value)] : null);
  return h("article", { class: `card pulse-card${clash ? " clash" : ""}${p.run_failure ? " failing" : ""}${pause ? " paused-agent" : ""}`,
    dataset: { agent: p.agent_id } },
  h("div", { class: "pulse-head" }, avatar(name, p.agent_id, "agent"),
    h("div", {}, h("strong", { text: name }), h("div", { class: "muted small", text: p.agent_id })),
    pulseState(p.availability, pause, p.agent_id)),
  pausedLine(p.agent_id, pause),
  h("p", { class: "pulse-doing", text: p.doing || "Not doing anything in particular." }),
  p.run_failure ? h("p", { class: "banner banner-danger inline small", role: "status" },
    h("strong", { text: `Run failed (${words(p.run_failure.class)})` }), `: ${words(p.run_failure.step)}`) : null,
  h("dl", { class: "facts" },
    row("Task", p.task_id ? h("a", { href: `#/p/${ctx.slug}/tasks/${p.task_id}`, text: "open the task" }) : null),
    row("Branch", p.branch ? h("code", { text: p.branch }) : null),
    row("Files", p.files?.length ? h("ul", { class: "code-list" }, p.files.map((f) => h("li", {}, h("code", { text: f })))) : null),
    row("Last decision", p.last_decision),
    row("About to", p.intent ? h("div", { class: "intent" },
      badge(p.intent.kind, clash ? "danger" : "info"),
      p.intent.paths?.length ? h("ul", { class: "code-list" }, p.intent.paths.map((x) => h("li", {}, h("code", { text: x })))) : null,
      p.intent.areas?.length ? h("p", { class: "small", text: `areas: ${p.intent.areas.join(", ")}` }) : null,
      h("p", { class: "muted small" }, "intent lapses ", timeEl(p.intent.expires_at, true))) : null)),
  h("p", { class: "muted small", text: `updated ${ago(p.updated_at)}` }));
}
