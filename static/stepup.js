// stepup.js — "Confirm it's you": the dialog the page shows when the server refuses an act until
// the person confirms it's them (step_up_required), and the passkeys they keep (on the Rules page).
// The server decides which acts need it and whether a confirmation holds; the page only asks.

import { get, post, del, seg, ApiError } from "./api.js";
import { h, uid, errorSlot, act, announce, fill, field, timeEl, confirmButton, modal } from "./ui.js";

// ---- passkeys: the browser's WebAuthn calls, with the server's JSON options -----------------------

function bytes(text) {
  const b64 = text.replace(/-/g, "+").replace(/_/g, "/");
  return Uint8Array.from(atob(b64 + "=".repeat((4 - (b64.length % 4)) % 4)), (c) => c.charCodeAt(0));
}

function text(buffer) {
  return btoa(String.fromCharCode(...new Uint8Array(buffer))).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

const withIds = (list) => (list || []).map((c) => ({ ...c, id: bytes(c.id) }));

/** The browser's answer as the JSON the server reads (PublicKeyCredential.toJSON, written out). */
function credentialJSON(cred) {
  const r = cred.response;
  const response = { clientDataJSON: text(r.clientDataJSON) };
  if (r.attestationObject) {
    response.attestationObject = text(r.attestationObject);
    response.transports = r.getTransports ? r.getTransports() : [];
  } else {
    response.authenticatorData = text(r.authenticatorData);
    response.signature = text(r.signature);
    if (r.userHandle) response.userHandle = text(r.userHandle);
  }
  return { id: cred.id, rawId: text(cred.rawId), type: cred.type, response,
    authenticatorAttachment: cred.authenticatorAttachment || undefined,
    clientExtensionResults: cred.getClientExtensionResults ? cred.getClientExtensionResults() : {} };
}

function passkeyError(err) {
  if (err instanceof ApiError) return err;
  // the browser's own refusal: the person cancelled, or no authenticator answered in time
  return new Error(err && err.name === "NotAllowedError"
    ? "The passkey was not used (cancelled or timed out). Try again."
    : `This browser could not use a passkey: ${err && err.message ? err.message : err}`);
}

/** Register a passkey on this device (label: its name in your list). Registering confirms it's you. */
export async function addPasskey(label, options = {}) {
  try {
    const { publicKey } = await post("/api/me/passkeys/options", { purpose: "register" }, options);
    const cred = await navigator.credentials.create({ publicKey: {
      ...publicKey, challenge: bytes(publicKey.challenge), user: { ...publicKey.user, id: bytes(publicKey.user.id) },
      excludeCredentials: withIds(publicKey.excludeCredentials) } });
    return await post("/api/me/passkeys", { credential: credentialJSON(cred), ...(label ? { label } : {}) }, options);
  } catch (err) {
    throw passkeyError(err);
  }
}

/** Confirm it's you with one of your passkeys. */
export async function confirmWithPasskey() {
  try {
    const { publicKey } = await post("/api/me/passkeys/options", { purpose: "confirm" }, { stepUp: false });
    const cred = await navigator.credentials.get({ publicKey: {
      ...publicKey, challenge: bytes(publicKey.challenge), allowCredentials: withIds(publicKey.allowCredentials) } });
    return await post("/api/me/step-up/passkey", { credential: credentialJSON(cred) }, { stepUp: false });
  } catch (err) {
    throw passkeyError(err);
  }
}

// ---- the dialog ------------------------------------------------------------------------------------

/** Ask the person to confirm it's them; resolves true once the server says they did, false if they
 *  close it (or chose the emailed link, which confirms the browser it is opened in). */
export async function ask(refusal) {
  let status;
  try {
    status = await get("/api/me/step-up");
  } catch {
    return false;
  }
  const { mail } = await get("/api/me").catch(() => ({ mail: false }));
  const titleId = uid("stepup-title");
  const error = errorSlot();
  const note = h("p", { class: "stepup-note", role: "status" });
  const buttons = [];
  const dialog = h("dialog", { class: "stepup-dialog", "aria-labelledby": titleId },
    h("h2", { id: titleId, text: "Confirm it's you" }),
    h("p", { class: "stepup-why", text: refusal.message }));
  const cancel = h("button", { type: "button", text: "Cancel" });
  return modal(dialog, { cancel, focus: () => buttons[0] || cancel }, (close) => {
    const button = (label, cls, run) => {
      const b = h("button", { type: "button", class: cls, text: label });
      b.addEventListener("click", () => act(b, error, run));
      buttons.push(b);
      return b;
    };
    if (status.passkeys) {
      button("Use my passkey", "primary", async () => {
        await confirmWithPasskey();
        announce("Confirmed");
        close(true);
      });
    } else if (!status.email_link || !mail) {
      dialog.append(h("p", { text: "You have no passkey yet. Add one now: this device keeps it, and it confirms it's you "
        + "from then on." }));
      button("Add a passkey and continue", "primary", async () => {
        await addPasskey("Passkey", { stepUp: false });
        announce("Passkey added");
        close(true);
      });
    }
    if (status.email_link && mail) {
      button("Email me a sign-in link", status.passkeys ? "" : "primary", async () => {
        const out = await post("/api/me/step-up/email", {}, { stepUp: false });
        note.textContent = `${out.sent[0].toUpperCase()}${out.sent.slice(1)}.`;
      });
    }
    dialog.append(h("div", { class: "button-row" }, buttons, cancel), note, error);
  });
}

// ---- settings: your passkeys and the cost that needs confirming -----------------------------------------

/** The Rules page's "Confirming it's you" section. */
export function settings() {
  let mail = false;
  const list = h("div", { class: "passkey-list" });
  const error = errorSlot();
  const reload = async () => {
    ({ mail } = await get("/api/me").catch(() => ({ mail: false })));
    const out = await get("/api/me/passkeys");
    fill(list, out.passkeys.length
      ? h("ul", { class: "plain-list passkeys" }, out.passkeys.map((k) => h("li", { class: "passkey" },
        h("span", { class: "passkey-label", text: k.label }),
        h("span", { class: "muted small" }, "added ", timeEl(k.created_at, true),
          k.last_used_at ? h("span", {}, ", last used ", timeEl(k.last_used_at, true)) : null),
        confirmButton("Remove", "Click again to remove", (b) => act(b, error, async () => {
          await del(`/api/me/passkeys/${seg(k.id)}`);
          announce(`Passkey ${k.label} removed`);
          await reload();
        }), { class: "danger-quiet small", "aria-label": `Remove passkey ${k.label}` }))))
      : h("p", { class: "muted", text: mail
        ? "No passkey yet: add one here, or confirm with a sign-in link mailed to your address."
        : "No passkey yet: add one here." }));
  };
  const label = h("input", { name: "label", maxlength: "60", autocomplete: "off", placeholder: "e.g. Laptop" });
  const add = h("button", { type: "submit", class: "primary", text: "Add a passkey" });
  const form = h("form", { class: "row-form add-passkey" }, field("Name for this passkey", label), add);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    act(add, error, async () => {
      const out = await addPasskey(label.value.trim());
      label.value = "";
      announce(`Passkey ${out.passkey.label} added`);
      await reload();
    });
  });
  reload().catch((err) => { error.textContent = err.message; error.hidden = false; });
  return h("section", { class: "section card", "aria-labelledby": "stepup-heading" },
    h("h2", { id: "stepup-heading", text: "Confirming it's you" }),
    h("p", { text: "Starting a run, connecting a computer, approving a costly action and sharing more ask you to "
      + "confirm it's you: with a passkey, or a sign-in link mailed to you when this server sends mail. It then "
      + "holds a few minutes in this browser." }),
    list, form, costForm(), error);
}

function costForm() {
  const amount = h("input", { type: "number", min: "0", step: "0.01", name: "amount", inputmode: "decimal" });
  const save = h("button", { type: "submit", class: "small", text: "Save" });
  const error = errorSlot();
  const form = h("form", { class: "row-form step-up-cost" },
    field("Confirm before approving an action that costs more than", amount), save);
  get("/api/me/step-up").then((out) => { amount.value = out.step_up_above_cost ?? ""; }).catch(() => {});
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    act(save, error, async () => {
      const out = await post("/api/me/step-up-cost", { amount: amount.value === "" ? null : Number(amount.value) });
      announce(out.step_up_above_cost == null ? "Approving actions no longer asks" : `Saved: above ${out.step_up_above_cost}`);
    });
  });
  return h("div", { class: "step-up-cost-box" }, form,
    h("p", { class: "hint", text: "In the currency your agents estimate in; empty: never ask. An action with no "
      + "estimate asks too, and raising the cost asks you to confirm it's you." }), error);
}
