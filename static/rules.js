// rules.js — your permission gate: delegation rules (who may hand your agents work:
// allow, ask me, never), standing approvals, and auto-accept of verified results.

import { get, post, del, seg } from "./api.js";
import { settings as stepUpSettings } from "./stepup.js";
import {
  h, heading, field, select, errorSlot, act, fill, empty, badge, timeEl, revokeButton, announce, words, loadFailed,
} from "./ui.js";

const DECISIONS = [["allow", "Allow"], ["approval_required", "Ask me each time"], ["never", "Never"]];
const DECISION_KIND = { allow: "ok", approval_required: "warn", never: "danger" };

// ---- lifecycle ---------------------------------------------------------------------------------------

export function mount(el, ctx) {
  const rules = h("div", { class: "table-wrap" }, h("p", { class: "muted", text: "Loading your rules…" }));
  const standing = h("div", { class: "table-wrap" });
  const error = errorSlot();
  const reload = async () => {
    try {
      const out = await get("/api/rules");
      renderRules(rules, out.rules, reload);
      renderStanding(standing, out.standing_approvals, reload);
    } catch (err) {
      fill(rules, loadFailed(err, reload));
    }
  };
  el.append(
    h("div", { class: "page-head" }, heading(1, "Rules"),
      h("p", { class: "muted", text: "When a teammate's agent hands work to one of your agents, your gate decides: "
        + "the most specific rule wins (one agent, then one owner's agents, then all teammates); otherwise it asks you." })),
    error,
    h("section", { class: "section", "aria-labelledby": "rules-heading" }, h("h2", { id: "rules-heading", text: "Gate rules" }), rules),
    ruleForm(reload),
    h("section", { class: "section", "aria-labelledby": "standing-heading" },
      h("h2", { id: "standing-heading", text: "Standing approvals" }),
      h("p", { class: "muted", text: "Made when you approve a handoff and let more like it through." }), standing),
    policy(ctx),
    stepUpSettings());
  reload();
  return () => {};
}

// ---- actions -------------------------------------------------------------------------------------------

function ruleForm(reload) {
  // The form starts at the safest choice: ask each time, for one agent you name. Allowing,
  // and a rule for everyone, are choices you make on purpose.
  const decision = select(["approval_required", "never", "allow"].map((d) => DECISIONS.find(([v]) => v === d)),
    { name: "decision" });
  const scope = select([["agent", "One agent"], ["owner", "The agents of one person"], ["all", "All teammates' agents"]],
    { name: "scope" });
  const who = h("input", { name: "who", autocomplete: "off", spellcheck: "false", placeholder: "owner/agent", required: true });
  const whoField = field("Who", who, "An agent (e.g. oj/muse) or, for one person's agents, a handle (e.g. oj).");
  const showWho = () => {
    whoField.hidden = scope.value === "all";
    who.required = scope.value !== "all";
    who.placeholder = scope.value === "owner" ? "handle" : "owner/agent";
  };
  scope.addEventListener("change", showWho);
  const expires = h("input", { type: "datetime-local", name: "expires" });
  const submit = h("button", { type: "submit", class: "primary", text: "Save rule" });
  const error = errorSlot();
  const form = h("form", { class: "grid-form" },
    field("Decision", decision), field("For", scope), whoField,
    field("Until (optional)", expires, "Leave empty for no end."),
    h("div", { class: "form-actions" }, submit), error);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const body = { decision: decision.value };
    if (scope.value === "owner") body.owner = who.value.trim().replace(/^@/, "");
    if (scope.value === "agent") body.agent = who.value.trim().replace(/^@/, "");
    if (expires.value) body.expires_at = new Date(expires.value).toISOString().replace(/\.\d{3}Z$/, "Z");
    const out = await act(submit, error, () => post("/api/rules", body));
    if (out) {
      announce("Rule saved");
      form.reset();
      showWho();
      reload();
    }
  });
  return h("details", { class: "section disclosure" }, h("summary", {}, h("h2", { text: "Add a rule" })), form);
}

function policy() {
  const status = h("p", { class: "muted small policy-status", role: "status" });
  const error = errorSlot();
  const label = h("span", { class: "switch-label", text: "…" });
  const toggle = h("button", { type: "button", class: "switch", role: "switch", "aria-checked": "false",
    "aria-labelledby": "policy-heading", "aria-describedby": "policy-what", disabled: true },
  h("span", { class: "switch-track", "aria-hidden": "true" }, h("span", { class: "switch-thumb" })), label);
  const show = (on) => {
    toggle.setAttribute("aria-checked", String(on));
    label.textContent = on ? "On" : "Off";
    status.textContent = on ? "Auto-accept is on: a result your agent verified is accepted at once."
      : "Auto-accept is off: you give final acceptance yourself.";
  };
  toggle.addEventListener("click", () => act(toggle, error, async () => {
    const on = toggle.getAttribute("aria-checked") !== "true";
    const out = await post("/api/policy", { auto_accept: on });
    show(Boolean(out.auto_accept));
    announce(out.auto_accept ? "Auto-accept on" : "Auto-accept off");
  }));
  get("/api/me").then((out) => {
    show(Boolean(out.auto_accept));
    toggle.disabled = false;
  }).catch((err) => {
    error.textContent = err.message;
    error.hidden = false;
  });
  return h("section", { class: "section card", "aria-labelledby": "policy-heading" },
    h("div", { class: "policy-head" },
      h("h2", { id: "policy-heading", text: "Auto-accept verified results" }), toggle),
    h("p", { id: "policy-what", text: "When your agent verifies a result it asked for, accept it at once instead of waiting for your final click." }),
    status, error);
}

// ---- rendering ------------------------------------------------------------------------------------------

function subjectText(rule) {
  if (rule.for === "all") return "All teammates' agents";
  if (rule.for === "owner") return `Agents of @${rule.subject}`;
  return `Agent ${rule.subject}`;
}

// A table of live records, each row ending in a Revoke button that deletes it and reloads.
function revocableTable(box, items, { caption, none, columns, dataset, what, path, done, cells }, reload) {
  if (!items.length) {
    fill(box, empty(none));
    return;
  }
  fill(box, h("table", {},
    h("caption", { class: "sr-only", text: caption }),
    h("thead", {}, h("tr", {}, [...columns, ""].map((t) => h("th", { scope: "col", text: t })))),
    h("tbody", {}, items.map((item) => {
      const error = errorSlot();
      const revoke = revokeButton(error, `Revoke ${what(item)}`, async () => {
        await del(path(item));
        announce(done);
        reload();
      });
      return h("tr", { dataset: dataset(item) }, ...cells(item), h("td", {}, revoke, error));
    }))));
}

function renderRules(box, rules, reload) {
  revocableTable(box, rules, {
    caption: "Gate rules", none: "No rules: every handoff from a teammate's agent asks you first.",
    columns: ["For", "Decision", "Until", "Made"], dataset: (r) => ({ ruleId: r.id }),
    what: (r) => `the rule for ${subjectText(r)}`, path: (r) => `/api/rules/${seg(r.id)}`, done: "Rule revoked",
    cells: (r) => [
      h("td", { text: subjectText(r) }),
      h("td", {}, badge(DECISIONS.find(([d]) => d === r.decision)?.[1] || words(r.decision), DECISION_KIND[r.decision] || "muted")),
      h("td", {}, r.expires_at ? timeEl(r.expires_at) : h("span", { class: "muted", text: "no end" })),
      h("td", {}, timeEl(r.created_at)),
    ],
  }, reload);
}

function renderStanding(box, items, reload) {
  revocableTable(box, items, {
    caption: "Standing approvals", none: "No standing approvals.",
    columns: ["From", "To", "Kind of work", "Used", "Until"], dataset: (s) => ({ standingId: s.id }),
    what: (s) => `the standing approval for ${s.requester}`, path: (s) => `/api/standing-approvals/${seg(s.id)}`,
    done: "Standing approval revoked",
    cells: (s) => [
      h("td", { text: s.requester }), h("td", { text: s.assignee }), h("td", { text: words(s.kind) }),
      h("td", { text: `${s.uses} of ${s.cap}` }), h("td", {}, timeEl(s.expires_at)),
    ],
  }, reload);
}
