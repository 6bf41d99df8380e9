// shortcuts.js — the keyboard's ways around the page: skip links that move focus (the page
// routes by hash, so a skip link never changes the address) and single-key shortcuts:
//   /    the search box in the header (#search), when there is one
//   c    the composer of the room or thread on screen
//   g i  the inbox (#/inbox)
//   ?    the list of shortcuts (with those of the screen on view: addHelp)
// No shortcut fires while you type in a field or hold Ctrl, Alt or Meta.

import { h } from "./ui.js";

const CHORD_MS = 1500; // how long after "g" its second key counts

let chord = 0; // when "g" was pressed (ms), 0 when no chord is open

// The keys every screen has, then those a screen on view adds (addHelp): [title, [[keys, what]]].
const GLOBAL_HELP = ["Everywhere", [["/", "Search"], ["c", "Write a message (in a room or a task's thread)"],
  ["g then i", "Go to the inbox"], ["?", "Show these shortcuts"]]];
const screenHelp = new Set();

// ---- lifecycle ------------------------------------------------------------------------------

/** Install the skip links' focus handling and the shortcuts; go(hash) changes route. */
export function install(go) {
  for (const skip of document.querySelectorAll(".skip-link")) wireSkip(skip);
  const toComposer = h("a", { class: "skip-link skip-composer", href: "#composer", hidden: true,
    text: "Skip to the message box" });
  wireSkip(toComposer);
  document.querySelector(".skip-link")?.after(toComposer);
  // The second skip link shows only where there is a composer to go to.
  new MutationObserver(() => { toComposer.hidden = !composer(); })
    .observe(document.getElementById("main"), { childList: true, subtree: true });
  document.addEventListener("keydown", (e) => onKey(e, go));
}

/** List a screen's own keys in the shortcut list while it is on view; returns a function that takes them out. */
export function addHelp(title, keys) {
  const entry = [title, keys];
  screenHelp.add(entry);
  return () => screenHelp.delete(entry);
}

/** Show the list of shortcuts (the "?" key). */
export function showHelp() {
  document.querySelector("dialog.shortcut-help")?.remove();
  const close = h("button", { type: "button", class: "small", text: "Close" });
  const dialog = h("dialog", { class: "shortcut-help", "aria-labelledby": "shortcut-help-title" },
    h("h2", { id: "shortcut-help-title", text: "Keyboard shortcuts" }),
    [...screenHelp, GLOBAL_HELP].map(([title, keys]) => h("section", {},
      h("h3", { text: title }),
      h("dl", {}, keys.map(([key, what]) => [h("dt", {}, key.split(" then ").map((k, n) => [n ? " then " : null,
        h("kbd", { text: k })])), h("dd", { text: what })])))),
    h("div", { class: "button-row" }, close));
  close.addEventListener("click", () => dialog.close());
  dialog.addEventListener("close", () => dialog.remove());
  document.body.append(dialog);
  dialog.showModal();
  close.focus();
}

// ---- callbacks ------------------------------------------------------------------------------

function onKey(e, go) {
  if (e.defaultPrevented || e.ctrlKey || e.altKey || e.metaKey || e.isComposing || typing(e.target)) return;
  const now = e.timeStamp || Date.now();
  if (chord && now - chord <= CHORD_MS) {
    chord = 0;
    if (e.key === "i") {
      e.preventDefault();
      go("#/inbox");
    }
    return;
  }
  chord = 0;
  if (e.key === "g") {
    chord = now;
  } else if (e.key === "/") {
    const search = document.getElementById("search");
    if (!search) return;
    e.preventDefault();
    const menu = document.querySelector(".menu-toggle[aria-expanded='false']");
    if (!search.offsetParent && menu?.offsetParent) menu.click(); // on a phone it sits in the top bar's menu
    search.focus();
  } else if (e.key === "?") {
    e.preventDefault();
    showHelp();
  } else if (e.key === "c") {
    const box = composer();
    if (!box) return;
    e.preventDefault();
    box.focus();
  }
}

// ---- internal -------------------------------------------------------------------------------

/** A skip link moves focus to its target instead of following its href (a route). */
function wireSkip(link) {
  link.addEventListener("click", (e) => {
    e.preventDefault();
    const target = link.classList.contains("skip-composer") ? composer() : document.getElementById("main");
    target?.focus();
  });
}

/** The message box on screen: the room's, else the first thread's. */
function composer() {
  return document.querySelector("#main .composer textarea");
}

/** Is the key meant for a field (typing, choosing, editing), or a dialog on top? */
export function typing(target) {
  if (document.querySelector("dialog[open]")) return true;
  if (!(target instanceof Element)) return false;
  if (target.isContentEditable) return true;
  const tag = target.tagName;
  if (tag === "TEXTAREA" || tag === "SELECT") return true;
  if (tag !== "INPUT") return false;
  return !["button", "checkbox", "radio", "submit", "reset", "range", "color", "file"].includes(target.type);
}
