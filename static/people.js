// people.js — the Members screen: a project's members with their role, their agents in it and
// when they joined, adding a teammate from the project's team (owners), the project's agents,
// and adding one of your own agents to it.

import { get, post, seg } from "./api.js";
import {
  h, heading, field, select, errorSlot, act, fill, empty, avatar, badge, availabilityBadge, ago, announce, timeEl,
  loadFailed,
} from "./ui.js";

// ---- lifecycle ------------------------------------------------------------------------------

export function mount(el, ctx) {
  const people = h("ul", { class: "people-list" });
  const agents = h("div", { class: "agent-grid" });
  const addPerson = h("div");
  const addAgent = h("div");
  el.append(
    h("div", { class: "page-head" }, heading(1, "Members and agents")),
    h("div", { class: "two-col" },
      h("section", { class: "section", "aria-labelledby": "people-heading" },
        h("h2", { id: "people-heading", text: "Members" }), people, addPerson),
      h("section", { class: "section", "aria-labelledby": "agents-heading" },
        h("h2", { id: "agents-heading", text: "Agents" }), agents, addAgent)));

  const render = () => {
    const data = ctx.project.data();
    renderPeople(people, data, ctx);
    renderAgents(agents, data);
  };
  render();
  const off = ctx.project.onChange(render);
  renderAddPerson(addPerson, ctx);
  renderAddAgent(addAgent, ctx);
  return off;
}

// ---- callbacks / rendering -------------------------------------------------------------------------

async function renderPeople(list, data, ctx) {
  let members;
  try {
    ({ members } = await get(`/api/projects/${seg(ctx.slug)}/members`));
  } catch (err) {
    fill(list, h("li", {}, loadFailed(err, () => renderPeople(list, ctx.project.data(), ctx))));
    return;
  }
  fill(list, members.map((p) => h("li", { class: "person", dataset: { handle: p.handle } },
    avatar(p.display_name, p.color),
    h("span", { class: "person-name" },
      h("strong", { text: p.display_name }),
      h("span", { class: "muted", text: ` @${p.handle}` }), p.handle === ctx.me.handle ? h("span", { class: "muted", text: " (you)" }) : null,
      h("span", { class: "member-facts muted small" },
        h("span", { class: "member-agents", text: p.agents.length ? `agents: ${p.agents.join(", ")}` : "no agents here" }),
        h("span", { class: "member-joined" }, "joined ", timeEl(p.joined_at)))),
    badge(p.role, p.role === "owner" ? "info" : "muted"),
    p.away ? badge("away", "warn") : null)));
}

function renderAgents(box, data) {
  fill(box, data.agents.length ? data.agents.map((a) => h("article", { class: "card agent-card", dataset: { agent: a.agent_id } },
    h("div", { class: "pulse-head" }, avatar(a.name, a.agent_id, "agent"),
      h("div", {}, h("strong", { text: a.name }), h("div", { class: "muted small", text: a.agent_id })),
      availabilityBadge(a.availability)),
    a.role ? h("p", { text: a.role }) : null,
    h("p", { class: "muted small", text: `${a.model} · ${a.client} · owner @${a.owner}` }),
    a.capabilities?.length ? h("p", { class: "chips" }, a.capabilities.map((c) => h("span", { class: "chip", text: `${c.kind}: ${c.name}` }))) : null,
    h("p", { class: "muted small", text: `${a.trust_level ? `trust ${a.trust_level} · ` : ""}${a.last_seen_at ? `seen ${ago(a.last_seen_at)}` : "never seen"}` })))
    : empty("No agents here yet."));
}

async function renderAddPerson(box, ctx) {
  const data = ctx.project.data();
  if (data.role !== "owner") {
    fill(box, h("p", { class: "muted small", text: "Project owners add teammates." }));
    return;
  }
  let everyone = [];
  try {
    ({ people: everyone } = await get(`/api/people?project=${encodeURIComponent(ctx.slug)}`));
  } catch (err) {
    fill(box, loadFailed(err, () => renderAddPerson(box, ctx)));
    return;
  }
  const draw = () => {
    const inProject = new Set(ctx.project.data().people.map((p) => p.handle));
    const candidates = everyone.filter((p) => !inProject.has(p.handle));
    if (!candidates.length) {
      fill(box, h("p", { class: "muted small", text: `Everyone in team ${data.project.team} is already here. Anyone else is invited to join.` }));
      return;
    }
    const who = select(candidates.map((p) => [p.handle, `${p.display_name} (@${p.handle})`]), { name: "handle" });
    const role = select([["member", "member"], ["owner", "owner"]], { name: "role" });
    const submit = h("button", { type: "submit", class: "primary", text: "Add teammate" });
    const error = errorSlot();
    const form = h("form", { class: "inline-form", "aria-labelledby": "add-person-heading" },
      h("h3", { id: "add-person-heading", text: "Add a teammate" }),
      h("div", { class: "inline-fields" }, field("Person", who), field("Role", role)), submit, error);
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      const out = await act(submit, error, () => post(`/api/projects/${seg(ctx.slug)}/members`, { handle: who.value, role: role.value }));
      if (out) {
        announce(`${who.value} was added as ${role.value}`);
        await ctx.project.refresh();
        draw();
      }
    });
    fill(box, form);
  };
  draw();
}

async function renderAddAgent(box, ctx) {
  let mine = [];
  try {
    ({ agents: mine } = await get("/api/agents"));
  } catch {
    return;
  }
  const draw = () => {
    const here = new Set(ctx.project.data().agents.map((a) => a.agent_id));
    const candidates = mine.filter((a) => !here.has(a.agent_id));
    if (!candidates.length) {
      fill(box, h("p", { class: "muted small" }, mine.length ? "All your agents are here. " : "You have no agents yet. ",
        h("a", { href: "#/agents", text: "Agents & keys" })));
      return;
    }
    const agent = select(candidates.map((a) => [a.agent_id, `${a.name} (${a.agent_id})`]), { name: "agent" });
    const submit = h("button", { type: "submit", class: "primary", text: "Add to this project" });
    const error = errorSlot();
    const form = h("form", { class: "inline-form", "aria-labelledby": "add-agent-heading" },
      h("h3", { id: "add-agent-heading", text: "Bring one of your agents" }),
      h("div", { class: "inline-fields" }, field("Your agent", agent)), submit, error);
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      const out = await act(submit, error, () => post(`/api/projects/${seg(ctx.slug)}/agents`, { agent_id: agent.value }));
      if (out) {
        announce(`${agent.value} joined the project`);
        await ctx.project.refresh();
        draw();
      }
    });
    fill(box, form);
  };
  draw();
}
