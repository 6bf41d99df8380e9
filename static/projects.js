// projects.js — the home page: one line about what waits for you (the inbox has the items), your
// projects, the deleted ones you owned (deletion.js) and a new project.

import { get, post } from "./api.js";
import { createWaiting } from "./waiting.js";
import { paintUnread, onProjectsChanged } from "./inbox_store.js";
import { deletedProjects } from "./deletion.js";
import { h, heading, field, errorSlot, act, fill, empty, badge, loadFailed } from "./ui.js";

// ---- lifecycle ---------------------------------------------------------------------------

export function mount(el, ctx) {
  const list = h("div", { class: "project-list" }, h("p", { class: "muted", text: "Loading your projects…" }));
  const listError = errorSlot();
  const waiting = createWaiting();
  const deleted = deletedProjects(() => loadProjects(list, listError));

  el.append(
    h("div", { class: "page-head" }, heading(1, `Hello, ${ctx.me.display_name}`)),
    waiting.el,
    h("section", { class: "section", "aria-labelledby": "projects-heading" },
      h("h2", { id: "projects-heading", text: "Your projects" }), listError, list),
    deleted,
    createForm(ctx));

  loadProjects(list, listError);
  // A project restored (by you or another of its owners) shows again, and leaves the deleted ones.
  const off = onProjectsChanged(() => {
    loadProjects(list, listError);
    deleted.reload();
  });
  return () => {
    waiting.destroy();
    off();
  };
}

// ---- actions ---------------------------------------------------------------------------------

async function loadProjects(list, error) {
  try {
    const { projects } = await get("/api/projects");
    fill(list, projects.length ? projects.map(projectCard)
      : empty("You are not in any project yet. Create one below, or ask a project owner to add you."));
    paintUnread(list);
  } catch (err) {
    fill(list, loadFailed(err, () => loadProjects(list, error)));
  }
}

// ---- internal ----------------------------------------------------------------------------------

function projectCard(p) {
  const privateRoom = p.kind === "private"; // each person's room with their own agents
  return h("a", { class: `card project-card${privateRoom ? " private-room" : ""}`, href: `#/p/${p.slug}/room`,
    dataset: { slug: p.slug } },
  h("span", { class: "project-card-head" },
    h("span", { class: "project-card-name", text: p.name }),
    h("span", { class: "unread-badge", hidden: true, dataset: { unreadProject: p.slug } }),
    privateRoom ? badge("private room", "violet", "Only you and your own agents")
      : badge(p.role, p.role === "owner" ? "info" : "muted", `You are ${p.role === "owner" ? "an owner" : "a member"}`)),
  h("span", { class: "muted small", text: `${p.team ? `${p.team} · ` : ""}${p.slug}` }),
  p.description ? h("span", { class: "project-card-desc", text: p.description })
    : privateRoom ? h("span", { class: "project-card-desc", text: "You and your agents." }) : null);
}

function createForm(ctx) {
  const slug = h("input", { name: "slug", required: true, pattern: "[a-z0-9]+(-[a-z0-9]+)*", maxlength: "39",
    autocomplete: "off", spellcheck: "false" });
  const name = h("input", { name: "name", required: true, maxlength: "80", autocomplete: "off" });
  const team = h("input", { name: "team", maxlength: "40", autocomplete: "off" });
  const description = h("textarea", { name: "description", rows: "2", maxlength: "2000" });
  const error = errorSlot();
  const submit = h("button", { type: "submit", class: "primary", text: "Create project" });
  name.addEventListener("input", () => {
    if (!slug.dataset.touched) slug.value = name.value.toLowerCase().replace(/[^a-z0-9]+/g, "-").replace(/^-|-$/g, "").slice(0, 39);
  });
  slug.addEventListener("input", () => { slug.dataset.touched = "1"; });
  const form = h("form", { class: "grid-form" },
    field("Name", name),
    field("Short name (slug)", slug, "Lowercase letters, digits and dashes; it is in every address."),
    field("Team", team),
    field("What it is about (optional)", description),
    h("div", { class: "form-actions" }, submit), error);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const body = { slug: slug.value.trim(), name: name.value.trim(), team: team.value.trim() };
    if (description.value.trim()) body.description = description.value.trim();
    const out = await act(submit, error, () => post("/api/projects", body));
    if (out) ctx.go(`#/p/${out.project.slug}/people`);
  });
  return h("details", { class: "section disclosure" },
    h("summary", {}, h("h2", { text: "New project" })),
    h("p", { class: "muted", text: "You become its owner and can add teammates and agents." }),
    form);
}
