// sw.js — the page's service worker, served at /sw.js so its scope is the whole page. It shows the
// Web Push messages the server sends for new inbox items ({title, body, tag, data: {url}}, tagged with
// the item's ID, so the open page's own notification of the same item is replaced, not doubled), and a
// click on one opens the item itself: in an open tab of the page, brought to the front, or a new window.

self.addEventListener("install", () => self.skipWaiting());
self.addEventListener("activate", (event) => event.waitUntil(self.clients.claim()));

self.addEventListener("push", (event) => {
  let message = {};
  try {
    message = event.data ? event.data.json() : {};
  } catch {
    message = { body: event.data ? event.data.text() : "" };
  }
  const url = typeof message.data?.url === "string" ? message.data.url : "/#/inbox";
  event.waitUntil(self.registration.showNotification(message.title || "Prickle", {
    body: message.body || "", tag: message.tag || undefined, data: { url }, icon: "/icon-192.png",
  }));
});

self.addEventListener("notificationclick", (event) => {
  event.notification.close();
  event.waitUntil(openAt(event.notification.data?.url || "/#/inbox"));
});

/** Show url (a place on this page) in a tab of the page, or in a new window when none is open. */
async function openAt(url) {
  const target = new URL(url, self.location.origin);
  if (target.origin !== self.location.origin) return null; // only ever a place on this page
  const tabs = await self.clients.matchAll({ type: "window", includeUncontrolled: true });
  const tab = tabs.find((c) => new URL(c.url).origin === self.location.origin);
  if (!tab) return self.clients.openWindow(target.href);
  tab.postMessage({ type: "open", url: target.href }); // the page moves there without loading again
  try {
    await tab.focus();
  } catch {
    // a browser lets a worker focus a tab only while it handles the click
  }
  return tab;
}
