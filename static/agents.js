// agents.js — your agents and their credentials: add an agent (model, client, role,
// capabilities), add it to projects, mint a client key (shown once, with set-up lines
// for Claude Code and Codex, never stored by the page), list and revoke keys, and the
// runner devices paired to your agents and signing out everywhere (devices.js), and closing your
// account (account.js).

import { get, post, del, seg } from "./api.js";
import { createDevices, createSignOutEverywhere } from "./devices.js";
import { createCloseAccount } from "./account.js";
import * as pauses from "./pauses.js";
import {
  h, heading, field, select, errorSlot, act, fill, empty, avatar, badge, timeEl, revokeButton, confirmButton, copyButton,
  lines, announce, loadFailed, clearError,
} from "./ui.js";

const CAPABILITY_KINDS = ["mcp", "repo", "deploy", "data", "other"];

// ---- lifecycle ---------------------------------------------------------------------------------------

export function mount(el, ctx) {
  const state = { agents: [], keys: [], projects: [], devices: [] };
  const agentsBox = h("div", { class: "agent-grid" }, h("p", { class: "muted", text: "Loading your agents…" }));
  const keysBox = h("div", { class: "table-wrap" });
  const shown = h("div", { class: "secret-slot" });
  const error = errorSlot();
  const devices = createDevices(shown, () => reload());
  const appsBox = h("div", { class: "table-wrap" });
  const everywhere = createSignOutEverywhere(() => reload());
  const closing = createCloseAccount();
  const pauseBox = h("div", { class: "pause-box" });
  el.append(
    h("div", { class: "page-head" }, heading(1, "Agents & keys"),
      h("p", { class: "muted", text: "Your agents connect over MCP with a key you make here." })),
    error, pauseBox, shown,
    h("section", { class: "section", "aria-labelledby": "my-agents" }, h("h2", { id: "my-agents", text: "Your agents" }), agentsBox),
    addAgentForm(ctx, state, () => reload()),
    h("section", { class: "section", "aria-labelledby": "keys-heading" }, h("h2", { id: "keys-heading", text: "Keys" }),
      h("p", { class: "muted", text: "Keys of yours and your agents'. Prickle keeps only a hash: a lost key is revoked and made again." }),
      keysBox),
    h("section", { class: "section", "aria-labelledby": "apps-heading" }, h("h2", { id: "apps-heading", text: "Connected apps" }),
      h("p", { class: "muted", text: "Apps you connected with a sign-in (OAuth), such as Claude Desktop or Claude Code, each acting as one of your agents." }),
      appsBox),
    devices.el, everywhere.el, closing.el);

  const reload = async () => {
    try {
      const [a, k, p, d, paused, apps] = await Promise.all([get("/api/agents"), get("/api/keys"), get("/api/projects"),
        get("/api/devices"), get("/api/agents/paused"), get("/api/apps")]);
      renderApps(appsBox, apps.apps, reload);
      renderPause(pauseBox, paused.paused_by, reload);
      state.paused = Object.fromEntries(paused.agents.map((p) => [p.agent_id, p]));
      state.agents = a.agents;
      state.keys = k.keys;
      state.projects = p.projects;
      state.devices = d.devices;
      clearError(error);
      renderAgents(agentsBox, state, ctx, shown, reload);
      renderKeys(keysBox, state, reload);
      devices.render(state.agents, state.devices);
    } catch (err) {
      if (state.loaded) showFailure(error, err); // the lists on screen stay; say why they did not refresh
      else fill(agentsBox, loadFailed(err, reload));
      return;
    }
    state.loaded = true;
  };
  reload();
  const offPauses = pauses.onChange(() => reload()); // paused or resumed from the header's chip
  return () => {
    offPauses();
    fill(shown); // the secret leaves the page with the view
  };
}

function showFailure(slot, err) {
  slot.textContent = err.message;
  slot.hidden = false;
}

// ---- actions ----------------------------------------------------------------------------------------------

/** Pause all your agents' runs (refused with "paused" at their next call), after a confirmation; or resume them. */
function renderPause(box, pausedBy, reload) {
  const error = errorSlot();
  const button = h("button", { type: "button", class: pausedBy ? "primary" : "danger-quiet",
    text: pausedBy ? "Resume all my agents" : "Pause all my agents", disabled: pausedBy === "operator" });
  button.addEventListener("click", async () => {
    if (pausedBy) await act(button, error, () => pauses.resume(null));
    else await pauses.confirmPause(null, button);
  });
  const text = pausedBy === "operator" ? "The server's operator paused every agent: nothing runs until they resume."
    : pausedBy ? "Your agents are paused: their runs are refused and their runners start nothing."
      : "Pausing stops every run of your agents at its next call; runners start nothing until you resume.";
  fill(box, h("div", { class: `banner ${pausedBy ? "banner-warn" : "banner-info"} pause` },
    h("p", { class: "pause-text", text }), button, error));
}

function addAgentForm(ctx, state, reload) {
  const name = h("input", { name: "name", required: true, pattern: "[a-z0-9]+(-[a-z0-9]+)*", maxlength: "39", autocomplete: "off", spellcheck: "false" });
  const display = h("input", { name: "display_name", required: true, maxlength: "80", autocomplete: "off" });
  const model = h("input", { name: "model", required: true, maxlength: "80", list: "model-hints", autocomplete: "off" });
  const client = h("input", { name: "client", required: true, maxlength: "40", list: "client-hints", autocomplete: "off" });
  const role = h("input", { name: "role", maxlength: "200", autocomplete: "off" });
  const caps = h("textarea", { name: "capabilities", rows: "3", spellcheck: "false" });
  const projects = h("fieldset", { class: "checks" }, h("legend", { text: "Projects" }));
  const submit = h("button", { type: "submit", class: "primary", text: "Add agent" });
  const error = errorSlot();
  const details = h("details", { class: "section disclosure" }, h("summary", {}, h("h2", { text: "Add an agent" })));
  const form = h("form", { class: "grid-form" },
    field(`Name (its address is ${ctx.me.handle}/NAME)`, name, "Lowercase letters, digits and dashes."),
    field("Display name", display),
    field("Model", model), field("Client", client, "The program it runs in, e.g. claude-code or codex."),
    h("div", { class: "wide" }, field("Role", role, "What it does for the team, in a few words.")),
    h("div", { class: "wide" }, field("Capabilities", caps, `One per line as kind:name — kinds: ${CAPABILITY_KINDS.join(", ")}. E.g. repo:website`)),
    h("div", { class: "wide" }, projects),
    h("datalist", { id: "model-hints" }, ["claude-opus-4", "claude-sonnet-4", "gpt-5-codex", "gpt-5"].map((m) => h("option", { value: m }))),
    h("datalist", { id: "client-hints" }, ["claude-code", "codex", "other"].map((m) => h("option", { value: m }))),
    h("div", { class: "form-actions" }, submit), error);
  details.addEventListener("toggle", async () => {
    if (!details.open) return;
    try {
      const mine = (await get("/api/projects")).projects.filter((p) => p.kind !== "private"); // private rooms hold every agent
      fill(projects, h("legend", { text: "Projects (optional)" }), mine.length ? mine.map((p) => h("label", { class: "check" },
        h("input", { type: "checkbox", value: p.slug }), ` ${p.name} `, h("span", { class: "muted small", text: p.slug })))
        : h("p", { class: "muted small", text: "You are in no project yet." }));
    } catch { /* the list stays empty */ }
  });
  name.addEventListener("input", () => {
    if (!display.dataset.touched) display.value = name.value ? name.value[0].toUpperCase() + name.value.slice(1) : "";
  });
  display.addEventListener("input", () => { display.dataset.touched = "1"; });
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const out = await act(submit, error, () => {
      const capabilities = lines(caps.value).map((line) => {
        const at = line.indexOf(":");
        const kind = at > 0 ? line.slice(0, at).trim() : "other";
        const cname = at > 0 ? line.slice(at + 1).trim() : line;
        if (!CAPABILITY_KINDS.includes(kind)) throw new Error(`“${line}”: the kind must be one of ${CAPABILITY_KINDS.join(", ")}.`);
        return { kind, name: cname };
      });
      const body = { name: name.value.trim(), display_name: display.value.trim(), model: model.value.trim(),
        client: client.value.trim(), capabilities,
        projects: [...projects.querySelectorAll("input:checked")].map((i) => i.value) };
      if (role.value.trim()) body.role = role.value.trim();
      return post("/api/agents", body);
    });
    if (out) {
      announce(`Added ${out.agent.agent_id}`);
      form.reset();
      delete display.dataset.touched;
      details.open = false;
      reload();
    }
  });
  details.append(form);
  return details;
}

// ---- rendering ---------------------------------------------------------------------------------------------

function renderAgents(box, state, ctx, shown, reload) {
  fill(box, state.agents.length ? state.agents.map((a) => {
    const projectsIn = new Set(a.projects || []);
    const addable = state.projects.filter((p) => p.kind !== "private" && !projectsIn.has(p.slug));
    const addError = errorSlot();
    let addForm = null;
    if (addable.length) {
      const which = select(addable.map((p) => [p.slug, p.name]), { "aria-label": `Project to add ${a.name} to` });
      const add = h("button", { type: "submit", class: "small", text: "Add to project" });
      addForm = h("form", { class: "row-form" }, which, add);
      addForm.addEventListener("submit", async (e) => {
        e.preventDefault();
        const out = await act(add, addError, () => post(`/api/projects/${seg(which.value)}/agents`, { agent_id: a.agent_id }));
        if (out) {
          announce(`${a.agent_id} joined ${which.value}`);
          reload();
        }
      });
    }
    const scope = select([["", "Every project it is in"], ...[...projectsIn].map((s) => [s, `Only ${s}`])],
      { "aria-label": `Which projects ${a.name}'s key reaches` });
    const label = h("input", { name: "label", maxlength: "60", autocomplete: "off", placeholder: "Key name, e.g. laptop",
      "aria-label": `Key name for ${a.name}'s new key` });
    const mint = h("button", { type: "submit", class: "small primary", text: "Make a key" });
    const mintError = errorSlot();
    const mintForm = h("form", { class: "row-form mint-form" }, label, scope, mint);
    mintForm.addEventListener("submit", async (e) => {
      e.preventDefault();
      const body = { agent_id: a.agent_id };
      if (scope.value) body.project = scope.value;
      if (label.value.trim()) body.label = label.value.trim();
      const out = await act(mint, mintError, () => post("/api/keys", body));
      if (out) {
        showSecret(shown, a, out);
        reload();
      }
    });
    return h("article", { class: `card agent-card${state.paused?.[a.agent_id] ? " paused-agent" : ""}`, dataset: { agent: a.agent_id } },
      h("div", { class: "pulse-head" }, avatar(a.name, a.agent_id, "agent"),
        h("div", {}, h("strong", { text: a.name }), h("div", { class: "muted small", text: a.agent_id }))),
      agentPause(a, state.paused?.[a.agent_id]),
      a.role ? h("p", { text: a.role }) : null,
      a.needs_update ? h("p", { class: "banner banner-warn needs-update", role: "status",
        text: "Its runner needs an update: it is too old to answer in your private room. Update Prickle on that computer (pip install -U prickle) and start prickle runner again." }) : null,
      h("p", { class: "muted small", text: `${a.model} · ${a.client}` }),
      a.capabilities?.length ? h("p", { class: "chips" }, a.capabilities.map((c) => h("span", { class: "chip", text: `${c.kind}: ${c.name}` }))) : null,
      h("p", { class: "small" }, "In: ", (a.projects || []).length
        ? a.projects.map((s, i) => [i ? ", " : "", h("a", { href: `#/p/${s}/room`, text: s })]) : h("span", { class: "muted", text: "no project yet" })),
      addForm, addError,
      projectsIn.size ? [mintForm, mintError] : h("p", { class: "muted small", text: "Add it to a project to make a key." }));
  }) : empty("You have no agents yet. Add one below."));
}

/** One agent's pause: "Paused by …" with Resume, or Pause (asks first). The server says who may. */
function agentPause(agent, pause) {
  const error = errorSlot();
  if (pause) {
    const resume = pause.by === "owner" ? h("button", { type: "button", class: "small primary", text: "Resume",
      "aria-label": `Resume ${agent.agent_id}` }) : null;
    resume?.addEventListener("click", () => act(resume, error, () => pauses.resume(agent.agent_id)));
    return h("div", { class: "agent-pause" }, badge("paused", "warn"),
      h("span", { class: "small", text: pauses.pausedBy(agent.agent_id, pause) }), resume, error);
  }
  const button = h("button", { type: "button", class: "small danger-quiet", text: "Pause",
    "aria-label": `Pause ${agent.agent_id}` });
  button.addEventListener("click", () => pauses.confirmPause(agent, button));
  return h("div", { class: "agent-pause" }, button, error);
}

function renderKeys(box, state, reload) {
  if (!state.keys.length) {
    fill(box, empty("No keys yet."));
    return;
  }
  const revoked = state.keys.filter((k) => k.revoked_at).length;
  // Revoked keys stay listed for the record, behind a toggle kept across redraws (it keeps focus).
  if (!state.revokedToggle) {
    const input = h("input", { type: "checkbox", name: "show-revoked" });
    state.revokedToggle = { label: h("label", { class: "check keys-toggle" }, input, h("span")), input };
    input.addEventListener("change", () => renderKeys(box, state, reload));
  }
  const { label, input } = state.revokedToggle;
  label.lastChild.textContent = `Show revoked keys (${revoked})`;
  const keys = state.keys.filter((k) => input.checked || !k.revoked_at)
    .sort((a, b) => (b.created_at || "").localeCompare(a.created_at || ""));
  fill(box, revoked ? label : null, keys.length ? h("table", { class: "keys" },
    h("caption", { class: "sr-only", text: "Keys" }),
    h("thead", {}, h("tr", {}, ["Name", "Kind", "For", "Reaches", "Made", "Last used", "Status", ""].map((t) => h("th", { scope: "col", text: t })))),
    h("tbody", {}, keys.map((k) => {
      const error = errorSlot();
      const revoke = k.revoked_at ? null : revokeButton(error, `Revoke ${k.kind} key for ${k.agent_id || k.person}`, async () => {
        await del(`/api/keys/${seg(k.id)}`);
        announce("Key revoked: it stopped working at once");
        reload();
      });
      const expired = k.expires_at && new Date(k.expires_at) < new Date();
      // data-label names each cell where a narrow screen stacks the row.
      return h("tr", { dataset: { keyId: k.id }, class: k.revoked_at ? "revoked" : "" },
        h("td", { class: k.label ? "key-name" : "key-name muted", "data-label": "", text: k.label || "unnamed" }),
        h("td", { "data-label": "Kind", text: { client: "client key", runner: "runner key", person: "personal token" }[k.kind] || k.kind }),
        h("td", { "data-label": "For", text: k.agent_id || `@${k.person}` }),
        h("td", { "data-label": "Reaches", text: k.kind === "runner" ? "its runner device's work"
          : k.project === "@rooms" ? "your private rooms only" : k.project || (k.agent_id ? "all its projects" : "—") }),
        h("td", { "data-label": "Made" }, timeEl(k.created_at)),
        h("td", { "data-label": "Last used" }, k.last_used_at ? timeEl(k.last_used_at, true) : h("span", { class: "muted", text: "never" })),
        h("td", { "data-label": "Status" }, k.revoked_at ? [badge("revoked", "muted"), " ", timeEl(k.revoked_at)]
          : expired ? badge("expired", "muted") : badge("active", "ok")),
        h("td", { "data-label": "" }, revoke, error));
    }))) : empty("Every key here is revoked."));
}

/** The apps connected as your agents, each with Disconnect (its tokens end at once). */
function renderApps(box, apps, reload) {
  if (!apps.length) {
    fill(box, empty("No apps connected. An MCP client that signs in (OAuth) shows here once you approve it."));
    return;
  }
  fill(box, h("table", { class: "keys apps" },
    h("caption", { class: "sr-only", text: "Connected apps" }),
    h("thead", {}, h("tr", {}, ["App", "Acts as", "In", "Connected", "Last used", ""].map((t) => h("th", { scope: "col", text: t })))),
    h("tbody", {}, apps.map((app) => {
      const error = errorSlot();
      const name = app.client_name || "an app with no name";
      const off = confirmButton("Disconnect", "Click again to disconnect", (button) => act(button, error, async () => {
        await del(`/api/apps/${seg(app.family)}`);
        announce("Disconnected: the app's access ended at once");
        reload();
      }), { class: "danger-quiet small", "aria-label": `Disconnect ${name} (${app.agent_id})` });
      return h("tr", { dataset: { family: app.family } },
        h("td", { class: "key-name", "data-label": "", text: name }),
        h("td", { "data-label": "Acts as", text: app.agent_id }),
        h("td", { "data-label": "In", text: app.project || "all its projects" }),
        h("td", { "data-label": "Connected" }, timeEl(app.connected_at)),
        h("td", { "data-label": "Last used" }, app.last_used_at ? timeEl(app.last_used_at, true) : h("span", { class: "muted", text: "never" })),
        h("td", { "data-label": "" }, off, error));
    }))));
}

/** The new key, once: the secret with copy-paste set-up lines. Nothing is stored. */
function showSecret(box, agent, out) {
  const hide = h("button", { type: "button", text: "I have copied it — hide the key" });
  const codeBlock = (label, text) => h("div", { class: "setup" },
    h("div", { class: "setup-head" }, h("strong", { text: label }), copyButton(() => text)),
    h("pre", { class: "code", text }));
  const panel = h("section", { class: "card secret", role: "region", "aria-labelledby": "secret-heading", tabindex: "-1" },
    h("h2", { id: "secret-heading", text: `New key for ${agent.agent_id}` }),
    h("p", { class: "banner banner-warn inline" }, h("strong", { text: "Copy it now. " }),
      "Prickle shows this key only once and does not keep it. Anyone with it can act as this agent."),
    codeBlock("Key", out.token),
    out.claude_code ? codeBlock("Claude Code", out.claude_code) : null,
    // Codex: TOML for its config file and a shell line for the key, each copied on its own.
    out.codex_config ? codeBlock("Codex: add to ~/.codex/config.toml", out.codex_config) : null,
    out.codex_env ? codeBlock("Codex: run in the shell that starts codex", out.codex_env) : null,
    out.url ? h("p", { class: "muted small" }, "Any other MCP client: Streamable HTTP at ", h("code", { text: out.url }),
      " with the header Authorization: Bearer <key>.") : null,
    h("p", { class: "muted small", text: "Then tell the agent to start with get_project_context and to wait in wait_for_mention." }),
    hide);
  hide.addEventListener("click", () => fill(box));
  fill(box, panel);
  panel.focus();
  panel.scrollIntoView({ block: "start" });
}
