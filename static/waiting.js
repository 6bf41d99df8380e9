// waiting.js — the home page's "Waiting for your decision": everything waiting on you, across
// your projects, as the inbox lists it (inbox.js, GET /api/inbox), so its count is the inbox's.
// Live from your own stream; a card already shown stays put, and a decided one stays with its
// outcome until you leave the page.

import { createInboxList } from "./inbox.js";
import { h } from "./ui.js";

// ---- lifecycle ---------------------------------------------------------------------------------

/** The "Waiting for your decision" section: {el, destroy}. */
export function createWaiting(ctx) {
  const count = h("span", { class: "count-badge", hidden: true });
  const el = h("section", { class: "section waiting", "aria-labelledby": "approvals-heading", hidden: true },
    h("h2", { id: "approvals-heading" }, "Waiting for your decision ", count));
  const list = createInboxList(ctx, {
    onCount: (open) => {
      count.textContent = open ? String(open) : "";
      count.setAttribute("aria-label", open === 1 ? "1 waiting" : `${open} waiting`);
      count.hidden = !open;
      el.hidden = !el.querySelector(".inbox-item");
    },
  });
  el.append(list.el);
  el.hidden = !el.querySelector(".inbox-item");
  return { el, destroy: () => list.destroy() };
}
