"""Schedules in the private room, in Chromium: make one (confirming it's you), see its next run, pause and resume
it, see a run the server's scheduler made (its last run and its task's state), delete it; desktop and phone widths."""

import re
from pathlib import Path

import apsw
from playwright.sync_api import expect

from browser import PROJECT, at_name, person_api, shot, signed_in_at_name, with_passkey

AXE = Path(__file__).resolve().parent.parent / ".cache" / "axe" / "node_modules" / "axe-core" / "axe.min.js"
PHONE = {"width": 390, "height": 844}


def open_room(page, served):
    with person_api(served, "oj") as oj:
        room = oj.get("/api/room").json()["room"]["project"]
    page.goto(at_name(f"{served.info['url']}/#/p/{room}/room"))
    card = page.locator("section.schedules")
    expect(card.get_by_role("heading", name="Schedules")).to_be_visible()
    return card


def make(page, card, text, often, at=None, zone="Europe/Berlin"):
    card.get_by_role("button", name="New schedule").click()
    form = card.get_by_role("form", name="New schedule")
    form.get_by_label("What to do").fill(text)
    form.get_by_label("How often").select_option(often)
    if at:
        form.get_by_label("At", exact=True).fill(at)
    form.get_by_label("Time zone").fill(zone)
    form.get_by_role("button", name="Make schedule").click()
    return form


def test_an_owner_makes_pauses_resumes_and_deletes_a_schedule_and_sees_its_runs(served, people):
    page = signed_in_at_name(people, served, "oj")
    with_passkey(page, served, "oj")
    card = open_room(page, served)
    expect(card.locator(".schedule-list")).to_contain_text("No schedules yet.")
    form = make(page, card, "Summarise yesterday's commits for the team.", "weekdays", "09:00")
    dialog = page.get_by_role("dialog", name="Confirm it's you")
    dialog.get_by_role("button", name="Use my passkey").click()
    expect(form).to_have_count(0)
    item = card.locator(".schedule").filter(has_text="Summarise yesterday's commits")
    expect(item.locator(".schedule-when")).to_have_text("every weekday at 09:00 (Europe/Berlin)")
    expect(item).to_contain_text("oj/muse in website-v2")
    expect(item.locator(".schedule-next time")).to_be_visible()
    expect(item.locator(".schedule-last")).to_have_text("Last run: not yet.")
    with person_api(served, "oj") as oj:
        [first] = oj.get("/api/room/schedules").json()["schedules"]
    assert (first["agent"], first["project"], first["recurrence"]) == (
        "oj/muse", PROJECT, {"freq": "weekly", "interval": 1, "byweekday": ["mo", "tu", "we", "th", "fr"],
                             "hour": [9], "minute": 0})
    # The next run is said in the schedule's own zone, named, as its recurrence is (the browser runs in UTC,
    # where it is 08:00 or 07:00).
    expect(item.locator(".schedule-next")).to_have_text(re.compile(r"^Next run: \w{3}, \w{3} \d{1,2}, 09:00 \(Europe/Berlin\)$"))
    expect(item.locator(".schedule-next time")).to_have_attribute("datetime", first["next_run_at"])

    item.get_by_role("button", name=re.compile("^Pause schedule")).click()
    expect(item.locator(".schedule-next")).to_have_text("Paused: nothing runs until you resume it.")
    item.get_by_role("button", name=re.compile("^Resume schedule")).click()  # confirmed minutes ago: no dialog
    expect(item.locator(".schedule-next time")).to_be_visible()
    # An edit: new words, its recurrence kept as it is.
    item.get_by_role("button", name=re.compile("^Edit schedule")).click()
    edit = card.get_by_role("form", name="Edit schedule")
    expect(edit.get_by_label("How often")).to_have_value("keep")
    edit.get_by_label("What to do").fill("Summarise yesterday's commits and open pull requests.")
    edit.get_by_role("button", name="Save changes").click()
    expect(edit).to_have_count(0)
    item = card.locator(".schedule").filter(has_text="Summarise yesterday's commits and open pull requests.")
    expect(item.locator(".schedule-when")).to_have_text("every weekday at 09:00 (Europe/Berlin)")

    # The first schedule falls due (its time moved into the past in the file, as after a night); making a
    # second wakes the server's scheduler, which asks oj/muse for the first one's task.
    with apsw.Connection(served.db) as conn:
        conn.setbusytimeout(5000)
        conn.execute("UPDATE schedules SET next_run_at = '2026-01-05T08:00:00.000Z' WHERE id = ?", (first["id"],))
    make(page, card, "Check the build every two hours.", "hours")
    second = card.locator(".schedule").filter(has_text="Check the build")
    expect(second.locator(".schedule-when")).to_have_text("every 2 hours (Europe/Berlin)")
    expect(item.locator(".schedule-last")).to_contain_text("asked its task", timeout=15_000)
    expect(item.locator(".schedule-last")).to_contain_text(re.compile(r"ran late after downtime, once for \d+ missed"))
    expect(item.locator(".schedule-last .state")).to_have_text("routed")
    expect(item.locator(".schedule-last time")).to_have_text(re.compile(r"^\w{3}, \w{3} \d{1,2}, \d\d:\d\d \(Europe/Berlin\)$"))
    shot(page, "schedules_desktop")
    card.get_by_role("button", name="New schedule").click()
    card.get_by_role("form", name="New schedule").get_by_label("How often").select_option("weekly")
    shot(page, "schedules_form_desktop")
    if AXE.exists():  # the card and its form read clearly (axe-core: no serious or critical finding)
        page.add_script_tag(path=str(AXE))
        found = page.evaluate("async () => (await axe.run({include: [['section.schedules']]}, {resultTypes: "
                              "['violations']})).violations.filter((v) => ['serious', 'critical'].includes(v.impact))"
                              ".map((v) => v.id)")
        assert found == []
    card.get_by_role("button", name="Cancel").click()

    # On a phone the card sits under the room's settings, every control in reach.
    phone = signed_in_at_name(people, served, "oj", viewport=PHONE)
    phone_card = open_room(phone, served)
    expect(phone_card.locator(".schedule")).to_have_count(2)
    phone_card.scroll_into_view_if_needed()
    assert phone.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    shot(phone, "schedules_phone")

    delete = second.get_by_role("button", name=re.compile("^Delete schedule"))
    delete.click()
    second.get_by_role("button", name=re.compile("^Click again to delete")).click()
    expect(card.locator(".schedule")).to_have_count(1)
    with person_api(served, "oj") as oj:
        [kept] = oj.get("/api/room/schedules").json()["schedules"]
    assert (kept["text"], kept["version"]) == ("Summarise yesterday's commits and open pull requests.", 4)
