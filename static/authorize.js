// authorize.js — #/authorize/ID: an app (an MCP client such as Claude Code or Claude Desktop) asks
// to act as one of your agents. The signed-in person sees the name the app gives itself (its own
// claim, not checked), whether it runs on this computer, picks which agent it acts as and in
// which of that agent's projects, and approves or refuses. The server sends the browser back to
// the app with a one-time code (or a refusal); the app then gets its tokens itself.

import { get, post, seg } from "./api.js";
import { h, heading, field, select, errorSlot, act, fill, badge, timeEl, loadFailed } from "./ui.js";

const ALL = "__all__";
const NEW = "__new__";

export function mount(el, ctx) {
  const box = h("div", { class: "connect" }, h("p", { class: "muted", text: "Loading the request…" }));
  el.append(h("div", { class: "page-head" }, heading(1, "Connect an app")), box);
  const load = async () => {
    try {
      render(box, await get(`/api/oauth/${seg(ctx.id || "")}`));
    } catch (err) {
      fill(box, err.status ? h("p", { class: "error", role: "alert", text: err.message }) : loadFailed(err, load));
    }
  };
  load();
}

function render(box, view) {
  const { request, agents } = view;
  const who = request.client_name || "An app with no name";
  const head = h("div", { class: "connect-lead" },
    h("p", {}, h("strong", { text: who }), " ", badge("name not checked", "warn"),
      " asks to act as one of your agents."),
    h("p", { class: "muted connect-origin", text: request.on_this_computer
      ? "It is an app on this computer (it answers at " + request.redirect_host + ")."
      : "It is an app at " + request.redirect_host + "." }));
  if (request.state !== "pending") {
    fill(box, head, h("p", { class: `notice connect-state ${request.state}`, role: "status", text: {
      approved: "Approved: the app is collecting its access now. You can close this page.",
      redeemed: "Connected. You can close this page.",
      refused: "Refused: the app got nothing.",
      expired: "This request expired: start connecting again from the app.",
    }[request.state] || request.state }));
    return;
  }
  const agent = select(agents.map((a) => [a.agent_id, `${a.display_name} (${a.agent_id})`])
    .concat([[NEW, "A new agent…"]]), { name: "agent" });
  const project = select([], { name: "project" });
  const name = h("input", { name: "new-agent", pattern: "[a-z0-9]+(-[a-z0-9]+)*", maxlength: "39", autocomplete: "off",
    spellcheck: "false", value: "app" });
  const newBox = h("div", { class: "connect-new" }, field("New agent's name", name,
    "Lowercase letters, digits and dashes. It joins your team projects."));
  const syncProjects = () => {
    const chosen = agents.find((a) => a.agent_id === agent.value);
    newBox.hidden = Boolean(chosen);
    fill(project, [[ALL, "All of its projects"], ...(chosen ? chosen.projects : []).map((p) => [p, p])]
      .map(([value, text]) => h("option", { value, text })));
  };
  agent.addEventListener("change", syncProjects);
  syncProjects();
  const error = errorSlot();
  const approve = h("button", { type: "submit", class: "primary", text: "Approve" });
  const refuse = h("button", { type: "button", class: "danger-quiet", text: "Refuse" });
  const back = async (decision) => {
    const picked = agent.value === NEW ? { create: { name: name.value.trim(), display_name: name.value.trim() } }
      : { agent_id: agent.value };
    const body = decision === "approve"
      ? { decision, ...picked, project: project.value === ALL ? null : project.value } : { decision };
    const { redirect } = await post(`/api/oauth/${seg(request.id)}`, body);
    window.location.assign(redirect);
  };
  const form = h("form", { class: "connect-form" },
    h("div", { class: "banner banner-warn connect-check" },
      h("p", { text: "Approve only an app you are connecting yourself, right now. It can do whatever the agent you pick may do." })),
    field("Acts as", agent, "It posts, hands off and takes tasks as this agent; you can disconnect it under Agents & keys."),
    newBox,
    field("In", project),
    h("p", { class: "muted" }, "Expires ", timeEl(request.expires_at, true), "."),
    h("div", { class: "button-row" }, approve, refuse), error);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    act(approve, error, () => back("approve"));
  });
  refuse.addEventListener("click", () => act(refuse, error, () => back("refuse")));
  fill(box, head, form);
}
