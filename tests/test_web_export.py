"""Browser tests: an owner exports a project from its Members screen (the audit log alone, then
everything) and the zip checks out; a member who is not an owner is offered no Export. Chromium, at a
laptop's and a phone's width, with an axe-core check of the section.

Like tests/test_web.py: a real ``prickle serve --demo`` and headless Chromium driven by Playwright.
"""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path

import pytest

import prickle
from browser import PROJECT, Page, expect, goto, shot

AXE = Path(__file__).resolve().parent.parent / ".cache" / "axe" / "node_modules" / "axe-core" / "axe.min.js"
WIDTHS = {"1366": {"width": 1366, "height": 900}, "390": {"width": 390, "height": 844}}


def serious_axe_violations(page: Page) -> list[dict]:
    """axe-core's serious and critical findings in the Export section."""
    if not AXE.exists():
        return []
    page.add_script_tag(path=str(AXE))
    result = page.evaluate(
        "async () => (await axe.run(document.querySelector('.export-slot'), {resultTypes: ['violations']})).violations"
        ".map((v) => ({id: v.id, impact: v.impact, nodes: v.nodes.map((n) => n.target.join(' '))}))")
    return [v for v in result if v["impact"] in ("serious", "critical")]


@pytest.mark.parametrize("width", list(WIDTHS))
def test_an_owner_exports_from_the_members_screen(served, people, width, tmp_path):
    page = people("oj", viewport=WIDTHS[width])
    goto(page, served, f"#/p/{PROJECT}/people")
    section = page.get_by_role("region", name="Export")
    expect(section).to_be_visible()
    section.scroll_into_view_if_needed()
    assert page.evaluate("document.documentElement.scrollWidth") <= WIDTHS[width]["width"]
    assert serious_axe_violations(page) == []
    shot(page, f"export_offered_{width}", full_page=False)

    day = prickle.iso(prickle.utcnow())[:10]
    for part, label in (("audit_log", "Export the audit log"), ("content", "Export everything")):
        with page.expect_download() as got:
            section.get_by_role("button", name=label).click()
        download = got.value
        name = f"{PROJECT}-{part.replace('_', '-')}-{day}.zip"
        assert download.suggested_filename == name
        expect(section.get_by_role("status")).to_have_text(re.compile(rf"^Saved {re.escape(name)} \(\d+ KB\)\.$"))
        saved = tmp_path / name
        download.save_as(saved)
        report = prickle.check_export(str(saved))
        assert report["ok"] and report["part"] == part and report["project"] == PROJECT, report
        with zipfile.ZipFile(saved) as archive:
            *_, last = archive.read("audit.jsonl").decode().splitlines()
            assert "messages.jsonl" in archive.namelist() if part == "content" else archive.namelist() == [
                "audit.jsonl", "manifest.json"]
        # the export's own entry closes the log it carries
        assert {k: json.loads(last)[k] for k in ("type", "refs")} == {
            "type": "project.exported", "refs": {"part": part, "by": "oj"}}
    shot(page, f"export_saved_{width}", full_page=False)
    # the Audit screen names the head the export ends with, to compare it by eye
    goto(page, served, f"#/p/{PROJECT}/audit")
    expect(page.locator(".chain-head code")).to_have_text(json.loads(last)["hash"])
    assert page.evaluate("document.documentElement.scrollWidth") <= WIDTHS[width]["width"]
    shot(page, f"export_audit_head_{width}", full_page=False)


def test_a_member_who_is_not_an_owner_is_offered_no_export(served, people):
    page = people("ren")
    with page.expect_response(lambda r: r.url.endswith(f"/api/projects/{PROJECT}/export")) as asked:
        goto(page, served, f"#/p/{PROJECT}/people")
    assert asked.value.json() == {"can_export": False, "parts": ["audit_log", "content"]}  # the server's say
    expect(page.get_by_role("heading", name="Members and agents")).to_be_visible()
    expect(page.get_by_role("region", name="Export")).to_have_count(0)
