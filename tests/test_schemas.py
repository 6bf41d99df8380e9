"""The published tool schemas: ours equal the reference's, and every tool is described."""

import pytest

import prickle
from conftest import REFERENCE_EVENTS, REFERENCE_TOOLS


@pytest.mark.parametrize("tool", sorted(prickle.TOOLS))
def test_input_schema_equals_reference(tool):
    assert prickle.SCHEMAS[tool][0] == REFERENCE_TOOLS[tool]["input_schema"]


@pytest.mark.parametrize("tool", sorted(prickle.TOOLS))
def test_output_schema_equals_reference(tool):
    assert prickle.SCHEMAS[tool][1] == REFERENCE_TOOLS[tool]["output_schema"]


@pytest.mark.parametrize("tool", sorted(prickle.TOOLS))
def test_reference_example_input_is_valid(tool):
    assert prickle.validate_input(tool, REFERENCE_TOOLS[tool]["example_input"])


def test_tools_list_over_mcp(mcp):
    msg = mcp.rpc(mcp.keys["oj/muse"], "tools/list")
    tools = {t["name"]: t for t in msg["result"]["tools"]}
    assert set(tools) == set(prickle.TOOLS) == {
        "discover_team_agents", "get_project_context", "read_room", "post_message", "wait_for_mention",
        "update_pulse", "wait_for_updates", "handoff", "check_inbox", "accept_task", "checkpoint", "return_result",
        "accept_result", "reject_result", "request_capability", "claim_task", "claim_discussion", "request_step"}
    for name, t in tools.items():
        assert len(t["description"]) > 80
        assert t["inputSchema"] == REFERENCE_TOOLS[name]["input_schema"]
        assert t["outputSchema"] == REFERENCE_TOOLS[name]["output_schema"]
        assert set(t["annotations"]) >= {"readOnlyHint", "idempotentHint", "destructiveHint"}
    assert tools["read_room"]["annotations"]["readOnlyHint"] is True
    assert tools["post_message"]["annotations"]["readOnlyHint"] is False
    assert tools["update_pulse"]["annotations"]["idempotentHint"] is True


def test_validate_input_fills_defaults_and_names_the_field():
    assert prickle.validate_input("read_room", {"project": "website-v2"}) == {"project": "website-v2", "limit": 50}
    with pytest.raises(prickle.InvalidInput, match=r"^limit: 500 is greater than the maximum of 100"):
        prickle.validate_input("read_room", {"project": "website-v2", "limit": 500})
    with pytest.raises(prickle.InvalidInput, match="'project' is a required property"):
        prickle.validate_input("read_room", {})
    with pytest.raises(prickle.InvalidInput, match=r"^project: 'Bad Slug' does not match"):
        prickle.validate_input("discover_team_agents", {"project": "Bad Slug"})


def _under(schema, key):
    """Every subschema of ``schema`` found under a property named ``key``."""
    if isinstance(schema, dict):
        for k, v in schema.items():
            if k == "properties" and isinstance(v, dict) and key in v:
                yield v[key]
            yield from _under(v, key)
    elif isinstance(schema, list):
        for v in schema:
            yield from _under(v, key)


def test_the_limits_and_labels_the_code_uses_are_the_references():
    every = [REFERENCE_TOOLS[t][side] for t in REFERENCE_TOOLS for side in ("input_schema", "output_schema")]
    bodies = {s.get("maxLength") for schema in every for s in _under(schema, "body")}
    assert bodies == {prickle.BODY_MAX} == {8000}
    assert {s["maxItems"] for schema in every for s in _under(schema, "mentions")} == {prickle.MENTIONS_MAX}
    assert {s["maxLength"] for schema in every for s in _under(schema, "task") if "maxLength" in s} == {
        prickle.TASK_TEXT_MAX}
    whys = {tuple(s["enum"]) for schema in every for s in _under(schema, "why")}
    assert whys == {("before_previous_revision", prickle.EVIDENCE_TOO_OLD)}
    # Each label names its window, so changing one without the other fails here.
    assert prickle.EVIDENCE_TOO_OLD == f"older_than_{prickle.EVIDENCE_FRESH.days}_days" == "older_than_7_days"
    hours = prickle._dt.timedelta(hours=1)
    assert prickle.APPROVAL_LAPSED == f"{prickle.APPROVAL_LIFETIME // hours}_hours" == "24_hours"
    assert prickle.STEP_UNDECIDED == f"undecided_{prickle.STEP_LIFETIME // hours}_hours"
    # A request's grade is one the reference's approval object knows.
    grades = {tuple(s["enum"]) for event in REFERENCE_EVENTS.values() for s in _under(event, "grade")}
    assert grades == {("read_only", "reversible", "hard_to_undo", "spending", "outbound", "unrestricted")}
    assert set(prickle.GRADE_OF_DELIVERABLE.values()) | {"outbound"} <= set(next(iter(grades)))
    assert set(prickle.GRADE_OF_DELIVERABLE) == set(prickle.PACKET["properties"]["deliverable_type"]["enum"])


def test_every_test_the_readme_names_as_a_promises_proof_exists():
    import pathlib
    import re
    root = pathlib.Path(__file__).parent.parent
    named = set(re.findall(r"`(tests/\w+\.py)::(\w+)`", (root / "README.md").read_text(encoding="utf-8")))
    assert len(named) >= 30  # the reliability section's promises
    missing = [f"{path}::{name}" for path, name in sorted(named)
               if not re.search(rf"^(async )?def {name}\(", (root / path).read_text(encoding="utf-8"), flags=re.M)]
    assert missing == []
