"""Browser tests: the device list says when and from where each device was last used; a device is marked
stolen after a confirmation; "Sign out everywhere" ends every session of the person and their devices.
At 1366 and 390 px wide, with an axe-core check of the list.

Like tests/test_web.py: a real ``prickle serve --demo`` and headless Chromium driven by Playwright; the
runner's key is used over MCP with plain HTTP POSTs. Screenshots go to tests/screenshots/.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import httpx
import pytest

from browser import Page, cli_json, expect, goto, mcp, person_api, shot

AXE = Path(__file__).resolve().parent.parent / ".cache" / "axe" / "node_modules" / "axe-core" / "axe.min.js"
WIDTHS = {"1366": {"width": 1366, "height": 900}, "390": {"width": 390, "height": 844}}


def serious_axe_violations(page: Page) -> list[dict]:
    if not AXE.exists():
        return []
    page.add_script_tag(path=str(AXE))
    result = page.evaluate(
        "async () => (await axe.run(document, {resultTypes: ['violations']})).violations"
        ".map((v) => ({id: v.id, impact: v.impact, nodes: v.nodes.map((n) => n.target.join(' '))}))")
    return [v for v in result if v["impact"] in ("serious", "critical")]


def live_devices(served, handle: str) -> dict:
    with person_api(served, handle) as api:
        return {d["name"]: d for d in api.get("/api/devices").json()["devices"]}


@pytest.mark.parametrize("width", list(WIDTHS))
def test_the_device_list_marks_one_stolen_and_signs_out_everywhere(served, people, width):
    tag = uuid.uuid4().hex[:4]
    lost, spare = f"lost-{tag}", f"spare-{tag}"
    key = cli_json(served.db, "device", "pair", "ren/builder", "--name", lost)["token"]
    cli_json(served.db, "device", "pair", "ren/builder", "--name", spare)
    assert "cursor" in mcp(served, "ren/builder", "wait_for_mention", {"timeout_seconds": 1}, key=key)
    elsewhere = people("ren", viewport=WIDTHS[width])  # ren signed in on another computer too
    page = people("ren", viewport=WIDTHS[width])
    goto(page, served, "#/agents")

    row = page.locator("tr[data-device-id]", has_text=lost)
    expect(row.locator(".device-used")).to_contain_text("from 127.0.0.1")
    expect(page.locator("tr[data-device-id]", has_text=spare).locator(".device-used")).to_have_text(
        re.compile(r"^(Last used: )?never$"))
    assert page.evaluate("document.documentElement.scrollWidth") <= WIDTHS[width]["width"]
    assert serious_axe_violations(page) == []
    row.scroll_into_view_if_needed()
    shot(page, f"devices_last_used_{width}", full_page=False)

    stolen = row.get_by_role("button", name=f"Mark stolen: {lost} (ren/builder)")
    found = stolen.bounding_box()
    assert found["x"] >= 0 and found["x"] + found["width"] <= WIDTHS[width]["width"]
    stolen.click()
    armed = row.get_by_role("button", name=re.compile("^Click again: it was stolen"))
    expect(armed).to_have_text("Click again: it was stolen")
    shot(page, f"devices_mark_stolen_confirm_{width}", full_page=False)
    assert live_devices(served, "ren")[lost]["revoked_at"] is None  # asked first: nothing ended yet
    armed.click()
    expect(row.locator(".badge")).to_have_text("stolen")
    expect(page.locator(".notice", has_text="Marked")).to_have_text(
        f"Marked {lost} stolen: 1 credential and 0 runs ended at once.")
    expect(row.get_by_role("button")).to_have_count(0)
    r = httpx.post(served.info["mcp"], headers={"Authorization": f"Bearer {key}"}, json={})
    assert r.status_code == 401
    assert live_devices(served, "ren")[lost]["revoked_reason"] == "stolen"
    shot(page, f"devices_marked_stolen_{width}", full_page=False)

    live = sum(1 for d in live_devices(served, "ren").values() if d["can_revoke"])
    section = page.get_by_role("region", name="Sign out everywhere")
    section.get_by_role("button", name="Sign out everywhere").click()
    confirm = section.get_by_role("button", name="Click again: end every session and device")
    expect(confirm).to_be_visible()
    shot(page, f"sign_out_everywhere_confirm_{width}", full_page=False)
    confirm.click()
    said = (f"Signed out everywhere: 2 sessions and {live} device{'' if live == 1 else 's'} ended. "
            "Sign in again to continue.")
    expect(page.get_by_role("heading", name="Sign in to Prickle")).to_be_visible()
    expect(page.locator(".signin .notice")).to_have_text(said)
    shot(page, f"signed_out_everywhere_{width}", full_page=False)
    assert live_devices(served, "ren")[spare]["revoked_reason"] == "sessions_ended"
    elsewhere.reload()  # the other computer's session ended too
    expect(elsewhere.get_by_role("heading", name="Sign in to Prickle")).to_be_visible()
