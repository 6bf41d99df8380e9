// evidence.js — a result's acceptance criteria, each with the evidence that covers it, for deciding
// next to the evidence: on the task page's decision panel and on an inbox card for final acceptance.
// The server shapes what it shows (criteria_evidence: which evidence covers which criterion, what is
// stale, which address is a picture to preview); this only draws it. `#n` references are in-page links
// that move the focus to what they name (the page routes by hash, so the address never changes).

import { h, badge, timeEl, words, safeUrl } from "./ui.js";
import { plainText } from "./markdown.js";

// ---- rendering ----------------------------------------------------------------------------------

const VERIFIER = { assignee: "the agent that did the work", requester: "the agent that asked", person: "a person",
  ci: "CI" };

/**
 * The criteria-with-evidence view of a result.
 *
 * `view` is the server's `criteria_evidence` (GET /api/tasks/ID's `criteria_evidence`, or an inbox
 * `final_acceptance` item's): `{revision, complete, criteria: [{criterion, text, standing, evidence,
 * verdict}], evidence: [{evidence, kind, summary, url, content, artifact_ref, preview, stale, …}],
 * general}`. `anchor` prefixes the ids of its parts, so it must be unique on the page: criterion
 * n (1-based) is `${anchor}-c${n}`, evidence #n is `${anchor}-e${n}`. Each evidence item is drawn
 * in full under the first criterion it covers (a link, its test output, a picture's preview);
 * later criteria it covers link to it. Evidence that covers no one criterion comes last.
 * Returns a `<div class="criteria-evidence">`; null when `view` is null (no result yet).
 */
export function criteriaEvidence(view, { anchor = "ce" } = {}) {
  if (!view) return null;
  const shown = new Map(); // evidence index -> the criterion (1-based) it was first drawn under
  const criteria = view.criteria.map((c) => {
    const n = c.criterion + 1;
    const items = c.evidence.map((e) => {
      if (shown.has(e)) return refItem(view.evidence[e], anchor, shown.get(e));
      shown.set(e, n);
      return evidenceItem(view.evidence[e], anchor);
    });
    return h("li", { class: `ce-criterion ce-${c.standing}`, id: `${anchor}-c${n}`, tabindex: "-1",
      dataset: { criterion: String(c.criterion) } },
    h("div", { class: "ce-head" },
      h("span", { class: "ce-n", text: `Criterion ${n}` }), " ",
      h("span", { class: "ce-text", text: plainText(c.text) }), " ",
      standingBadge(c, anchor, view.evidence),
      c.verdict ? [" ", badge(c.verdict.accepted ? "verifier: met" : "verifier: not met",
        c.verdict.accepted ? "ok" : "danger")] : null),
    c.verdict?.note ? h("p", { class: "muted small ce-note", text: `Verifier's note: ${c.verdict.note}` }) : null,
    items.length ? h("ul", { class: "ce-evidence" }, items)
      : h("p", { class: "ce-none", text: "No evidence covers this criterion." }));
  });
  const general = view.general.filter((e) => !shown.has(e));
  return h("div", { class: "criteria-evidence" },
    h("ol", { class: "ce-criteria" }, criteria),
    general.length ? h("div", { class: "ce-general" },
      h("p", { class: "muted small", text: "Evidence tagged to no one criterion (it covers none):" }),
      h("ul", { class: "ce-evidence" }, general.map((e) => evidenceItem(view.evidence[e], anchor)))) : null);
}

/** A link to an element of this page by its id: it moves the focus there and shows it, the address stays. */
export function anchorLink(id, text, props = {}) {
  const link = h("a", { href: `#${id}`, class: "anchor-link", ...props, text });
  link.addEventListener("click", (e) => {
    e.preventDefault();
    goToAnchor(id);
  });
  return link;
}

/** `#1, #2` as links to evidence items of the view with this anchor. */
export function evidenceRefs(indexes, anchor) {
  return indexes.map((e, i) => [i ? ", " : "", anchorLink(`${anchor}-e${e + 1}`, `#${e + 1}`)]);
}

function standingBadge(c, anchor, evidence) {
  if (c.standing === "uncovered") return badge("no evidence", "danger", "No evidence covers this criterion.");
  const stale = c.standing === "stale";
  const label = stale ? "only stale evidence: " : "covered by ";
  const el = badge("", stale ? "warn" : "ok", stale ? "Only stale evidence covers it." : undefined);
  el.classList.add("ce-standing");
  el.append(label, ...evidenceRefs(c.evidence, anchor).flat());
  if (!stale && c.evidence.some((e) => evidence[e]?.stale)) el.append(" (some stale)");
  return el;
}

function evidenceItem(ev, anchor) {
  const n = ev.evidence + 1;
  const url = ev.url ? safeUrl(ev.url) : null;
  const preview = ev.preview ? safeUrl(ev.preview) : null;
  const lines = ev.content ? ev.content.split("\n").length : 0;
  return h("li", { class: "ce-item", id: `${anchor}-e${n}`, tabindex: "-1", dataset: { evidence: String(ev.evidence) } },
    h("div", { class: "ce-item-head" },
      h("span", { class: "evidence-n", text: `#${n}` }), " ",
      badge(words(ev.kind), "muted"), " ",
      h("span", { class: "ce-summary", text: ev.summary }),
      ev.stale ? [" ", badge(`stale: ${words(ev.stale)}`, "warn")] : null),
    url ? h("a", { class: "ce-url small", href: url, target: "_blank", rel: "noopener noreferrer nofollow", text: ev.url })
      : ev.url ? h("code", { class: "small", text: ev.url }) : null,
    preview ? h("a", { class: "ce-preview", href: preview, target: "_blank", rel: "noopener noreferrer nofollow" },
      h("img", { src: preview, alt: `Preview of evidence #${n}: ${ev.summary}`, loading: "lazy",
        referrerpolicy: "no-referrer", decoding: "async" })) : null,
    ev.content ? (lines > 12
      ? h("details", { class: "ce-output" }, h("summary", { text: `${words(ev.kind)}: ${lines} lines` }),
        h("pre", { class: "code small", text: ev.content }))
      : h("pre", { class: "code small ce-output", text: ev.content })) : null,
    ev.artifact_ref ? h("p", { class: "muted small" }, "seen on ", h("code", { text: ev.artifact_ref })) : null,
    ev.observed_at || ev.verifier ? h("p", { class: "muted small" },
      ev.observed_at ? ["observed ", timeEl(ev.observed_at)] : null,
      ev.verifier ? `${ev.observed_at ? " · " : ""}checked by ${VERIFIER[ev.verifier] || words(ev.verifier)}` : null)
      : null);
}

/** Evidence already drawn under an earlier criterion: a line that links to it. */
function refItem(ev, anchor, under) {
  return h("li", { class: "ce-item ce-ref" },
    anchorLink(`${anchor}-e${ev.evidence + 1}`, `#${ev.evidence + 1}`), " ",
    h("span", { text: `${words(ev.kind)} “${ev.summary}”` }),
    h("span", { class: "muted small", text: ` (shown under criterion ${under})` }));
}

// ---- actions ------------------------------------------------------------------------------------

/** Show the element with this id: open what hides it, scroll it to the middle, focus and flash it. */
export function goToAnchor(id) {
  const target = document.getElementById(id);
  if (!target) return false;
  for (let up = target.parentElement; up; up = up.parentElement) if (up.tagName === "DETAILS") up.open = true;
  if (!target.hasAttribute("tabindex")) target.setAttribute("tabindex", "-1");
  target.scrollIntoView({ block: "center" });
  target.focus({ preventScroll: true });
  target.classList.add("flash");
  setTimeout(() => target.classList.remove("flash"), 1500);
  return true;
}
