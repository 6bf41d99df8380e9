"""Browser tests of reading the page: search and its links, Markdown in messages and tasks, the board's filters.

One ``prickle serve --demo`` and one Chromium for the module (the fixtures of browser.py).
"""

from __future__ import annotations

import re

from browser import PROJECT, cli_json, expect, goto, mcp, person_api, shot

PHONE = {"width": 390, "height": 844}

PACKET = {"deliverable_type": "doc", "acceptance_criteria": ["short and warm"]}


def no_horizontal_scroll(page) -> bool:
    return page.evaluate("document.documentElement.scrollWidth <= document.documentElement.clientWidth")


def test_search_finds_a_message_and_its_link_lands_on_it(served, people):
    cli_json(served.db, "project", "create", "search-talk", "--name", "Search talk", "--team", "web", "--owner", "oj")
    with person_api(served, "oj") as oj_api:
        target = oj_api.post("/api/projects/search-talk/messages", json={"body": "The kumquat plan is on"}).json()
        for n in range(60):  # the message is on an older page than the room opens at
            assert oj_api.post("/api/projects/search-talk/messages", json={"body": f"Filler {n}"}).status_code == 200
        task = oj_api.post(f"/api/projects/{PROJECT}/task-requests", json={
            "agent": "oj/muse", "packet": PACKET | {"task": "Draft the kumquat page"}}).json()["task"]
        in_thread = oj_api.post(f"/api/projects/{PROJECT}/messages", json={
            "body": "A kumquat question for the thread", "task_id": task["id"]}).json()
    page = people("oj")
    box = page.locator("input#search")
    box.fill("kumquat")
    box.press("Enter")
    expect(page).to_have_url(re.compile(r"#/search\?q=kumquat$"))
    hits = page.locator(".search-result")
    expect(hits).to_have_count(4)  # the task, the room's note of the request, and the two messages
    expect(page.locator(".search-result mark").first).to_have_text("kumquat")
    shot(page, "search_results")
    room_hit = page.locator(".search-result", has_text="The kumquat plan is on")
    expect(room_hit.locator(".search-snippet")).to_have_text("The kumquat plan is on")
    room_hit.get_by_role("link").click()
    expect(page).to_have_url(re.compile(rf"#/p/search-talk/room/{target['message']['id']}$"))
    linked = page.locator(f"#msg-{target['message']['id']}")
    expect(linked).to_have_class(re.compile(r"\bmsg-linked\b"))
    expect(linked).to_be_in_viewport()
    expect(page.locator(".msg.msg-linked")).to_have_count(1)
    shot(page, "search_landed_in_the_room", full_page=False)
    # A message in a task's thread lands on the task page at that message.
    page.go_back()
    page.locator(".search-result", has_text="A kumquat question").get_by_role("link").click()
    expect(page).to_have_url(re.compile(rf"#/p/{PROJECT}/tasks/{task['id']}/{in_thread['message']['id']}$"))
    expect(page.locator(f"#msg-{in_thread['message']['id']}")).to_have_class(re.compile(r"\bmsg-linked\b"))
    expect(page.locator(f"#msg-{in_thread['message']['id']}")).to_be_in_viewport()
    # A query full-text search cannot read says so, and what to do.
    box.fill("x AND AND y")
    box.press("Enter")
    expect(page).to_have_url(re.compile(r"#/search\?q=x%20AND"))
    refused = page.locator("main .error:visible")
    expect(refused).to_contain_text('the search "x AND AND y" could not be read')
    expect(refused).to_contain_text("in double quotes")
    # At phone width the box and the results fit.
    phone = people("ren", viewport=PHONE)
    goto(phone, served, "#/search?q=kumquat")
    expect(phone.locator(".search-result")).to_have_count(3)
    expect(phone.locator(".search-result", has_text="The kumquat plan")).to_have_count(0)  # ren is not in search-talk
    expect(phone.locator("input#search")).to_have_value("kumquat")
    assert no_horizontal_scroll(phone)
    shot(phone, "search_results_phone")


def test_markdown_renders_and_unsafe_links_and_html_do_not_run(served, people):
    page = people("oj")
    dialogs = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    goto(page, served, f"#/p/{PROJECT}/room")
    body = ("Release notes are **ready**, see `make docs` and [the docs](https://example.com/docs) or "
            "[this](javascript:window.pwned=1).\n\n- first point\n- second point\n\n"
            "```\nprint('hello')\n  indented\n```\n\n<img src=x onerror=\"window.pwned=2\">")
    message = mcp(served, "ren/builder", "post_message", {"project": PROJECT, "body": body})["message"]
    shown = page.locator(f"#msg-{message['id']}")
    md = shown.locator(".msg-body")
    expect(md.locator("strong")).to_have_text("ready")
    expect(md.locator("p code")).to_have_text("make docs")
    expect(md.locator("li")).to_have_text(["first point", "second point"])
    expect(md.locator("pre code")).to_have_text("print('hello')\n  indented\n")
    docs = md.locator("a")
    expect(docs).to_have_count(1)  # the javascript: link is left as its text
    expect(docs).to_have_attribute("href", "https://example.com/docs")
    expect(docs).to_have_attribute("target", "_blank")
    expect(docs).to_have_attribute("rel", "noopener noreferrer")
    expect(md).to_contain_text("or this.")
    expect(md).to_contain_text('<img src=x onerror="window.pwned=2">')  # raw HTML is shown as text
    assert page.locator("main a[href^=\"javascript\" i]").count() == 0
    assert page.locator("main img").count() == 0
    # The text as written is one click away.
    raw = shown.get_by_role("button", name="Raw")
    raw.click()
    expect(shown.locator("pre.raw")).to_have_text(body)
    expect(md).to_be_hidden()
    shot(page, "message_markdown_raw", full_page=False)
    shown.get_by_role("button", name="Formatted").click()
    expect(md).to_be_visible()
    # A day separator, the full time on hover, and the time links to the message.
    expect(page.locator(".day-sep").first).to_have_text("Today")
    time_link = shown.locator("a.msg-link")
    expect(time_link).to_have_attribute("href", f"#/p/{PROJECT}/room/{message['id']}")
    expect(time_link.locator("time")).to_have_attribute("title", re.compile(r"\d{4}"))
    time_link.click()
    expect(page).to_have_url(re.compile(rf"#/p/{PROJECT}/room/{message['id']}$"))
    expect(shown).to_have_class(re.compile(r"\bmsg-linked\b"))
    page.reload()  # from the room's pages, not the stream: the same
    expect(page.locator(f"#msg-{message['id']} .msg-body strong")).to_have_text("ready")
    expect(page.locator(f"#msg-{message['id']}")).to_have_class(re.compile(r"\bmsg-linked\b"))
    page.wait_for_timeout(300)
    assert page.evaluate("window.pwned") is None
    assert dialogs == []
    shot(page, "message_markdown", full_page=False)
    # A packet's context and a checkpoint are Markdown too.
    with person_api(served, "oj") as oj_api:
        task = oj_api.post(f"/api/projects/{PROJECT}/task-requests", json={"agent": "oj/muse", "packet": PACKET | {
            "task": "Write the **launch** post", "context": "Use `docs/voice.md`.\n\n1. short\n2. warm"}}).json()["task"]
    mcp(served, "oj/muse", "accept_task", {"task_id": task["id"]})
    mcp(served, "oj/muse", "checkpoint", {"task_id": task["id"], "checkpoint": {"progress": "Drafted the **intro**; next the list."}})
    goto(page, served, f"#/p/{PROJECT}/tasks/{task['id']}")
    expect(page.locator(".packet-task strong")).to_have_text("launch")
    expect(page.locator(".md-block .md code", has_text="docs/voice.md")).to_be_visible()
    expect(page.locator(".md-block .md ol li")).to_have_text(["short", "warm"])
    expect(page.locator(".tl-checkpoint-body .md strong")).to_have_text("intro")
    phone = people("oj", viewport=PHONE)
    goto(phone, served, f"#/p/{PROJECT}/room/{message['id']}")
    expect(phone.locator(f"#msg-{message['id']} .msg-body pre code")).to_be_visible()
    assert no_horizontal_scroll(phone)
    shot(phone, "message_markdown_phone", full_page=False)


def test_the_board_filters_and_lists_its_tasks(served, people):
    with person_api(served, "oj") as oj_api, person_api(served, "ren") as ren_api:
        mine = oj_api.post(f"/api/projects/{PROJECT}/task-requests", json={
            "agent": "oj/muse", "packet": PACKET | {"task": "Board task for muse"}}).json()["task"]
        rens = ren_api.post(f"/api/projects/{PROJECT}/task-requests", json={
            "agent": "ren/builder", "packet": PACKET | {"task": "Board task for builder"}}).json()["task"]
    held = mcp(served, "ren/builder", "handoff", {"project": PROJECT, "to": "oj/muse",
                                                  "packet": PACKET | {"task": "Held board task"}})["task"]
    page = people("oj")
    goto(page, served, f"#/p/{PROJECT}/tasks")
    cards = page.locator(".board .task-card")
    expect(cards.filter(has_text="Board task for builder")).to_have_count(1)
    page.get_by_label("Assignee").select_option("oj/muse")
    expect(page).to_have_url(re.compile(r"#/p/website-v2/tasks\?assignee=oj%2Fmuse$"))
    expect(cards.filter(has_text="Board task for builder")).to_have_count(0)
    expect(cards.filter(has_text="Board task for muse")).to_have_count(1)
    expect(cards.filter(has_text="Held board task")).to_have_count(1)
    page.get_by_label("Requester").select_option("ren/builder")
    expect(cards).to_have_count(1)
    expect(cards).to_have_attribute("data-task-id", held["id"])
    page.get_by_label("Requester").select_option("")
    page.get_by_label("State").select_option("routed")
    expect(page.locator(f'.board .task-card[data-task-id="{mine["id"]}"]')).to_be_visible()
    expect(page.locator(f'.board .task-card[data-task-id="{held["id"]}"]')).to_have_count(0)
    shot(page, "board_filtered")
    # The list view shows the same tasks as rows; a reload keeps the view and the filters.
    page.get_by_role("button", name="List").click()
    rows = page.locator(".task-table tbody tr")
    expect(page.locator(f'.task-table tr[data-task-id="{mine["id"]}"]')).to_be_visible()
    assert all(r.get_attribute("data-state") == "routed" for r in rows.all())
    assert all("oj/muse" in r.inner_text() for r in rows.all())
    page.reload()
    expect(page.locator(f'.task-table tr[data-task-id="{mine["id"]}"]')).to_be_visible()
    expect(page.get_by_label("Assignee")).to_have_value("oj/muse")
    expect(page.get_by_label("State")).to_have_value("routed")
    expect(page.get_by_role("button", name="List")).to_have_attribute("aria-pressed", "true")
    shot(page, "board_list")
    page.get_by_role("button", name="Clear filters").click()
    expect(page.locator(f'.task-table tr[data-task-id="{rens["id"]}"]')).to_be_visible()
    expect(page.locator(f'.task-table tr[data-task-id="{held["id"]}"]')).to_contain_text("needs you")
    page.get_by_role("button", name="Columns").click()
    expect(page.locator(".board .column")).to_have_count(6)
    # A long state ("awaiting handoff approval") wraps inside its card, never past its edge.
    expect(page.locator(f'.board .task-card[data-task-id="{held["id"]}"] .badge').first).to_be_visible()
    assert page.evaluate("""() => [...document.querySelectorAll('.board .task-card')].every((card) =>
        [...card.querySelectorAll('.badge')].every((b) => b.getBoundingClientRect().right <=
                                                             card.getBoundingClientRect().right + 0.5))""")
    phone = people("oj", viewport=PHONE)
    goto(phone, served, f"#/p/{PROJECT}/tasks?view=list&assignee=oj%2Fmuse")
    expect(phone.locator(f'.task-table tr[data-task-id="{mine["id"]}"]')).to_be_visible()
    assert no_horizontal_scroll(phone)
    shot(phone, "board_list_phone")


def test_a_message_the_renderer_cannot_take_shows_as_plain_text_and_hides_no_other(served, people):
    import prickle
    page = people("oj")
    goto(page, served, f"#/p/{PROJECT}/room")
    before = mcp(served, "oj/muse", "post_message", {"project": PROJECT, "body": "Before the deep one."})["message"]
    # The server refuses such a body now; one written before that rule still has to be shown.
    deep = ">" * 7990
    with person_api(served, "ren") as ren_api:
        r = ren_api.post(f"/api/projects/{PROJECT}/messages", json={"body": deep})
    assert r.status_code == 400 and r.json()["error"]["message"] == (
        "body nests quotes or lists 7990 levels deep; at most 32 can be shown: flatten it, or put it in a code block")
    db = prickle.Database(served.db)
    ren = prickle.Actor("person", "test", "person", handle="ren")
    with db.transaction():
        old = prickle.write_message(db, ren, PROJECT, deep)
    db.close()
    after = mcp(served, "oj/muse", "post_message", {"project": PROJECT, "body": "After **it**."})["message"]
    expect(page.locator(f"#msg-{after['id']} .msg-body strong")).to_have_text("it")
    expect(page.locator(f"#msg-{before['id']} .msg-body")).to_have_text("Before the deep one.")
    expect(page.locator(f"#msg-{old['id']} .msg-body .md-plain")).to_have_text(deep)
    page.reload()
    expect(page.locator(f"#msg-{after['id']} .msg-body strong")).to_have_text("it")
    expect(page.locator(f"#msg-{old['id']} .msg-body .md-plain")).to_have_text(deep)


def test_a_task_written_in_markdown_is_named_in_plain_words_and_its_packet_rendered(served, people):
    written = "Build the **pricing page** from `docs/pricing.md`."
    with person_api(served, "oj") as oj_api:
        task = oj_api.post(f"/api/projects/{PROJECT}/task-requests", json={
            "agent": "oj/muse", "packet": PACKET | {"task": written}}).json()["task"]
        said = oj_api.post(f"/api/projects/{PROJECT}/messages", json={"body": "The **new logo** is in."}).json()
        oj_api.post(f"/api/projects/{PROJECT}/messages", json={"body": "Looks good",
                                                               "in_reply_to": said["message"]["id"]})
    named = "Build the pricing page from docs/pricing.md."
    page = people("oj")
    goto(page, served, f"#/p/{PROJECT}/tasks")
    expect(page.locator(f'.board .task-card[data-task-id="{task["id"]}"] .task-card-title')).to_have_text(named)
    page.get_by_role("button", name="List").click()
    expect(page.locator(f'.task-table tr[data-task-id="{task["id"]}"] a')).to_have_text(named)
    goto(page, served, f"#/p/{PROJECT}/tasks/{task['id']}")
    expect(page.get_by_role("heading", level=1)).to_have_text(named)
    expect(page.locator("main code", has_text="docs/pricing.md").first).to_be_visible()  # the packet, rendered
    goto(page, served, f"#/p/{PROJECT}/room")
    expect(page.locator(".thread-title", has_text="Build the pricing page")).to_have_text(named)
    expect(page.locator(".msg-replyto").last).to_have_text("↪ in reply to Oj Okafor: “The new logo is in.”")


def test_a_table_in_a_message_scrolls_on_a_phone_and_never_splits_a_word_or_a_number(served, people):
    body = ("| plan | seats | monthly | annually | discount | support | storage |\n|---|---|---|---|---|---|---|\n"
            "| Team | 10 | 120 | 1200 | none | email | 100 GB |\n"
            "| Business | 300 | 3000 | 30000 | fifteen percent | telephone | 10000 GB |")
    with person_api(served, "oj") as oj_api:
        said = oj_api.post(f"/api/projects/{PROJECT}/messages", json={"body": body}).json()["message"]
    phone = people("ren", viewport=PHONE)
    goto(phone, served, f"#/p/{PROJECT}/room/{said['id']}")
    cells = phone.locator(f"#msg-{said['id']} .md table").locator("th, td")
    expect(cells).to_have_count(21)
    split = phone.evaluate(f"""() => [...document.querySelectorAll('#msg-{said["id"]} .md table :is(th, td)')]
        .flatMap((cell) => [...cell.textContent.matchAll(/\\S+/g)].map((word) => {{
            const range = document.createRange();  // the cell's text is one text node
            range.setStart(cell.firstChild, word.index);
            range.setEnd(cell.firstChild, word.index + word[0].length);
            return [word[0], new Set([...range.getClientRects()].map((r) => Math.round(r.top))).size];
        }})).filter(([, lines]) => lines !== 1)""")
    assert split == []  # a cell may wrap between words, never inside one
    assert no_horizontal_scroll(phone)  # the table scrolls inside the message, not the page
    shot(phone, "room_table_phone", full_page=False)
