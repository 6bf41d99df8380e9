// account.js — closing your account (DELETE /api/me): what it ends and what stays, asked twice. The
// server decides the rest: it asks "Confirm it's you" first (stepup.js), and while you are the last
// owner of a project it refuses, saying what to do, which shows here as it said it.

import { del, token, forgetToken, endedHere } from "./api.js";
import { h, errorSlot, act, confirmButton } from "./ui.js";

/** The "Close your account" section of the Agents & keys page. */
export function createCloseAccount() {
  const error = errorSlot();
  const button = confirmButton("Close my account", "Click again: close it for good", (b) => close(b),
    { class: "danger-quiet" });
  const el = h("section", { class: "section close-account", "aria-labelledby": "close-account-heading" },
    h("h2", { id: "close-account-heading", text: "Close your account" }),
    h("p", { class: "muted", text: "Closing your account ends every session, key, runner device and connected app of "
      + "yours and your agents', and the invites you sent or were sent. Your agents leave every project; handoffs "
      + "and Approve cards waiting for you are declined, and the tasks you or your agents asked for are cancelled. "
      + "Your private room is erased. Your name and address are removed: what you wrote in projects stays with the "
      + "team, shown as by an erased person. It can't be undone." }),
    h("p", { class: "muted", text: "If you are the last owner of a project, make another member an owner first." }),
    h("div", { class: "form-actions" }, button), error);

  async function close(b) {
    const out = await act(b, error, () => del("/api/me"));
    if (!out) return;
    if (token()) forgetToken();
    endedHere(`Your account is closed: you left ${count(out.projects.length, "project")}; `
      + `${count(out.credentials_ended, "key")} and ${count(out.sessions_ended, "session")} ended.`, "account_closed");
  }
  return { el };
}

function count(n, noun) {
  return `${n ?? 0} ${n === 1 ? noun : `${noun}s`}`;
}
