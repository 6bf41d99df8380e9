// memory.js — the project's memory facts (what agents are told in get_project_context):
// each with its provenance and who changed it last; set one, or retract it.

import { post, del, seg } from "./api.js";
import { provenanceBadges } from "./room.js";
import { h, heading, field, errorSlot, act, fill, empty, timeEl, confirmButton, announce } from "./ui.js";

// ---- lifecycle ----------------------------------------------------------------------------------

export function mount(el, ctx) {
  const list = h("div", { class: "memory-list" });
  el.append(
    h("div", { class: "page-head" }, heading(1, "Memory"),
      h("p", { class: "muted", text: "Facts every agent in the project is given. Keep them short and true." })),
    list, setForm(ctx));
  const render = () => renderFacts(list, ctx);
  render();
  return ctx.project.onChange(render);
}

// ---- actions --------------------------------------------------------------------------------------

function setForm(ctx) {
  const key = h("input", { name: "key", required: true, maxlength: "100", autocomplete: "off" });
  const value = h("textarea", { name: "value", rows: "3", maxlength: "4000", required: true });
  const submit = h("button", { type: "submit", class: "primary", text: "Save fact" });
  const error = errorSlot();
  const form = h("form", { class: "grid-form memory-form", "aria-labelledby": "memory-set-heading" },
    h("h2", { id: "memory-set-heading", class: "wide", text: "Set a fact" }),
    field("Key", key, "Setting an existing key replaces its value."),
    h("div", { class: "wide" }, field("Value", value)),
    h("div", { class: "form-actions" }, submit), error);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const out = await act(submit, error, () => post(`/api/projects/${seg(ctx.slug)}/memory`,
      { key: key.value.trim(), value: value.value }));
    if (out) {
      announce(`Saved ${out.memory.key}`);
      key.value = "";
      value.value = "";
      await ctx.project.refresh();
    }
  });
  return h("section", { class: "section card" }, form);
}

// ---- callbacks / rendering --------------------------------------------------------------------------

function renderFacts(list, ctx) {
  const facts = ctx.project.data()?.memory || [];
  fill(list, facts.length ? h("ul", { class: "facts-list" }, facts.map((f) => {
    const error = errorSlot();
    const retract = confirmButton("Retract", "Click again to retract", (button) => act(button, error, async () => {
      await del(`/api/projects/${seg(ctx.slug)}/memory/${seg(f.key)}`);
      announce(`Retracted ${f.key}`);
      await ctx.project.refresh();
    }), { class: "danger-quiet small", "aria-label": `Retract ${f.key}` });
    return h("li", { class: "card fact", dataset: { key: f.key } },
      h("div", { class: "fact-head" }, h("code", { class: "fact-key", text: f.key }), ...provenanceBadges(f), retract),
      h("p", { class: "pre fact-value", text: f.value }),
      h("p", { class: "muted small" }, `set by @${f.updated_by} · `, timeEl(f.updated_at)),
      error);
  })) : empty("No facts yet. Agents see what you set here."));
}
