// audit.js — the project's audit log, newest first, with the hash chain's check.
// Entries hold references and counts only (never message text or secrets).

import { get, seg } from "./api.js";
import { h, heading, errorSlot, showError, act, fill, badge, timeEl, words, loadFailed } from "./ui.js";

const LIMIT = 50;

// ---- lifecycle ------------------------------------------------------------------------------------

export function mount(el, ctx) {
  const chain = h("div", { class: "chain", role: "status" }, h("span", { class: "muted", text: "Checking the chain…" }));
  const rows = h("tbody");
  const more = h("button", { type: "button", class: "more quiet", hidden: true, text: "Show older entries" });
  const error = errorSlot();
  el.append(
    h("div", { class: "page-head" }, heading(1, "Audit log"),
      h("p", { class: "muted", text: "Everything that changed in this project, newest first. Each entry is chained to the one before by its hash." })),
    chain,
    h("div", { class: "table-wrap" },
      h("table", { class: "audit" },
        h("caption", { class: "sr-only", text: "Audit entries, newest first" }),
        h("thead", {}, h("tr", {}, h("th", { scope: "col", text: "#" }), h("th", { scope: "col", text: "When" }),
          h("th", { scope: "col", text: "What" }), h("th", { scope: "col", text: "Details" }))),
        rows)),
    error, more);

  let before = null;
  const load = async (button) => {
    const first = before === null;
    const out = await act(button, first ? null : error, () => get(`/api/projects/${seg(ctx.slug)}/audit?limit=${LIMIT}${before ? `&before=${before}` : ""}`)
      .catch((err) => {
        if (!first) throw err;
        fill(chain, loadFailed(err, () => load(null)));
        return undefined;
      }));
    if (!out) return;
    renderChain(chain, out.chain);
    const erased = new Set(out.erased || []);
    rows.append(...out.entries.map((entry) => renderEntry(entry, ctx, erased)));
    if (out.entries.length) before = out.entries[out.entries.length - 1].n;
    more.hidden = out.entries.length < LIMIT || before <= 1;
  };
  more.addEventListener("click", () => load(more));
  load(null).catch((err) => showError(error, err));
  return () => {};
}

// ---- rendering ------------------------------------------------------------------------------------------

function renderChain(el, chain) {
  fill(el, chain.ok
    ? [badge("chain intact", "ok"), h("span", { text: ` All ${chain.entries} entries check out against their hashes.` }),
      chain.head ? h("span", { class: "chain-head muted small" }, ` Its newest hash (hash version ${chain.hash_version}), `
        + "which an export of this log ends with: ", h("code", { text: chain.head })) : null]
    : [badge("chain broken", "danger"), h("strong", { text: ` The chain breaks at entry ${chain.broken_at}.` }),
      h("span", { text: " Entries from there on may have been changed outside Prickle; run 'prickle audit verify'." })]);
  el.dataset.ok = String(chain.ok);
}

/** An audit entry's row; ``erased``: the handles and agents it may name whose person closed their account. */
function renderEntry(entry, ctx, erased) {
  const refs = entry.refs || {};
  return h("tr", { dataset: { n: String(entry.n), type: entry.type } },
    h("td", { class: "num", text: String(entry.n) }),
    h("td", {}, timeEl(entry.at)),
    h("td", {}, h("code", { class: "audit-type", text: entry.type })),
    h("td", {}, h("dl", { class: "refs" }, Object.entries(refs).filter(([, v]) => v !== null && v !== undefined)
      .map(([k, v]) => {
        const text = typeof v === "object" ? JSON.stringify(v) : String(v);
        if (erased.has(v)) {
          return h("div", {}, h("dt", { text: words(k) }), h("dd", { class: "erased" }, text, " ",
            badge(v.includes("/") ? "erased agent" : "erased person", "muted")));
        }
        const href = typeof v === "string" ? refLink(v, refs, ctx) : null;
        return h("div", {}, h("dt", { text: words(k) }), h("dd", {}, href ? h("a", { href, text }) : text));
      }))));
}

/** Where an ID or a name in an audit entry leads: its task, its message, the members, your keys or rules. */
function refLink(value, refs, ctx) {
  const slug = seg(ctx.slug);
  const task = typeof refs.task === "string" && refs.task.startsWith("task_") ? refs.task : null;
  if (value.startsWith("task_")) return `#/p/${slug}/tasks/${seg(value)}`;
  if (value.startsWith("msg-")) return task ? `#/p/${slug}/tasks/${seg(task)}` : `#/p/${slug}/room/${seg(value)}`;
  if (/^(sub|cp|apr|att|step)_/.test(value) && task) return `#/p/${slug}/tasks/${seg(task)}`;
  if (value.startsWith("mo_")) return `#/p/${slug}/story`;
  if (/^(rule|sa)_/.test(value)) return "#/rules";
  if (/^(tok|dev)_/.test(value)) return "#/agents";
  const data = ctx.project.data();
  if (data?.agents?.some((a) => a.agent_id === value) || data?.people?.some((p) => p.handle === value)) {
    return `#/p/${slug}/people`;
  }
  return null;
}
