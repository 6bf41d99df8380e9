"""'Confirm it's you' on the page, in Chromium with its virtual authenticator (CDP WebAuthn): the server refuses
an act until the person confirms, the page asks in a dialog and sends the act again; a first passkey is added
from that dialog, the next session confirms with it, and the Rules page lists it. Desktop and phone widths."""

import re
from pathlib import Path

import httpx
from playwright.sync_api import expect

from browser import PROJECT, at_name, person_api, shot, signed_in_at_name, virtual_authenticator, with_passkey
from helpers import cli_json

AXE = Path(__file__).resolve().parent.parent / ".cache" / "axe" / "node_modules" / "axe-core" / "axe.min.js"
SHARE = "What your agents share with the other members"
WHY = ("Confirm it's you to share more with this project; a confirmation then holds 5 minutes for the session or "
       "token that made it.")


def open_at(page, served, hash_):
    page.goto(at_name(f"{served.info['url']}/{hash_}"))


def share(page, decision):
    form = page.locator("form.share-rule")
    expect(form.get_by_label(SHARE)).to_be_enabled()  # the rule as it stands is in
    form.get_by_label(SHARE).select_option(decision)
    form.get_by_role("button", name="Save").click()
    return form


def test_a_first_passkey_is_added_from_the_dialog_and_confirms_the_next_session(served, people):
    page = signed_in_at_name(people, served, "oj")
    cdp, authenticator = virtual_authenticator(page)
    open_at(page, served, f"#/p/{PROJECT}/people")
    expect(page.locator("form.share-rule").get_by_label(SHARE)).to_have_value("default")
    share(page, "threads")
    dialog = page.get_by_role("dialog", name="Confirm it's you")
    expect(dialog.locator(".stepup-why")).to_have_text(WHY)
    add = dialog.get_by_role("button", name="Add a passkey and continue")
    expect(add).to_be_focused()
    shot(page, "step_up_first_passkey_desktop", full_page=False)
    if AXE.exists():  # the dialog reads clearly and is named (axe-core: no serious or critical finding)
        page.add_script_tag(path=str(AXE))
        found = page.evaluate("async () => (await axe.run({include: [['.stepup-dialog']]}, {resultTypes: "
                              "['violations']})).violations.filter((v) => ['serious', 'critical'].includes(v.impact))"
                              ".map((v) => v.id)")
        assert found == []
    add.click()
    expect(dialog).to_have_count(0)
    expect(page.locator("#live-region, [aria-live]").first).to_be_attached()
    with person_api(served, "oj") as oj:
        assert oj.get(f"/api/projects/{PROJECT}/share-rule").json()["decision"] == "threads"
        [key] = oj.get("/api/me/passkeys").json()["passkeys"]
    assert key["label"] == "Passkey"
    [held] = cdp.send("WebAuthn.getCredentials", {"authenticatorId": authenticator})["credentials"]
    assert held["rpId"] == "localhost"

    # a new session in this browser is not confirmed: sharing less asks nothing, sharing more asks again
    page.goto(at_name(cli_json(served.db, "signin-link", "oj")["signin"]))
    expect(page.get_by_role("heading", name=re.compile(r"^Hello, "))).to_be_visible()
    open_at(page, served, f"#/p/{PROJECT}/people")
    expect(page.locator("form.share-rule").get_by_label(SHARE)).to_have_value("threads")
    share(page, "default")
    expect(page.locator("#announcer")).to_have_text("Your agents share the defaults")
    expect(page.locator("section[aria-labelledby=share-heading] .error")).to_be_hidden()
    share(page, "threads")
    use = dialog.get_by_role("button", name="Use my passkey")
    expect(use).to_be_focused()
    expect(dialog.get_by_role("button", name="Add a passkey and continue")).to_have_count(0)
    use.click()
    expect(dialog).to_have_count(0)
    with person_api(served, "oj") as oj:
        assert oj.get(f"/api/projects/{PROJECT}/share-rule").json()["decision"] == "threads"
        entries = [e for e in oj.get(f"/api/projects/{PROJECT}/audit").json()["entries"] if e["type"] == "share_rule.set"]
    assert [(e["refs"]["decision"], e["refs"]["previous"], e["refs"]["step_up"]) for e in entries][-3:] == [
        ("threads", "default", True), ("default", "threads", False), ("threads", "default", True)]
    [held] = cdp.send("WebAuthn.getCredentials", {"authenticatorId": authenticator})["credentials"]
    assert held["signCount"] == 2  # made once, used once

    # the Rules page lists the passkey and the cost that needs confirming
    open_at(page, served, "#/rules")
    section = page.get_by_role("region", name="Confirming it's you")
    expect(section.locator(".passkey-label")).to_have_text(["Passkey"])
    expect(section.get_by_label("Confirm before approving an action that costs more than")).to_have_value("")
    section.locator(".passkey").scroll_into_view_if_needed()
    shot(page, "step_up_settings_desktop")


def test_on_a_phone_the_dialog_fits_and_cancelling_leaves_the_rule_as_it_was(served, people):
    phone = signed_in_at_name(people, served, "ren", viewport={"width": 390, "height": 844})
    open_at(phone, served, f"#/p/{PROJECT}/people")
    form = share(phone, "threads")
    dialog = phone.get_by_role("dialog", name="Confirm it's you")
    expect(dialog.get_by_role("button", name="Add a passkey and continue")).to_be_visible()
    box = dialog.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= 390
    shot(phone, "step_up_dialog_phone", full_page=False)
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_have_count(0)
    expect(phone.locator("section[aria-labelledby=share-heading] .error")).to_have_text(WHY)
    with person_api(served, "ren") as ren:
        assert ren.get(f"/api/projects/{PROJECT}/share-rule").json()["decision"] == "default"
    open_at(phone, served, "#/rules")
    expect(phone.get_by_role("region", name="Confirming it's you").locator(".passkey-list")).to_have_text(
        "No passkey yet: add one here.")  # this server sends no mail
    shot(phone, "step_up_settings_phone")


def test_an_action_above_the_owners_cost_says_so_on_its_card_and_asks_before_approving(served, people):
    runner = cli_json(served.db, "device", "pair", "ren/builder", "--name", "ren-laptop")["token"]
    with person_api(served, "ren") as ren:
        assert ren.post("/api/me/step-up-cost", json={"amount": 1}).json() == {"step_up_above_cost": 1}
    proposed = httpx.post(served.info["url"] + "/api/runner/actions", headers={"Authorization": f"Bearer {runner}"},
                          json={"tool": "image_gen", "action": "Draw the launch poster", "prompt": "a bright launch",
                                "cost_estimate": "$3.50"}, timeout=30)
    assert proposed.status_code == 200, proposed.text
    action = proposed.json()["action"]
    assert action["step_up"] is True
    page = signed_in_at_name(people, served, "ren")
    with_passkey(page, served, "ren")
    open_at(page, served, "#/p/ren-room/room")
    card = page.locator(f'.action-card[data-action-id="{action["id"]}"]')
    expect(card.locator(".step-up-note")).to_have_text(" · approving asks you to confirm it's you")
    card.get_by_role("button", name="Approve").click()
    dialog = page.get_by_role("dialog", name="Confirm it's you")
    expect(dialog.locator(".stepup-why")).to_have_text(
        "Confirm it's you to approve an action above the cost you set; a confirmation then holds 5 minutes for the "
        "session or token that made it.")
    shot(page, "step_up_action_card_desktop", full_page=False)
    dialog.get_by_role("button", name="Use my passkey").click()
    expect(card.locator(".action-status")).to_have_text("approved")
    with person_api(served, "ren") as ren:
        [entry] = [e for e in ren.get("/api/projects/ren-room/audit").json()["entries"] if e["type"] == "action.approved"]
    assert (entry["refs"]["action"], entry["refs"]["cost_estimate"], entry["refs"]["step_up"]) == (
        action["id"], "$3.50", True)
