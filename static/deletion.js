// deletion.js — deleting, erasing and restoring a project: an owner's Delete and Erase on the
// project's Members screen, and, on the home page, the deleted projects the person owned with their
// deadline and Restore. The server says who may (can_delete, can_restore) and asks "Confirm it's you"
// before a Delete or an Erase (api.js shows the dialog, then sends the request again).

import { get, post, del, seg } from "./api.js";
import { h, errorSlot, act, announce, fill, confirmButton, timeEl, badge, when } from "./ui.js";

const STATE_WORDS = { deleted: "deleted", erasing: "being erased", purging: "being purged" };

// ---- the project's Members screen: Delete and Erase (owners) ----------------------------------

/** The "Delete or erase this project" section for an owner (null for anyone else). */
export function dangerZone(data, ctx) {
  if (!data.can_delete) return null;
  const error = errorSlot();
  const slug = data.project.slug;
  const name = data.project.name;
  const remove = confirmButton("Delete project", "Click again to delete it", (button) => act(button, error, async () => {
    const { deletion } = await del(`/api/projects/${seg(slug)}`);
    announce(`Deleted ${name}. Its owners can restore it until ${when(deletion.deadline)}.`);
    ctx.go("#/");
  }), { class: "danger-quiet", "aria-label": `Delete project: ${name}` });
  const erase = confirmButton("Erase project", "Click again to erase it for good", (button) => act(button, error, async () => {
    const { deletion } = await post(`/api/projects/${seg(slug)}/erase`);
    announce(`${name} will be erased: its content goes ${when(deletion.deadline)}, and it can't be restored.`);
    ctx.go("#/");
  }), { class: "danger-quiet", "aria-label": `Erase project: ${name}` });
  return h("section", { class: "section card danger-zone", "aria-labelledby": "danger-heading" },
    h("h2", { id: "danger-heading", text: "Delete or erase this project" }),
    h("p", { class: "muted small", text: "Either takes it away from everyone at once: its agents' runs stop and "
      + "nobody can open it. A deleted project can be restored by its owners until its deadline (on Your "
      + "projects), then its content is removed. An erased one can't be restored; its content goes after "
      + "30 days and its open invites end now. The audit log is kept a year after the content goes." }),
    h("div", { class: "button-row" }, remove, erase), error);
}

// ---- the home page: the deleted projects the person owned ---------------------------------------

/** The home page's "Deleted projects" section (hidden while there are none; ``reload()`` loads it
 *  again); ``onRestored()`` runs after a Restore, so the project list shows it again. */
export function deletedProjects(onRestored) {
  const box = h("section", { class: "section deleted-projects", "aria-labelledby": "deleted-heading", hidden: true });
  const reload = () => load(box, async () => {
    await reload();
    onRestored();
  });
  reload();
  box.reload = reload;
  return box;
}

async function load(box, restored) {
  let projects;
  try {
    ({ projects } = await get("/api/deleted-projects"));
  } catch (err) {
    console.warn("deleted projects not loaded", err.message);
    return;
  }
  box.hidden = !projects.length;
  fill(box, projects.length ? [
    h("h2", { id: "deleted-heading", text: "Deleted projects" }),
    h("p", { class: "muted small", text: "Only the owners of each see it here. Its agents' runs stay stopped after a "
      + "restore until someone starts them." }),
    h("ul", { class: "deleted-list" }, projects.map((p) => deletedItem(p, restored))),
  ] : []);
}

function deletedItem(p, restored) {
  const error = errorSlot();
  let restore = null;
  if (p.can_restore) {
    restore = h("button", { type: "button", class: "small", text: "Restore", "aria-label": `Restore ${p.name}` });
    restore.addEventListener("click", () => act(restore, error, async () => {
      await post(`/api/projects/${seg(p.project)}/restore`);
      announce(`Restored ${p.name}.`);
      await restored();
    }));
  }
  const deadline = p.state === "deleted" ? ["Restore until ", timeEl(p.deadline)]
    : p.state === "erasing" ? ["Its content goes ", timeEl(p.deadline)] : ["Its content is being removed now"];
  return h("li", { class: "card deleted-project", dataset: { slug: p.project } },
    h("span", { class: "project-card-head" },
      h("span", { class: "project-card-name", text: p.name }),
      badge(STATE_WORDS[p.state] || p.state, p.state === "deleted" ? "warn" : "danger")),
    h("span", { class: "muted small", text: `${p.team ? `${p.team} · ` : ""}${p.project} · request ${p.request_number}` }),
    h("span", { class: "deleted-deadline small" }, "Deleted ", timeEl(p.requested_at), " · ", ...deadline),
    restore ? h("div", { class: "button-row" }, restore) : null, error);
}
