"""Invites by email and the mail under them: a real SMTP server (aiosmtpd) started by the test."""

from __future__ import annotations

import datetime as dt
import re

import httpx
import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult
from starlette.testclient import TestClient

import prickle
from conftest import PROJECT, Served, World, all_events, audit_entries
from helpers import FROM, T0, Inbox, _free_port, _settings, auth, jrun, run, written

DAY = dt.timedelta(days=1)


@pytest.fixture
def mailing(world, smtp):
    """The app in-process on the world's database, with [smtp] pointing at the test's mail server."""
    app = prickle.create_app(world.db_path, _settings(smtp.port), port=8321)
    with TestClient(app, base_url="http://127.0.0.1:8321") as client:
        yield client


def _invite(client, world, address, role="member", by="oj", project=PROJECT):
    r = client.post(f"/api/projects/{project}/invites", json={"email": address, "role": role}, headers=auth(world, by))
    assert r.status_code == 200, r.text
    return r.json()


def _secret(link: str) -> str:
    return link.rpartition("/")[2]


def _invite_row(world, invite_id):
    return world.db.one("SELECT * FROM invites WHERE id = ?", (invite_id,))


def _counts(db):
    return {t: db.scalar(f"SELECT count(*) FROM {t}") for t in ("people", "members", "team_people", "audit",
                                                                 "outbox", "invites", "credentials")}


def test_an_invite_mails_its_link_which_signs_the_person_up_once(mailing, world, smtp, clock):
    out = _invite(mailing, world, " Kim@Example.ORG ")
    invite, link = out["invite"], out["link"]
    assert out["mailed"] is True and out["mail_problem"] is None
    assert re.fullmatch(r"http://127\.0\.0\.1:8321/#/invite/prk_iv_[A-Za-z0-9_-]{43}", link)
    assert invite == {"id": invite["id"], "project": PROJECT, "email": "Kim@example.org", "role": "member",
                      "invited_by": "oj", "state": "open", "sends": 1, "created_at": "2026-12-01T10:00:00.000Z",
                      "expires_at": "2026-12-08T10:00:00.000Z", "ended_at": None}
    mail = smtp.next()
    assert mail["to"] == ["Kim@example.org"]
    assert mail["message"]["From"] == FROM and mail["message"]["Subject"] == "Invite to Website v2 on Prickle"
    # Its Message-ID is in the sender's domain, as mail filters expect, never the recipient's.
    assert re.fullmatch(r"<[^@<>]+@" + re.escape(FROM.rpartition("@")[2].rstrip(">")) + ">",
                        mail["message"]["Message-ID"]), mail["message"]["Message-ID"]
    assert link in mail["text"] and "Oj Okafor (@oj) invites you" in mail["text"]
    # The secret is kept only as its hash; the address in no audit entry or event.
    assert _invite_row(world, invite["id"])["secret_hash"] == prickle.sha256_hex(_secret(link))
    assert audit_entries(world.db, PROJECT, "invite.created")[-1]["refs"] == {
        "invite": invite["id"], "role": "member", "expires_at": "2026-12-08T10:00:00.000Z", "by": "oj"}

    view = mailing.post("/api/invite", json={"token": _secret(link)})
    assert view.json() == {"invite": {
        "id": invite["id"], "project": {"slug": PROJECT, "team": "web", "name": "Website v2"}, "role": "member",
        "invited_by": {"handle": "oj", "display_name": "Oj Okafor", "avatar_url": None, "color": 0, "away": False},
        "expires_at": "2026-12-08T10:00:00.000Z"}}

    r = mailing.post("/api/invite/accept", json={"token": _secret(link), "handle": "kim", "display_name": "Kim Park"})
    assert r.json() == {"invite": {"state": "accepted", "project": PROJECT, "handle": "kim", "role": "member"}}
    session = r.cookies.get("prickle_session")
    assert session.startswith("prk_ss_")
    me = TestClient(mailing.app, base_url="http://127.0.0.1:8321", cookies={"prickle_session": session})
    assert me.get("/api/me").json()["person"]["handle"] == "kim"
    assert [m["handle"] for m in me.get(f"/api/projects/{PROJECT}/members").json()["members"]] == ["oj", "kim", "ren"]
    assert world.db.one("SELECT role FROM team_people WHERE team = 'web' AND handle = 'kim'") == {"role": "member"}
    event = all_events(world.db)[-1]
    assert event["type"] == "member.joined" and event["member"]["handle"] == "kim" and event["role"] == "member"
    assert audit_entries(world.db, PROJECT, "member.joined")[-1]["refs"] == {
        "person": "kim", "role": "member", "invite": invite["id"], "invited_by": "oj"}
    row = _invite_row(world, invite["id"])
    assert (row["state"], row["email"], row["joined"], row["ended_at"]) == (
        "accepted", None, "kim", "2026-12-01T10:00:00.000Z")
    every = " ".join(r["refs"] for r in world.db.rows("SELECT refs FROM audit")) + " ".join(
        r["payload"] for r in world.db.rows("SELECT payload FROM outbox"))
    assert "example.org" not in every.lower()

    # A second use is refused and changes nothing.
    before = _counts(world.db)
    again = mailing.post("/api/invite/accept", json={"token": _secret(link), "handle": "kim2", "display_name": "K"})
    assert again.status_code == 409
    assert again.json()["error"] == {"code": "invalid_state", "message": "this invite was already used: it works "
                                     "once; ask the person who invited you for a new one"}
    assert _counts(world.db) == before


def test_someone_already_in_the_project_spends_the_invite_and_nothing_joins(mailing, world, smtp):
    out = _invite(mailing, world, "ren@example.org", role="owner")
    smtp.next()
    events = len(all_events(world.db))
    r = mailing.post("/api/invite/accept", json={"token": _secret(out["link"])}, headers=auth(world, "ren"))
    assert r.json() == {"invite": {"state": "spent", "project": PROJECT, "handle": "ren", "role": "member"}}
    assert audit_entries(world.db, PROJECT, "invite.spent")[-1]["refs"] == {"invite": out["invite"]["id"]}
    row = _invite_row(world, out["invite"]["id"])
    assert (row["state"], row["email"], row["joined"]) == ("spent", None, None)
    assert len(all_events(world.db)) == events
    assert world.db.scalar("SELECT role FROM members WHERE project = ? AND handle = 'ren'", (PROJECT,)) == "member"
    # Accepting needs a signed-in person or a sign-up.
    r = mailing.post("/api/invite/accept", json={"token": _secret(out["link"])})
    assert r.status_code == 401


def test_an_invite_lasts_seven_days_and_a_resend_gives_it_seven_more_with_a_new_link(mailing, world, smtp, clock):
    first = _invite(mailing, world, "kim@example.org")
    assert smtp.next()["to"] == ["kim@example.org"]
    clock.now = T0 + 3 * DAY
    r = mailing.post(f"/api/invites/{first['invite']['id']}/resend", headers=auth(world, "oj"))
    again = r.json()
    assert again["invite"]["expires_at"] == "2026-12-11T10:00:00.000Z" and again["invite"]["sends"] == 2
    assert again["link"] != first["link"] and again["mailed"] is True
    assert again["link"] in smtp.next()["text"]
    assert audit_entries(world.db, PROJECT, "invite.resent")[-1]["refs"] == {
        "invite": first["invite"]["id"], "by": "oj", "expires_at": "2026-12-11T10:00:00.000Z", "attempt": 2}
    old = mailing.post("/api/invite", json={"token": _secret(first["link"])})
    assert old.status_code == 401 and "not known here" in old.json()["error"]["message"]
    assert mailing.post("/api/invite", json={"token": _secret(again["link"])}).status_code == 200

    clock.now = T0 + 10 * DAY - dt.timedelta(minutes=1)  # past the first 7 days, within the resent ones
    assert mailing.post("/api/invite", json={"token": _secret(again["link"])}).status_code == 200
    clock.now = T0 + 10 * DAY
    late = mailing.post("/api/invite/accept", json={"token": _secret(again["link"]), "handle": "kim",
                                                    "display_name": "Kim"})
    assert late.status_code == 410 and late.json()["error"] == {
        "code": "expired", "message": "this invite has expired: ask the person who invited you to send a new one"}
    row = _invite_row(world, first["invite"]["id"])
    assert (row["state"], row["email"]) == ("expired", None)
    assert world.db.one("SELECT 1 FROM people WHERE handle = 'kim'") is None
    r = mailing.post(f"/api/invites/{first['invite']['id']}/resend", headers=auth(world, "oj"))
    assert r.status_code == 409 and r.json()["error"]["code"] == "invalid_state"


def test_the_sweep_forgets_the_address_of_an_invite_whose_days_have_passed(world, clock):
    invite, _ = prickle.create_invite(world.db, PROJECT, "kim@example.org", "member", "oj")
    clock.now = T0 + 7 * DAY - dt.timedelta(seconds=1)
    assert prickle.expire_due(world.db, "invite") == 0
    assert _invite_row(world, invite["id"])["email"] == "kim@example.org"
    clock.now = T0 + 7 * DAY
    assert prickle.expire_due(world.db, "invite") == 1
    row = _invite_row(world, invite["id"])
    assert (row["state"], row["email"], row["ended_reason"]) == ("expired", None, "expired")


def test_declining_forgets_the_address_at_once_and_needs_no_account(mailing, world, smtp):
    out = _invite(mailing, world, "kim@example.org")
    smtp.next()
    r = mailing.post("/api/invite/decline", json={"token": _secret(out["link"])})
    assert r.json() == {"invite": {"state": "declined", "project": PROJECT}}
    row = _invite_row(world, out["invite"]["id"])
    assert (row["state"], row["email"], row["ended_reason"]) == ("declined", None, "declined")
    assert audit_entries(world.db, PROJECT, "invite.declined")[-1]["refs"] == {"invite": out["invite"]["id"]}
    r = mailing.post("/api/invite/accept", json={"token": _secret(out["link"]), "handle": "kim", "display_name": "K"})
    assert r.status_code == 409 and "was declined" in r.json()["error"]["message"]


def test_only_an_owner_of_the_project_and_its_team_invites(server, world):
    before = _counts(world.db)
    r = server.post(f"/api/projects/{PROJECT}/invites", json={"email": "kim@example.org"}, headers=auth(world, "ren"))
    assert r.status_code == 403 and r.json()["error"]["message"] == (
        "only an owner of both 'website-v2' and its team 'web' invites people; ask one of them")
    # sam owns the project 'side' but is a member of team web only.
    r = server.post("/api/projects/side/invites", json={"email": "kim@example.org"}, headers=auth(world, "sam"))
    assert r.status_code == 403 and "its team 'web'" in r.json()["error"]["message"]
    r = server.post(f"/api/projects/{PROJECT}/invites", json={"email": "kim at example"}, headers=auth(world, "oj"))
    assert r.status_code == 400 and r.json()["error"]["message"] == "email must be an email address like ana@example.org"
    r = server.post(f"/api/projects/{PROJECT}/invites", json={"email": "kim@example.org", "role": "boss"},
                    headers=auth(world, "oj"))
    assert r.status_code == 400 and "role must be 'owner' or 'member'" in r.json()["error"]["message"]
    assert _counts(world.db) == before
    # Without [smtp] the link is still given, to pass on by hand.
    out = server.post(f"/api/projects/{PROJECT}/invites", json={"email": "kim@example.org"},
                      headers=auth(world, "oj")).json()
    assert out["mailed"] is False and out["mail_problem"] == (
        "no mail server is configured ([smtp] in prickle.toml): pass the link on yourself")
    assert "/#/invite/prk_iv_" in out["link"]
    # ... and the sign-in page offers no link by email.
    assert server.get("/api/signin/options").json() == {"email_link": False}
    assert server.post("/api/signin/email", json={"email": "oj@example.org"}).status_code == 409
    r = server.post(f"/api/projects/{PROJECT}/invites", json={"email": "KIM@EXAMPLE.org"}, headers=auth(world, "oj"))
    assert r.status_code == 200  # the part before '@' is kept as written: another address
    r = server.post(f"/api/projects/{PROJECT}/invites", json={"email": "kim@EXAMPLE.org"}, headers=auth(world, "oj"))
    assert r.status_code == 409 and "already has an open invite" in r.json()["error"]["message"]
    # Only owners list invites (with their addresses); others are refused.
    assert [i["email"] for i in server.get(f"/api/projects/{PROJECT}/invites", headers=auth(world, "oj")).json()[
        "invites"]] == ["KIM@example.org", "kim@example.org"]
    assert server.get(f"/api/projects/{PROJECT}/invites", headers=auth(world, "ren")).status_code == 403
    assert server.get("/api/projects/side/invites", headers=auth(world, "oj")).status_code == 404


def test_an_owner_revokes_an_invite_and_its_link_stops_working(server, world):
    out = server.post(f"/api/projects/{PROJECT}/invites", json={"email": "kim@example.org"},
                      headers=auth(world, "oj")).json()
    assert server.post(f"/api/invites/{out['invite']['id']}/revoke", headers=auth(world, "ren")).status_code == 403
    r = server.post(f"/api/invites/{out['invite']['id']}/revoke", headers=auth(world, "oj"))
    assert r.json()["invite"]["state"] == "revoked" and r.json()["invite"]["email"] is None
    assert audit_entries(world.db, PROJECT, "invite.revoked")[-1]["refs"] == {
        "invite": out["invite"]["id"], "reason": "owner_revoked", "by": "oj"}
    r = server.post("/api/invite", json={"token": _secret(out["link"])})
    assert r.status_code == 409 and "revoked by an owner" in r.json()["error"]["message"]
    assert server.get(f"/api/projects/{PROJECT}/invites", headers=auth(world, "oj")).json() == {"invites": []}
    r = server.post(f"/api/invites/{out['invite']['id']}/revoke", headers=auth(world, "oj"))
    assert r.status_code == 409


def test_revoke_invites_by_ends_the_open_invites_a_person_sent(world):
    world.db.execute("UPDATE members SET role = 'owner' WHERE project = ? AND handle = 'ren'", (PROJECT,))
    prickle.add_to_team(world.db, "web", "ren", "owner")
    mine = [prickle.create_invite(world.db, PROJECT, f"{n}@example.org", "member", "oj")[0] for n in ("a", "b")]
    theirs = prickle.create_invite(world.db, PROJECT, "c@example.org", "member", "ren")[0]
    prickle.revoke_invite(world.db, mine[1]["id"], "oj")  # already ended: not counted again
    with world.db.transaction():
        assert prickle.revoke_invites_by(world.db, PROJECT, "oj", "inviter_left") == 1
    assert audit_entries(world.db, PROJECT, "invite.revoked")[-1]["refs"] == {
        "invite": mine[0]["id"], "reason": "inviter_left", "by": None}
    assert [(r["state"], r["email"]) for r in world.db.rows("SELECT state, email FROM invites ORDER BY email IS NULL, "
                                                            "created_at")] == [
        ("open", "c@example.org"), ("revoked", None), ("revoked", None)]
    assert _invite_row(world, theirs["id"])["state"] == "open"
    with pytest.raises(prickle.InvalidInput, match="reason must be one of"):
        prickle.revoke_invites_by(world.db, PROJECT, "ren", "bored")


def test_the_sign_in_page_mails_a_link_without_saying_whether_an_address_is_known(mailing, world, smtp):
    assert mailing.get("/api/signin/options").json() == {"email_link": True}
    r = mailing.post("/api/me/email", json={"email": "oj@example.org"}, headers=auth(world, "oj"))
    assert r.json() == {"handle": "oj", "email": "oj@example.org"}
    unknown = mailing.post("/api/signin/email", json={"email": "nobody@example.org"})
    known = mailing.post("/api/signin/email", json={"email": "oj@example.org"})
    assert unknown.status_code == known.status_code == 200 and unknown.json() == known.json() == {
        "sent": prickle.SIGNIN_MAIL_ANSWER}
    mail = smtp.next()  # one mail thread, in order: had the unknown address got one, it would be first
    assert mail["to"] == ["oj@example.org"] and mail["message"]["Subject"] == "Your Prickle sign-in link"
    link = re.search(r"http://127\.0\.0\.1:8321/signin\?token=(prk_sl_\S+)", mail["text"])
    r = mailing.get(f"/signin?token={link.group(1)}", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/" and r.cookies.get("prickle_session")
    assert mailing.post("/api/signin/email", json={"email": "not an address"}).status_code == 400


def test_signing_up_with_a_blank_or_many_line_name_is_refused_and_a_name_is_trimmed(server, world):
    out = server.post(f"/api/projects/{PROJECT}/invites", json={"email": "kim@example.org"},
                      headers=auth(world, "oj")).json()
    people = world.db.scalar("SELECT count(*) FROM people")
    for name in ("   ", "Kim\nOj Okafor (owner)", "\t"):
        r = server.post("/api/invite/accept", json={"token": _secret(out["link"]), "handle": "kim",
                                                     "display_name": name})
        assert r.status_code == 400 and r.json()["error"]["message"] == (
            "display_name: write the person's name in words, on one line, e.g. 'Ana Lima'")
    assert world.db.scalar("SELECT count(*) FROM people") == people
    assert _invite_row(world, out["invite"]["id"])["state"] == "open"
    r = server.post("/api/invite/accept", json={"token": _secret(out["link"]), "handle": "kim",
                                                 "display_name": "  Kim Park "})
    assert r.json()["invite"]["state"] == "accepted"
    assert prickle.person_out(world.db, "kim")["display_name"] == "Kim Park"
    code, _, err = run(world.db_path, "person", "add", "lee", "--name", " ", ok=False)
    assert code != 0 and "name: write the person's name in words" in err


def test_asking_again_and_again_mails_a_person_three_sign_in_links_in_15_minutes(mailing, world, smtp, clock):
    for handle in ("oj", "ren"):
        prickle.set_person_email(world.db, handle, f"{handle}@example.org")
    answers = [mailing.post("/api/signin/email", json={"email": "oj@example.org"}).json() for _ in range(5)]
    assert answers == [{"sent": prickle.SIGNIN_MAIL_ANSWER}] * 5
    assert world.db.scalar("SELECT count(*) FROM credentials WHERE kind = 'signin' AND person = 'oj'") == 3
    mailing.post("/api/signin/email", json={"email": "ren@example.org"})
    # One mail thread, in order: ren's mail comes right after oj's three.
    assert [smtp.next()["to"] for _ in range(4)] == [["oj@example.org"]] * 3 + [["ren@example.org"]]
    clock.now = T0 + prickle.SIGNIN_MAIL_WINDOW + prickle._dt.timedelta(seconds=1)
    mailing.post("/api/signin/email", json={"email": "oj@example.org"})
    assert smtp.next()["to"] == ["oj@example.org"]
    assert world.db.scalar("SELECT count(*) FROM credentials WHERE kind = 'signin' AND person = 'oj'") == 4


class _Password:
    def __init__(self, user, password):
        self.user, self.password = user.encode(), password.encode()

    def __call__(self, server, session, envelope, mechanism, auth_data):
        ok = auth_data.login == self.user and auth_data.password == self.password
        return AuthResult(success=ok, handled=False)


def test_send_mail_logs_in_with_the_password_from_the_environment_and_never_says_it(monkeypatch):
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=_free_port(), authenticator=_Password("prk", "s3cret-pw"),
                            auth_require_tls=False)
    controller.start()
    try:
        settings = _settings(controller.port, user="prk", password_env="PRICKLE_TEST_SMTP_PW")
        with pytest.raises(prickle.MailFailed, match="PRICKLE_TEST_SMTP_PW that holds its password is empty"):
            prickle.send_mail(settings, "kim@example.org", "Hi", "Hello")
        monkeypatch.setenv("PRICKLE_TEST_SMTP_PW", "wrong-pw")
        with pytest.raises(prickle.MailFailed) as refused:
            prickle.send_mail(settings, "kim@example.org", "Hi", "Hello")
        assert refused.value.message == (f"the mail server 127.0.0.1:{controller.port} refused the login of smtp.user "
                                         "(535): check the user and the password's environment variable")
        monkeypatch.setenv("PRICKLE_TEST_SMTP_PW", "s3cret-pw")
        prickle.send_mail(settings, "kim@example.org", "Hi", "Hello there")
        mail = inbox.next()
        assert mail["to"] == ["kim@example.org"] and mail["text"].splitlines() == ["Hello there"]
        assert mail["message"]["From"] == FROM and mail["message"]["Subject"] == "Hi"
    finally:
        controller.stop()
    with pytest.raises(prickle.MailFailed, match=rf"^could not send mail through 127\.0\.0\.1:{controller.port}: "):
        prickle.send_mail(_settings(controller.port), "kim@example.org", "Hi", "Hello")
    with pytest.raises(prickle.InvalidState, match=r"no mail server is configured: add an \[smtp\] table"):
        prickle.send_mail(prickle.Settings(), "kim@example.org", "Hi", "Hello")


def test_the_smtp_settings_are_read_and_checked(tmp_path):
    path = tmp_path / "prickle.toml"
    path.write_text('[smtp]\nhost = "mail.example.org"\nport = 465\ntls = "tls"\nuser = "prickle"\n'
                    'password_env = "SMTP_PASSWORD"\nfrom_address = "Prickle <prickle@example.org>"\n')
    smtp = prickle.load_settings(str(path)).smtp
    assert (smtp.host, smtp.port, smtp.tls, smtp.user, smtp.password_env) == (
        "mail.example.org", 465, "tls", "prickle", "SMTP_PASSWORD")
    assert prickle.load_settings(None).smtp is None
    path.write_text('[smtp]\nhost = "mail.example.org"\ntls = "ssl"\nfrom_address = "p@example.org"\n')
    with pytest.raises(prickle.PrickleError, match=r"smtp\.tls: String should match pattern"):
        prickle.load_settings(str(path))
    path.write_text('[smtp]\nhost = "mail.example.org"\nfrom_address = "p@example.org"\npassword = "x"\n')
    with pytest.raises(prickle.PrickleError, match=r"smtp\.password: Extra inputs are not permitted"):
        prickle.load_settings(str(path))


def test_invites_from_the_command_line(world, clock):
    out = jrun(world.db_path, "invite", "create", PROJECT, "kim@example.org", "--by", "oj", "--role", "owner")
    assert out["mailed"] is False and out["invite"]["role"] == "owner" and "/#/invite/prk_iv_" in out["link"]
    listed = jrun(world.db_path, "invite", "list", PROJECT)["invites"]
    assert [(i["id"], i["email"], i["invited_by"]) for i in listed] == [(out["invite"]["id"], "kim@example.org", "oj")]
    again = jrun(world.db_path, "invite", "resend", out["invite"]["id"], "--by", "oj")
    assert again["invite"]["sends"] == 2 and again["link"] != out["link"]
    assert jrun(world.db_path, "invite", "revoke", out["invite"]["id"])["invite"]["state"] == "revoked"
    assert audit_entries(world.db, PROJECT, "invite.revoked")[-1]["refs"]["by"] is None
    assert jrun(world.db_path, "invite", "list", PROJECT) == {"invites": []}
    assert jrun(world.db_path, "person", "email", "ren", "ren@example.org") == {"handle": "ren",
                                                                                  "email": "ren@example.org"}
    assert jrun(world.db_path, "person", "email", "ren") == {"handle": "ren", "email": None}
    # An invite's secret is made only by create_invite, never as a credential.
    with pytest.raises(prickle.InvalidInput, match="kind must be one of"):
        prickle.create_token(world.db, "invite", person="oj")
    assert world.db.scalar("SELECT count(*) FROM credentials WHERE kind = 'invite'") == 0


def test_a_person_already_on_the_server_signs_in_and_accepts_joining_the_team(server, world):
    prickle.add_person(world.db, "kim", "Kim Park")
    kim = prickle.create_token(world.db, "person", person="kim")[1]
    out = server.post(f"/api/projects/{PROJECT}/invites", json={"email": "kim@example.org", "role": "owner"},
                      headers=auth(world, "oj")).json()
    r = server.post("/api/invite/accept", json={"token": _secret(out["link"])}, headers={"Authorization": f"Bearer {kim}"})
    assert r.json() == {"invite": {"state": "accepted", "project": PROJECT, "handle": "kim", "role": "owner"}}
    assert "set-cookie" not in r.headers  # a signed-in person keeps the session they have
    assert world.db.scalar("SELECT role FROM members WHERE project = ? AND handle = 'kim'", (PROJECT,)) == "owner"
    assert world.db.scalar("SELECT role FROM team_people WHERE team = 'web' AND handle = 'kim'") == "member"
    assert audit_entries(world.db, PROJECT, "member.joined")[-1]["refs"] == {
        "person": "kim", "role": "owner", "invite": out["invite"]["id"], "invited_by": "oj"}


def test_a_served_prickle_with_smtp_in_its_settings_mails_the_invite(tmp_path, smtp):
    db = str(tmp_path / "prickle.db")
    world = World(db)
    world.db.close()
    config = tmp_path / "prickle.toml"
    config.write_text(f'[smtp]\nhost = "127.0.0.1"\nport = {smtp.port}\ntls = "none"\nfrom_address = "{FROM}"\n')
    with Served(db, "--config", str(config)) as served:
        r = httpx.post(f"{served.info['url']}/api/projects/{PROJECT}/invites", json={"email": "kim@example.org"},
                       headers={"Authorization": f"Bearer {world.tokens['oj']}"}, timeout=30)
        out = r.json()
        assert out["mailed"] is True and out["link"].startswith(served.info["url"] + "/#/invite/prk_iv_")
        assert out["link"] in smtp.next()["text"]


class _Refusing(Inbox):
    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        return "550 no such mailbox here"


def test_a_mail_the_server_refuses_leaves_the_invite_open_with_its_link_and_logs_no_address(world, capfd):
    controller = Controller(_Refusing(), hostname="127.0.0.1", port=_free_port())
    controller.start()
    try:
        app = prickle.create_app(world.db_path, _settings(controller.port), port=8321)
        with TestClient(app, base_url="http://127.0.0.1:8321") as client:
            capfd.readouterr()
            out = _invite(client, world, "kim@example.org")
    finally:
        controller.stop()
    assert out["mailed"] is False and out["mail_problem"] == (
        f"the mail was not sent: the mail server 127.0.0.1:{controller.port} refused the recipient's address (550); "
        "pass the link on yourself")
    assert _invite_row(world, out["invite"]["id"])["state"] == "open"
    logged = capfd.readouterr().err
    assert f"mailing invite {out['invite']['id']} failed" in logged
    assert "kim@" not in logged and _secret(out["link"]) not in logged


def test_a_name_on_two_lines_is_refused_and_mail_never_fails_after_the_invite_is_written(mailing, world, smtp):
    before = written(world.db)
    r = mailing.post(f"/api/projects/{PROJECT}/rename", json={"name": "Website\nBcc: everyone@example.org"},
                     headers=auth(world, "oj"))
    assert (r.status_code, r.json()["error"]["message"]) == (
        400, "name: write it on one line, without line breaks, tabs or control characters")
    with pytest.raises(prickle.InvalidInput):
        prickle.create_project(world.db, "two-lines", "Two\nlines", "web", "oj")
    assert written(world.db) == before
    # A name written before the rule (or straight into the file) still mails: one header line.
    world.db.execute("UPDATE projects SET name = 'Website\nBcc: everyone@example.org' WHERE slug = ?", (PROJECT,))
    out = _invite(mailing, world, "kim@example.org")
    assert out["mailed"] is True and out["mail_problem"] is None
    message = smtp.next()["message"]
    assert message["Subject"] == "Invite to Website Bcc: everyone@example.org on Prickle" and message["Bcc"] is None


def test_a_person_who_signs_up_through_an_invite_gets_their_private_room_with_their_first_agent(server, world):
    out = server.post(f"/api/projects/{PROJECT}/invites", json={"email": "kim@example.org"},
                      headers=auth(world, "oj")).json()
    r = server.post("/api/invite/accept", json={"token": _secret(out["link"]), "handle": "kim",
                                                 "display_name": "Kim Park"})
    assert r.json()["invite"]["state"] == "accepted"
    kim = {"Authorization": f"Bearer {prickle.create_token(world.db, 'person', person='kim')[1]}"}
    listed = lambda: [(p["slug"], p["kind"]) for p in server.get("/api/projects", headers=kim).json()["projects"]]
    assert listed() == [(PROJECT, "team")]  # no agent yet: no room yet
    assert world.db.scalar("SELECT count(*) FROM rooms WHERE owner = 'kim'") == 0
    r = server.post("/api/agents", json={"name": "scout", "display_name": "Scout", "model": "gpt-5", "client": "codex",
                                         "role": "Research", "capabilities": [], "projects": [PROJECT]}, headers=kim)
    assert r.status_code == 200, r.text
    assert sorted(listed()) == [("kim-room", "private"), (PROJECT, "team")]
    assert [a["agent_id"] for a in prickle.room_agents(world.db, "kim-room")] == ["kim/scout"]
