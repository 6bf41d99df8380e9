"""Browser tests of a person's day on the page: what waits in the morning, answering, reading
Markdown, the members on a phone, handing work on, keys and outages.

Like tests/test_page.py: a real ``prickle serve --demo`` and headless Chromium driven by
Playwright; agents act over MCP with plain HTTP POSTs. Screenshots go to tests/screenshots/.
"""

from __future__ import annotations

import re

from browser import PROJECT, Page, cli_json, expect, goto, mcp, person_api, read_all, shot
from conftest import Served

PHONE = {"width": 390, "height": 844}


# ---- helpers ---------------------------------------------------------------------------------------


def lines(page: Page, selector: str) -> list[int]:
    """How many lines each element matching ``selector`` is drawn on (one rectangle per line)."""
    return page.evaluate("(sel) => [...document.querySelectorAll(sel)].map((el) => el.getClientRects().length)", selector)


def text_lines(page: Page, selector: str) -> list[int]:
    """How many lines the text of each element matching ``selector`` runs over (pieces that overlap sit on one line)."""
    return page.evaluate("""(sel) => [...document.querySelectorAll(sel)].map((el) => {
        const range = document.createRange();
        range.selectNodeContents(el);
        const rects = [...range.getClientRects()].filter((r) => r.width > 0).sort((a, b) => a.top - b.top);
        let count = 0, bottom = -Infinity;
        for (const r of rects) if (r.top >= bottom - 1) { count += 1; bottom = r.bottom; } else bottom = Math.max(bottom, r.bottom);
        return count;
    })""", selector)


# ---- tests ------------------------------------------------------------------------------------------


def test_a_mention_waiting_in_the_inbox_reads_as_formatted_markdown(served, people):
    body = ("@oj The plan for the pricing page:\n\n- three plans\n- one call to action each\n\n"
            "```\nnpm run build -- --filter pricing\n```\n\nDetails in [the brief](https://example.com/brief).")
    posted = mcp(served, "ren/builder", "post_message", {"project": PROJECT, "body": body})
    page = people("oj")
    goto(page, served, "#/inbox")
    page.locator(f'.inbox-row[data-item-id="mention:{posted["message"]["id"]}"] .inbox-row-head').click()
    card = page.locator(f'.inbox-mention[data-message-id="{posted["message"]["id"]}"]')
    expect(card.locator(".inbox-body li")).to_have_text(["three plans", "one call to action each"])
    expect(card.locator(".inbox-body pre code")).to_have_text("npm run build -- --filter pricing")
    expect(card.get_by_role("link", name="the brief")).to_have_attribute("href", "https://example.com/brief")
    expect(card.locator(".inbox-body .mention")).to_have_text("@oj")
    expect(card.locator(".inbox-body")).not_to_contain_text("```")
    shot(page, "inbox_mention_markdown")


def test_the_members_list_on_a_phone_keeps_each_name_and_its_agents_whole(served, people):
    page = people("oj", PHONE)
    goto(page, served, f"#/p/{PROJECT}/people")
    ren = page.locator('.person[data-handle="ren"]')
    expect(ren.get_by_role("button", name="Remove Ren Ito")).to_be_visible()
    assert lines(page, ".person-name strong") == [1, 1]  # "Ren Ito" was broken over two lines
    assert lines(page, ".member-agents") == [1, 1]  # and "agents: ren/builder" over five
    assert page.evaluate("document.documentElement.scrollWidth") == PHONE["width"]
    shot(page, "members_on_a_phone")


def test_on_a_phone_each_link_of_the_top_bar_is_one_line_with_its_count_and_all_in_view(served, people):
    mcp(served, "ren/builder", "post_message", {"project": PROJECT, "body": "@oj The hero image is in."})
    page = people("oj", PHONE)
    page.get_by_role("button", name="Menu").click()  # on a phone the links sit in the top bar's menu
    inbox = page.get_by_role("navigation", name="Main").get_by_role("link", name=re.compile(r"^Inbox"))
    expect(inbox.locator(".inbox-badge")).to_have_text(re.compile(r"^[1-9]"))
    assert text_lines(page, ".global-nav a") == [1, 1, 1, 1]  # "Agents & keys" and "Inbox N" were two lines
    rights = page.evaluate("[...document.querySelectorAll('.global-nav a')].map((a) => a.getBoundingClientRect().right)")
    assert max(rights) <= PHONE["width"]  # and none hides past the edge
    shot(page, "top_bar_on_a_phone", full_page=False)


def test_on_a_phone_every_tab_of_a_project_is_in_view_and_the_current_one_too(served, people):
    page = people("oj", PHONE)
    goto(page, served, f"#/p/{PROJECT}/audit")
    expect(page.get_by_role("heading", name="Audit log")).to_be_visible()
    tabs = page.locator(".tabs a")
    expect(tabs).to_have_text(["Room", "Tasks", "Team Pulse", "Members", "Memory", "Story", "Audit"])
    rights = page.evaluate("[...document.querySelectorAll('.tabs a')].map((a) => a.getBoundingClientRect().right)")
    assert max(rights) <= PHONE["width"], rights  # Memory and Audit sat past the edge, the strip's scrollbar hidden
    expect(page.locator('.tabs a[aria-current="page"]')).to_have_text("Audit")
    shot(page, "project_tabs_on_a_phone", full_page=False)


def test_answering_and_accepting_in_the_inbox_by_keyboard_keeps_the_focus_on_the_outcome(served, people):
    with person_api(served, "oj") as oj:
        ids = [oj.post(f"/api/projects/{PROJECT}/task-requests", json={"agent": "oj/muse", "packet": {
            "task": task, "deliverable_type": "doc", "acceptance_criteria": ["One line."]}}).json()["task"]["id"]
            for task in ("Pick the hero font.", "Write the hero line.")]
    for task_id in ids:
        mcp(served, "oj/muse", "accept_task", {"task_id": task_id})
    mcp(served, "oj/muse", "checkpoint", {"task_id": ids[0], "checkpoint": {
        "progress": "Two fonts shortlisted.", "open_questions": ["Serif or sans?"], "needs_answer": True}})
    mcp(served, "oj/muse", "return_result", {"task_id": ids[1], "summary": "Hero line drafted.", "evidence": [
        {"kind": "note", "summary": "One line.", "criteria": [0]}]})
    page = people("oj")
    goto(page, served, "#/inbox")
    for item_id in (f"question:{ids[0]}", f"final_acceptance:{ids[1]}"):
        page.locator(f'.inbox-row[data-item-id="{item_id}"] .inbox-row-head').click()
    question = page.locator(f'.inbox-question[data-task-id="{ids[0]}"]')
    question.get_by_label("Your answer to oj/muse").fill("Sans, please.")
    page.keyboard.press("Tab")
    expect(question.get_by_role("button", name="Send answer")).to_be_focused()
    page.keyboard.press("Enter")
    expect(question.get_by_role("status")).to_have_text("Answered in the task's thread.")
    expect(question.get_by_role("status")).to_be_focused()  # the page itself had it: the spent button was disabled

    final = page.locator(f'.inbox-final[data-task-id="{ids[1]}"]')
    final.get_by_role("button", name="Give final acceptance").focus()
    page.keyboard.press("Enter")
    expect(final.get_by_role("status")).to_have_text("Accepted: the task is completed.")
    expect(final.get_by_role("status")).to_be_focused()
    page.keyboard.press("Shift+Tab")  # the place is kept: back to the card's own link beside the spent button
    expect(final.get_by_role("link", name="Open the task")).to_be_focused()


def test_approving_a_held_handoff_by_keyboard_keeps_the_focus_on_the_outcome(served, people):
    held = mcp(served, "oj/muse", "handoff", {"project": PROJECT, "to": "ren/builder", "packet": {
        "task": "Build the pricing page.", "deliverable_type": "doc", "acceptance_criteria": ["Three plans."]}})
    assert held["task"]["state"] == "approval"
    page = people("ren")
    goto(page, served, "#/inbox")
    page.locator(f'.inbox-row[data-item-id="approval:{held["gate"]["approval_id"]}"] .inbox-row-head').click()
    card = page.locator(f'.approval[data-task-id="{held["task"]["id"]}"]')
    card.get_by_role("button", name="Approve", exact=True).focus()
    page.keyboard.press("Enter")
    expect(card.get_by_role("status")).to_have_text("Approved: the task went to the agent.")
    expect(card.get_by_role("status")).to_be_focused()


def test_on_a_phone_a_message_that_arrives_while_you_read_the_newest_shows_above_the_composer(served, people):
    with person_api(served, "oj") as oj:
        for n in range(25):
            assert oj.post(f"/api/projects/{PROJECT}/messages", json={"body": f"Morning note {n:02}"}).status_code == 200
        read_all(oj)  # oj has read the room: it opens at its newest message, not at unread ones
    page = people("oj", PHONE)
    goto(page, served, f"#/p/{PROJECT}/room")
    expect(page.locator(".msg-body").last).to_have_text("Morning note 24")
    expect(page.locator(".room-side")).to_be_visible()  # on a phone the task threads sit below the composer
    page.wait_for_function("() => document.querySelector('.msg:last-child').getBoundingClientRect().bottom"
                           " <= document.querySelector('.room-foot').getBoundingClientRect().top")
    posted = mcp(served, "ren/builder", "post_message", {"project": PROJECT, "body": "The hero image is in."})
    arrived = page.locator(f"#msg-{posted['message']['id']}")
    expect(arrived).to_have_text(re.compile("The hero image is in."))
    page.wait_for_function("(id) => document.getElementById(id).getBoundingClientRect().bottom"
                           " <= document.querySelector('.room-foot').getBoundingClientRect().top",
                           arg=f"msg-{posted['message']['id']}")
    expect(arrived).to_be_in_viewport()
    shot(page, "phone_message_arrives", full_page=False)


def test_on_a_phone_the_room_says_beside_the_composer_when_the_connection_drops_and_when_it_is_back(browser, tmp_path):
    db = str(tmp_path / "prickle.db")
    first = Served(db, "--demo")
    context = browser.new_context(viewport=PHONE)
    try:
        page = context.new_page()
        page.goto(cli_json(db, "signin-link", "oj")["signin"])
        expect(page.get_by_role("heading", name=re.compile(r"^Hello, "))).to_be_visible()
        page.goto(f"{first.info['url']}/#/p/{PROJECT}/room")
        expect(page.locator(".live")).to_have_text("Live")
        dropped = page.locator(".room-foot .room-offline")
        expect(dropped).to_be_hidden()
        first.stop()
        expect(page.locator(".live")).to_have_text("Reconnecting…", timeout=20_000)
        expect(dropped).to_have_text("Reconnecting… New messages show here once the connection is back.")
        expect(dropped).to_be_in_viewport()  # the header with its "Live" has scrolled away on a phone
        shot(page, "phone_room_reconnecting", full_page=False)
        # A message sent meanwhile stays in the box with why; that reason goes once the stream is back.
        box = page.get_by_role("combobox", name="Message")
        box.fill("Sent while away")
        page.get_by_role("button", name="Send").click()
        why = page.locator(".room-foot .composer .error")
        expect(why).to_contain_text("Could not reach the Prickle server")
        expect(box).to_have_value("Sent while away")
        port = first.info["url"].rsplit(":", 1)[1]
        with Served(db, "--port", port):
            expect(page.locator(".live")).to_have_text("Live", timeout=20_000)
            expect(dropped).to_be_hidden()
            expect(why).to_be_hidden()
            expect(box).to_have_value("Sent while away")
    finally:
        first.stop()
        context.close()


def test_a_link_beside_a_button_in_an_inbox_card_sits_on_the_buttons_middle(served, people):
    with person_api(served, "oj") as oj:
        task_id = oj.post(f"/api/projects/{PROJECT}/task-requests", json={"agent": "oj/muse", "packet": {
            "task": "Write the footer line.", "deliverable_type": "doc", "acceptance_criteria": ["One line."]}}
        ).json()["task"]["id"]
    mcp(served, "oj/muse", "accept_task", {"task_id": task_id})
    mcp(served, "oj/muse", "return_result", {"task_id": task_id, "summary": "Footer line drafted.", "evidence": [
        {"kind": "note", "summary": "One line.", "criteria": [0]}]})
    page = people("oj", PHONE)
    goto(page, served, "#/inbox")
    page.locator(f'.inbox-row[data-item-id="final_acceptance:{task_id}"] .inbox-row-head').click()
    card = page.locator(f'.inbox-final[data-task-id="{task_id}"]')
    expect(card.get_by_role("link", name="Open the task")).to_be_visible()
    middles = page.evaluate("""(sel) => [sel + ' .button-row button', sel + ' .button-row a'].map((s) => {
        const range = document.createRange();
        range.selectNodeContents(document.querySelector(s));  // the words, not the box the row stretches
        const r = range.getBoundingClientRect();
        return r.top + r.height / 2;
    })""", f'.inbox-final[data-task-id="{task_id}"]')
    assert abs(middles[0] - middles[1]) <= 1, middles  # the link's words sat at the top of the row
