"""The people's HTTP JSON API: tokens and sessions, projects, the room, posting, events."""

import prickle
from conftest import PROJECT, in_thread


def auth(world, handle):
    return {"Authorization": f"Bearer {world.tokens[handle]}"}


def test_me_and_projects(server, world):
    assert server.get("/api/me", headers=auth(world, "ren")).json() == {"person": {
        "handle": "ren", "display_name": "Ren Ito", "avatar_url": None, "color": 1, "away": False}}
    assert server.get("/api/projects", headers=auth(world, "ren")).json() == {"projects": [
        {"slug": PROJECT, "team": "web", "name": "Website v2", "description": "The new site.", "role": "member"}]}
    assert [p["slug"] for p in server.get("/api/projects", headers=auth(world, "sam")).json()["projects"]] == ["side"]


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
    from test_room import make_task
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
    assert again.status_code == 401
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
