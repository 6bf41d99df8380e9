// devices.js — runner devices, on "Agents & keys": pair a device for one of your agents
// (its runner key is shown once, with the lines `prickle device pair` prints), list your
// devices with when and from where each was last used, revoke one or mark it stolen (which
// ends its key, its runs and every credential its runner was given), and sign out everywhere.

import { post, del, seg, token, endedHere } from "./api.js";
import {
  h, field, errorSlot, act, fill, empty, badge, timeEl, revokeButton, confirmButton, copyButton, announce,
} from "./ui.js";

// ---- lifecycle ------------------------------------------------------------------------------------

/** The "Runner devices" section. shown: where a new key is shown once; reload(): fetch everything again.
 *  Returns {el, render(agents, devices)}. */
export function createDevices(shown, reload) {
  const agent = h("select", { name: "agent_id", required: true });
  const name = h("input", { name: "device_name", maxlength: "80", autocomplete: "off", spellcheck: "false",
    placeholder: "e.g. ren-laptop" });
  const submit = h("button", { type: "submit", class: "primary", text: "Pair a device" });
  const error = errorSlot();
  const form = h("form", { class: "grid-form pair-form", "aria-labelledby": "pair-heading" },
    h("h3", { id: "pair-heading", class: "wide", text: "Pair a device" }),
    field("Agent", agent, "The runner starts this agent's work on that computer."),
    field("Device name (optional)", name, "What to call the computer, so you know which one to revoke."),
    h("div", { class: "form-actions" }, submit), error);
  const notice = h("p", { class: "notice ok", role: "status", hidden: true });
  const table = h("div", { class: "table-wrap" }, h("p", { class: "muted", text: "Loading your devices…" }));
  const el = h("section", { class: "section", "aria-labelledby": "devices-heading" },
    h("h2", { id: "devices-heading", text: "Runner devices" }),
    h("p", { class: "muted", text: "A runner is a small program on your computer, paired to one agent. It waits for the "
      + "agent's work and starts its CLI with a credential for that one piece of work." }),
    notice, table, h("div", { class: "card pair-card" }, form));

  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const body = { agent_id: agent.value };
    if (name.value.trim()) body.name = name.value.trim();
    const out = await act(submit, error, () => {
      if (!agent.value) throw new Error("Add an agent first: a device pairs with one of your agents.");
      return post("/api/devices", body);
    });
    if (out) {
      name.value = "";
      notice.hidden = true;
      showRunnerKey(shown, out);
      reload();
    }
  });

  return {
    el,
    render(agents, devices) {
      const keep = agent.value;
      fill(agent, agents.map((a) => h("option", { value: a.agent_id, text: `${a.name} (${a.agent_id})` })));
      if (keep && agents.some((a) => a.agent_id === keep)) agent.value = keep;
      submit.disabled = !agents.length;
      renderDevices(table, devices, notice, reload);
    },
  };
}

/** The "Sign out everywhere" section: every browser session of yours and every device of your agents
 *  end at once. reload(): fetch everything again (when this tab goes on with a personal token). */
export function createSignOutEverywhere(reload) {
  const error = errorSlot();
  const notice = h("p", { class: "notice ok", role: "status", hidden: true });
  const button = confirmButton("Sign out everywhere", "Click again: end every session and device",
    (b) => signOutEverywhere(b), { class: "danger-quiet" });
  const el = h("section", { class: "section", "aria-labelledby": "everywhere-heading" },
    h("h2", { id: "everywhere-heading", text: "Sign out everywhere" }),
    h("p", { class: "muted", text: "Lost a computer or a phone? This ends every browser session you have, here and "
      + "elsewhere, and every runner device paired to your agents, with their runs. Your agents' keys and personal "
      + "tokens keep working; revoke those above if they were on it too." }),
    notice, h("div", { class: "form-actions" }, button), error);

  async function signOutEverywhere(b) {
    const out = await act(b, error, () => post("/api/signout/everywhere"));
    if (!out) return;
    const text = `Signed out everywhere: ${count(out.sessions_ended, "session")} and `
      + `${count(out.devices_ended, "device")} ended.`;
    if (!token()) return endedHere(`${text} Sign in again to continue.`); // this tab's session was one of them
    notice.textContent = text;
    notice.hidden = false;
    announce(text);
    reload();
  }
  return { el };
}

// ---- rendering -------------------------------------------------------------------------------------

function renderDevices(box, devices, notice, reload) {
  if (!devices.length) {
    fill(box, empty("No devices yet. Pair one below."));
    return;
  }
  const list = [...devices].sort((a, b) => (b.created_at || "").localeCompare(a.created_at || ""));
  fill(box, h("table", { class: "devices" },
    h("caption", { class: "sr-only", text: "Runner devices" }),
    h("thead", {}, h("tr", {}, ["Device", "Agent", "Paired", "Last used", "Status", ""]
      .map((t) => h("th", { scope: "col", text: t })))),
    h("tbody", {}, list.map((d) => {
      const error = errorSlot();
      const said = (text) => {
        notice.textContent = text;
        notice.hidden = false;
        announce(text);
        reload();
      };
      const revoke = d.can_revoke ? revokeButton(error, `Revoke device ${d.name} (${d.agent_id})`, async () => {
        const out = await del(`/api/devices/${seg(d.id)}`);
        said(`Revoked ${d.name}: ${count(out.credentials_ended, "credential")} ended at once.`);
      }) : null;
      const stolen = d.can_revoke ? confirmButton("Mark stolen", "Click again: it was stolen",
        (b) => act(b, error, async () => {
          const out = await post(`/api/devices/${seg(d.id)}/stolen`);
          said(`Marked ${d.name} stolen: ${count(out.credentials_ended, "credential")} and `
            + `${count(out.runs_stopped, "run")} ended at once.`);
        }), { class: "danger-quiet small", "aria-label": `Mark stolen: ${d.name} (${d.agent_id})` }) : null;
      return h("tr", { dataset: { deviceId: d.id }, class: d.revoked_at ? "revoked" : "" },
        // data-label names each cell where a phone shows the row as a card.
        h("td", { "data-label": "" }, h("strong", { text: d.name }), h("div", { class: "muted small", text: d.id })),
        h("td", { "data-label": "Agent", text: d.agent_id }),
        h("td", { "data-label": "Paired" }, timeEl(d.created_at)),
        h("td", { "data-label": "Last used", class: "device-used" }, d.last_used_at
          ? [timeEl(d.last_used_at), d.last_address ? h("div", { class: "muted small", text: `from ${d.last_address}` }) : null]
          : h("span", { class: "muted", text: "never" })),
        h("td", { "data-label": "Status" }, d.revoked_at
          ? [badge(REVOKED_BADGE[d.revoked_reason] || "revoked", "muted"), " ", timeEl(d.revoked_at),
            REVOKED_WHY[d.revoked_reason] ? h("div", { class: "muted small", text: REVOKED_WHY[d.revoked_reason] }) : null]
          : badge("active", "ok")),
        h("td", { "data-label": "", class: "device-revoke" }, revoke, stolen, error));
    }))));
}

/** The badge of a device that ended, by why it ended (anything else says "revoked"). */
const REVOKED_BADGE = { stolen: "stolen", expired: "expired" };

/** Why a device ended, in words, when it was not simply revoked by its owner. */
const REVOKED_WHY = {
  sessions_ended: "ended when you signed out everywhere",
  expired: "unused for too long",
  key_revoked: "its runner key was revoked",
};

/** "1 credential", "2 credentials". */
function count(n, noun) {
  return `${n ?? 0} ${n === 1 ? noun : `${noun}s`}`;
}

/** The runner key, once, with what `prickle device pair` would have printed. Nothing is stored. */
function showRunnerKey(box, out) {
  const { device, token } = out;
  const printed = `Paired device ${device.id} (${device.name}) with ${device.agent_id}. Runner key (shown once):\n${token}`;
  const hide = h("button", { type: "button", text: "I have copied it — hide the key" });
  const codeBlock = (label, text) => h("div", { class: "setup" },
    h("div", { class: "setup-head" }, h("strong", { text: label }), copyButton(() => text)),
    h("pre", { class: "code", text }));
  const panel = h("section", { class: "card secret", role: "region", "aria-labelledby": "secret-heading", tabindex: "-1" },
    h("h2", { id: "secret-heading", text: `Runner key for ${device.agent_id} on ${device.name}` }),
    h("p", { class: "banner banner-warn inline" }, h("strong", { text: "Copy it now. " }),
      "Prickle shows this key only once and does not keep it. Anyone with it can claim this agent's work."),
    codeBlock("Runner key", token),
    codeBlock("What 'prickle device pair' prints", printed),
    h("p", { class: "muted small", text: "Give the key to the runner on that computer. Revoking the device ends this key "
      + "and every credential the runner got with it." }),
    hide);
  hide.addEventListener("click", () => {
    fill(box);
    document.getElementById("devices-heading")?.scrollIntoView({ block: "start" });
  });
  fill(box, panel);
  panel.focus();
  panel.scrollIntoView({ block: "start" });
}
