"""Private rooms: schedules -- an owner's schedule for their own agent, and the task each due time asks.

The scheduler is driven by a controlled clock (the ``clock`` fixture): a test moves the time and
calls run_due_schedules, as the server's "schedules" piece does when it wakes.
"""

import datetime as dt
import json
import time

import pytest

import prickle
from conftest import PROJECT, Served, all_events, audit_entries
from helpers import T0, auth, confirm_with, confirmed, confirmed_token, paired, person
from model_standin import ModelStandIn
from runner_util import CLAUDE, CLAUDE_MISSING, RunnerProcess, claude_env, task_state, wait_until, write_config
from runner_util import person as runner_person

UTC = dt.timezone.utc
WEEKDAYS_9 = {"freq": "weekly", "byweekday": ["mo", "tu", "we", "th", "fr"], "hour": 9}
BERLIN = {"agent": "oj/muse", "project": PROJECT, "text": "Summarise yesterday's commits for the team.",
          "recurrence": WEEKDAYS_9, "timezone": "Europe/Berlin"}


@pytest.fixture(autouse=True)
def scheduler_held(request, monkeypatch):
    """The test moves the clock and calls run_due_schedules itself: the in-process server's own
    scheduler piece would race it for each due time, so it only sleeps -- except in the one test
    about that piece."""
    if request.node.get_closest_marker("background_scheduler") is None:
        monkeypatch.setattr(prickle, "schedule_piece", lambda *a: lambda: prickle.SCHEDULER_MAX_SLEEP)


def make(api, **changes):
    r = api.post("/api/room/schedules", BERLIN | changes)
    assert r.status_code == 200, r.text
    return r.json()["schedule"]


def schedule_events(db):
    return [{k: e[k] for k in ("project", "schedule_id", "change", "version")}
            for e in all_events(db) if e["type"] == "schedule.updated"]


def entries(db, type_=None):
    return [(e["type"], e["refs"]) for e in audit_entries(db, "oj-room") if e["type"].startswith("schedule.")
            and (type_ is None or e["type"] == type_)]


def due(db, now):
    return prickle.run_due_schedules(db, now)["runs"]


def test_an_owner_makes_a_schedule_after_confirming_and_each_due_time_asks_their_agent(server, world, clock, mcp):
    plain = person(server, world, "oj")
    r = plain.post("/api/room/schedules", BERLIN)
    assert (r.status_code, r.json()["error"]["code"]) == (403, "step_up_required")
    assert world.db.scalar("SELECT count(*) FROM schedules") == 0
    oj = confirmed(server, world, "oj")
    made = make(oj)
    # T0 is Tuesday 1 December 2026, 10:00 UTC (11:00 in Berlin): the next weekday 9:00 is Wednesday's.
    assert {k: made[k] for k in ("agent", "project", "text", "timezone", "kind", "runs_a_day", "state", "version",
                                 "next_run_at", "last_run", "stop_reason", "can")} == {
        "agent": "oj/muse", "project": PROJECT, "text": BERLIN["text"], "timezone": "Europe/Berlin", "kind": "weekly",
        "runs_a_day": 1, "state": "active", "version": 1, "next_run_at": "2026-12-02T08:00:00.000Z",
        "last_run": None, "stop_reason": None, "can": ["edit", "pause", "delete"]}
    assert made["recurrence"] == WEEKDAYS_9 | {"interval": 1, "hour": [9], "minute": 0}
    assert schedule_events(world.db) == [{"project": "oj-room", "schedule_id": made["id"], "change": "created",
                                          "version": 1}]
    assert entries(world.db) == [("schedule.created", {"schedule": made["id"], "agent": "oj/muse", "version": 1,
                                                       "kind": "weekly", "runs_a_day": 1})]
    assert due(world.db, dt.datetime(2026, 12, 2, 7, 59, 59, tzinfo=UTC)) == []
    clock.now = dt.datetime(2026, 12, 2, 8, 0, 1, tzinfo=UTC)
    [run] = due(world.db, clock.now)
    assert run == {"schedule_id": made["id"], "outcome": "asked", "task_id": run["task_id"], "missed": 0}
    task = world.db.one("SELECT * FROM tasks WHERE id = ?", (run["task_id"],))
    assert (task["project"], task["state"], task["assignee"], task["requester"]) == (PROJECT, "routed", "oj/muse", None)
    assert json.loads(task["requested_by"]) == {"kind": "person", "handle": "oj"}
    assert json.loads(task["schedule"]) == {"schedule_id": made["id"], "version": 1}
    packet = json.loads(task["packet"])
    assert packet["task"] == BERLIN["text"]
    assert packet["context"] == f"Asked by oj's schedule {made['id']} (version 1), due 2026-12-02 09:00 CET."
    request = world.db.one("SELECT * FROM messages WHERE task_request = ?", (task["id"],))
    assert (request["author"], request["body"]) == ("oj", f"@oj/muse Task request: {BERLIN['text']}")
    # The owner's runner claims it like any other task: the run's cause is the schedule.
    device, runner = paired(world, "oj/muse")
    claim = mcp.ok("oj/muse", "claim_task", {"task_id": task["id"], "idempotency_key": "s1"}, token=runner)
    cause = {"kind": "owner_schedule", "schedule_id": made["id"], "version": 1, "task_id": task["id"], "owner": "oj"}
    assert json.loads(world.db.scalar("SELECT cause FROM attempts WHERE id = ?",
                                      (claim["attempt"]["attempt_id"],))) == cause
    run_token = claim["execution_credential"]["token"]
    posted = mcp.ok("oj/muse", "post_message", {"project": PROJECT, "body": "On it.", "task_id": task["id"]},
                    token=run_token)
    assert posted["message"]["lineage"]["cause"] == cause
    # The room shows the last run, its outcome (the task's state now) and the next run (Thursday).
    [listed] = oj.get("/api/room/schedules").json()["schedules"]
    assert listed["last_run"] == {"due_at": "2026-12-02T08:00:00.000Z", "at": "2026-12-02T08:00:01.000Z",
                                  "outcome": "asked", "detail": None, "missed": 0, "task_id": task["id"],
                                  "task_state": "routed"}
    assert listed["next_run_at"] == "2026-12-03T08:00:00.000Z"
    assert due(world.db, clock.now) == []  # nothing twice
    # No entry holds the text.
    assert BERLIN["text"] not in json.dumps([e["refs"] for e in audit_entries(world.db, "oj-room")])


def scheduler_next_in(server):
    return next(p["next_in"] for p in server.get("/healthz").json()["pieces"] if p["piece"] == "schedules")


@pytest.mark.background_scheduler
def test_the_scheduler_is_a_background_piece_shown_in_healthz_that_sleeps_until_the_next_due_time(
        server, world, clock):
    # Its first look comes at the loop's first tick; then, with nothing scheduled, it sleeps its longest.
    deadline = time.monotonic() + 10
    while scheduler_next_in(server) < prickle.SCHEDULER_MAX_SLEEP - 60 and time.monotonic() < deadline:
        server.get("/api/meta", headers=auth(world, "oj"))  # wait for the state, not for a time
    assert scheduler_next_in(server) > prickle.SCHEDULER_MAX_SLEEP - 60
    # A new schedule wakes it; it looks again and sleeps until the schedule's first due time (20 minutes).
    clock.now = T0.replace(hour=10, minute=40)
    make(confirmed(server, world, "oj"), recurrence={"freq": "hourly"})
    deadline = time.monotonic() + 10
    while not 0 < scheduler_next_in(server) <= 1200 and time.monotonic() < deadline:
        server.get("/api/meta", headers=auth(world, "oj"))
    assert 1100 < scheduler_next_in(server) <= 1200


def times(rec, tz, start, end):
    """The due times of a recurrence set at ``start``, up to ``end``, as ISO strings."""
    out = []
    for t in prickle.schedule_times(prickle.check_recurrence(rec), tz, prickle.iso(start), start):
        if t > end:
            return out
        out.append(prickle.iso(t))


def test_daylight_saving_changes_neither_skip_nor_double_a_run_in_two_time_zones():
    # Berlin springs forward on 28 March 2027 (02:00 -> 03:00) and falls back on 31 October (03:00 -> 02:00).
    at_230 = {"freq": "daily", "hour": 2, "minute": 30}
    assert times(at_230, "Europe/Berlin", dt.datetime(2027, 3, 26, 12, tzinfo=UTC),
                 dt.datetime(2027, 3, 29, 12, tzinfo=UTC)) == [
        "2027-03-27T01:30:00.000Z",  # 02:30 CET
        "2027-03-28T01:00:00.000Z",  # 02:30 does not exist that day: 03:00 CEST, the first moment after
        "2027-03-29T00:30:00.000Z"]  # 02:30 CEST
    # Two times in the same gap run once, at its end; the next day both run.
    assert times({"freq": "daily", "hour": [2, 3]}, "Europe/Berlin", dt.datetime(2027, 3, 27, 12, tzinfo=UTC),
                 dt.datetime(2027, 3, 29, 2, tzinfo=UTC)) == [
        "2027-03-28T01:00:00.000Z", "2027-03-29T00:00:00.000Z", "2027-03-29T01:00:00.000Z"]
    # Santiago springs forward at midnight on 5 September 2027 (00:00 -> 01:00): 00:30 runs at 01:00 -03:00.
    assert times({"freq": "daily", "hour": 0, "minute": 30}, "America/Santiago",
                 dt.datetime(2027, 9, 3, 12, tzinfo=UTC), dt.datetime(2027, 9, 6, 12, tzinfo=UTC)) == [
        "2027-09-04T04:30:00.000Z",  # 00:30 -04:00
        "2027-09-05T04:00:00.000Z",  # 00:30 does not exist that day: 01:00 -03:00, the first moment after
        "2027-09-06T03:30:00.000Z"]  # 00:30 -03:00
    assert times(at_230, "Europe/Berlin", dt.datetime(2027, 10, 29, 12, tzinfo=UTC),
                 dt.datetime(2027, 11, 1, 12, tzinfo=UTC)) == [
        "2027-10-30T00:30:00.000Z", "2027-10-31T00:30:00.000Z",  # 02:30 happens twice that day: once
        "2027-11-01T01:30:00.000Z"]
    # New York springs forward on 14 March 2027 and falls back on 7 November: 9:00 stays 9:00 local.
    weekday_9 = {"freq": "weekly", "byweekday": ["fr", "mo"], "hour": 9}
    assert times(weekday_9, "America/New_York", dt.datetime(2027, 3, 11, tzinfo=UTC),
                 dt.datetime(2027, 3, 16, tzinfo=UTC)) == ["2027-03-12T14:00:00.000Z", "2027-03-15T13:00:00.000Z"]
    # Every 2 hours counts elapsed time: across the fall-back night, still 2 hours apart, none twice.
    two_hours = times({"freq": "hourly", "interval": 2}, "America/New_York", dt.datetime(2027, 11, 7, 3, tzinfo=UTC),
                      dt.datetime(2027, 11, 7, 11, tzinfo=UTC))
    assert two_hours == ["2027-11-07T05:00:00.000Z", "2027-11-07T07:00:00.000Z", "2027-11-07T09:00:00.000Z",
                         "2027-11-07T11:00:00.000Z"]
    # Elapsed time counts on from the anchor, however long ago it was set (and quickly).
    assert prickle.next_due(prickle.check_recurrence({"freq": "minutely", "interval": 5}), "UTC",
                            "2020-01-01T00:01:30.000Z", dt.datetime(2026, 12, 2, 10, 3, tzinfo=UTC)) == \
        dt.datetime(2026, 12, 2, 10, 6, tzinfo=UTC)
    assert prickle.next_due(prickle.check_recurrence({"freq": "hourly", "interval": 7, "minute": 10}), "UTC",
                            "2026-11-01T03:20:00.000Z", dt.datetime(2026, 12, 2, 10, 3, tzinfo=UTC)) == \
        dt.datetime(2026, 12, 2, 15, 10, tzinfo=UTC)
    # The 1st of each month.
    assert times({"freq": "monthly", "bymonthday": [1], "hour": 8}, "UTC", dt.datetime(2027, 1, 15, tzinfo=UTC),
                 dt.datetime(2027, 4, 2, tzinfo=UTC)) == [
        "2027-02-01T08:00:00.000Z", "2027-03-01T08:00:00.000Z", "2027-04-01T08:00:00.000Z"]


@pytest.mark.parametrize("zone, start, hour, expected", [
    # Berlin springs forward on 28 March 2027: 02:30 that night does not exist, it runs at 03:00 CEST.
    ("Europe/Berlin", dt.datetime(2027, 3, 26, 12, tzinfo=UTC), 2,
     ["2027-03-27T01:30:00.000Z", "2027-03-28T01:00:00.000Z", "2027-03-29T00:30:00.000Z"]),
    # New York falls back on 7 November 2027: 01:30 that night happens twice, it runs once (the first).
    ("America/New_York", dt.datetime(2027, 11, 5, 12, tzinfo=UTC), 1,
     ["2027-11-06T05:30:00.000Z", "2027-11-07T05:30:00.000Z", "2027-11-08T06:30:00.000Z"]),
])
def test_the_scheduler_runs_once_a_day_across_a_daylight_saving_change(server, world, clock, zone, start, hour,
                                                                        expected):
    clock.now = start
    oj = confirmed(server, world, "oj")
    make(oj, recurrence={"freq": "daily", "hour": hour, "minute": 30}, timezone=zone)
    ran = []
    for minutes in range(0, 72 * 60, 5):  # a look every 5 minutes for three days, across the change
        clock.now = start + dt.timedelta(minutes=minutes)
        ran += [(prickle.iso(clock.now), r["outcome"], r["missed"]) for r in due(world.db, clock.now)]
    assert ran == [(at, "asked", 0) for at in expected]
    assert [r["due_at"] for r in world.db.rows("SELECT due_at FROM schedule_runs ORDER BY id")] == expected
    assert world.db.scalar("SELECT count(*) FROM tasks WHERE schedule IS NOT NULL") == 3


def test_after_downtime_a_missed_schedule_runs_once_and_says_so(server, world, clock, tmp_path):
    oj = confirmed(server, world, "oj")
    made = make(oj, recurrence={"freq": "hourly"}, timezone="UTC", text="Check the build.")
    assert made["next_run_at"] == "2026-12-01T11:00:00.000Z"
    # The server was down from 10:30 to 15:20: the 11, 12, 13, 14 and 15 o'clock times passed.
    clock.now = dt.datetime(2026, 12, 1, 15, 20, tzinfo=UTC)
    restarted = prickle.Database(world.db_path)  # what the file kept, read by a new process
    [run] = due(restarted, clock.now)
    assert (run["outcome"], run["missed"]) == ("asked", 5)
    assert due(restarted, clock.now) == []
    context = json.loads(world.db.scalar("SELECT packet FROM tasks WHERE id = ?", (run["task_id"],)))["context"]
    assert context == (f"Asked by oj's schedule {made['id']} (version 1), due 2026-12-01 11:00 UTC. The server was "
                       "not running when it was due: this one run stands for the 5 due times missed.")
    listed = oj.get("/api/room/schedules").json()["schedules"][0]
    assert (listed["last_run"]["missed"], listed["next_run_at"]) == (5, "2026-12-01T16:00:00.000Z")
    restarted.close()


def test_pause_resume_and_delete_each_write_their_event_and_exact_entry(server, world, clock):
    oj = confirmed(server, world, "oj")
    made = make(oj, recurrence={"freq": "daily", "hour": [9, 17]}, timezone="UTC")
    sid = made["id"]
    paused = oj.post(f"/api/room/schedules/{sid}/pause", {"version": 1}).json()["schedule"]
    assert (paused["state"], paused["version"], paused["next_run_at"], paused["can"]) == (
        "paused", 2, None, ["edit", "resume", "delete"])
    clock.now = dt.datetime(2026, 12, 3, 12, tzinfo=UTC)
    assert due(world.db, clock.now) == []  # a paused schedule starts nothing
    # The step-up lapsed meanwhile: resuming asks again.
    r = oj.post(f"/api/room/schedules/{sid}/resume", {"version": 2})
    assert (r.status_code, r.json()["error"]["code"]) == (403, "step_up_required")
    assert confirm_with(oj, oj.authenticator).status_code == 200
    resumed = oj.post(f"/api/room/schedules/{sid}/resume", {"version": 2}).json()["schedule"]
    # Its next time from now on; the times while it was paused are not run.
    assert (resumed["state"], resumed["version"], resumed["next_run_at"]) == ("active", 3, "2026-12-03T17:00:00.000Z")
    r = oj.delete(f"/api/room/schedules/{sid}?version=2")
    assert (r.status_code, r.json()["error"]["code"]) == (409, "conflict")
    assert oj.delete(f"/api/room/schedules/{sid}?version=3").json() == {"schedule_id": sid, "deleted": True,
                                                                      "version": 4}
    row = world.db.one("SELECT * FROM schedules WHERE id = ?", (sid,))
    assert (row["state"], row["text"], row["next_run_at"]) == ("deleted", "", None)
    clock.now = dt.datetime(2026, 12, 4, 12, tzinfo=UTC)
    assert due(world.db, clock.now) == []
    assert oj.get("/api/room/schedules").json()["schedules"] == []
    assert [e["change"] for e in schedule_events(world.db)] == ["created", "paused", "resumed", "deleted"]
    assert entries(world.db) == [
        ("schedule.created", {"schedule": sid, "agent": "oj/muse", "version": 1, "kind": "daily", "runs_a_day": 2}),
        ("schedule.paused", {"schedule": sid, "agent": "oj/muse", "version": 2}),
        ("schedule.updated", {"schedule": sid, "agent": "oj/muse", "version_before": 2, "version": 3,
                              "confirmed": True, "kind": "daily", "runs_a_day": 2}),
        ("schedule.deleted", {"schedule": sid, "agent": "oj/muse", "version": 4})]
    r = oj.post(f"/api/room/schedules/{sid}/resume", {})
    assert (r.status_code, r.json()["error"]["code"]) == (404, "not_found")


def test_an_edit_that_adds_runs_or_changes_the_text_needs_confirming_and_a_stale_version_is_refused(
        server, world, clock):
    oj = confirmed(server, world, "oj")
    sid = make(oj, recurrence={"freq": "daily", "hour": [9, 17]}, timezone="UTC")["id"]
    clock.now = T0 + dt.timedelta(minutes=10)  # the step-up lapsed
    fewer = oj.post(f"/api/room/schedules/{sid}", {"version": 1, "recurrence": {"freq": "daily", "hour": 9}})
    assert fewer.status_code == 200, fewer.text  # fewer runs, same agent and text: no confirming
    assert fewer.json()["schedule"]["runs_a_day"] == 1
    for change in ({"text": "Something else."}, {"recurrence": {"freq": "daily", "hour": [8, 9]}},
                   {"timezone": "Europe/Berlin"}, {"agent": "oj/scout"}):
        r = oj.post(f"/api/room/schedules/{sid}", {"version": 2} | change)
        assert (r.status_code, r.json()["error"]["code"]) == (403, "step_up_required"), change
    assert confirm_with(oj, oj.authenticator).status_code == 200
    r = oj.post(f"/api/room/schedules/{sid}", {"version": "2", "text": "Something else."})
    assert r.json()["error"]["message"] == "version must be the schedule's version as you read it (a whole number)"
    r = oj.post(f"/api/room/schedules/{sid}", {"version": 1, "text": "Something else."})
    assert r.status_code == 409
    assert r.json()["error"]["message"] == (f"version: schedule '{sid}' is at version 2, not 1: it changed since "
                                            "you read it; read it again and make your change on that")
    edited = oj.post(f"/api/room/schedules/{sid}", {"version": 2, "agent": "oj/scout", "text": "Something else."})
    assert edited.json()["schedule"]["version"] == 3
    assert entries(world.db, "schedule.updated") == [
        ("schedule.updated", {"schedule": sid, "agent": "oj/muse", "version_before": 1, "version": 2,
                              "confirmed": False, "kind": "daily", "runs_a_day": 1}),
        ("schedule.updated", {"schedule": sid, "agent": "oj/scout", "version_before": 2, "version": 3,
                              "confirmed": True, "kind": "daily", "runs_a_day": 1})]
    assert [e["change"] for e in schedule_events(world.db)] == ["created", "updated", "updated"]


@pytest.mark.parametrize("body, status, message", [
    ({"recurrence": {"freq": "daily", "hour": 9, "until": "2026-11-30"}}, 400,
     "recurrence: it never fires from now on: check its until, bymonth and bymonthday"),
    ({"recurrence": {"freq": "yearly", "bymonth": [2], "bymonthday": [30], "hour": 9}}, 400,
     "recurrence: it never fires from now on: check its until, bymonth and bymonthday"),
    ({"recurrence": {"freq": "minutely", "interval": 30}}, 400,
     "recurrence: 48 runs a day is more than the 24 one schedule may have; run it less often"),
    ({"recurrence": {"freq": "daily"}}, 400, "recurrence.hour: say at which hour it runs (0 to 23, or a list of hours)"),
    ({"recurrence": {"freq": "fortnightly", "hour": 9}}, 400,
     "recurrence.freq must be one of minutely, hourly, daily, weekly, monthly, yearly"),
    ({"recurrence": {"freq": "weekly", "byweekday": ["mon"], "hour": 9}}, 400,
     "recurrence.byweekday must be a list of mo, tu, we, th, fr, sa, su"),
    ({"timezone": "Europe/Berln"}, 400,
     'timezone: unknown time zone "Europe/Berln": use an IANA name such as Europe/Berlin, America/New_York or UTC'),
    ({"agent": "ren/builder"}, 403, "agent: 'ren/builder' is not your agent: a schedule runs one of your own agents"),
    ({"room": "ren-room"}, 403,
     "room: 'ren-room' is not your private room: make schedules in your own room ('oj-room')"),
    ({"project": "side"}, 404, "project: no project 'side' of yours: name a team project you are a member of"),
    ({"project": "oj-room"}, 400, "project: 'oj-room' is a private room; a scheduled task is asked in a team "
                                  "project where your agent works"),
    ({"text": ""}, 400, "text must be text of 1 to 500 characters"),
    ({"agent": 5}, 400, "agent: name one of your agents as owner/name"),
    ({"agent": "oj/nobody"}, 404, 'agent: no agent "oj/nobody": name one of your agents as owner/name'),
    ({"recurrence": {"freq": ["daily"], "hour": 9}}, 400,
     "recurrence.freq must be one of minutely, hourly, daily, weekly, monthly, yearly"),
    ({"recurrence": {"freq": "weekly", "byweekday": [["mo"]], "hour": 9}}, 400,
     "recurrence.byweekday must be a list of mo, tu, we, th, fr, sa, su"),
    ({"recurrence": {"freq": "daily", "hour": 24}}, 400,
     "recurrence.hour must be a whole number from 0 to 23, or a list of them"),
    ({"recurrence": {"freq": "hourly", "hour": 9}}, 400,
     "recurrence.hour: an hourly recurrence counts elapsed time; leave hour out (or use daily, weekly or monthly)"),
    ({"recurrence": "FREQ=DAILY"}, 400,
     'recurrence must be an object such as {"freq": "weekly", "byweekday": ["mo"], "hour": 9}'),
    ({"timezone": "../../etc/passwd"}, 400, 'timezone: unknown time zone "../../etc/passwd": use an IANA name such '
                                            "as Europe/Berlin, America/New_York or UTC"),
    ({"timezone": "localtime"}, 400, 'timezone: unknown time zone "localtime": use an IANA name such as '
                                      "Europe/Berlin, America/New_York or UTC"),
    ({"timezone": "/usr/share/zoneinfo/UTC"}, 400, 'timezone: unknown time zone "/usr/share/zoneinfo/UTC": use an '
                                                   "IANA name such as Europe/Berlin, America/New_York or UTC"),
    ({"cron": "* * * * *"}, 400, "unknown field cron: send agent, project, text, recurrence, timezone, room"),
])
def test_bad_input_is_a_clear_error_naming_the_field_and_changes_nothing(server, world, body, status, message):
    oj = confirmed(server, world, "oj")
    r = oj.post("/api/room/schedules", BERLIN | body)
    assert (r.status_code, r.json()["error"]["message"]) == (status, message)
    assert world.db.scalar("SELECT count(*) FROM schedules") == 0


def test_one_owner_s_schedules_together_keep_to_the_owner_s_runs_a_day(server, world):
    oj = confirmed(server, world, "oj")
    make(oj, recurrence={"freq": "hourly"})  # 24
    make(oj, recurrence={"freq": "hourly"})
    make(oj, recurrence={"freq": "hourly"})
    make(oj, recurrence={"freq": "daily", "hour": list(range(20))})  # 92 a day
    r = oj.post("/api/room/schedules", BERLIN | {"recurrence": {"freq": "daily", "hour": [1, 2, 3, 4, 5]}})
    assert r.json()["error"]["message"] == ("recurrence: your active schedules would run 97 times a day, more than "
                                            "the 96 one person's schedules may; run this one less often, or pause "
                                            "another")
    assert oj.get("/api/room/schedules").json()["limits"] == {
        "runs_a_day_per_schedule": 24, "runs_a_day_per_owner": 96, "runs_a_day_used": 92, "schedules_max": 50}


def test_someone_else_s_schedule_is_not_found(server, world):
    oj = confirmed(server, world, "oj")
    sid = make(oj)["id"]
    ren = confirmed(server, world, "ren")
    for r in (ren.post(f"/api/room/schedules/{sid}/pause", {}), ren.post(f"/api/room/schedules/{sid}",
                                                                        {"version": 1, "text": "Mine now."}),
              ren.delete(f"/api/room/schedules/{sid}")):
        assert (r.status_code, r.json()["error"]["message"]) == (
            404, f"schedule_id: no schedule '{sid}' of yours (it is someone else's, deleted or never was)")
    assert ren.get("/api/room/schedules").json()["schedules"] == []


def test_a_paused_agent_is_asked_nothing_and_an_agent_that_left_stops_the_schedule(server, world, clock):
    oj = confirmed(server, world, "oj")
    sid = make(oj, recurrence={"freq": "daily", "hour": 12}, timezone="UTC")["id"]
    assert oj.post("/api/agents/oj/muse/pause", {}).status_code == 200
    clock.now = dt.datetime(2026, 12, 1, 12, 0, 5, tzinfo=UTC)
    [run] = due(world.db, clock.now)
    assert (run["outcome"], run["task_id"]) == ("agent_paused", None)
    assert world.db.scalar("SELECT count(*) FROM tasks") == 0
    prickle.remove_agent(world.db, PROJECT, "oj/muse", by="oj")
    # The room shows it stopped at once, before its next due time, with the reason.
    [listed] = oj.get("/api/room/schedules").json()["schedules"]
    assert (listed["state"], listed["stop_reason"], listed["next_run_at"], listed["can"]) == (
        "stopped", "agent_left", None, ["edit", "resume", "delete"])
    assert listed["last_run"]["outcome"] == "agent_paused"
    assert entries(world.db)[-1][0] == "schedule.created"  # the owner changed nothing: no entry of theirs
    clock.now = dt.datetime(2026, 12, 2, 12, 0, 5, tzinfo=UTC)
    assert due(world.db, clock.now) == []
    assert world.db.scalar("SELECT count(*) FROM tasks") == 0
    assert confirm_with(oj, oj.authenticator).status_code == 200
    r = oj.post(f"/api/room/schedules/{sid}/resume", {})
    assert r.json()["error"]["message"] == ("project: your agent 'oj/muse' is not in 'website-v2': add it there "
                                            "first, or pick a project it is in")


def test_a_schedule_whose_owner_was_removed_stops(server, world, clock):
    ren = confirmed(server, world, "ren")
    r = ren.post("/api/room/schedules", BERLIN | {"agent": "ren/builder", "timezone": "UTC"})
    assert r.status_code == 200, r.text
    prickle.remove_member(world.db, PROJECT, "ren", by="oj")
    # The scheduler's next look stops it (and asks nothing), whether or not it was due.
    clock.now = dt.datetime(2026, 12, 2, 9, 0, 5, tzinfo=UTC)
    assert due(world.db, clock.now) == []
    [listed] = ren.get("/api/room/schedules").json()["schedules"]
    assert (listed["state"], listed["stop_reason"], listed["last_run"]) == ("stopped", "owner_removed", None)
    assert world.db.scalar("SELECT count(*) FROM tasks") == 0


def test_the_runs_a_day_limit_holds_at_run_time_too(server, world, clock):
    oj = confirmed(server, world, "oj")
    make(oj, recurrence={"freq": "hourly"}, timezone="UTC")
    outcomes = []
    for hour in range(11, 38):
        clock.now = T0.replace(hour=0) + dt.timedelta(hours=hour, seconds=1)
        outcomes += [r["outcome"] for r in prickle.run_due_schedules(world.db, clock.now, per_schedule=3)["runs"]]
    assert outcomes[:4] == ["asked", "asked", "asked", "limit"]
    assert outcomes.count("asked") == 6  # three in any one day


@pytest.mark.skipif(not CLAUDE, reason=CLAUDE_MISSING)
def test_a_scheduled_run_goes_end_to_end_through_prickle_runner_and_claude_code(db_path, tmp_path):
    """A due schedule asks oj/muse; oj's runner starts Claude Code (its model the stand-in), which accepts the
    task and returns its result; oj gives final acceptance. The run's lineage names the schedule."""
    script = [
        lambda seen: ("mcp__prickle__accept_task", {"task_id": seen.find(r"Prickle task (\S+) ")}),
        lambda seen: ("mcp__prickle__return_result", {
            "task_id": seen.find(r"Prickle task (\S+) "), "summary": "Three commits yesterday: the hero, the CTA, a fix.",
            "evidence": [{"kind": "note", "summary": "Read the log of yesterday's commits.", "criteria": [0]}]}),
        lambda seen: "Returned the summary.",
    ]
    with Served(db_path, "--demo") as served, ModelStandIn(script) as model:
        base, db = served.info["url"], prickle.Database(db_path)
        _, key = prickle.pair_device(db, "oj", "oj/muse", "oj-laptop")
        named = base.replace("//127.0.0.1:", "//localhost:")  # a passkey is bound to a name
        oj = runner_person(named, confirmed_token(db_path, named, "oj"))
        made = oj.post("/api/room/schedules", json=BERLIN)
        assert made.status_code == 200, made.text
        sid = made.json()["schedule"]["id"]
        config = write_config(tmp_path / "runner.toml", base, {
            "oj/muse": {"key": key, "client": "claude", "cli_path": CLAUDE, "launch_timeout_minutes": 5}})
        with RunnerProcess(config, env=claude_env(tmp_path / "home", model.url)) as runner:
            runner.wait_connected("oj/muse")
            # It falls due (its time moved into the past in the file); a change to another schedule wakes the
            # scheduler, which asks oj/muse at once.
            with db.transaction():
                db.execute("UPDATE schedules SET next_run_at = ? WHERE id = ?",
                           (prickle.iso(prickle.utcnow() - dt.timedelta(seconds=1)), sid))
            assert oj.post("/api/room/schedules", json=BERLIN | {"text": "Another."}).status_code == 200
            run = wait_until("the scheduled run", lambda: db.one("SELECT * FROM schedule_runs WHERE schedule_id = ?",
                                                                 (sid,)))
            assert run["outcome"] == "asked"
            task = wait_until("the result", lambda: (t := task_state(oj, run["task_id"]))["state"] == "verifying"
                              and t, timeout=90)
        assert task["result"]["lineage"]["cause"] == {"kind": "owner_schedule", "schedule_id": sid, "version": 1,
                                                      "task_id": run["task_id"], "owner": "oj"}
        accepted = oj.post(f"/api/tasks/{run['task_id']}/accept", json={})
        assert accepted.json()["task"]["state"] == "completed"
        [listed] = [s for s in oj.get("/api/room/schedules").json()["schedules"] if s["id"] == sid]
        assert (listed["last_run"]["task_id"], listed["last_run"]["task_state"]) == (run["task_id"], "completed")
        assert [a for a in model.calls if not isinstance(a, str)][0][0] == "mcp__prickle__accept_task"
        oj.close(), db.close()


def test_closing_an_account_deletes_its_schedules_and_clears_their_texts(server, world):
    ren = confirmed(server, world, "ren")
    r = ren.post("/api/room/schedules", BERLIN | {"agent": "ren/builder", "timezone": "UTC"})
    sid = r.json()["schedule"]["id"]
    prickle.close_account(world.db, "ren")
    row = world.db.one("SELECT * FROM schedules WHERE id = ?", (sid,))
    assert (row["state"], row["text"], row["next_run_at"], row["version"]) == ("deleted", "", None, 2)
    assert [e["change"] for e in schedule_events(world.db)] == ["created", "deleted"]


def test_a_schedule_s_text_mentions_nobody_and_its_run_wakes_only_its_own_agent(server, world, clock):
    oj = confirmed(server, world, "oj")
    named = "@ren/builder please do it, @ren look"
    r = oj.post("/api/room/schedules", BERLIN | {"text": named, "timezone": "UTC", "recurrence": {"freq": "hourly"}})
    assert (r.status_code, r.json()["error"]["message"]) == (
        400, "text: a schedule asks only its own agent, so its text mentions nobody: remove the mention "
             "@ren/builder (write the name without @)")
    assert world.db.scalar("SELECT count(*) FROM schedules") == 0
    made = make(oj, timezone="UTC", recurrence={"freq": "hourly"})
    r = oj.post(f"/api/room/schedules/{made['id']}", {"version": 1, "text": "Ask @ren about it."})
    assert (r.status_code, r.json()["error"]["message"]) == (
        400, "text: a schedule asks only its own agent, so its text mentions nobody: remove the mention @ren "
             "(write the name without @)")
    # A text stored before texts were checked: its run still mentions (and wakes) only the schedule's agent.
    world.db.execute("UPDATE schedules SET text = ? WHERE id = ?", (named, made["id"]))
    clock.now = dt.datetime(2026, 12, 1, 11, 0, 5, tzinfo=UTC)
    [run] = due(world.db, clock.now)
    assert run["outcome"] == "asked"
    request = world.db.one("SELECT * FROM messages WHERE task_request = ?", (run["task_id"],))
    assert (request["body"], json.loads(request["mentions"])) == (f"@oj/muse Task request: {named}", ["oj/muse"])
    assert [(w["agent_id"], w["kind"]) for w in world.db.rows("SELECT * FROM wakes WHERE message_id = ?",
                                                             (request["id"],))] == [("oj/muse", "mention")]
    assert person(server, world, "ren").get("/api/inbox").json()["items"] == []


def test_a_scheduled_task_names_its_owner_as_who_asked_exactly_as_a_task_asked_by_hand(server, world, clock):
    oj = confirmed(server, world, "oj")
    make(oj)
    by_hand = oj.post(f"/api/projects/{PROJECT}/task-requests", {"agent": "oj/muse", "packet": {
        "task": "By hand.", "deliverable_type": "answer", "acceptance_criteria": ["It answers."]}}).json()["task"]
    clock.now = dt.datetime(2026, 12, 2, 8, 0, 1, tzinfo=UTC)
    [run] = due(world.db, clock.now)
    scheduled = oj.get(f"/api/tasks/{run['task_id']}").json()["task"]
    who = {"requester": None, "requested_by": {"kind": "person", "handle": "oj"}}
    assert {k: scheduled[k] for k in who} == {k: by_hand[k] for k in who} == who
    # The room's task threads say who asked (the page shows "@oj → oj/muse", as the board does).
    threads = oj.get(f"/api/projects/{PROJECT}/room").json()["threads"]
    assert [(t["task_id"], t["requester"], t["requested_by"], t["assignee"]) for t in threads] == [
        (run["task_id"], None, {"kind": "person", "handle": "oj"}, "oj/muse"),
        (by_hand["id"], None, {"kind": "person", "handle": "oj"}, "oj/muse")]


def test_a_deleted_project_stops_its_schedules_which_stay_stopped_through_a_restore_and_a_purge(server, world, clock):
    oj = confirmed(server, world, "oj")
    active = make(oj, timezone="UTC", recurrence={"freq": "daily", "hour": 12})["id"]
    paused = make(oj, timezone="UTC", recurrence={"freq": "daily", "hour": 13})["id"]
    assert oj.post(f"/api/room/schedules/{paused}/pause", {}).status_code == 200

    def listed():
        return sorted((s["id"], s["state"], s["stop_reason"], s["next_run_at"], s["can"])
                      for s in oj.get("/api/room/schedules").json()["schedules"])

    stopped = ["edit", "resume", "delete"]
    prickle.delete_project(world.db, PROJECT, "oj")
    gone = sorted((sid, "stopped", "project_deleted", None, stopped) for sid in (active, paused))
    assert listed() == gone
    assert prickle.STOP_REASONS["project_deleted"] == "its project was deleted"
    clock.now = dt.datetime(2026, 12, 1, 12, 0, 5, tzinfo=UTC)
    assert due(world.db, clock.now) == []
    # Restored: its schedules stay stopped, saying why, until their owner resumes them.
    prickle.restore_project(world.db, PROJECT, "oj")
    assert listed() == gone
    assert due(world.db, clock.now) == []
    assert confirm_with(oj, oj.authenticator).status_code == 200
    r = oj.post(f"/api/room/schedules/{active}/resume", {})
    assert (r.json()["schedule"]["state"], r.json()["schedule"]["next_run_at"]) == ("active", "2026-12-02T12:00:00.000Z")
    # Deleted again and purged: the schedules, which live in oj's room, are still there, stopped.
    prickle.delete_project(world.db, PROJECT, "oj", window=dt.timedelta(0))
    steps = prickle.run_retention(world.db)
    assert steps[-1] == f"{PROJECT}: content purged (request 2)"
    assert listed() == gone
    assert world.db.scalar("SELECT count(*) FROM tasks WHERE project = ?", (PROJECT,)) == 0
    r = oj.post(f"/api/room/schedules/{active}/resume", {})
    assert (r.status_code, r.json()["error"]["message"]) == (
        404, f"project: no project '{PROJECT}' of yours: name a team project you are a member of")
