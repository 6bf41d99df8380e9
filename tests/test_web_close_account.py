"""Browser tests: a person closes their account from the Agents & keys page (asked twice, then "Confirm it's
you"), lands signed out with what ended, and their teammate's room shows their message by an erased person.
At 1366 and 390 px wide; the last owner of a project is told what to do first.

Like tests/test_web.py: a real ``prickle serve --demo`` and headless Chromium driven by Playwright.
Screenshots go to tests/screenshots/.
"""

from __future__ import annotations

import re

import pytest

from browser import PROJECT, at_name, expect, goto, person_api, shot, signed_in_at_name, with_passkey
from helpers import cli_json

WIDTHS = {"1366": {"width": 1366, "height": 900}, "390": {"width": 390, "height": 844}}


PACKET = {"task": "Check the footer links.", "deliverable_type": "answer", "acceptance_criteria": ["Every link named."],
          "context": "", "files": []}


def newcomer(served, handle: str, name: str) -> tuple[str, str]:
    """A new member of website-v2 with an agent there, one message in its room and a task they asked their
    agent for; returns (the message id, the task id)."""
    cli_json(served.db, "person", "add", handle, "--name", name)
    cli_json(served.db, "team", "add", "web", handle)
    cli_json(served.db, "member", "add", PROJECT, handle)
    cli_json(served.db, "agent", "add", f"{handle}/helper", "--name", "Helper", "--model", "m", "--client", "codex",
             "--project", PROJECT)
    with person_api(served, handle) as api:
        r = api.post(f"/api/projects/{PROJECT}/messages", json={"body": f"Notes from {handle}: ship it Friday."})
        assert r.status_code == 200, r.text
        asked = api.post(f"/api/projects/{PROJECT}/task-requests", json={"agent": f"{handle}/helper",
                                                                        "packet": PACKET})
        assert asked.status_code == 200, asked.text
        return r.json()["message"]["id"], asked.json()["task"]["id"]


@pytest.mark.parametrize("width", list(WIDTHS))
def test_a_person_closes_their_account_from_the_page(served, people, width):
    handle = f"kim{width}"
    message, task = newcomer(served, handle, f"Kim Park {width}")
    page = signed_in_at_name(people, served, handle, viewport=WIDTHS[width])
    with_passkey(page, served, handle)
    page.goto(at_name(f"{served.info['url']}/#/agents"))
    section = page.get_by_role("region", name="Close your account")
    expect(section).to_contain_text("It can't be undone.")
    section.get_by_role("button", name="Close my account").scroll_into_view_if_needed()
    assert page.evaluate("document.documentElement.scrollWidth") <= WIDTHS[width]["width"]
    shot(page, f"close_account_{width}", full_page=False)

    with person_api(served, "oj") as oj:
        members = oj.get(f"/api/projects/{PROJECT}/members")
    section.get_by_role("button", name="Close my account").click()
    confirm = section.get_by_role("button", name="Click again: close it for good")
    expect(confirm).to_be_visible()  # asked first: nothing ended yet
    box = confirm.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= WIDTHS[width]["width"]
    shot(page, f"close_account_confirm_{width}", full_page=False)
    confirm.click()
    dialog = page.get_by_role("dialog", name="Confirm it's you")
    expect(dialog).to_contain_text("Confirm it's you to close your account")
    dialog.get_by_role("button", name="Use my passkey").click()

    expect(page.get_by_role("heading", name="Account closed")).to_be_visible()
    expect(page.locator(".signin .notice")).to_have_text(
        "Your account is closed: you left 2 projects; 2 keys and 1 session ended.")  # two personal tokens
    # the closed message alone: no sign-in instructions or token form that can't work for it, nothing announced
    expect(page.locator(".signin > *")).to_have_count(2)
    expect(page.locator("main form")).to_have_count(0)
    expect(page.locator("#announcer")).to_have_text("")
    shot(page, f"close_account_closed_{width}", full_page=False)

    # The teammate's room: the message stays, by an erased person; the members list no longer has them.
    assert handle in [p["handle"] for p in members.json()["members"]]
    with person_api(served, "oj") as oj:
        assert handle not in [p["handle"] for p in oj.get(f"/api/projects/{PROJECT}/members").json()["members"]]
    oj_page = people("oj", viewport=WIDTHS[width])
    goto(oj_page, served, f"#/p/{PROJECT}/room/{message}")
    said = oj_page.locator(f"[id='msg-{message}']")
    expect(said).to_contain_text("Erased person")
    expect(said).to_contain_text(f"Notes from {handle}: ship it Friday.")
    expect(said).not_to_contain_text("Kim Park")
    said.scroll_into_view_if_needed()
    shot(oj_page, f"close_account_room_{width}", full_page=False)
    # The task kim asked for is cancelled, asked for and cancelled by an erased person.
    goto(oj_page, served, f"#/p/{PROJECT}/tasks/{task}")
    expect(oj_page.locator("main")).to_contain_text(f"an erased person (@{handle})")
    expect(oj_page.locator("main")).not_to_contain_text("Kim Park")
    shot(oj_page, f"close_account_task_{width}", full_page=False)
    goto(oj_page, served, f"#/p/{PROJECT}/audit")
    erased = oj_page.locator("tr[data-type='person.erased']").first
    expect(erased).to_contain_text("erased person")
    shot(oj_page, f"close_account_audit_{width}", full_page=False)


def test_the_last_owner_is_told_what_to_do_first(served, people):
    page = signed_in_at_name(people, served, "oj")
    with_passkey(page, served, "oj")
    page.goto(at_name(f"{served.info['url']}/#/agents"))
    section = page.get_by_role("region", name="Close your account")
    section.get_by_role("button", name="Close my account").click()
    section.get_by_role("button", name="Click again: close it for good").click()
    page.get_by_role("dialog", name="Confirm it's you").get_by_role("button", name="Use my passkey").click()
    expect(section.locator(".error")).to_contain_text(re.compile(
        r"'oj' is the last owner of 'website-v2': make another member an owner"))
    section.locator(".error").scroll_into_view_if_needed()
    shot(page, "close_account_last_owner", full_page=False)
    with person_api(served, "oj") as oj:
        assert oj.get("/api/me").status_code == 200
