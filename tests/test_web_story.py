"""The Story tab in Chromium: marking a moment from a message or a task in one click, the timeline by day
from three sources, an owner's curating seen live by a member, GitHub's failure shown on the story, at
desktop and phone width.

A real ``prickle serve --demo`` whose settings point GitHub's API at the local stand-in
(tests/github_standin.py); Playwright drives headless Chromium. Screenshots go to tests/screenshots/.
"""

from __future__ import annotations

import re
from pathlib import Path
import pytest

from browser import PROJECT, expect, goto, mcp, shot
from conftest import Served
from github_standin import GitHub, pull, release

AXE = Path(__file__).resolve().parent.parent / ".cache" / "axe" / "node_modules" / "axe-core" / "axe.min.js"
DESKTOP = {"width": 1366, "height": 900}
PHONE = {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def github():
    gh = GitHub(per_page=2)
    gh.add("octo/site", [release(1, "2026-10-01"), release(2, "2026-11-01")],
           [pull(12, "2026-11-20"), pull(11, "2026-11-18", merged=False), pull(10, "2026-10-15")])
    yield gh
    gh.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory, github):
    folder = tmp_path_factory.mktemp("story")
    (folder / "prickle.toml").write_text(f'github_api_url = "{github.url}"\n')
    db = str(folder / "prickle.db")
    with Served(db, "--demo") as s:
        s.db = db
        yield s


def test_a_message_is_marked_in_one_click_and_the_story_reads_like_a_changelog(served, people, github):
    posted = mcp(served, "ren/builder", "post_message", {"project": PROJECT, "body": "## The new pricing page is live\n\nThanks all."})
    message_id = posted["message"]["id"]
    oj = people("oj", DESKTOP)
    ren = people("ren", DESKTOP)
    goto(ren, served, f"#/p/{PROJECT}/story")
    expect(ren.get_by_role("heading", name="Story", level=1)).to_be_visible()
    expect(ren.locator(".story-settings")).to_have_count(0)          # a member does not curate

    goto(oj, served, f"#/p/{PROJECT}/room")
    message = oj.locator(f"#msg-{message_id}")
    message.hover()
    message.get_by_role("button", name=re.compile("as a moment in the story")).click()
    dialog = oj.get_by_role("dialog", name="Mark a moment")
    expect(dialog.get_by_label("Title")).to_have_value("The new pricing page is live")
    # the kinds as the README and the API name them ("other" is "Other", on badges too)
    expect(dialog.get_by_label("Kind").locator("option")).to_have_text(
        ["Milestone", "Launch", "Release", "Decision", "Incident", "Thanks", "Other"])
    dialog.get_by_label("Kind").select_option("launch")
    shot(oj, "story_mark_dialog", full_page=False)
    dialog.get_by_role("button", name="Mark it").click()
    expect(dialog).to_have_count(0)

    # The member's open Story tab shows it without a reload (moment.updated).
    launch = ren.locator('.moment[data-kind="launch"]')
    expect(launch.locator(".moment-title")).to_have_text("The new pricing page is live")
    expect(launch.locator(".moment-meta")).to_contain_text("marked by Oj Okafor")
    expect(launch.get_by_role("link", name="The new pricing page is live")).to_have_attribute(
        "href", f"#/p/{PROJECT}/room/{message_id}")
    expect(launch.get_by_role("button", name=re.compile("^Remove"))).to_have_count(0)

    # The owner links the repository: GitHub's releases and merged pulls join the story.
    goto(oj, served, f"#/p/{PROJECT}/story")
    oj.locator(".story-settings summary").click()
    oj.get_by_label("GitHub repository").fill("octo/site")
    oj.get_by_role("button", name="Link", exact=True).click()
    expect(oj.locator(".story-source")).to_contain_text("From GitHub: octo/site")
    expect(ren.locator('.moment[data-source="github"] .moment-title')).to_have_text(
        ["Merged #12: Pull 12", "Released Version 2.0", "Merged #10: Pull 10", "Released Version 1.0"])
    # Days newest first, each a heading of its own.
    days = ren.locator(".story-day").evaluate_all("(els) => els.map((e) => e.dataset.day)")
    assert days == sorted(days, reverse=True) and "2026-11-20" in days and "2026-10-01" in days

    # Hiding a join names nobody; the member's view loses it live; the owner brings it back.
    join = oj.locator('.moment[data-kind="joined"]', has_text="Ren Ito joined")
    join.get_by_role("button", name=re.compile("^Hide")).click()
    expect(ren.locator(".moment", has_text="Ren Ito joined")).to_have_count(0)
    shot(oj, "story_desktop")
    expect(oj.locator(".story-settings[open]")).to_have_count(1)   # a live refresh keeps the settings open
    oj.get_by_role("button", name="Bring back 1 hidden moment").click()
    expect(ren.locator(".moment", has_text="Ren Ito joined")).to_have_count(1)
    shot(ren, "story_desktop_member")


def test_a_task_is_marked_from_its_page_and_the_story_fits_a_phone(served, people):
    task = mcp(served, "oj/muse", "handoff", {"project": PROJECT, "to": "ren/builder", "packet": {
        "task": "Draft the hero copy.", "deliverable_type": "doc", "acceptance_criteria": ["At most 8 words."]}})["task"]
    page = people("oj", PHONE)
    goto(page, served, f"#/p/{PROJECT}/room")
    # On a phone a message's rarer actions wait until it is tapped (focused): then Moment is in sight.
    first = page.locator(".msg").first
    expect(first.locator(".msg-moment")).to_be_hidden()
    first.focus()
    expect(first.locator(".msg-moment")).to_be_visible()
    shot(page, "story_room_phone", full_page=False)
    goto(page, served, f"#/p/{PROJECT}/tasks/{task['id']}")
    page.get_by_role("button", name="Mark as a moment").click()
    dialog = page.get_by_role("dialog", name="Mark a moment")
    dialog.get_by_label("Kind").select_option("milestone")
    dialog.get_by_label("Title").fill("Hero copy signed off")
    dialog.get_by_role("button", name="Mark it").click()
    goto(page, served, f"#/p/{PROJECT}/story")
    moment = page.locator(".moment", has_text="Hero copy signed off")
    expect(moment.get_by_role("link", name="Hero copy signed off")).to_have_attribute(
        "href", f"#/p/{PROJECT}/tasks/{task['id']}")
    width = page.evaluate("document.scrollingElement.scrollWidth")
    assert width <= PHONE["width"], width                             # nothing runs off the side
    box = moment.locator(".moment-kind").bounding_box()
    title = moment.locator(".moment-title").bounding_box()
    assert title["y"] > box["y"]                                       # on a phone the kind sits above the title
    shot(page, "story_phone")
    assert axe(page) == []
    # Edit is one's own; the dialog fits the phone too.
    moment.get_by_role("button", name=re.compile("^Edit")).click()
    dialog = page.get_by_role("dialog", name="Edit the moment")
    expect(dialog.get_by_label("Title")).to_have_value("Hero copy signed off")
    shot(page, "story_phone_edit", full_page=False)
    assert axe(page) == []
    dialog.get_by_label("Title").fill("Hero copy signed off by the team")
    dialog.get_by_role("button", name="Save").click()
    expect(page.locator(".moment-title", has_text="Hero copy signed off by the team")).to_have_count(1)


def axe(page) -> list[dict]:
    """The serious and critical violations axe-core finds on the page as it is (none checked without axe-core)."""
    if not AXE.exists():
        return []
    page.add_script_tag(path=str(AXE))
    found = page.evaluate("async () => (await axe.run(document, {resultTypes: ['violations']})).violations"
                          ".map((v) => ({id: v.id, impact: v.impact, nodes: v.nodes.map((n) => n.target.join(' '))}))")
    return [v for v in found if v["impact"] in ("serious", "critical")]
