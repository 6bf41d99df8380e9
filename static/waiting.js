// waiting.js — the home page's one line about your inbox: "4 things wait for you: 2 decisions,
// 2 mentions — Open inbox", from the same list the inbox shows (inbox_store.js), live. The
// projects come right after it; the items themselves are on the inbox screen.

import { items, loaded, onChange } from "./inbox_store.js";
import { h } from "./ui.js";

// How the line counts the kinds: [kinds, one, many], in the order it names them.
const GROUPS = [
  [["step", "action", "approval", "final_acceptance"], "decision", "decisions"],
  [["question"], "question", "questions"],
  [["mention", "agent_mention"], "mention", "mentions"],
  [["returned"], "task handed back", "tasks handed back"],
  [["verify"], "result to verify", "results to verify"],
  [["run_failed"], "failed run", "failed runs"],
  [["paused_pair"], "pair of paused agents", "pairs of paused agents"],
];

// ---- lifecycle ---------------------------------------------------------------------------------

/** The inbox's one-line summary: {el, destroy}. */
export function createWaiting() {
  const text = h("span", { class: "inbox-line-text" });
  const link = h("a", { href: "#/inbox", text: "Open inbox" });
  const el = h("p", { class: "inbox-line", role: "status" }, text, " — ", link);
  const paint = () => {
    el.hidden = !loaded();
    text.textContent = inboxLine(items());
  };
  const off = onChange(paint);
  paint();
  return { el, destroy: off };
}

/** "4 things wait for you: 2 decisions, 2 mentions", or "Nothing waits for you." */
export function inboxLine(list) {
  if (!list.length) return "Nothing waits for you.";
  const parts = GROUPS.map(([kinds, one, many]) => {
    const n = list.filter((i) => kinds.includes(i.kind)).length;
    return n ? `${n} ${n === 1 ? one : many}` : null;
  }).filter(Boolean);
  return `${list.length === 1 ? "1 thing waits" : `${list.length} things wait`} for you: ${parts.join(", ")}`;
}
