"""Browser tests of read = seen: the read position moves only over messages that were on screen.

Each path that once marked unseen messages read is reproduced: opening a room with more unread
than fits, opening it at an old message (a link), and a message arriving while you read higher
up. Then the room's "New messages" line, the bar that jumps to it, the "N new" pill, "Mark
unread" and one author's messages under one header. One ``prickle serve --demo`` and one
Chromium for the module (the fixtures of browser.py).
"""

from __future__ import annotations

import re
import time

from browser import cli_json, expect, goto, person_api, shot

PHONE = {"width": 390, "height": 844}


def room_with(served, slug: str, count: int) -> list[dict]:
    """A new project where ren has posted ``count`` numbered messages; oj and ren are its members."""
    cli_json(served.db, "project", "create", slug, "--name", slug.replace("-", " ").title(), "--team", "web",
             "--owner", "oj")
    cli_json(served.db, "member", "add", slug, "ren", "--role", "member")
    with person_api(served, "ren") as ren:
        return [ren.post(f"/api/projects/{slug}/messages", json={"body": f"Note number {n}"}).json()["message"]
                for n in range(1, count + 1)]


def unread(served, slug: str) -> int:
    """oj's unread messages in the project's general chat, as the server counts them."""
    with person_api(served, "oj") as oj:
        return next(p["general"] for p in oj.get("/api/unread").json()["projects"] if p["project"] == slug)


def settles(read, want, seconds: float = 10.0):
    """Poll ``read()`` until it equals ``want`` (the page saves a read position a moment after it is seen)."""
    deadline = time.monotonic() + seconds
    while (got := read()) != want and time.monotonic() < deadline:
        time.sleep(0.1)
    return got


def test_opening_a_room_marks_read_only_what_was_on_screen_and_opens_at_new_messages(served, people):
    notes = room_with(served, "read-open", 40)
    with person_api(served, "oj") as oj:
        oj.post("/api/projects/read-open/read", json={"message_id": notes[9]["id"]})  # read through note 10
    assert unread(served, "read-open") == 30
    page = people("oj")
    goto(page, served, "#/p/read-open/room")
    divider = page.locator(".unread-divider")
    expect(divider).to_have_text("New messages")
    expect(divider).to_be_in_viewport()
    # The line stands right before note 11, where the view opened; notes far below are not yet read.
    assert page.evaluate("document.querySelector('.unread-divider').nextElementSibling.id") == f"msg-{notes[10]['id']}"
    # ren's notes share one header, but the first below the line shows whose it is again
    expect(page.locator(f"#msg-{notes[10]['id']}")).to_have_class(re.compile(r"\bmsg-grouped\b"))
    expect(page.locator(f"#msg-{notes[10]['id']} .msg-author")).to_be_visible()
    expect(page.locator(f"#msg-{notes[11]['id']} .msg-author")).to_be_hidden()
    expect(page.locator(f"#msg-{notes[39]['id']}")).not_to_be_in_viewport()
    left = settles(lambda: unread(served, "read-open") < 30, True) and unread(served, "read-open")
    assert 0 < left < 30, left
    shot(page, "read_opens_at_new_messages", full_page=False)
    # Reading down to the end reads everything.
    page.locator(f"#msg-{notes[39]['id']}").scroll_into_view_if_needed()
    assert settles(lambda: unread(served, "read-open"), 0) == 0


def test_a_link_to_an_old_message_does_not_mark_the_newest_read(served, people):
    notes = room_with(served, "read-link", 40)
    with person_api(served, "ren") as ren:
        mention = ren.post("/api/projects/read-link/messages", json={"body": "@oj the newest, for you"}).json()
    page = people("oj")
    goto(page, served, f"#/p/read-link/room/{notes[2]['id']}")
    expect(page.locator(f"#msg-{notes[2]['id']}")).to_be_in_viewport()
    # The read position moved over what was shown near note 3 only; the mention far below still waits.
    assert settles(lambda: unread(served, "read-link") < 41, True)
    left = unread(served, "read-link")
    assert 0 < left < 41
    with person_api(served, "oj") as oj:
        assert f"mention:{mention['message']['id']}" in [i["id"] for i in oj.get("/api/inbox").json()["items"]]
    # The bar offers the way down is not needed here: the unread line is below, so no bar shows above.
    expect(page.locator(".unread-bar")).to_be_hidden()


def test_a_message_arriving_while_reading_higher_up_stays_unread_with_a_pill_and_a_line(served, people):
    notes = room_with(served, "read-live", 30)
    with person_api(served, "oj") as oj:
        oj.post("/api/projects/read-live/read", json={"message_id": notes[-1]["id"]})
    page = people("oj")
    goto(page, served, "#/p/read-live/room")
    expect(page.locator(f"#msg-{notes[-1]['id']}")).to_be_in_viewport()
    expect(page.locator(".unread-divider")).to_have_count(0)
    page.locator(f"#msg-{notes[0]['id']}").scroll_into_view_if_needed()
    expect(page.locator(f"#msg-{notes[-1]['id']}")).not_to_be_in_viewport()
    with person_api(served, "ren") as ren:
        fresh = ren.post("/api/projects/read-live/messages", json={"body": "Arrived while oj read above"}).json()
    expect(page.locator(f"#msg-{fresh['message']['id']}")).to_be_attached()
    pill = page.locator(".new-pill")
    expect(pill).to_have_text("1 new ↓")
    expect(pill).to_be_visible()
    assert page.evaluate("document.querySelector('.unread-divider').nextElementSibling.id") == \
        f"msg-{fresh['message']['id']}"
    assert settles(lambda: unread(served, "read-live"), 1) == 1  # not read: it was never on screen
    shot(page, "read_new_pill", full_page=False)
    pill.click()
    expect(page.locator(f"#msg-{fresh['message']['id']}")).to_be_in_viewport()
    assert settles(lambda: unread(served, "read-live"), 0) == 0
    expect(pill).to_be_hidden()


def test_mark_unread_and_the_bar_that_jumps_to_the_first_unread(served, people):
    notes = room_with(served, "read-mark", 70)
    page = people("oj")
    goto(page, served, "#/p/read-mark/room")
    # 70 unread and the room opens at its newest 50: the line is not on the page, the bar says so.
    bar = page.locator(".unread-bar")
    expect(bar).to_be_visible()
    expect(bar).to_contain_text("70 unread messages")
    shot(page, "read_bar", full_page=False)
    bar.get_by_role("button", name="Jump").click()
    expect(page.locator(f"#msg-{notes[0]['id']}")).to_be_attached()
    expect(page.locator(".unread-divider")).to_be_in_viewport()
    expect(bar).to_be_hidden()  # you are at the line now
    page.locator(f"#msg-{notes[-1]['id']}").scroll_into_view_if_needed()
    assert settles(lambda: unread(served, "read-mark"), 0) == 0
    # Mark unread from note 65 on: the line moves there and the server counts six unread.
    target = page.locator(f"#msg-{notes[64]['id']}")
    target.hover()
    target.get_by_role("button", name="Mark unread").click()
    assert settles(lambda: unread(served, "read-mark"), 6) == 6
    assert page.evaluate("document.querySelector('.unread-divider').nextElementSibling.id") == \
        f"msg-{notes[64]['id']}"
    # It stays unread while the page is open, and the room opens at it next time.
    page.mouse.wheel(0, 400)
    assert settles(lambda: unread(served, "read-mark"), 6) == 6
    goto(page, served, "#/inbox")
    goto(page, served, "#/p/read-mark/room")
    expect(page.locator(".unread-divider")).to_be_in_viewport()
    assert page.evaluate("document.querySelector('.unread-divider').nextElementSibling.id") == \
        f"msg-{notes[64]['id']}"
    # Your own message is never unread to you: it offers no Mark unread.
    with person_api(served, "oj") as oj:
        own = oj.post("/api/projects/read-mark/messages", json={"body": "mine"}).json()["message"]
    expect(page.locator(f"#msg-{own['id']}")).to_be_attached()
    expect(page.locator(f"#msg-{own['id']} .msg-unread")).to_have_count(0)
    expect(page.locator(f"#msg-{notes[-1]['id']} .msg-unread")).to_have_count(1)


def test_one_authors_messages_in_a_row_share_one_header_at_both_widths(served, people):
    notes = room_with(served, "read-group", 3)
    with person_api(served, "oj") as oj:
        reply = oj.post("/api/projects/read-group/messages", json={"body": "oj answers"}).json()["message"]
    for name, viewport in (("desktop", None), ("phone", PHONE)):
        page = people("oj", viewport=viewport)
        goto(page, served, "#/p/read-group/room")
        msgs = page.locator(".msg")
        expect(msgs).to_have_count(4)
        grouped = [bool(re.search(r"\bmsg-grouped\b", msgs.nth(i).get_attribute("class"))) for i in range(4)]
        assert grouped == [False, True, True, False]
        expect(page.locator(".msg .msg-author:visible")).to_have_text(["Ren Ito", "Oj Okafor"])
        expect(page.locator(f"#msg-{reply['id']} .msg-author")).to_be_visible()
        shot(page, f"read_grouped_{name}", full_page=False)
        # A continued message hovered, focused or linked to shows its time and actions, never over its own text.
        second = page.locator(f"#msg-{notes[1]['id']}")
        second.hover()
        expect(second.locator(".msg-head")).to_be_visible()
        assert second.locator(".msg-head").bounding_box()["y"] + second.locator(".msg-head").bounding_box()[
            "height"] <= second.locator(".msg-body").bounding_box()["y"] + 1
        goto(page, served, f"#/p/read-group/room/{notes[2]['id']}")
        third = page.locator(f"#msg-{notes[2]['id']}")
        expect(third).to_have_class(re.compile(r"\bmsg-linked\b"))
        head, body = third.locator(".msg-head").bounding_box(), third.locator(".msg-body").bounding_box()
        assert head["y"] + head["height"] <= body["y"] + 1, (head, body)
        expect(third.locator(".msg-body")).to_have_text("Note number 3")
        shot(page, f"read_grouped_linked_{name}", full_page=False)
