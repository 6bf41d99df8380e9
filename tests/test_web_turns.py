"""A private room's turns that finish, in Chromium at 1366 and 390 px: two named drafts combined into one
answer while the turn banner says who it waits on, a turn that ran out of time (the owner sees who didn't
answer), and the owner stopping the round (agents can't post until they write again).

Like tests/test_web.py: a real ``prickle serve --demo``; agents act over MCP with plain HTTP POSTs.
Screenshots go to tests/screenshots/.
"""

from __future__ import annotations

import json
import re

import pytest

import prickle
from browser import cli_json, expect, goto, mcp, person_api, shot

ROOM = "oj-room"
PHONE = {"width": 390, "height": 844}


def _write(page, text: str):
    box = page.get_by_role("combobox", name="Message")
    box.fill(text)
    box.press("Enter")
    mine = page.locator(".msg", has_text=text)
    expect(mine).to_have_attribute("data-id", re.compile(r"^msg-"))  # posted: no longer the sending copy
    return mine.get_attribute("data-id")


def _answer(served, runners, agent: str, message_id: str, body: str) -> dict:
    claim = mcp(served, agent, "claim_discussion", {"message_id": message_id, "idempotency_key": "d", "harness": 2},
                key=runners[agent])
    return mcp(served, agent, "post_message", {"project": ROOM, "body": body, "verdict": "draft"},
               key=claim["discussion_credential"]["token"])["message"] | {"role": claim["role"]}


def test_a_combined_turn_a_turn_out_of_time_and_a_stopped_round(served, people):
    cli_json(served.db, "agent", "add", "oj/critic", "--name", "Critic", "--model", "gpt-5", "--client", "codex")
    runners = {a: cli_json(served.db, "device", "pair", a, "--name", "oj-desktop")["token"]
               for a in ("oj/muse", "oj/critic")}
    with person_api(served, "oj") as oj:
        assert oj.post("/api/room", json={"reply_mode": "named", "lead": "oj/muse"}).status_code == 200
    page = people("oj")
    page.locator(f'.project-card[data-slug="{ROOM}"]').click()
    expect(page).to_have_url(re.compile(f"#/p/{ROOM}/room$"))
    settings = page.locator(".room-settings")
    expect(settings.get_by_label("Reply mode")).to_have_value("named")
    expect(settings).to_contain_text("one of them combines the drafts into one answer")

    # Two named agents draft; the lead combines the drafts into one answer.
    asked = _write(page, "@muse and @critic: a tagline for the launch?")
    turn = page.locator(".turn")
    expect(turn.locator(".turn-text")).to_have_text("Waiting on oj/muse and oj/critic to draft, 3 replies left.")
    expect(turn).to_contain_text(re.compile(r"It ends at \d"))
    _answer(served, runners, "oj/muse", asked, "Work, together.")
    expect(turn.locator(".turn-text")).to_have_text("Waiting on oj/critic to draft, 2 replies left.")
    last = _answer(served, runners, "oj/critic", asked, "Your team and its agents, in one room.")
    expect(turn.locator(".turn-text")).to_have_text("Waiting on oj/muse to combine the drafts, 1 reply left.")
    shot(page, "private_room_combine_waiting", full_page=False)
    combined = _answer(served, runners, "oj/muse", last["id"], "Your team and its agents, working together.")
    assert combined["role"] == "combine"
    expect(page.locator(f"#msg-{combined['id']} .msg-body")).to_have_text("Your team and its agents, working together.")
    expect(turn).to_have_count(0)
    expect(page.locator(".turn-ended")).to_have_count(0)  # answered: nothing to say

    # A turn nobody answers runs out of time: the owner sees who didn't answer.
    _write(page, "@critic and a subtitle?")
    expect(turn.locator(".turn-text")).to_have_text("Waiting on oj/critic to draft, 1 reply left.")
    db = prickle.Database(served.db)
    db.execute("UPDATE turns SET expires_at = ? WHERE ended_at IS NULL", (prickle.iso(prickle.utcnow()),))  # time's up
    page.reload()
    ended = page.locator(".turn-ended.out-of-time")
    expect(ended).to_have_text("Your last turn ran out of time. oj/critic didn't answer in time. "
                               "Write again to start a new turn.")
    expect(turn).to_have_count(0)
    shot(page, "private_room_turn_out_of_time", full_page=False)
    assert [json.loads(r["refs"])["agents"] for r in db.rows(
        "SELECT refs FROM audit WHERE chain = ? AND type = 'room.turn_timed_out'", (ROOM,))] == [["oj/critic"]]

    # The owner stops the round: the turn ends, and agents post nothing until the owner writes again.
    again = _write(page, "@muse one more idea?")
    expect(ended).to_have_count(0)
    expect(turn.locator(".turn-text")).to_have_text("Waiting on oj/muse to draft, 1 reply left.")
    turn.get_by_role("button", name="Stop the round").click()
    stopped = page.locator(".turn-ended.round-stopped")
    expect(stopped).to_have_text("You stopped this round. Your agents can't post here until you write again.")
    expect(turn).to_have_count(0)
    shot(page, "private_room_round_stopped", full_page=False)
    with person_api(served, "oj") as oj:
        assert oj.get("/api/room").json()["room"]["round"]["stopped"] is True
    with pytest.raises(AssertionError, match="this turn no longer waits on your agent: the owner stopped it"):
        mcp(served, "oj/muse", "claim_discussion", {"message_id": again, "idempotency_key": "d", "harness": 2},
            key=runners["oj/muse"])
    page.set_viewport_size(PHONE)
    expect(stopped).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    shot(page, "phone_private_room_round_stopped", full_page=False)
    _write(page, "@muse go on")
    expect(stopped).to_have_count(0)
    expect(turn.locator(".turn-text")).to_have_text("Waiting on oj/muse to draft, 1 reply left.")
    db.close()



def test_a_runner_too_old_for_turns_shows_as_needing_an_update_on_the_agents_page(served, people):
    runner = cli_json(served.db, "device", "pair", "oj/muse", "--name", "old-laptop")["token"]
    with person_api(served, "oj") as oj:
        oj.post("/api/room", json={"reply_mode": "solo", "lead": "oj/muse"})
        asked = oj.post(f"/api/projects/{ROOM}/messages", json={"body": "Still there?"}).json()["message"]
    with pytest.raises(AssertionError, match="harness: this runner speaks harness 1"):  # an old runner sends none
        mcp(served, "oj/muse", "claim_discussion", {"message_id": asked["id"], "idempotency_key": "old"}, key=runner)
    page = people("oj")
    goto(page, served, "#/agents")
    card = page.locator('.agent-card[data-agent="oj/muse"]')
    expect(card.locator(".needs-update")).to_contain_text("Its runner needs an update")
    expect(page.locator('.agent-card[data-agent="oj/critic"] .needs-update')).to_have_count(0)
    card.scroll_into_view_if_needed()
    shot(page, "agents_runner_needs_an_update", full_page=False)
    # The updated runner answers: the warning goes.
    mcp(served, "oj/muse", "claim_discussion", {"message_id": asked["id"], "idempotency_key": "new", "harness": 2},
        key=runner)
    page.reload()
    expect(card).to_be_visible()
    expect(card.locator(".needs-update")).to_have_count(0)
