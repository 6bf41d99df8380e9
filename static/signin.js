// signin.js — the signed-out screen: how to sign in with the printed link, or paste a
// personal token (kept for this tab only, in sessionStorage).

import { get, useToken, forgetToken } from "./api.js";
import { h, heading, field, errorSlot, act } from "./ui.js";

// ---- lifecycle ---------------------------------------------------------------------

/** Show the signed-out screen in el; onSignedIn(person) runs once a pasted token works. */
export function mount(el, { onSignedIn, reason } = {}) {
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

  el.replaceChildren(h("section", { class: "signin card" },
    heading(1, "Sign in to Prickle"),
    reason ? h("p", { class: "notice", role: "status", text: reason }) : null,
    h("p", { text: "Open the one-time sign-in link that was printed for you. It looks like:" }),
    h("pre", { class: "code", text: `${window.location.origin}/signin?token=prk_sl_…` }),
    h("p", { text: "Whoever runs the server can print a new one:" }),
    h("pre", { class: "code", text: "prickle signin-link YOUR-HANDLE" }),
    h("p", { class: "muted", text: "The link works once; after it, this browser stays signed in." }),
    form));
  el.querySelector("h1").focus();
  return () => {};
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
