"""Browser tests of the inbox as a triage list: one-line rows that open in place, the keys and the
shortcut list, filters by kind and project kept in the address, done and snooze with their undo,
"Mark read" on one mention and on all of them, the home page's one line, and words for people
(no Markdown marks, state codes or slugs) in the rows and in search.

One ``prickle serve --demo`` and one Chromium for the module (the fixtures of browser.py). Each test
signs in a newcomer of its own, so what waits on them is exactly what the test made.
"""

from __future__ import annotations

import datetime
import re
from pathlib import Path

import pytest

from browser import PROJECT, LAPTOP, Page, cli_json, expect, goto, mcp, person_api, shot
from conftest import Served

AXE = Path(__file__).resolve().parent.parent / ".cache" / "axe" / "node_modules" / "axe-core" / "axe.min.js"
DESKTOP = {"width": 1366, "height": 900}
PHONE = {"width": 390, "height": 844}


# ---- helpers ---------------------------------------------------------------------------------------


def newcomer(served: Served, handle: str, name: str) -> str:
    """``handle`` joins Website v2 with an agent ``handle/helper``; returns the agent's key."""
    cli_json(served.db, "person", "add", handle, "--name", name)
    cli_json(served.db, "team", "add", "web", handle)
    cli_json(served.db, "member", "add", PROJECT, handle)
    cli_json(served.db, "agent", "add", f"{handle}/helper", "--name", "Helper", "--model", "m", "--client",
             "claude-code", "--project", PROJECT)
    return cli_json(served.db, "token", "create", "--agent", f"{handle}/helper", "--project", PROJECT)["token"]


def mention(served: Served, handle: str, body: str, project: str = PROJECT) -> str:
    """ren/builder posts ``@handle body``; returns the message ID."""
    return mcp(served, "ren/builder", "post_message", {"project": project, "body": f"@{handle} {body}"})["message"]["id"]


def held(served: Served, handle: str, task: str) -> dict:
    """oj/muse asks ``handle``'s agent for work; their gate holds it (an approval in their inbox)."""
    out = mcp(served, "oj/muse", "handoff", {"project": PROJECT, "to": f"{handle}/helper", "packet": {
        "task": task, "deliverable_type": "doc", "acceptance_criteria": ["Done well."]}})
    assert out["gate"]["decision"] == "approval_required", out["gate"]
    return out


def row(page: Page, item_id: str):
    return page.locator(f'.inbox-row[data-item-id="{item_id}"]')


def inbox_ids(served: Served, handle: str) -> list[str]:
    with person_api(served, handle) as api:
        return [i["id"] for i in api.get("/api/inbox").json()["items"]]


def no_horizontal_scroll(page: Page) -> bool:
    return page.evaluate("document.documentElement.scrollWidth <= document.documentElement.clientWidth")


# ---- tests -------------------------------------------------------------------------------------------


def test_each_item_is_one_line_that_opens_in_place_into_its_card(served, people):
    newcomer(served, "ada", "Ada Lovelace")
    handoff = held(served, "ada", "Proofread the **pricing** page.")
    ids = [mention(served, "ada", f"note {n}: the `hero` needs **one** more look") for n in range(6)]
    page = people("ada", DESKTOP)
    goto(page, served, "#/inbox")
    rows = page.locator(".inbox-row")
    expect(rows).to_have_count(7)
    first = row(page, f"mention:{ids[-1]}")
    expect(first.locator(".inbox-kind")).to_have_text("Mention")
    expect(first.locator(".inbox-summary")).to_have_text("Builder: @ada note 5: the hero needs one more look")
    expect(first.locator(".inbox-project")).to_have_text("Website v2")
    expect(first.locator(".inbox-age")).to_have_text(re.compile(r"^(now|\d+ min)$"))
    approval = row(page, f"approval:{handoff['gate']['approval_id']}")
    expect(approval.locator(".inbox-kind")).to_have_text("Held handoff")
    expect(approval.locator(".inbox-summary")).to_have_text(re.compile(r"^[^*]*pricing[^*]*$"))
    heights = page.evaluate("[...document.querySelectorAll('.inbox-row')].map((r) => r.getBoundingClientRect().height)")
    assert max(heights) <= 50, heights  # one line each (a full card was about 260 px)
    assert page.locator(".inbox-mention").count() == 0  # no card until a row opens
    shot(page, "inbox_rows_desktop")

    # A row opens in place into its card with its inline action, and closes again.
    first.locator(".inbox-row-head").click()
    expect(first.locator(".inbox-row-head")).to_have_attribute("aria-expanded", "true")
    card = first.locator(".inbox-mention")
    expect(card.locator(".inbox-body code")).to_have_text("hero")
    expect(card.get_by_role("button", name="Mark read")).to_be_visible()
    approval.locator(".inbox-row-head").click()
    expect(approval.get_by_role("button", name="Approve", exact=True)).to_be_visible()
    shot(page, "inbox_rows_open_desktop")
    first.locator(".inbox-row-head").click()
    expect(card).to_be_hidden()

    phone = people("ada", PHONE)
    goto(phone, served, "#/inbox")
    expect(phone.locator(".inbox-row")).to_have_count(7)
    heights = phone.evaluate("[...document.querySelectorAll('.inbox-row')].map((r) => r.getBoundingClientRect().height)")
    assert max(heights) <= 64, heights  # the words on one line, kind · project · age under them
    assert no_horizontal_scroll(phone)
    shot(phone, "inbox_rows_phone")
    row(phone, f"approval:{handoff['gate']['approval_id']}").locator(".inbox-row-head").click()
    expect(row(phone, f"approval:{handoff['gate']['approval_id']}").get_by_role("button", name="Approve", exact=True)
           ).to_be_visible()
    assert no_horizontal_scroll(phone)
    shot(phone, "inbox_row_open_phone")


def test_the_keys_move_open_and_mark_done_and_the_shortcut_list_names_them(served, people):
    newcomer(served, "bea", "Bea Ng")
    ids = [mention(served, "bea", f"point {n}") for n in range(3)]  # newest first: ids[2], ids[1], ids[0]
    page = people("bea", DESKTOP)
    goto(page, served, "#/inbox")
    expect(page.locator(".inbox-row")).to_have_count(3)
    page.keyboard.press("j")
    expect(row(page, f"mention:{ids[2]}")).to_have_class(re.compile(r"\bselected\b"))
    expect(row(page, f"mention:{ids[2]}").locator(".inbox-row-head")).to_be_focused()
    page.keyboard.press("j")
    page.keyboard.press("j")
    page.keyboard.press("j")  # stays on the last
    expect(row(page, f"mention:{ids[0]}")).to_have_class(re.compile(r"\bselected\b"))
    page.keyboard.press("k")
    expect(row(page, f"mention:{ids[1]}").locator(".inbox-row-head")).to_be_focused()
    page.keyboard.press("Enter")
    expect(row(page, f"mention:{ids[1]}").locator(".inbox-mention")).to_be_visible()
    page.keyboard.press("o")
    expect(row(page, f"mention:{ids[1]}").locator(".inbox-mention")).to_be_hidden()
    page.keyboard.press("e")  # done: the row goes, the next one is selected, the toast offers Undo
    expect(row(page, f"mention:{ids[1]}")).to_have_count(0)
    expect(row(page, f"mention:{ids[0]}").locator(".inbox-row-head")).to_be_focused()
    expect(page.locator(".toast")).to_have_text(re.compile(r"^Done: Builder: @bea point 1\s*Undo$"))
    assert inbox_ids(served, "bea") == [f"mention:{ids[2]}", f"mention:{ids[0]}"]
    page.keyboard.press("u")  # undo
    expect(row(page, f"mention:{ids[1]}")).to_have_count(1)
    expect(page.locator(".toast")).to_be_hidden()
    assert inbox_ids(served, "bea") == [f"mention:{ids[2]}", f"mention:{ids[1]}", f"mention:{ids[0]}"]

    page.keyboard.press("?")
    help_ = page.get_by_role("dialog", name="Keyboard shortcuts")
    expect(help_).to_be_visible()
    expect(help_.locator("section").first.locator("dt")).to_have_text(["j", "k", "Enter", "e", "s", "u"])
    expect(help_).to_contain_text("Snooze it until later")
    expect(help_).to_contain_text("Go to the inbox")
    shot(page, "inbox_shortcut_list", full_page=False)
    page.keyboard.press("e")  # no key works behind the list
    page.keyboard.press("Escape")
    expect(help_).to_have_count(0)
    assert len(inbox_ids(served, "bea")) == 3

    # Typing in a field fires nothing.
    page.locator("#search").fill("")
    page.locator("#search").type("jjes")
    expect(page.locator("#search")).to_have_value("jjes")
    assert len(inbox_ids(served, "bea")) == 3
    expect(page.locator(".snooze-menu:visible")).to_have_count(0)
    # Done with every one: the focus goes to the line that says nothing waits, never to nowhere.
    row(page, f"mention:{ids[2]}").locator(".inbox-row-head").focus()
    for left in (2, 1, 0):
        page.keyboard.press("e")
        expect(page.locator(".inbox-row")).to_have_count(left)
    expect(page.locator(".inbox-count")).to_be_focused()


def test_filters_by_kind_and_project_count_their_items_and_stay_in_the_address(served, people):
    newcomer(served, "cy", "Cy Twombly")
    cli_json(served.db, "project", "create", "garden", "--name", "Garden plans", "--team", "web", "--owner", "oj")
    cli_json(served.db, "member", "add", "garden", "cy")
    cli_json(served.db, "member", "add", "garden", "ren")
    cli_json(served.db, "agent", "join", "garden", "ren/builder")
    held(served, "cy", "Check the footer.")
    for n in range(3):
        mention(served, "cy", f"web note {n}")
    garden = mention(served, "cy", "the roses", project="garden")
    page = people("cy", DESKTOP)
    goto(page, served, "#/inbox")
    kinds = page.get_by_role("group", name="Show one kind")
    projects = page.get_by_role("group", name="Show one project")
    expect(kinds.get_by_role("button")).to_have_text(["All kinds 5", "Held handoffs 1", "Mentions 4"])
    expect(projects.get_by_role("button")).to_have_text(["All projects 5", "Garden plans 1", "Website v2 4"])
    kinds.get_by_role("button", name="Mentions 4").click()
    expect(page).to_have_url(re.compile(r"#/inbox\?kind=mention$"))
    expect(page.locator(".inbox-row:visible")).to_have_count(4)
    expect(projects.get_by_role("button")).to_have_text(["All projects 4", "Garden plans 1", "Website v2 3"])
    projects.get_by_role("button", name="Garden plans 1").click()
    expect(page).to_have_url(re.compile(r"#/inbox\?kind=mention&project=garden$"))
    expect(page.locator(".inbox-row:visible")).to_have_count(1)
    expect(row(page, f"mention:{garden}")).to_be_visible()
    expect(page.locator(".inbox-count")).to_have_text("5 things wait on you; 1 shown.")
    shot(page, "inbox_filtered")
    page.reload()  # the filters are kept
    expect(page.locator(".inbox-row:visible")).to_have_count(1)
    expect(kinds.get_by_role("button", name="Mentions 1")).to_have_attribute("aria-pressed", "true")
    expect(projects.get_by_role("button", name="Garden plans 1")).to_have_attribute("aria-pressed", "true")
    kinds.get_by_role("button", name=re.compile(r"^All kinds")).click()
    projects.get_by_role("button", name=re.compile(r"^All projects")).click()
    expect(page).to_have_url(re.compile(r"#/inbox$"))
    expect(page.locator(".inbox-row:visible")).to_have_count(5)
    phone = people("cy", PHONE)
    goto(phone, served, "#/inbox?kind=approval")
    expect(phone.locator(".inbox-row:visible")).to_have_count(1)
    assert no_horizontal_scroll(phone)
    shot(phone, "inbox_filtered_phone")


def test_snooze_hides_an_item_until_its_time_with_undo_and_a_snoozed_list_to_bring_it_back(served, people):
    newcomer(served, "dee", "Dee Rao")
    first, second = mention(served, "dee", "first"), mention(served, "dee", "second")
    page = people("dee", DESKTOP)
    goto(page, served, "#/inbox")
    target = row(page, f"mention:{first}")
    target.get_by_role("button", name="Snooze").click()
    menu = target.locator(".snooze-menu")
    expect(menu.get_by_role("button")).to_have_text(["In 1 hour", "Tomorrow 9:00", "Next Monday 9:00", "Snooze until then"])
    expect(menu.get_by_role("button", name="In 1 hour")).to_be_focused()
    shot(page, "inbox_snooze_menu", full_page=False)
    menu.get_by_role("button", name="Tomorrow 9:00").click()
    expect(target).to_have_count(0)
    expect(page.locator(".toast")).to_contain_text("Snoozed until ")
    with person_api(served, "dee") as api:
        out = api.get("/api/inbox?snoozed=1").json()
    assert ([i["id"] for i in out["items"]], out["snoozed"]) == ([f"mention:{second}"], 1)
    until = page.evaluate("(iso) => { const d = new Date(iso); return [d.getHours(), d.getMinutes(), "
                          "Math.round((d - new Date()) / 3600000)]; }", out["snoozed_items"][0]["snoozed_until"])
    assert until[:2] == [9, 0] and 0 < until[2] <= 33, until  # tomorrow at 9:00, the browser's local time
    page.locator(".toast").get_by_role("button", name="Undo").click()
    expect(row(page, f"mention:{first}")).to_have_count(1)
    assert inbox_ids(served, "dee") == [f"mention:{second}", f"mention:{first}"]

    # Snoozed by keyboard to a chosen time; listed under "Snoozed (1)", and brought back from there.
    page.keyboard.press("j")
    page.keyboard.press("j")
    page.keyboard.press("s")
    menu = row(page, f"mention:{first}").locator(".snooze-menu")
    expect(menu.get_by_role("button", name="In 1 hour")).to_be_focused()
    chosen = (datetime.datetime.now() + datetime.timedelta(days=3)).strftime("%Y-%m-%dT08:30")
    menu.get_by_label("Snooze until (date and time)").fill(chosen)
    menu.get_by_role("button", name="Snooze until then").click()
    expect(row(page, f"mention:{first}")).to_have_count(0)
    snoozed = page.locator(".inbox-snoozed")
    expect(snoozed.locator("summary")).to_have_text("Snoozed (1)")
    snoozed.locator("summary").click()
    item = snoozed.locator(f'.snoozed-item[data-item-id="mention:{first}"]')
    expect(item).to_contain_text("Builder: @dee first")
    expect(item).to_contain_text("Website v2")
    expect(item).to_contain_text("back ")
    with person_api(served, "dee") as api:
        until = api.get("/api/inbox?snoozed=1").json()["snoozed_items"][0]["snoozed_until"]
    assert page.evaluate("([iso, chosen]) => new Date(iso).getTime() === new Date(chosen).getTime()", [until, chosen])
    shot(page, "inbox_snoozed_list")
    item.get_by_role("button", name="Unsnooze").click()
    expect(row(page, f"mention:{first}")).to_have_count(1)
    expect(snoozed).to_be_hidden()
    phone = people("dee", PHONE)
    goto(phone, served, "#/inbox")
    r = row(phone, f"mention:{second}")
    r.locator(".inbox-row-head").click()
    r.get_by_role("button", name="Snooze").click()
    r.locator(".snooze-menu").get_by_role("button", name="In 1 hour").click()
    expect(phone.locator(".toast")).to_be_visible()
    assert no_horizontal_scroll(phone)
    shot(phone, "inbox_snoozed_phone", full_page=False)


def test_the_page_brings_a_snoozed_item_back_by_itself_when_its_time_comes(served, people):
    newcomer(served, "ivy", "Ivy Chen")
    first = mention(served, "ivy", "back soon")
    page = people("ivy", DESKTOP)
    goto(page, served, "#/inbox")
    expect(row(page, f"mention:{first}")).to_have_count(1)
    with person_api(served, "ivy") as api:  # snoozed elsewhere (another tab), for three seconds
        soon = (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=3)).isoformat()
        assert api.post("/api/inbox/mark", json={"item_id": f"mention:{first}", "mark": "snoozed",
                                                  "until": soon}).status_code == 200
    page.reload()
    expect(page.locator(".inbox-snoozed summary")).to_have_text("Snoozed (1)")
    expect(row(page, f"mention:{first}")).to_have_count(0)
    # No event announces the return: the page reads the inbox again when the first snoozed item is due.
    expect(row(page, f"mention:{first}")).to_have_count(1, timeout=15_000)
    expect(page.locator(".inbox-snoozed")).to_be_hidden()
    expect(page.locator(".inbox-badge")).to_have_text("1")


def test_mark_read_on_one_mention_dismisses_that_one_only_and_mark_all_has_an_undo(served, people):
    newcomer(served, "eli", "Eli Sato")
    ids = [mention(served, "eli", f"item {n}") for n in range(12)]
    with person_api(served, "eli") as api:
        unread = api.get("/api/unread").json()
    page = people("eli", DESKTOP)
    goto(page, served, "#/inbox")
    expect(page.locator(".inbox-row")).to_have_count(12)
    # "Mark read" on the newest mention used to move the room's read position: all 12 went at once.
    newest = row(page, f"mention:{ids[-1]}")
    newest.locator(".inbox-row-head").click()
    newest.get_by_role("button", name="Mark read").click()
    expect(newest).to_have_count(0)
    expect(page.locator(".inbox-row")).to_have_count(11)
    assert inbox_ids(served, "eli") == [f"mention:{m}" for m in reversed(ids[:-1])]
    with person_api(served, "eli") as api:
        assert api.get("/api/unread").json() == unread  # the room's read position did not move
    page.locator(".toast").get_by_role("button", name="Undo").click()
    expect(page.locator(".inbox-row")).to_have_count(12)

    # All of them at once, and back with Undo.
    page.get_by_role("button", name="Mark all mentions read (12)").click()
    expect(page.locator(".inbox-row")).to_have_count(0)
    expect(page.locator(".toast")).to_contain_text("12 mentions marked read")
    expect(page.locator(".empty")).to_have_text("Nothing waits on you. New items appear here as they arrive.")
    assert inbox_ids(served, "eli") == []
    shot(page, "inbox_all_mentions_read", full_page=False)
    page.locator(".toast").get_by_role("button", name="Undo").click()
    expect(page.locator(".inbox-row")).to_have_count(12)
    assert len(inbox_ids(served, "eli")) == 12
    with person_api(served, "eli") as api:
        assert api.get("/api/unread").json() == unread


def test_home_says_in_one_line_what_waits_and_shows_the_projects_first(served, people):
    newcomer(served, "fay", "Fay Wu")
    held(served, "fay", "Write the FAQ.")
    held(served, "fay", "Write the footer.")
    mention(served, "fay", "one")
    mention(served, "fay", "two")
    for viewport, name in ((PHONE, "home_phone"), (DESKTOP, "home_desktop")):
        page = people("fay", viewport)
        line = page.locator(".inbox-line")
        expect(line).to_have_text("4 things wait for you: 2 decisions, 2 mentions — Open inbox")
        heading = page.get_by_role("heading", name="Your projects")
        top = heading.evaluate("(el) => el.getBoundingClientRect().top + window.scrollY")
        assert top < 400, top  # was 6,274 px down on a phone, below every card of the inbox
        assert page.locator(".inbox-row, .inbox-card, .approval").count() == 0
        assert no_horizontal_scroll(page)
        shot(page, name)
    line.get_by_role("link", name="Open inbox").click()
    expect(page).to_have_url(re.compile(r"#/inbox$"))
    expect(page.locator(".inbox-row")).to_have_count(4)


def test_summaries_and_search_snippets_read_as_words_not_markdown_state_codes_or_slugs(served, people):
    newcomer(served, "gus", "Gus Hale")
    body = ("Plan for **zucchini** launch:\n\n| plan | price |\n| --- | --- |\n| basic | `$5` |\n\n"
            "Run `npm test` first.")
    posted = mention(served, "gus", body)
    handoff = held(served, "gus", "Publish the **zucchini** `FAQ`")
    page = people("gus", DESKTOP)
    goto(page, served, "#/inbox")
    summary = row(page, f"mention:{posted}").locator(".inbox-summary")
    expect(summary).to_have_text("Builder: @gus Plan for zucchini launch: plan price basic $5 Run npm test first.")
    expect(row(page, f"approval:{handoff['gate']['approval_id']}").locator(".inbox-summary")).to_have_text(
        "Publish the zucchini FAQ")
    text = page.locator(".triage").inner_text()
    for raw in ("**", "`", "|", "waiting_on", "approval_required", "routed", PROJECT):
        assert raw not in text, raw

    page.locator("#search").fill("zucchini")
    page.locator("#search").press("Enter")
    hits = page.locator(".search-result")
    expect(hits).to_have_count(2)  # the message and the task
    message = page.locator('.search-result[data-kind="message"]', has_text="Plan for")
    expect(message.locator(".search-snippet")).to_contain_text("Plan for zucchini launch: plan price basic $5")
    expect(message.locator(".search-snippet mark").first).to_have_text("zucchini")
    task = page.locator('.search-result[data-kind="task"]')
    expect(task.locator(".search-title")).to_have_text("Publish the zucchini FAQ")
    expect(task.locator(".search-where")).to_have_text("Website v2 · task, waiting for a decision")
    results = page.locator(".search-results").inner_text()
    for raw in ("**", "`", "|", "approval ", "routed", PROJECT):
        assert raw not in results, raw
    shot(page, "search_plain_words")

    # A snippet cut out of the middle of a long table keeps none of its pipes or marks.
    rows = "\n".join(f"| fruit {n} | **{'quince' if n == 30 else 'apple'}** | `{n}` |" for n in range(60))
    mcp(served, "ren/builder", "post_message", {"project": PROJECT, "body": f"| fruit | name | n |\n| --- | --- | --- |\n{rows}"})
    page.locator("#search").fill("quince")
    page.locator("#search").press("Enter")
    snippet = page.locator(".search-result .search-snippet")
    expect(snippet).to_have_count(1)
    expect(snippet.locator("mark")).to_have_text("quince")
    text = snippet.inner_text()
    assert text.startswith("…") and "fruit 30 quince 30" in text, text
    for raw in ("**", "`", "|"):
        assert raw not in text, (raw, text)


@pytest.mark.skipif(not AXE.exists(), reason=f"axe-core is not installed at {AXE} (.ci/run installs it)")
def test_axe_finds_no_serious_or_critical_violation_in_the_triage_list_and_on_home(served, people):
    newcomer(served, "hal", "Hal Berg")
    handoff = held(served, "hal", "Write the **release** notes.")
    first, second = mention(served, "hal", "the `hero`"), mention(served, "hal", "the footer")
    with person_api(served, "hal") as api:
        later = (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=1)).isoformat()
        assert api.post("/api/inbox/mark", json={"item_id": f"mention:{second}", "mark": "snoozed",
                                                  "until": later}).status_code == 200
    found = {}
    for viewport in (DESKTOP, PHONE):
        for scheme in ("light", "dark"):
            page = people("hal", viewport)
            page.emulate_media(color_scheme=scheme)
            where = f"{viewport['width']} {scheme}"
            found[f"home {where}"] = axe(page)
            goto(page, served, "#/inbox")
            row(page, f"approval:{handoff['gate']['approval_id']}").locator(".inbox-row-head").click()
            row(page, f"mention:{first}").locator(".inbox-row-head").click()
            row(page, f"mention:{first}").get_by_role("button", name="Snooze").click()
            page.locator(".inbox-snoozed summary").click()
            expect(page.locator(".snoozed-item")).to_have_count(1)
            page.keyboard.press("Escape")
            found[f"inbox {where}"] = axe(page)
            row(page, f"mention:{first}").locator(".inbox-row-head").click()
            page.keyboard.press("e")
            expect(page.locator(".toast")).to_be_visible()
            found[f"inbox toast {where}"] = axe(page)
            page.keyboard.press("u")
            expect(row(page, f"mention:{first}")).to_have_count(1)
            page.locator("#main").focus()
            page.keyboard.press("?")
            expect(page.get_by_role("dialog", name="Keyboard shortcuts")).to_be_visible()
            found[f"shortcuts {where}"] = axe(page)
            if (viewport, scheme) == (PHONE, "dark"):
                shot(page, "inbox_shortcuts_phone_dark", full_page=False)
            page.context.close()
    assert found == {where: [] for where in found}, found


def axe(page: Page) -> list[dict]:
    """The serious and critical violations axe-core finds on the page as it is."""
    page.add_script_tag(path=str(AXE))
    result = page.evaluate("async () => (await axe.run(document, {resultTypes: ['violations']})).violations"
                           ".map((v) => ({id: v.id, impact: v.impact, nodes: v.nodes.map((n) => n.target.join(' '))}))")
    return [v for v in result if v["impact"] in ("serious", "critical")]


def test_a_questions_line_says_the_question_first_then_its_task(served, people):
    page = people("oj")
    said = page.evaluate("""async () => {
        const { summary } = await import('/static/inbox_store.js');
        return summary({kind: 'question', title: 'Draft the **pricing** FAQ.', questions: ['Which plan goes first?']});
    }""")
    assert said == "Which plan goes first? — Draft the pricing FAQ"
