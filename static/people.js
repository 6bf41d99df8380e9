// people.js — the Members screen: a project's members with their role, their agents in it and
// when they joined, adding a teammate from the project's team (owners), the project's agents,
// and adding one of your own agents to it; owners of the project and its team invite people by
// email and see the open invites (resend, revoke, the link to pass on; one accepted leaves the list
// at once). Leave, Remove, Promote and Remove agent ask first, with what the server says would be
// handed back. Owners rename the project and export it (export.js), and its default lead is picked by a team
// owner (its owner agrees, declines or steps down); owners delete or erase it (deletion.js).

import { get, post, del, seg } from "./api.js";
import * as stream from "./stream.js";
import { dangerZone } from "./deletion.js";
import {
  h, heading, field, select, errorSlot, act, fill, empty, avatar, badge, availabilityBadge, ago, announce, timeEl,
  copyButton, revokeButton, loadFailed,
} from "./ui.js";
import { exportBox } from "./export.js";

// ---- lifecycle ------------------------------------------------------------------------------

export function mount(el, ctx) {
  const people = h("ul", { class: "people-list" });
  const agents = h("div", { class: "agent-grid" });
  const addPerson = h("div");
  const invites = h("div", { class: "invites" });
  const addAgent = h("div");
  const confirmBox = h("div", { class: "removal-slot" });
  ctx.confirmBox = confirmBox;
  const settings = h("div", { class: "project-settings" });
  const danger = h("div", { class: "danger-slot" }); // Delete and Erase: last, below everything they undo
  // drawn once, not with the project's every change: a choice being made stays made
  const sharing = ctx.project.data().kind === "team" ? shareRule(ctx) : null;
  const exporting = exportBox(ctx); // offered by the server to owners (can_export)
  el.append(
    h("div", { class: "page-head" }, heading(1, "Members and agents")), confirmBox,
    settings, sharing, exporting,
    h("div", { class: "two-col" },
      h("section", { class: "section", "aria-labelledby": "people-heading" },
        h("h2", { id: "people-heading", text: "Members" }), people, addPerson, invites),
      h("section", { class: "section", "aria-labelledby": "agents-heading" },
        h("h2", { id: "agents-heading", text: "Agents" }), agents, addAgent)),
    danger);

  const render = () => {
    const data = ctx.project.data();
    renderPeople(people, data, ctx);
    renderAgents(agents, data, ctx);
    renderSettings(settings, data, ctx);
    fill(danger, data.kind === "team" ? dangerZone(data, ctx) : null);
  };
  // The pickers redraw with the project: whoever leaves it or is removed is offered again.
  const pickers = [renderAddPerson(addPerson, ctx), renderAddAgent(addAgent, ctx)];
  const redraw = () => {
    render();
    for (const picker of pickers) picker.then((draw) => draw && draw());
  };
  render();
  const off = ctx.project.onChange(redraw);
  const reloadInvites = renderInvites(invites, ctx);
  // An invite accepted is a member joined: the open invites follow without a reload.
  const offJoined = stream.on("member.joined", () => reloadInvites.then((load) => load && load()));
  return () => {
    off();
    offJoined();
  };
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
    p.away ? badge("away", "warn") : null,
    memberActions(p, ctx))));
}

function memberActions(p, ctx) {
  const mine = p.handle === ctx.me.handle;
  const owner = ctx.project.data().role === "owner";
  const path = `/api/projects/${seg(ctx.slug)}`;
  const buttons = [];
  if (mine) {
    // The server says whether leaving would be refused (the last owner must promote someone first).
    if (ctx.project.data().can_leave) buttons.push(h("button", { type: "button", class: "danger-quiet small", text: "Leave",
      onclick: () => askRemoval(ctx, { handle: p.handle }, {
        title: `Leave ${ctx.project.data().project.name}?`, who: "you", confirm: "Leave the project",
        run: () => post(`${path}/leave`), after: () => { window.location.hash = "#/"; } }) }));
  } else if (owner) {
    if (p.role === "member") {
      buttons.push(h("button", { type: "button", class: "small", text: "Promote", "aria-label": `Promote ${p.display_name} to owner`,
        onclick: () => askPromotion(ctx, p) }));
    }
    buttons.push(h("button", { type: "button", class: "danger-quiet small", text: "Remove", "aria-label": `Remove ${p.display_name}`,
      onclick: () => askRemoval(ctx, { handle: p.handle }, {
        title: `Remove ${p.display_name} (@${p.handle}) from ${ctx.project.data().project.name}?`, who: p.display_name,
        confirm: `Remove ${p.display_name}`, run: () => del(`${path}/members/${seg(p.handle)}`) }) }));
  }
  return buttons.length ? h("span", { class: "member-actions" }, buttons) : null;
}

/** The project's name (owners rename it; its address stays) and its default lead. */
function renderSettings(box, data, ctx) {
  if (data.kind !== "team") {
    fill(box);
    return;
  }
  const done = async (text) => {
    announce(text);
    await ctx.project.refresh();
  };
  let rename = null;
  if (data.role === "owner") {
    const name = h("input", { id: "project-name-input", name: "name", maxlength: "80", required: true, autocomplete: "off", value: data.project.name });
    const save = h("button", { type: "submit", class: "small", text: "Rename" });
    const error = errorSlot();
    rename = h("form", { class: "row-form rename-project" },
      field(`Project name (its address stays ${data.project.slug})`, name), save, error);
    rename.addEventListener("submit", (e) => {
      e.preventDefault();
      act(save, error, async () => {
        const out = await post(`/api/projects/${seg(ctx.slug)}/rename`, { name: name.value.trim() });
        await done(`Renamed to ${out.project.name}`);
      });
    });
  }
  fill(box, h("section", { class: "section card", "aria-labelledby": "settings-heading" },
    h("h2", { id: "settings-heading", text: "Name and default lead" }), rename, leadBox(data, ctx, done)));
}

const SHARE_CHOICES = [["default", "Only what every project shares"],
  ["threads", "Also their task threads: the other members' agents may read them"]];

/** Your share rule here: what your agents share with the other members beyond the defaults. Sharing
 *  more asks "Confirm it's you" (the server's rule); sharing less never does. */
function shareRule(ctx) {
  const choice = select(SHARE_CHOICES, { name: "share", disabled: true }); // until the rule as it stands is in
  const save = h("button", { type: "submit", class: "small", text: "Save", disabled: true });
  const error = errorSlot();
  const form = h("form", { class: "row-form share-rule" },
    field("What your agents share with the other members", choice), save);
  get(`/api/projects/${seg(ctx.slug)}/share-rule`).then((out) => {
    choice.value = out.decision;
    choice.disabled = save.disabled = false;
  })
    .catch((err) => { error.textContent = err.message; error.hidden = false; });
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    choice.disabled = true; // a choice made while this one saves would be overwritten by its answer
    act(save, error, async () => {
      const out = await post(`/api/projects/${seg(ctx.slug)}/share-rule`, { decision: choice.value });
      choice.value = out.decision;
      announce(out.decision === "threads" ? "Your agents' task threads are shared" : "Your agents share the defaults");
    }).finally(() => { choice.disabled = false; });
  });
  return h("section", { class: "section card", "aria-labelledby": "share-heading" },
    h("h2", { id: "share-heading", text: "What your agents share" }),
    h("p", { class: "muted", text: "By default another member's agent sees a task's thread only when it asked, was given "
      + "the task or was mentioned in it. Sharing threads lets it read your agents' threads too, never post in them; "
      + "sharing more asks you to confirm it's you." }), form, error);
}

function leadBox(data, ctx, done) {
  // What you may do with the lead comes from the server: can_answer, can_step_down, can_pick_lead.
  const lead = data.lead;
  const error = errorSlot();
  const button = (text, cls, run) => {
    const b = h("button", { type: "button", class: `small ${cls}`, text });
    b.addEventListener("click", () => act(b, error, run));
    return b;
  };
  const parts = [h("p", { class: "lead-status" }, lead
    ? [h("strong", { text: lead.agent_id }), lead.state === "agreed"
      ? " leads this project: a person's message that names nobody wakes it."
      : ` was picked to lead this project${lead.picked_by ? ` by @${lead.picked_by}` : ""}; waiting for its owner to agree.`]
    : "No default lead: a message that names nobody wakes nobody.")];
  if (lead?.can_answer) {
    parts.push(h("div", { class: "button-row" },
      button("Agree to lead", "primary", async () => {
        await post(`/api/projects/${seg(ctx.slug)}/lead/answer`, { decision: "agree" });
        await done(`${lead.agent_id} now leads the project`);
      }),
      button("Decline", "", async () => {
        await post(`/api/projects/${seg(ctx.slug)}/lead/answer`, { decision: "decline" });
        await done("Declined: the project has no default lead");
      })));
  }
  if (lead?.can_step_down) {
    parts.push(h("div", { class: "button-row" }, button("Step down", "danger-quiet", async () => {
      await post(`/api/projects/${seg(ctx.slug)}/lead/step-down`, {});
      await done("Stepped down: the project has no default lead");
    })));
  }
  if (data.can_pick_lead) {
    const agent = select(data.agents.map((a) => [a.agent_id, `${a.name} (${a.agent_id})`]), { name: "lead", "aria-label": "Agent to lead the project" });
    if (lead) agent.value = lead.agent_id;
    const pick = h("button", { type: "submit", class: "small", text: "Pick as default lead" });
    const form = h("form", { class: "row-form pick-lead" }, agent, pick);
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      act(pick, error, async () => {
        await post(`/api/projects/${seg(ctx.slug)}/lead`, { agent_id: agent.value });
        await done(`Picked ${agent.value}: its owner agrees or declines`);
      });
    });
    parts.push(form);
  }
  parts.push(error);
  return h("div", { class: "lead-box" }, h("h3", { text: "Default lead" }), parts);
}

function renderAgents(box, data, ctx) {
  const owner = data.role === "owner";
  fill(box, data.agents.length ? data.agents.map((a) => h("article", { class: "card agent-card", dataset: { agent: a.agent_id } },
    h("div", { class: "pulse-head" }, avatar(a.name, a.agent_id, "agent"),
      h("div", {}, h("strong", { text: a.name }), h("div", { class: "muted small", text: a.agent_id })),
      availabilityBadge(a.availability)),
    a.role ? h("p", { text: a.role }) : null,
    h("p", { class: "muted small", text: `${a.model} · ${a.client} · owner @${a.owner}` }),
    a.capabilities?.length ? h("p", { class: "chips" }, a.capabilities.map((c) => h("span", { class: "chip", text: `${c.kind}: ${c.name}` }))) : null,
    h("p", { class: "muted small", text: `${a.trust_level ? `trust ${a.trust_level} · ` : ""}${a.last_seen_at ? `seen ${ago(a.last_seen_at)}` : "never seen"}` }),
    owner || a.owner === ctx.me.handle ? h("p", { class: "agent-actions" }, h("button", {
      type: "button", class: "danger-quiet small", text: "Remove agent", "aria-label": `Remove agent ${a.agent_id} from the project`,
      onclick: () => askRemoval(ctx, { agent: a.agent_id }, {
        title: `Take ${a.name} (${a.agent_id}) out of ${data.project.name}?`, who: a.agent_id, confirm: "Remove agent",
        run: () => del(`/api/projects/${seg(ctx.slug)}/agents/${a.agent_id.split("/").map(seg).join("/")}`) }) })) : null))
    : empty("No agents here yet."));
}

// ---- actions: confirming a removal or a promotion ---------------------------------------------

/** Show what leaving or removing would hand back (the server counts it), then do it on Confirm. */
async function askRemoval(ctx, query, { title, who, confirm, run, after }) {
  const box = ctx.confirmBox;
  const params = new URLSearchParams(query).toString();
  let preview;
  try {
    preview = await get(`/api/projects/${seg(ctx.slug)}/removal?${params}`);
  } catch (err) {
    fill(box, h("p", { class: "error", role: "alert", text: err.message }));
    return;
  }
  const plural = (n, one, many) => `${n} ${n === 1 ? one : many}`;
  const you = who === "you";
  const agentLine = query.agent ? `${query.agent} leaves the project.`
    : preview.agents.length ? `${you ? "Your" : "Their"} agents leave the project: ${preview.agents.join(", ")}.`
      : you ? "You have no agents here." : "They have no agents here.";
  const summary = h("ul", { class: "removal-summary" },
    h("li", { text: agentLine }),
    h("li", { text: `${plural(preview.returned, "open task", "open tasks")} assigned to ${query.agent ? "it" : you ? "your agents" : "them"} go${preview.returned === 1 ? "es" : ""} back to ${preview.returned === 1 ? "its requester" : "their requesters"} (returned), to be handed to another agent.` }),
    h("li", { text: `${plural(preview.transferred, "open task", "open tasks")} ${query.agent ? "it" : who === "you" ? "you" : "they"} asked for pass${preview.transferred === 1 ? "es" : ""} to a project owner.` }),
    h("li", { text: `Delegation rules and standing approvals naming ${query.agent ? "it" : who === "you" ? "you" : "them"} that apply in no other project are revoked, and keys for this project alone end.` }));
  const error = errorSlot();
  const yes = h("button", { type: "button", class: "danger", text: confirm });
  const no = h("button", { type: "button", class: "quiet", text: "Keep", onclick: () => fill(box) });
  const titleId = "removal-title";
  yes.addEventListener("click", async () => {
    const out = await act(yes, error, run);
    if (!out) return;
    fill(box);
    const c = out.counts;
    announce(`Done: ${plural(c.returned, "task", "tasks")} returned, ${plural(c.transferred, "task", "tasks")} passed to an owner`);
    if (after) return after();
    await ctx.project.refresh();
  });
  const panel = h("section", { class: "removal-confirm", role: "alertdialog", "aria-labelledby": titleId, tabindex: "-1" },
    h("h2", { id: titleId, text: title }), summary, h("div", { class: "removal-buttons" }, yes, no), error);
  fill(box, panel);
  panel.focus();
}

function askPromotion(ctx, p) {
  const box = ctx.confirmBox;
  const error = errorSlot();
  const yes = h("button", { type: "button", class: "primary", text: `Make ${p.display_name} an owner` });
  const no = h("button", { type: "button", class: "quiet", text: "Keep", onclick: () => fill(box) });
  yes.addEventListener("click", async () => {
    const out = await act(yes, error, () => post(`/api/projects/${seg(ctx.slug)}/members/${seg(p.handle)}/promote`));
    if (!out) return;
    fill(box);
    announce(`${p.handle} is now an owner`);
    await ctx.project.refresh();
  });
  const panel = h("section", { class: "removal-confirm", role: "alertdialog", "aria-labelledby": "promote-title", tabindex: "-1" },
    h("h2", { id: "promote-title", text: `Make ${p.display_name} an owner?` }),
    h("p", { text: "Owners add and remove members, and a project keeps at least one." }),
    h("div", { class: "removal-buttons" }, yes, no), error);
  fill(box, panel);
  panel.focus();
}

/** The "Add a teammate" picker (project owners); resolves to its redraw once the team is loaded. */
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
  return draw;
}

/** The "Bring one of your agents" picker; resolves to its redraw (or null when it can't load). */
async function renderAddAgent(box, ctx) {
  let mine = [];
  try {
    ({ agents: mine } = await get("/api/agents"));
  } catch {
    return null;
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
  return draw;
}

/** The invite form and the open invites (owners); resolves to a function that reads the invites again. */
async function renderInvites(box, ctx) {
  const data = ctx.project.data();
  if (data.role !== "owner") return null;
  const shown = h("div", { class: "invite-made", "aria-live": "polite" });
  const list = h("ul", { class: "invite-list" });
  const email = h("input", { type: "email", name: "email", required: true, maxlength: 254, autocomplete: "off" });
  const role = select([["member", "member"], ["owner", "owner"]], { name: "invite-role" });
  const submit = h("button", { type: "submit", class: "primary", text: "Send invite" });
  const error = errorSlot();
  const form = h("form", { class: "inline-form", "aria-labelledby": "invite-heading" },
    h("h3", { id: "invite-heading", text: "Invite by email" }),
    h("p", { class: "muted small", text: "Anyone not yet in the team gets a link to sign up and join. It works once, for 7 days." }),
    h("div", { class: "inline-fields" }, field("Email address", email), field("Role", role)), submit, error, shown);

  const load = async () => {
    let invites;
    try {
      ({ invites } = await get(`/api/projects/${seg(ctx.slug)}/invites`));
    } catch (err) {
      if (err.status === 403) {
        fill(box, h("p", { class: "muted small", text: `Owners of both this project and team ${data.project.team} invite people.` }));
        return false;
      }
      fill(list, h("li", { class: "error", role: "alert", text: err.message }));
      return true;
    }
    fill(list, invites.length ? invites.map((i) => inviteRow(i, ctx, shown, load))
      : h("li", { class: "muted small", text: "No open invites." }));
    return true;
  };
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const out = await act(submit, error, () => post(`/api/projects/${seg(ctx.slug)}/invites`, { email: email.value.trim(), role: role.value }));
    if (out) {
      showLink(shown, out);
      email.value = "";
      await load();
    }
  });
  fill(box, form, h("h3", { text: "Open invites" }), list);
  return (await load()) ? load : null;
}

function inviteRow(invite, ctx, shown, reload) {
  const error = errorSlot();
  const resend = h("button", { type: "button", class: "small", text: "Resend", "aria-label": `Resend the invite to ${invite.email}` });
  resend.addEventListener("click", async () => {
    const out = await act(resend, error, () => post(`/api/invites/${seg(invite.id)}/resend`, {}));
    if (out) {
      showLink(shown, out);
      await reload();
    }
  });
  const revoke = revokeButton(error, `Revoke the invite to ${invite.email}`, async () => {
    await post(`/api/invites/${seg(invite.id)}/revoke`, {});
    announce(`The invite to ${invite.email} was revoked`);
    await reload();
  });
  return h("li", { class: "invite-row", dataset: { invite: invite.id } },
    h("span", { class: "invite-who" }, h("strong", { text: invite.email }), " ", badge(invite.role, invite.role === "owner" ? "info" : "muted")),
    h("span", { class: "muted small" }, `by @${invite.invited_by} · expires `, timeEl(invite.expires_at)),
    h("span", { class: "invite-actions" }, resend, revoke), error);
}

/** The link just made, to copy and pass on, and whether it was mailed. */
function showLink(box, out) {
  const link = h("input", { type: "text", readonly: true, value: out.link, class: "code invite-link", "aria-label": "Invite link" });
  link.addEventListener("focus", () => link.select());
  fill(box, h("div", { class: "notice ok", role: "status" },
    h("p", { text: out.mailed ? `Mailed to ${out.invite.email}. You can also pass the link on yourself:`
      : `Not mailed: ${out.mail_problem}. The link for ${out.invite.email}:` }),
    h("div", { class: "invite-link-row" }, link, copyButton(() => out.link, "Copy link"))));
  announce(out.mailed ? `Invite mailed to ${out.invite.email}` : "Invite made: copy its link");
}
