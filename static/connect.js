// connect.js — #/connect/CODE: a computer asks to connect its runner. The signed-in person sees
// its name, where and when it asked and the agent CLIs found on it, types the code their own
// computer shows (a link someone else sent is not enough), picks (or creates) one agent per CLI,
// and approves or refuses. The runner then collects the keys itself: no key ever shows on this page.

import { get, post, seg } from "./api.js";
import { h, heading, field, select, errorSlot, act, fill, announce, badge, timeEl, loadFailed } from "./ui.js";

const NEW = "__new__";

// ---- lifecycle ---------------------------------------------------------------------------

export function mount(el, ctx) {
  const box = h("div", { class: "connect" }, h("p", { class: "muted", text: "Loading the request…" }));
  el.append(h("div", { class: "page-head" }, heading(1, "Connect a computer")), box);
  if (!ctx.id) {
    fill(box, h("p", { text: "Open the link that prickle runner connect printed on the computer." }));
    return;
  }
  const load = async () => {
    try {
      render(box, await get(`/api/connect/${seg(ctx.id)}`), load);
    } catch (err) {
      fill(box, err.status ? h("p", { class: "error", role: "alert", text: err.message }) : loadFailed(err, load));
    }
  };
  load();
}

// ---- rendering ---------------------------------------------------------------------------

function render(box, view, reload) {
  const { request, agents, clients } = view;
  const head = h("div", { class: "connect-lead" },
    h("p", {}, "A computer calling itself ", h("strong", { text: request.name }), " asks to run your agents."),
    h("p", { class: "muted connect-origin" }, "It asked from ", h("strong", { text: request.address || "an unknown address" }),
      " at ", timeEl(request.created_at), "."));
  if (request.state !== "pending") {
    fill(box, head, h("p", { class: `notice connect-state ${request.state}`, role: "status", text: {
      approved: "Approved: the runner on that computer is collecting its keys now. You can close this page.",
      collected: "Connected: the runner on that computer has its keys.",
      refused: "Refused: nothing was connected.",
      expired: "This code expired: run prickle runner connect on the computer again.",
    }[request.state] || request.state }));
    return;
  }
  const picks = request.clis.map((cli) => pickRow(cli, agents, clients));
  const typed = h("input", { name: "typed_code", id: "connect-typed-code", required: true, autocomplete: "off",
    spellcheck: "false", maxlength: "12", placeholder: "XXXX-XXXX", class: "code-input" });
  const check = h("div", { class: "banner banner-warn connect-check" },
    h("p", { text: "Approve only a computer you are connecting yourself, right now. If someone sent you this link, refuse it." }),
    field("The code your computer shows", typed, "prickle runner connect printed it in the terminal on that computer."));
  const error = errorSlot();
  const approve = h("button", { type: "submit", class: "primary", text: "Approve" });
  const refuse = h("button", { type: "button", class: "danger-quiet", text: "Refuse" });
  const form = h("form", { class: "connect-form" },
    h("p", { class: "muted" }, "Expires ", timeEl(request.expires_at, true),
      ". One agent per app found on it; each gets its own runner key, collected once by that computer."),
    check,
    picks.map((p) => p.el),
    h("div", { class: "button-row" }, approve, refuse), error);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    act(approve, error, async () => {
      await post(`/api/connect/${seg(request.code)}`, { decision: "approve", typed_code: typed.value,
        agents: picks.map((p) => p.value()) });
      announce("Approved: the computer collects its keys");
      reload();
    });
  });
  refuse.addEventListener("click", () => act(refuse, error, async () => {
    await post(`/api/connect/${seg(request.code)}`, { decision: "refuse" });
    announce("Refused");
    reload();
  }));
  fill(box, head, form);
}

function pickRow(cli, agents, clients) {
  const own = agents.filter((a) => a.client === clients[cli]);
  const others = agents.filter((a) => a.client !== clients[cli]);
  const choice = select([...own, ...others].map((a) => [a.agent_id, `${a.display_name} (${a.agent_id})`])
    .concat([[NEW, "A new agent…"]]), { name: `agent-${cli}` });
  choice.value = own[0]?.agent_id || NEW;
  const name = h("input", { name: `new-${cli}`, pattern: "[a-z0-9]+(-[a-z0-9]+)*", maxlength: "39", autocomplete: "off",
    spellcheck: "false", value: cli === "claude" ? "claude" : cli });
  const newBox = h("div", { class: "connect-new" }, field("New agent's name", name, "Lowercase letters, digits and dashes."));
  const sync = () => { newBox.hidden = choice.value !== NEW; };
  choice.addEventListener("change", sync);
  sync();
  const el = h("fieldset", { class: "connect-pick", dataset: { cli } },
    h("legend", {}, badge(cli, "info"), ` runs as`), field(`Agent for ${cli}`, choice), newBox);
  return {
    el,
    value: () => (choice.value === NEW
      ? { cli, create: { name: name.value.trim(), display_name: name.value.trim(), model: cli } }
      : { cli, agent_id: choice.value }),
  };
}
