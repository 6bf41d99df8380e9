"""Confirming it's you (chapter 14): a step-up by passkey or by a sign-in link mailed to the person, held
STEP_UP_WINDOW by the credential that made it, and every guarded act refused without a fresh one."""

import datetime as dt

import pytest
from starlette.testclient import TestClient

import prickle
from conftest import PROJECT, audit_entries
from helpers import (AT_ORIGIN, ORIGIN, T0, SoftAuthenticator, _settings, add_passkey, ask_connect, confirm_with, confirmed,
                     jrun, run,
                     paired, person, routed, setup_room)

STEP_UP = "step_up_required"


def refused(r, doing):
    assert r.status_code == 403, r.text
    assert r.json()["error"] == {"code": STEP_UP, "message": (
        f"confirm it's you to {doing}; a confirmation then holds 5 minutes for the session or token that made it")}


def test_a_passkey_registered_confirms_and_its_step_up_lapses_after_five_minutes(server, world, clock):
    ren = person(server, world, "ren")
    assert ren.get("/api/me/step-up").json() == {"confirmed": False, "until": None, "window_minutes": 5,
                                                  "passkeys": 0, "email_link": False, "step_up_above_cost": None}
    # no passkey yet: confirming with one is refused; registering the first needs nothing (no address either)
    r = ren.post("/api/me/passkeys/options", {"purpose": "confirm"}, AT_ORIGIN)
    assert (r.status_code, r.json()["error"]["code"]) == (409, "invalid_state")
    r = ren.post("/api/me/passkeys/options", {"purpose": "register"})  # at 127.0.0.1: a browser would refuse it
    assert (r.status_code, r.json()["error"]["message"]) == (400, (
        "a passkey needs the page opened at a name, not at 127.0.0.1 (e.g. localhost, or set public_url): until "
        "then, confirm with a sign-in link mailed to you"))
    options = ren.post("/api/me/passkeys/options", {"purpose": "register"}, AT_ORIGIN).json()["publicKey"]
    assert (options["rp"], options["user"]["name"], options["attestation"]) == (
        {"id": "localhost", "name": "Prickle"}, "ren", "none")
    authenticator = SoftAuthenticator()
    made = ren.post("/api/me/passkeys", {"credential": authenticator.create(options, ORIGIN), "label": "Laptop"})
    assert made.status_code == 200, made.text
    assert made.json()["passkey"] | {"id": None} == {"id": None, "label": "Laptop", "created_at": prickle.iso(T0),
                                                     "last_used_at": prickle.iso(T0)}
    until = prickle.iso(T0 + dt.timedelta(minutes=5))
    assert ren.get("/api/me/step-up").json() == {"confirmed": True, "until": until, "window_minutes": 5,
                                                  "passkeys": 1, "email_link": False, "step_up_above_cost": None}
    # the step-up is this credential's alone: another of ren's credentials is not confirmed
    other = prickle.create_token(world.db, "person", person="ren")[1]
    assert server.get("/api/me/step-up", headers={"Authorization": f"Bearer {other}"}).json()["confirmed"] is False
    clock.now = T0 + dt.timedelta(minutes=5)
    assert ren.get("/api/me/step-up").json()["confirmed"] is False
    # a second passkey now needs a step-up first
    refused(ren.post("/api/me/passkeys/options", {"purpose": "register"}, AT_ORIGIN), "add a passkey")
    clock.now = T0 + dt.timedelta(minutes=7)
    confirmed_now = confirm_with(ren, authenticator)
    assert confirmed_now.status_code == 200, confirmed_now.text
    assert confirmed_now.json()["until"] == prickle.iso(T0 + dt.timedelta(minutes=12))
    assert world.db.scalar("SELECT confirmed_by FROM credentials WHERE id = ?",
                           (world.person("ren").credential_id,)) == "passkey"


def test_a_passkey_answer_that_does_not_verify_confirms_nothing(server, world, clock):
    ren = confirmed(server, world, "ren")
    clock.now = T0 + dt.timedelta(minutes=6)
    options = ren.post("/api/me/passkeys/options", {"purpose": "confirm"}, AT_ORIGIN).json()["publicKey"]
    answer = ren.authenticator.get(options, "http://evil.example")  # another origin
    r = ren.post("/api/me/step-up/passkey", {"credential": answer})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("credential: the passkey did not verify")
    assert ren.get("/api/me/step-up").json()["confirmed"] is False  # a refusal changes nothing
    stranger = SoftAuthenticator()
    options = ren.post("/api/me/passkeys/options", {"purpose": "confirm"}, AT_ORIGIN).json()["publicKey"]
    r = ren.post("/api/me/step-up/passkey", {"credential": stranger.get(options, ORIGIN)})
    assert r.json()["error"]["message"] == "credential: not one of your passkeys for this address"
    assert ren.post("/api/me/step-up/passkey", {"credential": "x"}).status_code == 400
    assert ren.get("/api/me/step-up").json()["confirmed"] is False
    assert confirm_with(ren, ren.authenticator).json()["confirmed"] is True
    # a replayed answer (its ceremony spent, its counter not moving on) confirms nothing more
    options = ren.post("/api/me/passkeys/options", {"purpose": "confirm"}, AT_ORIGIN).json()["publicKey"]
    answer = ren.authenticator.get(options, ORIGIN)
    assert ren.post("/api/me/step-up/passkey", {"credential": answer}).status_code == 200
    assert ren.post("/api/me/step-up/passkey", {"credential": answer}).status_code == 409


def test_start_a_run_is_refused_without_a_fresh_step_up_and_its_entry_says_one_was_asked(mcp, server, world, clock):
    task = routed(mcp, server, world)
    paired(world)
    ren = person(server, world, "ren")
    refused(ren.post(f"/api/tasks/{task['id']}/runs"), "start a run")
    assert audit_entries(world.db, PROJECT, "task.run_approved") == []
    authenticator, _ = add_passkey(ren)
    clock.now = T0 + dt.timedelta(minutes=5, seconds=1)
    refused(ren.post(f"/api/tasks/{task['id']}/runs"), "start a run")  # it lapsed
    assert confirm_with(ren, authenticator).status_code == 200
    started = ren.post(f"/api/tasks/{task['id']}/runs")
    assert started.status_code == 200, started.text
    [entry] = audit_entries(world.db, PROJECT, "task.run_approved")
    assert entry["refs"] == {"agent": "ren/builder", "run": started.json()["run_id"], "task": task["id"], "by": "ren",
                             "step_up": True}


def test_approving_a_computer_needs_a_step_up(server, world, clock):
    asked = ask_connect(server, ("codex",))
    ren = person(server, world, "ren")
    body = {"decision": "approve", "typed_code": asked["code"], "agents": [{"cli": "codex", "agent_id": "ren/builder"}]}
    refused(ren.post(f"/api/connect/{asked['code']}", body), "connect a computer")
    assert ren.get(f"/api/connect/{asked['code']}").json()["request"]["state"] == "pending"
    add_passkey(ren)
    assert ren.post(f"/api/connect/{asked['code']}", body).status_code == 200
    [entry] = audit_entries(world.db, PROJECT, "device.approved")
    assert entry["refs"] == {"request": asked["request_id"], "agents": ["ren/builder"], "keys": 1, "by": "ren",
                             "step_up": True}
    # refusing a computer needs none
    other = ask_connect(server, ("codex",))
    clock.now = T0 + dt.timedelta(minutes=6)
    assert ren.post(f"/api/connect/{other['code']}", {"decision": "refuse"}).status_code == 200


def test_an_action_above_the_owners_cost_needs_a_step_up_and_its_entries_say_so_truly(server, world, clock):
    runners = setup_room(world)
    runner = {"Authorization": f"Bearer {runners['oj/muse']}"}
    room = world.db.scalar("SELECT project FROM rooms WHERE owner = 'oj'")
    oj = person(server, world, "oj")
    assert oj.post("/api/me/step-up-cost", {"amount": -1}).status_code == 400
    assert oj.post("/api/me/step-up-cost", {"amount": "1"}).status_code == 400
    assert oj.post("/api/me/step-up-cost", {"amount": 1}).json() == {"step_up_above_cost": 1}  # tightening: free

    def propose(cost):
        r = server.post("/api/runner/actions", json={"tool": "image_gen", "action": f"Draw for {cost}", "prompt": "p",
                                                     **({"cost_estimate": cost} if cost else {})}, headers=runner)
        assert r.status_code == 200, r.text
        return r.json()["action"]

    cheap, dear, unknown = propose("$0.40"), propose("about $2.50"), propose(None)
    assert [c["step_up"] for c in (cheap, dear, unknown)] == [False, True, True]
    assert oj.post(f"/api/actions/{cheap['id']}", {"decision": "approve"}).status_code == 200
    refused(oj.post(f"/api/actions/{dear['id']}", {"decision": "approve"}), "approve an action above the cost you set")
    assert oj.post(f"/api/actions/{unknown['id']}", {"decision": "decline"}).status_code == 200  # declining: free
    authenticator, _ = add_passkey(oj)
    approved = oj.post(f"/api/actions/{dear['id']}", {"decision": "approve"}).json()["action"]
    assert (approved["status"], approved["step_up"]) == ("approved", True)
    assert [(e["refs"]["action"], e["refs"]["step_up"]) for e in audit_entries(world.db, room, "action.approved")] == [
        (cheap["id"], False), (dear["id"], True)]
    # raising the cost or turning it off loosens: a step-up again
    clock.now = T0 + dt.timedelta(minutes=6)
    refused(oj.post("/api/me/step-up-cost", {"amount": 5}), "raise the cost that needs confirming")
    refused(oj.post("/api/me/step-up-cost", {"amount": None}), "raise the cost that needs confirming")
    assert oj.post("/api/me/step-up-cost", {"amount": 0.5}).status_code == 200
    assert confirm_with(oj, authenticator).status_code == 200
    assert oj.post("/api/me/step-up-cost", {"amount": None}).json() == {"step_up_above_cost": None}
    assert propose("$900")["step_up"] is False


def test_removing_a_passkey_needs_a_step_up(server, world, clock):
    ren = confirmed(server, world, "ren")
    [key] = ren.get("/api/me/passkeys").json()["passkeys"]
    clock.now = T0 + dt.timedelta(minutes=6)
    refused(ren.delete(f"/api/me/passkeys/{key['id']}"), "remove a passkey")
    assert confirm_with(ren, ren.authenticator).status_code == 200
    assert ren.delete(f"/api/me/passkeys/{key['id']}").json() == {"removed": key["id"]}
    assert ren.delete(f"/api/me/passkeys/{key['id']}").status_code == 404
    assert ren.get("/api/me/passkeys").json() == {"passkeys": []}


@pytest.fixture
def mailing(world, smtp):
    app = prickle.create_app(world.db_path, _settings(smtp.port), port=8321)
    with TestClient(app, base_url=ORIGIN) as client:
        yield client


def test_without_a_passkey_a_sign_in_link_mailed_to_the_person_confirms_the_browser_it_opens_in(mailing, world,
                                                                                              smtp, clock):
    ren = person(mailing, world, "ren")
    r = ren.post("/api/me/step-up/email")
    assert (r.status_code, r.json()["error"]["message"]) == (
        409, "you have no address to mail a link to: add one on the Inbox page, or add a passkey")
    assert ren.post("/api/me/email", {"email": "ren@example.com"}).status_code == 200
    # an address now exists: the first passkey needs a step-up too (anyone at an open browser could add one)
    refused(ren.post("/api/me/passkeys/options", {"purpose": "register"}, AT_ORIGIN), "add a passkey")
    assert ren.post("/api/me/step-up/email").json() == {
        "sent": "a sign-in link is on its way to your address: open it in this browser, then try again"}
    mail = smtp.next()
    assert mail["to"] == ["ren@example.com"] and mail["message"]["Subject"] == "Your Prickle sign-in link"
    link = next(w for w in mail["text"].split() if "/signin?token=" in w)
    opened = mailing.get(link.removeprefix(ORIGIN), follow_redirects=False)
    assert opened.status_code == 303
    session = opened.cookies[prickle.SESSION_COOKIE]
    mailing.cookies.clear()
    browser = {"Cookie": f"{prickle.SESSION_COOKIE}={session}"}
    assert mailing.get("/api/me/step-up", headers=browser).json() == {
        "confirmed": True, "until": prickle.iso(T0 + dt.timedelta(minutes=5)), "window_minutes": 5, "passkeys": 0,
        "email_link": True, "step_up_above_cost": None}
    assert world.db.scalar("SELECT confirmed_by FROM credentials WHERE kind = 'session'") == "email_link"
    # the address is a way in: changing it asks a step-up, which this browser now has
    refused(ren.post("/api/me/email", {"email": "someone@example.net"}), "change your address")
    moved = mailing.post("/api/me/email", json={"email": "ren@example.org"}, headers=browser | {"Origin": ORIGIN})
    assert moved.json() == {"handle": "ren", "email": "ren@example.org"}
    # a link the operator made ('prickle signin-link') signs in but confirms nothing
    operator = prickle.signin_link(world.db, _settings(smtp.port), "ren", 8321)
    opened = mailing.get(operator.removeprefix(ORIGIN), follow_redirects=False)
    assert mailing.get("/api/me/step-up", headers={
        "Cookie": f"{prickle.SESSION_COOKIE}={opened.cookies[prickle.SESSION_COOKIE]}"}).json()["confirmed"] is False


def test_the_operator_removes_a_lost_passkey_on_a_server_without_mail_and_the_person_adds_a_new_one(server, world):
    ren = person(server, world, "ren")
    prickle.set_person_email(world.db, "ren", "ren@example.com")
    room = prickle.ensure_room(world.db, "ren")
    # no [smtp]: an address is no way to confirm, so the first passkey asks nothing
    assert add_passkey(ren, label="Phone")[1].status_code == 200
    _, session = prickle.create_token(world.db, "session", person="ren")
    assert [k["label"] for k in jrun(world.db_path, "person", "passkeys", "ren")["passkeys"]] == ["Phone"]
    code, out, _ = run(world.db_path, "person", "passkeys", "ren", "--remove-all")
    assert out == ("Removed 1 passkey(s) of ren and ended 1 browser session(s) or sign-in link(s). Give them a "
                   "sign-in link (prickle signin-link ren): at the next \"Confirm it's you\" they add a new passkey.\n")
    [entry] = audit_entries(world.db, room, "person.passkeys_removed")
    assert entry["refs"] == {"person": "ren", "passkeys_removed": 1, "sessions_ended": 1, "by": "operator"}
    assert jrun(world.db_path, "person", "passkeys", "ren") == {"passkeys": []}
    assert server.get("/api/me", headers={"Cookie": f"{prickle.SESSION_COOKIE}={session}"}).status_code == 401
    # the token that registered the lost passkey holds no confirmation any more
    assert ren.get("/api/me/step-up").json() == {"confirmed": False, "until": None, "window_minutes": 5,
                                                  "passkeys": 0, "email_link": True, "step_up_above_cost": None}
    authenticator, made = add_passkey(ren, label="New phone")
    assert made.status_code == 200, made.text
    assert ren.get("/api/me/step-up").json()["confirmed"] is True
    code, out, err = run(world.db_path, "person", "passkeys", "nobody", "--remove-all", ok=False)
    assert code != 0 and "nobody" in err


def test_with_mail_an_address_still_guards_the_first_passkey(mailing, world):
    ren = person(mailing, world, "ren")
    prickle.set_person_email(world.db, "ren", "ren@example.com")
    refused(ren.post("/api/me/passkeys/options", {"purpose": "register"}, AT_ORIGIN), "add a passkey")
