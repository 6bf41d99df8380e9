// task.js — one task's page: first where it stands, whose turn it is and the decisions that are
// yours (decisions.js: final acceptance next to each criterion's evidence, evidence.js) with the
// steps its run asks you to allow (steps.js) and why it was last sent back, cancelled or handed
// back; then the packet with what the latest evidence report and verdicts say of each criterion,
// its timeline (timeline.js: messages, checkpoints, results, runs, decisions and state changes in
// order), its sub-tasks and runs, each result (evidence, evidence report, artifacts) with the files delivered
// (deliverables.js), renaming it
// and what a sub-task waits on, and its thread.

import { get, post, seg } from "./api.js";
import * as stream from "./stream.js";
import { markDialog, localDay } from "./story.js";
import { MessageList, provenanceBadges } from "./room.js";
import { createComposer } from "./composer.js";
import { stepCard, pendingSteps } from "./steps.js";
import { runsSection } from "./runs.js";
import { approvalCard, finalDecision, cancelRow, reassignForm } from "./decisions.js";
import { requestingPerson, awaitingFinal, taskState, titleOf, requesterText, actorText, askToVerify } from "./task_common.js";
import { timeline, lastReason } from "./timeline.js";
import { markdownWithRaw, plainText } from "./markdown.js";
import { evidenceRefs } from "./evidence.js";
import { pausedSentence } from "./pauses.js";
import { deliverablesSection } from "./deliverables.js";
import {
  h, heading, field, errorSlot, act, fill, empty, badge, stateBadge, timeEl, words, safeUrl, debounce, announce,
  ownerOf, loadFailed,
} from "./ui.js";

// ---- lifecycle --------------------------------------------------------------------------------

/** #/p/SLUG/tasks/ID (and #/p/SLUG/tasks/ID/MSG_ID, at one message of its thread) */
export function mount(el, ctx) {
  const taskId = ctx.id;
  const top = h("div", { class: "task-top" }, h("p", { class: "muted", text: "Loading the task…" }));
  const body = h("div", { class: "task-body" });
  const list = new MessageList(ctx, taskId);
  const composer = createComposer({ taskId, onSending: (body) => list.sending(body),
    onPosted: (m) => list.add(m, { scroll: true }) });
  list.onReply = (m) => composer.replyTo(m);
  const thread = h("section", { class: "section thread-section", "aria-labelledby": "thread-heading" },
    h("h2", { id: "thread-heading", text: "Thread" }), list.el, composer.el);
  el.append(h("p", { class: "back" }, h("a", { href: `#/p/${ctx.slug}/tasks`, text: "← All tasks" })), top, body, thread);

  let shown = null; // what is on screen, so an unchanged answer does not redraw (and drop focus)
  let first = true;
  let said = null; // what the person just did here, said until they leave the page
  const done = (text) => { said = text; };
  const decided = new Map(); // step id -> its card, decided here: it stays with its outcome
  const load = async () => {
    try {
      const [detail, steps] = await Promise.all([
        get(`/api/tasks/${seg(taskId)}`),
        pendingSteps().catch(() => []),
      ]);
      if (detail.task.project !== ctx.slug) {
        ctx.go(`#/p/${detail.task.project}/tasks/${taskId}`);
        return;
      }
      // The held handoff's approval, when it is this person's to decide.
      const approval = detail.approval?.owner === ctx.me.handle ? { approval: detail.approval, task: detail.task } : null;
      const mine = steps.filter((step) => step.task_id === taskId && !decided.has(step.id));
      const key = JSON.stringify([detail, approval, mine, [...decided.keys()], said]);
      if (key === shown) return;
      shown = key;
      const stepCards = [...decided.values(), ...mine.map((step) => {
        const card = stepCard(step, { embedded: true, onDecided: () => decided.set(step.id, card) });
        return card;
      })];
      const focused = document.activeElement;
      renderTask(top, body, ctx, detail, approval, stepCards, load, { said, done });
      if (focused !== document.activeElement && top.contains(focused)) focused.focus({ preventScroll: true });
      else if (focused !== document.body && !focused?.isConnected) {
        // The control that had the focus went with what it did (Send back, Cancel...): hand the focus
        // to what it did, or to the heading, never to nowhere.
        const to = (said && top.querySelector(".decided-notice")) || top.querySelector("h1");
        to?.setAttribute("tabindex", "-1");
        to?.focus();
      }
      if (first) {
        first = false;
        if (!ctx.sub) top.querySelector("h1")?.focus(); // a link to a message keeps the focus there
      }
    } catch (err) {
      if (err.status !== 404) {
        if (shown !== null) return; // the task on screen stays; the next event tries again
        fill(top, heading(1, "This task could not be loaded"), loadFailed(err, load));
        return;
      }
      fill(top, heading(1, "Task not found"),
        h("p", { class: "error", role: "alert", text: err.message }),
        h("a", { href: `#/p/${ctx.slug}/tasks`, text: "Back to the tasks" }));
      thread.hidden = true;
    }
  };
  const reload = debounce(load, 250);
  const offTask = stream.on("task.updated", (e) => {
    if (e.task?.id === taskId) reload();
  });
  const offApproval = stream.on("approval.updated", (e) => {
    if (e.approval?.task_id === taskId) reload();
  });
  const offMessage = stream.on("message.posted", (e) => { // the timeline lists the thread's messages
    if (e.message?.task_id === taskId) reload();
  });
  const drawn = load();
  // A linked message is scrolled to once the task above the thread is drawn too: drawn later, it
  // would push the message out of view.
  Promise.all([drawn, list.load()]).then(() => { if (ctx.sub) list.revealDeep(ctx.sub); });
  return () => {
    offTask();
    offApproval();
    offMessage();
    reload.cancel();
    list.destroy();
    composer.destroy();
  };
}

// ---- rendering --------------------------------------------------------------------------------

/** "Mark as a moment": one click opens the story's dialog, linked to this task. */
function markMomentButton(ctx, task) {
  const button = h("button", { type: "button", class: "link small mark-moment", text: "Mark as a moment" });
  const day = localDay(new Date(task.state === "completed" ? task.updated_at : task.created_at));
  button.addEventListener("click", () => markDialog(ctx, { task_id: task.id, day, title: titleOf(task).slice(0, 140) }, button));
  return button;
}

function renderTask(top, body, ctx, detail, approval, stepCards, reload, said) {
  const { task, submissions } = detail;
  fill(top,
    heading(1, titleOf(task), { class: "task-title" }),
    h("div", { class: "task-meta" },
      taskState(task),
      h("span", { text: `${requesterText(task)} → ${task.assignee}` }),
      h("span", { class: "muted", text: words(task.packet.deliverable_type) }),
      h("span", { class: "muted" }, "created ", timeEl(task.created_at)),
      h("span", { class: "muted" }, "updated ", timeEl(task.updated_at, true)),
      task.parent_task_id ? h("a", { href: `#/p/${ctx.slug}/tasks/${task.parent_task_id}`, text: "parent task" }) : null,
      markMomentButton(ctx, task),
      detail.blocked?.length ? h("span", { class: "task-blocked" }, badge("blocked", "warn"), " waits on ",
        detail.blocked.map((id, i) => [i ? ", " : "", h("a", { href: `#/p/${ctx.slug}/tasks/${id}`, text: siblingTitle(detail, id) })]))
        : null),
    renderActions(ctx, detail, approval, stepCards, reload, said),
    detail.can_rename ? namesBox(ctx, detail, reload) : null);

  const latest = task.result;
  fill(body,
    h("section", { class: "section", "aria-labelledby": "packet-heading" },
      h("h2", { id: "packet-heading", text: "What was asked" }),
      markdownWithRaw(task.packet.task, { class: "packet-task" }),
      h("h3", { text: "Acceptance criteria" }),
      criteriaList(task.packet.acceptance_criteria, latest),
      task.packet.context ? [h("h3", { text: "Context" }), markdownWithRaw(task.packet.context)] : null,
      task.packet.files?.length ? [h("h3", { text: "Files" }), codeList(task.packet.files)] : null,
      task.packet.depends_on?.length ? [h("h3", { text: "Depends on" }), codeList(task.packet.depends_on)] : null),
    h("section", { class: "section", "aria-labelledby": "timeline-heading" },
      h("h2", { id: "timeline-heading", text: "Timeline" }),
      timeline(detail, ctx.me.handle, ctx.slug)),
    detail.subtasks?.length ? subtasksSection(ctx, detail.subtasks) : null,
    runsSection(ctx, detail, reload),
    h("section", { class: "section", "aria-labelledby": "subs-heading" },
      h("h2", { id: "subs-heading", text: submissions.length > 1 ? `Results (${submissions.length} revisions)` : "Result" }),
      submissions.length
        ? [...submissions].reverse().map((s, i) => (i === 0 ? renderSubmission(s, task, detail.deliverables)
          : h("details", { class: "older" }, h("summary", { text: `Revision ${s.revision} · ${s.status}` }),
            renderSubmission(s, task, detail.deliverables))))
        : empty("No result yet.")),
    detail.deliverables?.length ? deliverablesSection(detail.deliverables) : null);
}

function renderActions(ctx, detail, approval, stepCards, reload, { said, done }) {
  const { task } = detail;
  const box = h("section", { class: "actions card", "aria-labelledby": "actions-heading" },
    h("h2", { id: "actions-heading", class: "sr-only", text: "Whose turn, and your decisions" }));
  const requester = requestingPerson(task);
  const owner = ownerOf(task.assignee);
  const parts = [
    said ? h("p", { class: "notice ok decided-notice", role: "status", text: said }) : null,
    h("p", { class: "status-line", text: statusLine(task, requester, owner, ctx.me.handle, detail.assignee_paused) }),
    lastReason(detail, ctx.me.handle)];

  const asking = stepCards.filter((card) => !card.classList.contains("decided")).length;
  if (stepCards.length) {
    parts.push(h("div", { class: "step-box" },
      asking ? h("p", { class: "step-lead", text: `${task.assignee}'s run is waiting for you: allow or refuse ${asking === 1 ? "this step" : "these steps"}.` }) : null,
      stepCards));
  }

  if (approval) parts.push(approvalCard(approval, { onDecided: (out, text) => { done(text); reload(); }, embedded: true }));
  // The server says what you may do now: give final acceptance, start a verification, cancel it, hand it on (can_*).
  if (task.can_give_final) {
    parts.push(finalDecision(ctx, task, reload, { view: detail.criteria_evidence, anchor: "decide", onDone: done }));
  }
  if (task.can_verify) parts.push(verifyRow(task, reload));
  if (task.can_ask_to_verify) parts.push(askToVerify(task.id, task.requester));
  if (task.can_cancel) parts.push(cancelRow(task, reload, done));
  if (task.can_reassign) parts.push(reassignForm(ctx, task, reload));
  box.classList.toggle("done", task.state === "completed");
  box.append(...parts.filter(Boolean));
  return box;
}

/** Rename the task (its display title; the packet stays) and, for a sub-task, pick the siblings it waits on. */
function namesBox(ctx, detail, reload) {
  const { task } = detail;
  const input = h("input", { id: "task-title-input", name: "title", maxlength: "500", autocomplete: "off",
    value: task.display_title || "", placeholder: task.packet.task });
  const save = h("button", { type: "submit", class: "small primary", text: "Rename" });
  const error = errorSlot();
  const setTitle = (title) => act(save, error, async () => {
    await post(`/api/tasks/${seg(task.id)}/title`, { title });
    announce(title ? `Renamed to ${title}` : "The task shows its own words again");
    reload();
  });
  const form = h("form", { class: "row-form title-form" }, field("Display title", input, "Only the name people and agents see changes: the packet stays as it was."),
    h("div", { class: "button-row" }, save,
      task.display_title ? h("button", { type: "button", class: "small", text: "Use the task's own words", onclick: () => setTitle(null) }) : null),
    error);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    setTitle(input.value.trim() || null);
  });
  const open = detail.can_set_waits ? detail.siblings : null;
  let waits = null;
  if (open?.length) {
    const checks = open.map((s) => h("label", { class: "check" },
      h("input", { type: "checkbox", value: s.id, checked: detail.blocked_by.includes(s.id) }),
      ` ${s.title} `, stateBadge(s.state)));
    const saveWaits = h("button", { type: "submit", class: "small", text: "Save what it waits on" });
    const waitsError = errorSlot();
    waits = h("form", { class: "waits-form" },
      h("fieldset", { class: "checks" }, h("legend", { text: "Waits on (other sub-tasks of the same parent)" }), checks),
      saveWaits, waitsError);
    waits.addEventListener("submit", (e) => {
      e.preventDefault();
      const blocked_by = [...waits.querySelectorAll("input:checked")].map((i) => i.value);
      act(saveWaits, waitsError, async () => {
        await post(`/api/tasks/${seg(task.id)}/blocked-by`, { blocked_by });
        announce(blocked_by.length ? `Waits on ${blocked_by.length} sub-task${blocked_by.length > 1 ? "s" : ""}` : "Waits on nothing");
        reload();
      });
    });
  }
  return h("details", { class: "card names-box" }, h("summary", { text: task.parent_task_id ? "Rename the task, or set what it waits on" : "Rename the task" }),
    form, waits);
}

/** The parent's own sub-tasks, each with its state and whether it is blocked. */
function subtasksSection(ctx, subtasks) {
  return h("section", { class: "section", "aria-labelledby": "subtasks-heading" },
    h("h2", { id: "subtasks-heading", text: `Sub-tasks (${subtasks.length})` }),
    h("ul", { class: "subtask-list" }, subtasks.map((s) => h("li", { dataset: { taskId: s.id } },
      h("a", { href: `#/p/${ctx.slug}/tasks/${s.id}`, text: s.title }), " ", stateBadge(s.state),
      s.blocked.length ? [" ", badge("blocked", "warn", `Waits on ${s.blocked.length} other sub-task${s.blocked.length > 1 ? "s" : ""}`)] : null,
      h("span", { class: "muted small", text: ` → ${s.assignee}` })))));
}

function siblingTitle(detail, id) {
  return detail.siblings?.find((s) => s.id === id)?.title || id;
}

/** Ask the requesting agent's runner to verify the result now. */
function verifyRow(task, reload) {
  const error = errorSlot();
  const button = h("button", { type: "button", class: "primary", text: `Verify now with ${task.requester}` });
  button.addEventListener("click", () => act(button, error, async () => {
    await post(`/api/tasks/${seg(task.id)}/verify`, {});
    announce(`${task.requester}'s runner is verifying the result`);
    reload();
  }));
  return h("div", { class: "button-row verify-row" }, button, error);
}

/** One sentence: where the task stands and whose turn it is. */
function statusLine(task, requester, owner, me, paused) {
  const you = (handle) => (handle === me ? "you" : handle);
  // The task is with its agent, and its agent is paused: say so, never "working on it".
  if (paused && ["requested", "routed", "accepted", "working"].includes(task.state)) return pausedSentence(task.assignee, paused);
  switch (task.state) {
    case "approval":
      if (awaitingFinal(task)) {
        return requester === me ? "The result was verified. Your final decision:"
          : `The result was verified. Waiting for ${requester}'s final acceptance.`;
      }
      return owner === me ? "Your gate is holding this handoff. Approve or deny it:"
        : `Held by the gate until ${owner} approves or denies it.`;
    case "requested":
    case "routed":
      return `Handed to ${task.assignee}; it has not accepted the task yet.`;
    case "accepted":
    case "working":
      if (task.step_waiting) {
        return owner === me ? `${task.assignee} waits for your decision on a step it asked to take (in your inbox).`
          : `${task.assignee} waits for ${owner}'s decision on a step it asked to take.`;
      }
      return `${task.assignee} is working on it.`;
    case "waiting":
      return `${task.assignee} has a question for ${you(requester)}: answer it in the thread below.`;
    case "verifying":
      if (task.requester) {
        // What is really happening: a verification run, a runner about to start one, or nobody at all.
        if (task.verification === "running") return `${task.requester} is checking the result (a verification run is going).`;
        if (task.verification === "listening") return `The result is back: ${task.requester}'s runner verifies it.`;
        return `The result waits for ${task.requester} to verify it, and no runner of it is listening: start prickle runner on its computer, or ask it in a session.`;
      }
      return requester === me ? "The result is back. Your final decision:" : `Waiting for ${you(requester)} to check the result.`;
    case "completed":
      return "Completed: the result was accepted.";
    case "returned":
      return `Returned by ${task.assignee}: it waits for ${you(requester)} to hand it to another agent.`;
    default:
      return `This task is ${task.state}.`;
  }
}

function codeList(items) {
  return h("ul", { class: "code-list" }, items.map((f) => h("li", {}, h("code", { text: f }))));
}

/** Criteria with what the latest result's evidence report and verdicts say about each; a result sent
 *  back (or superseded, cancelled) no longer stands, so what it said is shown as its revision's, greyed. */
function criteriaList(criteria, result) {
  const report = result?.evidence_report;
  const past = result && !["submitted", "accepted"].includes(result.status) ? `revision ${result.revision}: ` : "";
  const mark = (text, kind, title) => badge(`${past}${text}`, past ? "muted" : kind, title);
  const staleSet = new Set((report?.stale || []).map((s) => s.evidence));
  return h("ol", { class: "criteria" }, criteria.map((text, i) => {
    const covering = report?.coverage?.find((c) => c.criterion === i)?.evidence || [];
    const verdict = result?.verdicts?.find((v) => v.criterion === i);
    let status = null;
    if (report) {
      if (!covering.length) status = mark("uncovered", "danger", "No evidence covers this criterion.");
      else if (covering.every((n) => staleSet.has(n))) status = mark("stale evidence", "warn", "Only stale evidence covers it.");
      else {
        status = mark("covered by ", "ok"); // each #n links to the item in the result below
        status.append(...evidenceRefs(covering, `r${result.revision}`).flat());
        status.classList.add("ce-standing");
      }
    }
    return h("li", { class: "criterion", dataset: { criterion: String(i) } },
      h("span", { class: "criterion-text", text: plainText(text) }),
      h("span", { class: "criterion-status" }, status,
        verdict ? mark(`verifier: ${verdict.accepted ? "met" : "not met"}`, // as the decision panel says
          verdict.accepted ? "ok" : "danger", verdict.note || undefined) : null,
        verdict?.note ? h("span", { class: "muted small", text: verdict.note }) : null));
  }));
}

const SUBMISSION_KIND = { submitted: "info", accepted: "ok", rejected: "danger", superseded: "muted", cancelled: "muted" };

function renderSubmission(sub, task, deliverables = []) {
  const report = sub.evidence_report || {};
  const stale = new Map((report.stale || []).map((s) => [s.evidence, s.why]));
  return h("article", { class: "submission", dataset: { revision: String(sub.revision) } },
    h("div", { class: "submission-head" },
      h("strong", { text: `Revision ${sub.revision}` }),
      badge(sub.status, SUBMISSION_KIND[sub.status] || "muted"),
      ...provenanceBadges(sub),
      h("span", { class: "muted small" }, `returned by ${sub.returned_by} · `, timeEl(sub.returned_at))),
    markdownWithRaw(sub.summary, { class: "submission-summary" }),
    h("h3", { text: "Evidence" }),
    h("ol", { class: "evidence" }, sub.evidence.map((ev, n) => {
      const url = ev.url ? safeUrl(ev.url) : null;
      return h("li", { class: "evidence-item", id: `r${sub.revision}-e${n + 1}`, tabindex: "-1" },
        h("div", { class: "evidence-head" },
          h("span", { class: "evidence-n", text: `#${n + 1}` }), badge(words(ev.kind), "muted"),
          h("span", { text: ev.summary }),
          stale.has(n) ? badge(`stale: ${words(stale.get(n))}`, "warn") : null),
        ev.criteria?.length ? h("p", { class: "muted small",
          text: `for criterion ${ev.criteria.map((c) => c + 1).join(", ")}` }) : null,
        url ? h("a", { href: url, target: "_blank", rel: "noopener noreferrer nofollow", class: "small", text: ev.url })
          : ev.url ? h("code", { class: "small", text: ev.url }) : null,
        ev.content ? h("pre", { class: "code small", text: ev.content }) : null,
        ev.artifact != null && sub.artifacts?.[ev.artifact]
          ? h("p", { class: "muted small", text: `artifact: ${sub.artifacts[ev.artifact].ref}` }) : null,
        ev.observed_at || ev.verifier ? h("p", { class: "muted small" },
          ev.observed_at ? ["observed ", timeEl(ev.observed_at)] : null, ev.verifier ? ` · checked by ${ev.verifier}` : null)
          : null);
    })),
    h("h3", { text: "Evidence report" }),
    evidenceReport(report, task.packet.acceptance_criteria),
    sub.artifacts?.length ? [h("h3", { text: "Artifacts" }), h("ul", { class: "artifacts" }, sub.artifacts.map((a) =>
      h("li", {}, h("code", { text: a.ref }),
        deliveredLink(a, deliverables),
        a.commit_sha ? h("span", { class: "muted small", title: a.commit_sha, text: ` commit ${a.commit_sha.slice(0, 12)}` }) : null,
        a.sha256 ? h("span", { class: "muted small", title: a.sha256, text: ` sha256 ${a.sha256.slice(0, 12)}…` }) : null)))]
      : null,
    h("dl", { class: "facts" },
      sub.verified_by ? [h("dt", { text: "Verified by" }), h("dd", { text: actorText(sub.verified_by) })] : null,
      sub.decided_by ? [h("dt", { text: "Decided by" }), h("dd", { text: actorText(sub.decided_by) })] : null,
      sub.decided_by_policy ? [h("dt", { text: "Policy" }), h("dd", { text: words(sub.decided_by_policy) })] : null,
      sub.reason ? [h("dt", { text: "Reason" }), h("dd", { class: "pre", text: sub.reason })] : null));
}

/** "open": to the delivered file an artifact names (the same ref and sha256), in "Delivered files" below. */
function deliveredLink(artifact, deliverables) {
  const d = artifact.sha256 && deliverables?.find((x) => x.ref === artifact.ref && x.sha256 === artifact.sha256);
  if (!d) return null;
  const button = h("button", { type: "button", class: "link small", "aria-label": `Open ${d.ref} below`, text: "open" });
  button.addEventListener("click", () => {
    const card = document.querySelector(`.deliverable[data-ref="${CSS.escape(d.ref)}"]`);
    card?.scrollIntoView({ block: "center" });
    card?.querySelector("a")?.focus();
  });
  return button;
}

function evidenceReport(report, criteria) {
  if (!report.coverage) return empty("No report.");
  const staleSet = new Set((report.stale || []).map((s) => s.evidence));
  // Covered only by stale evidence is not covered: it gets its own mark.
  const standing = (c) => (!c.evidence.length ? "uncovered" : c.evidence.every((n) => staleSet.has(n)) ? "stale" : "covered");
  const MARK = { covered: "✓", stale: "!", uncovered: "✗" };
  return h("div", { class: "report" },
    report.complete ? badge("complete: every criterion covered, nothing stale", "ok")
      : badge("incomplete", "warn"),
    h("ul", { class: "report-list" },
      report.coverage.map((c) => h("li", { class: standing(c) },
        h("span", { class: "report-mark", "aria-hidden": "true", text: MARK[standing(c)] }),
        h("span", { text: `Criterion ${c.criterion + 1}: ${plainText(criteria[c.criterion] ?? "")}` }),
        h("span", { class: "muted small", text: {
          covered: ` — evidence ${c.evidence.map((n) => `#${n + 1}`).join(", ")}`,
          stale: ` — only stale evidence ${c.evidence.map((n) => `#${n + 1}`).join(", ")}`,
          uncovered: " — uncovered" }[standing(c)] })))),
    report.general?.length ? h("p", { class: "muted small",
      text: `Counted for no criterion (untagged, or of a kind that does not count for this deliverable): ${
        report.general.map((n) => `#${n + 1}`).join(", ")}` }) : null,
    report.stale?.length ? h("p", { class: "warn-text small",
      text: `Stale: ${report.stale.map((s) => `#${s.evidence + 1} (${words(s.why)})`).join(", ")}` }) : null);
}
