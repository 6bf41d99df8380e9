// triage.js — the inbox as a triage list: one line per item (its kind in words, what it is about,
// the project's name, its age) that opens in place into the item's card; filters by kind and by
// project kept in the address (#/inbox?kind=…&project=…); done and snooze, each undone from a
// toast; "Mark all mentions read"; the items you snoozed, to bring back early; and the keys
// (j/k, Enter or o, e, s, u; "?" lists them). Marks are the server's (POST /api/inbox/mark …):
// they hide an item from you alone and never move a room's read position.

import { get } from "./api.js";
import { items, loaded, onChange, snoozedCount, markItem, markMentionsDone, unmark, summary, LABEL } from "./inbox_store.js";
import { addHelp, typing } from "./shortcuts.js";
import { h, fill, errorSlot, showError, clearError, announce, uid } from "./ui.js";

/** Each kind as a filter calls it, in the filter bar's order. */
const FILTER_LABEL = {
  step: "Steps", action: "Make or spend", approval: "Held handoffs", final_acceptance: "Final acceptance",
  question: "Questions", mention: "Mentions", agent_mention: "Your agents mentioned", returned: "Handed back",
  verify: "To verify", run_failed: "Failed runs", paused_pair: "Paused agents",
};
const MENTIONS = new Set(["mention", "agent_mention"]);
const UNDO_MS = 10_000; // how long the toast offers Undo
const KEYS = [["j", "Next item"], ["k", "Previous item"], ["Enter", "Open or close the item (o too)"],
  ["e", "Done: take it out of your list"], ["s", "Snooze it until later"], ["u", "Undo the last done or snooze"]];

// ---- lifecycle ---------------------------------------------------------------------------------------

/** The triage list: {el, destroy}. ``card(item, {done})`` draws an item's full card; ``query`` holds the
 *  filters the address carried. */
export function createTriage(ctx, { card, query }) {
  const filter = { kind: query?.get("kind") || "", project: query?.get("project") || "" };
  const rows = new Map(); // item id -> row
  const view = {
    selected: null,
    error: errorSlot(),
    count: h("p", { class: "muted inbox-count", role: "status" }),
    kinds: h("div", { class: "filter-chips", role: "group", "aria-label": "Show one kind" }),
    projects: h("div", { class: "filter-chips", role: "group", "aria-label": "Show one project" }),
    allMentions: h("button", { type: "button", class: "small", hidden: true }),
    nothing: h("p", { class: "empty", hidden: true }),
    list: h("ul", { class: "inbox-rows", "aria-label": "What waits on you" }),
    toast: createToast(),
  };
  const snoozed = snoozedSection(view);
  const el = h("div", { class: "triage" },
    h("div", { class: "inbox-filters" }, view.kinds, view.projects),
    h("div", { class: "inbox-status" }, view.count, view.allMentions), view.error, view.nothing, view.list, snoozed.el, view.toast.el);

  // ---- actions ----
  const act = {
    toggle(row, open = !row.open) {
      row.open = open;
      row.li.classList.toggle("open", open);
      row.head.setAttribute("aria-expanded", String(open));
      if (open && !row.card) {
        row.card = card(row.item, { done: () => act.done(row) });
        fill(row.body, row.card);
      }
      row.body.hidden = !open;
    },
    select(row, focus = true) {
      for (const r of rows.values()) r.li.classList.toggle("selected", r === row);
      view.selected = row?.item.id ?? null;
      if (row && focus) {
        row.head.focus();
        row.li.scrollIntoView({ block: "nearest" });
      }
    },
    async done(row) {
      const { id } = row.item;
      const out = await run(() => markItem(id, "done"));
      if (!out) return;
      dismiss(row);
      view.toast.show(`Done: ${short(summary(row.item))}`, () => unmark([id]));
    },
    async snooze(row, until) {
      const { id } = row.item;
      const out = await run(() => markItem(id, "snoozed", until));
      if (!out) return;
      dismiss(row);
      view.toast.show(`Snoozed until ${untilText(out.until)}: ${short(summary(row.item))}`, () => unmark([id]));
    },
    async allMentions() {
      const ids = await run(() => markMentionsDone());
      if (!ids) return;
      for (const id of ids) if (rows.has(id)) dismiss(rows.get(id), false);
      view.toast.show(ids.length === 1 ? "1 mention marked read" : `${ids.length} mentions marked read`,
        ids.length ? () => unmark(ids) : null);
    },
  };

  const run = async (fn) => {
    clearError(view.error);
    try {
      return await fn();
    } catch (err) {
      showError(view.error, err);
      return null;
    }
  };

  /** Take a row out (done or snoozed) and hand the selection to the next one in view. */
  const dismiss = (row, focus = true) => {
    const visible = visibleRows();
    const at = visible.indexOf(row);
    const next = visible[at + 1] || visible[at - 1] || null;
    row.li.remove();
    rows.delete(row.item.id);
    if (view.selected === row.item.id || focus) {
      act.select(next, !!next && focus);
      if (!next && focus) { // the last one gone: the focus goes to the line that says so, never to nowhere
        view.count.tabIndex = -1;
        view.count.focus();
      }
    }
    render();
  };

  const visibleRows = () => [...view.list.children].map((li) => rows.get(li.dataset.itemId)).filter((r) => r && !r.li.hidden);
  const matches = (item) => (!filter.kind || item.kind === filter.kind) && (!filter.project || item.project === filter.project);

  const render = () => {
    const all = items();
    const ids = new Set(all.map((i) => i.id));
    for (const [id, row] of rows) {
      const keep = row.card && (row.card.classList.contains("decided") || !!row.card.querySelector(".decided"));
      if (!ids.has(id) && !keep && !row.li.contains(document.activeElement)) {
        row.li.remove();
        rows.delete(id);
      }
    }
    for (const item of all) {
      const row = rows.get(item.id);
      if (!row) rows.set(item.id, createRow(item, act));
      else if (row.item.since !== item.since && !row.open) {
        row.item = item;
        paintHead(row);
        row.card = null;
      }
    }
    const order = [...rows.values()].sort((a, b) => (a.item.since < b.item.since ? 1 : a.item.since > b.item.since ? -1 : 0));
    order.forEach((row, n) => {
      if (view.list.children[n] !== row.li) view.list.insertBefore(row.li, view.list.children[n] || null);
      row.li.hidden = !matches(row.item);
    });
    paintFilters(view, all, filter, setFilter);
    const visible = visibleRows();
    const shown = visible.filter((r) => ids.has(r.item.id)).length; // a card just decided stays in view, but waits no more
    const mentions = all.filter((i) => MENTIONS.has(i.kind)).length;
    view.allMentions.hidden = !mentions;
    view.allMentions.textContent = `Mark all mentions read (${mentions})`;
    view.count.textContent = !loaded() ? "Loading…"
      : `${all.length === 1 ? "1 thing waits" : `${all.length} things wait`} on you${shown !== all.length ? `; ${shown} shown` : ""}.`;
    view.nothing.hidden = !loaded() || visible.length > 0;
    view.nothing.textContent = all.length ? "Nothing here with these filters." : "Nothing waits on you. New items appear here as they arrive.";
    if (view.selected && !visible.some((r) => r.item.id === view.selected)) act.select(null, false);
    snoozed.paint();
  };

  const setFilter = (name, value) => {
    filter[name] = value;
    const params = new URLSearchParams();
    if (filter.kind) params.set("kind", filter.kind);
    if (filter.project) params.set("project", filter.project);
    const text = params.toString();
    history.replaceState(null, "", `#/inbox${text ? `?${text}` : ""}`); // the view stays; a reload keeps the filters
    render();
  };

  view.allMentions.addEventListener("click", () => act.allMentions());

  // ---- keys ----
  const onKey = (e) => {
    if (e.defaultPrevented || e.ctrlKey || e.altKey || e.metaKey || e.isComposing || typing(e.target)) return;
    if (!el.isConnected) return;
    const visible = visibleRows();
    const current = rows.get(view.selected) || null;
    const move = (step) => {
      const at = current ? visible.indexOf(current) : -1;
      const next = visible[Math.min(visible.length - 1, Math.max(0, at + step))];
      if (next) act.select(next);
    };
    const key = e.key;
    if (key === "j") move(1);
    else if (key === "k") move(current ? -1 : 1);
    else if ((key === "o" || (key === "Enter" && !e.target.closest?.("button, a, summary"))) && current) act.toggle(current);
    else if (key === "e" && current) act.done(current);
    else if (key === "s" && current) openSnooze(current, act);
    else if (key === "u" && view.toast.undo) view.toast.undo();
    else return;
    e.preventDefault();
  };
  document.addEventListener("keydown", onKey);
  const offHelp = addHelp("Inbox", KEYS);
  const off = onChange(render);
  render();
  return {
    el,
    destroy() {
      off();
      offHelp();
      document.removeEventListener("keydown", onKey);
      view.toast.destroy();
    },
  };
}

// ---- rendering -----------------------------------------------------------------------------------------

/** One item's row: a button that opens it (kind, words, project, age), Done, Snooze, and its card. */
function createRow(item, act) {
  const bodyId = uid("inbox-body");
  const head = h("button", { type: "button", class: "inbox-row-head", "aria-expanded": "false", "aria-controls": bodyId });
  const doneButton = h("button", { type: "button", class: "quiet small", text: "Done" });
  const snoozeButton = h("button", { type: "button", class: "quiet small", text: "Snooze", "aria-haspopup": "true",
    "aria-expanded": "false" });
  const body = h("div", { class: "inbox-row-body", id: bodyId, hidden: true });
  const menu = h("div", { class: "snooze-menu", hidden: true });
  const li = h("li", { class: `inbox-item inbox-row`, dataset: { itemId: item.id, kind: item.kind } },
    h("div", { class: "inbox-row-line" }, head, h("span", { class: "inbox-row-tools" }, doneButton, snoozeButton)),
    menu, body);
  const row = { item, li, head, body, menu, snoozeButton, open: false, card: null };
  paintHead(row);
  head.addEventListener("click", () => {
    act.select(row, false);
    act.toggle(row);
  });
  head.addEventListener("focus", () => act.select(row, false));
  doneButton.addEventListener("click", () => act.done(row));
  snoozeButton.addEventListener("click", () => (menu.hidden ? openSnooze(row, act) : closeSnooze(row)));
  return row;
}

function paintHead(row) {
  const { item } = row;
  const sep = () => h("span", { class: "sr-only", text: ", " });
  fill(row.head,
    h("span", { class: "inbox-kind", text: capital(LABEL[item.kind] || "item") }), sep(),
    h("span", { class: "inbox-summary", text: summary(item) || "(no title)" }), sep(),
    h("span", { class: "inbox-project", text: item.project_name }), sep(),
    h("time", { class: "inbox-age", datetime: item.since, title: new Date(item.since).toLocaleString(), text: age(item.since) }));
}

/** The snooze choices under a row: in an hour, tomorrow 9:00, next Monday 9:00, or a chosen time. */
function openSnooze(row, act) {
  const choices = snoozeChoices(new Date());
  const custom = h("input", { type: "datetime-local", required: true, "aria-label": "Snooze until (date and time)",
    value: localInput(choices[1][1]) });
  const form = h("form", { class: "snooze-custom" }, custom, h("button", { type: "submit", class: "small", text: "Snooze until then" }));
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const when = new Date(custom.value);
    if (Number.isNaN(when.getTime())) return;
    act.snooze(row, when.toISOString());
  });
  fill(row.menu, h("p", { class: "small muted", text: "Snooze until:" }),
    h("div", { class: "button-row" }, choices.map(([label, when]) =>
      h("button", { type: "button", class: "small", text: label, onclick: () => act.snooze(row, when.toISOString()) }))),
    form);
  row.menu.onkeydown = (e) => {
    if (e.key === "Escape") {
      e.preventDefault();
      closeSnooze(row);
      row.snoozeButton.focus();
    }
  };
  row.menu.hidden = false;
  row.snoozeButton.setAttribute("aria-expanded", "true");
  row.menu.querySelector("button").focus();
}

function closeSnooze(row) {
  row.menu.hidden = true;
  row.snoozeButton.setAttribute("aria-expanded", "false");
}

/** [label, Date] in the person's local time: in 1 hour, tomorrow 9:00, next Monday 9:00. */
export function snoozeChoices(now) {
  const nine = (days) => {
    const d = new Date(now);
    d.setDate(d.getDate() + days);
    d.setHours(9, 0, 0, 0);
    return d;
  };
  const toMonday = ((8 - now.getDay()) % 7) || 7;
  return [["In 1 hour", new Date(now.getTime() + 3600_000)], ["Tomorrow 9:00", nine(1)], ["Next Monday 9:00", nine(toMonday)]];
}

function paintFilters(view, all, filter, setFilter) {
  const count = (list, key) => list.reduce((m, i) => m.set(i[key], (m.get(i[key]) || 0) + 1), new Map());
  const byKind = count(all.filter((i) => !filter.project || i.project === filter.project), "kind");
  const inKind = all.filter((i) => !filter.kind || i.kind === filter.kind);
  const byProject = count(inKind, "project");
  const names = new Map(all.map((i) => [i.project, i.project_name]));
  const chip = (name, value, label, n) => h("button", { type: "button", class: "chip", "aria-pressed": String(filter[name] === value),
    dataset: { filter: name, value }, onclick: () => setFilter(name, value) }, label, " ", h("span", { class: "chip-count", text: String(n) }));
  const kinds = Object.keys(FILTER_LABEL).filter((k) => byKind.has(k) || filter.kind === k);
  fill(view.kinds, chip("kind", "", "All kinds", [...byKind.values()].reduce((a, b) => a + b, 0)),
    kinds.map((k) => chip("kind", k, FILTER_LABEL[k], byKind.get(k) || 0)));
  const projects = [...new Set([...byProject.keys(), ...(filter.project ? [filter.project] : [])])]
    .sort((a, b) => (names.get(a) || a).localeCompare(names.get(b) || b));
  fill(view.projects, chip("project", "", "All projects", inKind.length),
    projects.map((p) => chip("project", p, names.get(p) || "a project you left", byProject.get(p) || 0)));
  view.projects.hidden = projects.length < 2 && !filter.project;
}

/** "Snoozed (N)": the items you snoozed, each with when it comes back and Unsnooze. */
function snoozedSection(view) {
  const summaryEl = h("summary", {});
  const list = h("ul", { class: "snoozed-list" });
  const el = h("details", { class: "inbox-snoozed", hidden: true }, summaryEl, list);
  let serial = 0;
  const load = async () => {
    const mine = ++serial;
    try {
      const out = await get("/api/inbox?snoozed=1");
      if (mine !== serial) return;
      fill(list, out.snoozed_items.map((item) => {
        const back = h("button", { type: "button", class: "small", text: "Unsnooze" });
        back.addEventListener("click", async () => {
          back.disabled = true;
          try {
            await unmark([item.id]);
            announce(`Back in your list: ${short(summary(item))}`);
          } catch (err) {
            back.disabled = false;
            showError(view.error, err);
          }
        });
        return h("li", { class: "snoozed-item", dataset: { itemId: item.id } },
          h("span", { class: "inbox-kind", text: capital(LABEL[item.kind] || "item") }),
          h("span", { class: "inbox-summary", text: summary(item) }),
          h("span", { class: "inbox-project", text: item.project_name }),
          h("span", { class: "muted small", text: `back ${untilText(item.snoozed_until)}` }), back);
      }));
    } catch (err) {
      showError(view.error, err);
    }
  };
  el.addEventListener("toggle", () => { if (el.open) load(); });
  return {
    el,
    paint() {
      const n = snoozedCount();
      summaryEl.textContent = `Snoozed (${n})`;
      el.hidden = !n;
      if (!n) el.open = false;
      else if (el.open) load();
    },
  };
}

/** The toast at the foot of the screen: what was just done, with Undo for a few seconds. */
function createToast() {
  const text = h("span", { class: "toast-text" });
  const undoButton = h("button", { type: "button", class: "small", text: "Undo" });
  const el = h("div", { class: "toast", role: "status", hidden: true }, text, undoButton);
  let timer = null;
  const toast = {
    el,
    undo: null,
    show(message, undo) {
      clearTimeout(timer);
      text.textContent = message;
      undoButton.hidden = !undo;
      el.hidden = false;
      toast.undo = undo ? async () => {
        toast.hide();
        try {
          await undo();
          announce("Undone");
        } catch (err) {
          toast.show(`Could not undo: ${err.message}`, null);
        }
      } : null;
      timer = setTimeout(toast.hide, UNDO_MS);
    },
    hide() {
      clearTimeout(timer);
      el.hidden = true;
      toast.undo = null;
    },
    destroy() {
      clearTimeout(timer);
    },
  };
  undoButton.addEventListener("click", () => toast.undo?.());
  return toast;
}

// ---- internal ----------------------------------------------------------------------------------------

const DAY = new Intl.DateTimeFormat(undefined, { day: "numeric", month: "short" });
const DAY_YEAR = new Intl.DateTimeFormat(undefined, { day: "numeric", month: "short", year: "numeric" });
const WHEN = new Intl.DateTimeFormat(undefined, { weekday: "short", day: "numeric", month: "short", hour: "2-digit", minute: "2-digit" });

/** How long an item has waited, short: "now", "5 min", "2 h", "3 Dec". */
export function age(iso, now = Date.now()) {
  const t = new Date(iso);
  const minutes = Math.floor((now - t.getTime()) / 60_000);
  if (minutes < 1) return "now";
  if (minutes < 60) return `${minutes} min`;
  if (minutes < 24 * 60) return `${Math.floor(minutes / 60)} h`;
  return (t.getFullYear() === new Date(now).getFullYear() ? DAY : DAY_YEAR).format(t);
}

function untilText(iso) {
  return WHEN.format(new Date(iso));
}

function short(text) {
  return text.length > 60 ? `${text.slice(0, 59)}…` : text;
}

function capital(text) {
  return text.charAt(0).toUpperCase() + text.slice(1);
}

/** A Date as a datetime-local input's value (local time). */
function localInput(d) {
  const pad = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}`;
}
