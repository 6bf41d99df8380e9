// export.js — Export on the Members screen: an owner takes the project out as a zip of documented
// files, the audit log alone or everything. Whether the person may is the server's to say
// (can_export); the zip comes as a download named by the server.

import { get, download, seg } from "./api.js";
import { h, errorSlot, act, announce, fill } from "./ui.js";

const PARTS = [
  ["audit_log", "Export the audit log", "The audit log alone, each entry with its hashes, to check anywhere."],
  ["content", "Export everything", "Members, memory, messages, tasks, results, evidence, files and the audit log."],
];

// ---- lifecycle ------------------------------------------------------------------------------------

/** The Export section (empty until the server says this person may export the project). */
export function exportBox(ctx) {
  const box = h("div", { class: "export-slot" });
  get(`/api/projects/${seg(ctx.slug)}/export`)
    .then((out) => { if (out.can_export) fill(box, render(ctx)); })
    .catch(() => fill(box)); // not offered: the rest of the screen says why the project can't be read
  return box;
}

// ---- rendering / actions ----------------------------------------------------------------------------

function render(ctx) {
  const error = errorSlot();
  const done = h("p", { class: "muted small export-done", role: "status" });
  const buttons = PARTS.map(([part, label, hint]) => {
    const button = h("button", { type: "button", class: "small", text: label, dataset: { part }, title: hint });
    button.addEventListener("click", () => act(button, error, async () => {
      done.textContent = "";
      const file = await download(`/api/projects/${seg(ctx.slug)}/export`, { part });
      save(file.blob, file.name);
      done.textContent = `Saved ${file.name} (${Math.max(1, Math.round(file.blob.size / 1024))} KB).`;
      announce(done.textContent);
    }));
    return button;
  });
  return h("section", { class: "section card export", "aria-labelledby": "export-heading" },
    h("h2", { id: "export-heading", text: "Export" }),
    h("p", { class: "muted small", text: "A zip of JSON Lines files, described in the README. The audit log in it "
      + "can be checked with 'prickle audit verify --file' or a few lines of Python, on any machine." }),
    h("div", { class: "row-form export-buttons" }, ...buttons), done, error);
}

function save(blob, name) {
  const url = URL.createObjectURL(blob);
  const a = h("a", { href: url, download: name, hidden: true });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
}
