"""The board and the task page: the task lists the page builds them from come from the server (every state,
the ones a task can be cancelled in, the deliverable types, and the board's columns)."""

import prickle
from helpers import auth


def test_meta_gives_the_page_its_task_lists_from_the_server(server, world):
    r = server.get("/api/meta", headers=auth(world, "ren"))
    assert r.json() == {"tasks": {
        "states": ["requested", "routed", "accepted", "working", "waiting", "verifying", "approval",
                   "completed", "rejected", "cancelled", "returned"],
        "cancellable": ["routed", "accepted", "working", "waiting", "verifying", "approval"],
        "deliverable_types": ["code", "doc", "answer", "screenshots", "reviewed_pr", "design", "data", "other"],
        "board": [{"title": "Needs a person", "states": ["approval", "waiting", "returned"]},
                  {"title": "Queued", "states": ["requested", "routed"]},
                  {"title": "In progress", "states": ["accepted", "working"]},
                  {"title": "Verifying", "states": ["verifying"]},
                  {"title": "Done", "states": ["completed"]},
                  {"title": "Closed", "states": ["rejected", "cancelled"]}]}}
    assert r.json()["tasks"]["states"] == prickle.SCHEMAS["check_inbox"][1]["properties"]["assigned"]["items"][
        "properties"]["state"]["enum"]
    assert server.get("/api/meta").status_code == 401
