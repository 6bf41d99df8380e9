"""Results and evidence: return_result's rules, the evidence report, rejecting and accepting a result's
revisions, and no acceptance without evidence that covers every criterion."""

import datetime as dt

import pytest

import prickle
from conftest import PROJECT, audit_entries
from helpers import PACKET, SHA, P, evidence, person, start, submit, wait_kinds, working

COMMIT = "b" * 40


def test_return_result_rules(mcp, server, world):
    task = working(mcp, server, world)
    base = {"task_id": task["id"], "summary": "Done."}
    cases = [
        ({"evidence": [{"kind": "link", "summary": "See it"}]}, "evidence[0]: a link needs a url or content"),
        ({"evidence": [evidence([2])]}, "evidence[0].criteria: the task has 2 acceptance criteria"),
        ({"evidence": [evidence([0], artifact=1)], "artifacts": [{"ref": "a", "sha256": SHA}]},
         "evidence[0].artifact: there is no artifacts[1]"),
        ({"evidence": [evidence([0])], "artifacts": [{"ref": "a"}]}, "artifacts[0]: pin 'a' by sha256 or commit_sha"),
        ({"evidence": [evidence([0], observed_at="2999-01-01T00:00:00Z")]}, "is in the future"),
    ]
    for extra, message in cases:
        text = mcp.error("ren/builder", "return_result", base | extra, "invalid_input")
        assert message in text, text
    mcp.error("ren/builder", "return_result", base | {"evidence": [evidence([0])], "provenance": "owner_approved"},
              "invalid_input")
    mcp.error("oj/muse", "return_result", base | {"evidence": [evidence([0])]}, "forbidden")
    assert world.db.scalar("SELECT count(*) FROM submissions") == 0


def test_code_needs_a_commit(mcp, world):
    packet = PACKET | {"deliverable_type": "code"}
    task = mcp.ok("oj/muse", "handoff", P | {"to": "oj/scout", "packet": packet})["task"]
    mcp.ok("oj/scout", "accept_task", {"task_id": task["id"]})
    args = {"task_id": task["id"], "summary": "Built.", "evidence": [evidence([0, 1])]}
    text = mcp.error("oj/scout", "return_result", args | {"artifacts": [{"ref": "a.py", "sha256": SHA}]},
                     "invalid_input")
    assert "code needs a commit" in text
    out = mcp.ok("oj/scout", "return_result", args | {"artifacts": [{"ref": "main", "commit_sha": COMMIT}]})
    assert out["submission"]["artifacts"] == [{"ref": "main", "sha256": None, "commit_sha": COMMIT}]


def test_evidence_report(mcp, server, world):
    task = working(mcp, server, world)
    old = (prickle.utcnow() - dt.timedelta(days=8)).strftime("%Y-%m-%dT%H:%M:%SZ")
    out = submit(mcp, task["id"], [evidence([0], observed_at=old), evidence(), evidence([0, 0])])
    result = out["task"]["result"]
    assert result["evidence_report"] == {
        "coverage": [{"criterion": 0, "evidence": [0, 2]}, {"criterion": 1, "evidence": []}],
        "general": [1], "uncovered": [1], "stale": [{"evidence": 0, "why": "older_than_7_days"}],
        "complete": False}
    first_returned = result["returned_at"]
    second = submit(mcp, task["id"], [evidence([0], observed_at=first_returned[:-5] + "Z"), evidence([1])])
    report = second["task"]["result"]["evidence_report"]
    assert report["stale"] == [{"evidence": 0, "why": "before_previous_revision"}] or report["stale"] == []
    third = submit(mcp, task["id"], [evidence([0, 1])])["task"]["result"]
    assert third["evidence_report"] == {"coverage": [{"criterion": 0, "evidence": [0]},
                                                     {"criterion": 1, "evidence": [0]}],
                                        "general": [], "uncovered": [], "stale": [], "complete": True}


def test_untagged_evidence_covers_the_only_criterion(mcp, world):
    packet = PACKET | {"acceptance_criteria": ["One thing."]}
    task = mcp.ok("oj/muse", "handoff", P | {"to": "oj/scout", "packet": packet})["task"]
    mcp.ok("oj/scout", "accept_task", {"task_id": task["id"]})
    out = mcp.ok("oj/scout", "return_result", {"task_id": task["id"], "summary": "Done.",
                                               "evidence": [{"kind": "note", "summary": "Checked."}]})
    assert out["task"]["result"]["evidence_report"]["coverage"] == [{"criterion": 0, "evidence": [0]}]
    assert out["task"]["result"]["evidence_report"]["complete"] is True


def test_full_life_with_rejection_resubmission_and_final_acceptance(mcp, server, world):
    task = working(mcp, server, world)
    muse = start(mcp, "oj/muse")
    first = submit(mcp, task["id"])
    assert (first["task"]["state"], first["submission"]["revision"]) == ("verifying", 1)
    assert first["task"]["result"]["status"] == "submitted"
    assert wait_kinds(mcp, "oj/muse", muse) == [("result", task["id"])]
    builder = start(mcp, "ren/builder", "wait_for_mention")
    sub1 = first["submission"]
    out = mcp.ok("oj/muse", "reject_result", {"task_id": task["id"], "submission_id": sub1["submission_id"],
                                              "revision": 1, "reason": "The headline has 11 words; the limit is 8.",
                                              "verdicts": [{"criterion": 0, "accepted": False, "note": "11 words."}]})
    assert out["task"]["state"] == "working"
    assert out["task"]["result"]["status"] == "rejected"
    assert out["task"]["result"]["reason"] == "The headline has 11 words; the limit is 8."
    assert wait_kinds(mcp, "ren/builder", builder, "wait_for_mention") == [("task", task["id"])]
    verdicts = [{"criterion": 0, "accepted": True}, {"criterion": 1, "accepted": True}]
    text = mcp.error("oj/muse", "accept_result", {"task_id": task["id"], "submission_id": sub1["submission_id"],
                                                  "revision": 1, "verdicts": verdicts, "artifacts": sub1["artifacts"]},
                     "stale_submission")
    assert "was rejected and can never be accepted" in text
    second = submit(mcp, task["id"])
    sub2 = second["submission"]
    assert sub2["revision"] == 2
    args = {"task_id": task["id"], "submission_id": sub2["submission_id"], "revision": 2, "verdicts": verdicts,
            "artifacts": sub2["artifacts"]}
    text = mcp.error("oj/muse", "accept_result", args | {"submission_id": sub1["submission_id"], "revision": 1},
                     "stale_submission")
    assert "can never be accepted" in text
    mcp.error("oj/muse", "accept_result", args | {"revision": 1}, "stale_submission")
    mcp.error("oj/muse", "accept_result", args | {"artifacts": [{"ref": "docs/hero.md", "sha256": "c" * 64}]},
              "stale_submission")
    mcp.error("oj/muse", "accept_result", args | {"verdicts": verdicts[:1]}, "invalid_input")
    text = mcp.error("oj/muse", "accept_result", args | {"verdicts": [verdicts[0], {"criterion": 1,
                                                                                   "accepted": False}]},
                     "invalid_input")
    assert "reject_result" in text
    mcp.error("ren/builder", "accept_result", args, "forbidden")
    refused = audit_entries(world.db, PROJECT, "result.acceptance_refused")
    assert [e["refs"]["reason"] for e in refused] == ["rejected", "rejected", "not_latest", "artifacts_changed",
                                                      "not_yours"]
    verified = mcp.ok("oj/muse", "accept_result", args)["task"]
    assert (verified["state"], verified["waiting_on"]) == ("approval", "owner_approval")
    assert verified["result"]["verified_by"] == {"kind": "agent", "agent_id": "oj/muse"}
    assert verified["result"]["verdicts"] == verdicts and verified["result"]["status"] == "submitted"
    oj, ren = person(server, world, "oj"), person(server, world, "ren")
    assert ren.post(f"/api/tasks/{task['id']}/accept").status_code == 403      # not the requester's owner
    done = oj.post(f"/api/tasks/{task['id']}/accept")
    assert done.status_code == 200, done.text
    final = done.json()["task"]
    assert (final["state"], final["waiting_on"]) == ("completed", None)
    assert final["result"]["status"] == "accepted" and final["result"]["provenance"] == "owner_approved"
    assert final["result"]["decided_by"] == {"kind": "person", "handle": "oj"}
    assert [e["refs"]["to"] for e in audit_entries(world.db, PROJECT, "task.transitioned")
            if e["refs"]["task"] == task["id"]] == [
        "approval", "routed", "accepted", "verifying", "working", "verifying", "approval", "completed"]
    assert [e["refs"]["step"] for e in audit_entries(world.db, PROJECT, "result.accepted")] == [
        "verified", "owner_accepted"]
    detail = oj.get(f"/api/tasks/{task['id']}").json()
    assert [s["status"] for s in detail["submissions"]] == ["rejected", "accepted"]
    assert oj.post(f"/api/tasks/{task['id']}/cancel").status_code == 409


def test_an_evidence_url_must_be_a_uri(mcp, server, world):
    task = working(mcp, server, world)
    text = mcp.error("ren/builder", "return_result", {"task_id": task["id"], "summary": "x", "evidence": [
        {"kind": "link", "summary": "l", "url": "not a url", "criteria": [0, 1]}]}, "invalid_input")
    assert text.startswith("invalid_input: evidence[0].url:")


def test_the_uri_check_holds_without_a_format_library(mcp, server, world):
    task = working(mcp, server, world)
    with pytest.raises(prickle.InvalidInput, match=r"^evidence\[0\]\.url: 'not a url' is not an absolute URI"):
        prickle.return_result(world.db, world.actor("ren/builder"), task["id"], "x",
                              [{"kind": "link", "summary": "l", "url": "not a url"}])


def test_a_result_for_a_person_waits_on_that_person(mcp, server, world):
    r = person(server, world, "ren").post(f"/api/projects/{PROJECT}/task-requests",
                                          {"agent": "ren/builder", "packet": PACKET})
    task = r.json()["task"]
    mcp.ok("ren/builder", "accept_task", {"task_id": task["id"]})
    out = submit(mcp, task["id"])["task"]
    assert (out["state"], out["waiting_on"]) == ("verifying", "owner_approval")


# -- no acceptance without evidence ----------------------------------------------


def all_accepted(mcp, task_id, sub, code=None):
    args = {"task_id": task_id, "submission_id": sub["submission_id"], "revision": sub["revision"],
            "verdicts": [{"criterion": 0, "accepted": True}, {"criterion": 1, "accepted": True}],
            "artifacts": sub["artifacts"]}
    return mcp.error("oj/muse", "accept_result", args, code) if code else mcp.ok("oj/muse", "accept_result", args)


@pytest.mark.parametrize("auto_accept", [False, True])
def test_a_result_with_uncovered_or_stale_criteria_cant_be_verified(mcp, server, world, auto_accept):
    person(server, world, "oj").post("/api/policy", {"auto_accept": auto_accept})
    task = working(mcp, server, world)
    old = (prickle.utcnow() - dt.timedelta(days=8)).strftime("%Y-%m-%dT%H:%M:%SZ")
    cases = [  # evidence, what the refusal names, its refs
        ([evidence([0])], "no evidence covers criterion 1", [1], []),
        ([{"kind": "note", "summary": "Looks fine."}], "no evidence covers criterion 0, 1", [0, 1], []),
        ([evidence([0]), evidence([1], observed_at=old)], "evidence 1 is stale (for criterion 1)", [], [1]),
        ([evidence([0, 1], observed_at=old), evidence()], "evidence 0 is stale "
         "(for criterion 0, 1)", [], [0, 1]),
    ]
    for items, named, uncovered, stale in cases:
        sub = submit(mcp, task["id"], items)["submission"]
        before = len(audit_entries(world.db, PROJECT))
        text = all_accepted(mcp, task["id"], sub, "evidence_incomplete")
        assert text == (f"evidence_incomplete: submission '{sub['submission_id']}' revision {sub['revision']} can't "
                        f"be verified: its evidence report is not complete ({named}); send it back with "
                        "reject_result and ask for fresh evidence tagged with each criterion it supports")
        # Only the refusal's entry was written; the task and the submission are as they were.
        entries = audit_entries(world.db, PROJECT)[before:]
        assert [(e["type"], e["refs"]) for e in entries] == [("result.acceptance_refused", {
            "task": task["id"], "action": "accept", "reason": "evidence_incomplete",
            "asked": {"submission": sub["submission_id"], "revision": sub["revision"]},
            "latest": {"submission": sub["submission_id"], "revision": sub["revision"]},
            "uncovered": uncovered, "stale": stale})]
        now = prickle.task_out(world.db, task["id"])
        assert (now["state"], now["waiting_on"], now["result"]["status"]) == ("verifying", "agent", "submitted")
        assert (now["result"]["verdicts"], now["result"]["verified_by"], now["result"]["decided_by"]) == ([], None, None)
    assert audit_entries(world.db, PROJECT, "result.accepted") == []
    # Sending it back still works; a complete report is verified (and, with the policy, completed).
    sub = submit(mcp, task["id"], [evidence([0]), evidence([1])])["submission"]
    out = all_accepted(mcp, task["id"], sub)["task"]
    assert out["state"] == ("completed" if auto_accept else "approval")
    assert [e["refs"]["step"] for e in audit_entries(world.db, PROJECT, "result.accepted")] == (
        ["verified", "policy"] if auto_accept else ["verified"])


def test_a_note_is_no_evidence_where_the_deliverable_needs_more_and_never_auto_accepted(mcp, server, world):
    # Code: notes tagged to every criterion cover none of them, so the result can't be verified.
    code = mcp.ok("oj/muse", "handoff", P | {"to": "oj/scout", "packet": PACKET | {"deliverable_type": "code"}})["task"]
    mcp.ok("oj/scout", "accept_task", {"task_id": code["id"]})
    notes = [{"kind": "note", "summary": "Works on my machine.", "criteria": [0, 1]}]
    out = mcp.ok("oj/scout", "return_result", {"task_id": code["id"], "summary": "Built.", "evidence": notes,
                                               "artifacts": [{"ref": "a.py", "commit_sha": COMMIT}]})
    assert out["task"]["result"]["evidence_report"] == {
        "coverage": [{"criterion": 0, "evidence": []}, {"criterion": 1, "evidence": []}], "general": [0],
        "uncovered": [0, 1], "stale": [], "complete": False}
    # A doc: a bare "." says nothing, so it covers nothing either.
    doc = working(mcp, server, world)
    bare = submit(mcp, doc["id"], [{"kind": "note", "summary": ".", "criteria": [0, 1]}])["task"]["result"]
    assert (bare["evidence_report"]["uncovered"], bare["evidence_report"]["complete"]) == ([0, 1], False)
    # Notes in words cover a doc's criteria; with auto-accept on, a person still gives final acceptance.
    assert person(server, world, "oj").post("/api/policy", {"auto_accept": True}).json()["auto_accept"] is True
    sub = submit(mcp, doc["id"], [{"kind": "note", "summary": "Headline has six words.", "criteria": [0]},
                                  {"kind": "note", "summary": "The CTA asks to try the demo.", "criteria": [1]}]
                 )["submission"]
    task = mcp.ok("oj/muse", "accept_result", {"task_id": doc["id"], "submission_id": sub["submission_id"],
                                               "revision": sub["revision"], "artifacts": sub["artifacts"],
                                               "verdicts": [{"criterion": 0, "accepted": True},
                                                            {"criterion": 1, "accepted": True}]})["task"]
    assert (task["state"], task["waiting_on"], task["result"]["decided_by_policy"]) == (
        "approval", "owner_approval", None)


def test_a_refusal_of_what_is_not_yours_records_the_submission_asked_for_and_the_latest(mcp, server, world):
    task = working(mcp, server, world)
    sub = submit(mcp, task["id"])["submission"]
    mcp.error("oj/scout", "accept_result", {"task_id": task["id"], "submission_id": sub["submission_id"],
                                            "revision": 1, "verdicts": [{"criterion": 0, "accepted": True},
                                                                        {"criterion": 1, "accepted": True}],
                                            "artifacts": sub["artifacts"]}, "not_found")
    prickle.post_message(world.db, world.person("oj"), PROJECT, "@scout have a look", task_id=task["id"])
    mcp.error("oj/scout", "reject_result", {"task_id": task["id"], "submission_id": sub["submission_id"],
                                            "revision": 1, "reason": "Not mine to say."}, "forbidden")
    [refused] = audit_entries(world.db, PROJECT, "result.acceptance_refused")
    assert refused["refs"] == {"task": task["id"], "action": "reject", "by": "oj/scout", "reason": "not_yours",
                               "asked": {"submission": sub["submission_id"], "revision": 1},
                               "latest": {"submission": sub["submission_id"], "revision": 1}}


def test_each_criterion_comes_with_the_evidence_that_covers_it_and_pictures_to_preview(mcp, server, world):
    packet = PACKET | {"acceptance_criteria": ["Builds.", "Looks right.", "Fast."]}
    task = mcp.ok("oj/muse", "handoff", P | {"to": "oj/scout", "packet": packet})["task"]
    mcp.ok("oj/scout", "accept_task", {"task_id": task["id"]})
    old = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=9)).strftime("%Y-%m-%dT%H:%M:%SZ")
    oj = person(server, world, "oj")
    assert oj.get(f"/api/tasks/{task['id']}").json()["criteria_evidence"] is None  # no result yet
    mcp.ok("oj/scout", "return_result", {"task_id": task["id"], "summary": "Done.", "evidence": [
        {"kind": "link", "summary": "The build", "url": "https://ci.example/build/7", "criteria": [0]},
        {"kind": "test_output", "summary": "Tests", "content": "12 passed", "criteria": [0, 1]},
        {"kind": "screenshot", "summary": "Home", "url": "https://img.example/shots/Home.PNG?v=2", "criteria": [2],
         "observed_at": old},
        {"kind": "screenshot", "summary": "Pinned", "content": "1280 by 800", "artifact": 0, "criteria": [1]},
        {"kind": "note", "summary": "A general remark."}],
        "artifacts": [{"ref": "https://img.example/a/b.webp", "sha256": SHA}]})
    view = oj.get(f"/api/tasks/{task['id']}").json()["criteria_evidence"]
    assert view == prickle.criteria_evidence(world.db.one("SELECT * FROM tasks WHERE id = ?", (task["id"],)),
                                             prickle.latest_submission(world.db, task["id"]))
    assert view["criteria"] == [
        {"criterion": 0, "text": "Builds.", "standing": "covered", "evidence": [0, 1], "verdict": None},
        {"criterion": 1, "text": "Looks right.", "standing": "covered", "evidence": [1, 3], "verdict": None},
        {"criterion": 2, "text": "Fast.", "standing": "stale", "evidence": [2], "verdict": None}]
    assert (view["revision"], view["complete"], view["general"]) == (1, False, [4])
    none = {"url": None, "content": None, "criteria": None, "artifact": None, "observed_at": None, "verifier": None,
            "stale": None, "artifact_ref": None, "preview": None}
    assert view["evidence"] == [
        none | {"evidence": 0, "kind": "link", "summary": "The build", "url": "https://ci.example/build/7",
                "criteria": [0]},
        none | {"evidence": 1, "kind": "test_output", "summary": "Tests", "content": "12 passed", "criteria": [0, 1]},
        none | {"evidence": 2, "kind": "screenshot", "summary": "Home", "url": "https://img.example/shots/Home.PNG?v=2",
                "criteria": [2], "observed_at": old, "stale": "older_than_7_days",
                "preview": "https://img.example/shots/Home.PNG?v=2"},
        none | {"evidence": 3, "kind": "screenshot", "summary": "Pinned", "content": "1280 by 800", "criteria": [1],
                "artifact": 0, "artifact_ref": "https://img.example/a/b.webp", "preview": "https://img.example/a/b.webp"},
        none | {"evidence": 4, "kind": "note", "summary": "A general remark."}]
    # Only an http(s) address of a picture is previewed.
    assert [prickle.image_url(u) for u in ("https://x.example/a.gif", "http://x.example/a.jpeg#top",
                                           "javascript:alert(1)//a.png", "ftp://x.example/a.png", "/a.png",
                                           "https://x.example/a.png.html", None)] == [
        "https://x.example/a.gif", "http://x.example/a.jpeg#top", None, None, None, None, None]
