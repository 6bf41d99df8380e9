// waiting.js — everything waiting for your decision, across your projects: steps your
// agents' runs ask to take, make-or-spend actions your agents propose, and handoffs your
// gate holds. Asked again every POLL ms and when the tab comes back (the home page has no
// project stream); a card already shown stays put, and a decided one stays with its outcome.

import { get } from "./api.js";
import { approvalCard } from "./tasks.js";
import { stepCard, pendingSteps, taskOf } from "./steps.js";
import { actionCard } from "./makeaction.js";
import { h, fill } from "./ui.js";

const POLL = 20000;

// ---- lifecycle ---------------------------------------------------------------------------------

/** The "Waiting for your decision" section: {el, destroy}. */
export function createWaiting(ctx) {
  const count = h("span", { class: "count-badge" });
  const groups = {
    steps: group("waiting-steps", "Steps your agents' runs ask to take",
      "A run stopped before a destructive, spending or outbound call. Check the exact call before you allow it."),
    actions: group("waiting-actions", "Things your agents want to make or spend",
      "Proposed in your room. Nothing runs until you approve."),
    approvals: group("waiting-approvals", "Handoffs held by your gate",
      "Agents of your teammates asked your agents for work. Your gate holds it until you decide."),
  };
  const el = h("section", { class: "section waiting", "aria-labelledby": "approvals-heading", hidden: true },
    h("h2", { id: "approvals-heading" }, "Waiting for your decision ", count),
    groups.steps.el, groups.actions.el, groups.approvals.el);

  const recount = () => {
    const open = Object.values(groups).reduce((n, g) => n + g.open(), 0);
    count.textContent = open ? String(open) : "";
    count.setAttribute("aria-label", open === 1 ? "1 waiting" : `${open} waiting`);
    count.hidden = !open;
  };
  let serial = 0;
  const load = async () => {
    const mine = ++serial;
    const [steps, actions, approvals] = await Promise.all([
      pendingSteps().catch(() => null),
      get("/api/actions").then((o) => o.actions).catch(() => null),
      get("/api/approvals").then((o) => o.approvals).catch(() => null),
    ]);
    if (mine !== serial) return;
    if (steps) {
      const titles = await Promise.all(steps.map((s) => taskOf(s.task_id)));
      if (mine !== serial) return;
      reconcile(groups.steps, steps, (s) => s.id, (s, i) => stepCard(s, { task: titles[i], onDecided: recount }));
    }
    if (actions) {
      reconcile(groups.actions, actions, (a) => a.id, (a) => h("div", { class: "waiting-action" },
        actionCard(a, { me: ctx.me.handle, room: a.project, messageId: a.message_id, onDecided: recount })));
    }
    if (approvals) {
      reconcile(groups.approvals, approvals, (a) => a.approval.id, (a) => approvalCard(a, { showProject: true, onDecided: recount }));
    }
    recount();
    el.hidden = Object.values(groups).every((g) => g.el.hidden);
  };

  const timer = setInterval(load, POLL);
  const onVisible = () => { if (document.visibilityState === "visible") load(); };
  document.addEventListener("visibilitychange", onVisible);
  load();
  return {
    el,
    reload: load,
    destroy() {
      clearInterval(timer);
      document.removeEventListener("visibilitychange", onVisible);
      serial += 1;
    },
  };
}

// ---- internal ------------------------------------------------------------------------------------

function group(id, title, lead) {
  const list = h("div", { class: "stack" });
  const el = h("div", { class: "waiting-group", hidden: true, "aria-labelledby": id, role: "group" },
    h("h3", { id, text: title }), h("p", { class: "muted small", text: lead }), list);
  const shown = new Map(); // key -> card element
  return {
    el, list, shown,
    open: () => [...shown.values()].filter((card) => !isDecided(card)).length,
  };
}

function isDecided(card) {
  return card.classList.contains("decided") || !!card.querySelector(".decided");
}

/** Keep the cards of items still waiting (and decided ones, with their outcome); add new ones in order. */
function reconcile(g, items, keyOf, render) {
  const keys = new Set(items.map(keyOf));
  for (const [key, card] of g.shown) {
    if (!keys.has(key) && !isDecided(card) && !card.contains(document.activeElement)) {
      card.remove();
      g.shown.delete(key);
    }
  }
  items.forEach((item, i) => {
    const key = keyOf(item);
    if (!g.shown.has(key)) {
      const card = render(item, i);
      g.shown.set(key, card);
      g.list.append(card);
    }
  });
  g.el.hidden = g.shown.size === 0;
  if (!g.shown.size) fill(g.list);
}
