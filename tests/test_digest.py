"""The email digest: what waited on a person longer than they chose, mailed once, through a real SMTP
server (aiosmtpd) started by the test."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest
from aiosmtpd.controller import Controller

import prickle
from conftest import PROJECT
from helpers import T0, Inbox, _free_port, _settings, auth

MINUTE = dt.timedelta(minutes=1)
BASE = "http://prickle.example:8321"


def ask(world, text):
    """oj says something in general chat; returns the message."""
    return prickle.post_message(world.db, prickle.Actor("person", "", "cli", handle="oj"), PROJECT, text)


def test_what_waited_longer_than_the_chosen_minutes_is_mailed_once(world, smtp, clock):  # noqa: F811
    db = world.db
    prickle.set_person_email(db, "ren", "ren@example.org")
    assert prickle.set_digest(db, "ren", 30) == {"handle": "ren", "digest_minutes": 30, "email": "ren@example.org",
                                                 "timezone": None}
    first = ask(world, "@ren can you look at the pricing copy?")
    clock.now = T0 + 10 * MINUTE
    assert prickle.digests_due(db, BASE, clock.now) == []  # not waited long enough yet
    clock.now = T0 + 31 * MINUTE
    [due] = prickle.digests_due(db, BASE, clock.now)
    assert (due["to"], due["subject"], due["through"]) == ("ren@example.org", "Prickle: 1 waiting for you",
                                                           first["created_at"])
    assert due["text"].splitlines() == [
        "Hello Ren Ito,", "",
        "1 thing has waited for you in Prickle for more than 30 minutes:", "",
        "- A message that mentions you in Website v2: @ren can you look at the pricing copy?",
        "  waiting since today 10:00 UTC", f"  {BASE}/#/p/{PROJECT}/room/{first['id']}", "",
        f"Your inbox: {BASE}/#/inbox",
        "You get this digest because you turned it on; turn it off on the inbox screen."]

    # The server's own background piece sends it through [smtp] and records it: nothing twice.
    settings = _settings(smtp.port)
    pieces = {p.name: p for p in prickle.server_maintenance(db, None, None, settings, lambda: None).pieces}
    asyncio.run(pieces["email digest"].run())
    mail = smtp.next()
    assert mail["to"] == ["ren@example.org"] and mail["message"]["Subject"] == "Prickle: 1 waiting for you"
    assert f"{PROJECT}/room/{first['id']}" in mail["text"]
    # Its HTML part says the same, each item a link to its place.
    assert "waiting since today 10:00 UTC" in mail["html"] and f"{PROJECT}/room/{first['id']}" in mail["html"]
    assert (f'<li style="margin:0 0 14px"><strong>A message that mentions you</strong> in Website v2<br><a href="{BASE}/'
            f'#/p/{PROJECT}/room/{first["id"]}" style="color:#1f5c8f">@ren can you look at the pricing copy?</a><br>'
            '<span style="color:#5b6670">waiting since today 10:00 UTC</span></li>') in due["html"]
    assert f'<a href="{BASE}/#/inbox" style="color:#1f5c8f">Open your inbox</a>' in due["html"]
    assert prickle.digests_due(db, BASE, clock.now + 60 * MINUTE) == []

    # Something new waits: the next digest tells of it alone; reading the mention takes it out of the inbox.
    clock.now = T0 + 40 * MINUTE
    second = ask(world, "@ren and the footer too, please")
    [due] = prickle.digests_due(db, BASE, T0 + 71 * MINUTE)
    assert due["subject"] == "Prickle: 1 waiting for you" and second["id"] in due["text"]
    assert first["id"] not in due["text"]

    # Off: nothing is mailed, however long things wait.
    prickle.set_digest(db, "ren", None)
    assert prickle.digests_due(db, BASE, T0 + 600 * MINUTE) == []


def test_no_address_or_no_digest_means_no_mail_and_bad_minutes_change_nothing(world, clock):  # noqa: F811
    db = world.db
    prickle.set_digest(db, "ren", 5)  # on, but ren has no address yet
    ask(world, "@ren hello")
    assert prickle.digests_due(db, BASE, T0 + 60 * MINUTE) == []
    prickle.set_person_email(db, "oj", "oj@example.org")  # oj has an address but the digest is off
    assert prickle.digests_due(db, BASE, T0 + 60 * MINUTE) == []
    for bad in (0, -1, prickle.DIGEST_MINUTES_MAX + 1, "30", 1.5, True):
        with pytest.raises(prickle.InvalidInput, match="minutes must be a whole number from 1 to 10080"):
            prickle.set_digest(db, "ren", bad)
    assert db.scalar("SELECT digest_minutes FROM people WHERE handle = 'ren'") == 5
    with pytest.raises(prickle.NotFound):
        prickle.set_digest(db, "nobody", 5)


def test_the_page_sets_the_digest_and_is_told_whether_mail_goes_out(server, world):
    h = auth(world, "ren")
    r = server.post("/api/me/digest", json={"minutes": 45, "timezone": "Asia/Tokyo"}, headers=h)
    assert r.status_code == 200 and r.json() == {"handle": "ren", "digest_minutes": 45, "email": None, "mail": False,
                                                 "timezone": "Asia/Tokyo"}
    me = server.get("/api/me", headers=h).json()
    assert (me["digest_minutes"], me["email"], me["mail"]) == (45, None, False)
    r = server.post("/api/me/digest", json={"minutes": "soon"}, headers=h)
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("minutes must be a whole number")
    for zone in ("Mars/Olympus", "../etc/passwd", "", 3):
        r = server.post("/api/me/digest", json={"minutes": 45, "timezone": zone}, headers=h)
        assert r.status_code == 400 and r.json()["error"]["message"].startswith("timezone must be a time zone's name")
    r = server.post("/api/me/digest", json={}, headers=h)
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("minutes is required")
    assert server.post("/api/me/digest", json={"minutes": None}, headers=h).json()["digest_minutes"] is None


class _Refusing(Inbox):
    """A mail server that has no mailbox for one address."""

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        if address == "gone@example.org":
            return "550 no such mailbox here"
        envelope.rcpt_tos.append(address)
        return "250 OK"


def test_an_address_the_mail_server_refuses_holds_up_nobody_elses_digest(world, clock):  # noqa: F811
    db = world.db
    inbox = _Refusing()
    controller = Controller(inbox, hostname="127.0.0.1", port=_free_port())
    controller.start()
    try:
        for handle, address in (("oj", "gone@example.org"), ("ren", "ren@example.org")):
            prickle.set_person_email(db, handle, address)
            prickle.set_digest(db, handle, 30)
        mention = prickle.post_message(db, prickle.Actor("person", "", "cli", handle="ren"), PROJECT, "@oj look?")
        ask(world, "@ren and you?")
        clock.now = T0 + 31 * MINUTE
        assert [d["handle"] for d in prickle.digests_due(db, BASE, clock.now)] == ["oj", "ren"]
        piece = {p.name: p for p in prickle.server_maintenance(db, None, None, _settings(controller.port),
                                                               lambda: None).pieces}["email digest"]
        with pytest.raises(prickle.MailFailed) as failed:
            asyncio.run(piece.run())
        assert failed.value.message == ("1 digest(s) could not be sent and the others went out: the mail server "
                                        f"127.0.0.1:{controller.port} refused the recipient's address (550)")
        mail = inbox.next()
        assert mail["to"] == ["ren@example.org"] and mail["message"]["Subject"] == "Prickle: 1 waiting for you"
        # ren's is recorded and not sent again; oj's waits to be tried again.
        assert [d["handle"] for d in prickle.digests_due(db, BASE, clock.now)] == ["oj"]
        assert mention["id"] in prickle.digests_due(db, BASE, clock.now)[0]["text"]
    finally:
        controller.stop()
    assert inbox.mails.empty()


def test_the_digest_says_when_in_words_in_the_persons_time_zone_and_quotes_words_not_markdown(world, clock):  # noqa: F811
    db = world.db
    prickle.set_person_email(db, "ren", "ren@example.org")
    prickle.set_digest(db, "ren", 30, "Asia/Tokyo")  # 10:00 UTC is 19:00 in Tokyo
    clock.now = T0 - dt.timedelta(days=3)
    old = ask(world, "@ren **the** `old` one, see [the brief](https://example.org/brief)")
    clock.now = T0 - dt.timedelta(days=1)
    ask(world, "@ren yesterday's")
    clock.now = T0
    ask(world, "@ren <b>today</b> & now")
    [due] = prickle.digests_due(db, BASE, T0 + 31 * MINUTE)
    assert [line for line in due["text"].splitlines() if "waiting since" in line or line.startswith("- ")] == [
        "- A message that mentions you in Website v2: @ren the old one, see the brief", "  waiting since 28 Nov",
        "- A message that mentions you in Website v2: @ren yesterday's", "  waiting since yesterday 19:00",
        "- A message that mentions you in Website v2: @ren <b>today</b> & now", "  waiting since today 19:00"]
    assert "@ren &lt;b&gt;today&lt;/b&gt; &amp; now</a>" in due["html"] and "<b>today" not in due["html"]
    assert old["id"] in due["html"]
    assert prickle.human_time("2025-12-31T23:00:00.000Z", T0) == "31 Dec 2025"
