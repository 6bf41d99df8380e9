// app.js — the shell: who is signed in, the top bar, and hash routing to the views.
//
// Routes (a reload keeps the place):
//   #/                      your projects, new project, handoffs waiting for you
//   #/inbox                 everything waiting on you, across your projects
//   #/agents                your agents and their keys
//   #/rules                 your gate rules, standing approvals, auto-accept
//   #/connect/CODE          a computer asking to connect its runner
//   #/authorize/ID          an app (an MCP client) asking to act as one of your agents (OAuth)
//   #/invite/SECRET         an invite's landing page (signed in or not)
//   #/p/SLUG/room           the room (general chat)
//   #/search?q=WORDS        search your projects (the header's search box)
//   #/p/SLUG/room/MSG_ID    the room at one message
//   #/p/SLUG/tasks          the task board (?view=list&assignee=…&requester=…&state=…)
//   #/p/SLUG/tasks/TASK_ID  one task;  #/p/SLUG/tasks/TASK_ID/MSG_ID  at one message of its thread
//   #/p/SLUG/pulse | people | memory | story | audit

import * as api from "./api.js";
import * as project from "./project.js";
import * as stream from "./stream.js";
import * as signin from "./signin.js";
import * as projects from "./projects.js";
import * as room from "./room.js";
import * as board from "./board.js";
import * as task from "./task.js";
import * as pulse from "./pulse.js";
import * as people from "./people.js";
import * as memory from "./memory.js";
import * as audit from "./audit.js";
import * as story from "./story.js";
import * as agents from "./agents.js";
import * as rules from "./rules.js";
import * as connect from "./connect.js";
import * as stepup from "./stepup.js";
import * as authorize from "./authorize.js";
import * as inbox from "./inbox.js";
import * as inboxStore from "./inbox_store.js";
import * as invite from "./invite.js";
import * as search from "./search.js";
import * as shortcuts from "./shortcuts.js";
import * as push from "./push.js";
import * as pauses from "./pauses.js";
import { h, avatar, fill, heading, errorSlot, act, link, loadFailed } from "./ui.js";

const PROJECT_VIEWS = {
  room: ["Room", room.mount],
  tasks: ["Tasks", (el, ctx) => (ctx.id ? task.mount(el, ctx) : board.mount(el, ctx))],
  pulse: ["Team Pulse", pulse.mount],
  people: ["Members", people.mount],
  memory: ["Memory", memory.mount],
  story: ["Story", story.mount],
  audit: ["Audit", audit.mount],
};

const GLOBAL_VIEWS = {
  "": ["Projects", projects.mount],
  inbox: ["Inbox", inbox.mount],
  agents: ["Agents & keys", agents.mount],
  rules: ["Rules", rules.mount],
  connect: ["Connect a computer", connect.mount],
  authorize: ["Connect an app", authorize.mount],
  search: ["Search", search.mount],
};

let me = null;
let unmount = null;
let routeSerial = 0;
let firstRoute = true;
let closeMenu = null; // the phone's top-bar menu closes when the page goes elsewhere

// ---- lifecycle -----------------------------------------------------------------------

async function boot() {
  api.onSignedOut((err) => {
    if (!me) return;
    if (err?.code === "account_closed") showSignedOut(err.message, true); // nothing to sign in to any more
    else showSignedOut(err?.code === "signed_out" ? err.message : "Your session ended. Sign in again to continue.");
  });
  api.onStepUp((refusal) => stepup.ask(refusal)); // the server asked: "Confirm it's you", then the act again
  window.addEventListener("hashchange", route);
  window.addEventListener("hashchange", () => closeMenu?.());
  document.addEventListener("keydown", (e) => { if (e.key === "Escape") closeMenu?.(); });
  shortcuts.install(go);
  push.registerWorker();
  await start();
}

async function start() {
  try {
    ({ person: me } = await api.get("/api/me", { quietAuth: true }));
  } catch (err) {
    if (err.status === 401) return inviteSecret() ? showInvite(null) : showSignedOut(signinProblem());
    return showFatal(err);
  }
  inboxStore.start(me);
  inboxStore.onChange(() => pauses.changed()); // the person's stream said something changed
  pauses.load();
  renderShell();
  const back = returnTo();
  if (back && back !== window.location.hash) return go(back);
  await route();
}

// A request that waits for a person (an app or a computer asking to connect) survives signing in
// by an emailed link, which opens the page afresh: the page remembers it for RETURN_MINUTES.
const RETURN_KEY = "prickle.returnTo";
const RETURN_MINUTES = 15;

function rememberReturn() {
  if (/^#\/(authorize|connect)\/[A-Za-z0-9_-]+$/.test(window.location.hash)) {
    localStorage.setItem(RETURN_KEY, JSON.stringify({ hash: window.location.hash, at: Date.now() }));
  }
}

function returnTo() {
  const kept = JSON.parse(localStorage.getItem(RETURN_KEY) || "null");
  localStorage.removeItem(RETURN_KEY);
  return kept && Date.now() - kept.at < RETURN_MINUTES * 60000 ? kept.hash : null;
}

// ---- actions ----------------------------------------------------------------------------

/** Go to a hash route. */
export function go(hash) {
  if (window.location.hash === hash) route();
  else window.location.hash = hash;
}

async function signOut(button, error) {
  await act(button, error, async () => {
    await push.forgetDevice(); // a shared computer stops being told of your inbox
    if (!api.token()) await api.post("/api/signout", {});
    api.forgetToken();
    showSignedOut("You are signed out.");
  });
}

// ---- callbacks -------------------------------------------------------------------------

async function route() {
  if (!me) return;
  const serial = ++routeSerial;
  const [path, queryText = ""] = window.location.hash.replace(/^#\/?/, "").split(/\?(.*)/s);
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  const query = new URLSearchParams(queryText);
  teardown();
  const main = document.getElementById("main");
  const focus = !firstRoute;
  firstRoute = false;

  if (parts[0] === "invite") {
    project.leave();
    markNav(null);
    return showInvite(me);
  }
  if (parts[0] === "p" && parts[1]) {
    const [, slug, viewName = "room", id] = parts;
    const view = PROJECT_VIEWS[viewName];
    markNav(null);
    fill(main, h("p", { class: "muted loading", text: "Loading project…" }));
    let data;
    try {
      data = await project.enter(slug);
    } catch (err) {
      if (serial !== routeSerial) return;
      project.leave();
      return showProjectMissing(main, slug, err);
    }
    if (serial !== routeSerial) return;
    if (!view) return showNotFound(main);
    const bar = project.header(viewName);
    const body = h("div", { class: "view" });
    fill(main, bar.el, body);
    document.title = `${view[0]} · ${data.project.name} · Prickle`;
    const ctx = { me, slug, id, sub: parts[4], query, project, go, view: viewName };
    const off = view[1](body, ctx);
    // The project deleted (or the person removed) while open: the view goes, saying so.
    const offGone = stream.on("gone", () => {
      project.leave();
      route();
    });
    unmount = () => {
      bar.destroy();
      offGone();
      if (typeof off === "function") off();
    };
  } else {
    project.leave();
    const key = parts[0] || "";
    const view = GLOBAL_VIEWS[key];
    markNav(key);
    if (!view) return showNotFound(main);
    const body = h("div", { class: "view" });
    fill(main, body);
    document.title = key ? `${view[0]} · Prickle` : "Prickle";
    const off = view[1](body, { me, go, id: parts[1], query });
    unmount = typeof off === "function" ? off : null;
  }
  if (focus) {
    const target = main.querySelector("h1");
    (target || main).focus({ preventScroll: false });
    window.scrollTo(0, 0);
  }
}

// ---- internal -----------------------------------------------------------------------------

function teardown() {
  if (unmount) {
    try {
      unmount();
    } catch (err) {
      console.error(err);
    }
  }
  unmount = null;
}

function renderShell() {
  const error = errorSlot();
  const out = h("button", { type: "button", class: "quiet", text: "Sign out" });
  out.addEventListener("click", () => signOut(out, error));
  // On a phone the bar is one row: the inbox link stays, the menu button shows the other links, the
  // search box and you below it.
  const nav = h("nav", { class: "global-nav", id: "main-nav", "aria-label": "Main" },
    h("a", { href: "#/", dataset: { nav: "" }, text: "Projects" }),
    inbox.headerLink(),
    h("a", { href: "#/agents", dataset: { nav: "agents" }, text: "Agents & keys" }),
    h("a", { href: "#/rules", dataset: { nav: "rules" }, text: "Rules" }));
  const menu = h("div", { class: "topbar-menu", id: "topbar-menu" },
    searchBox(),
    h("div", { class: "me" },
      avatar(me.display_name, me.color),
      h("span", { class: "me-name" }, h("span", { text: me.display_name }),
        h("span", { class: "muted", text: ` @${me.handle}` })),
      out));
  const toggle = h("button", { type: "button", class: "menu-toggle", "aria-expanded": "false",
    "aria-controls": "main-nav topbar-menu", text: "Menu" });
  const bar = document.getElementById("topbar");
  const openMenu = (yes) => {
    bar.classList.toggle("menu-open", yes);
    toggle.setAttribute("aria-expanded", String(yes));
  };
  toggle.addEventListener("click", () => openMenu(!bar.classList.contains("menu-open")));
  closeMenu = () => openMenu(false);
  fill(bar,
    h("a", { class: "brand", href: "#/" }, h("span", { class: "brand-mark", "aria-hidden": "true", text: "✳" }), "Prickle"),
    nav, menu, pauses.chip(), toggle, error);
  document.body.classList.remove("signed-out");
}

/** The header's search box: Enter opens #/search?q=… (search.js). */
function searchBox() {
  const input = h("input", { id: "search", type: "search", name: "q", placeholder: "Search", autocomplete: "off",
    "aria-label": "Search messages and tasks", maxlength: "200" });
  const form = h("form", { class: "search-box", role: "search" }, input);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const q = input.value.trim();
    if (q) go(`#/search?q=${encodeURIComponent(q)}`);
  });
  return form;
}

function markNav(key) {
  for (const a of document.querySelectorAll(".global-nav a")) {
    if (a.dataset.nav === key) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
}

/** What went wrong with a sign-in link, from the ?signin= the server redirected with. */
function signinProblem() {
  const why = new URLSearchParams(window.location.search).get("signin");
  const again = "Ask whoever runs Prickle for a new one (they make it with prickle signin-link YOUR-HANDLE)";
  const what = { used: "was already used", expired: "has expired", invalid: "is not valid here" }[why];
  return what ? `That sign-in link ${what}. ${again}` : undefined;
}

function showSignedOut(reason, closed = false) {
  closeMenu?.();
  teardown();
  project.leave();
  inboxStore.stop();
  me = null;
  firstRoute = true;
  document.body.classList.add("signed-out");
  fill(document.getElementById("topbar"),
    h("span", { class: "brand" }, h("span", { class: "brand-mark", "aria-hidden": "true", text: "✳" }), "Prickle"));
  document.title = "Sign in · Prickle";
  rememberReturn();
  signin.mount(document.getElementById("main"), {
    reason,
    closed,
    onSignedIn: () => start(),
  });
}

/** The secret of an invite link this page was opened with (#/invite/SECRET), or null. */
function inviteSecret() {
  const match = window.location.hash.match(/^#\/invite\/([A-Za-z0-9_-]+)$/);
  return match ? match[1] : null;
}

function showInvite(person) {
  teardown();
  if (!person) {
    document.body.classList.add("signed-out");
    fill(document.getElementById("topbar"),
      h("span", { class: "brand" }, h("span", { class: "brand-mark", "aria-hidden": "true", text: "✳" }), "Prickle"));
  }
  document.title = "Invite · Prickle";
  const main = document.getElementById("main");
  unmount = invite.mount(main, {
    me: person,
    id: inviteSecret(),
    onJoined: (slug) => {
      window.location.hash = `#/p/${encodeURIComponent(slug)}/room`;
      if (!me) start();
    },
  });
  main.querySelector("h1")?.focus();
}

function showFatal(err) {
  fill(document.getElementById("main"), h("section", { class: "card" },
    heading(1, "Prickle could not start"),
    h("p", { class: "error", role: "alert", text: err.message }),
    h("button", { type: "button", onclick: () => start(), text: "Try again" })));
}

function showProjectMissing(main, slug, err) {
  document.title = "Not found · Prickle";
  fill(main, h("section", { class: "card" },
    heading(1, err.status === 404 ? "No such project in your list" : "This project could not be opened"),
    err.status === 404
      ? h("p", { text: `There is no project “${slug}” among your projects. A project shows here once an owner adds you; `
        + "one that was deleted is listed on Your projects for its owners, who can restore it." })
      : loadFailed(err, route),
    link("#/", "Back to your projects")));
}

function showNotFound(main) {
  fill(main, h("section", { class: "card" }, heading(1, "Nothing here"),
    h("p", { text: "This address is not a page of Prickle." }), link("#/", "Back to your projects")));
}

boot();
