"""Share rules (chapter 15): an owner shares their agents' task threads with the project's other members' agents
(read only); loosening needs a step-up, and ``share_rule.set`` records the new and previous decision truly."""

import datetime as dt

import prickle

from conftest import PROJECT, audit_entries
from helpers import P, T0, confirm_with, confirmed, person, routed


def test_loosening_a_share_rule_needs_a_step_up_and_tightening_does_not(server, world, clock):
    ren = person(server, world, "ren")
    assert ren.get(f"/api/projects/{PROJECT}/share-rule").json() == {
        "project": PROJECT, "decision": "default", "decisions": ["default", "threads"]}
    r = ren.post(f"/api/projects/{PROJECT}/share-rule", {"decision": "threads"})
    assert (r.status_code, r.json()["error"]["code"]) == (403, "step_up_required")
    assert r.json()["error"]["message"] == ("confirm it's you to share more with this project; a confirmation then "
                                            "holds 5 minutes for the session or token that made it")
    assert audit_entries(world.db, PROJECT, "share_rule.set") == []
    ren = confirmed(server, world, "ren")
    assert ren.post(f"/api/projects/{PROJECT}/share-rule", {"decision": "threads"}).json() == {
        "project": PROJECT, "decision": "threads", "previous": "default", "step_up": True}
    clock.now = T0 + dt.timedelta(minutes=6)  # the step-up lapsed: tightening needs none
    assert ren.post(f"/api/projects/{PROJECT}/share-rule", {"decision": "default"}).json() == {
        "project": PROJECT, "decision": "default", "previous": "threads", "step_up": False}
    # the same decision again changes nothing and writes nothing
    assert ren.post(f"/api/projects/{PROJECT}/share-rule", {"decision": "default"}).json()["previous"] == "default"
    assert [e["refs"] for e in audit_entries(world.db, PROJECT, "share_rule.set")] == [
        {"owner": "ren", "decision": "threads", "previous": "default", "step_up": True},
        {"owner": "ren", "decision": "default", "previous": "threads", "step_up": False}]
    bad = ren.post(f"/api/projects/{PROJECT}/share-rule", {"decision": "everything"})
    assert (bad.status_code, bad.json()["error"]["message"]) == (400, "decision must be 'default' or 'threads'")
    assert person(server, world, "sam").post(f"/api/projects/{PROJECT}/share-rule",
                                             {"decision": "default"}).status_code == 404
    with world.db.transaction():
        room = prickle.ensure_room(world.db, "ren")  # ren's private room
    r = ren.post(f"/api/projects/{room}/share-rule", {"decision": "default"})
    assert (r.status_code, r.json()["error"]["message"]) == (400, "project: a private room has no other members to "
                                                                  "share with")
    assert confirm_with(ren, ren.authenticator).status_code == 200


def test_a_shared_thread_is_readable_by_other_members_agents_but_never_listed_or_open_to_posting(mcp, server, world):
    task = routed(mcp, server, world)  # oj/muse asked ren/builder
    thread = P | {"task_id": task["id"]}
    assert mcp.error("oj/scout", "read_room", thread, "not_found")
    mcp.ok("ren/builder", "post_message", P | {"task_id": task["id"], "body": "On it."})
    oj = confirmed(server, world, "oj")
    assert oj.post(f"/api/projects/{PROJECT}/share-rule", {"decision": "threads"}).status_code == 200
    # oj's own other agent gains nothing: the rule shares with the project's other members
    assert mcp.error("oj/scout", "read_room", thread, "not_found")
    ren = confirmed(server, world, "ren")
    assert ren.post(f"/api/projects/{PROJECT}/share-rule", {"decision": "threads"}).status_code == 200
    read = mcp.ok("oj/scout", "read_room", thread)
    assert [m["body"] for m in read["messages"]] == ["On it."]
    general = mcp.ok("oj/scout", "read_room", P)
    assert task["id"] not in {m.get("task_id") for m in general["messages"]}
    assert mcp.error("oj/scout", "post_message", P | {"task_id": task["id"], "body": "hi"}, "not_found")
    ren.post(f"/api/projects/{PROJECT}/share-rule", {"decision": "default"})
    assert mcp.error("oj/scout", "read_room", thread, "not_found")
