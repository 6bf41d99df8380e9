"""The people's HTTP JSON API: tokens and sessions, projects, the room, posting, events."""

import datetime

import prickle
from conftest import PROJECT, in_thread
from helpers import auth, make_task


def test_me_and_projects(server, world):
    assert server.get("/api/me", headers=auth(world, "ren")).json() == {"person": {
        "handle": "ren", "display_name": "Ren Ito", "avatar_url": None, "color": 1, "away": False},
        "auto_accept": False, "email": None, "digest_minutes": None, "mail": False}
    assert server.get("/api/projects", headers=auth(world, "ren")).json() == {"projects": [
        {"slug": PROJECT, "team": "web", "name": "Website v2", "description": "The new site.", "role": "member",
         "kind": "team"},
        {"slug": "ren-room", "team": "", "name": "Ren Ito's room", "description": "A private room with your own agents.",
         "role": "owner", "kind": "private"}]}
    assert [p["slug"] for p in server.get("/api/projects", headers=auth(world, "sam")).json()["projects"]] == [
        "side", "sam-room"]


def test_no_credential_is_401_with_a_json_error(server):
    r = server.get("/api/projects")
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    r = server.get("/api/projects", headers={"Authorization": "Bearer prk_pt_nope"})
    assert r.status_code == 401


def test_agent_keys_do_not_open_the_people_api(server, world):
    r = server.get("/api/projects", headers={"Authorization": f"Bearer {world.keys['oj/muse']}"})
    assert r.status_code == 401


def test_project_view(server, world):
    prickle.set_memory(world.db, PROJECT, "tone", "Warm.", "oj")
    out = server.get(f"/api/projects/{PROJECT}", headers=auth(world, "oj")).json()
    assert out["project"]["slug"] == PROJECT and out["role"] == "owner"
    assert [p["handle"] for p in out["people"]] == ["oj", "ren"]
    assert [a["agent_id"] for a in out["agents"]] == ["oj/muse", "oj/scout", "ren/builder"]
    assert out["memory"][0]["key"] == "tone" and out["pulse"] == [] and out["paused"] == []


def test_non_member_gets_404_and_nothing_leaks(server, world):
    for path in (f"/api/projects/{PROJECT}", f"/api/projects/{PROJECT}/room", f"/api/projects/{PROJECT}/events",
                 "/api/projects/no-such-project"):
        r = server.get(path, headers=auth(world, "sam"))
        assert r.status_code == 404, path
        assert r.json()["error"]["code"] == "not_found"
        assert "Website" not in r.text
    r = server.post(f"/api/projects/{PROJECT}/messages", json={"body": "let me in"}, headers=auth(world, "sam"))
    assert r.status_code == 404
    assert world.db.scalar("SELECT count(*) FROM messages") == 0


def test_person_posts_and_reads_the_room_with_threads(server, mcp, world):
    task = make_task(world)
    r = server.post(f"/api/projects/{PROJECT}/messages", json={"body": "Plan for today"}, headers=auth(world, "oj"))
    assert r.status_code == 200
    mcp.ok("ren/builder", "post_message", {"project": PROJECT, "body": "in thread", "task_id": task})
    room = server.get(f"/api/projects/{PROJECT}/room", headers=auth(world, "oj")).json()
    assert [m["body"] for m in room["messages"]] == ["Plan for today"]
    assert [t["task_id"] for t in room["threads"]] == [task]  # people see every thread of their project
    thread = server.get(f"/api/projects/{PROJECT}/room", params={"task_id": task}, headers=auth(world, "oj")).json()
    assert [m["body"] for m in thread["messages"]] == ["in thread"]
    page = server.get(f"/api/projects/{PROJECT}/room", params={"limit": "0"}, headers=auth(world, "oj"))
    assert page.status_code == 400 and "limit" in page.json()["error"]["message"]


def test_bad_post_bodies_are_400_and_change_nothing(server, world):
    h = auth(world, "oj") | {"Content-Type": "application/json"}
    for body in (b"not json", b"[1]", b'{"body": 5}', b'{"text": "hi"}', b'{}'):
        r = server.post(f"/api/projects/{PROJECT}/messages", content=body, headers=h)
        assert r.status_code == 400, body
        assert r.json()["error"]["code"] == "invalid_input"
    # ids are held to the reference's ID pattern, and a long one is not echoed back
    for field, value in (("in_reply_to", "x" * 5000), ("in_reply_to", "msg 1"), ("task_id", ""), ("task_id", 7)):
        r = server.post(f"/api/projects/{PROJECT}/messages", json={"body": "hi", field: value}, headers=h)
        assert r.status_code == 400 and r.json()["error"] == {
            "code": "invalid_input", "message": f"{field} must be an id: 1 to 64 letters, digits, '_' or '-'"}
    assert world.db.scalar("SELECT count(*) FROM messages") == 0


def test_signin_link_becomes_a_session_cookie_once(server, world):
    link = prickle.signin_link(world.db, prickle.Settings(), "ren", 8321)
    path = link.split("8321", 1)[1]
    r = server.get(path, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/"
    cookie = r.headers["set-cookie"]
    assert "prickle_session=prk_ss_" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
    me = server.get("/api/me")
    assert me.json()["person"]["handle"] == "ren"
    again = server.get(path, follow_redirects=False)
    assert again.status_code == 303 and again.headers["location"] == "/?signin=used"
    assert server.get(path, headers={"Accept": "application/json"}).status_code == 401
    # writes with the cookie need our own origin
    r = server.post(f"/api/projects/{PROJECT}/messages", json={"body": "hi"})
    assert r.status_code == 403
    r = server.post(f"/api/projects/{PROJECT}/messages", json={"body": "hi"}, headers={"Origin": "http://evil.example"})
    assert r.status_code == 403
    r = server.post(f"/api/projects/{PROJECT}/messages", json={"body": "hi"},
                    headers={"Origin": "http://127.0.0.1:8321"})
    assert r.status_code == 200
    assert world.db.scalar("SELECT count(*) FROM messages") == 1
    r = server.post("/api/signout", json={}, headers={"Origin": "http://127.0.0.1:8321"})
    assert r.json() == {"signed_out": True}
    assert server.get("/api/me").status_code == 401


def test_events_long_poll_returns_new_outbox_rows(server, world):
    head = server.get(f"/api/projects/{PROJECT}/events", headers=auth(world, "oj")).json()["last_seq"]
    join = in_thread(server.get, f"/api/projects/{PROJECT}/events", params={"after": head, "wait": 10},
                     headers=auth(world, "oj"))
    import time
    time.sleep(0.3)
    server.post(f"/api/projects/{PROJECT}/messages", json={"body": "ping"}, headers=auth(world, "ren"))
    out = join().json()
    assert [e["type"] for e in out["events"]] == ["message.posted"]
    assert out["events"][0]["message"]["body"] == "ping" and out["last_seq"] == out["events"][0]["seq"]


def test_healthz(server):
    assert server.get("/healthz").json()["ok"] is True


def test_agents_and_keys(server, mcp, world):
    ren = auth(world, "ren")
    r = server.post("/api/agents", json={"name": "helper", "display_name": "Helper", "model": "gpt-5",
                                         "client": "codex", "role": "Tests",
                                         "capabilities": [{"kind": "repo", "name": "website"}],
                                         "projects": [PROJECT]}, headers=ren)
    assert r.status_code == 200 and r.json()["agent"]["agent_id"] == "ren/helper"
    agents = server.get("/api/agents", headers=ren).json()["agents"]
    assert [(a["agent_id"], a["projects"]) for a in agents] == [("ren/builder", [PROJECT]),
                                                               ("ren/helper", [PROJECT])]
    assert server.post("/api/agents", json={"name": "x", "display_name": "X", "model": "m", "client": "c",
                                            "projects": ["side"]}, headers=ren).status_code == 404
    minted = server.post("/api/keys", json={"agent_id": "ren/helper"}, headers=ren).json()
    assert minted["token"].startswith("prk_ck_") and minted["token"] in minted["claude_code"]
    assert minted["url"] == "http://127.0.0.1:8321/mcp"
    assert mcp.ok("ren/helper", "read_room", {"project": PROJECT}, token=minted["token"])
    assert server.post("/api/keys", json={"agent_id": "oj/muse"}, headers=ren).status_code == 403
    keys = server.get("/api/keys", headers=ren).json()["keys"]
    assert minted["id"] in [k["id"] for k in keys] and all("token" not in k for k in keys)
    assert server.delete(f"/api/keys/{minted['id']}", headers=auth(world, "oj")).status_code == 404
    assert server.delete(f"/api/keys/{minted['id']}", headers=ren).json()["revoked"] is True
    assert mcp.raw(minted["token"], "tools/list").status_code == 401
    r = server.post("/api/projects/side/agents", json={"agent_id": "ren/helper"}, headers=ren)
    assert r.status_code == 404


def test_memory_and_audit_from_the_api(server, world):
    oj = auth(world, "oj")
    r = server.post(f"/api/projects/{PROJECT}/memory", json={"key": "launch", "value": "Friday"}, headers=oj)
    assert r.json()["memory"] | {"updated_at": None} == {"key": "launch", "value": "Friday",
                                                         "provenance": "owner_approved", "updated_by": "oj",
                                                         "updated_at": None}
    assert server.delete(f"/api/projects/{PROJECT}/memory/launch", headers=oj).json()["retracted"] is True
    assert server.delete(f"/api/projects/{PROJECT}/memory/launch", headers=oj).status_code == 404
    page = server.get(f"/api/projects/{PROJECT}/audit", params={"limit": 2}, headers=oj).json()
    assert [e["type"] for e in page["entries"]] == ["memory.retracted", "memory.set"]
    assert page["chain"]["ok"] is True and page["chain"]["broken_at"] is None
    older = server.get(f"/api/projects/{PROJECT}/audit", params={"before": page["entries"][-1]["n"]},
                       headers=oj).json()["entries"]
    assert older[0]["n"] == page["entries"][-1]["n"] - 1
    assert "Friday" not in str(page)
    assert server.get(f"/api/projects/{PROJECT}/audit", headers=auth(world, "sam")).status_code == 404


def test_static_files_and_unknown_paths(server):
    assert server.get("/").status_code == 200
    r = server.get("/api/nothing")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = server.put("/api/me")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"


def test_events_after_a_position_it_cannot_continue_resync_from_the_head(server, world):
    url, h = f"/api/projects/{PROJECT}/events", auth(world, "oj")
    head = prickle.outbox_head(world.db)
    for after in (head + 1, 10**30):  # beyond the head (another database), and beyond any seq at all
        assert server.get(url, params={"after": after, "wait": 5}, headers=h).json() == {
            "events": [], "last_seq": head, "resync": "ahead"}
    assert server.get(url, params={"after": head}, headers=h).json() == {"events": [], "last_seq": head,
                                                                          "resync": None}
    later = prickle.utcnow() + datetime.timedelta(days=40)
    assert prickle.prune_outbox(world.db, datetime.timedelta(days=30), later) > 0
    for params in ({"after": 0}, {}):  # events after it were pruned
        assert server.get(url, params=params, headers=h).json() == {"events": [], "last_seq": head, "resync": "pruned"}
    assert server.get(url, params={"after": "²"}, headers=h).json()["error"]["code"] == "invalid_input"


def test_healthz_lists_nothing_degraded_when_all_is_well(server):
    assert server.get("/healthz").json()["degraded"] == []


def _refused(error, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except error as e:
        return e.message
    raise AssertionError(f"{fn.__name__} did not refuse")


def test_who_may_do_it_is_decided_in_the_operation(world):
    db, oj, ren, sam = world.db, world.person("oj"), world.person("ren"), world.person("sam")
    audit = db.scalar("SELECT count(*) FROM audit")
    assert _refused(prickle.Forbidden, prickle.create_token, db, "client", agent_id="ren/builder",
                    by="oj") == "'ren/builder' is not your agent: only its owner makes its keys"
    assert _refused(prickle.Forbidden, prickle.add_agent_to_project, db, "oj-room", "ren/builder",
                    by=oj) == "'ren/builder' is not your agent: its owner adds it"
    _refused(prickle.NotFound, prickle.add_agent_to_project, db, "side", "oj/muse", by=oj)
    assert _refused(prickle.Forbidden, prickle.add_agent, db, "ren/helper", "Helper", "gpt-5", "codex",
                    by=oj) == "'ren/helper' is not your agent: name it oj/NAME"
    _refused(prickle.NotFound, prickle.add_agent, db, "oj/helper", "Helper", "gpt-5", "codex", projects=["side"],
             by=oj)
    _refused(prickle.NotFound, prickle.add_member, db, PROJECT, "sam", by=sam)
    assert _refused(prickle.Forbidden, prickle.add_member, db, PROJECT, "sam",
                    by=ren) == "only an owner of 'website-v2' can add teammates"
    _refused(prickle.NotFound, prickle.set_memory, db, PROJECT, "launch", "Friday", sam)
    _refused(prickle.NotFound, prickle.retract_memory, db, PROJECT, "tone", sam)
    _refused(prickle.NotFound, prickle.audit_page, db, sam, PROJECT, None, 10)
    assert db.scalar("SELECT count(*) FROM audit") == audit  # nothing was written
    assert db.one("SELECT 1 FROM agents WHERE agent_id = 'oj/helper'") is None
    assert prickle.set_memory(db, PROJECT, "launch", "Friday", ren)["updated_by"] == "ren"
    assert prickle.audit_page(db, ren, PROJECT, None, 1)["entries"][0]["type"] == "memory.set"


def test_a_sign_in_link_opens_one_session(world):
    _, link = prickle.create_token(world.db, "signin", person="ren")
    session = prickle.spend_signin_link(world.db, link, datetime.timedelta(days=1))
    assert prickle.resolve_token(world.db, session, ("session",)).handle == "ren"
    assert _refused(prickle.Unauthorized, prickle.spend_signin_link, world.db, link, datetime.timedelta(days=1)) == (
        "this sign-in link was already used: get a new one with 'prickle signin-link HANDLE'")
    assert world.db.scalar("SELECT count(*) FROM credentials WHERE kind = 'session' AND person = 'ren'") == 1


def test_a_live_reader_is_checked_on_every_turn(world):
    db, ren, sam = world.db, world.person("ren"), world.person("sam")
    assert _refused(prickle.NotFound, prickle.live_position, db, sam, PROJECT, "0") == (
        "project 'website-v2' not found: it does not exist or 'sam' is not in it")
    start, gap = prickle.live_position(db, ren, PROJECT, "0")
    assert (start, gap) == (0, None)
    prickle.set_memory(db, PROJECT, "launch", "Friday", "oj")
    assert prickle.live_events(db, ren, PROJECT, start) == prickle.read_events(db, PROJECT, start)
    _refused(prickle.NotFound, prickle.live_events, db, sam, PROJECT, start)
    prickle.revoke_token(db, ren.credential_id)
    assert _refused(prickle.Unauthorized, prickle.live_events, db, ren, PROJECT, start) == (
        "this credential was revoked: ask its owner for a new one")


def test_a_persons_feed_reads_only_their_projects_events_through_the_project_index(world):
    db, sam = world.db, world.person("sam")
    for n in range(30):
        prickle.post_message(db, sam, "side", f"side note {n}")
    mine = prickle.post_message(db, world.person("oj"), PROJECT, "for the website")
    read = []
    db.conn.exec_trace = lambda cursor, sql, bindings: read.append((sql, bindings)) or True
    try:
        events = prickle.person_events(db, world.person("oj"), 0, limit=5)
    finally:
        db.conn.exec_trace = None
    assert {e["project"] for e in events} <= {PROJECT, "oj-room"} and len(events) == 5  # oj's projects only
    assert [e["seq"] for e in events] == sorted(e["seq"] for e in events)
    assert prickle.person_events(db, world.person("oj"), events[-1]["seq"], limit=500)[-1]["message"]["id"] == mine["id"]
    plans = [" ".join(str(r["detail"]) for r in db.rows("EXPLAIN QUERY PLAN " + sql, bindings))
             for sql, bindings in read if "FROM outbox" in sql]
    assert plans and all("USING INDEX outbox_by_project" in p and "SCAN outbox" not in p for p in plans), plans
