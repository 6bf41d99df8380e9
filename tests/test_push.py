"""Web Push: a person's browsers are told of each new inbox item, once, at the item's own place.

The push path runs end to end against tests/push_service.py, a stand-in for a browser and its
push service over HTTPS that checks the server's VAPID signature and decrypts each message with the
browser's keys (``http_ece``), as a browser would: a real ``prickle serve``, browsers subscribed
over the API, items caused by agents over MCP, a restart, and a push service that answers 410 or 500.
"""

from __future__ import annotations

import datetime as dt
import time

import httpx
import pytest

import prickle
from conftest import MCP, PROJECT, Served, World
from helpers import T0, handoff, person, post
from push_service import PushService

CHROME = ("Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 "
          "Safari/537.36")


def until(check, timeout=20.0):
    """Wait for ``check()`` to be true (a state the server reaches by itself); return its value."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, "the state was not reached"
        time.sleep(0.05)
    return value


@pytest.fixture
def service(tmp_path):
    s = PushService(str(tmp_path))
    yield s
    s.close()
    assert s.refused == [], "the push service refused a message the server sent"


class serve(Served):
    """``prickle serve`` trusting the stand-in's certificate, with an HTTP client for its API and /mcp."""

    def __init__(self, db_path, service):
        super().__init__(db_path, env={"REQUESTS_CA_BUNDLE": service.cert_path})
        self.http = httpx.Client(base_url=self.info["url"], timeout=30)

    def stop(self, kill=False):
        self.http.close()
        super().stop(kill)


def subscribe(http, world, handle, browser, **extra):
    r = http.post("/api/push/subscriptions", json=browser.subscription() | extra.pop("body", {}),
                  headers={"Authorization": f"Bearer {world.tokens[handle]}"} | extra)
    assert r.status_code == 200, r.text
    return r.json()["subscription"]


def mine(http, world, handle):
    r = http.get("/api/push/subscriptions", headers={"Authorization": f"Bearer {world.tokens[handle]}"})
    assert r.status_code == 200, r.text
    return r.json()["subscriptions"]


def mention(message):
    return {"title": "Mention · Website v2", "body": f"Muse: {message['body']}", "tag": f"mention:{message['id']}",
            "data": {"url": f"/#/p/{PROJECT}/room/{message['id']}"}}


def test_each_new_item_reaches_every_browser_of_the_person_once_even_across_a_restart(db_path, service):
    world = World(db_path)
    with serve(db_path, service) as served:
        http, mcp = served.http, MCP(served.http, world.keys)
        service.server_key = http.get("/api/push/key", headers={"Authorization": f"Bearer {world.tokens['ren']}"}) \
            .json()["public_key"]
        assert prickle.push_public_key(world.db) == service.server_key  # made once, kept in the database
        post(mcp, "oj/muse", "@ren an old question")  # waits on ren before any browser is subscribed
        phone, laptop = service.browser("phone"), service.browser("laptop")
        subscribe(http, world, "ren", phone, body={"label": "Firefox on Android"})
        subscribe(http, world, "ren", laptop, **{"User-Agent": CHROME})
        assert sorted((s["label"], s["service"]) for s in mine(http, world, "ren")) == [
            ("Chrome on Linux", service.origin), ("Firefox on Android", service.origin)]

        # An agent mentions ren over MCP: both browsers are told, in plain words, with the message's place.
        first = post(mcp, "oj/muse", "**Pricing** copy is ready, @ren: see `docs/pricing.md`")
        for browser in (phone, laptop):
            got = browser.next()
            assert got["message"] == mention(first) | {"body": "Muse: Pricing copy is ready, @ren: see docs/pricing.md"}
            assert (got["claims"]["sub"], got["ttl"], got["urgency"]) == ("mailto:prickle@localhost", 86400, "normal")

        # A handoff that waits at ren's gate: its place is the task's page.
        out = handoff(mcp)
        summary = prickle.inbox(world.db, world.person("ren"))["items"][0]["title"]
        for browser in (phone, laptop):
            assert browser.next()["message"] == {
                "title": "Handoff to approve · Website v2", "body": summary,
                "tag": f"approval:{out['gate']['approval_id']}", "data": {"url": f"/#/p/{PROJECT}/tasks/{out['task']['id']}"}}
        assert phone.nothing_more() and laptop.nothing_more()
        # Each browser's answer is recorded as it comes (a server killed between the two sends it again).
        until(lambda: world.db.scalar("SELECT count(*) FROM push_sent WHERE item = ?",
                                      (f"approval:{out['gate']['approval_id']}",)) == 2)

    # While the server is down another mention comes: it is sent once the server is back, and nothing
    # sent before is sent again.
    while_down = prickle.post_message(world.db, world.actor("oj/muse"), PROJECT, "@ren while it was down")
    with serve(db_path, service) as served:
        for browser in (phone, laptop):
            assert browser.next()["message"] == mention(while_down)
        after = post(MCP(served.http, world.keys), "oj/muse", "@ren and after")
        for browser in (phone, laptop):
            assert browser.next()["message"] == mention(after)  # passes run one after another: no resend came first
        assert phone.nothing_more() and laptop.nothing_more()

        # This browser turns itself off: only the other one is told from now on.
        r = served.http.post("/api/push/unsubscribe", json={"endpoint": phone.endpoint},
                             headers={"Authorization": f"Bearer {world.tokens['ren']}"})
        assert r.json() == {"removed": True}
        last = post(MCP(served.http, world.keys), "oj/muse", "@ren one more")
        assert laptop.next()["message"] == mention(last)
        again = post(MCP(served.http, world.keys), "oj/muse", "@ren and the last")
        assert laptop.next()["message"] == mention(again)
        assert phone.nothing_more()
        assert [s["label"] for s in mine(served.http, world, "ren")] == ["Chrome on Linux"]
        # Someone else's items never reach ren's browsers.
        assert prickle.inbox(world.db, world.person("oj"))["count"] == 0
        post(MCP(served.http, world.keys), "ren/builder", "@oj a question for you")
        final = post(MCP(served.http, world.keys), "oj/muse", "@ren really the last")
        assert laptop.next()["message"] == mention(final) and laptop.nothing_more()
    world.db.close()


def test_a_browser_its_push_service_forgot_is_dropped_and_one_failing_waits_without_leaking(db_path, service):
    world = World(db_path)
    served = serve(db_path, service)
    try:
        http, mcp = served.http, MCP(served.http, world.keys)
        service.server_key = prickle.push_public_key(world.db)
        gone, down = service.browser("gone"), service.browser("down")
        subscribe(http, world, "ren", gone)
        subscribe(http, world, "oj", down)
        gone.status, down.status = 410, 500
        message = post(mcp, "ren/builder", "@oj @ren both of you")
        assert gone.next()["status"] == 410 and down.next()["status"] == 500
        # 410: the browser unsubscribed; its subscription is dropped.
        until(lambda: mine(http, world, "ren") == [])
        # 500: kept, and tried again after a wait; the item is not counted as told.
        [sub] = until(lambda: [s for s in mine(http, world, "oj") if s["failures"] == 1])
        assert sub["last_error"] == f"the push service {service.origin} refused the message (500)"
        assert world.db.scalar("SELECT count(*) FROM push_sent WHERE subscription = ? AND item = ?",
                               (sub["id"], f"mention:{message['id']}")) == 0
    finally:
        served.proc.terminate()
        served.proc.wait(15)
        log = served.proc.stderr.read()
        served.stop()
    assert f"the push service {service.origin} refused the message (500)" in log
    private = world.db.scalar("SELECT value FROM meta WHERE key = 'vapid_private_key'")
    assert private not in log and gone.token not in log and down.token not in log
    world.db.close()


def test_bad_subscriptions_are_refused_naming_the_field_and_nothing_is_kept(server, world, tmp_path):
    service = PushService(str(tmp_path))
    try:
        good = service.browser("good").subscription()
    finally:
        service.close()
    ren = person(server, world, "ren")
    bad = [
        ({}, "endpoint must be the https address of the browser's push service"),
        (good | {"endpoint": "http://push.example/abc"}, "endpoint must be the https address"),
        (good | {"endpoint": "https://push.example/a b"}, "endpoint must be the https address"),
        (good | {"endpoint": "https://push.example/" + "a" * 2048}, "endpoint must be the https address"),
        (good | {"keys": "p256dh"}, "keys must be an object {p256dh, auth}"),
        (good | {"keys": {"auth": good["keys"]["auth"]}}, "keys.p256dh must be the browser's P-256 public key"),
        (good | {"keys": {"p256dh": "BAAA", "auth": good["keys"]["auth"]}}, "keys.p256dh must be"),
        (good | {"keys": {"p256dh": good["keys"]["p256dh"], "auth": "c2hvcnQ"}}, "keys.auth must be the browser's 16-byte"),
        (good | {"keys": {"p256dh": good["keys"]["p256dh"]}}, "keys.auth must be"),
        (good | {"label": "two\nlines"}, "label: write it on one line"),
        (good | {"colour": "red"}, "unknown field colour"),
    ]
    for body, message in bad:
        r = ren.post("/api/push/subscriptions", body)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["message"].startswith(message), (body, r.json())
    r = ren.post("/api/push/unsubscribe", {})
    assert (r.status_code, r.json()["error"]["message"]) == (400, "endpoint is required")
    r = ren.delete("/api/push/subscriptions/not an id")
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("subscription_id must be an id")
    assert server.post("/api/push/subscriptions", json=good).status_code == 401
    assert world.db.scalar("SELECT count(*) FROM push_subscriptions") == 0
    # The good one is kept; subscribing it again is the same browser; removing it by ID ends it.
    first = ren.post("/api/push/subscriptions", good).json()["subscription"]
    assert ren.post("/api/push/subscriptions", good).json()["subscription"]["id"] == first["id"]
    assert ren.delete(f"/api/push/subscriptions/{first['id']}").json() == {"removed": True}
    assert ren.delete(f"/api/push/subscriptions/{first['id']}").json() == {"removed": False}
    assert ren.get("/api/push/subscriptions").json() == {"subscriptions": []}


def subscribed(world, handle, tmp_path):
    service = PushService(str(tmp_path))
    service.close()
    return prickle.subscribe_push(world.db, world.person(handle), service.browser(handle).subscription())["subscription"]


def test_a_burst_of_new_items_is_told_as_a_few_and_a_failing_browser_waits_longer_each_time(world, clock, tmp_path):
    db = world.db
    sub = subscribed(world, "ren", tmp_path)
    assert prickle.pushes_due(db) == []  # nothing new since it subscribed
    messages = []
    for n in range(6):
        clock.now = T0 + dt.timedelta(seconds=n)
        messages.append(prickle.post_message(db, world.actor("oj/muse"), PROJECT, f"@ren number {n}"))
    due = prickle.pushes_due(db)
    assert [d["message"]["body"] for d in due[:3]] == ["Muse: @ren number 5", "Muse: @ren number 4",
                                                       "Muse: @ren number 3"]
    assert due[3]["message"] == {"title": "3 more waiting for you", "body": "Open your inbox in Prickle to see them all.",
                                 "tag": "inbox", "data": {"url": "/#/inbox"}}
    assert due[3]["items"] == [f"mention:{m['id']}" for m in reversed(messages[:3])]

    # The push service fails: the browser waits 30 s, then 60 s; one that went out resets it.
    failed = prickle.PushFailed("the push service https://push.example refused the message (503)")
    prickle.record_push(db, sub["id"], due[0]["items"], failed)
    clock.now = T0 + dt.timedelta(seconds=34)
    assert prickle.pushes_due(db) == []
    clock.now = T0 + dt.timedelta(seconds=36)
    assert len(prickle.pushes_due(db)) == 4
    prickle.record_push(db, sub["id"], due[0]["items"], failed)
    assert db.scalar("SELECT retry_at FROM push_subscriptions") == prickle.iso(clock.now + dt.timedelta(seconds=60))
    clock.now += dt.timedelta(seconds=61)
    for d in prickle.pushes_due(db):
        prickle.record_push(db, sub["id"], d["items"])
    assert db.one("SELECT failures, retry_at, last_error FROM push_subscriptions") == {
        "failures": 0, "retry_at": None, "last_error": None}
    assert prickle.pushes_due(db) == []
    # Read, the mentions leave the inbox and what was told of them is forgotten.
    prickle.mark_read(db, world.person("ren"), PROJECT, messages[-1]["id"])
    prickle.pushes_due(db)
    assert db.scalar("SELECT count(*) FROM push_sent") == 0
    # Gone: the subscription is dropped with what it was told.
    prickle.record_push(db, sub["id"], [], prickle.PushGone("gone"))
    assert db.scalar("SELECT count(*) FROM push_subscriptions") == 0


def test_what_a_notification_says_for_each_kind_of_item():
    base = {"project": PROJECT, "project_name": "Website v2", "task_id": "t_1", "message_id": None,
            "title": "Draft the **hero** copy.", "since": "2026-12-01T10:00:00.000Z"}
    cases = [
        (base | {"id": "step:s_1", "kind": "step", "step": {"agent_id": "ren/builder", "tool_name": "Bash"}},
         "Step to allow · Website v2", "ren/builder asks to run Bash: Draft the hero copy.", "/#/p/website-v2/tasks/t_1"),
        (base | {"id": "action:a_1", "kind": "action", "task_id": None, "message_id": "m_1",
                 "action_card": {"agent_id": "oj/muse", "action": "buy a domain"}},
         "Card to approve · Website v2", "oj/muse asks to buy a domain", "/#/p/website-v2/room/m_1"),
        (base | {"id": "final_acceptance:t_1", "kind": "final_acceptance"},
         "Result to accept · Website v2", "Draft the hero copy.", "/#/p/website-v2/tasks/t_1"),
        (base | {"id": "question:t_1", "kind": "question", "questions": ["Formal", "or casual?"]},
         "Question for you · Website v2", "Formal or casual? — Draft the hero copy.", "/#/p/website-v2/tasks/t_1"),
        (base | {"id": "mention:m_2", "kind": "mention", "message_id": "m_2",
                 "message": {"author": {"display_name": "Ren Ito"}, "body": "> quoted\n\n| a | b |\n|---|---|\n| 1 | 2 |"}},
         "Mention · Website v2", "Ren Ito: quoted a b 1 2", "/#/p/website-v2/tasks/t_1/m_2"),
        (base | {"id": "paused_pair:x", "kind": "paused_pair", "task_id": None, "title": "oj/muse and ren/builder are paused"},
         "Agents paused · Website v2", "oj/muse and ren/builder are paused", "/#/p/website-v2/room"),
        (base | {"id": "run_failed:a_1", "kind": "run_failed", "agent": "ren/builder"},
         "Run failed · Website v2", "ren/builder's run stopped: Draft the hero copy.", "/#/p/website-v2/tasks/t_1"),
        (base | {"id": "mention:m_3", "kind": "mention", "task_id": None, "message_id": "m_3",
                 "message": {"author": {"display_name": "Muse"}, "body": "x" * 300}},
         "Mention · Website v2", "Muse: " + "x" * 153 + "…", "/#/p/website-v2/room/m_3"),
    ]
    for item, title, body, url in cases:
        assert prickle.push_message(item) == {"title": title, "body": body, "tag": item["id"], "data": {"url": url}}


def test_the_manifest_worker_and_icons_are_served_typed_and_the_keys_stay_the_databases(server, world):
    r = server.get("/manifest.webmanifest")
    assert r.headers["content-type"] == "application/manifest+json"
    manifest = r.json()
    assert (manifest["name"], manifest["start_url"], manifest["scope"], manifest["display"]) == (
        "Prickle", "/", "/", "standalone")
    for icon in manifest["icons"]:
        png = server.get(icon["src"])
        assert png.headers["content-type"] == "image/png" and png.content.startswith(b"\x89PNG\r\n\x1a\n")
        size = int(icon["sizes"].split("x")[0])
        assert int.from_bytes(png.content[16:20], "big") == int.from_bytes(png.content[20:24], "big") == size
    sw = server.get("/sw.js")
    assert sw.headers["content-type"].startswith("text/javascript") and sw.headers["cache-control"] == "no-cache"
    assert 'addEventListener("push"' in sw.text and 'addEventListener("notificationclick"' in sw.text
    page = server.get("/").text
    assert '<link rel="manifest" href="/manifest.webmanifest">' in page
    key = person(server, world, "ren").get("/api/push/key").json()["public_key"]
    assert key == person(server, world, "oj").get("/api/push/key").json()["public_key"]
    assert len(prickle._unb64url(key)) == 65 and key == prickle.push_public_key(world.db)
    assert server.get("/api/push/key").status_code == 401
