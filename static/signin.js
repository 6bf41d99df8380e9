// signin.js — the signed-out screen: how to sign in with the printed link, or paste a
// personal token (kept for this tab only, in sessionStorage); with mail configured on the
// server, "email me a sign-in link".

import { get, post, useToken, forgetToken } from "./api.js";
import { h, heading, field, errorSlot, act, fill, announce } from "./ui.js";

// ---- lifecycle ---------------------------------------------------------------------

/** Show the signed-out screen in el; onSignedIn(person) runs once a pasted token works. */
export function mount(el, { onSignedIn, reason, closed = false } = {}) {
  if (closed) { // a closed account signs in nowhere: its message alone, and nothing left over to announce
    announce("");
    el.replaceChildren(h("section", { class: "signin card" }, heading(1, "Account closed"),
      h("p", { class: "notice", role: "status", text: reason })));
    el.querySelector("h1").focus();
    return () => {};
  }
  const input = h("input", { type: "password", name: "token", autocomplete: "off", spellcheck: "false",
    placeholder: "prk_pt_…", required: true });
  const error = errorSlot();
  const submit = h("button", { type: "submit", class: "primary", text: "Sign in with this token" });
  const form = h("form", { class: "stack", "aria-labelledby": "token-heading" },
    h("h2", { id: "token-heading", text: "Or use a personal token" }),
    h("p", { class: "muted", text: "A personal token comes from 'prickle token create --person HANDLE'. "
      + "This tab keeps it until you close it or sign out." }),
    field("Personal token", input),
    submit, error);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    submit2(input, submit, error, onSignedIn);
  });

  const mailSlot = h("div");
  el.replaceChildren(h("section", { class: "signin card" },
    heading(1, "Sign in to Prickle"),
    reason ? h("p", { class: "notice", role: "status", text: reason }) : null,
    h("p", { text: "Open the one-time sign-in link that was printed for you. It looks like:" }),
    h("pre", { class: "code", text: `${window.location.origin}/signin?token=prk_sl_…` }),
    h("p", { text: "Whoever runs the server can print a new one:" }),
    h("pre", { class: "code", text: "prickle signin-link YOUR-HANDLE" }),
    h("p", { class: "muted", text: "The link works once; after it, this browser stays signed in." }),
    mailSlot,
    form));
  el.querySelector("h1").focus();
  offerMail(mailSlot);
  return () => {};
}

/** "Email me a sign-in link", when the server sends mail. The answer never says whether the address is known. */
async function offerMail(slot) {
  let options;
  try {
    options = await get("/api/signin/options", { quietAuth: true });
  } catch {
    return;
  }
  if (!options.email_link) return;
  const input = h("input", { type: "email", name: "email", autocomplete: "email", required: true, maxlength: 254 });
  const error = errorSlot();
  const done = h("p", { class: "notice ok", role: "status", hidden: true });
  const submit = h("button", { type: "submit", class: "primary", text: "Email me a sign-in link" });
  const form = h("form", { class: "stack", "aria-labelledby": "mail-heading" },
    h("h2", { id: "mail-heading", text: "Or get a sign-in link by email" }),
    field("Your email address", input), submit, error, done);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const out = await act(submit, error, () => post("/api/signin/email", { email: input.value.trim() }, { quietAuth: true }));
    if (out) {
      done.textContent = out.sent[0].toUpperCase() + out.sent.slice(1) + ".";
      done.hidden = false;
    }
  });
  fill(slot, form);
}

// ---- actions ------------------------------------------------------------------------

async function submit2(input, button, error, onSignedIn) {
  const value = input.value.trim();
  await act(button, error, async () => {
    if (!value.startsWith("prk_pt_")) {
      throw new Error("That is not a personal token: it starts with prk_pt_. A sign-in link is opened, not pasted.");
    }
    useToken(value);
    try {
      const { person } = await get("/api/me", { quietAuth: true });
      input.value = "";
      onSignedIn?.(person);
    } catch (err) {
      forgetToken();
      if (err.status === 401) throw new Error("That token was not accepted: it may be revoked or mistyped.");
      throw err;
    }
  });
}
