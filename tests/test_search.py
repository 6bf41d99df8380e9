"""Search: the full-text index of messages, task titles and packets, who finds what, bad queries, the upgrade."""

import math

import pytest

import prickle
from conftest import PROJECT
from helpers import _database_at_version, auth


PACKET = {"task": "Write the changelog for v2", "deliverable_type": "doc",
          "acceptance_criteria": ["lists every breaking change"], "context": "Readers are integrators.",
          "files": ["docs/CHANGELOG.md"]}


def found(out):
    """(kind, id) of each result, best first."""
    return [(r["kind"], r["message"]["id"] if r["kind"] == "message" else r["task"]["id"]) for r in out["results"]]


def test_messages_and_tasks_are_found_best_match_first(world):
    db, oj = world.db, world.person("oj")
    once = prickle.post_message(db, oj, PROJECT, "The changelog draft is in the docs folder with other long notes "
                                "about colours, fonts, spacing and the footer.")
    twice = prickle.post_message(db, world.actor("oj/muse"), PROJECT, "changelog: the changelog needs work")
    prickle.post_message(db, oj, PROJECT, "Nothing about that here.")
    task = prickle.handoff(db, world.actor("oj/muse"), PROJECT, "oj/scout", PACKET)["task"]
    out = prickle.search(db, oj, "changelog")
    # bm25: the short message saying it twice first, then the title (a title word counts double), then
    # the long message saying it once.
    assert found(out) == [("message", twice["id"]), ("task", task["id"]), ("message", once["id"])]
    first = out["results"][1]
    assert first == {"kind": "task", "project": PROJECT, "project_name": "Website v2", "task_id": task["id"],
                     "at": task["created_at"],
                     "title": "Write the changelog for v2",
                     "snippet": [{"text": "Write the ", "match": False}, {"text": "changelog", "match": True},
                                 {"text": " for v2", "match": False}],
                     "task": {"id": task["id"], "title": "Write the changelog for v2", "state": "routed",
                              "assignee": "oj/scout"}}
    assert out["results"][0]["message"] == twice and out["results"][0]["title"] is None
    # The packet's context, criteria and files are searched too; a phrase, a prefix and a column filter work.
    assert found(prickle.search(db, oj, "integrators")) == [("task", task["id"])]
    assert found(prickle.search(db, oj, "breaking")) == [("task", task["id"])]
    assert found(prickle.search(db, oj, '"docs folder"')) == [("message", once["id"])]
    assert found(prickle.search(db, oj, "chang*")) == found(out)
    assert found(prickle.search(db, oj, "title:changelog")) == [("task", task["id"])]
    assert found(prickle.search(db, oj, "changelog", limit=1)) == [("message", twice["id"])]


def test_a_message_in_a_thread_carries_the_thread_title(world):
    db, oj = world.db, world.person("oj")
    task = prickle.handoff(db, world.actor("oj/muse"), PROJECT, "oj/scout", PACKET)["task"]
    reply = prickle.post_message(db, world.actor("oj/scout"), PROJECT, "Started on the integrators section",
                                 task_id=task["id"])
    out = prickle.search(db, oj, "section")
    assert [(r["kind"], r["task_id"], r["title"], r["message"]["id"]) for r in out["results"]] == [
        ("message", task["id"], "Write the changelog for v2", reply["id"])]


def test_only_what_the_searcher_may_see_is_found(world):
    db = world.db
    oj, ren, sam = world.person("oj"), world.person("ren"), world.person("sam")
    in_project = prickle.post_message(db, oj, PROJECT, "zebra crossing")
    private = prickle.post_message(db, oj, "oj-room", "zebra in my own room")
    elsewhere = prickle.post_message(db, sam, "side", "zebra on the side")
    assert found(prickle.search(db, oj, "zebra")) == [("message", in_project["id"]), ("message", private["id"])]
    assert found(prickle.search(db, ren, "zebra")) == [("message", in_project["id"])]  # not oj's private room
    assert found(prickle.search(db, sam, "zebra")) == [("message", elsewhere["id"])]  # not website-v2
    # A handoff the gate holds (ren's agent to oj's) is the assignee's to see only once approved.
    held = prickle.handoff(db, world.actor("ren/builder"), PROJECT, "oj/muse", PACKET | {"task": "zebra stripes"})
    assert held["task"]["state"] == "approval"
    note = prickle.post_message(db, world.actor("ren/builder"), PROJECT, "zebra detail for the held one",
                                task_id=held["task"]["id"])
    muse = world.actor("oj/muse")
    assert found(prickle.search(db, muse, "zebra")) == [("message", in_project["id"])]
    assert {k for k, _ in found(prickle.search(db, world.actor("ren/builder"), "zebra"))} == {"task", "message"}
    approval = db.one("SELECT id FROM approvals WHERE task_id = ?", (held["task"]["id"],))
    prickle.decide_approval(db, oj, approval["id"], "approve")
    assert sorted(found(prickle.search(db, muse, "zebra"))) == sorted([
        ("message", in_project["id"]), ("task", held["task"]["id"]), ("message", note["id"])])
    # sam/lone is in the side project only.
    assert found(prickle.search(db, world.actor("sam/lone"), "zebra")) == [("message", elsewhere["id"])]


def test_words_with_punctuation_are_found_as_typed(world):
    db, oj = world.db, world.person("oj")
    logo = prickle.post_message(db, oj, PROJECT, "The new logo is in logo-v2.svg, don't ship the old one")
    other = prickle.post_message(db, oj, PROJECT, "Port the parser to C++ and call it foo-bar")
    ids = lambda q: [r["message"]["id"] for r in prickle.search(db, oj, q)["results"]]  # noqa: E731
    # FTS5 can't read these as typed; each is searched as a phrase of its words, in a row.
    assert ids("logo-v2.svg") == [logo["id"]]
    assert ids("don't") == [logo["id"]]
    assert ids("C++") == [other["id"]]
    assert ids("title:foo-bar") == []  # a title only: the message's body doesn't count
    assert ids("foo-ba*") == [other["id"]]
    assert sorted(ids("logo-v2.svg OR foo-bar")) == sorted([other["id"], logo["id"]])
    assert ids('"new logo') == [logo["id"]]
    assert ids("v2-logo.svg") == []  # the words, in their order
    # A phrase whose last word is a prefix, as FTS5 reads it; a NUL would cut the query short, so it is refused.
    assert ids('"new lo"*') == [logo["id"]]
    assert ids('"new lo"* foo-bar') == []
    with pytest.raises(prickle.InvalidInput) as e:
        prickle.search(db, oj, "logo\x00zzzz")
    assert str(e.value) == "q: the search holds a control character: search for words, without it"


@pytest.mark.parametrize("query", ["AND", "NOT x", "a OR", "x AND AND y"])
def test_a_query_search_cannot_read_is_a_clear_error(world, query):
    with pytest.raises(prickle.InvalidInput) as e:
        prickle.search(world.db, world.person("oj"), query)
    assert str(e.value).startswith(f'q: the search "{query}" could not be read (')
    assert str(e.value).endswith('search for words, "a phrase in double quotes", prefix* or OR between words')


def test_the_api_searches_and_refuses_bad_queries_with_400(server, world):
    db = world.db
    message = prickle.post_message(db, world.person("oj"), PROJECT, "Ship it on Friday")
    r = server.get("/api/search", params={"q": "friday"}, headers=auth(world, "ren"))
    assert r.status_code == 200
    assert [x["message"]["id"] for x in r.json()["results"]] == [message["id"]]
    assert server.get("/api/search", params={"q": "friday"}, headers=auth(world, "sam")).json() == {"results": []}
    for params, text in (({"q": "AND"}, 'q: the search "AND" could not be read'),
                         ({"q": "  "}, "q: say what to search for"), ({}, "q: say what to search for"),
                         ({"q": "x" * 201}, "q must be text of 0 to 200 characters"),
                         ({"q": "friday", "limit": "0"}, "limit must be a whole number from 1 to 50")):
        r = server.get("/api/search", params=params, headers=auth(world, "oj"))
        assert r.status_code == 400, params
        assert r.json()["error"]["code"] == "invalid_input" and r.json()["error"]["message"].startswith(text)
    assert server.get("/api/search", params={"q": "friday"}).status_code == 401


def test_the_index_is_written_with_the_row_or_not_at_all(world):
    db, oj = world.db, world.person("oj")
    with pytest.raises(RuntimeError):
        with db.transaction():
            prickle.write_message(db, oj, PROJECT, "walrus that never was")
            raise RuntimeError("the write fails after the message")
    assert prickle.search(db, oj, "walrus") == {"results": []}
    prickle.post_message(db, oj, PROJECT, "walrus that was")
    task = prickle.handoff(db, world.actor("oj/muse"), PROJECT, "oj/scout", PACKET | {"task": "walrus task"})["task"]
    assert len(prickle.search(db, oj, "walrus")["results"]) == 2
    # one index row per message and per task, naming it
    assert db.scalar("SELECT count(*) FROM search_index WHERE kind = 'message'") == db.scalar(
        "SELECT count(*) FROM messages")
    assert db.rows("SELECT ref, project, task_id FROM search_index WHERE kind = 'task'") == [
        {"ref": task["id"], "project": PROJECT, "task_id": task["id"]}]


def test_the_upgrade_builds_the_index_for_existing_rows(db_path):
    version = next(i for i, m in enumerate(prickle.MIGRATIONS) if any("search_index USING fts5" in s for s in m))
    conn = _database_at_version(db_path, version)
    with conn:
        conn.execute("INSERT INTO people (handle, display_name, created_at) VALUES ('oj', 'Oj', 'x')")
        conn.execute("INSERT INTO projects (slug, team, name, created_by, created_at) VALUES ('p1', 'web', 'P', 'oj', 'x')")
        conn.execute("INSERT INTO members VALUES ('p1', 'oj', 'owner', 1, 'x')")
        conn.execute("INSERT INTO messages (seq, id, project, author_kind, author, body, mentions, created_at) VALUES "
                     "(1, 'msg_old', 'p1', 'person', 'oj', 'an old otter message', '[]', '2026-01-01T00:00:00Z')")
        conn.execute("INSERT INTO tasks (id, project, state, assignee, title, packet, created_at, updated_at, "
                     "last_activity_at, requested_by, route) VALUES ('task_old', 'p1', 'routed', 'oj/muse', "
                     "'Otter census', ?, '2026-01-02T00:00:00Z', 'x', 'x', '{\"kind\": \"person\", \"handle\": \"oj\"}', "
                     "'{\"via\": \"handoff\"}')",
                     ('{"task": "Otter census", "deliverable_type": "data", "acceptance_criteria": ["count pups"], '
                      '"context": "river bend", "files": ["data/otters.csv"], "depends_on": []}',))
    conn.close()
    db = prickle.Database(db_path)
    assert db.rows("SELECT title, body, kind, ref, project, task_id, at FROM search_index ORDER BY kind") == [
        {"title": "", "body": "an old otter message", "kind": "message", "ref": "msg_old", "project": "p1",
         "task_id": None, "at": "2026-01-01T00:00:00Z"},
        {"title": "Otter census", "body": "count pups\nriver bend\ndata/otters.csv", "kind": "task",
         "ref": "task_old", "project": "p1", "task_id": "task_old", "at": "2026-01-02T00:00:00Z"}]
    oj = prickle.Actor(kind="person", credential_id="cred_x", credential_kind="person", handle="oj")
    assert found(prickle.search(db, oj, "otter*")) == [("task", "task_old"), ("message", "msg_old")]
    db.close()


def test_a_query_too_broad_to_run_beside_other_requests_is_refused_saying_what_to_change(server, world):
    every_letter = " OR ".join(f"{c}*" for c in "abcdefghijklmnopqrstuvwxyz")
    asked = {every_letter: "q: a* is too broad: a prefix needs at least 2 letters before its *",
             "dep* OR rel* OR doc* OR cha* OR fon*": "q: 5 prefix* terms are too broad: use at most 4, or whole words",
             " ".join(f"word{n}" for n in range(13)): "q: 13 terms are too many: use at most 12 words, phrases or "
                                                       "prefixes"}
    for query, message in asked.items():
        r = server.get("/api/search", params={"q": query}, headers=auth(world, "oj"))
        assert (r.status_code, r.json()) == (400, {"error": {"code": "invalid_input", "message": message}})
    assert server.get("/api/search", params={"q": "dep* OR rel* OR \"release notes\" OR deploy"},
                      headers=auth(world, "oj")).status_code == 200


def test_a_search_that_runs_past_its_time_limit_stops_and_says_to_narrow_it(world):
    db, oj = world.db, world.person("oj")
    for n in range(200):
        prickle.post_message(db, oj, PROJECT, f"deploy notes number {n} about the release")
    assert len(prickle.search(db, oj, "deploy", limit=50)["results"]) == 50
    with pytest.raises(prickle.InvalidInput) as e:
        prickle.search(db, oj, "deploy", limit=50, seconds=0)
    assert str(e.value) == ("q: the search ran past its time limit of 0 seconds: narrow it (fewer OR, longer "
                            "prefixes, a \"phrase\")")
    assert len(prickle.search(db, oj, "deploy", limit=50)["results"]) == 50  # the limit is gone with the search


def test_a_search_runs_off_the_event_loop_on_a_reader_of_its_own(server, world, monkeypatch):
    import threading
    ran = []
    real = prickle.search

    def spy(db, *args, **kwargs):
        ran.append((threading.current_thread().name, db is server.app.state.prickle.db, kwargs["seconds"]))
        return real(db, *args, **kwargs)
    monkeypatch.setattr(prickle, "search", spy)
    prickle.post_message(world.db, world.person("oj"), PROJECT, "release notes are ready")
    r = server.get("/api/search", params={"q": "release"}, headers=auth(world, "oj"))
    assert r.status_code == 200 and len(r.json()["results"]) == 1
    (thread, same_db, seconds), = ran
    assert thread.startswith("prickle-read") and not same_db and seconds == 2.0


def _segments(db):
    """How many segments the search index is in (FTS5 keeps a row per segment's leaf in search_index_idx)."""
    return db.scalar("SELECT count(DISTINCT segid) FROM search_index_idx")


def test_the_search_index_merges_in_background_steps_not_in_the_posts(world):
    db, oj = world.db, world.person("oj")
    assert db.scalar("SELECT v FROM search_index_config WHERE k = 'automerge'") == 0
    posted = [prickle.post_message(db, oj, PROJECT, f"Step {n}: the changelog grows")["id"] for n in range(12)]
    before = _segments(db)
    assert before >= 12  # a post merges nothing: each one's words are a segment of their own
    steps = 0
    while prickle.merge_search_index(db, pages=8):
        steps += 1
        assert steps < 100
    assert steps >= 1 and _segments(db) < before
    assert not prickle.merge_search_index(db)  # nothing left: a step finds no work
    assert sorted(r["message"]["id"] for r in prickle.search(db, oj, "changelog", limit=50)["results"]) == \
        sorted(posted)


def test_after_a_burst_the_background_merge_yields_to_requests_and_goes_on_once_they_stop(world):
    # The server's pieces without their loop: this test takes the merge's steps itself.
    maintenance = prickle.server_maintenance(world.db, None, None, prickle.Settings(), lambda: None)
    [piece] = [p for p in maintenance.pieces if p.name == "search index merging"]
    oj = world.person("oj")
    words = lambda n: " ".join(f"w{n}x{i}" for i in range(1000))  # long posts: a merge of several steps
    posted = [prickle.post_message(world.db, oj, PROJECT, f"Burst {n}: line{n} {words(n)}")["id"] for n in range(60)]
    before = _segments(world.db)
    maintenance.last_request = math.inf  # requests keep coming (the middleware notes each one)
    assert maintenance.busy()
    assert piece.run() == prickle.SEARCH_MERGE_BUSY_EVERY == 1.0  # one step, the next a second later
    maintenance.last_request = -math.inf  # they stopped
    assert not maintenance.busy()
    assert piece.run() == 0.1  # quiet: the next step soon
    steps = 2
    while piece.run() is not None:
        steps += 1
        assert steps < 500
    assert _segments(world.db) < before
    assert piece.run() is None  # nothing written since: nothing to do
    for n in (0, 30, 59):  # every post is still found, by its one word of its own
        assert [r["message"]["id"] for r in prickle.search(world.db, oj, f"line{n}")["results"]] == [posted[n]]
