"""The project story: moments marked by members, derived from the record and read from GitHub (a local
stand-in, tests/github_standin.py), and what owners hide."""

import datetime as dt
import json
import socket
import time

import pytest
from starlette.testclient import TestClient

import prickle
from conftest import PROJECT, all_events, audit_entries
from github_standin import GitHub, pull, release
from helpers import SHA, T0, make_task, person, written

DAY = dt.timedelta(days=1)


def story_events(db, after=0):
    return [{k: v for k, v in e.items() if k not in ("id", "seq", "at")} for e in all_events(db)
            if e["seq"] > after and e["type"] in ("moment.updated", "story.updated")]


def entries(db, after=0):
    return [(e["type"], e["refs"]) for e in audit_entries(db, PROJECT) if e["n"] > after
            and e["type"].split(".")[0] in ("moment", "story")]


def head(db):
    return db.scalar("SELECT coalesce(max(seq), 0) FROM outbox"), db.scalar(
        "SELECT coalesce(max(n), 0) FROM audit WHERE chain = ?", (PROJECT,))


def moments(db, who, **kw):
    return [m for d in prickle.story(db, who, PROJECT, **kw)["days"] for m in d["moments"]]


def titles(db, who, source=None, **kw):
    return [m["title"] for m in moments(db, who, **kw) if source in (None, m["source"])]


def complete(world, started, took):
    """A task oj/muse hands ren/builder at ``started``, completed ``took`` later (its result accepted)."""
    world.clock.now = started
    task_id = make_task(world)
    db = world.db
    prickle.accept_task(db, world.actor("ren/builder"), task_id)
    world.clock.now = started + took
    artifacts = [{"ref": "docs/hero.md", "sha256": SHA}]
    sub = prickle.return_result(db, world.actor("ren/builder"), task_id, "Done.",
                                [{"kind": "test_output", "summary": "ok", "content": "6 words"}], artifacts=artifacts)
    prickle.accept_result(db, world.actor("oj/muse"), task_id, sub["submission"]["submission_id"], 1,
                          [{"criterion": 0, "accepted": True}], artifacts)
    prickle.final_accept(db, world.person("oj"), task_id)
    return task_id


@pytest.fixture
def team(clock, world):
    world.clock = clock
    return world


# -- marked by members --------------------------------------------------------------------------------


def test_a_member_marks_edits_and_removes_a_moment_with_exact_events_and_entries(team):
    db, ren, oj = team.db, team.person("ren"), team.person("oj")
    message = prickle.post_message(db, ren, PROJECT, "We shipped the beta!")
    seq, n = head(db)
    out = prickle.mark_moment(db, ren, PROJECT, "launch", "2026-11-30", "  Beta is live  ", message_id=message["id"])
    moment = out["moment"]
    assert moment == {"id": moment["id"], "source": "member", "kind": "launch", "day": "2026-11-30",
                      "at": prickle.iso(T0), "title": "Beta is live", "message_id": message["id"], "task_id": None,
                      "url": None, "by": {"kind": "person", "handle": "ren", "display_name": "Ren Ito"},
                      "edited_at": None, "can_edit": True, "can_remove": True, "can_hide": False}
    assert entries(db, n) == [("moment.marked", {"moment": moment["id"], "kind": "launch", "day": "2026-11-30",
                                                 "role": "member", "by": "ren"})]
    assert story_events(db, seq) == [{"project": PROJECT, "type": "moment.updated", "moment_id": moment["id"],
                                      "change": "marked"}]
    # The owner sees it, may remove it but not edit it.
    seen = next(m for m in moments(db, oj) if m["id"] == moment["id"])
    assert (seen["can_edit"], seen["can_remove"], seen["can_hide"]) == (False, True, False)
    with pytest.raises(prickle.Forbidden, match="only the member who marked this moment may edit it"):
        prickle.edit_moment(db, oj, moment["id"], {"title": "Mine now"})

    seq, n = head(db)
    edited = prickle.edit_moment(db, ren, moment["id"], {"title": "Beta is live!", "day": "2026-11-29",
                                                         "kind": "launch", "message_id": None})
    assert edited["changed"] and edited["moment"]["title"] == "Beta is live!"
    assert (edited["moment"]["day"], edited["moment"]["message_id"]) == ("2026-11-29", None)
    assert entries(db, n) == [("moment.edited", {"moment": moment["id"], "fields": ["day", "link", "title"],
                                                 "by": "ren"})]
    assert story_events(db, seq) == [{"project": PROJECT, "type": "moment.updated", "moment_id": moment["id"],
                                      "change": "edited"}]
    # Nothing changed: nothing written.
    assert not prickle.edit_moment(db, ren, moment["id"], {"title": "Beta is live!"})["changed"]
    assert head(db) == (seq + 1, n + 1)

    mine = prickle.mark_moment(db, oj, PROJECT, "decision", "2026-12-01", "We keep the old logo")["moment"]
    with pytest.raises(prickle.Forbidden, match="only the member who marked this moment, or a project owner"):
        prickle.remove_moment(db, ren, mine["id"])
    seq, n = head(db)
    assert prickle.remove_moment(db, oj, moment["id"]) == {"removed": moment["id"], "by": "owner"}
    assert prickle.remove_moment(db, oj, mine["id"]) == {"removed": mine["id"], "by": "marker"}
    assert entries(db, n) == [("moment.removed", {"moment": moment["id"], "removed_by": "owner", "by": "oj"}),
                              ("moment.removed", {"moment": mine["id"], "removed_by": "marker", "by": "oj"})]
    assert story_events(db, seq) == [
        {"project": PROJECT, "type": "moment.updated", "moment_id": moment["id"], "change": "removed"},
        {"project": PROJECT, "type": "moment.updated", "moment_id": mine["id"], "change": "removed"}]
    assert titles(db, ren, "member") == []
    # No agent is woken by the story's events.
    assert db.scalar("SELECT count(*) FROM wakes WHERE seq > ?", (seq - 3,)) == 0


def test_bad_input_is_a_clear_error_and_changes_nothing(team, server):
    ren, oj, sam = (person(server, team, h) for h in ("ren", "oj", "sam"))
    path = f"/api/projects/{PROJECT}/moments"
    good = {"kind": "milestone", "day": "2026-11-30", "title": "First sketch"}
    mine = ren.post(path, good).json()["moment"]
    before = written(team.db)
    cases = [
        (ren.post(path, good | {"title": "x" * 141}), 400, "title is 141 characters long; at most 140: shorten it"),
        (ren.post(path, good | {"title": "   "}), 400, "title is empty: say in a few words what happened"),
        (ren.post(path, good | {"title": "\u200b\u200b"}), 400, "title is empty: say in a few words what happened"),
        (ren.post(path, good | {"title": " \u2060\ufeff\u00ad \u3164"}), 400,
         "title is empty: say in a few words what happened"),
        (ren.post(f"/api/moments/{mine['id']}", {"title": "\u200b"}), 400,
         "title is empty: say in a few words what happened"),
        (ren.post(path, good | {"day": "0001-01-01"}), 400,
         "day 0001-01-01 is too early: a moment marks a day from 1970-01-01 on"),
        (ren.post(path, good | {"day": "1969-12-31"}), 400,
         "day 1969-12-31 is too early: a moment marks a day from 1970-01-01 on"),
        (ren.post(path, good | {"title": "two\nlines"}), 400,
         "title: write it on one line, without line breaks, tabs or control characters"),
        (ren.post(path, good | {"day": "2026-12-03"}), 400,
         "day 2026-12-03 is in the future: a moment marks what happened, today at the latest"),
        (ren.post(path, good | {"day": "30/11/2026"}), 400, "day must be a date like 2026-12-01, got '30/11/2026'"),
        (ren.post(path, good | {"day": "2026-W48-1"}), 400, "day must be a date like 2026-12-01, got '2026-W48-1'"),
        (ren.post(path, good | {"day": "2026-02-30"}), 400, "day must be a date like 2026-12-01, got '2026-02-30'"),
        (ren.post(path, good | {"kind": "party"}), 400,
         "kind must be one of milestone, launch, release, decision, incident, thanks, other; got 'party'"),
        (ren.post(path, good | {"message_id": "msg-nope"}), 404, "message_id: no message 'msg-nope' in 'website-v2'"),
        (ren.post(path, good | {"task_id": "t", "message_id": "m"}), 400,
         "link a moment to a message or to a task, not both: send message_id or task_id"),
        (ren.post(path, good | {"colour": "red"}), 400,
         "unknown field colour: send kind, day, title, message_id, task_id"),
        (sam.post(path, good), 404, "project 'website-v2' not found: it does not exist or 'sam' is not in it"),
        (oj.post(f"/api/moments/{mine['id']}", {"title": "Not yours"}), 403,
         "only the member who marked this moment may edit it; a project owner may remove it"),
        (sam.delete(f"/api/moments/{mine['id']}"), 404, f"no moment '{mine['id']}' in a project of yours"),
        (ren.post(f"/api/projects/{PROJECT}/story/hide", {"moment_id": "rec-joined-x"}), 403,
         "only a project owner may hide a moment from the story: ask one of the project's owners"),
        (ren.post(f"/api/projects/{PROJECT}/story/round-numbers", {"round_numbers": False}), 403,
         "only a project owner may turn round numbers on or off: ask one of the project's owners"),
        (oj.post(f"/api/projects/{PROJECT}/story/round-numbers", {"round_numbers": "no"}), 400,
         "round_numbers must be true (show the 100th message, the 10th completed task, …) or false"),
        (oj.post(f"/api/projects/{PROJECT}/story/hide", {"moment_id": mine["id"]}), 400,
         "moment_id: that moment was marked by a member: remove it instead of hiding it"),
        (oj.post(f"/api/projects/{PROJECT}/story/hide", {"moment_id": "rec-joined-nope"}), 404,
         "moment_id: no moment 'rec-joined-nope' in the story of 'website-v2'"),
        (oj.get(f"/api/projects/{PROJECT}/story?before=yesterday"), 400,
         "before must be a day like 2026-12-01, got 'yesterday'"),
        (oj.delete(f"/api/projects/{PROJECT}/story/repo"), 409,
         "no GitHub repository is linked to this project's story"),
    ]
    for r, status, message in cases:
        assert (r.status_code, r.json()["error"]["message"]) == (status, message)
    assert written(team.db) == before
    # Today in the world's latest time zone is not the future (T0 is 10:00 UTC: 2026-12-02 in Kiribati).
    assert ren.post(path, good | {"day": "2026-12-02"}).status_code == 200


# -- derived from the record --------------------------------------------------------------------------


def test_moments_derived_from_a_seeded_history_with_round_numbers_on_and_off(team):
    db, oj, ren = team.db, team.person("oj"), team.person("ren")
    first = complete(team, T0, dt.timedelta(days=5))                     # a long run, the first task and result
    for i in range(9):
        complete(team, T0 + dt.timedelta(days=6, hours=i), dt.timedelta(hours=1))
    tasks = [r["id"] for r in db.rows("SELECT id FROM tasks ORDER BY updated_at, id")]
    team.clock.now = T0 + dt.timedelta(days=7)
    for i in range(100 - db.scalar("SELECT count(*) FROM messages WHERE project = ?", (PROJECT,))):
        prickle.post_message(db, ren, PROJECT, f"note {i}")
    hundredth = db.one("SELECT id FROM messages WHERE project = ? ORDER BY seq LIMIT 1 OFFSET 99", (PROJECT,))["id"]
    derived = {(m["kind"], m["day"], m["title"], m["task_id"], m["message_id"]) for m in moments(db, ren)
               if m["source"] == "record"}
    assert derived == {
        ("joined", "2026-12-01", "Oj Okafor started the project", None, None),
        ("joined", "2026-12-01", "Ren Ito joined", None, None),
        ("first_task", "2026-12-01", "The first task: Draft the hero copy.", first, None),
        ("long_run", "2026-12-06", "Draft the hero copy. — completed after 5 days", first, None),
        ("first_result", "2026-12-06", "Builder's first accepted result: Draft the hero copy.", first, None),
        ("round_number", "2026-12-07", "The 10th completed task: Draft the hero copy.", tasks[9], None),
        ("round_number", "2026-12-08", "The 100th message", None, hundredth),
    }
    days = [d["day"] for d in prickle.story(db, ren, PROJECT)["days"]]
    assert days == sorted(days, reverse=True) == ["2026-12-08", "2026-12-07", "2026-12-06", "2026-12-01"]
    # Members see what owners chose: round numbers off, for everyone.
    seq, n = head(db)
    assert prickle.set_round_numbers(db, oj, PROJECT, False) == {"round_numbers": False, "changed": True}
    assert prickle.set_round_numbers(db, oj, PROJECT, False)["changed"] is False
    assert entries(db, n) == [("story.round_numbers_set", {"on": False, "by": "oj"})]
    assert story_events(db, seq) == [{"project": PROJECT, "type": "story.updated", "change": "round_numbers"}]
    for who in (oj, ren):
        assert not [m for m in moments(db, who) if m["kind"] == "round_number"]
        assert prickle.story(db, who, PROJECT)["round_numbers"] is False
    prickle.set_round_numbers(db, oj, PROJECT, True)
    assert len([m for m in moments(db, ren) if m["kind"] == "round_number"]) == 2
    assert entries(db, n + 1) == [("story.round_numbers_set", {"on": True, "by": "oj"})]
    # Paging by whole days: two moments asked, the newest day and the next come whole.
    page = prickle.story(db, ren, PROJECT, limit=2)
    assert ([d["day"] for d in page["days"]], page["next_before"]) == (["2026-12-08", "2026-12-07"], "2026-12-07")
    rest = prickle.story(db, ren, PROJECT, before=page["next_before"])
    assert ([d["day"] for d in rest["days"]], rest["next_before"]) == (["2026-12-06", "2026-12-01"], None)


def test_an_owner_hides_a_join_without_saying_whose_and_brings_every_hidden_moment_back(team):
    db, oj, ren = team.db, team.person("oj"), team.person("ren")
    join = next(m for m in moments(db, oj) if m["title"] == "Ren Ito joined")
    assert join["can_hide"] and join["id"].startswith("rec-joined-") and "ren" not in join["id"]
    with pytest.raises(prickle.Forbidden):
        prickle.hide_moment(db, ren, PROJECT, join["id"])
    seq, n = head(db)
    assert prickle.hide_moment(db, oj, PROJECT, join["id"]) == {"hidden": True, "source": "record", "kind": "joined"}
    assert entries(db, n) == [("moment.hidden", {"source": "record", "kind": "joined", "by": "oj"})]
    assert story_events(db, seq) == [{"project": PROJECT, "type": "story.updated", "change": "hidden"}]
    with pytest.raises(prickle.InvalidState, match="hidden already"):
        prickle.hide_moment(db, oj, PROJECT, join["id"])
    for who in (oj, ren):
        assert "Ren Ito joined" not in titles(db, who)
    assert (prickle.story(db, oj, PROJECT)["hidden"], prickle.story(db, ren, PROJECT)["hidden"]) == (1, None)
    seq, n = head(db)
    assert prickle.restore_hidden(db, oj, PROJECT) == {"restored": 1}
    assert prickle.restore_hidden(db, oj, PROJECT) == {"restored": 0}
    assert entries(db, n) == [("moment.restored", {"count": 1, "by": "oj"})]
    assert story_events(db, seq) == [{"project": PROJECT, "type": "story.updated", "change": "restored"}]
    assert "Ren Ito joined" in titles(db, ren)


# -- from GitHub --------------------------------------------------------------------------------------


@pytest.fixture
def github():
    gh = GitHub(per_page=2)
    gh.add("octo/site", [release(1, "2026-10-01"), release(2, "2026-11-01"), release(3, "2026-11-20", draft=True),
                         release(4, "2026-11-28"), release(5, "2026-11-29")],
           [pull(7, "2026-11-30"), pull(6, "2026-11-25", merged=False), pull(5, "2026-11-20"), pull(4, "2026-11-02")])
    gh.add("octo/docs", [release(9, "2026-11-15")], [])
    yield gh
    gh.close()


@pytest.fixture
def app(team, github):
    """The server, reading GitHub from the stand-in."""
    app = prickle.create_app(team.db_path, prickle.Settings(github_api_url=github.url), port=8321)
    with TestClient(app, base_url="http://127.0.0.1:8321") as client:
        yield client


def read(client, team, handle="oj"):
    r = person(client, team, handle).get(f"/api/projects/{PROJECT}/story")
    assert r.status_code == 200, r.text
    return r.json()


def gh_titles(out):
    return [m["title"] for d in out["days"] for m in d["moments"] if m["source"] == "github"]


GH_TITLES = ["Merged #7: Pull 7", "Released Version 5.0", "Released Version 4.0", "Merged #5: Pull 5",
             "Merged #4: Pull 4", "Released Version 2.0", "Released Version 1.0"]


def test_a_linked_repository_s_releases_and_merged_pulls_come_page_by_page_and_are_cached(team, app, github):
    oj = person(app, team, "oj")
    seq, n = head(team.db)
    r = oj.post(f"/api/projects/{PROJECT}/story/repo", {"repository": "https://github.com/Octo/site"})
    assert r.json() == {"repo": "octo/site", "replaced": False, "github_restored": 0, "changed": True}
    assert entries(team.db, n) == [("story.repo_linked", {"replaced": False, "github_restored": 0, "by": "oj"})]
    assert story_events(team.db, seq) == [{"project": PROJECT, "type": "story.updated", "change": "repo"}]
    # Three pages of releases and two of pulls, by the Link headers; drafts and closed-unmerged pulls left out.
    assert (github.fetched("releases"), github.fetched("pulls")) == (["1", "2", "3"], ["1", "2"])
    out = read(app, team, "ren")
    assert gh_titles(out) == GH_TITLES
    assert out["repo"] == {"name": "octo/site", "url": "https://github.com/octo/site"}
    assert out["github"] == {"state": "ok", "message": None, "fetched_at": prickle.iso(T0), "retry_at": None}
    pr = next(m for d in out["days"] for m in d["moments"] if m["title"] == "Merged #7: Pull 7")
    assert (pr["kind"], pr["day"], pr["at"], pr["url"], pr["author"], pr["can_hide"]) == (
        "pull_merged", "2026-11-30", "2026-11-30T15:30:00.000Z", "https://github.com/octo/site/pull/7", "octocat", False)
    # Cached: GitHub is asked again only after GITHUB_FRESH.
    asked = len(github.requests)
    read(app, team)
    assert len(github.requests) == asked
    team.clock.now = T0 + dt.timedelta(seconds=prickle.GITHUB_FRESH + 1)
    github.add("octo/site", [release(6, "2026-12-01")], [])
    assert gh_titles(read(app, team)) == ["Released Version 6.0"]
    assert len(github.requests) == asked + 2


def test_the_token_setting_is_sent_to_github(team, github, monkeypatch):
    monkeypatch.setenv("STORY_TOKEN", "ghp_test")
    settings = prickle.Settings(github_api_url=github.url, github_token_env="STORY_TOKEN")
    app = prickle.create_app(team.db_path, settings, port=8321)
    with TestClient(app, base_url="http://127.0.0.1:8321") as client:
        r = person(client, team, "oj").post(f"/api/projects/{PROJECT}/story/repo", {"repository": "octo/docs"})
        assert r.status_code == 200, r.text
    assert {q["authorization"] for q in github.requests} == {"Bearer ghp_test"}
    # A token GitHub refuses: the repository can't be read, a clear error.
    github.token = "ghp_other"
    with TestClient(prickle.create_app(team.db_path, settings, port=8321), base_url="http://127.0.0.1:8321") as client:
        r = person(client, team, "oj").post(f"/api/projects/{PROJECT}/story/repo", {"repository": "octo/site"})
    assert (r.status_code, r.json()["error"]["message"]) == (
        400, "repository: GitHub refused to let this server read 'octo/site' (401): the server's GitHub token "
             "(github_token_env) is missing, wrong or lacks access")


def test_a_rate_limit_is_waited_out_and_a_failure_shows_on_the_story_never_as_an_error(team, app, github):
    oj = person(app, team, "oj")
    assert oj.post(f"/api/projects/{PROJECT}/story/repo", {"repository": "octo/site"}).status_code == 200
    team.clock.now = T0 + dt.timedelta(seconds=prickle.GITHUB_FRESH + 1)
    github.reset_in(team.clock.now, 300)
    asked = len(github.requests)
    out = read(app, team)
    until = prickle.iso(team.clock.now + dt.timedelta(seconds=300))
    assert out["github"] == {"state": "rate_limited", "fetched_at": prickle.iso(T0), "retry_at": until,
                             "message": f"GitHub's rate limit for this server is used up until {until[11:16]} UTC; "
                                        "the story shows what it read before and asks again then"}
    assert gh_titles(out) == GH_TITLES                      # what was read before stays
    assert len(github.requests) == asked + 1
    team.clock.now += dt.timedelta(seconds=299)              # not before the reset
    assert read(app, team)["github"]["state"] == "rate_limited" and len(github.requests) == asked + 1
    github.limited = "429"                                   # a secondary limit: retry-after
    team.clock.now += dt.timedelta(seconds=2)
    out = read(app, team)
    assert (out["github"]["state"], out["github"]["retry_at"]) == (
        "rate_limited", prickle.iso(team.clock.now + dt.timedelta(seconds=90)))
    # An answer unlike GitHub's: the story says so, and still answers.
    github.limited, github.garbled = None, True
    team.clock.now += dt.timedelta(seconds=91)
    out = read(app, team)
    assert out["github"]["state"] == "failed" and gh_titles(out) == GH_TITLES
    assert out["github"]["message"] == "GitHub's answer could not be read (AttributeError); the story tries again later"
    github.garbled = False
    team.clock.now += dt.timedelta(seconds=prickle.GITHUB_RETRY)
    # The repository goes away: the story says so, and still answers.
    del github.repos["octo/site"]
    out = read(app, team, "ren")
    assert out["github"]["state"] == "failed" and out["github"]["message"].startswith(
        "repository: GitHub has no repository 'octo/site' this server can read")
    assert gh_titles(out) == GH_TITLES


def test_linking_a_repository_that_cannot_be_read_is_a_clear_error(team, app, github):
    oj, ren = person(app, team, "oj"), person(app, team, "ren")
    path = f"/api/projects/{PROJECT}/story/repo"
    before, asked = written(team.db), len(github.requests)
    r = ren.post(path, {"repository": "octo/site"})
    assert (r.status_code, r.json()["error"]["message"]) == (
        403, "only a project owner may link the story to a GitHub repository: ask one of the project's owners")
    assert len(github.requests) == asked                     # a member never makes the server ask GitHub
    r = oj.post(path, {"repository": "octo/nothing"})
    assert (r.status_code, r.json()["error"]["message"]) == (
        400, "repository: GitHub has no repository 'octo/nothing' this server can read: check its name (a private "
             "one needs the server's github_token_env setting)")
    r = oj.post(path, {"repository": "not a repo"})
    assert (r.status_code, r.json()["error"]["message"]) == (
        400, "repository must be a GitHub repository like 'octo-org/website' (or its github.com address), "
             "got 'not a repo'")
    github.reset_in(T0, 600)
    r = oj.post(path, {"repository": "octo/site"})
    assert (r.status_code, r.json()["error"]["code"]) == (503, "github_unavailable")
    assert r.json()["error"]["message"] == ("GitHub's rate limit for this server is used up until 10:10 UTC; "
                                            "nothing was linked: link it again after 10:10 UTC")
    assert written(team.db) == before and read(app, team)["repo"] is None


def test_linking_while_github_is_out_of_reach_says_nothing_was_linked(team, github):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = prickle.Settings(github_api_url=f"http://127.0.0.1:{port}")
    with TestClient(prickle.create_app(team.db_path, settings, port=8321), base_url="http://127.0.0.1:8321") as app:
        before = written(team.db)
        r = person(app, team, "oj").post(f"/api/projects/{PROJECT}/story/repo", {"repository": "octo/site"})
        assert (r.status_code, r.json()["error"]) == (503, {"code": "github_unavailable", "message": (
            "GitHub could not be reached (ConnectError); nothing was linked: link it again in a while")})
        assert written(team.db) == before and read(app, team)["repo"] is None


def test_replacing_or_unlinking_the_repository_brings_hidden_github_moments_back(team, app, github):
    oj, db = person(app, team, "oj"), team.db
    path = f"/api/projects/{PROJECT}/story/repo"
    oj.post(path, {"repository": "octo/site"})
    v1 = next(m for d in read(app, team)["days"] for m in d["moments"] if m["title"] == "Released Version 1.0")
    seq, n = head(db)
    r = oj.post(f"/api/projects/{PROJECT}/story/hide", {"moment_id": v1["id"]})
    assert r.json() == {"hidden": True, "source": "github", "kind": "release"}
    assert "Released Version 1.0" not in gh_titles(read(app, team, "ren"))
    assert oj.post(path, {"repository": "octo/site"}).json()["changed"] is False   # the same one: nothing to do
    assert oj.post(path, {"repository": "octo/docs"}).json() == {
        "repo": "octo/docs", "replaced": True, "github_restored": 1, "changed": True}
    assert gh_titles(read(app, team)) == ["Released Version 9.0"]
    nine = next(m for d in read(app, team)["days"] for m in d["moments"] if m["source"] == "github")
    oj.post(f"/api/projects/{PROJECT}/story/hide", {"moment_id": nine["id"]})
    assert oj.delete(path).json() == {"unlinked": True, "github_restored": 1}
    out = read(app, team)
    assert (gh_titles(out), out["repo"], out["github"], out["hidden"]) == ([], None, None, 0)
    assert entries(db, n) == [
        ("moment.hidden", {"source": "github", "kind": "release", "by": "oj"}),
        ("story.repo_linked", {"replaced": True, "github_restored": 1, "by": "oj"}),
        ("moment.hidden", {"source": "github", "kind": "release", "by": "oj"}),
        ("story.repo_unlinked", {"github_restored": 1, "by": "oj"})]
    assert [e["change"] for e in story_events(db, seq)] == ["hidden", "repo", "hidden", "repo"]
    # Neither titles nor the repository's name reach the audit log or the events.
    text = " ".join(r["refs"] for r in db.rows("SELECT refs FROM audit")) + " ".join(
        r["payload"] for r in db.rows("SELECT payload FROM outbox"))
    assert "octo" not in text and "Version" not in text
    assert db.scalar("SELECT count(*) FROM wakes WHERE seq > ?", (seq,)) == 0


def test_the_story_is_only_for_the_project_s_people(team, app):
    r = person(app, team, "sam").get(f"/api/projects/{PROJECT}/story")
    assert (r.status_code, r.json()["error"]["code"]) == (404, "not_found")
    out = read(app, team, "ren")
    assert (out["can_curate"], out["kinds"]) == (False, list(prickle.MOMENT_KINDS))
    assert json.dumps(out).count('"can_hide": true') == 0


def test_an_erased_person_s_moments_lose_their_name(team):
    db, ren, oj = team.db, team.person("ren"), team.person("oj")
    mine = prickle.mark_moment(db, ren, PROJECT, "thanks", "2026-11-30", "Thanks for the late night")["moment"]
    prickle.close_account(db, "ren")
    out = prickle.story(db, oj, PROJECT)
    moment = next(m for d in out["days"] for m in d["moments"] if m["id"] == mine["id"])
    assert moment["by"] == {"kind": "person", "handle": "ren", "erased": True, "display_name": prickle.ERASED_NAME}
    assert "Ren Ito" not in json.dumps(out)                   # their join went with their membership
    assert (moment["can_edit"], moment["can_remove"]) == (False, True)   # an owner may still remove it


def test_the_record_s_round_numbers_read_an_index_not_every_message(team):
    db = team.db
    plan = " ".join(r["detail"] for r in db.rows(
        "EXPLAIN QUERY PLAN SELECT id, task_id, created_at FROM messages INDEXED BY messages_by_project "
        "WHERE project = ? ORDER BY seq LIMIT 1 OFFSET ?", (PROJECT, 99)))
    assert "USING INDEX messages_by_project" in plan and "TEMP B-TREE" not in plan
    # A big project: 20,000 messages in another project change nothing of this one's story, and the
    # 10,000th of its own is found.
    with db.transaction():
        for project, n in (("side", 20_000), (PROJECT, 10_000)):
            db.conn.executemany("INSERT INTO messages (id, project, author_kind, author, body, mentions, created_at) "
                                "VALUES (?, ?, 'person', 'oj', 'x', '[]', ?)",
                                [(f"msg-{project}-{i}", project, prickle.iso(T0)) for i in range(n)])
    rounds = {m["title"] for m in moments(db, team.person("oj")) if m["kind"] == "round_number"}
    assert rounds == {"The 10,000th message", "The 5,000th message", "The 1,000th message", "The 500th message",
                      "The 100th message"}


def test_a_slow_github_holds_no_reader_back(team, app, github, monkeypatch):
    monkeypatch.setattr(prickle, "GITHUB_WAIT", 0.2)
    github.delay = 0.3                                         # five pages: 1.5 s in all
    r = person(app, team, "oj").post(f"/api/projects/{PROJECT}/story/repo", {"repository": "octo/site"})
    assert r.json()["changed"] is True                         # answered before GitHub finished
    out = read(app, team, "ren")
    assert (out["github"]["state"], gh_titles(out)) == (None, [])   # not read yet: nothing to show
    asked = len(github.requests)
    deadline = time.monotonic() + 30
    while out["github"]["state"] is None and time.monotonic() < deadline:
        out = read(app, team, "ren")                           # each reader joins the one read under way
    assert (out["github"]["state"], gh_titles(out)) == ("ok", GH_TITLES)
    assert len(github.requests) <= asked + 5


def test_junk_in_every_field_is_a_400_never_a_500(team, server):
    oj = person(server, team, "oj")
    mine = prickle.mark_moment(team.db, team.person("oj"), PROJECT, "other", "2026-11-30", "Ours")["moment"]
    before = written(team.db)
    for junk in (None, 5, 1.5, True, [], {}, "", "x" * 5000, "\x00"):
        for method, path, body in (
                ("post", f"/api/projects/{PROJECT}/moments", {"kind": junk, "day": "2026-11-30", "title": "t"}),
                ("post", f"/api/projects/{PROJECT}/moments", {"kind": "other", "day": junk, "title": "t"}),
                ("post", f"/api/projects/{PROJECT}/moments", {"kind": "other", "day": "2026-11-30", "title": junk}),
                ("post", f"/api/projects/{PROJECT}/moments", {"kind": "other", "day": "2026-11-30", "title": "t",
                                                              "message_id": junk or 0}),
                ("post", f"/api/moments/{mine['id']}", {"title": junk}),
                ("post", f"/api/moments/{mine['id']}", {"task_id": junk or 0}),
                ("post", f"/api/projects/{PROJECT}/story/hide", {"moment_id": junk}),
                ("post", f"/api/projects/{PROJECT}/story/round-numbers", {"round_numbers": junk}),
                ("post", f"/api/projects/{PROJECT}/story/repo", {"repository": junk})):
            if body.get("round_numbers") is True:
                continue  # that one is no junk
            r = getattr(oj, method)(path, body)
            assert r.status_code in (400, 404), (path, body, r.status_code, r.text)
            assert r.json()["error"]["code"] in ("invalid_input", "not_found"), r.text
    assert written(team.db) == before


def test_a_title_with_something_to_see_and_the_earliest_day_are_marked(team, server):
    ren = person(server, team, "ren")
    path = f"/api/projects/{PROJECT}/moments"
    for title, day in (("\u200b🎉\u200d", "1970-01-01"), ("\u0663", "2026-11-30"), ("é", "2026-11-30")):
        r = ren.post(path, {"kind": "milestone", "day": day, "title": title})
        assert r.status_code == 200, r.text
        assert (r.json()["moment"]["title"], r.json()["moment"]["day"]) == (title, day)
