"""Browser tests: an owner deletes a project from its Members screen (confirming it's them with a passkey),
an open view of it loses it at once, the home page lists it for its owners with its deadline and Restore,
and Restore brings it back; Erase is offered beside Delete. Desktop (1366 px) and phone (390 px) widths.

Like tests/test_web_step_up.py: a real ``prickle serve --demo``, headless Chromium with its virtual
authenticator. Screenshots go to tests/screenshots/.
"""

from __future__ import annotations

import re
from pathlib import Path

from browser import PROJECT, at_name, cli_json, expect, goto, person_api, shot, signed_in_at_name, with_passkey

AXE = Path(__file__).resolve().parent.parent / ".cache" / "axe" / "node_modules" / "axe-core" / "axe.min.js"
DESKTOP = {"width": 1366, "height": 900}
PHONE = {"width": 390, "height": 844}


def serious(page, selector):
    """The serious and critical axe-core findings inside ``selector`` (none when axe-core is not installed)."""
    if not AXE.exists():
        return []
    page.add_script_tag(path=str(AXE))
    return page.evaluate("async (s) => (await axe.run({include: [[s]]}, {resultTypes: ['violations']})).violations"
                         ".filter((v) => ['serious', 'critical'].includes(v.impact)).map((v) => v.id)", selector)


def test_an_owner_deletes_a_project_an_open_view_loses_it_and_restore_brings_it_back(served, people):
    ren = people("ren", viewport=DESKTOP)
    goto(ren, served, f"#/p/{PROJECT}/room")
    expect(ren.locator(".project-name")).to_have_text("Website v2")
    page = signed_in_at_name(people, served, "oj", viewport=DESKTOP)
    with_passkey(page, served, "oj")
    page.goto(at_name(f"{served.info['url']}/#/p/{PROJECT}/people"))
    zone = page.locator("section.danger-zone")
    expect(zone.get_by_role("heading", name="Delete or erase this project")).to_be_visible()
    expect(zone.get_by_role("button", name="Erase project: Website v2")).to_be_visible()
    expect(page.locator(".page-head h1")).to_have_text("Members and agents")
    # A destructive act comes last: the screen's sections, top to bottom, end with it.
    sections = page.locator("main section h2").all_inner_texts()
    assert sections[-1] == "Delete or erase this project"
    assert sections.index("Members") < sections.index("Agents") < sections.index("Delete or erase this project")
    zone.scroll_into_view_if_needed()
    shot(page, "deletion_members_owner_desktop")
    assert serious(page, "section.danger-zone") == []
    delete = zone.get_by_role("button", name="Delete project: Website v2")
    delete.click()
    expect(delete).to_have_text("Click again to delete it")
    delete.click()
    dialog = page.get_by_role("dialog", name="Confirm it's you")
    expect(dialog.locator(".stepup-why")).to_have_text(re.compile(r"^Confirm it's you to delete the project "
                                                                  f"'{PROJECT}'"))
    dialog.get_by_role("button", name="Use my passkey").click()
    # Gone for everyone at once: the owner lands on the home page, the member's open room says so.
    expect(page.get_by_role("heading", name=re.compile(r"^Hello, "))).to_be_visible()
    item = page.locator(f".deleted-project[data-slug='{PROJECT}']")
    expect(item.locator(".project-card-name")).to_have_text("Website v2")
    expect(item.locator(".deleted-deadline")).to_contain_text("Restore until")
    expect(page.locator(f".project-card[data-slug='{PROJECT}']")).to_have_count(0)
    expect(ren.get_by_role("heading", name="No such project in your list")).to_be_visible()
    with person_api(served, "oj") as oj:
        [deleted] = oj.get("/api/deleted-projects").json()["projects"]
    assert (deleted["project"], deleted["state"], deleted["can_restore"]) == (PROJECT, "deleted", True)
    shot(page, "deletion_home_deleted_desktop")
    assert serious(page, "section.deleted-projects") == []
    # The member who is no owner sees nothing to restore.
    goto(ren, served, "#/")
    expect(ren.get_by_role("heading", name=re.compile(r"^Hello, "))).to_be_visible()
    expect(ren.locator("section.deleted-projects")).to_be_hidden()
    expect(ren.locator(f".project-card[data-slug='{PROJECT}']")).to_have_count(0)
    item.get_by_role("button", name="Restore Website v2").click()
    expect(page.locator(f".project-card[data-slug='{PROJECT}']")).to_be_visible()
    expect(page.locator("section.deleted-projects")).to_be_hidden()
    # The member's open list of projects shows it again (project.restored on their own stream).
    expect(ren.locator(f".project-card[data-slug='{PROJECT}']")).to_be_visible(timeout=25_000)
    with person_api(served, "oj") as oj:
        assert oj.get(f"/api/projects/{PROJECT}").status_code == 200
        types = [e["type"] for e in oj.get(f"/api/projects/{PROJECT}/audit").json()["entries"][:2]]
    assert types == ["project.restored", "project.deleted"]
    # A member who is no owner is offered neither.
    goto(ren, served, f"#/p/{PROJECT}/people")
    expect(ren.get_by_role("heading", name="Members and agents")).to_be_visible()
    expect(ren.locator("section.danger-zone")).to_have_count(0)


def test_on_a_phone_the_deleted_project_and_its_restore_fit(served, people):
    page = people("oj", viewport=PHONE)
    goto(page, served, f"#/p/{PROJECT}/people")
    zone = page.locator("section.danger-zone")
    expect(zone.get_by_role("button", name="Delete project: Website v2")).to_be_visible()
    zone.scroll_into_view_if_needed()
    shot(page, "deletion_members_owner_phone", full_page=False)
    cli_json(served.db, "project", "delete", PROJECT, "--by", "oj")
    goto(page, served, "#/")
    item = page.locator(f".deleted-project[data-slug='{PROJECT}']")
    restore = item.get_by_role("button", name="Restore Website v2")
    expect(restore).to_be_visible()
    box = item.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"]
    assert restore.bounding_box()["height"] >= 32
    item.scroll_into_view_if_needed()
    shot(page, "deletion_home_deleted_phone", full_page=False)
    assert serious(page, "section.deleted-projects") == []
    restore.click()
    expect(page.locator(f".project-card[data-slug='{PROJECT}']")).to_be_visible()
