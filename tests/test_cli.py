"""The command line: every command has help, takes --db and --json, and fails in one line."""

import os
import re
import subprocess

import click
import click.testing
import pytest

import prickle
from conftest import PRICKLE, Served
from helpers import jrun, run


def leaf_commands(group=prickle.cli, path=()):
    for name, cmd in group.commands.items():
        if cmd.hidden:  # run by a program, not a person (the runner's permission-prompt bridge speaks MCP)
            continue
        if isinstance(cmd, click.Group):
            yield from leaf_commands(cmd, path + (name,))
        else:
            yield path + (name,), cmd


@pytest.mark.parametrize("path,cmd", list(leaf_commands()), ids=lambda x: " ".join(x) if isinstance(x, tuple) else "")
def test_every_command_has_help_db_and_json(path, cmd):
    assert cmd.help and len(cmd.help) > 10
    names = {o for p in cmd.params for o in getattr(p, "opts", [])}
    # The runner's commands run on a teammate's computer, on its config file instead of the database.
    store = "--config" if path[0] == "runner" else "--db"
    assert {store, "--json"} <= names
    runner = click.testing.CliRunner()
    result = runner.invoke(prickle.cli, list(path) + ["--help"])
    assert result.exit_code == 0 and store in result.output


def test_command_functions_do_not_take_the_names_of_their_commands():
    groups = {name: cmd for name, cmd in prickle.cli.commands.items() if isinstance(cmd, click.Group)}
    assert {name: sorted(g.commands) for name, g in groups.items()} == {
        "agent": ["add", "join", "list", "remove"], "agents": ["pause", "resume"], "audit": ["rehash", "verify"],
        "device": ["list", "pair", "revoke"], "member": ["add", "leave", "list", "promote", "remove"], "memory": ["retract", "set"],
        "person": ["add", "digest", "email", "erase", "list", "passkeys", "signout-everywhere"], "invite": ["create", "list", "resend", "revoke"],
        "project": ["create", "delete", "deleted", "erase", "export", "list", "rename", "restore"], "rule": ["auto-accept", "list", "revoke", "set"],
        "runner": ["bridge", "connect", "start", "status"], "team": ["add", "apps", "list", "show"], "token": ["create", "list", "revoke"],
        "lead": ["answer", "pick", "show", "step-down"], "task": ["blocked-by", "title"]}
    assert sorted(set(prickle.cli.commands) - set(groups)) == ["backup", "connect", "init", "restore", "serve", "signin-link"]
    # A module-level function named "token" or "project" would be shadowed by every local of that name.
    for path, cmd in list(leaf_commands()) + [((name,), g) for name, g in groups.items()]:
        assert cmd.callback.__name__ not in {path[-1], path[-1].replace("-", "_")}, path
        assert getattr(prickle, cmd.callback.__name__).callback is cmd.callback


def test_a_whole_setup_from_the_command_line(db_path):
    first = jrun(db_path, "init", "--owner", "oj", "--name", "Oj Okafor")
    assert first["person"]["handle"] == "oj" and "/signin?token=prk_sl_" in first["signin"]
    assert jrun(db_path, "person", "add", "ren", "--name", "Ren Ito")["person"]["color"] == 1
    p = jrun(db_path, "project", "create", "website-v2", "--name", "Website v2", "--team", "web", "--owner", "oj")
    assert p["project"] == {"slug": "website-v2", "team": "web", "name": "Website v2", "description": ""}
    assert jrun(db_path, "member", "add", "website-v2", "ren", "--role", "member")["member"]["role"] == "member"
    a = jrun(db_path, "agent", "add", "oj/muse", "--name", "Muse", "--model", "claude-opus-4", "--client",
             "claude-code", "--role", "Copy", "--capability", "other:Docs", "--project", "website-v2")
    assert a["agent"]["capabilities"] == [{"kind": "other", "name": "Docs"}]
    t = jrun(db_path, "token", "create", "--agent", "oj/muse", "--project", "website-v2")
    assert t["token"].startswith("prk_ck_") and t["project"] == "website-v2"
    assert jrun(db_path, "token", "create", "--person", "ren")["token"].startswith("prk_pt_")
    assert jrun(db_path, "token", "create", "--runner", "oj/muse")["token"].startswith("prk_rk_")
    listed = jrun(db_path, "token", "list")["tokens"]
    assert len(listed) == 3 and all("token" not in r and "secret_hash" not in r for r in listed)
    assert jrun(db_path, "token", "revoke", t["id"])["revoked"] is True
    assert jrun(db_path, "memory", "set", "website-v2", "tone", "Warm.", "--by", "ren")["memory"]["value"] == "Warm."
    assert jrun(db_path, "memory", "retract", "website-v2", "tone", "--by", "oj")["retracted"] is True
    c = jrun(db_path, "connect", "oj/muse")
    assert c["token"].startswith("prk_ck_") and c["url"].endswith("/mcp")
    assert c["token"] in c["claude_code"] and "claude mcp add --transport http" in c["claude_code"]
    assert "[mcp_servers.prickle]" in c["codex"] and c["token"] in c["codex"]
    # The Codex set-up in two parts: the TOML for its config file, the shell line with the key.
    assert c["codex_config"] == (f'# ~/.codex/config.toml\n[mcp_servers.prickle]\nurl = "{c["url"]}"\n'
                                 'bearer_token_env_var = "PRICKLE_TOKEN"')
    assert c["codex_env"] == f"export PRICKLE_TOKEN={c['token']}"
    v = jrun(db_path, "audit", "verify")
    assert v["ok"] is True and {r["chain"] for r in v["chains"]} == {"website-v2", "oj-room", ""}
    assert jrun(db_path, "signin-link", "ren")["signin"].startswith("http://127.0.0.1:8321/signin?token=prk_sl_")
    dest = os.path.join(os.path.dirname(db_path), "backup.db")
    assert jrun(db_path, "backup", dest)["backup"] == dest
    assert jrun(dest, "audit", "verify", "website-v2")["ok"] is True


@pytest.mark.parametrize("args,needle", [
    (["person", "add", "Bad Handle", "--name", "X"], "handle must be lowercase"),
    (["project", "create", "p", "--name", "P", "--team", "t", "--owner", "ghost"], "no person with handle 'ghost'"),
    (["agent", "add", "nobody", "--name", "X", "--model", "m", "--client", "c"], "agent must be an agent address"),
    (["agent", "add", "oj/x", "--name", "X", "--model", "m", "--client", "c", "--capability", "bogus"],
     "--capability must be KIND:NAME"),
    (["token", "create"], "pass exactly one of"),
    (["token", "revoke", "tok_missing"], "no credential 'tok_missing'"),
    (["member", "add", "nope", "oj"], "no project 'nope'"),
    (["memory", "retract", "nope", "k", "--by", "oj"], "no project 'nope'"),
    (["audit", "verify", "nope"], "no project 'nope'"),
    (["init", "--owner", "again"], "already has people"),
    (["token", "list", "--owner", "nobody"], "no person with handle 'nobody'"),
    (["backup", "/no/such/folder/x.db"], "does not exist"),
    (["rule", "set", "oj", "--decision", "maybe"], "Invalid value for '--decision'"),
    (["rule", "set", "oj", "--decision", "allow", "--agent", "oj/self"], "your own agents"),
    (["rule", "set", "oj", "--decision", "allow", "--agent", "ren/ghost"], "agent: there is no agent 'ren/ghost'"),
    (["rule", "set", "oj", "--decision", "allow", "--from-owner", "zed"], "owner: there is no person 'zed'"),
    (["rule", "revoke", "oj", "rule_nope"], "no rule 'rule_nope'"),
    (["person", "add", "x"], "Missing option '--name'"),
    (["no-such-command"], "No such command"),
])
def test_bad_input_fails_in_one_line(db_path, args, needle):
    run(db_path, "init", "--owner", "oj")
    before = prickle.Database(db_path).scalar("SELECT count(*) FROM audit")
    code, out, err = run(db_path, *args, ok=False)
    assert code != 0 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("prickle: ") and needle in err, err
    assert "Traceback" not in err
    assert prickle.Database(db_path).scalar("SELECT count(*) FROM audit") == before


def test_audit_verify_exits_non_zero_on_a_broken_chain(db_path):
    run(db_path, "init", "--owner", "oj")
    run(db_path, "project", "create", "p", "--name", "P", "--team", "t", "--owner", "oj")
    db = prickle.Database(db_path)
    db.execute("UPDATE audit SET type = 'forged' WHERE chain = 'p' AND n = 1")
    code, out, err = run(db_path, "audit", "verify", ok=False)
    assert code == 1 and "p: 2 entries, BROKEN at entry 1" in out


def test_serve_on_a_new_database_says_what_to_do_and_a_second_serve_is_refused(db_path):
    with Served(db_path, json_info=False) as served:
        lines = [served.first]
        while not lines[-1].startswith("  prickle connect"):
            lines.append(served.proc.stdout.readline())
            assert lines[-1], "".join(lines)
        assert lines[0].startswith("Prickle ") and "is listening on http://127.0.0.1:" in lines[0]
        port = lines[0].split("http://127.0.0.1:")[1].split()[0]
        assert lines[1] == ("Apps connect with keys only: sign-in (OAuth) needs public_url in prickle.toml set to "
                            f"this server's https address (or http://localhost:{port} to try it on this machine).\n")
        steps = [line.split("#")[0].strip() for line in lines if line.startswith("  prickle ")]
        assert [step.split()[:2] for step in steps] == [["prickle", "init"], ["prickle", "project"],
                                                        ["prickle", "agent"], ["prickle", "connect"]]
        # Run as printed (with a handle filled in): each names this database and works while it serves.
        for step in steps:
            args = [a.replace("YOUR-HANDLE", "oj") for a in __import__("shlex").split(step)[1:]]
            assert args[args.index("--db") + 1] == db_path
            done = subprocess.run(PRICKLE + args, capture_output=True, text=True, timeout=30)
            assert done.returncode == 0, (step, done.stderr)
        assert "prk_ck_" in done.stdout  # connect printed the new agent's key
        second = subprocess.run(PRICKLE + ["serve", "--db", db_path, "--port", "0"], capture_output=True, text=True,
                                timeout=30)
        assert second.returncode == 1
        assert second.stderr.startswith("prickle: another prickle serve is already using")
        assert len(second.stderr.strip().splitlines()) == 1


def test_serve_says_when_apps_may_sign_in(tmp_path, db_path):
    config = tmp_path / "elsewhere.toml"  # not the prickle.toml beside the database, read when --config is left out
    config.write_text('public_url = "http://127.0.0.1:8321"\n')
    with Served(db_path, "--config", str(config), json_info=False) as served:
        assert served.proc.stdout.readline() == "Apps may connect by signing in (OAuth) at http://127.0.0.1:8321/mcp.\n"
        # Started on another port than the one public_url names (--port), it says its links reach nothing.
        said = served.proc.stdout.readline()
        assert re.fullmatch(r"public_url names port 8321, but this server listens on (\d+): the links it prints and "
                            r"sends would reach nothing\. Set public_url in prickle\.toml to http://127\.0\.0\.1:\1, or "
                            r"start without --port\.\n", said), said
        assert said.split()[8] != "8321:"
    with Served(db_path, "--config", str(config)) as served:
        assert served.info["oauth"] == {"issuer": "http://127.0.0.1:8321"}
        assert served.info["warning"].startswith("public_url names port 8321, but this server listens on ")
    with Served(db_path) as served:
        assert served.info["oauth"] is None and "warning" not in served.info
    # The port from prickle.toml, not --port: the advice is to start on the port public_url names.
    settings = prickle.Settings(public_url="http://localhost:9999", port=8321)
    assert prickle._address_notes(settings, "http://localhost:9999", 8321, None, False)[1] == (
        "public_url names port 9999, but this server listens on 8321: the links it prints and sends would reach "
        "nothing. Set public_url in prickle.toml to http://localhost:8321, or start with --port 9999.")


def test_settings_file_errors_name_the_setting(tmp_path, db_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("port = 'eighty'\n")
    code, out, err = run(db_path, "serve", "--config", str(bad), ok=False)
    assert code == 1 and "port" in err and len(err.strip().splitlines()) == 1
    bad.write_text("colour = 3\n")
    code, out, err = run(db_path, "serve", "--config", str(bad), ok=False)
    assert "colour" in err


def test_example_settings_file_is_valid_and_complete():
    path = os.path.join(os.path.dirname(__file__), "..", "prickle.example.toml")
    settings = prickle.load_settings(path)
    with open(path) as f:
        text = f.read()
    for name in prickle.Settings.model_fields:
        if name == "smtp":  # a table, off by default: shown commented out, every field of it
            assert "\n# [smtp]\n" in text and settings.smtp is None
            for field in prickle.SmtpSettings.model_fields:
                assert f"\n# {field} =" in text, f"prickle.example.toml does not document smtp.{field}"
            continue
        assert f"{name} =" in text, f"prickle.example.toml does not document {name}"
    assert settings == prickle.Settings(**__import__("tomllib").loads(text))


def test_admin_commands_refuse_a_database_that_does_not_exist(tmp_path):
    missing = str(tmp_path / "typo.db")
    code, out, err = run(missing, "token", "list", ok=False)
    assert code == 1 and "no database at" in err and not os.path.exists(missing)


def test_rules_from_the_command_line(db_path):
    run(db_path, "init", "--owner", "oj")
    run(db_path, "person", "add", "ren", "--name", "Ren")
    r = jrun(db_path, "rule", "set", "oj", "--decision", "never", "--from-owner", "ren")["rule"]
    assert (r["for"], r["subject"], r["decision"]) == ("owner", "ren", "never")
    again = jrun(db_path, "rule", "set", "oj", "--decision", "allow", "--from-owner", "ren")["rule"]
    rules = jrun(db_path, "rule", "list", "oj")
    assert [x["id"] for x in rules["rules"]] == [again["id"]] and rules["standing_approvals"] == []
    assert jrun(db_path, "rule", "revoke", "oj", again["id"])["revoked"] is True
    assert jrun(db_path, "rule", "list", "oj")["rules"] == []
    assert jrun(db_path, "rule", "auto-accept", "oj", "on") == {"owner": "oj", "auto_accept": True}


def test_connect_warns_about_an_agent_in_no_project(db_path):
    run(db_path, "init", "--owner", "oj")
    run(db_path, "agent", "add", "oj/solo", "--name", "Solo", "--model", "m", "--client", "c")
    code, out, err = run(db_path, "connect", "oj/solo")
    assert "is in no project yet" in out and "prickle agent join PROJECT oj/solo" in out
    codex = out.split("Codex, in ~/.codex/config.toml:\n")[1].split("\n\n")[0]
    assert codex.splitlines() == ["  [mcp_servers.prickle]", '  url = "http://127.0.0.1:8321/mcp"',
                                  '  bearer_token_env_var = "PRICKLE_TOKEN"']
    run(db_path, "project", "create", "p", "--name", "P", "--team", "t", "--owner", "oj")
    assert jrun(db_path, "agent", "join", "p", "oj/solo") == {"project": "p", "agent_id": "oj/solo"}
    assert jrun(db_path, "connect", "oj/solo")["projects"] == ["p"]


def test_no_schema_upgrade_under_a_running_server(db_path):
    run(db_path, "init", "--owner", "oj")
    db = prickle.Database(db_path)
    db.conn.pragma("user_version", len(prickle.MIGRATIONS) - 1)  # as if an older Prickle made it
    db.close()
    lock = prickle.ServerLock(db_path)
    lock.acquire()
    try:
        code, out, err = run(db_path, "token", "list", ok=False)
        assert code == 1 and "needs a schema upgrade and a server is using it" in err
    finally:
        lock.release()


def test_a_key_for_a_project_the_agent_is_not_in_names_the_commands_that_fix_it(db_path):
    run(db_path, "init", "--owner", "oj")
    run(db_path, "person", "add", "ren", "--name", "Ren")
    run(db_path, "project", "create", "site", "--name", "Site", "--team", "web", "--owner", "oj")
    run(db_path, "agent", "add", "ren/builder", "--name", "B", "--model", "m", "--client", "c")
    code, _, err = run(db_path, "token", "create", "--agent", "ren/builder", "--project", "sight", ok=False)
    assert code != 0 and err.strip() == "prickle: no project 'sight'"  # a typo is not a missing membership
    code, _, err = run(db_path, "token", "create", "--agent", "ren/builder", "--project", "site", ok=False)
    assert code != 0 and err.strip() == (
        "prickle: agent 'ren/builder' is not in project 'site': add it with 'prickle member add site ren', "
        "then 'prickle agent join site ren/builder', and make the key again")
    run(db_path, "member", "add", "site", "ren")
    code, _, err = run(db_path, "token", "create", "--agent", "ren/builder", "--project", "site", ok=False)
    assert err.strip() == ("prickle: agent 'ren/builder' is not in project 'site': add it with "
                           "'prickle agent join site ren/builder', and make the key again")
    run(db_path, "agent", "join", "site", "ren/builder")
    assert jrun(db_path, "token", "create", "--agent", "ren/builder", "--project", "site")["project"] == "site"


def test_init_says_when_its_link_address_is_a_guess_and_reads_settings_beside_the_database(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the working directory has no prickle.toml
    guessed = str(tmp_path / "a" / "prickle.db")
    os.makedirs(os.path.dirname(guessed))
    _, out, _ = run(guessed, "init", "--owner", "oj")
    assert out.startswith("Created oj. Sign in (once, within 30 min): http://127.0.0.1:8321/signin?token=prk_sl_")
    assert "No server has run on this database yet, so the address above is a guess" in out
    beside = tmp_path / "b"
    beside.mkdir()
    (beside / "prickle.toml").write_text('public_url = "https://prickle.example.org"\n')
    first = jrun(str(beside / "prickle.db"), "init", "--owner", "oj")
    assert first["signin"].startswith("https://prickle.example.org/signin?token=prk_sl_")
    assert first["address_known"] is True
    _, out, _ = run(str(beside / "prickle.db"), "signin-link", "oj")
    assert out.startswith("https://prickle.example.org/signin?token=prk_sl_") and "guess" not in out


def test_listening_everywhere_links_to_the_machine_address_and_the_host_check_takes_it(monkeypatch, db_path):
    import starlette.testclient
    monkeypatch.setattr(prickle.socket, "gethostbyname", lambda name: "192.0.2.7")
    prickle.machine_address.cache_clear()
    try:
        settings = prickle.Settings(host="0.0.0.0")
        assert settings.base_url(8321) == "http://192.0.2.7:8321"
        prickle.init_owner(prickle.Database(db_path), "oj", "Oj")
        app = prickle.create_app(db_path, settings, 8321)
        with starlette.testclient.TestClient(app, base_url="http://192.0.2.7:8321") as client:
            assert client.get("/api/me").status_code == 401  # past the Host check, not 421
            assert client.get("/api/me", headers={"Host": "evil.example:8321"}).status_code == 421
    finally:
        prickle.machine_address.cache_clear()


def test_device_pair_prints_the_agents_table_for_the_runners_config_and_a_missing_agent_says_to_add_it(db_path, tmp_path):
    run(db_path, "init", "--owner", "ren")
    run(db_path, "project", "create", "p", "--name", "P", "--team", "t", "--owner", "ren")
    run(db_path, "agent", "add", "ren/helper", "--name", "Helper", "--model", "m", "--client", "command",
        "--project", "p")
    run(db_path, "agent", "add", "ren/coder", "--name", "Coder", "--model", "m", "--client", "claude-code",
        "--project", "p")
    code, out, err = run(db_path, "device", "pair", "ren/helper", "--name", "lap")
    key = re.search(r"prk_rk_[A-Za-z0-9_-]+", out).group(0)
    assert out.split("\n", 2)[2] == (
        '\nIts table for the runner\'s config (server = "http://127.0.0.1:8321"; prickle runner start --config '
        f'FILE):\n[agents."ren/helper"]\nkey = "{key}"\nclient = "command"\n'
        'command = ["my-agent", "{prompt_file}"]   # the argv the runner starts for a run\n')
    # Pasted under a server line, it is a config the runner takes.
    config = tmp_path / "runner.toml"
    config.write_text('server = "http://127.0.0.1:8321"\n' + out.split("--config FILE):\n")[1])
    loaded = prickle.load_runner_config(str(config))
    assert (loaded.agents["ren/helper"].client, loaded.agents["ren/helper"].command) == (
        "command", ["my-agent", "{prompt_file}"])
    code, out, err = run(db_path, "device", "pair", "ren/coder")
    assert out.endswith('client = "claude"      # or "command", with a command line\n')
    code, out, err = run(db_path, "device", "pair", "ren/nope", ok=False)
    assert (code, err) == (1, "prickle: no agent 'ren/nope' of ren's: a device pairs with its owner's own agent (add "
                              "it first: prickle agent add ren/nope --name NAME --model MODEL --client command "
                              "--project PROJECT)\n")


def test_turning_the_digest_on_says_what_it_still_needs_to_mail_anything(db_path, tmp_path):
    run(db_path, "init", "--owner", "ren")
    code, out, err = run(db_path, "person", "digest", "ren", "30")
    assert out == ("ren's email digest is on: what waited more than 30 minutes (no address yet: prickle person email "
                   "ren ADDRESS; no mail server is configured ([smtp] in prickle.toml): nothing is mailed until there "
                   "is one).\n")
    run(db_path, "person", "email", "ren", "ren@example.org")
    (tmp_path / "prickle.toml").write_text('[smtp]\nhost = "mail.example.org"\nfrom_address = "prickle@example.org"\n')
    code, out, err = run(db_path, "person", "digest", "ren", "30")
    assert out == "ren's email digest is on: what waited more than 30 minutes.\n"
    code, out, err = run(db_path, "person", "digest", "ren", "1")
    assert out == "ren's email digest is on: what waited more than 1 minute.\n"
    code, out, err = run(db_path, "person", "digest", "ren")
    assert out == "ren's email digest is off.\n"
    code, out, err = run(db_path, "person", "digest", "ren", "0", ok=False)  # off is MINUTES left out
    assert code == 2 and "0 is not in the range 1<=x<=" in err
