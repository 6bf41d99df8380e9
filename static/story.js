// story.js — the project story: the moments a team looks back on, newest first, grouped by day, read
// like a changelog. Marked by members, derived from Prickle's record, read from a linked GitHub
// repository. Owners curate (the server says who may: can_curate, can_edit, can_remove, can_hide);
// moment.updated and story.updated refresh it live. markDialog() is how a message or a task marks one.

import { get, post, del, seg } from "./api.js";
import * as stream from "./stream.js";
import {
  h, heading, errorSlot, showError, act, fill, badge, field, select, uid, announce, loadFailed, debounce,
  timeEl, safeUrl, confirmButton, modal,
} from "./ui.js";

const KIND_LABEL = {
  milestone: "Milestone", launch: "Launch", release: "Release", decision: "Decision", incident: "Incident",
  thanks: "Thanks", other: "Other", joined: "Joined", first_task: "First task", long_run: "Long run",
  first_result: "First result", round_number: "Round number", pull_merged: "Merged",
};
const KIND_BADGE = {
  launch: "ok", release: "ok", milestone: "violet", decision: "info", incident: "danger", thanks: "attention",
  joined: "muted", first_task: "info", long_run: "work", first_result: "ok", round_number: "violet",
  pull_merged: "info", other: "muted",
};
const MARK_KINDS = ["milestone", "launch", "release", "decision", "incident", "thanks", "other"];
const DAY_TITLE = new Intl.DateTimeFormat(undefined, { weekday: "long", day: "numeric", month: "long", year: "numeric" });

// ---- lifecycle ------------------------------------------------------------------------------------

export function mount(el, ctx) {
  const status = h("div", { class: "story-status" });
  const curate = h("div", { class: "story-curate" });
  const list = h("div", { class: "story-days" });
  const more = h("button", { type: "button", class: "more quiet", hidden: true, text: "Show earlier days" });
  const error = errorSlot();
  const markButton = h("button", { type: "button", class: "primary", text: "Mark a moment" });
  el.append(
    h("div", { class: "page-head story-head" },
      h("div", {}, heading(1, "Story"),
        h("p", { class: "muted", text: "The moments this team looks back on: marked by its members, from Prickle's record and from GitHub. Newest first." })),
      markButton),
    status, curate, error, list, more);

  let pages = 1;
  let nextBefore = null;
  const load = async (button, append = false) => {
    const url = `/api/projects/${seg(ctx.slug)}/story${append && nextBefore ? `?before=${nextBefore}` : ""}`;
    const out = await act(button, append ? error : null, () => get(url).catch((err) => {
      if (append) throw err;
      fill(list, loadFailed(err, () => load(null)));
      return undefined;
    }));
    if (!out) return;
    if (!append) {
      fill(list);
      renderStatus(status, out);
      renderCurate(curate, out, ctx, error);
    }
    let last = list.lastElementChild;
    for (const day of out.days) {
      // A day cut by the page boundary continues in the same section.
      if (last?.dataset.day === day.day) last.querySelector("ol").append(...day.moments.map((m) => renderMoment(m, ctx, error)));
      else list.append(last = renderDay(day, ctx, error));
    }
    if (!list.childElementCount) list.append(h("p", { class: "empty story-empty", text: "Nothing here yet. Mark the first moment: a launch, a decision, a thank-you." }));
    nextBefore = out.next_before;
    more.hidden = !nextBefore;
  };
  const reloadAll = async () => {
    const wanted = pages;
    await load(null);
    for (pages = 1; pages < wanted && nextBefore; pages += 1) await load(null, true);
  };
  more.addEventListener("click", async () => { await load(more, true); pages += 1; });
  markButton.addEventListener("click", () => markDialog(ctx, {}, markButton));
  // Live: a moment marked, edited or removed, or an owner's choice, reads the story again.
  const refresh = debounce(() => reloadAll().catch(() => {}), 300);
  const offs = [stream.on("moment.updated", refresh), stream.on("story.updated", refresh), stream.on("resync", refresh)];
  load(null).catch((err) => showError(error, err));
  return () => {
    refresh.cancel?.();
    for (const off of offs) off();
  };
}

// ---- actions ----------------------------------------------------------------------------------------

/** Open the "Mark a moment" dialog, or with `moment` (one of yours) edit it. `link`: {message_id?, task_id?, day?,
 *  title?} a message or a task being marked. Resolves true once saved. */
export function markDialog(ctx, link = {}, opener = null, moment = null) {
  const today = localDay(new Date());
  const titleId = uid("moment-title");
  const error = errorSlot();
  const kind = select(MARK_KINDS.map((k) => [k, KIND_LABEL[k]]), { name: "kind" });
  kind.value = moment?.kind || "milestone";
  const day = h("input", { type: "date", name: "day", required: true, max: today, value: moment?.day || link.day || today });
  const title = h("input", { type: "text", name: "title", required: true, maxlength: "140", autocomplete: "off",
    value: moment?.title || link.title || "", placeholder: "What happened, in a few words" });
  const linked = moment ? { message_id: moment.message_id, task_id: moment.message_id ? null : moment.task_id } : link;
  const keepLink = h("input", { type: "checkbox", checked: true });
  const linkNote = linked.message_id || linked.task_id
    ? h("label", { class: "check" }, keepLink, ` Links to ${linked.message_id ? "the message" : "the task"} it marks`) : null;
  const save = h("button", { type: "submit", class: "primary", text: moment ? "Save" : "Mark it" });
  const cancel = h("button", { type: "button", text: "Cancel" });
  const form = h("form", { class: "moment-form" },
    field("Kind", kind), field("Day", day), field("Title", title, "One line, at most 140 characters."),
    linkNote, h("div", { class: "button-row" }, save, cancel), error);
  const dialog = h("dialog", { class: "story-dialog", "aria-labelledby": titleId },
    h("h2", { id: titleId, text: moment ? "Edit the moment" : "Mark a moment" }), form);
  return modal(dialog, { opener, cancel, focus: () => title }, (close) => {
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      const keep = linkNote ? keepLink.checked : false;
      const body = { kind: kind.value, day: day.value, title: title.value };
      if (moment) {
        if (!keep && (moment.message_id || moment.task_id)) body.message_id = null;
      } else if (keep) {
        if (linked.message_id) body.message_id = linked.message_id;
        else if (linked.task_id) body.task_id = linked.task_id;
      }
      const out = await act(save, error, () => (moment
        ? post(`/api/moments/${seg(moment.id)}`, body)
        : post(`/api/projects/${seg(ctx.slug)}/moments`, body)));
      if (!out) return;
      announce(moment ? "The moment is saved" : "Marked in the project story");
      close(true);
    });
  });
}

// ---- rendering ------------------------------------------------------------------------------------------

function renderStatus(el, out) {
  fill(el);
  if (!out.repo) return;
  const gh = out.github || {};
  const repo = safeUrl(out.repo.url) ? h("a", { href: out.repo.url, rel: "noopener", target: "_blank", text: out.repo.name })
    : h("strong", { text: out.repo.name });
  const read = gh.fetched_at ? [" · read ", timeEl(gh.fetched_at, true)] : [];
  el.append(h("p", { class: "muted story-source" }, "From GitHub: ", repo, ...read));
  if (!gh.state) el.append(h("p", { class: "muted", role: "status", text: "Reading GitHub… its moments show once it answers." }));
  if (gh.state && gh.state !== "ok") {
    el.append(h("p", { class: "note warn story-github-failed", role: "status" },
      badge(gh.state === "rate_limited" ? "waiting for GitHub" : "GitHub failed", "warn"), " ", gh.message || ""));
  }
}

function renderCurate(el, out, ctx, error) {
  const open = !!el.querySelector(".story-settings[open]"); // a live refresh keeps the settings as they were
  fill(el);
  if (!out.can_curate) return;
  const base = `/api/projects/${seg(ctx.slug)}/story`;
  const round = h("input", { type: "checkbox", checked: out.round_numbers });
  round.addEventListener("change", () => act(round, error, () => post(`${base}/round-numbers`, { round_numbers: round.checked })));
  const repo = h("input", { type: "text", name: "repository", placeholder: "owner/name", autocomplete: "off",
    value: out.repo?.name || "", spellcheck: "false" });
  const link = h("button", { type: "submit", class: "small", text: out.repo ? "Replace" : "Link" });
  const repoError = errorSlot();
  const form = h("form", { class: "story-repo" }, field("GitHub repository", repo,
    "Its releases and merged pull requests join the story."), h("div", { class: "button-row" }, link,
    out.repo ? confirmButton("Unlink", "Click again to unlink", (b) => act(b, repoError, () => del(`${base}/repo`)),
      { class: "danger-quiet small" }) : null), repoError);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const done = await act(link, repoError, () => post(`${base}/repo`, { repository: repo.value }));
    if (done) announce(`Linked ${done.repo}`);
  });
  const restore = out.hidden ? h("button", { type: "button", class: "small",
    text: `Bring back ${out.hidden} hidden moment${out.hidden === 1 ? "" : "s"}` }) : null;
  restore?.addEventListener("click", () => act(restore, error, () => post(`${base}/restore`, {})));
  el.append(h("details", { class: "story-settings", open },
    h("summary", { text: "Story settings" }),
    h("label", { class: "check" }, round, " Round numbers: the 100th message, the 10th completed task, …"),
    form, restore ? h("p", {}, restore) : null));
}

function renderDay(day, ctx, error) {
  const date = new Date(`${day.day}T00:00:00`);
  return h("section", { class: "story-day", dataset: { day: day.day } },
    h("h2", { class: "story-date" }, h("time", { datetime: day.day, text: DAY_TITLE.format(date) })),
    h("ol", { class: "story-list" }, day.moments.map((m) => renderMoment(m, ctx, error))));
}

function renderMoment(m, ctx, error) {
  const href = momentHref(m, ctx);
  const title = href ? h("a", { href, text: m.title, ...(m.url ? { rel: "noopener", target: "_blank" } : {}) })
    : h("span", { text: m.title });
  const source = m.source === "member" ? `marked by ${m.by?.display_name ?? "a former member"}`
    : m.source === "github" ? `from GitHub${m.author ? ` · ${m.author}` : ""}` : "from Prickle's record";
  const tools = h("span", { class: "moment-tools" });
  if (m.can_edit) {
    const edit = h("button", { type: "button", class: "link small", text: "Edit", "aria-label": `Edit “${m.title}”` });
    edit.addEventListener("click", () => markDialog(ctx, {}, edit, m));
    tools.append(edit);
  }
  if (m.can_remove) {
    tools.append(confirmButton("Remove", "Click again to remove", (b) => act(b, error, () => del(`/api/moments/${seg(m.id)}`)),
      { class: "link small moment-remove", "aria-label": `Remove “${m.title}”` }));
  }
  if (m.can_hide) {
    const hide = h("button", { type: "button", class: "link small", text: "Hide", "aria-label": `Hide “${m.title}”` });
    hide.addEventListener("click", () => act(hide, error, () => post(`/api/projects/${seg(ctx.slug)}/story/hide`, { moment_id: m.id })));
    tools.append(hide);
  }
  return h("li", { class: `moment moment-${m.source}`, dataset: { id: m.id, kind: m.kind, source: m.source } },
    h("span", { class: "moment-kind" }, badge(KIND_LABEL[m.kind] || m.kind, KIND_BADGE[m.kind] || "muted")),
    h("div", { class: "moment-main" },
      h("p", { class: "moment-title" }, title),
      h("p", { class: "moment-meta muted" }, source, m.edited_at ? " · edited" : "", tools)));
}

// ---- internal ----------------------------------------------------------------------------------------

function momentHref(m, ctx) {
  const slug = seg(ctx.slug);
  if (m.url && safeUrl(m.url)) return m.url;
  if (m.message_id) return m.task_id ? `#/p/${slug}/tasks/${seg(m.task_id)}/${seg(m.message_id)}` : `#/p/${slug}/room/${seg(m.message_id)}`;
  if (m.task_id) return `#/p/${slug}/tasks/${seg(m.task_id)}`;
  return null;
}

/** YYYY-MM-DD of a date in the browser's own time zone. */
export function localDay(date) {
  const pad = (n) => String(n).padStart(2, "0");
  return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())}`;
}
