// push.js — told when away: the page's service worker (/sw.js, registered at boot) and this
// browser's Web Push subscription. pushControl() is the inbox's "Notify me on this device": it asks
// the browser for a push subscription made with the server's key (GET /api/push/key) and gives it to
// the server (POST /api/push/subscriptions), which then sends each new inbox item to this browser
// even with the page closed; "Stop notifying this device" ends it in the browser and on the server.
// The notifications themselves are the service worker's; a click on one opens its item here.

import { get, post } from "./api.js";
import { h, errorSlot, act, announce } from "./ui.js";

let registration = Promise.resolve(null);

/** Register the service worker (where the browser has them and the page is on HTTPS or localhost). */
export function registerWorker() {
  if (!("serviceWorker" in navigator) || !window.isSecureContext) return registration;
  registration = navigator.serviceWorker.register("/sw.js", { scope: "/" }).catch((err) => {
    console.warn("service worker not registered", err.message);
    return null;
  });
  navigator.serviceWorker.addEventListener("message", (event) => {
    if (event.data?.type === "open" && typeof event.data.url === "string") openHere(event.data.url);
  });
  navigator.serviceWorker.startMessages();
  return registration;
}

/** The button that turns push notifications on or off for this browser, with a line saying which. */
export function pushControl() {
  const button = h("button", { type: "button", class: "small push-toggle", hidden: true });
  const note = h("p", { class: "muted small push-note", role: "status" });
  const error = errorSlot();
  const el = h("div", { class: "push-control" }, button, note, error);
  if (!("PushManager" in window) || !("serviceWorker" in navigator) || !window.isSecureContext) {
    note.textContent = window.isSecureContext ? "This browser can't receive push notifications."
      : "Push notifications need this page on HTTPS (or on localhost).";
    return el;
  }
  let mine = null; // this browser's subscription, while the server has it
  const draw = () => {
    button.hidden = false;
    button.textContent = mine ? "Stop notifying this device" : "Notify me on this device";
    note.textContent = mine ? "This device is told of new items, even with Prickle closed."
      : Notification.permission === "denied" ? "Notifications are blocked for this site in your browser's settings."
        : "Get each new item on this device, even with Prickle closed.";
  };
  button.addEventListener("click", async () => {
    const out = await act(button, error, () => (mine ? turnOff(mine) : turnOn()));
    if (out === undefined) return;
    mine = out;
    announce(mine ? "This device will be notified of new items" : "This device will not be notified");
    draw();
  });
  current().then((sub) => {
    mine = sub;
    draw();
  }, (err) => {
    note.textContent = "Push notifications are not available here.";
    console.warn("push state unknown", err.message);
  });
  return el;
}

/** Stop this browser's notifications (on signing out), on the server and in the browser. */
export async function forgetDevice() {
  try {
    const sub = await (await registration)?.pushManager.getSubscription();
    if (sub) await turnOff(sub);
  } catch (err) {
    console.warn("push subscription not ended", err.message);
  }
}

// ---- internal ----------------------------------------------------------------------------------------

/** This browser's subscription if the server has it (and it was made with the server's key), else null. */
async function current() {
  const reg = await registration;
  if (!reg) throw new Error("no service worker");
  const sub = await reg.pushManager.getSubscription();
  if (!sub) return null;
  const [{ public_key: key }, { subscriptions }] = await Promise.all([get("/api/push/key"), get("/api/push/subscriptions")]);
  const made = sub.options?.applicationServerKey;
  if (made && b64url(made) !== key) { // made for another server's key: of no use now
    await sub.unsubscribe();
    return null;
  }
  return subscriptions.some((s) => s.endpoint === sub.endpoint) ? sub : null;
}

async function turnOn() {
  const reg = await registration;
  const answer = await Notification.requestPermission();
  if (answer !== "granted") throw new Error("The browser did not allow notifications for this site.");
  const { public_key: key } = await get("/api/push/key");
  const sub = await reg.pushManager.subscribe({ userVisibleOnly: true, applicationServerKey: bytes(key) });
  await post("/api/push/subscriptions", sub.toJSON());
  return sub;
}

async function turnOff(sub) {
  await post("/api/push/unsubscribe", { endpoint: sub.endpoint });
  await sub.unsubscribe();
  return null;
}

/** Go to url (a place on this page) in this tab: a new hash moves the page without loading it again. */
function openHere(url) {
  const target = new URL(url, window.location.origin);
  if (target.origin !== window.location.origin) return;
  window.focus();
  if (target.pathname === window.location.pathname) window.location.hash = target.hash;
  else window.location.assign(target.href);
}

function bytes(text) {
  const raw = atob(text.replace(/-/g, "+").replace(/_/g, "/") + "=".repeat((4 - (text.length % 4)) % 4));
  return Uint8Array.from(raw, (c) => c.charCodeAt(0));
}

function b64url(buffer) {
  return btoa(String.fromCharCode(...new Uint8Array(buffer))).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}
