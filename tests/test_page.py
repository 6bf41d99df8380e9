"""Browser tests of the page's rough spots: where the newest message sits, the final decision's
evidence, a phone's width, rules, set-up lines, the audit log, outages, the keyboard and axe-core.

Like tests/test_web.py: a real ``prickle serve --demo`` and headless Chromium driven by
Playwright; agents act over MCP with plain HTTP POSTs. Screenshots go to tests/screenshots/.
The axe-core checks read the pinned copy .ci/run installs into .cache/axe.
"""

from __future__ import annotations

import datetime
import re
from pathlib import Path

import pytest

from browser import LAPTOP, PROJECT, Page, cli_json, expect, goto, mcp, person_api, read_all, shot
from conftest import Served

AXE = Path(__file__).resolve().parent.parent / ".cache" / "axe" / "node_modules" / "axe-core" / "axe.min.js"
PHONE = {"width": 390, "height": 844}
#: A phone with its on-screen keyboard up: what is left of the screen for the page.
PHONE_TYPING = {"width": 390, "height": 480}


def covered_by_composer(page: Page, selector: str) -> float:
    """How many pixels of the element the room's sticky composer covers (0 when it sits above it)."""
    return page.evaluate("""(sel) => {
        const el = document.querySelector(sel);
        const foot = document.querySelector('.room-foot');
        return Math.max(0, el.getBoundingClientRect().bottom - foot.getBoundingClientRect().top);
    }""", selector)


def a_task_with_gaps(served: Served) -> str:
    """oj asks oj/muse for three things; the result covers one, covers one with stale evidence only, misses one."""
    with person_api(served, "oj") as oj:
        r = oj.post(f"/api/projects/{PROJECT}/task-requests", json={"agent": "oj/muse", "packet": {
            "task": "Write the launch note for src/components/pricing/PlanComparisonTableWithFootnotes.astro",
            "deliverable_type": "doc",
            "acceptance_criteria": ["Under 200 words.", "Names the three plans.", "Links the pricing page."]}})
        assert r.status_code == 200, r.text
        task_id = r.json()["task"]["id"]
    mcp(served, "oj/muse", "accept_task", {"task_id": task_id})
    old = (datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
    out = mcp(served, "oj/muse", "return_result", {"task_id": task_id, "summary": "Drafted.", "evidence": [
        {"kind": "note", "summary": "182 words.", "criteria": [0]},
        {"kind": "note", "summary": "Plans named in an old draft.", "criteria": [1], "observed_at": old},
        {"kind": "link", "summary": "Build log", "url": "https://ci.example/a/very/long/path/to/the/build/log/"
                                                      "for/this/commit/0123456789abcdef0123456789abcdef"}]})
    assert out["task"]["state"] == "verifying"
    return task_id


# ---- the room -------------------------------------------------------------------------------------


def test_the_newest_message_sits_above_the_composer_on_load_after_sending_and_when_one_arrives(served, people):
    with person_api(served, "oj") as oj, person_api(served, "ren") as ren:
        for n in range(40):
            assert oj.post(f"/api/projects/{PROJECT}/messages", json={"body": f"Backlog note {n:02}"}).status_code == 200
        page = people("oj")
        goto(page, served, f"#/p/{PROJECT}/room")
        expect(page.locator(".msg-body").last).to_have_text("Backlog note 39")
        expect(page.locator(".msg").last).to_be_in_viewport()
        assert covered_by_composer(page, ".msg:last-child") == 0  # on load

        # Sending: the words show at once as "Sending…", then as the server's copy with its time.
        held = []
        page.route("**/api/projects/*/messages", lambda route: held.append(route))
        box = page.get_by_role("combobox", name="Message")
        box.fill("My own words, sent")
        box.press("Enter")
        sending = page.locator(".msg-sending")
        expect(sending).to_have_count(1)
        expect(sending.locator(".msg-time")).to_have_text("Sending…")
        expect(sending.locator(".msg-body")).to_have_text("My own words, sent")
        assert covered_by_composer(page, ".msg-sending") == 0
        held[0].continue_()
        mine = page.locator(".msg:not(.msg-sending)", has_text="My own words, sent")
        expect(mine.locator(".msg-time time")).to_be_visible()
        expect(page.locator(".msg-sending")).to_have_count(0)
        expect(page.locator(".msg").last).to_have_id(re.compile(r"^msg-msg-"))
        assert covered_by_composer(page, ".msg:last-child") == 0  # after sending
        expect(box).to_have_value("")

        # Arriving while you read the end of the room.
        assert ren.post(f"/api/projects/{PROJECT}/messages", json={"body": "Ren's answer arrives"}).status_code == 200
        expect(page.locator(".msg-body").last).to_have_text("Ren's answer arrives")
        page.wait_for_function("() => { const l = document.querySelector('.msg:last-child').getBoundingClientRect();"
                               " return l.bottom <= document.querySelector('.room-foot').getBoundingClientRect().top; }")
        shot(page, "room_newest_above_composer", full_page=False)


def test_a_phone_keeps_the_screen_for_messages_and_the_task_page_never_scrolls_sideways(served, people):
    task_id = a_task_with_gaps(served)
    with person_api(served, "oj") as oj:
        read_all(oj)  # oj has read the room: it opens at its newest message
    page = people("oj", viewport=PHONE_TYPING)
    goto(page, served, f"#/p/{PROJECT}/room")
    expect(page.locator(".msg").last).to_be_visible()
    page.wait_for_function("() => document.querySelector('.msg:last-child').getBoundingClientRect().bottom"
                           " <= document.querySelector('.room-foot').getBoundingClientRect().top")
    # The header scrolls away and the composer is one line: messages keep three quarters of the screen.
    room_for_messages = page.evaluate("""() => {
        const top = Math.max(0, document.querySelector('.topbar').getBoundingClientRect().bottom);
        return (document.querySelector('.room-foot').getBoundingClientRect().top - top) / innerHeight;
    }""")
    assert room_for_messages >= 0.75, room_for_messages
    shot(page, "phone_room_typing", full_page=False)
    page.set_viewport_size(PHONE)
    shot(page, "phone_room_newest", full_page=False)
    goto(page, served, f"#/p/{PROJECT}/tasks/{task_id}")
    expect(page.locator(".task-title")).to_contain_text("PlanComparisonTableWithFootnotes")
    expect(page.locator(".submission")).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    for card in page.locator(".task-body .section, .actions").all():  # no card is cut at the right edge
        box = card.bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"], box
    shot(page, "phone_task_page")


# ---- the final decision ------------------------------------------------------------------------------


def test_the_final_decision_states_the_gaps_and_asks_before_accepting(served, people):
    task_id = a_task_with_gaps(served)
    page = people("oj")
    goto(page, served, f"#/p/{PROJECT}/tasks/{task_id}")
    decision = page.locator(".decision")
    expect(decision.locator(".decision-lead")).to_have_text(
        "1 of 3 criteria are covered by fresh evidence; check the gaps before you accept:")
    expect(decision.locator(".ce-criterion .ce-head")).to_have_text([
        "Criterion 1 Under 200 words. covered by #1",
        "Criterion 2 Names the three plans. only stale evidence: #2",
        "Criterion 3 Links the pricing page. no evidence"])
    expect(decision.locator(".ce-criterion").nth(1).locator(".ce-item-head")).to_have_text(
        "#2 note Plans named in an old draft. stale: older than 7 days")
    expect(decision.locator(".ce-general")).to_contain_text("Evidence tagged to no one criterion (it covers none):")
    expect(decision.locator(".ce-general .ce-item-head")).to_have_text("#3 link Build log")
    expect(page.locator(".report-list li")).to_have_text([  # the result's own report says the same
        "✓Criterion 1: Under 200 words. — evidence #1",
        "!Criterion 2: Names the three plans. — only stale evidence #2",
        "✗Criterion 3: Links the pricing page. — uncovered"])
    shot(page, "task_final_decision_with_gaps")
    accept = decision.get_by_role("button", name="Give final acceptance")
    accept.click()
    confirm = decision.locator(".confirm-accept")
    expect(confirm).to_have_text(re.compile(r"^Accept with gaps\? No evidence covers criterion 3\. Only stale evidence "
                                            r"covers criterion 2\. Accepting makes this result owner-approved as it is\."))
    expect(confirm.locator("p")).to_be_focused()
    expect(page.locator(".task-meta .state")).to_have_text("verifying")  # nothing was accepted yet
    shot(page, "task_final_decision_confirm")
    confirm.get_by_role("button", name="Not yet").click()
    expect(confirm).to_be_hidden()
    expect(accept).to_be_focused()
    accept.click()
    confirm.get_by_role("button", name="Accept anyway").click()
    expect(page.locator(".task-meta .state")).to_have_text("completed")
    expect(page.locator(".submission-head").first).to_contain_text("owner-approved")


# ---- rules, keys, audit -------------------------------------------------------------------------------


def test_add_a_rule_starts_at_the_safest_choice_and_an_unknown_agent_is_refused(served, people):
    page = people("oj")
    goto(page, served, "#/rules")
    page.get_by_role("heading", name="Add a rule").click()
    form = page.locator("form.grid-form")
    expect(form.get_by_label("Decision")).to_have_value("approval_required")
    expect(form.get_by_label("For")).to_have_value("agent")
    expect(form.get_by_label("Who")).to_be_visible()
    form.get_by_label("Decision").select_option("allow")
    form.get_by_label("Who").fill("ren/ghost")
    form.get_by_role("button", name="Save rule").click()
    expect(form.get_by_role("alert")).to_have_text(
        "Agent: there is no agent 'ren/ghost'; give an existing agent as owner/name.")
    expect(page.locator("[data-rule-id]")).to_have_count(0)
    form.get_by_label("Who").fill("ren/builder")
    form.get_by_role("button", name="Save rule").click()
    expect(page.locator("[data-rule-id]")).to_have_count(1)
    expect(page.locator("[data-rule-id]")).to_contain_text("Agent ren/builder")
    expect(form.get_by_label("Decision")).to_have_value("approval_required")  # the form starts over safe
    expect(form.get_by_label("Who")).to_be_visible()


def test_the_codex_set_up_is_its_toml_and_its_shell_line(served, people):
    page = people("oj")
    goto(page, served, "#/agents")
    page.locator('.agent-card[data-agent="oj/muse"]').get_by_role("button", name="Make a key").click()
    secret = page.locator(".secret")
    expect(secret).to_be_visible()
    blocks = {b.locator("strong").inner_text(): b.locator("pre").inner_text() for b in secret.locator(".setup").all()}
    token = blocks["Key"]
    assert blocks["Codex: add to ~/.codex/config.toml"] == (
        f'# ~/.codex/config.toml\n[mcp_servers.prickle]\nurl = "{served.info["url"]}/mcp"\n'
        'bearer_token_env_var = "PRICKLE_TOKEN"')
    assert blocks["Codex: run in the shell that starts codex"] == f"export PRICKLE_TOKEN={token}"
    secret.get_by_role("button", name="I have copied it — hide the key").click()


def test_the_audit_log_links_what_it_names_and_keeps_codes_whole(served, people):
    task_id = a_task_with_gaps(served)
    for viewport, name in ((LAPTOP, "audit_log"), (PHONE, "phone_audit_log")):
        page = people("oj", viewport=viewport)
        goto(page, served, f"#/p/{PROJECT}/audit")
        row = page.locator('tr[data-type="result.returned"]').first
        expect(row).to_be_visible()
        link = row.get_by_role("link", name=task_id)
        expect(link).to_have_attribute("href", f"#/p/{PROJECT}/tasks/{task_id}")
        code = page.locator('tr[data-type="task.transitioned"] code.audit-type').first
        assert code.evaluate("el => getComputedStyle(el).whiteSpace") == "nowrap"
        assert code.evaluate("el => el.getClientRects().length") == 1  # one line: never broken mid-word
        agent = page.locator('tr[data-type="handoff.requested"]').first.get_by_role("link", name="oj/muse")
        expect(agent).to_have_attribute("href", f"#/p/{PROJECT}/people")
        if viewport is PHONE:  # each entry is one block: nothing to scroll sideways to
            assert page.evaluate("(() => { const w = document.querySelector('.table-wrap');"
                                 " return w.scrollWidth <= w.clientWidth; })()")
        shot(page, name, full_page=False)
    link.click()
    expect(page.locator(".task-title")).to_contain_text("Write the launch note")


# ---- outages -------------------------------------------------------------------------------------


def test_every_screen_that_cannot_load_says_so_with_retry_and_nothing_goes_unhandled(browser, tmp_path):
    db = str(tmp_path / "prickle.db")
    first = Served(db, "--demo")
    url, port = first.info["url"], first.info["port"]
    context = browser.new_context(viewport=LAPTOP)
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
    # The browser itself logs each refused connection; anything else on the console is the page's.
    page.on("console", lambda m: errors.append(f"console: {m.text}")
            if m.type == "error" and not m.text.startswith("Failed to load resource") else None)
    try:
        page.goto(cli_json(db, "signin-link", "oj")["signin"])
        expect(page.get_by_role("heading", name=re.compile(r"^Hello, "))).to_be_visible()
        page.goto(f"{url}/#/p/{PROJECT}/room")
        expect(page.locator(".live")).to_have_text("Live")
        # The network drops under the project view's refresh: the room stays as it was, nothing unhandled.
        page.route(f"{url}/api/projects/{PROJECT}", lambda route: route.abort("internetdisconnected"))
        with page.expect_request(f"{url}/api/projects/{PROJECT}"):
            mcp(first, "ren/builder", "post_message", {"project": PROJECT, "body": "just before the outage"})
        expect(page.locator(".msg-body", has_text="just before the outage")).to_be_visible()
        page.unroute(f"{url}/api/projects/{PROJECT}")
    finally:
        first.stop()
    screens = {"#/agents": "Agents & keys", "#/rules": "Rules", "#/": f"Hello, ", f"#/p/{PROJECT}/tasks": None}
    for hash_, heading in screens.items():
        page.evaluate("(h) => { location.hash = h; }", hash_)
        failed = page.locator("main .load-failed").first
        expect(failed).to_contain_text("Could not reach the Prickle server. Check that it is running, then try again.",
                                       timeout=15_000)
        expect(failed.get_by_role("button", name="Retry")).to_be_visible()
        if heading:
            expect(page.locator("main h1")).to_contain_text(heading)
    shot(page, "outage_retry", full_page=False)
    with Served(db, "--demo", "--port", str(port)):
        page.locator("main .load-failed").get_by_role("button", name="Retry").click()
        expect(page.get_by_role("heading", name="Tasks")).to_be_visible()
        page.evaluate("() => { location.hash = '#/agents'; }")
        expect(page.locator('.agent-card[data-agent="oj/muse"]')).to_be_visible()
        expect(page.locator("main .load-failed")).to_have_count(0)
    context.close()
    assert not errors, errors


# ---- the keyboard and axe-core --------------------------------------------------------------------------


def test_skip_links_and_shortcuts_reach_the_composer_search_and_inbox(served, people):
    page = people("oj")
    goto(page, served, f"#/p/{PROJECT}/room")
    expect(page.locator(".msg").last).to_be_visible()
    log = page.get_by_role("log", name="Room messages")
    expect(log.locator("> ol.messages > li.msg").first).to_be_attached()  # list items in a list, inside the log
    assert page.locator("ol.messages").get_attribute("role") is None
    page.reload()  # a fresh load: the first Tab starts at the top of the page
    expect(page.locator(".msg").last).to_be_visible()
    page.keyboard.press("Tab")
    expect(page.locator(":focus")).to_have_text("Skip to content")
    page.keyboard.press("Tab")
    expect(page.locator(":focus")).to_have_text("Skip to the message box")
    page.keyboard.press("Enter")
    box = page.get_by_role("combobox", name="Message")
    expect(box).to_be_focused()
    assert page.evaluate("location.hash") == f"#/p/{PROJECT}/room"  # focus moved; the route stayed
    box.type("c/gi")  # typing in a field fires no shortcut
    expect(box).to_have_value("c/gi")
    assert page.evaluate("location.hash") == f"#/p/{PROJECT}/room"
    box.fill("")
    page.locator("#room-heading").focus()
    page.keyboard.press("c")
    expect(box).to_be_focused()
    page.locator("#room-heading").focus()
    expect(page.locator("#search")).to_have_count(1)  # the header's search box
    page.keyboard.press("/")
    expect(page.locator("#search")).to_be_focused()
    expect(page.locator("#search")).to_have_value("")  # the key was not typed into it
    page.locator("#room-heading").focus()
    page.keyboard.press("g")
    page.keyboard.press("i")
    page.wait_for_function("() => location.hash === '#/inbox'")


@pytest.mark.skipif(not AXE.exists(), reason=f"axe-core is not installed at {AXE} (.ci/run installs it)")
def test_axe_finds_no_serious_or_critical_violation_on_the_room_the_inbox_a_task_page_and_the_keys_screen(
        served, people):
    task_id = a_task_with_gaps(served)
    page = people("oj")
    found = {}
    for hash_, ready in ((f"#/p/{PROJECT}/room", ".msg"), ("#/inbox", ".inbox-item"),
                         (f"#/p/{PROJECT}/tasks/{task_id}", ".decision"), ("#/agents", ".agent-card")):
        goto(page, served, hash_)
        expect(page.locator(ready).first).to_be_visible()
        page.add_script_tag(path=str(AXE))
        result = page.evaluate("async () => (await axe.run(document, {resultTypes: ['violations']})).violations"
                               ".map((v) => ({id: v.id, impact: v.impact, nodes: v.nodes.map((n) => n.target.join(' '))}))")
        found[hash_] = [v for v in result if v["impact"] in ("serious", "critical")]
    assert found == {hash_: [] for hash_ in found}, found


def test_the_inbox_takes_your_address_and_then_offers_the_digest(browser, tmp_path):
    # A server that sends mail; oj has no address on file, so the inbox asks for one first.
    config = tmp_path / "prickle.toml"
    config.write_text('[smtp]\nhost = "127.0.0.1"\nport = 8025\ntls = "none"\nfrom_address = "p@example.org"\n')
    db = str(tmp_path / "prickle.db")
    with Served(db, "--demo", "--config", str(config)) as served:
        context = browser.new_context(viewport=LAPTOP)
        errors = []
        page = context.new_page()
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(cli_json(db, "signin-link", "oj")["signin"])
        goto(page, served, "#/inbox")
        address = page.get_by_label("Your email address, for a digest of what waits on you")
        address.fill("oj@example.org")
        with page.expect_response(lambda r: r.url.endswith("/api/me/email")) as answer:
            page.get_by_role("button", name="Save address").click()
        assert answer.value.json() == {"handle": "oj", "email": "oj@example.org"}
        expect(page.locator(".digest-form label")).to_have_text(" Email oj@example.org what has waited on me more than ")
        minutes = page.locator("#digest-minutes")
        assert minutes.bounding_box()["width"] < 160  # a few digits, not the whole row
        page.locator("#digest-on").check()
        minutes.fill("45")
        with page.expect_response(lambda r: r.url.endswith("/api/me/digest")) as answer:
            page.get_by_role("button", name="Save", exact=True).click()
        assert answer.value.json()["digest_minutes"] == 45
        shot(page, "inbox_address_then_digest")
        context.close()
        assert not errors, errors
