"""Told when away, in Chromium: the page installs (manifest, icons), registers its service worker,
and the inbox offers push notifications for this device; a push the worker gets shows a
notification whose click opens the item itself, and so does the open page's own notification.

Headless Chromium has no push service to subscribe to, so the subscription itself is tested against
the stand-in in test_push.py; here the worker is handed a push message directly (DevTools' ServiceWorker
domain), as the browser hands it one from its push service.
"""

from __future__ import annotations

import json
import time

from browser import PROJECT, expect, goto, mcp, shot
from playwright.sync_api import Page


def worker_ready(page: Page) -> dict:
    return page.evaluate("""async () => {
        const reg = await navigator.serviceWorker.ready;
        return {scope: reg.scope, script: reg.active.scriptURL};
    }""")


def test_the_page_installs_its_worker_registers_and_the_inbox_offers_push_for_this_device(served, people):
    base = served.info["url"]
    page = people("ren")
    assert worker_ready(page) == {"scope": f"{base}/", "script": f"{base}/sw.js"}
    manifest = page.evaluate("""async () => {
        const r = await fetch(document.querySelector('link[rel=manifest]').href);
        return {type: r.headers.get('content-type'), body: await r.json()};
    }""")
    assert manifest["type"] == "application/manifest+json"
    assert [(i["src"], i["sizes"], i["purpose"]) for i in manifest["body"]["icons"]] == [
        ("/icon-192.png", "192x192", "any"), ("/icon-512.png", "512x512", "any"),
        ("/icon-maskable-512.png", "512x512", "maskable")]
    sizes = page.evaluate("""async () => Promise.all(['/icon-192.png', '/icon-512.png'].map(async (src) => {
        const img = new Image(); img.src = src; await img.decode(); return [img.naturalWidth, img.naturalHeight];
    }))""")
    assert sizes == [[192, 192], [512, 512]]

    goto(page, served, "#/inbox")
    control = page.locator(".push-control")
    expect(control.get_by_role("button", name="Notify me on this device")).to_be_visible()
    expect(control.locator(".push-note")).to_have_text("Get each new item on this device, even with Prickle closed.")
    shot(page, "push_inbox_control", full_page=False)
    phone = people("ren", viewport={"width": 390, "height": 800})
    goto(phone, served, "#/inbox")
    button = phone.locator(".push-control").get_by_role("button", name="Notify me on this device")
    expect(button).to_be_visible()
    box = button.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= 390
    shot(phone, "push_inbox_control_phone", full_page=False)


def test_a_push_shows_a_notification_and_its_click_opens_the_item_in_the_open_tab(served, people):
    base = served.info["url"]
    page = people("ren")
    page.context.grant_permissions(["notifications"], origin=base)
    worker_ready(page)
    held = mcp(served, "oj/muse", "handoff", {"project": PROJECT, "to": "ren/builder", "packet": {
        "task": "Build the pricing page.", "deliverable_type": "doc", "acceptance_criteria": ["Three plans."]}})
    url = f"/#/p/{PROJECT}/tasks/{held['task']['id']}"

    # The browser hands the worker a push message from its push service.
    cdp = page.context.new_cdp_session(page)
    registrations: list[str] = []
    cdp.on("ServiceWorker.workerRegistrationUpdated",
           lambda e: registrations.extend(r["registrationId"] for r in e["registrations"] if r["scopeURL"] == f"{base}/"))
    cdp.send("ServiceWorker.enable")
    deadline = time.monotonic() + 10
    while not registrations:  # the events come while Playwright talks to the page
        assert time.monotonic() < deadline, "the worker's registration was not reported"
        page.evaluate("0")
    message = {"title": "Handoff to approve · Website v2", "body": "Build the pricing page.", "tag": f"approval:{held['gate']['approval_id']}",
               "data": {"url": url}}
    # A push the browser hands a worker that is starting can be lost under load (nothing in the page
    # sees it), as a push service's can; a push service sends again, and so does this test: the same
    # tag, so a second delivery replaces the first notification rather than adding one.
    shown = None
    for _ in range(3):
        cdp.send("ServiceWorker.deliverPushMessage", {"origin": base, "registrationId": registrations[0],
                                                       "data": json.dumps(message)})
        shown = page.evaluate("""async () => {  // waits (up to 10 s, on a busy machine) for the worker to show it
            const reg = await navigator.serviceWorker.ready;
            for (let tries = 0; tries < 200; tries++) {
                const list = await reg.getNotifications();
                if (list.length) return list.map((n) => ({title: n.title, body: n.body, tag: n.tag, data: n.data}));
                await new Promise((resolve) => setTimeout(resolve, 50));
            }
            return null;
        }""")
        if shown is not None:
            break
    assert shown == [message]

    # Its click (the worker's notificationclick) brings this tab forward at the item, with no reload.
    goto(page, served, "#/inbox")
    page.evaluate("window.__sameDocument = true")
    [worker] = [w for w in page.context.service_workers if w.url == f"{base}/sw.js"]
    worker.evaluate(f"openAt({json.dumps(url)})")
    expect(page).to_have_url(f"{base}{url}")
    expect(page.get_by_role("heading", level=1, name="Build the pricing page.")).to_be_visible()
    assert page.evaluate("window.__sameDocument") is True


def test_the_open_pages_own_notification_opens_the_item_not_the_inbox(served, people):
    page = people("ren")
    hrefs = page.evaluate("""async () => {
        const { itemHref } = await import('/static/inbox_store.js');
        const item = (kind, task_id, message_id) => ({kind, project: 'website-v2', task_id, message_id});
        return [item('mention', null, 'm_1'), item('mention', 't_1', 'm_2'), item('approval', 't_1', null),
                item('paused_pair', null, null), item('action', null, 'm_3')].map(itemHref);
    }""")
    assert hrefs == ["#/p/website-v2/room/m_1", "#/p/website-v2/tasks/t_1/m_2", "#/p/website-v2/tasks/t_1",
                     "#/p/website-v2/room", "#/p/website-v2/room/m_3"]
