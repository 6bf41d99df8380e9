"""Browser tests: pausing one agent (confirmed, and shown wherever the agent appears), the header's
paused chip, the phone's one-row top bar and its menu, devices as cards on a phone, 44 px touch
targets, the open invites following an accepted one live, and an axe-core sweep of every screen.

Like tests/test_web.py: a real ``prickle serve --demo`` and headless Chromium driven by Playwright;
agents act over MCP with plain HTTP POSTs. Screenshots go to tests/screenshots/.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import httpx
import pytest

from browser import PROJECT, Page, cli_json, expect, goto, mcp, person_api, shot

AXE = Path(__file__).resolve().parent.parent / ".cache" / "axe" / "node_modules" / "axe-core" / "axe.min.js"
DESKTOP = {"width": 1366, "height": 900}
PHONE = {"width": 390, "height": 844}
PAUSE_MEANS = ("Its run in progress is refused at its next call and stops; its runner starts nothing new (no task, "
               "no private-room turn). Messages and tasks for it wait, and it picks them up when you resume it.")
PAUSE_ALL_MEANS = ("Each run of theirs in progress is refused at its next call and stops; their runners start nothing "
                   "new (no task, no private-room turn). Messages and tasks for them wait until you resume them.")
PAUSED = "ren/builder is paused by ren: nothing of it runs until it is resumed."


def running_task(served, text: str) -> tuple[str, dict]:
    """ren asks ren/builder for ``text`` and its runner claims it: ``(task id, claim answer)``."""
    runner = cli_json(served.db, "device", "pair", "ren/builder", "--name", f"ren-{uuid.uuid4().hex[:4]}")["token"]
    with person_api(served, "ren") as ren_api:
        asked = ren_api.post(f"/api/projects/{PROJECT}/task-requests", json={"agent": "ren/builder", "packet": {
            "task": text, "deliverable_type": "answer", "acceptance_criteria": ["It is done."]}})
    assert asked.status_code == 200, asked.text
    task_id = asked.json()["task"]["id"]
    claim = mcp(served, "ren/builder", "claim_task", {"task_id": task_id, "idempotency_key": uuid.uuid4().hex},
                key=runner)
    return task_id, claim


def paused_now(served, handle: str) -> dict:
    with person_api(served, handle) as api:
        return api.get("/api/agents/paused").json()


def box(page: Page, selector: str) -> dict:
    found = page.locator(selector).first.bounding_box()
    assert found is not None, selector
    return found


# ---- pausing one agent ------------------------------------------------------------------------------


def test_an_owner_pauses_one_agent_after_a_confirmation_and_everyone_sees_it_paused(served, people):
    task_id, claim = running_task(served, "Rebuild the footer.")
    attempt = claim["attempt"]["attempt_id"]
    oj = people("oj", viewport=DESKTOP)  # a teammate, watching the task as it happens
    goto(oj, served, f"#/p/{PROJECT}/tasks/{task_id}")
    expect(oj.locator(".status-line")).to_have_text("Handed to ren/builder; it has not accepted the task yet.")
    row = oj.locator(f'.runs-table tr[data-attempt-id="{attempt}"]')
    expect(row.locator(".badge")).to_have_text("running")

    ren = people("ren", viewport=DESKTOP)
    goto(ren, served, "#/agents")
    card = ren.locator('.agent-card[data-agent="ren/builder"]')
    expect(ren.locator(".pause-chip-box")).to_be_hidden()
    card.get_by_role("button", name="Pause ren/builder").click()
    dialog = ren.get_by_role("dialog", name="Pause Builder (ren/builder)?")
    expect(dialog.locator(".pause-means")).to_have_text(PAUSE_MEANS)
    dialog.get_by_role("button", name="Cancel").click()  # asked first: cancelling pauses nothing
    expect(dialog).to_have_count(0)
    assert paused_now(served, "ren") == {"paused_by": None, "agents": []}
    card.get_by_role("button", name="Pause ren/builder").click()
    shot(ren, "pause_one_agent_confirm_1366", full_page=False)
    ren.get_by_role("dialog").get_by_role("button", name="Pause ren/builder").click()
    expect(card.locator(".agent-pause")).to_contain_text("pausedPaused by ren")
    expect(card.get_by_role("button", name="Resume ren/builder")).to_be_visible()
    chip = ren.locator(".pause-chip")
    expect(chip).to_have_text("1 agent paused")
    assert [(a["agent_id"], a["scope"]) for a in paused_now(served, "ren")["agents"]] == [("ren/builder", "agent")]
    shot(ren, "pause_one_agent_card_1366")

    # the teammate's task page follows live: the status, the run row, the note under the runs
    expect(oj.locator(".status-line")).to_have_text(PAUSED)
    expect(row.locator(".badge")).to_have_text("paused: stops at its next call")
    expect(oj.locator(".runs .paused-note")).to_have_text(PAUSED)
    shot(oj, "pause_task_page_teammate_1366")
    goto(oj, served, f"#/p/{PROJECT}/pulse")
    pulse = oj.locator('.pulse-card[data-agent="ren/builder"]')
    expect(pulse.locator(".pulse-head .badge")).to_have_text("paused")
    expect(pulse.locator(".paused-note")).to_have_text(PAUSED)
    expect(oj.locator('.pulse-card[data-agent="oj/muse"] .paused-note')).to_have_count(0)
    shot(oj, "pause_pulse_1366")
    expect(oj.locator(".pause-chip-box")).to_be_hidden()  # none of oj's agents is paused

    # the owner's own task page says how to resume it
    goto(ren, served, f"#/p/{PROJECT}/tasks/{task_id}")
    expect(ren.locator(".run-controls .notice")).to_have_text(
        "You paused ren/builder: nothing of it runs until you resume it (Agents & keys, or the paused chip at the top).")
    expect(ren.locator(".status-line")).to_have_text(PAUSED)

    # the chip lists it; Resume there, and Pulse follows
    goto(oj, served, f"#/p/{PROJECT}/pulse")
    chip.click()
    panel = ren.locator("#pause-panel")
    expect(panel.locator('li[data-agent="ren/builder"]')).to_contain_text("Builder ren/builderPaused by ren")
    shot(ren, "pause_chip_open_1366", full_page=False)
    panel.get_by_role("button", name="Resume ren/builder").click()
    expect(ren.locator(".pause-chip-box")).to_be_hidden()
    expect(ren.locator(".status-line")).to_have_text("Handed to ren/builder; it has not accepted the task yet.")
    expect(oj.locator('.pulse-card[data-agent="ren/builder"] .paused-note')).to_have_count(0)
    assert paused_now(served, "ren") == {"paused_by": None, "agents": []}


def test_the_paused_chip_stays_in_the_phones_one_row_bar_and_resumes_there(served, people):
    with person_api(served, "oj") as oj_api:
        assert oj_api.post("/api/agents/oj/muse/pause").json()["paused"] is True
    page = people("oj", viewport=PHONE)
    chip = page.locator(".pause-chip")
    expect(chip).to_have_text("1 agent paused")
    assert box(page, ".topbar")["height"] <= 60
    assert box(page, ".pause-chip")["height"] >= 44
    chip.click()
    panel = page.locator("#pause-panel")
    expect(panel).to_be_visible()
    assert box(page, "#pause-panel")["x"] >= 0 and box(page, "#pause-panel")["width"] <= PHONE["width"]
    shot(page, "pause_chip_open_390", full_page=False)
    panel.get_by_role("button", name="Resume oj/muse").click()
    expect(page.locator(".pause-chip-box")).to_be_hidden()


def test_pause_all_asks_first_and_the_chip_counts_every_agent(served, people):
    page = people("oj", viewport=DESKTOP)
    goto(page, served, "#/agents")
    pause = page.locator(".pause")
    pause.get_by_role("button", name="Pause all my agents").click()
    dialog = page.get_by_role("dialog", name="Pause all your agents?")
    expect(dialog.locator(".pause-means")).to_have_text(PAUSE_ALL_MEANS)
    dialog.get_by_role("button", name="Pause all my agents").click()
    expect(pause.locator(".pause-text")).to_have_text(
        "Your agents are paused: their runs are refused and their runners start nothing.")
    expect(page.locator(".pause-chip")).to_have_text("1 agent paused")
    expect(page.locator('.agent-card[data-agent="oj/muse"] .agent-pause')).to_contain_text("Paused by oj")
    assert paused_now(served, "oj")["paused_by"] == "owner"
    pause.get_by_role("button", name="Resume all my agents").click()
    expect(page.locator(".pause-chip-box")).to_be_hidden()
    assert paused_now(served, "oj") == {"paused_by": None, "agents": []}


# ---- the phone ----------------------------------------------------------------------------------------


def test_the_top_bar_is_one_row_on_a_phone_with_a_menu_that_opens_and_navigates(served, people):
    page = people("ren", viewport=PHONE)
    for hash_, ready in (("#/", "h1"), (f"#/p/{PROJECT}/room", ".msg"), ("#/inbox", "h1"), ("#/agents", ".agent-card")):
        goto(page, served, hash_)
        expect(page.locator(ready).first).to_be_visible()
        assert box(page, ".topbar")["height"] <= 60, hash_
    toggle = page.get_by_role("button", name="Menu")
    expect(toggle).to_have_attribute("aria-expanded", "false")
    links = page.locator(".global-nav a")
    expect(links.filter(has_text="Inbox")).to_be_visible()  # what waits on you stays in sight
    for name in ("Projects", "Agents & keys", "Rules"):
        expect(links.filter(has_text=name)).to_be_hidden()
    expect(page.locator("#search")).to_be_hidden()
    assert box(page, ".menu-toggle")["height"] >= 44
    shot(page, "phone_top_bar_390", full_page=False)
    toggle.click()
    expect(toggle).to_have_attribute("aria-expanded", "true")
    nav = page.get_by_role("navigation", name="Main")
    expect(nav).to_be_visible()
    expect(page.locator("#search")).to_be_visible()
    expect(page.locator(".topbar .me")).to_contain_text("Ren Ito")
    for link in nav.get_by_role("link").all():
        assert link.bounding_box()["height"] >= 44
    shot(page, "phone_menu_open_390", full_page=False)
    nav.get_by_role("link", name="Rules").click()
    page.wait_for_function("() => location.hash === '#/rules'")
    expect(page.get_by_role("heading", level=1)).to_be_visible()
    expect(toggle).to_have_attribute("aria-expanded", "false")
    expect(nav.get_by_role("link", name="Rules")).to_be_hidden()
    toggle.click()
    page.locator("#search").fill("sitemap")
    page.locator("#search").press("Enter")
    page.wait_for_function("() => location.hash.startsWith('#/search')")
    expect(page.locator("#search")).to_be_hidden()
    expect(toggle).to_have_attribute("aria-expanded", "false")

    desk = people("ren", viewport=DESKTOP)
    expect(desk.get_by_role("button", name="Menu")).to_be_hidden()
    expect(desk.get_by_role("navigation", name="Main")).to_be_visible()
    assert box(desk, ".topbar")["height"] <= 64
    shot(desk, "top_bar_1366", full_page=False)


def test_devices_are_cards_on_a_phone_with_revoke_in_reach(served, people):
    name = f"oj-phone-{uuid.uuid4().hex[:4]}"
    cli_json(served.db, "device", "pair", "oj/muse", "--name", name)
    page = people("oj", viewport=PHONE)
    goto(page, served, "#/agents")
    row = page.locator("tr[data-device-id]", has_text=name)
    agent = row.locator('td[data-label="Agent"]')
    expect(agent).to_have_text("oj/muse")
    assert agent.evaluate("(td) => getComputedStyle(td, '::before').content") == '"Agent: "'
    assert row.evaluate("(tr) => getComputedStyle(tr).display") == "grid"
    revoke = row.get_by_role("button", name=f"Revoke device {name} (oj/muse)")
    revoke.scroll_into_view_if_needed()
    expect(revoke).to_be_visible()
    found = revoke.bounding_box()
    assert found["x"] >= 0 and found["x"] + found["width"] <= PHONE["width"]
    assert found["height"] >= 44 and found["width"] >= 44
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    shot(page, "devices_cards_390")
    revoke.click()
    row.get_by_role("button", name=re.compile("^Click again to revoke")).click()
    expect(row.locator(".badge")).to_have_text("revoked")


def test_reply_raw_and_the_tabs_are_44_px_touch_targets_on_a_phone(served, people):
    task_id, _ = running_task(served, "Write **the launch note**.")
    page = people("ren", viewport=PHONE)
    goto(page, served, f"#/p/{PROJECT}/room")
    reply = page.locator(".msg-reply").first
    expect(reply).to_be_visible()
    found = reply.bounding_box()
    assert found["height"] >= 44 and found["width"] >= 44
    for tab in page.locator(".tabs a").all():
        assert tab.bounding_box()["height"] >= 44
    goto(page, served, f"#/p/{PROJECT}/tasks/{task_id}")
    raw = page.locator(".raw-toggle").first
    expect(raw).to_be_visible()
    found = raw.bounding_box()
    assert found["height"] >= 44 and found["width"] >= 44
    shot(page, "touch_targets_task_390")


# ---- invites -------------------------------------------------------------------------------------------


def test_the_open_invites_follow_an_accepted_invite_without_a_reload(served, people):
    tag = uuid.uuid4().hex[:6]
    page = people("oj", viewport=DESKTOP)
    goto(page, served, f"#/p/{PROJECT}/people")
    page.get_by_label("Email address").fill(f"ana-{tag}@example.org")
    page.get_by_role("button", name="Send invite").click()
    secret = page.get_by_label("Invite link").input_value().rsplit("/", 1)[1]
    row = page.locator(".invite-row", has_text=f"ana-{tag}@example.org")
    expect(row).to_be_visible()
    r = httpx.post(served.info["url"] + "/api/invite/accept",
                   json={"token": secret, "handle": f"ana-{tag}", "display_name": "Ana Lima"})
    assert r.status_code == 200, r.text
    expect(row).to_have_count(0)
    expect(page.locator(f'.person[data-handle="ana-{tag}"]')).to_contain_text("member")
    shot(page, "invites_live_after_accept_1366")


# ---- axe-core -------------------------------------------------------------------------------------------


def axe_violations(page: Page) -> list[dict]:
    """The serious and critical axe-core violations on the page as it is now: ``[{id, impact, nodes}]``."""
    page.add_script_tag(path=str(AXE))
    result = page.evaluate(
        "async () => (await axe.run(document, {resultTypes: ['violations']})).violations"
        ".map((v) => ({id: v.id, impact: v.impact, nodes: v.nodes.map((n) => n.target.join(' '))}))")
    return [v for v in result if v["impact"] in ("serious", "critical")]


@pytest.mark.skipif(not AXE.exists(), reason=f"axe-core is not installed at {AXE} (.ci/run installs it)")
@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("width", ["desktop", "phone"])
def test_axe_finds_no_serious_or_critical_violation_on_any_screen(served, browser, width, scheme):
    task_id, _ = running_task(served, f"Check the {scheme} {width} screens.")
    with person_api(served, "oj") as oj_api:  # an owner's screens, with one of their agents paused
        assert oj_api.post(f"/api/projects/{PROJECT}/invites", json={"email": f"{scheme}-{width}@example.org"}).status_code == 200
        assert oj_api.post("/api/agents/oj/muse/pause").status_code == 200
    context = browser.new_context(viewport=DESKTOP if width == "desktop" else PHONE, color_scheme=scheme)
    try:
        page = context.new_page()
        page.goto(cli_json(served.db, "signin-link", "oj")["signin"])
        expect(page.get_by_role("heading", name=re.compile(r"^Hello, "))).to_be_visible()
        screens = (("#/", "h1"), ("#/inbox", "h1"), (f"#/p/{PROJECT}/room", ".msg"),
                   (f"#/p/{PROJECT}/tasks/{task_id}", ".status-line"), (f"#/p/{PROJECT}/tasks", ".board, .task-table"),
                   (f"#/p/{PROJECT}/people", ".invite-row"), (f"#/p/{PROJECT}/pulse", ".paused-note"),
                   ("#/agents", ".agent-pause .badge"), ("#/rules", "h1"), ("#/p/oj-room/room", "h1"),
                   ("#/search?q=footer", ".search-hit, .empty"))
        found = {}
        for hash_, ready in screens:
            goto(page, served, hash_)
            expect(page.locator(ready).first).to_be_visible()
            found[hash_] = axe_violations(page)
        # what opens over a screen: the phone's menu, the paused chip's list, the pause dialog
        if width == "phone":
            page.get_by_role("button", name="Menu").click()
            found["menu"] = axe_violations(page)
            page.get_by_role("button", name="Menu").click()
        page.locator(".pause-chip").click()
        expect(page.locator("#pause-panel")).to_be_visible()
        found["chip"] = axe_violations(page)
        page.locator(".pause-chip").click()
        goto(page, served, "#/agents")
        page.locator(".pause").get_by_role("button", name="Pause all my agents").click()
        expect(page.get_by_role("dialog")).to_be_visible()
        found["dialog"] = axe_violations(page)
        shot(page, f"axe_pause_dialog_{width}_{scheme}", full_page=False)
        page.get_by_role("dialog").get_by_role("button", name="Cancel").click()
        bad = {k: v for k, v in found.items() if v}
        assert not bad, json.dumps(bad, indent=1)
    finally:
        context.close()
        with person_api(served, "oj") as oj_api:
            oj_api.post("/api/agents/oj/muse/resume")
