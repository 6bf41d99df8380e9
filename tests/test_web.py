"""Browser tests of the people's page: a real ``prickle serve --demo`` and headless Chromium.

Playwright drives Debian's Chromium (``/usr/bin/chromium``); agents act over MCP with
plain HTTP POSTs (protocol 2026-07-28). Every test saves a screenshot to
``tests/screenshots/NAME.png`` and fails on any uncaught script error in the page. The served
demo, the browser and people signed in are browser.py's.
"""

from __future__ import annotations

import json
import re
import uuid

import httpx

from browser import (LAPTOP, PROJECT, at_name, cli_json, expect, goto, mcp, person_api, shot, signed_in_at_name,
                     with_passkey)
from conftest import Served

PHONE = {"width": 380, "height": 800}


def test_sign_in_with_the_printed_link_and_sign_out(served, people):
    page = people(None)
    expect(page.get_by_role("heading", name="Sign in to Prickle")).to_be_visible()
    expect(page.get_by_label("Personal token", exact=True)).to_be_visible()
    shot(page, "signed_out")

    page.goto(served.info["demo"]["signin"])  # the link `prickle serve --demo` printed for oj
    expect(page.get_by_role("heading", name="Hello, Oj Okafor")).to_be_visible()
    expect(page.get_by_role("link", name=re.compile("Website v2"))).to_be_visible()
    expect(page.locator(".me")).to_contain_text("@oj")
    shot(page, "signed_in_projects")

    page.get_by_role("link", name=re.compile("Website v2")).click()
    expect(page).to_have_url(re.compile(r"#/p/website-v2/room$"))
    page.reload()  # the hash keeps the place
    expect(page.get_by_role("link", name="Room")).to_have_attribute("aria-current", "page")

    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_role("heading", name="Sign in to Prickle")).to_be_visible()
    page.reload()  # the session is over on the server too
    expect(page.get_by_role("heading", name="Sign in to Prickle")).to_be_visible()
    page.goto(served.info["demo"]["signin"])  # a sign-in link works once
    expect(page.get_by_role("heading", name="Sign in to Prickle")).to_be_visible()
    expect(page.get_by_role("status")).to_have_text(
        "That sign-in link was already used. Ask whoever runs Prickle for a new one (they make it with prickle "
        "signin-link YOUR-HANDLE)")


def test_a_personal_token_signs_in_and_the_room_stays_live(served, people):
    token = cli_json(served.db, "token", "create", "--person", "ren")["token"]
    page = people(None)
    field = page.get_by_label("Personal token", exact=True)
    field.fill("prk_pt_not-a-real-token")
    page.get_by_role("button", name="Sign in with this token").click()
    expect(page.get_by_role("alert")).to_contain_text("not accepted")
    field.fill(token)
    page.get_by_role("button", name="Sign in with this token").click()
    expect(page.get_by_role("heading", name="Hello, Ren Ito")).to_be_visible()

    goto(page, served, f"#/p/{PROJECT}/room")
    expect(page.locator(".live")).to_have_text("Live")
    words = f"token path {uuid.uuid4().hex[:8]}"
    mcp(served, "oj/muse", "post_message", {"project": PROJECT, "body": f"@ren {words}"})
    expect(page.locator(".msg-body", has_text=words)).to_be_visible()  # long-polled: EventSource sends no bearer


def test_an_agent_message_appears_in_the_room_without_a_reload(served, people):
    page = people("oj")
    goto(page, served, f"#/p/{PROJECT}/room")
    expect(page.locator(".msg-body").first).to_be_visible()
    expect(page.locator(".live")).to_have_text("Live")
    page.evaluate("window.__sameDocument = true")

    words = f"Hero section is up on the preview {uuid.uuid4().hex[:8]}"
    posted = mcp(served, "ren/builder", "post_message", {"project": PROJECT, "body": f"@oj/muse {words}"})
    message = page.locator(f"#msg-{posted['message']['id']}")
    expect(message).to_contain_text(words)
    expect(message.locator(".msg-address")).to_have_text("ren/builder")
    expect(message.locator(".badge", has_text="agent-written")).to_be_visible()
    assert page.evaluate("window.__sameDocument") is True  # no reload happened

    # Reply with an @mention completed from the keyboard.
    message.hover()
    message.get_by_role("button", name="Reply to Builder").click()
    box = page.get_by_role("combobox")
    box.press_sequentially("Thanks @mu")
    expect(page.get_by_role("option").filter(has_text="@oj/muse")).to_have_attribute("aria-selected", "true")
    box.press("Enter")
    expect(box).to_have_value("Thanks @oj/muse ")
    box.press_sequentially("please draft the hero copy")
    box.press("Enter")
    mine = page.locator(".msg", has_text="please draft the hero copy")
    expect(mine).to_be_visible()
    expect(mine.locator(".msg-replyto")).to_contain_text("in reply to Builder")
    expect(mine.locator(".mention")).to_have_text("@oj/muse")
    expect(box).to_have_value("")
    shot(page, "room_live", full_page=False)


def test_denying_a_held_handoff_asks_once_more_and_then_says_it_was_denied(served, people):
    handoff = mcp(served, "oj/muse", "handoff", {"project": PROJECT, "to": "ren/builder", "packet": {
        "task": "Add a favicon.", "deliverable_type": "doc", "acceptance_criteria": ["A 32 px icon."]}})
    task_id, approval_id = handoff["task"]["id"], handoff["gate"]["approval_id"]
    ren = people("ren")
    goto(ren, served, "#/inbox")
    ren.locator(f'.inbox-row[data-item-id="approval:{approval_id}"] .inbox-row-head').click()
    card = ren.locator(f'.approval[data-task-id="{task_id}"]')
    card.get_by_role("button", name="Deny", exact=True).click()
    # One click only arms it: the task is still held, and the button says what a second click does.
    confirm = card.get_by_role("button", name="Deny: reject the task?")
    expect(confirm).to_be_visible()
    with person_api(served, "ren") as api:
        assert api.get(f"/api/tasks/{task_id}").json()["task"]["state"] == "approval"
    shot(ren, "handoff_deny_armed")
    confirm.click()
    expect(card.get_by_role("status")).to_have_text("Denied: the task was rejected.")
    expect(card.locator(".approval-head .badge")).to_have_text("denied")
    expect(card.locator(".approval-head")).not_to_contain_text("expires")
    with person_api(served, "ren") as api:
        assert api.get(f"/api/tasks/{task_id}").json()["task"]["state"] == "rejected"
    # Approved on the task's own page, written in Markdown: it says so there too, and the focus goes to it.
    other = mcp(served, "oj/muse", "handoff", {"project": PROJECT, "to": "ren/builder", "packet": {
        "task": "Add a **touch** icon.", "deliverable_type": "doc", "acceptance_criteria": ["A `180 px` icon."]}})
    goto(ren, served, f"#/p/{PROJECT}/tasks/{other['task']['id']}")
    held = ren.locator(f'.approval[data-task-id="{other["task"]["id"]}"]')
    expect(held.locator(".criteria-brief li")).to_have_text(["A 180 px icon."])
    expect(ren.locator(".criterion-text")).to_have_text(["A 180 px icon."])
    held.get_by_role("button", name="Approve", exact=True).click()
    expect(ren.locator(".decided-notice")).to_have_text("Approved: the task went to the agent.")
    expect(ren.locator(".decided-notice")).to_be_focused()
    expect(ren.locator(".task-meta .state")).to_have_text("routed")


def test_a_result_nothing_verifies_is_asked_for_in_the_thread_from_the_inbox_and_the_task_page(served, people):
    handoff = mcp(served, "oj/muse", "handoff", {"project": PROJECT, "to": "ren/builder", "packet": {
        "task": "Write the changelog.", "deliverable_type": "doc", "acceptance_criteria": ["Every release."]}})
    task_id = handoff["task"]["id"]
    with person_api(served, "ren") as api:
        assert api.post(f"/api/approvals/{handoff['gate']['approval_id']}", json={"decision": "approve"}).status_code == 200
    mcp(served, "ren/builder", "accept_task", {"task_id": task_id})
    mcp(served, "ren/builder", "return_result", {"task_id": task_id, "summary": "Changelog written.", "evidence": [
        {"kind": "note", "summary": "Lists 0.1 to 0.4.", "criteria": [0]}]})
    # No runner of oj/muse listens: oj's inbox says so, and asks the agent in the thread in one click.
    oj = people("oj")
    goto(oj, served, "#/inbox")
    row = oj.locator(f'.inbox-row[data-item-id="verify:{task_id}"]')
    row.locator(".inbox-row-head").click()
    row.get_by_role("button", name="Ask oj/muse in the thread").click()
    expect(row.get_by_role("status")).to_have_text(
        "Asked oj/muse in the thread: a session of it waiting for mentions hears it.")
    shot(oj, "inbox_verify_asked")
    goto(oj, served, f"#/p/{PROJECT}/tasks/{task_id}")
    expect(oj.locator(".thread-section .msg").last).to_contain_text(
        "@oj/muse revision 1 of the result waits for you to verify it")
    expect(oj.locator(".actions").get_by_role("button", name="Ask oj/muse in the thread")).to_be_visible()
    ren = people("ren")  # not the requesting agent's owner: nothing to ask
    goto(ren, served, f"#/p/{PROJECT}/tasks/{task_id}")
    expect(ren.locator(".task-meta .state")).to_have_text("verifying")
    expect(ren.get_by_role("button", name="Ask oj/muse in the thread")).to_have_count(0)


def test_a_held_handoff_is_approved_verified_and_finally_accepted(served, people):
    handoff = mcp(served, "oj/muse", "handoff", {"project": PROJECT, "to": "ren/builder", "packet": {
        "task": "Build the pricing page.", "deliverable_type": "doc",
        "acceptance_criteria": ["Three plans side by side.", "A clear call to action on each plan."],
        "context": "Plans: Free, Team, Business.", "files": ["src/pages/pricing.astro"]}})
    task_id = handoff["task"]["id"]
    assert handoff["task"]["state"] == "approval" and handoff["gate"]["decision"] == "approval_required"

    # ren, the assignee's owner, approves the held handoff in the inbox, its row opened.
    ren = people("ren")
    goto(ren, served, "#/inbox")
    ren.locator(f'.inbox-row[data-item-id="approval:{handoff["gate"]["approval_id"]}"] .inbox-row-head').click()
    card = ren.locator(f'.approval[data-task-id="{task_id}"]')
    expect(card).to_contain_text("Build the pricing page.")
    expect(card).to_contain_text("oj/muse asks your agent ren/builder")
    card.get_by_role("button", name="Approve", exact=True).click()
    expect(card.get_by_role("status")).to_have_text("Approved: the task went to the agent.")
    expect(card.locator(".approval-head .badge")).to_have_text("approved")  # no longer held, nor expiring
    expect(card.locator(".approval-head")).not_to_contain_text("expires")
    with person_api(served, "ren") as api:
        waiting = len(api.get("/api/inbox").json()["items"])
    expect(card).to_be_visible()  # the decided card stays in view, and is not counted as waiting
    expect(ren.locator(".inbox-count")).to_have_text(
        f"{waiting} {'thing waits' if waiting == 1 else 'things wait'} on you.")
    shot(ren, "handoff_approved")
    card.get_by_role("link", name="Build the pricing page.").click()
    expect(ren.locator(".task-meta .state")).to_have_text("routed")

    # ren/builder does the work; oj/muse verifies it — all over MCP, while ren watches live.
    mcp(served, "ren/builder", "accept_task", {"task_id": task_id})
    mcp(served, "ren/builder", "checkpoint", {"task_id": task_id, "checkpoint": {
        "progress": "Layout done.", "files_touched": ["src/pages/pricing.astro"], "next_steps": ["Write the CTAs."]}})
    returned = mcp(served, "ren/builder", "return_result", {"task_id": task_id, "summary": "Pricing page drafted.",
        "evidence": [{"kind": "screenshot", "summary": "Three plans in one row.", "url": "https://preview.example/pricing",
                      "criteria": [0]},
                     {"kind": "note", "summary": "Each plan ends with 'Start free'.", "criteria": [1]}]})
    expect(ren.locator(".task-meta .state")).to_have_text("verifying")
    sub = returned["submission"]
    verified = mcp(served, "oj/muse", "accept_result", {"task_id": task_id, "submission_id": sub["submission_id"],
        "revision": sub["revision"], "verdicts": [{"criterion": 0, "accepted": True}, {"criterion": 1, "accepted": True}],
        "artifacts": sub["artifacts"]})
    assert verified["task"]["state"] == "approval"

    # oj, the requester's owner, gives final acceptance on the task's page.
    oj = people("oj")
    goto(oj, served, f"#/p/{PROJECT}/tasks/{task_id}")
    expect(oj.get_by_role("heading", name="Build the pricing page.")).to_be_visible()
    criteria = oj.locator(".criterion")
    expect(criteria.nth(0)).to_contain_text("covered by #1")
    expect(criteria.nth(1)).to_contain_text("covered by #2")
    expect(criteria.nth(1)).to_contain_text("verifier: met")
    expect(oj.locator(".report")).to_contain_text("complete")
    expect(oj.locator(".tl-checkpoint-body")).to_contain_text("Layout done.")
    expect(oj.locator(".submission").get_by_role("link", name="https://preview.example/pricing")).to_be_visible()
    note = mcp(served, "ren/builder", "post_message", {"project": PROJECT, "task_id": task_id,
                                                      "body": "@oj/muse The preview is up for review."})
    expect(oj.locator(f".thread-section #msg-{note['message']['id']}")).to_contain_text("The preview is up for review.")
    decision = oj.locator(".decision")
    expect(decision.locator(".decision-lead")).to_have_text(
        "oj/muse verified it. Every criterion is covered by fresh evidence:")
    expect(decision.locator(".ce-criterion .ce-head")).to_have_text([
        "Criterion 1 Three plans side by side. covered by #1 verifier: met",
        "Criterion 2 A clear call to action on each plan. covered by #2 verifier: met"])
    expect(decision.locator(".ce-item-head")).to_have_text([
        "#1 screenshot Three plans in one row.", "#2 note Each plan ends with 'Start free'."])
    # The timeline names each wait for approval as the badge does: the gate's hold, then final acceptance.
    lines = oj.locator(".task-timeline .tl-line")
    expect(lines.filter(has_text="The gate held it")).to_have_text(
        "The gate held it for the assignee's owner to approve → awaiting handoff approval")
    expect(lines.filter(has_text="verified revision 1")).to_have_text(
        "oj/muse verified revision 1 → awaiting final acceptance")
    shot(oj, "task_ready_for_final_acceptance")
    oj.get_by_role("button", name="Give final acceptance").click()
    expect(oj.locator(".task-meta .state")).to_have_text("completed")
    expect(oj.locator(".submission-head").first).to_contain_text("owner-approved")
    expect(ren.locator(".task-meta .state")).to_have_text("completed")  # ren's page followed along
    shot(oj, "task_completed")

    goto(oj, served, f"#/p/{PROJECT}/tasks")
    expect(oj.locator(f'#col-completed [data-task-id="{task_id}"]')).to_be_visible()
    shot(oj, "task_board")


def test_ask_your_own_agent_then_send_back_and_cancel(served, people):
    page = people("oj")
    goto(page, served, f"#/p/{PROJECT}/tasks")
    page.get_by_text("Ask one of your agents").click()
    page.get_by_role("button", name="Ask the agent").click()
    expect(page.locator("textarea[name=task]:invalid")).to_have_count(1)  # the browser asks for it; nothing sent
    page.get_by_label("Agent", exact=True).select_option("oj/muse")
    page.get_by_label("Deliverable").select_option("doc")
    page.get_by_label("What to do").fill("Write the FAQ.")
    page.get_by_label("Acceptance criteria").fill("Five questions.\nPlain words.")
    page.get_by_role("button", name="Ask the agent").click()
    expect(page).to_have_url(re.compile(r"#/p/website-v2/tasks/[A-Za-z0-9_-]+$"))
    task_id = page.url.rsplit("/", 1)[1]
    state = page.locator(".task-meta .state")
    expect(state).to_have_text("routed")
    expect(page.locator(".criterion")).to_have_count(2)

    mcp(served, "oj/muse", "accept_task", {"task_id": task_id})
    mcp(served, "oj/muse", "return_result", {"task_id": task_id, "summary": "FAQ drafted.", "evidence": [
        {"kind": "note", "summary": "Five questions.", "criteria": [0]}]})
    expect(state).to_have_text("verifying")
    expect(page.locator(".criterion").nth(1)).to_contain_text("uncovered")
    expect(page.locator(".report")).to_contain_text("incomplete")
    decision = page.locator(".decision")
    expect(decision.locator(".decision-lead")).to_have_text(
        "1 of 2 criteria are covered by fresh evidence; check the gaps before you accept:")
    expect(decision.locator(".ce-criterion .ce-head")).to_have_text([
        "Criterion 1 Five questions. covered by #1", "Criterion 2 Plain words. no evidence"])
    expect(decision.locator(".ce-uncovered")).to_have_attribute("data-criterion", "1")
    expect(decision).not_to_contain_text("every criterion", ignore_case=True)
    shot(page, "final_decision_with_an_uncovered_criterion")
    page.get_by_text("Send it back with a reason").click()
    page.get_by_label("Why it goes back").fill("Criterion 2 has no evidence: show the words are plain.")
    page.get_by_role("button", name="Send back").click()
    expect(state).to_have_text("working")
    expect(page.locator(".submission-head").first).to_contain_text("rejected")
    expect(page.locator(".facts")).to_contain_text("Criterion 2 has no evidence")
    shot(page, "task_sent_back")

    page.get_by_text("Cancel the task…").click()
    cancel = page.get_by_role("button", name="Cancel task")
    cancel.click()
    page.get_by_role("button", name="Click again to cancel the task").click()
    expect(state).to_have_text("cancelled")

    goto(page, served, f"#/p/{PROJECT}/room")
    request = page.locator(".msg", has_text="Task request: Write the FAQ.")
    expect(request.get_by_role("link", name="open the task")).to_have_attribute("href", f"#/p/{PROJECT}/tasks/{task_id}")


def test_the_loop_guard_pause_shows_and_one_click_resumes(served, people):
    page = people("ren")
    goto(page, served, f"#/p/{PROJECT}/room")
    box = page.get_by_role("combobox")
    box.fill("Muse and Builder: settle the hero between you.")
    box.press("Enter")  # a person's message starts the count afresh
    expect(page.locator(".msg-body", has_text="settle the hero")).to_be_visible()
    pair = ("oj/muse", "ren/builder")
    for turn in range(10):
        me, other = pair if turn % 2 == 0 else pair[::-1]
        mcp(served, me, "post_message", {"project": PROJECT, "body": f"@{other} turn {turn}"})
    banner = page.locator(".paused-list .banner")
    expect(banner).to_contain_text("oj/muse and ren/builder are paused")
    expect(banner).to_contain_text("after 10 turns")
    shot(page, "loop_guard_paused")
    banner.get_by_role("button", name="Resume them").click()
    expect(banner).to_have_count(0)
    expect(page.locator(".msg-body", has_text="Resumed @oj/muse and @ren/builder")).to_be_visible()
    mcp(served, "oj/muse", "post_message", {"project": PROJECT, "body": "@ren/builder back to work"})  # not refused


def test_rules_and_a_standing_approval(served, people):
    held = mcp(served, "oj/muse", "handoff", {"project": PROJECT, "to": "ren/builder", "packet": {
        "task": "Review the docs navigation.", "deliverable_type": "answer",
        "acceptance_criteria": ["Say what is missing."]}})
    task_id = held["task"]["id"]
    page = people("ren")
    goto(page, served, f"#/p/{PROJECT}/tasks/{task_id}")
    card = page.locator(".actions .approval")
    expect(card).to_contain_text("oj/muse asks your agent ren/builder for answer work")
    card.get_by_text("Let similar requests through without asking").click()
    card.get_by_label("Up to (uses)").fill("3")
    card.get_by_label("For (days)").fill("7")
    card.get_by_role("button", name="Approve and allow more like it").click()
    expect(page.locator(".task-meta .state")).to_have_text("routed")

    goto(page, served, "#/rules")
    standing = page.locator("tr[data-standing-id]")
    expect(standing).to_contain_text("oj/muse")
    expect(standing).to_contain_text("ren/builder")
    expect(standing).to_contain_text("of 3")
    page.get_by_text("Add a rule").click()
    page.get_by_label("Decision").select_option("never")
    page.get_by_label("For", exact=True).select_option("agent")
    page.get_by_label("Who").fill("ren/builder")
    page.get_by_role("button", name="Save rule").click()
    expect(page.get_by_role("alert")).to_contain_text("Your own agents always reach each other")  # under the form
    page.get_by_label("Who").fill("oj/muse")
    page.get_by_role("button", name="Save rule").click()
    rule = page.locator("tr[data-rule-id]", has_text="Agent oj/muse")
    expect(rule).to_contain_text("Never")
    shot(page, "rules")
    for row in (rule, standing):
        row.get_by_role("button", name=re.compile("^Revoke")).click()
        row.get_by_role("button", name="Click again to revoke").click()
        expect(row).to_have_count(0)

    # The auto-accept switch shows the state the server holds (GET /api/me), and flips it.
    switch = page.get_by_role("switch", name="Auto-accept verified results")
    expect(switch).to_be_enabled()
    with person_api(served, "ren") as ren_api:
        state = "true" if ren_api.get("/api/me").json()["auto_accept"] else "false"
        expect(switch).to_have_attribute("aria-checked", state)
        flipped = "false" if state == "true" else "true"
        switch.click()
        expect(switch).to_have_attribute("aria-checked", flipped)
        assert ren_api.get("/api/me").json()["auto_accept"] is (flipped == "true")
    switch.press("Space")  # a switch works from the keyboard too
    expect(switch).to_have_attribute("aria-checked", state)
    expect(page.locator(".policy-status")).to_have_text(re.compile(f"^Auto-accept is {'on' if state == 'true' else 'off'}"))
    if state == "true":
        switch.click()
    expect(page.get_by_text("Auto-accept is off")).to_be_visible()


def test_html_in_a_message_body_is_shown_as_text(served, people):
    page = people("oj")
    dialogs = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    goto(page, served, f"#/p/{PROJECT}/room")
    box = page.get_by_role("combobox")
    expect(box).to_be_visible()
    payload = "<img src=x onerror=alert(1)>"
    box.fill(payload)
    box.press("Enter")
    agent_payload = "<script>alert(2)</script><b>bold</b>"
    mcp(served, "ren/builder", "post_message", {"project": PROJECT, "body": agent_payload})
    for text in (payload, agent_payload):
        expect(page.locator(".msg-body", has_text=text).last).to_have_text(text)
    assert page.locator("main img").count() == 0
    assert page.locator(".msg-body *:not(.mention)").count() == 0
    page.reload()  # rendered again from the room's pages, not the stream
    expect(page.locator(".msg-body", has_text=payload).last).to_have_text(payload)
    assert page.locator("img").count() == 0
    page.wait_for_timeout(300)
    assert dialogs == []
    shot(page, "message_html_as_text", full_page=False)


def test_team_pulse_warns_when_two_intents_touch_the_same_paths(served, people):
    page = people("oj")
    goto(page, served, f"#/p/{PROJECT}/pulse")
    expect(page.get_by_role("heading", name="Team Pulse")).to_be_visible()
    mcp(served, "ren/builder", "update_pulse", {"project": PROJECT, "availability": "working",
        "doing": "Building the pricing page.", "branch": "pricing-page", "files": ["src/pages/pricing.astro"],
        "last_decision": "Plans in one row on wide screens.", "intent": {"kind": "change", "paths": ["src/pages/**"]}})
    mcp(served, "oj/muse", "update_pulse", {"project": PROJECT, "availability": "working", "doing": "Editing the hero copy.",
        "intent": {"kind": "change", "paths": ["src/pages/index.astro"], "areas": ["hero"]}})
    warning = page.locator(".overlap")
    expect(warning).to_contain_text("intend to edit the same things")
    expect(warning).to_contain_text("oj/muse")
    expect(warning).to_contain_text("ren/builder")
    expect(warning).to_contain_text("src/pages/**")
    builder = page.locator('.pulse-card[data-agent="ren/builder"]')
    expect(builder).to_contain_text("Building the pricing page.")
    expect(builder).to_contain_text("pricing-page")
    expect(builder).to_contain_text("Plans in one row on wide screens.")
    expect(page.locator(".pulse-card.clash")).to_have_count(2)
    shot(page, "pulse_overlap")

    mcp(served, "oj/muse", "update_pulse", {"project": PROJECT, "availability": "idle", "doing": ""})  # intent cleared
    expect(warning).to_have_count(0)


def test_an_agent_key_is_shown_once_works_and_can_be_revoked(served, people):
    page = people("oj")
    goto(page, served, "#/agents")
    page.get_by_text("Add an agent").click()
    page.get_by_label(re.compile(r"^Name")).fill("scribe")
    expect(page.get_by_label("Display name", exact=True)).to_have_value("Scribe")
    page.get_by_label("Model", exact=True).fill("claude-sonnet-4")
    page.get_by_label("Client", exact=True).fill("claude-code")
    page.get_by_label("Role", exact=True).fill("Release notes")
    page.get_by_label("Capabilities", exact=True).fill("other:Docs\nrepo:website")
    page.get_by_label(re.compile("Website v2")).check()
    page.get_by_role("button", name="Add agent").click()
    scribe = page.locator('.agent-card[data-agent="oj/scribe"]')
    expect(scribe).to_contain_text("Release notes")
    expect(scribe).to_contain_text("repo: website")
    expect(scribe.get_by_role("link", name=PROJECT)).to_be_visible()
    expect(scribe.get_by_label("Which projects Scribe's key reaches")).to_contain_text(f"Only {PROJECT}")
    card = page.locator('.agent-card[data-agent="oj/muse"]')
    card.get_by_label("Key name for Muse's new key").fill("laptop")
    card.get_by_role("button", name="Make a key").click()
    secret = page.locator(".secret")
    expect(secret).to_contain_text("Copy it now")
    key = secret.locator("pre").first.inner_text().strip()
    assert key.startswith("prk_ck_")
    expect(secret).to_contain_text("claude mcp add --transport http prickle")
    expect(secret).to_contain_text("bearer_token_env_var")
    shot(page, "agent_key_shown_once")
    assert mcp(served, "oj/muse", "discover_team_agents", {"project": PROJECT}, key=key)["agents"]

    page.get_by_role("button", name=re.compile("hide the key")).click()
    expect(page.locator(".secret")).to_have_count(0)
    assert key not in page.content()
    page.reload()
    expect(page.locator(".agent-card").first).to_be_visible()
    assert key not in page.content()

    newest = page.locator("table.keys tbody tr").first
    expect(newest.locator(".key-name")).to_have_text("laptop")
    expect(newest.locator("td").nth(5)).not_to_have_text("never")  # it was used just now
    key_id = newest.get_attribute("data-key-id")
    newest.get_by_role("button", name=re.compile("^Revoke")).click()
    newest.get_by_role("button", name="Click again to revoke").click()  # the second click confirms
    # A revoked key leaves the list; the toggle shows it again, marked revoked.
    row = page.locator(f'table.keys tr[data-key-id="{key_id}"]')
    expect(row).to_have_count(0)
    toggle = page.get_by_label(re.compile(r"^Show revoked keys \(\d+\)$"))
    toggle.check()
    expect(row.locator(".badge")).to_have_text("revoked")
    expect(row.locator(".key-name")).to_have_text("laptop")
    shot(page, "keys_revoked_shown")
    r = httpx.post(served.info["mcp"], headers={"Authorization": f"Bearer {key}"}, json={})
    assert r.status_code == 401
    phone = people("oj", viewport={"width": 390, "height": 800})
    goto(phone, served, "#/agents")
    expect(phone.locator(f'table.keys tr[data-key-id="{key_id}"]')).to_have_count(0)
    phone.get_by_label(re.compile(r"^Show revoked keys")).check()
    expect(phone.locator(f'table.keys tr[data-key-id="{key_id}"] .key-name')).to_have_text("laptop")
    assert phone.evaluate("document.documentElement.scrollWidth") <= 390
    shot(phone, "phone_keys_revoked_shown")


def test_a_task_is_renamed_on_its_page_and_its_sub_tasks_show_what_they_wait_on(served, people):
    packet = {"task": "Write the launch post.", "deliverable_type": "doc", "acceptance_criteria": ["Under 400 words."]}
    with person_api(served, "ren") as ren, person_api(served, "oj") as oj:
        held = mcp(served, "oj/muse", "handoff", {"project": PROJECT, "to": "ren/builder", "packet": packet})
        ren.post(f"/api/approvals/{held['gate']['approval_id']}", json={"decision": "approve"}).raise_for_status()
        parent = held["task"]["id"]
        mcp(served, "ren/builder", "accept_task", {"task_id": parent})
        kids = []
        for words in ("Draft the outline.", "Write the body."):
            sub = mcp(served, "ren/builder", "handoff", {"project": PROJECT, "to": "oj/muse", "parent_task_id": parent,
                                                         "packet": packet | {"task": words}})
            oj.post(f"/api/approvals/{sub['gate']['approval_id']}", json={"decision": "approve"}).raise_for_status()
            kids.append(sub["task"]["id"])
        oj.post(f"/api/tasks/{kids[1]}/blocked-by", json={"blocked_by": [kids[0]]}).raise_for_status()

    page = people("oj")
    goto(page, served, f"#/p/{PROJECT}/tasks/{parent}")
    expect(page.get_by_role("heading", name="Write the launch post.", exact=True)).to_be_visible()
    subtasks = page.locator(".subtask-list li")
    expect(subtasks).to_have_count(2)
    expect(page.locator(f'.subtask-list li[data-task-id="{kids[1]}"] .badge-warn')).to_have_text("blocked")
    expect(page.locator(f'.subtask-list li[data-task-id="{kids[0]}"] .badge-warn')).to_have_count(0)
    page.locator(".names-box summary").click()
    page.get_by_label("Display title").fill("Launch post")
    page.get_by_role("button", name="Rename", exact=True).click()
    expect(page.get_by_role("heading", name="Launch post", exact=True)).to_be_visible()
    expect(page.locator(".packet-task")).to_have_text("Write the launch post.")  # the packet stays
    shot(page, "task_renamed")
    goto(page, served, f"#/p/{PROJECT}/tasks/{kids[1]}")
    expect(page.locator(".task-blocked")).to_contain_text("waits on Draft the outline.")
    page.locator(".names-box summary").click()
    expect(page.get_by_label("Draft the outline.")).to_be_checked()
    shot(page, "sub_task_waits_on_a_sibling")
    goto(page, served, f"#/p/{PROJECT}/tasks")
    expect(page.locator(f'[data-task-id="{parent}"] .task-card-title')).to_have_text("Launch post")
    expect(page.locator(f'[data-task-id="{kids[1]}"] .badge-warn')).to_have_text("blocked")

    phone = people("oj", viewport={"width": 390, "height": 800})
    goto(phone, served, f"#/p/{PROJECT}/tasks/{parent}")
    expect(phone.get_by_role("heading", name="Launch post", exact=True)).to_be_visible()
    phone.locator(".names-box summary").click()
    phone.get_by_role("button", name="Use the task's own words").click()
    expect(phone.get_by_role("heading", name="Write the launch post.", exact=True)).to_be_visible()
    assert phone.evaluate("document.documentElement.scrollWidth") <= 390
    shot(phone, "phone_task_with_sub_tasks")


def test_memory_facts_and_the_audit_log(served, people):
    page = people("oj")
    goto(page, served, f"#/p/{PROJECT}/memory")
    expect(page.locator('.fact[data-key="tone"]')).to_contain_text("Plain and warm")
    page.get_by_label("Key", exact=True).fill("launch-date")
    page.get_by_label("Value", exact=True).fill("The site goes live on 3 March.")
    page.get_by_role("button", name="Save fact").click()
    fact = page.locator('.fact[data-key="launch-date"]')
    expect(fact).to_contain_text("The site goes live on 3 March.")
    expect(fact).to_contain_text("set by @oj")
    expect(fact.locator(".badge")).to_contain_text("owner-approved")
    shot(page, "memory")
    fact.get_by_role("button", name="Retract launch-date").click()
    fact.get_by_role("button", name="Click again to retract").click()
    expect(fact).to_have_count(0)

    goto(page, served, f"#/p/{PROJECT}/audit")
    expect(page.locator(".chain")).to_contain_text("chain intact")
    first = page.locator("table.audit tbody tr").first
    expect(first).to_have_attribute("data-type", "memory.retracted")
    shot(page, "audit")


def test_a_new_project_with_a_teammate_and_only_your_projects(served, people):
    cli_json(served.db, "person", "add", "sam", "--name", "Sam Lee")
    cli_json(served.db, "project", "create", "secret-plans", "--name", "Secret plans", "--team", "ops", "--owner", "sam")
    cli_json(served.db, "team", "add", "web", "sam")  # a teammate in web, so oj can add sam
    page = people("oj")
    expect(page.get_by_role("link", name=re.compile("Secret plans"))).to_have_count(0)
    goto(page, served, "#/p/secret-plans/room")
    expect(page.get_by_role("heading", name="No such project in your list")).to_be_visible()

    goto(page, served, "#/")
    page.get_by_text("New project").click()
    page.get_by_label("Name", exact=True).fill("Launch plan")
    expect(page.get_by_label("Short name (slug)")).to_have_value("launch-plan")
    page.get_by_label("Team").fill("web")
    page.get_by_role("button", name="Create project").click()
    expect(page).to_have_url(re.compile(r"#/p/launch-plan/people$"))
    expect(page.locator('.person[data-handle="oj"]')).to_contain_text("owner")
    page.get_by_label("Person", exact=True).select_option("ren")
    page.get_by_role("button", name="Add teammate").click()
    expect(page.locator('.person[data-handle="ren"]')).to_contain_text("member")
    page.get_by_role("button", name="Add teammate").click()  # sam is the one left
    expect(page.locator('.person[data-handle="sam"]')).to_contain_text("member")
    shot(page, "project_people")


def test_the_members_screen_shows_each_role_agents_and_joined(served, people):
    with person_api(served, "oj") as api:  # other tests of this module may have added agents
        members = {m["handle"]: m for m in api.get(f"/api/projects/{PROJECT}/members").json()["members"]}
    assert members["oj"]["role"] == "owner" and "oj/muse" in members["oj"]["agents"]
    assert members["ren"]["role"] == "member" and "ren/builder" in members["ren"]["agents"]
    for viewport, name in ((LAPTOP, "members"), ({"width": 390, "height": 800}, "phone_members")):
        page = people("oj", viewport=viewport)
        goto(page, served, f"#/p/{PROJECT}/people")
        expect(page.get_by_role("heading", name="Members", exact=True)).to_be_visible()
        for handle in ("oj", "ren"):
            row = page.locator(f'.person[data-handle="{handle}"]')
            expect(row.locator(".badge")).to_have_text(members[handle]["role"])
            expect(row.locator(".member-agents")).to_have_text(f"agents: {', '.join(members[handle]['agents'])}")
            expect(row.locator(".member-joined time")).to_have_attribute("datetime", members[handle]["joined_at"])
        assert page.evaluate("document.documentElement.scrollWidth") <= viewport["width"]
        shot(page, name)


def test_a_team_owner_picks_a_default_lead_and_its_owner_agrees_then_steps_down(served, people):
    oj = people("oj")
    goto(oj, served, f"#/p/{PROJECT}/people")
    oj.get_by_label("Agent to lead the project").select_option("ren/builder")
    oj.get_by_role("button", name="Pick as default lead").click()
    expect(oj.locator(".lead-status")).to_have_text(
        "ren/builder was picked to lead this project by @oj; waiting for its owner to agree.")
    ren = people("ren", viewport={"width": 390, "height": 800})
    goto(ren, served, f"#/p/{PROJECT}/people")
    expect(ren.get_by_label("Agent to lead the project")).to_have_count(0)  # ren is no team owner
    ren.get_by_role("button", name="Agree to lead").click()
    expect(ren.locator(".lead-status")).to_have_text(
        "ren/builder leads this project: a person's message that names nobody wakes it.")
    assert ren.evaluate("document.documentElement.scrollWidth") <= 390
    shot(ren, "phone_default_lead_agreed")
    ren.get_by_role("button", name="Step down").click()
    expect(ren.locator(".lead-status")).to_have_text("No default lead: a message that names nobody wakes nobody.")
    with person_api(served, "oj") as api:
        assert api.get(f"/api/projects/{PROJECT}").json()["lead"] is None
        types = [e["type"] for e in api.get(f"/api/projects/{PROJECT}/audit").json()["entries"]]
    assert types.index("room.lead_declined") < types.index("room.lead_agreed")  # newest first


def test_phone_width_is_readable(served, people):
    page = people("ren", viewport=PHONE)
    goto(page, served, f"#/p/{PROJECT}/room")
    expect(page.get_by_role("combobox")).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    # The composer's placeholder fits its short box on a phone (the hint below says "@ to mention").
    expect(page.get_by_role("combobox")).to_have_attribute("placeholder", "Write to the room…")
    shot(page, "phone_room", full_page=False)
    page.set_viewport_size({"width": 1366, "height": 900})
    expect(page.get_by_role("combobox")).to_have_attribute("placeholder", "Write to the room… (@ to mention)")
    page.set_viewport_size(PHONE)
    goto(page, served, f"#/p/{PROJECT}/tasks")
    expect(page.get_by_role("heading", name="Tasks")).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    shot(page, "phone_tasks")


def test_a_runner_device_is_paired_shown_once_and_revoked(served, people):
    page = people("oj")
    goto(page, served, "#/agents")
    pair = page.locator("form.pair-form")
    pair.get_by_label("Agent", exact=True).select_option("oj/muse")
    pair.get_by_label("Device name (optional)").fill("oj-laptop")
    pair.get_by_role("button", name="Pair a device").click()
    secret = page.locator(".secret")
    expect(secret.get_by_role("heading")).to_have_text("Runner key for oj/muse on oj-laptop")
    expect(secret).to_contain_text("Copy it now")
    key = secret.locator("pre").first.inner_text().strip()
    assert key.startswith("prk_rk_")
    printed = secret.locator("pre").nth(1).inner_text()
    assert re.fullmatch(r"Paired device \S+ \(oj-laptop\) with oj/muse\. Runner key \(shown once\):\n" + key + r"\n?", printed)
    expect(secret.get_by_role("button", name="Copy")).to_have_count(2)
    row = page.locator("tr[data-device-id]", has_text="oj-laptop")
    expect(row).to_contain_text("oj/muse")
    expect(row.locator(".badge")).to_have_text("active")
    shot(page, "device_paired_key_shown_once")
    assert "cursor" in mcp(served, "oj/muse", "wait_for_mention", {"timeout_seconds": 1}, key=key)  # the runner listens

    page.get_by_role("button", name=re.compile("hide the key")).click()
    expect(page.locator(".secret")).to_have_count(0)
    assert key not in page.content()
    row.get_by_role("button", name="Revoke device oj-laptop (oj/muse)").click()
    row.get_by_role("button", name=re.compile("^Click again to revoke")).click()
    expect(row.locator(".badge")).to_have_text("revoked")
    expect(page.locator(".notice", has_text="Revoked oj-laptop")).to_have_text(
        "Revoked oj-laptop: 1 credential ended at once.")
    r = httpx.post(served.info["mcp"], headers={"Authorization": f"Bearer {key}"}, json={})
    assert r.status_code == 401
    shot(page, "device_revoked")


def ren_asks_builder(served: Served, task: str, criterion: str) -> tuple[str, str]:
    """ren pairs a runner for ren/builder and asks it for a task: ``(runner key, task id)``."""
    runner = cli_json(served.db, "device", "pair", "ren/builder", "--name", "ren-laptop")["token"]
    with person_api(served, "ren") as ren_api:
        asked = ren_api.post(f"/api/projects/{PROJECT}/task-requests", json={"agent": "ren/builder", "packet": {
            "task": task, "deliverable_type": "answer", "acceptance_criteria": [criterion]}})
    assert asked.status_code == 200, asked.text
    return runner, asked.json()["task"]["id"]


def test_a_run_asks_a_step_and_its_owner_allows_it_on_the_page(served, people):
    runner, task_id = ren_asks_builder(served, "Publish the docs branch.", "The branch is on origin.")
    claim = mcp(served, "ren/builder", "claim_task", {"task_id": task_id, "idempotency_key": "web-run-1"}, key=runner)
    run = claim["execution_credential"]["token"]
    mcp(served, "ren/builder", "accept_task", {"task_id": task_id}, key=run)
    step_call = {"tool_name": "Bash", "input": {"command": "git push origin main"}, "kind": "outbound",
                 "target": "origin", "reason": "Publish the reviewed branch."}
    pending = mcp(served, "ren/builder", "request_step", step_call, key=run)
    assert (pending["status"], pending["behavior"]) == ("pending", "deny")
    step = f'.step[data-step-id="{pending["step_id"]}"]'

    # On ren's home page, one line says a decision waits; the inbox's row opens into the exact call.
    page = people("ren")
    expect(page.locator(".inbox-line")).to_contain_text(re.compile(r"\b[1-9]\d* decisions?\b"))
    page.locator(".inbox-line").get_by_role("link", name="Open inbox").click()
    page.locator(f'.inbox-row[data-item-id="step:{pending["step_id"]}"] .inbox-row-head').click()
    card = page.locator(f".inbox-row {step}")
    expect(card.locator(".step-tool-name")).to_have_text("Bash")
    assert card.locator(".step-input").inner_text() == json.dumps(step_call["input"], indent=2)
    expect(card.locator(".step-facts")).to_contain_text("outbound")
    expect(card.locator(".step-facts")).to_contain_text("origin")
    expect(card.locator(".step-facts")).to_contain_text("Publish the reviewed branch.")
    expect(card).to_contain_text("ren/builder's run stopped before this call")
    shot(page, "step_waiting_in_the_inbox")

    # And on the task's page, where ren allows it.
    card.get_by_role("link", name="Publish the docs branch.").click()
    expect(page).to_have_url(re.compile(f"#/p/{PROJECT}/tasks/{task_id}$"))
    card = page.locator(f".actions {step}")
    expect(page.locator(".step-lead")).to_have_text("ren/builder's run is waiting for you: allow or refuse this step.")
    # The header agrees with the run: it waits on ren, not "working".
    expect(page.locator(".status-line")).to_have_text(
        "ren/builder waits for your decision on a step it asked to take (in your inbox).")
    expect(card.locator(".step-input")).to_contain_text('"command": "git push origin main"')
    shot(page, "step_on_the_task_page")
    card.get_by_role("button", name="Allow").click()
    expect(card.get_by_role("status")).to_have_text("Allowed: the run may make exactly this call once, within 15 minutes.")
    expect(card.get_by_role("button", name="Allow")).to_be_disabled()
    expect(page.locator(".step-lead")).to_have_count(0)  # the decision's task.updated redrew the page: nothing waits
    expect(page.locator(".status-line")).to_have_text("ren/builder is working on it.")

    used = mcp(served, "ren/builder", "request_step", step_call | {"tool_use_id": "toolu_web"}, key=run)
    assert (used["status"], used["behavior"]) == ("consumed", "allow")
    assert used["updatedInput"] == step_call["input"]
    goto(page, served, "#/")
    expect(page.get_by_role("heading", name=re.compile("^Hello, "))).to_be_visible()
    expect(page.locator(step)).to_have_count(0)


def test_a_private_room_turn_a_live_draft_and_an_approved_action(served, people):
    runner = cli_json(served.db, "device", "pair", "oj/muse", "--name", "oj-desktop")["token"]
    page = people("oj")
    page.locator('.project-card[data-slug="oj-room"]').click()
    expect(page).to_have_url(re.compile("#/p/oj-room/room$"))
    expect(page.locator(".project-bar .badge", has_text="private room")).to_be_visible()
    settings = page.locator(".room-settings")
    expect(settings.get_by_label("Reply mode")).to_have_value("review")
    settings.get_by_label("Reply mode").select_option("solo")
    expect(settings).to_contain_text("answers alone")
    settings.get_by_label("Lead agent").select_option("oj/muse")
    settings.get_by_role("button", name="Save").click()
    expect(settings.get_by_role("status")).to_have_text("Saved.")
    with person_api(served, "oj") as oj_api:
        assert oj_api.get("/api/room").json()["room"] == {"project": "oj-room", "reply_mode": "solo",
                                                         "lead_agent": "oj/muse",
                                                         "round": {"number": 0, "stopped": False}}

    # oj writes; the turn waits on the lead; its runner drafts with a discussion credential.
    box = page.get_by_role("combobox", name="Message")
    box.fill("A one-line welcome for the launch, please.")
    box.press("Enter")
    mine = page.locator(".msg", has_text="A one-line welcome for the launch")
    expect(mine).to_be_visible()
    turn = page.locator(".turn")
    expect(turn.locator(".turn-text")).to_have_text("Waiting on oj/muse to draft, 1 reply left.")
    shot(page, "private_room_turn_in_progress", full_page=False)
    claim = mcp(served, "oj/muse", "claim_discussion", {"message_id": mine.get_attribute("data-id"),
                                                        "idempotency_key": "d", "harness": 2}, key=runner)
    assert claim["role"] == "draft"
    draft = mcp(served, "oj/muse", "post_message", {"project": "oj-room", "body": "Welcome: work, together.",
                                                    "verdict": "draft"}, key=claim["discussion_credential"]["token"])
    shown = page.locator(f"#msg-{draft['message']['id']}")
    expect(shown.locator(".msg-body")).to_have_text("Welcome: work, together.")
    expect(shown.locator(".badge", has_text="verdict: draft")).to_be_visible()
    expect(turn).to_have_count(0)  # solo: the one reply ends the turn

    # The runner proposes a make-or-spend action: the card appears live, and oj approves it.
    def runner_post(path: str, body: dict) -> dict:
        r = httpx.post(served.info["url"] + path, json=body, headers={"Authorization": f"Bearer {runner}"}, timeout=30)
        assert r.status_code == 200, r.text
        return r.json()["action"]

    action = runner_post("/api/runner/actions", {"tool": "image_gen", "action": "Draw the hero", "prompt": "calm robots"})
    card = page.locator(f'.action-card[data-action-id="{action["id"]}"]')
    expect(card.locator(".action-title")).to_have_text("Draw the hero")
    expect(card.locator(".action-prompt")).to_have_text("calm robots")
    expect(card).to_contain_text("no estimate given")
    expect(card.locator(".action-status")).to_have_text("waiting for your decision")
    shot(page, "private_room_action_proposed", full_page=False)
    card.get_by_role("button", name="Approve").click()
    expect(card.locator(".action-status")).to_have_text("approved")
    expect(card.get_by_role("button", name="Approve")).to_have_count(0)
    expect(card).to_contain_text("Approved by@oj")
    runner_post(f"/api/runner/actions/{action['id']}/claim", {})
    expect(card.locator(".action-status")).to_have_text("running")  # live from action.updated
    runner_post(f"/api/runner/actions/{action['id']}/finish", {"body": "The hero: three calm robots at a desk."})
    expect(card.locator(".action-status")).to_have_text("done")
    result = page.locator(".msg", has_text="three calm robots at a desk")
    expect(result.locator(".badge", has_text="made by an approved action")).to_be_visible()
    expect(card.get_by_role("link", name="see the result")).to_be_visible()
    shot(page, "private_room_action_done")

    # A new turn, stopped from the page.
    box.fill("@oj/muse and a subtitle?")
    box.press("Enter")
    expect(turn.locator(".turn-text")).to_have_text("Waiting on oj/muse to draft, 1 reply left.")
    turn.get_by_role("button", name="Stop this turn").click()
    expect(turn).to_have_count(0)
    with person_api(served, "oj") as oj_api:
        assert oj_api.get("/api/room").json()["turn"] is None

    # A card waiting in the inbox is decided there too, its row opened.
    second = runner_post("/api/runner/actions", {"tool": "image_gen", "action": "Draw a banner", "prompt": "a quiet sea",
                                                 "cost_estimate": "about $0.04"})
    goto(page, served, "#/inbox")
    page.locator(f'.inbox-row[data-item-id="action:{second["id"]}"] .inbox-row-head').click()
    waiting = page.locator(f'.inbox-row .action-card[data-action-id="{second["id"]}"]')
    expect(waiting).to_contain_text("about $0.04")
    expect(waiting.get_by_role("link", name="Open it in your room")).to_have_attribute(
        "href", re.compile(r"^#/p/oj-room/room/"))
    shot(page, "action_waiting_in_the_inbox")
    waiting.get_by_role("button", name="Decline").click()
    expect(waiting.locator(".action-status")).to_have_text("declined")
    expect(waiting.get_by_role("status")).to_have_text("Declined: nothing will run.")

    page.set_viewport_size(PHONE)
    goto(page, served, "#/p/oj-room/room")
    expect(page.locator(".room-settings")).to_be_visible()
    expect(page.locator(f'.action-card[data-action-id="{second["id"]}"] .action-status')).to_have_text("declined")
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    shot(page, "phone_private_room")


def test_the_room_opens_at_the_newest_page_and_pages_back(served, people):
    cli_json(served.db, "project", "create", "long-talk", "--name", "Long talk", "--team", "web", "--owner", "oj")
    with person_api(served, "oj") as oj_api:
        for n in range(1, 121):
            r = oj_api.post("/api/projects/long-talk/messages", json={"body": f"Note {n:03}"})
            assert r.status_code == 200, r.text
        page = people("oj")
        goto(page, served, "#/p/long-talk/room")
        bodies = page.locator(".msg-body")
        expect(bodies.last).to_have_text("Note 120")
        expect(bodies).to_have_count(50)
        expect(bodies.first).to_have_text("Note 071")
        older = page.get_by_role("button", name="Show older messages")
        older.click()
        expect(bodies).to_have_count(100)
        expect(bodies.first).to_have_text("Note 021")
        expect(page.locator(".msg-body", has_text="Note 071")).to_be_in_viewport()  # the view stayed where it was
        older.focus()
        older.press("Enter")  # from the keyboard
        expect(bodies).to_have_count(120)
        expect(bodies.first).to_have_text("Note 001")
        expect(older).to_be_hidden()  # the start of the room
        shot(page, "room_paged_back", full_page=False)
        assert oj_api.post("/api/projects/long-talk/messages", json={"body": "Note 121"}).status_code == 200
        expect(bodies.last).to_have_text("Note 121")  # the stream still appends
        expect(bodies).to_have_count(121)


def test_the_room_stays_live_after_the_server_is_restored_from_an_older_backup(browser, tmp_path):
    db, backup = str(tmp_path / "prickle.db"), str(tmp_path / "backup.db")
    first = Served(db, "--demo")
    try:
        context = browser.new_context(viewport=LAPTOP)
        page = context.new_page()
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(cli_json(db, "signin-link", "oj")["signin"])
        expect(page.get_by_role("heading", name=re.compile(r"^Hello, "))).to_be_visible()
        page.goto(f"{first.info['url']}/#/p/{PROJECT}/room")
        expect(page.locator(".live")).to_have_text("Live")
        cli_json(db, "backup", backup)  # holds oj's browser session
        for i in range(12):  # the page sees seqs the backup never had
            mcp(first, "ren/builder", "post_message", {"project": PROJECT, "body": f"before the restore {i}"})
        expect(page.locator(".msg-body", has_text="before the restore 11")).to_be_visible()
    finally:
        first.stop()
    port = first.info["url"].rsplit(":", 1)[1]
    with Served(backup, "--demo", "--port", port) as restored:
        expect(page.locator(".live")).to_have_text("Live", timeout=20_000)  # the browser reconnected itself
        errors.clear()  # a refresh that ran while no server answered may have failed: that is not this test
        words = f"after the restore {uuid.uuid4().hex[:8]}"
        mcp(restored, "ren/builder", "post_message", {"project": PROJECT, "body": words})
        expect(page.locator(".msg-body", has_text=words)).to_be_visible()
        context.close()
    assert not errors, errors


def test_a_computer_is_connected_from_the_page_with_its_code(served, people):
    asked = httpx.post(served.info["url"] + "/api/runner/connect", json={"name": "ren-desk", "clis": ["claude", "codex"]})
    assert asked.status_code == 200, asked.text
    asked = asked.json()
    page = signed_in_at_name(people, served, "ren")  # a passkey confirms it's ren (tests/test_web_step_up.py)
    with_passkey(page, served, "ren")
    page.goto(at_name(asked["link"]))
    form = page.locator("form.connect-form")
    expect(page.locator(".connect-lead p").first).to_have_text("A computer calling itself ren-desk asks to run your agents.")
    expect(page.locator(".connect-origin")).to_contain_text("It asked from 127.0.0.1")
    assert asked["code"] not in page.locator(".connect").inner_text()  # the link's code is not shown to copy
    expect(form.get_by_label("Agent for codex")).to_have_value("ren/builder")  # the agent on that app comes first
    expect(form.get_by_label("Agent for claude")).to_have_value("__new__")
    form.locator('fieldset[data-cli="claude"]').get_by_label("New agent's name").fill("desk-claude")
    shot(page, "connect_request_desktop")
    phone = people("ren", viewport={"width": 390, "height": 844})
    phone.goto(asked["link"])
    expect(phone.locator("form.connect-form").get_by_role("button", name="Approve")).to_be_visible()
    shot(phone, "connect_request_phone")
    form.get_by_role("button", name="Approve").click()  # the code from the computer is not typed yet
    expect(form.get_by_label("The code your computer shows")).to_be_focused()
    form.get_by_label("The code your computer shows").fill("WXYZ-2345")
    form.get_by_role("button", name="Approve").click()
    expect(form.locator(".error")).to_contain_text("type the code your computer shows (prickle runner connect printed it)")
    form.get_by_label("The code your computer shows").fill(asked["code"].lower())
    form.get_by_role("button", name="Approve").click()
    page.get_by_role("dialog", name="Confirm it's you").get_by_role("button", name="Use my passkey").click()
    expect(page.locator(".connect-state")).to_have_text(
        "Approved: the runner on that computer is collecting its keys now. You can close this page.")
    got = httpx.post(served.info["url"] + "/api/runner/connect/collect",
                     json={"request_id": asked["request_id"], "collect_secret": asked["collect_secret"]}).json()
    assert [(a["agent_id"], a["client"]) for a in got["agents"]] == [("ren/desk-claude", "claude"),
                                                                     ("ren/builder", "codex")]
    assert all(a["key"] not in page.content() for a in got["agents"])
    page.reload()
    expect(page.locator(".connect-state")).to_have_text("Connected: the runner on that computer has its keys.")
    shot(page, "connect_collected")


def test_the_owner_stops_and_starts_a_run_on_the_task_page(served, people):
    runner, task_id = ren_asks_builder(served, "Rebuild the sitemap.", "The sitemap lists every page.")
    first = mcp(served, "ren/builder", "claim_task", {"task_id": task_id, "idempotency_key": "web-stop-1"}, key=runner)
    page = signed_in_at_name(people, served, "ren")  # a passkey confirms it's ren (tests/test_web_step_up.py)
    with_passkey(page, served, "ren")
    page.goto(at_name(f"{served.info['url']}/#/p/{PROJECT}/tasks/{task_id}"))
    row = page.locator(f'.runs-table tr[data-attempt-id="{first["attempt"]["attempt_id"]}"]')
    expect(row).to_contain_text("#1")
    expect(row).to_contain_text("ren-laptop")
    expect(row.locator(".badge")).to_have_text("running")
    shot(page, "task_run_running_desktop")
    page.get_by_role("button", name="Stop the run").click()
    page.get_by_role("button", name=re.compile("^Click again to stop")).click()
    expect(row.locator(".badge")).to_have_text("stopped")
    r = httpx.post(served.info["mcp"], headers={"Authorization": f"Bearer {first['execution_credential']['token']}"},
                   json={})
    assert r.status_code == 401  # its credentials ended at once
    start = page.locator("form.start-run")
    expect(start.locator(".hint")).to_have_text("Starts one run of ren/builder: its runner claims the task and "
                                                "launches the agent on your computer. You confirm it's you first.")
    start.get_by_role("button", name="Start a run").click()
    page.get_by_role("dialog", name="Confirm it's you").get_by_role("button", name="Use my passkey").click()
    expect(page.locator(".run-controls")).to_contain_text("A run was started: waiting for the runner to pick it up.")
    second = mcp(served, "ren/builder", "claim_task", {"task_id": task_id, "idempotency_key": "web-stop-2"}, key=runner)
    row2 = page.locator(f'.runs-table tr[data-attempt-id="{second["attempt"]["attempt_id"]}"]')
    expect(row2).to_contain_text("#2")  # the claim's task.updated redraws the page
    expect(row2.locator(".badge")).to_have_text("running")
    shot(page, "task_runs_desktop")
    phone = people("ren", viewport={"width": 390, "height": 844})
    goto(phone, served, f"#/p/{PROJECT}/tasks/{task_id}")
    expect(phone.locator(".runs-table tr[data-attempt-id]")).to_have_count(2)
    expect(phone.get_by_role("button", name="Stop the run")).to_be_visible()
    shot(phone, "task_runs_phone")


def test_an_owner_pauses_and_resumes_all_their_agents_on_the_page(served, people):
    page = people("oj")
    goto(page, served, "#/agents")
    pause = page.locator(".pause")
    expect(pause.locator(".pause-text")).to_have_text(
        "Pausing stops every run of your agents at its next call; runners start nothing until you resume.")
    pause.get_by_role("button", name="Pause all my agents").click()
    page.get_by_role("dialog", name="Pause all your agents?").get_by_role("button", name="Pause all my agents").click()
    expect(pause.locator(".pause-text")).to_have_text(
        "Your agents are paused: their runs are refused and their runners start nothing.")
    with person_api(served, "oj") as oj_api:
        assert oj_api.get("/api/agents/paused").json()["paused_by"] == "owner"
    shot(page, "agents_paused")
    pause.get_by_role("button", name="Resume all my agents").click()
    expect(pause.get_by_role("button", name="Pause all my agents")).to_be_visible()
    with person_api(served, "oj") as oj_api:
        assert oj_api.get("/api/agents/paused").json() == {"paused_by": None, "agents": []}


NOTIFICATION_STUB = """
window.__notes = [];
window.Notification = class {
  constructor(title, options) { window.__notes.push([title, (options || {}).body]); }
  static get permission() { return "granted"; }
  static requestPermission() { return Promise.resolve("granted"); }
};
"""


def waiting_count(served: Served, handle: str) -> int:
    with person_api(served, handle) as api:
        return api.get("/api/inbox").json()["count"]


def test_an_item_waiting_on_me_appears_in_the_inbox_live_and_is_acted_on_there(served, people):
    page = people("oj")
    page.add_init_script(NOTIFICATION_STUB)
    goto(page, served, "#/inbox")
    page.reload()
    expect(page.get_by_role("heading", name="Inbox")).to_be_visible()
    page.get_by_label("Notify me while Prickle is open").check()
    before = waiting_count(served, "oj")
    expect(page).to_have_title(f"({before}) Inbox · Prickle" if before else "Inbox · Prickle")

    # ren/builder asks oj/muse for work: oj's gate holds it, and it shows at once, counted and notified.
    held = mcp(served, "ren/builder", "handoff", {"project": PROJECT, "to": "oj/muse", "packet": {
        "task": "Proofread the pricing page.", "deliverable_type": "doc", "acceptance_criteria": ["No typos."]}})
    item = page.locator(f'.inbox-item[data-item-id="approval:{held["gate"]["approval_id"]}"]')
    expect(item).to_contain_text("Proofread the pricing page.")
    expect(item.locator(".inbox-project")).to_have_text("Website v2")
    item.locator(".inbox-row-head").click()
    expect(item.locator(".inbox-where")).to_contain_text("Website v2")
    expect(page).to_have_title(f"({before + 1}) Inbox · Prickle")
    expect(page.locator(".inbox-badge")).to_have_text(str(before + 1))
    assert page.evaluate("window.__notes") == [["Held handoff · Website v2", "Proofread the pricing page."]]
    item.get_by_role("button", name="Approve", exact=True).click()
    expect(item.get_by_role("status")).to_have_text("Approved: the task went to the agent.")
    expect(page).to_have_title(f"({before}) Inbox · Prickle" if before else "Inbox · Prickle")

    # oj's own request comes back with a gap: accepting it from the inbox asks to confirm first.
    with person_api(served, "oj") as api:
        asked = api.post(f"/api/projects/{PROJECT}/task-requests", json={"agent": "oj/muse", "packet": {
            "task": "Write the launch note.", "deliverable_type": "doc",
            "acceptance_criteria": ["Under 100 words.", "Links the pricing page."]}}).json()["task"]
    mcp(served, "oj/muse", "accept_task", {"task_id": asked["id"]})
    mcp(served, "oj/muse", "return_result", {"task_id": asked["id"], "summary": "Drafted.", "evidence": [
        {"kind": "note", "summary": "82 words.", "criteria": [0]}]})
    final = page.locator(f'.inbox-item[data-item-id="final_acceptance:{asked["id"]}"]')
    final.locator(".inbox-row-head").click()
    expect(final.locator(".inbox-gaps")).to_have_text("Check first: no evidence for criterion 2.")
    shot(page, "inbox_desktop")
    page.set_viewport_size({"width": 390, "height": 800})
    expect(final).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    shot(page, "inbox_phone")
    page.set_viewport_size(LAPTOP)

    # The board marks the tasks that need oj, from the same list, and "Needs me" shows only those.
    with person_api(served, "oj") as api:
        needing = {i["task_id"] for i in api.get("/api/inbox").json()["items"]
                   if i["project"] == PROJECT and i["task_id"] and i["kind"] != "mention"}
    assert asked["id"] in needing
    goto(page, served, f"#/p/{PROJECT}/tasks")
    expect(page.locator(f'.task-card[data-task-id="{asked["id"]}"] .badge', has_text="needs you")).to_be_visible()
    expect(page.locator(".task-card.needs-you")).to_have_count(len(needing))
    page.get_by_role("button", name="Needs me").click()
    expect(page.locator(".task-card")).to_have_count(len(needing))
    goto(page, served, "#/inbox")
    final.locator(".inbox-row-head").click()
    accept = final.locator(".button-row button")
    expect(accept).to_have_text("Give final acceptance")
    with person_api(served, "oj") as api:  # made first: the armed button disarms after 5 s
        accept.click()
        expect(accept).to_have_text("Accept with gaps? Click again")
        assert api.get(f"/api/tasks/{asked['id']}").json()["task"]["state"] == "verifying"  # one click did nothing
        accept.click()
        expect(final.get_by_role("status")).to_have_text("Accepted: the task is completed.")
        assert api.get(f"/api/tasks/{asked['id']}").json()["task"]["state"] == "completed"
    assert len(page.evaluate("window.__notes")) == 2  # the result was new; oj's own clicks notify nothing


def test_unread_markers_and_the_title_count_follow_a_message_and_reading_it(served, people):
    cli_json(served.db, "project", "create", "quiet-room", "--name", "Quiet room", "--team", "web", "--owner", "oj")
    cli_json(served.db, "member", "add", "quiet-room", "ren")
    cli_json(served.db, "agent", "join", "quiet-room", "ren/builder")
    page = people("oj")
    marker = page.locator('.project-card[data-slug="quiet-room"] .unread-badge')
    expect(page.locator('.project-card[data-slug="quiet-room"]')).to_be_visible()
    expect(marker).to_be_hidden()
    before = waiting_count(served, "oj")
    expect(page).to_have_title(f"({before}) Prickle" if before else "Prickle")

    posted = mcp(served, "ren/builder", "post_message", {"project": "quiet-room", "body": "@oj the numbers are in"})
    mcp(served, "ren/builder", "post_message", {"project": "quiet-room", "body": "and the chart"})
    expect(marker).to_have_text("2")
    expect(page).to_have_title(f"({before + 1}) Prickle")  # the mention waits on oj; the other message is unread
    expect(page.locator(".inbox-line")).to_contain_text(  # the same count everywhere
        f"{before + 1} {'thing waits' if before == 0 else 'things wait'} for you")
    expect(page.locator(".inbox-badge")).to_have_text(str(before + 1))
    shot(page, "unread_on_home")

    page.locator('.project-card[data-slug="quiet-room"]').click()
    expect(page.locator(f"#msg-{posted['message']['id']}")).to_be_visible()
    expect(page).to_have_title(f"({before}) Room · Quiet room · Prickle" if before else "Room · Quiet room · Prickle")
    goto(page, served, "#/")
    expect(page.locator('.project-card[data-slug="quiet-room"]')).to_be_visible()
    expect(marker).to_be_hidden()


def test_an_owner_removes_a_member_and_their_task_comes_back_on_the_board(served, people):
    # kim joins with an agent and takes a task from oj/muse; oj removes kim on the Members screen.
    cli_json(served.db, "person", "add", "kim", "--name", "Kim Park")
    cli_json(served.db, "team", "add", "web", "kim")
    cli_json(served.db, "member", "add", PROJECT, "kim")
    cli_json(served.db, "agent", "add", "kim/helper", "--name", "Helper", "--model", "m", "--client", "claude-code",
             "--project", PROJECT)
    with person_api(served, "kim") as kim:
        assert kim.post("/api/rules", json={"decision": "allow", "owner": "oj"}).status_code == 200
    task = mcp(served, "oj/muse", "handoff", {"project": PROJECT, "to": "kim/helper", "packet": {
        "task": "Check the footer links.", "deliverable_type": "doc", "acceptance_criteria": ["Every link works."]}})
    task_id = task["task"]["id"]
    assert task["task"]["state"] == "routed"
    for viewport, name in (({"width": 390, "height": 800}, "phone_member_removal_confirm"),
                           (LAPTOP, "member_removal_confirm")):
        page = people("oj", viewport=viewport)
        goto(page, served, f"#/p/{PROJECT}/people")
        page.locator('.person[data-handle="kim"]').get_by_role("button", name="Remove Kim Park").click()
        confirm = page.get_by_role("alertdialog", name=f"Remove Kim Park (@kim) from Website v2?")
        expect(confirm.locator(".removal-summary li")).to_have_text([
            "Their agents leave the project: kim/helper.",
            "1 open task assigned to them goes back to its requester (returned), to be handed to another agent.",
            "0 open tasks they asked for pass to a project owner.",
            "Delegation rules and standing approvals naming them that apply in no other project are revoked, and "
            "keys for this project alone end."])
        assert page.evaluate("document.documentElement.scrollWidth") <= viewport["width"]
        shot(page, name, full_page=False)
    confirm.get_by_role("button", name="Keep").click()
    expect(confirm).to_have_count(0)
    page.locator('.person[data-handle="kim"]').get_by_role("button", name="Remove Kim Park").click()
    confirm.get_by_role("button", name="Remove Kim Park").click()
    expect(page.locator('.person[data-handle="kim"]')).to_have_count(0)
    goto(page, served, f"#/p/{PROJECT}/tasks")
    card = page.locator(f'#col-approval .task-card[data-task-id="{task_id}"]')
    expect(card).to_contain_text("returned")
    expect(card).to_contain_text("needs you")
    shot(page, "returned_task_on_the_board")
    goto(page, served, "#/inbox")
    page.locator(f'.inbox-row[data-item-id="returned:{task_id}"] .inbox-row-head').click()
    waiting = page.locator(f'.inbox-returned[data-task-id="{task_id}"]')
    expect(waiting).to_contain_text("Returned by kim/helper.")
    waiting.get_by_role("link", name="Hand it on").click()
    expect(page.locator(".status-line")).to_have_text(
        "Returned by kim/helper: it waits for you to hand it to another agent.")
    goto(page, served, f"#/p/{PROJECT}/tasks")
    card.click()
    expect(page.locator(".status-line")).to_have_text(
        "Returned by kim/helper: it waits for you to hand it to another agent.")
    page.get_by_label("Agent", exact=True).select_option("ren/builder")
    with page.expect_response(lambda r: r.url.endswith(f"/api/tasks/{task_id}/reassign")) as answer:
        page.get_by_role("button", name="Hand to this agent").click()
    handed = answer.value.json()["task"]
    assert handed["assignee"] == "ren/builder" and handed["state"] in ("routed", "approval")  # ren's gate decides
    expect(page.locator(".task-meta .state")).to_have_attribute("data-state", handed["state"])


def test_whoever_is_removed_is_offered_again_by_the_pickers_without_a_reload(served, people):
    # lee (a teammate) and oj/scout are in the project; oj removes both on the Members screen.
    cli_json(served.db, "person", "add", "lee", "--name", "Lee Moss")
    cli_json(served.db, "member", "add", PROJECT, "lee")
    cli_json(served.db, "agent", "add", "oj/scout", "--name", "Scout", "--model", "m", "--client", "claude-code",
             "--project", PROJECT)
    page = people("oj")
    goto(page, served, f"#/p/{PROJECT}/people")
    add_person = page.get_by_role("form", name="Add a teammate")
    expect(page.locator('.person[data-handle="lee"]')).to_have_count(1)
    expect(add_person.get_by_label("Person").locator('option[value="lee"]')).to_have_count(0)
    # The only owner is offered no Leave (the server would refuse it); with another owner, Leave is there.
    expect(page.locator('.person[data-handle="oj"]')).to_contain_text("owner")
    expect(page.get_by_role("button", name="Leave", exact=True)).to_have_count(0)
    cli_json(served.db, "member", "promote", PROJECT, "lee")
    page.reload()
    # Leaving speaks to you about your own agents; Keep changes nothing.
    page.get_by_role("button", name="Leave", exact=True).click()
    leaving = page.get_by_role("alertdialog", name="Leave Website v2?")
    expect(leaving.locator(".removal-summary li").first).to_have_text(
        re.compile(r"^Your agents leave the project: (\S+, )*oj/scout(, \S+)*\.$"))
    expect(leaving.locator(".removal-summary li").nth(1)).to_contain_text(" assigned to your agents go")
    leaving.get_by_role("button", name="Keep").click()
    page.locator('.person[data-handle="lee"]').get_by_role("button", name="Remove Lee Moss").click()
    page.get_by_role("alertdialog").get_by_role("button", name="Remove Lee Moss").click()
    expect(page.locator('.person[data-handle="lee"]')).to_have_count(0)
    expect(add_person.get_by_label("Person").locator("option")).to_contain_text(["Lee Moss (@lee)"])
    page.get_by_role("button", name="Remove agent oj/scout from the project").click()
    page.get_by_role("alertdialog").get_by_role("button", name="Remove agent").click()
    expect(page.get_by_role("button", name="Remove agent oj/scout from the project")).to_have_count(0)
    expect(page.get_by_role("form", name="Bring one of your agents").get_by_label("Your agent").locator("option")
           ).to_contain_text(["Scout (oj/scout)"])
    add_person.get_by_label("Person").select_option("lee")
    add_person.get_by_role("button", name="Add teammate").click()
    expect(page.locator('.person[data-handle="lee"]')).to_have_count(1)
    shot(page, "pickers_after_a_removal")


def test_an_owner_invites_a_teammate_who_signs_up_and_joins_in_another_browser(served, people):
    tag = uuid.uuid4().hex[:6]
    oj = people("oj")
    goto(oj, served, f"#/p/{PROJECT}/people")
    oj.get_by_label("Email address").fill(f"kim-{tag}@example.org")
    oj.get_by_role("button", name="Send invite").click()
    made = oj.locator(".invite-made .notice")
    expect(made).to_contain_text(f"Not mailed: no mail server is configured")
    link = oj.get_by_label("Invite link").input_value()
    assert re.fullmatch(rf"{re.escape(served.info['url'])}/#/invite/prk_iv_[A-Za-z0-9_-]+", link)
    expect(oj.locator(".invite-row", has_text=f"kim-{tag}@example.org")).to_contain_text("by @oj")
    shot(oj, "invite_made_on_members")

    kim = people(None, link=link)  # a second browser, signed out
    expect(kim.get_by_role("heading", name="Join Website v2")).to_be_visible()
    expect(kim.locator(".invite-from")).to_contain_text("Oj Okafor @oj invites you to the project “Website v2”")
    shot(kim, "invite_landing_desktop")
    kim.get_by_label("Handle").fill(f"kim-{tag}")
    kim.get_by_label("Display name").fill("Kim Park")
    kim.get_by_role("button", name="Sign up and join").click()
    expect(kim).to_have_url(re.compile(rf"#/p/{PROJECT}/room$"))
    expect(kim.locator(".me")).to_contain_text(f"@kim-{tag}")

    oj.reload()
    expect(oj.locator(f'.person[data-handle="kim-{tag}"]')).to_contain_text("member")
    expect(oj.locator(".invite-row", has_text=f"kim-{tag}@example.org")).to_have_count(0)
    kim.goto(link)  # the link works once
    expect(kim.get_by_role("heading", name="This invite can't be used")).to_be_visible()
    expect(kim.get_by_role("alert")).to_contain_text("already used")

    # At phone width the landing page reads, and an owner can still revoke an invite.
    oj.get_by_label("Email address").fill(f"lee-{tag}@example.org")
    oj.get_by_role("button", name="Send invite").click()
    second = oj.get_by_label("Invite link").input_value()
    assert second != link
    phone = people(None, viewport={"width": 390, "height": 844}, link=second)
    expect(phone.get_by_role("heading", name="Join Website v2")).to_be_visible()
    assert phone.evaluate("document.documentElement.scrollWidth") <= 390
    shot(phone, "invite_landing_390")
    row = oj.locator(".invite-row", has_text=f"lee-{tag}@example.org")
    row.get_by_role("button", name=f"Revoke the invite to lee-{tag}@example.org").click()
    row.get_by_role("button", name=re.compile("Click again to revoke")).click()
    expect(oj.locator(".invite-row", has_text=f"lee-{tag}@example.org")).to_have_count(0)


def test_the_owner_takes_an_agent_out_of_their_private_room_and_adds_it_back(served, people):
    page = people("oj")
    goto(page, served, "#/p/oj-room/room")
    members = page.locator(".room-settings .room-agents")
    row = members.locator(".room-agent", has_text="oj/muse")
    expect(row).to_contain_text("in this room")
    row.get_by_role("button", name="Take out").click()
    expect(row.get_by_role("button", name="Add back")).to_be_visible()
    expect(row).to_contain_text("not in this room")
    shot(page, "private_room_agent_taken_out", full_page=False)
    row.get_by_role("button", name="Add back").click()
    expect(row.get_by_role("button", name="Take out")).to_be_visible()
    with person_api(served, "oj") as oj_api:
        assert {a["agent_id"]: a["in_room"] for a in oj_api.get("/api/room").json()["agents"]}["oj/muse"] is True
