"""People, teams and projects: people and owners, a project's team, creating and renaming projects, adding
teammates, allowed agent apps, and listing."""

import prickle
from conftest import PROJECT, all_events, audit_entries
from helpers import P, _database_at_version, audit_text, auth, jrun, person, run, sha, written


def _counts(db):
    return {t: db.scalar(f"SELECT count(*) FROM {t}") for t in ("members", "team_people", "audit", "outbox",
                                                                 "agents", "project_agents")}


def _person(handle, name, color):
    return {"handle": handle, "display_name": name, "avatar_url": None, "color": color, "away": False}


def test_a_project_owner_adds_a_teammate_and_is_told_to_invite_anyone_else(server, world):
    prickle.add_person(world.db, "kim", "Kim Park")
    before = _counts(world.db)
    r = server.post("/api/projects/side/members", json={"handle": "kim"}, headers=auth(world, "sam"))
    assert r.status_code == 403
    assert r.json()["error"] == {"code": "forbidden", "message": "handle: 'kim' is not in team 'web': only a "
                                 "teammate is added directly; invite them by email instead, with the Invite form on the "
                                 "Members page or 'prickle invite create side ADDRESS --by HANDLE'"}
    assert _counts(world.db) == before
    prickle.add_to_team(world.db, "web", "kim")
    r = server.post("/api/projects/side/members", json={"handle": "kim"}, headers=auth(world, "sam"))
    assert r.json() == {"member": {"project": "side", "handle": "kim", "role": "member"}}
    assert audit_entries(world.db, "side", "member.added")[-1]["refs"] == {
        "person": "kim", "role": "member", "grant_version": 1, "by": "sam"}
    assert all_events(world.db)[-1]["type"] == "member.joined"
    assert all_events(world.db)[-1]["member"]["handle"] == "kim"


def test_the_command_line_adds_anyone_making_them_a_teammate_on_the_way(world):
    prickle.add_person(world.db, "kim", "Kim Park")
    assert jrun(world.db_path, "member", "add", PROJECT, "kim")["member"] == {
        "project": PROJECT, "handle": "kim", "role": "member"}
    assert world.db.one("SELECT role FROM team_people WHERE team = 'web' AND handle = 'kim'") == {"role": "member"}
    assert audit_entries(world.db, PROJECT, "member.added")[-1]["refs"] == {
        "person": "kim", "role": "member", "grant_version": 1, "by": None}


def test_creating_a_project_makes_its_team_with_the_creator_as_owner(server, world):
    prickle.add_person(world.db, "kim", "Kim Park")
    jrun(world.db_path, "project", "create", "ops-board", "--name", "Ops", "--team", "ops", "--owner", "kim")
    assert prickle.team_out(world.db, "ops")["people"][0] | {"joined_at": None} == _person(
        "kim", "Kim Park", 3) | {"role": "owner", "joined_at": None}
    # Through the API a person starts a team, or works in a team they are in, not someone else's.
    before = _counts(world.db)
    r = server.post("/api/projects", json={"slug": "x", "name": "X", "team": "ops"}, headers=auth(world, "ren"))
    assert r.status_code == 403 and "'ren' is not in team 'ops'" in r.json()["error"]["message"]
    assert _counts(world.db) == before
    assert server.post("/api/projects", json={"slug": "x", "name": "X", "team": ""},
                       headers=auth(world, "ren")).json()["error"]["message"] == "team must be text of 1 to 40 characters"
    r = server.post("/api/projects", json={"slug": "ren-lab", "name": "Lab", "team": "lab"}, headers=auth(world, "ren"))
    assert r.status_code == 200
    assert [(p["handle"], p["role"]) for p in prickle.team_out(world.db, "lab")["people"]] == [("ren", "owner")]
    # The CLI may put anyone's project in an existing team: they become a member of it.
    jrun(world.db_path, "project", "create", "ops-two", "--name", "Ops 2", "--team", "ops", "--owner", "oj")
    assert [(p["handle"], p["role"]) for p in prickle.team_out(world.db, "ops")["people"]] == [
        ("kim", "owner"), ("oj", "member")]


def test_people_create_projects_and_add_teammates(server, world):
    oj = auth(world, "oj")
    r = server.post("/api/projects", json={"slug": "docs-site", "name": "Docs site", "team": "web"}, headers=oj)
    assert r.status_code == 200 and r.json()["project"]["slug"] == "docs-site"
    assert server.post("/api/projects", json={"slug": "docs-site", "name": "X", "team": "web"},
                       headers=oj).status_code == 409
    assert server.post("/api/projects", json={"slug": "Bad Slug", "name": "X", "team": "web"},
                       headers=oj).status_code == 400
    assert [p["handle"] for p in server.get("/api/people", headers=oj).json()["people"]] == ["oj", "ren", "sam"]
    r = server.post("/api/projects/docs-site/members", json={"handle": "sam"}, headers=oj)
    assert r.json()["member"] == {"project": "docs-site", "handle": "sam", "role": "member"}
    r = server.post("/api/projects/docs-site/members", json={"handle": "ren"}, headers=auth(world, "sam"))
    assert r.status_code == 403  # only an owner adds teammates
    assert server.post("/api/projects/docs-site/members", json={"handle": "ren"},
                       headers=auth(world, "ren")).status_code == 404  # not a member at all


def test_a_project_owner_renames_a_project_and_its_address_stays(server, mcp, world):
    oj, ren = person(server, world, "oj"), person(server, world, "ren")
    before = written(world.db)
    r = ren.post(f"/api/projects/{PROJECT}/rename", {"name": "Marketing site"})
    assert r.status_code == 403 and r.json()["error"] == {
        "code": "forbidden", "message": "only an owner of 'website-v2' can rename it"}
    r = oj.post(f"/api/projects/{PROJECT}/rename", {"name": ""})
    assert r.status_code == 400 and r.json()["error"]["message"] == "name must be text of 1 to 80 characters"
    assert written(world.db) == before
    r = oj.post(f"/api/projects/{PROJECT}/rename", {"name": "  Marketing site "})
    assert r.json() == {"project": {"slug": PROJECT, "team": "web", "name": "Marketing site",
                                    "description": "The new site."}}
    assert [e["refs"] for e in audit_entries(world.db, PROJECT, "project.renamed")] == [
        {"from": sha("Website v2"), "to": sha("Marketing site"), "by": "oj"}]
    assert "Marketing site" not in audit_text(world.db)
    # The agents still reach it at the same address, and see the new name.
    assert mcp.ok("oj/muse", "get_project_context", P)["project"]["name"] == "Marketing site"
    assert oj.get(f"/api/projects/{PROJECT}").json()["project"]["name"] == "Marketing site"
    # The command line, run by whoever holds the file, renames too; a private room is not renamed.
    assert jrun(world.db_path, "project", "rename", PROJECT, "Site")["project"]["name"] == "Site"
    assert audit_entries(world.db, PROJECT, "project.renamed")[-1]["refs"] == {
        "from": sha("Marketing site"), "to": sha("Site"), "by": None}
    room = world.db.scalar("SELECT project FROM rooms WHERE owner = 'oj'")
    code, out, err = run(world.db_path, "project", "rename", room, "Mine", ok=False)
    assert code != 0 and "is a private room" in err


def test_a_team_that_limits_its_apps_refuses_other_agents_and_records_it(server, world):
    ren, oj = auth(world, "ren"), auth(world, "oj")
    r = server.post("/api/teams/web/apps", json={"apps": ["claude-code"]}, headers=ren)
    assert r.status_code == 403 and r.json()["error"]["message"] == "only an owner of team 'web' chooses the apps it allows"
    assert server.post("/api/teams/web/apps", json={"apps": ["claude-code"]}, headers=oj).json()["team"]["apps"] == [
        "claude-code"]
    assert server.post("/api/teams/web/apps", json={"apps": []}, headers=oj).status_code == 400
    before = _counts(world.db)
    r = server.post("/api/agents", json={"name": "helper", "display_name": "Helper", "model": "gpt-5",
                                         "client": "codex", "projects": [PROJECT]}, headers=ren)
    assert r.status_code == 403
    assert r.json()["error"] == {"code": "forbidden", "message": "team 'web' allows agents of claude-code only, and "
                                 "'ren/helper' uses 'codex': ask a team owner to allow that app"}
    after = _counts(world.db)
    assert after == before | {"audit": before["audit"] + 1}  # nothing joined, nothing made: one record
    entry = audit_entries(world.db, PROJECT)[-1]
    assert (entry["type"], entry["refs"]) == ("agent.add_refused", {"agent": "ren/helper", "app": "codex"})
    # An agent already made is refused the same way by the CLI, which says so in one line.
    prickle.add_agent(world.db, "sam/coder", "Coder", "gpt-5", "codex")
    code, out, err = run(world.db_path, "agent", "join", "side", "sam/coder", ok=False)
    assert code == 1 and err.strip().endswith("'sam/coder' uses 'codex': ask a team owner to allow that app")
    assert [e["refs"] for e in audit_entries(world.db, "side", "agent.add_refused")] == [
        {"agent": "sam/coder", "app": "codex"}]
    # An allowed app joins; a private room is no team's and takes any of its owner's agents.
    jrun(world.db_path, "agent", "add", "sam/writer", "--name", "W", "--model", "m", "--client", "claude-code",
         "--project", "side")
    assert prickle.team_projects_of(world.db, "sam/writer") == ["side"]
    assert world.db.one("SELECT 1 FROM project_agents WHERE project = 'sam-room' AND agent_id = 'sam/coder'")
    assert jrun(world.db_path, "team", "apps", "web", "--any")["team"]["apps"] is None
    assert jrun(world.db_path, "agent", "join", "side", "sam/coder") == {"project": "side", "agent_id": "sam/coder"}


def test_people_lists_your_teams_people_not_everyone(server, world):
    prickle.add_person(world.db, "kim", "Kim Park")
    jrun(world.db_path, "project", "create", "ops-board", "--name", "Ops", "--team", "ops", "--owner", "kim")
    assert [p["handle"] for p in server.get("/api/people", headers=auth(world, "oj")).json()["people"]] == [
        "oj", "ren", "sam"]
    jrun(world.db_path, "team", "add", "ops", "ren")
    assert [p["handle"] for p in server.get("/api/people", headers=auth(world, "ren")).json()["people"]] == [
        "kim", "oj", "ren", "sam"]
    assert server.get("/api/people?project=website-v2", headers=auth(world, "ren")).json()["people"] == [
        _person("oj", "Oj Okafor", 0), _person("ren", "Ren Ito", 1), _person("sam", "Sam Lee", 2)]
    assert server.get("/api/people?project=ops-board", headers=auth(world, "ren")).status_code == 404  # not in it


def test_members_and_teams_over_http(server, world):
    members = server.get(f"/api/projects/{PROJECT}/members", headers=auth(world, "ren")).json()["members"]
    assert [(m["handle"], m["role"], m["agents"]) for m in members] == [
        ("oj", "owner", ["oj/muse", "oj/scout"]), ("ren", "member", ["ren/builder"])]
    assert all(m["joined_at"].endswith("Z") for m in members)
    assert server.get("/api/projects/side/members", headers=auth(world, "ren")).status_code == 404
    assert server.get("/api/teams", headers=auth(world, "ren")).json() == {"teams": [
        {"name": "web", "apps": None, "people": 3, "projects": 2, "role": "member"}]}
    team = server.get("/api/teams/web", headers=auth(world, "ren")).json()["team"]
    assert [(p["handle"], p["role"]) for p in team["people"]] == [("oj", "owner"), ("ren", "member"), ("sam", "member")]
    assert team["projects"] == ["side", PROJECT] and team["apps"] is None
    prickle.add_person(world.db, "kim", "Kim Park")
    kim = prickle.create_token(world.db, "person", person="kim")[1]
    r = server.get("/api/teams/web", headers={"Authorization": f"Bearer {kim}"})
    assert r.status_code == 404 and r.json()["error"]["message"] == "no team 'web' that you are in"
    # Changing a team you are not in reads the same whether it exists or not.
    for name in ("web", "nope"):
        r = server.post(f"/api/teams/{name}/apps", json={"apps": None}, headers={"Authorization": f"Bearer {kim}"})
        assert r.status_code == 404 and r.json()["error"]["message"] == f"no team '{name}' that you are in"


def test_listing_from_the_command_line(world):
    db = world.db_path
    people = jrun(db, "person", "list")["people"]
    assert [(p["handle"], p["teams"]) for p in people] == [
        ("oj", [{"team": "web", "role": "owner"}]), ("ren", [{"team": "web", "role": "member"}]),
        ("sam", [{"team": "web", "role": "member"}])]
    assert jrun(db, "team", "list") == {"teams": [{"name": "web", "apps": None, "people": 3, "projects": 2}]}
    shown = jrun(db, "team", "show", "web")["team"]
    assert [p["handle"] for p in shown["people"]] == ["oj", "ren", "sam"] and shown["projects"] == ["side", PROJECT]
    members = jrun(db, "member", "list", PROJECT)["members"]
    assert [(m["handle"], m["role"], m["agents"]) for m in members] == [
        ("oj", "owner", ["oj/muse", "oj/scout"]), ("ren", "member", ["ren/builder"])]
    agents = jrun(db, "agent", "list", "--owner", "oj")["agents"]
    assert [(a["agent_id"], a["client"], a["projects"]) for a in agents] == [
        ("oj/muse", "claude-code", [PROJECT]), ("oj/scout", "claude-code", [PROJECT])]
    assert len(jrun(db, "agent", "list")["agents"]) == 4
    assert jrun(db, "project", "list") == {"projects": [
        {"slug": "side", "team": "web", "name": "Side project", "description": "", "members": 1, "agents": 1},
        {"slug": PROJECT, "team": "web", "name": "Website v2", "description": "The new site.", "members": 2,
         "agents": 3}]}
    assert run(db, "project", "list")[1].splitlines() == [
        "side                     team web              1 member, 1 agent  Side project",
        "website-v2               team web              2 members, 3 agents  Website v2"]
    assert run(db, "team", "list")[1] == "web                      3 people, 2 projects, apps: any\n"
    out = run(db, "team", "show", "web")[1].splitlines()
    assert out[0] == "Team web (apps: any)" and out[-1] == "  projects: side, website-v2"
    assert run(db, "member", "list", PROJECT)[1].splitlines()[1].startswith("ren                  member  joined ")
    assert run(db, "team", "show", "nope", ok=False)[2].startswith("prickle: no team 'nope'")
    assert run(db, "team", "apps", "web", ok=False)[2].strip() == (
        "prickle: name the apps to allow (like: prickle team apps web claude-code codex), or pass --any")


def test_the_upgrade_turns_team_names_into_teams(db_path):
    teams_migration = next(i for i, m in enumerate(prickle.MIGRATIONS) if any("CREATE TABLE teams" in s for s in m))
    conn = _database_at_version(db_path, teams_migration)
    with conn:
        for h in ("oj", "ren", "sam"):
            conn.execute("INSERT INTO people (handle, display_name, created_at) VALUES (?, ?, 'x')", (h, h.upper()))
        for slug, team, kind, at in (("p1", "web", "team", "2026-01-02"), ("p2", "web", "team", "2026-01-01"),
                                     ("p3", "ops", "team", "2026-01-03"), ("oj-room", "", "private", "2026-01-01")):
            conn.execute("INSERT INTO projects (slug, team, name, created_by, created_at, kind) VALUES "
                         "(?, ?, 'P', 'oj', ?, ?)", (slug, team, at, kind))
        for project, handle, role, at in (("p1", "oj", "owner", "2026-01-02"), ("p1", "ren", "member", "2026-01-05"),
                                          ("p2", "ren", "owner", "2026-01-01"), ("p3", "sam", "owner", "2026-01-03"),
                                          ("p3", "oj", "member", "2026-01-04"), ("oj-room", "oj", "owner", "2026-01-01")):
            conn.execute("INSERT INTO members VALUES (?, ?, ?, 1, ?)", (project, handle, role, at))
    conn.close()
    db = prickle.Database(db_path)
    assert db.rows("SELECT * FROM teams ORDER BY name") == [
        {"name": "ops", "apps": None, "created_at": "2026-01-03"}, {"name": "web", "apps": None, "created_at": "2026-01-01"}]
    assert db.rows("SELECT * FROM team_people ORDER BY team, handle") == [
        {"team": "ops", "handle": "oj", "role": "member", "joined_at": "2026-01-04"},
        {"team": "ops", "handle": "sam", "role": "owner", "joined_at": "2026-01-03"},
        {"team": "web", "handle": "oj", "role": "owner", "joined_at": "2026-01-02"},
        {"team": "web", "handle": "ren", "role": "owner", "joined_at": "2026-01-01"}]


def test_agent_added_says_whether_it_came_with_its_owner_and_whether_it_ended_a_removal(world):
    db = world.db
    prickle.add_agent(db, "oj/scribe", "Scribe", "claude-sonnet", "claude-code", "", [], [PROJECT])
    prickle.remove_agent(db, PROJECT, "oj/scribe", by="oj")
    prickle.add_agent_to_project(db, PROJECT, "oj/scribe", by=world.person("oj"))
    prickle.remove_agent(db, PROJECT, "oj/scout", by="oj")
    prickle.add_agent_to_project(db, PROJECT, "oj/scout")
    refs = [e["refs"] for e in audit_entries(db, PROJECT, "agent.added") if e["refs"]["agent"] in ("oj/scribe",
                                                                                                   "oj/scout")]
    assert refs[-3:] == [{"agent": "oj/scribe", "with_owner": True, "ended_removal": False},
                         {"agent": "oj/scribe", "with_owner": False, "ended_removal": True},
                         {"agent": "oj/scout", "with_owner": False, "ended_removal": True}]
    assert [e["refs"] for e in audit_entries(db, "oj-room", "agent.added")][-1] == {
        "agent": "oj/scribe", "with_owner": True, "ended_removal": False}
