"""Files: the store and attachments (chapter 19).

A person uploads an image or a file to their private room, posts it with a message, and their
agent reads it over MCP (resources/read) with an audit entry that names no file and holds no
bytes. The type comes from the bytes; everything outside the reference's list is refused and
leaves nothing behind; the bytes are kept once; unposted uploads and unused bytes are pruned.
"""

from __future__ import annotations

import base64
import datetime as dt
import io
import json

import prickle
from conftest import audit_entries
from helpers import ROOM, T0, pdf_bytes, person

from PIL import Image


def png(width: int = 3, height: int = 2, color=(200, 30, 30)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, "PNG")
    return out.getvalue()


def upload(server, world, data: bytes, name: str | None = None, handle: str = "oj", project: str = ROOM):
    query = f"?name={name}" if name is not None else ""
    return server.post(f"/api/projects/{project}/attachments{query}", content=data,
                       headers={"Authorization": f"Bearer {world.tokens[handle]}"})


def rooms_key(world, agent="oj/muse"):
    return prickle.create_token(world.db, "client", agent_id=agent, project=prickle.ROOMS_SCOPE)[1]


def read(mcp, key: str, attachment_id: str) -> dict:
    """resources/read of one attachment, as a client sends it (the URI in Mcp-Name too)."""
    uri = f"prickle://attachments/{attachment_id}"
    return mcp.rpc(key, "resources/read", {"uri": uri}, uri)


def stored(world) -> tuple[int, int]:
    return (world.db.scalar("SELECT count(*) FROM attachments"), world.db.scalar("SELECT count(*) FROM blobs"))


def test_an_image_goes_up_with_a_message_and_the_agent_reads_it_with_an_audit_entry(mcp, server, world):
    image = png(3, 2)
    r = upload(server, world, image)
    assert r.status_code == 200, r.text
    attachment = r.json()["attachment"]
    assert attachment == {"id": attachment["id"], "kind": "image", "content_type": "image/png",
                          "byte_size": len(image), "width": 3, "height": 2}
    message = person(server, world, "oj").post(f"/api/projects/{ROOM}/messages", {
        "body": "What do you make of this?", "attachments": [attachment["id"]]}).json()["message"]
    assert message["attachments"] == [attachment]
    # The agent sees it in the room (the reference's Message schema) and reads its bytes as a resource.
    key = rooms_key(world)
    [seen] = mcp.ok("oj/muse", "read_room", {"project": ROOM}, token=key)["messages"]
    assert seen["attachments"] == [attachment]
    templates = mcp.rpc(key, "resources/templates/list")["result"]["resourceTemplates"]
    assert [t["uriTemplate"] for t in templates] == ["prickle://attachments/{id}"]
    listed = mcp.rpc(key, "resources/list")["result"]["resources"]
    uri = f"prickle://attachments/{attachment['id']}"
    assert listed == [{"uri": uri, "name": f"image 1 of message {message['id']}", "mimeType": "image/png",
                       "size": len(image)}]
    [contents] = mcp.rpc(key, "resources/read", {"uri": uri}, uri)["result"]["contents"]
    assert contents == {"uri": uri, "mimeType": "image/png", "blob": base64.b64encode(image).decode()}
    # The audit says what went up and who read it: no name, no bytes.
    [up] = audit_entries(world.db, ROOM, "attachment.uploaded")
    assert up["refs"] == {"message": message["id"], "attachment": attachment["id"], "content_type": "image/png",
                          "byte_size": len(image), "position": 0, "sha256": prickle.sha256_hex(image)}
    [read] = audit_entries(world.db, ROOM, "attachment.read")
    assert read["refs"] == {"message": message["id"], "attachment": attachment["id"], "agent": "oj/muse",
                            "content_type": "image/png", "byte_size": len(image)}
    # Its owner gets the bytes from the page: shown inline, never run.
    r = person(server, world, "oj").get(f"/api/attachments/{attachment['id']}")
    assert r.status_code == 200 and r.content == image
    assert (r.headers["content-type"], r.headers["x-content-type-options"], r.headers["content-disposition"],
            r.headers["content-security-policy"]) == ("image/png", "nosniff", "inline",
                                                      "default-src 'none'; sandbox")


def test_files_keep_their_name_for_people_and_are_text_or_bytes_for_agents(mcp, server, world):
    notes = "# Notes\n\nShip **Friday**.\n".encode()
    pdf = b"%PDF-1.4\n1 0 obj <<>> endobj\ntrailer <<>>\n%%EOF\n"
    md = upload(server, world, notes, "plan notes.md").json()["attachment"]
    doc = upload(server, world, pdf, "brief.pdf").json()["attachment"]
    table = upload(server, world, b"a,b\n1,2\n", "numbers.csv").json()["attachment"]
    assert [(a["kind"], a["content_type"], a["name"], a["byte_size"]) for a in (md, doc, table)] == [
        ("file", "text/markdown", "plan notes.md", len(notes)), ("file", "application/pdf", "brief.pdf", len(pdf)),
        ("file", "text/csv", "numbers.csv", 8)]
    message = person(server, world, "oj").post(f"/api/projects/{ROOM}/messages", {
        "body": "", "attachments": [md["id"], doc["id"], table["id"]]}).json()["message"]  # files alone may speak
    assert [a["id"] for a in message["attachments"]] == [md["id"], doc["id"], table["id"]]
    key = rooms_key(world)
    text = read(mcp, key, md["id"])["result"]["contents"]
    assert text == [{"uri": f"prickle://attachments/{md['id']}", "mimeType": "text/markdown",
                     "text": notes.decode()}]
    blob = read(mcp, key, doc["id"])["result"]["contents"]
    assert base64.b64decode(blob[0]["blob"]) == pdf
    r = person(server, world, "oj").get(f"/api/attachments/{md['id']}")
    assert r.headers["content-disposition"] == "attachment; filename*=UTF-8''plan%20notes.md"
    assert r.headers["content-type"].startswith("text/markdown")
    assert [e["refs"]["position"] for e in audit_entries(world.db, ROOM, "attachment.uploaded")] == [0, 1, 2]
    assert "plan notes" not in json.dumps([e["refs"] for e in audit_entries(world.db, ROOM)])


def test_what_the_reference_does_not_list_is_refused_by_its_bytes_and_leaves_nothing(mcp, server, world):
    svg = b'<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>'
    gif = b"GIF89a\x01\x00\x01\x00\x00\x00\x00;"
    cases = [
        (svg, "picture.svg", 400, "'.svg' files are not accepted; send an image (PNG, JPEG or WebP)"),
        (svg, "picture.txt", 400, "markup (SVG, HTML or XML)"),
        (gif, "anim.gif", 400, "'.gif' files are not accepted"),
        (b"\x00\x01binary", "data.txt", 400, "binary data are not accepted"),
        (b"not a pdf", "brief.pdf", 400, "the bytes are not a PDF"),
        (png()[:30], None, 400, "file: the image could not be read whole"),
        (b"", "empty.txt", 400, "file: it is empty"),
        (b"just words", None, 400, "name: a file needs its name"),
        (b"just words", "../etc/notes.txt", 400, "name: give the file's name alone"),
        (b"x" * (4 * 1024 * 1024 + 1), "big.txt", 413, "the limit is 4194304"),
    ]
    for data, name, status, text in cases:
        r = upload(server, world, data, name)
        assert (r.status_code, text in r.json()["error"]["message"]) == (status, True), (name, r.text)
    # A team project takes no uploads; someone else's room is not there.
    r = upload(server, world, png(), project="website-v2")
    assert r.status_code == 403 and "private room only" in r.json()["error"]["message"]
    assert upload(server, world, png(), handle="ren").status_code == 404
    assert stored(world) == (0, 0)
    # Posting: only your own unposted uploads of this room, at most four, each once.
    ids = [upload(server, world, png(color=(i, i, i))).json()["attachment"]["id"] for i in range(5)]
    oj, ren = person(server, world, "oj"), person(server, world, "ren")
    r = oj.post(f"/api/projects/{ROOM}/messages", {"body": "five", "attachments": ids})
    assert r.status_code == 400 and "1 to 4" in r.json()["error"]["message"]
    r = oj.post(f"/api/projects/{ROOM}/messages", {"body": "twice", "attachments": [ids[0], ids[0]]})
    assert r.status_code == 400 and "listed twice" in r.json()["error"]["message"]
    r = oj.post(f"/api/projects/{ROOM}/messages", {"body": "nope", "attachments": ["att_missing"]})
    assert r.status_code == 404 and "attachments[0]" in r.json()["error"]["message"]
    r = ren.post("/api/projects/website-v2/messages", {"body": "team", "attachments": [ids[0]]})
    assert r.status_code == 400 and "private room" in r.json()["error"]["message"]
    assert world.db.scalar("SELECT count(*) FROM messages WHERE project = ?", (ROOM,)) == 0
    assert oj.post(f"/api/projects/{ROOM}/messages", {"body": "one", "attachments": [ids[0]]}).status_code == 200
    r = oj.post(f"/api/projects/{ROOM}/messages", {"body": "again", "attachments": [ids[0]]})
    assert r.status_code == 400 and "went with another message" in r.json()["error"]["message"]
    # An agent that may not read the message gets what an unknown attachment gets.
    for agent, key in (("ren/builder", world.keys["ren/builder"]), ("oj/muse", world.keys["oj/muse"])):
        error = read(mcp, key, ids[0])["error"]
        assert (error["code"], error["data"]["code"]) == (-32002, "not_found"), agent
    error = mcp.rpc(rooms_key(world), "resources/read", {"uri": "https://example.com/x"}, "https://example.com/x")["error"]
    assert error["code"] == -32002 and "prickle://attachments/ID" in error["message"]
    assert audit_entries(world.db, ROOM, "attachment.read") == []


def test_bytes_are_kept_once_the_project_limit_holds_and_pruning_removes_what_nothing_uses(world, clock):
    oj = world.person("oj")
    image = png(4, 4)
    first = prickle.upload_attachment(world.db, oj, ROOM, image, None, limit_bytes=10_000)
    second = prickle.upload_attachment(world.db, oj, ROOM, image, None, limit_bytes=10_000)
    assert first["id"] != second["id"] and stored(world) == (2, 1)  # two uploads, one copy of the bytes
    assert prickle.project_files_bytes(world.db, ROOM) == len(image)
    try:
        prickle.upload_attachment(world.db, oj, ROOM, b"x" * 10_000, "big.txt", limit_bytes=10_000)
        raise AssertionError("over the limit")
    except prickle.InvalidState as e:
        assert "files_per_project_mb" in e.message and f"keeps {len(image)} bytes" in e.message
    assert stored(world) == (2, 1)
    posted = prickle.post_message(world.db, oj, ROOM, "kept", attachments=[first["id"]])
    assert posted["attachments"] == [first]
    # A day on, the upload never posted goes; the bytes stay while the posted one uses them.
    clock.now = T0 + dt.timedelta(hours=25)
    assert prickle.prune_files(world.db) == 0
    assert stored(world) == (1, 1)
    with world.db.transaction():  # as if its message were gone: nothing uses the bytes
        world.db.execute("DELETE FROM attachments")
    assert prickle.prune_files(world.db) == 1 and stored(world) == (0, 0)


def test_a_private_room_sessions_prompt_lists_the_attachments_and_how_to_read_them():
    message = {"author": {"kind": "person", "handle": "oj"}, "body": "Look", "attachments": [
        {"id": "att_1", "kind": "image", "content_type": "image/png", "byte_size": 120, "width": 40, "height": 30},
        {"id": "att_2", "kind": "file", "content_type": "application/pdf", "byte_size": 900, "name": "brief.pdf"}]}
    prompt = prickle.room_prompt({"role": "draft", "project": ROOM}, message)
    assert ("Attached to it (read each as the MCP resource at its address: resources/read on the server \"prickle\"; "
            "in Claude Code, ReadMcpResourceTool {server: \"prickle\", uri}, then Read the file an image or a PDF is "
            "saved to):\n"
            "  - 40x30 image (image/png, 120 bytes): prickle://attachments/att_1\n"
            "  - file brief.pdf (application/pdf, 900 bytes): prickle://attachments/att_2\n") in prompt
    assert "Attached" not in prickle.room_prompt({"role": "draft", "project": ROOM}, message | {"attachments": []})


def test_a_pdf_attachment_shows_its_first_page_as_a_picture_to_those_who_may_read_it(mcp, server, world):
    doc = upload(server, world, pdf_bytes(1, (0, 0, 1)), "brief.pdf").json()["attachment"]
    person(server, world, "oj").post(f"/api/projects/{ROOM}/messages", {"body": "the brief",
                                                                        "attachments": [doc["id"]]})
    r = person(server, world, "oj").get(f"/api/attachments/{doc['id']}/pages/1")
    assert (r.status_code, r.headers["content-type"], r.headers["x-page-count"]) == (200, "image/png", "1")
    assert Image.open(io.BytesIO(r.content)).convert("RGB").getpixel((500, 647)) == (0, 0, 255)
    r = person(server, world, "oj").get(f"/api/attachments/{doc['id']}/pages/2")
    assert (r.status_code, r.json()["error"]["message"]) == (
        404, "page: the preview shows page 1 to 1 of 1; download the PDF for the rest")
    assert person(server, world, "ren").get(f"/api/attachments/{doc['id']}/pages/1").status_code == 404
