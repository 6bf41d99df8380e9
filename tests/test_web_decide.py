"""Deciding next to the evidence, in Chromium at 1366 and 390 px: the task page's decision panel shows each
criterion with the evidence covering it (a link, test output, a picture's preview) right under its buttons,
its `#n` references move the focus to what they name, the armed "Click again" of a confirm reads clearly
(axe-core, light and dark), the task's one timeline lists what happened in order, and a send-back or a
cancel is confirmed with its reason shown on the task.

Like tests/test_web.py: a real ``prickle serve --demo``; agents act over MCP with plain HTTP POSTs.
Screenshots go to tests/screenshots/.
"""

from __future__ import annotations

import re
import struct
import time
import zlib
from pathlib import Path

import pytest

from browser import PROJECT, Page, expect, goto, mcp, person_api, shot

AXE = Path(__file__).resolve().parent.parent / ".cache" / "axe" / "node_modules" / "axe-core" / "axe.min.js"
DESKTOP = {"width": 1366, "height": 900}
PHONE = {"width": 390, "height": 844}
PICTURE = "https://img.example/shots/pricing.png"


def png(width: int, height: int) -> bytes:
    """A striped RGB picture, as PNG bytes."""
    rows = b"".join(b"\x00" + b"".join(bytes((40, 110, 90) if (x // 20 + y // 20) % 2 else (230, 240, 235))
                                       for x in range(width)) for y in range(height))
    chunk = lambda kind, data: (struct.pack(">I", len(data)) + kind + data  # noqa: E731
                                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def asked(served, title: str, criteria: list[str]) -> str:
    """oj asks oj/muse for a doc; oj/muse takes it on. The task's ID."""
    with person_api(served, "oj") as oj:
        r = oj.post(f"/api/projects/{PROJECT}/task-requests", json={"agent": "oj/muse", "packet": {
            "task": title, "deliverable_type": "doc", "acceptance_criteria": criteria}})
        assert r.status_code == 200, r.text
        task_id = r.json()["task"]["id"]
    mcp(served, "oj/muse", "accept_task", {"task_id": task_id})
    return task_id


def a_result_with_a_link_test_output_and_a_picture(served) -> str:
    task_id = asked(served, "Ship the pricing page.", ["The build passes.", "The tests pass.", "The page looks right."])
    out = mcp(served, "oj/muse", "return_result", {"task_id": task_id, "summary": "Shipped.", "evidence": [
        {"kind": "link", "summary": "CI build 7", "url": "https://ci.example/builds/7", "criteria": [0]},
        {"kind": "test_output", "summary": "Unit tests", "content": "collected 12 items\n\n12 passed in 0.31s",
         "criteria": [0, 1]},
        {"kind": "screenshot", "summary": "Pricing page at 1366 px", "url": PICTURE, "criteria": [2]},
        {"kind": "note", "summary": "Read it through once more."}]})
    assert out["task"]["state"] == "verifying"
    return task_id


def open_task(people, served, task_id: str, viewport: dict) -> Page:
    page = people("oj", viewport=viewport)
    picture = png(320, 200)
    page.route("https://img.example/**", lambda route: route.fulfill(status=200, content_type="image/png",
                                                                     body=picture))
    goto(page, served, f"#/p/{PROJECT}/tasks/{task_id}")
    expect(page.locator(".task-title")).to_be_visible()
    return page


# ---- the criteria with their evidence ------------------------------------------------------------------


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["1366", "390"])
def test_each_criterion_shows_its_evidence_under_the_buttons_and_its_refs_move_the_focus(served, people, viewport):
    task_id = a_result_with_a_link_test_output_and_a_picture(served)
    page = open_task(people, served, task_id, viewport)
    decision = page.locator(".decision")
    expect(decision.locator(".decision-lead")).to_have_text("Every criterion is covered by fresh evidence:")
    expect(decision.locator(".ce-criterion .ce-head")).to_have_text([
        "Criterion 1 The build passes. covered by #1, #2",
        "Criterion 2 The tests pass. covered by #2",
        "Criterion 3 The page looks right. covered by #3"])
    first, second, third = (decision.locator(".ce-criterion").nth(i) for i in range(3))
    expect(first.locator(".ce-item-head")).to_have_text(["#1 link CI build 7", "#2 test output Unit tests"])
    expect(first.get_by_role("link", name="https://ci.example/builds/7")).to_have_attribute(
        "href", "https://ci.example/builds/7")
    expect(first.locator("pre.ce-output")).to_have_text("collected 12 items\n\n12 passed in 0.31s")
    expect(second.locator(".ce-item")).to_have_text("#2 test output “Unit tests” (shown under criterion 1)")
    picture = third.get_by_role("img", name="Preview of evidence #3: Pricing page at 1366 px")
    expect(picture).to_have_attribute("src", PICTURE)
    page.wait_for_function("(img) => img.complete && img.naturalWidth === 320", arg=picture.element_handle())
    expect(decision.locator(".ce-general .ce-item-head")).to_have_text("#4 note Read it through once more.")

    # Right under the buttons, and the decision comes before the packet: on a phone too, on the first screen.
    button = decision.get_by_role("button", name="Give final acceptance").bounding_box()
    criteria = decision.locator(".ce-criteria").bounding_box()
    assert 0 < criteria["y"] - (button["y"] + button["height"]) < 120, (button, criteria)
    assert button["y"] + button["height"] <= viewport["height"], button
    assert button["y"] < page.get_by_role("heading", name="What was asked").bounding_box()["y"]
    assert page.evaluate("document.documentElement.scrollWidth") <= viewport["width"]
    name = f"decide_evidence_{viewport['width']}"
    shot(page, name)

    # #2 under criterion 2 and #3 in criterion 3's standing are links: the focus moves, the address stays.
    route = page.evaluate("location.hash")
    second.locator(".ce-ref").get_by_role("link", name="#2").click()
    expect(page.locator("#decide-e2")).to_be_focused()
    expect(page.locator("#decide-e2")).to_be_in_viewport()
    expect(page.locator("#decide-e2")).to_contain_text("Unit tests")
    third.locator(".ce-standing").get_by_role("link", name="#3").click()
    expect(page.locator("#decide-e3")).to_be_focused()
    assert page.evaluate("location.hash") == route
    shot(page, f"{name}_anchor", full_page=False)
    # So are the packet's: "covered by #2" under criterion 2 leads to #2 of the result.
    page.locator(".criterion").nth(1).get_by_role("link", name="#2").click()
    expect(page.locator("#r1-e2")).to_be_focused()
    expect(page.locator("#r1-e2")).to_contain_text("collected 12 items")
    assert page.evaluate("location.hash") == route


# ---- the armed confirm -----------------------------------------------------------------------------------

CONTRAST = """(el) => {
    const rgb = (c) => c.match(/[\\d.]+/g).slice(0, 3).map(Number);
    const lum = (c) => { const [r, g, b] = rgb(c).map((v) => { v /= 255;
        return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; }); return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
    const s = getComputedStyle(el);
    const [a, b] = [lum(s.color), lum(s.backgroundColor)].sort((x, y) => y - x);
    return Math.round(((a + 0.05) / (b + 0.05)) * 100) / 100;
}"""


def armed_and_hovered(page: Page, button) -> float:
    """Hover the armed button and wait for its colours to settle; the contrast of its text."""
    button.hover()
    page.wait_for_function(f"(el) => ({CONTRAST})(el) >= 4.5", arg=button.element_handle(), timeout=3000)
    return page.evaluate(CONTRAST, button.element_handle())


def serious(page: Page, selector: str, settle: bool = False) -> list:
    """axe-core's serious and critical violations within ``selector`` (axe is loaded beforehand). With
    ``settle``, axe looks again (up to 3 s) while it finds any: a hovered button's colours are still
    changing for a moment after it is armed."""
    deadline = time.monotonic() + (3 if settle else 0)
    while True:
        found = _serious(page, selector)
        if not found or time.monotonic() > deadline:
            return found
        page.wait_for_timeout(100)


def _serious(page: Page, selector: str) -> list:
    found = page.evaluate("async (sel) => (await axe.run({include: [[sel]]}, {resultTypes: ['violations']}))"
                          ".violations.map((v) => ({id: v.id, impact: v.impact, nodes: v.nodes.map((n) => "
                          "n.target.join(' ') + ': ' + n.failureSummary)}))", selector)
    return [v for v in found if v["impact"] in ("serious", "critical")]


@pytest.mark.skipif(not AXE.exists(), reason=f"axe-core is not installed at {AXE} (.ci/run installs it)")
@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_an_armed_confirm_reads_clearly_when_hovered_light_and_dark(served, people, scheme):
    task_id = a_result_with_a_link_test_output_and_a_picture(served)
    page = open_task(people, served, task_id, DESKTOP)
    page.emulate_media(color_scheme=scheme)
    page.add_script_tag(path=str(AXE))
    # An armed confirm disarms itself after 5 s: here it stays armed while axe looks at it.
    page.evaluate("""() => { const later = window.setTimeout;
        window.setTimeout = (fn, ms, ...args) => (ms === 5000 ? 0 : later(fn, ms, ...args)); }""")
    expect(page.locator(".task-timeline .tl-entry")).to_have_count(4)
    assert serious(page, "main") == []  # the whole task page: decision, evidence, timeline
    # A primary button armed, as the inbox's "Accept with gaps? Click again" is: once red on dark green (1.13:1).
    page.evaluate("""async () => {
        const { confirmButton } = await import('/static/ui.js');
        const b = confirmButton('Give final acceptance', 'Accept with gaps? Click again', () => {}, {class: 'primary'});
        b.id = 'armed-primary';
        document.querySelector('.decision .button-row').append(b);
    }""")
    primary = page.locator("#armed-primary")
    primary.click()
    expect(primary).to_have_text("Accept with gaps? Click again")
    expect(primary).to_have_class(re.compile(r"\barmed\b"))
    assert armed_and_hovered(page, primary) >= 4.5
    assert serious(page, ".decision .button-row", settle=True) == []
    expect(primary).to_have_class(re.compile(r"\barmed\b"))  # what axe checked was the armed state
    shot(page, f"decide_armed_primary_{scheme}", full_page=False)
    # The task page's own: Cancel task, armed and hovered.
    page.get_by_text("Cancel the task…").click()
    page.get_by_role("button", name="Cancel task").click()
    cancel = page.get_by_role("button", name="Click again to cancel the task")
    assert armed_and_hovered(page, cancel) >= 4.5
    assert serious(page, ".actions", settle=True) == []
    expect(cancel).to_have_class(re.compile(r"\barmed\b"))
    shot(page, f"decide_armed_cancel_{scheme}", full_page=False)


# ---- one timeline, and the reason shown ------------------------------------------------------------------


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["1366", "390"])
def test_the_timeline_lists_what_happened_in_order_and_a_send_back_and_a_cancel_say_why(served, people, viewport):
    task_id = asked(served, "Write the FAQ.", ["Five questions.", "Plain words."])
    mcp(served, "oj/muse", "post_message", {"project": PROJECT, "task_id": task_id,
                                            "body": "Starting with the **billing** questions."})
    mcp(served, "oj/muse", "checkpoint", {"task_id": task_id, "checkpoint": {"progress": "Three questions drafted."}})
    mcp(served, "oj/muse", "checkpoint", {"task_id": task_id, "checkpoint": {
        "progress": "Drafting the pricing questions.", "open_questions": ["Which plan goes first?"], "needs_answer": True}})
    mcp(served, "oj/muse", "return_result", {"task_id": task_id, "summary": "FAQ drafted.", "evidence": [
        {"kind": "note", "summary": "Five questions.", "criteria": [0]}]})
    page = open_task(people, served, task_id, viewport)
    lines = page.locator(".task-timeline .tl-line")
    expect(lines).to_have_text([
        "you asked oj/muse for this task",
        "The gate let it through → routed",
        "oj/muse took the task on → accepted",
        "oj/muse wrote in the thread",
        "oj/muse noted progress → working",
        "oj/muse noted progress needs a person's answer → waiting",
        "oj/muse returned revision 1: see the result → verifying"])
    expect(page.locator(".tl-checkpoint .tl-line .badge-attention")).to_have_text(["needs a person's answer"])
    expect(page.locator(".tl-message .tl-excerpt")).to_have_text("Starting with the billing questions.")
    expect(page.locator(".tl-message .tl-excerpt strong")).to_have_text("billing")  # Markdown, rendered
    expect(page.locator(".tl-checkpoint .tl-checkpoint-body .md").first).to_have_text("Three questions drafted.")
    expect(page.locator(".tl-submission .tl-excerpt")).to_have_text("FAQ drafted.")

    page.get_by_text("Send it back with a reason").click()
    page.get_by_label("Why it goes back").fill("Criterion 2 has no evidence: show the words are plain.")
    page.get_by_role("button", name="Send back").click()
    expect(page.locator(".task-meta .state")).to_have_text("working")
    expect(page.locator(".decided-notice")).to_have_text("Sent back to oj/muse with your reason: it works on it again.")
    expect(page.locator(".decided-notice")).to_be_focused()  # the focus goes to what was done, not to nowhere
    # What the sent-back revision said of each criterion no longer stands: it is shown as that revision's.
    expect(page.locator(".criteria .criterion-status .badge").first).to_have_text(re.compile(r"^revision 1: "))
    assert all(b.startswith("revision 1: ") for b in page.locator(".criteria .criterion-status .badge").all_inner_texts())
    expect(page.locator(".actions .reason-line")).to_have_text(
        "You sent the result back just now:Criterion 2 has no evidence: show the words are plain.")
    expect(lines.last).to_have_text("you sent revision 1 back → working")
    expect(page.locator(".tl-decision .tl-words")).to_have_text("Criterion 2 has no evidence: show the words are plain.")
    # the actions box, confirmation and reason first, is the first thing under the title
    assert page.locator(".reason-line").bounding_box()["y"] + 40 <= viewport["height"]
    shot(page, f"decide_sent_back_{viewport['width']}")

    page.get_by_text("Cancel the task…").click()
    page.get_by_label("Why it is cancelled").fill("Plans changed: the FAQ moves to the help centre.")
    page.get_by_role("button", name="Cancel task").click()
    page.get_by_role("button", name="Click again to cancel the task").click()
    expect(page.locator(".task-meta .state")).to_have_text("cancelled")
    expect(page.locator(".decided-notice")).to_have_text("You cancelled the task.")
    expect(page.locator(".actions .reason-line")).to_have_text(
        "You cancelled the task just now:Plans changed: the FAQ moves to the help centre.")
    expect(lines.last).to_have_text("you cancelled the task → cancelled")
    expect(page.locator(".tl-state .tl-words").last).to_have_text("Plans changed: the FAQ moves to the help centre.")
    # No internal words on the page: no state codes, no underscores.
    text = page.locator("main").inner_text()
    for code in ("waiting_on", "owner_approval", "send_back", "approval_required", "hand_back"):
        assert code not in text, code
    shot(page, f"decide_cancelled_{viewport['width']}")

    # A message in the thread joins the timeline without a reload.
    mcp(served, "oj/muse", "post_message", {"project": PROJECT, "task_id": task_id, "body": "Understood."})
    expect(lines.last).to_have_text("oj/muse wrote in the thread")
    expect(page.locator(".tl-message .tl-excerpt").last).to_have_text("Understood.")
