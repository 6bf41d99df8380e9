// invite.js — the invite landing page (#/invite/SECRET): what the link invites to, then sign up
// (handle, display name) or, signed in, accept; or decline without an account. The secret rides
// in the address's fragment, so it never appears in a request line; it is sent in a POST body.

import { post } from "./api.js";
import { h, heading, field, errorSlot, act, fill, avatar, timeEl, announce } from "./ui.js";

// ---- lifecycle ----------------------------------------------------------------------

/** Show the landing page for invite secret ctx.id in el; ctx.me is the signed-in person or null.
 *  onJoined(slug) runs once the invite was accepted (a sign-up has its session cookie by then). */
export function mount(el, { me, id: secret, onJoined }) {
  const box = h("section", { class: "signin card invite", "aria-labelledby": "invite-heading" },
    h("p", { class: "muted loading", text: "Opening the invite…" }));
  fill(el, box);
  load(box, secret, me, onJoined);
  return () => {};
}

// ---- callbacks / rendering -------------------------------------------------------------

async function load(box, secret, me, onJoined) {
  let invite;
  try {
    ({ invite } = await post("/api/invite", { token: secret }, { quietAuth: true }));
  } catch (err) {
    fill(box, heading(1, "This invite can't be used", { id: "invite-heading" }),
      h("p", { class: "error", role: "alert", text: err.message }),
      h("p", { class: "muted", text: me ? "" : "If you are already on this Prickle, sign in from its front page." }),
      h("a", { href: "#/", text: me ? "Go to your projects" : "Go to the sign-in page" }));
    return;
  }
  const by = invite.invited_by;
  const done = h("div", { class: "stack" });
  fill(box,
    heading(1, `Join ${invite.project.name}`, { id: "invite-heading" }),
    h("p", { class: "invite-from" }, avatar(by.display_name, by.color),
      h("span", { class: "invite-text" }, h("strong", { text: by.display_name }), h("span", { class: "muted", text: ` @${by.handle}` }),
        ` invites you to the project “${invite.project.name}” of team ${invite.project.team}, as ${invite.role}.`)),
    h("p", { class: "muted small" }, "The link works once, until ", timeEl(invite.expires_at), "."),
    done);
  if (me) renderAccept(done, secret, me, invite, onJoined);
  else renderSignup(done, secret, invite, onJoined);
  done.append(renderDecline(box, secret, invite));
}

function renderAccept(box, secret, me, invite, onJoined) {
  const error = errorSlot();
  const accept = h("button", { type: "button", class: "primary", text: `Accept as @${me.handle}` });
  accept.addEventListener("click", async () => {
    const out = await act(accept, error, () => post("/api/invite/accept", { token: secret }));
    if (!out) return;
    if (out.invite.state === "spent") {
      fill(box, h("p", { class: "notice", role: "status",
        text: `You are already in ${invite.project.name}, so nothing changed; this invite is used up.` }),
        h("a", { href: `#/p/${encodeURIComponent(out.invite.project)}/room`, text: `Open ${invite.project.name}` }));
      return;
    }
    announce(`You joined ${invite.project.name}`);
    onJoined?.(out.invite.project);
  });
  box.append(h("p", { text: `You are signed in as ${me.display_name} (@${me.handle}).` }), accept, error);
}

function renderSignup(box, secret, invite, onJoined) {
  const handle = h("input", { name: "handle", autocomplete: "username", required: true, maxlength: 39,
    pattern: "[a-z0-9]+(-[a-z0-9]+)*", spellcheck: "false", autocapitalize: "none" });
  const name = h("input", { name: "display_name", autocomplete: "name", required: true, maxlength: 80 });
  const mail = h("input", { name: "email", type: "email", autocomplete: "email", maxlength: 254 });
  const error = errorSlot();
  const submit = h("button", { type: "submit", class: "primary", text: "Sign up and join" });
  const form = h("form", { class: "stack", "aria-labelledby": "signup-heading" },
    h("h2", { id: "signup-heading", text: "New here? Sign up" }),
    field("Handle", handle, "Lowercase letters, digits and single hyphens, like kim-park. It can't change later."),
    field("Display name", name),
    field("Email for sign-in links (optional)", mail, "Only used to mail you a sign-in link when you ask for one."),
    submit, error);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const body = { token: secret, handle: handle.value.trim(), display_name: name.value.trim() };
    if (mail.value.trim()) body.email = mail.value.trim();
    const out = await act(submit, error, () => post("/api/invite/accept", body, { quietAuth: true }));
    if (out) {
      announce(`Welcome, ${body.display_name}`);
      onJoined?.(out.invite.project);
    }
  });
  box.append(form, h("div", { class: "stack invite-signin" },
    h("h2", { text: "Already on this Prickle?" }),
    h("p", { text: "Sign in first (with your sign-in link, or on the front page), then open this invite link "
      + "again to accept it as yourself." }),
    h("a", { href: "#/", text: "Go to the sign-in page" })));
}

function renderDecline(box, secret, invite) {
  const error = errorSlot();
  const decline = h("button", { type: "button", class: "quiet", text: "Decline this invite" });
  decline.addEventListener("click", async () => {
    const out = await act(decline, error, () => post("/api/invite/decline", { token: secret }, { quietAuth: true }));
    if (out) {
      fill(box, heading(1, "Invite declined", { id: "invite-heading" }),
        h("p", { role: "status", text: `You declined the invite to ${invite.project.name}. The address it was `
          + "sent to has been forgotten, and the link no longer works." }));
    }
  });
  return h("div", { class: "invite-decline" }, decline, error);
}
