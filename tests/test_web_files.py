"""Browser tests of attachments in your private room: picked, pasted and dropped images and files,
the strip of what will go (previews, removing one, upload progress), the server's refusals shown
beside the composer, and a posted message's thumbnails and file cards (opening an image, downloading
a file). One ``prickle serve --demo`` and one Chromium for the module (the fixtures of browser.py).
"""

from __future__ import annotations

import base64
import io
import re
from pathlib import Path

from PIL import Image

from browser import PROJECT, expect, goto, person_api, shot

AXE = Path(__file__).resolve().parent.parent / ".cache" / "axe" / "node_modules" / "axe-core" / "axe.min.js"

LAPTOP = {"width": 1366, "height": 860}
PHONE = {"width": 390, "height": 844}
ROOM = "oj-room"


def png(width: int, height: int, color=(200, 30, 30)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, "PNG")
    return out.getvalue()


def dispatch_files(page, selector: str, kind: str, files: list[dict]) -> None:
    """A paste or a drop of ``files`` ({name, type, b64}) on ``selector``, as the browser delivers them:
    a DataTransfer built in the page."""
    page.evaluate("""([selector, kind, files]) => {
        const dt = new DataTransfer();
        for (const f of files) {
            const bytes = Uint8Array.from(atob(f.b64), (c) => c.charCodeAt(0));
            dt.items.add(new File([bytes], f.name, { type: f.type }));
        }
        const target = document.querySelector(selector);
        if (kind === "paste") {
            target.dispatchEvent(new ClipboardEvent("paste", { clipboardData: dt, bubbles: true, cancelable: true }));
        } else {
            target.dispatchEvent(new DragEvent("dragover", { dataTransfer: dt, bubbles: true, cancelable: true }));
            target.dispatchEvent(new DragEvent("drop", { dataTransfer: dt, bubbles: true, cancelable: true }));
        }
    }""", [selector, kind, files])


def room_messages(served) -> list[dict]:
    with person_api(served, "oj") as oj:
        return oj.get(f"/api/projects/{ROOM}/room?latest=1&limit=50").json()["messages"]


def serious_axe_findings(page) -> list[dict]:
    """axe-core's serious and critical findings on the page as it is (none when axe is not installed)."""
    if not AXE.exists():
        return []
    page.add_script_tag(path=str(AXE))
    found = page.evaluate("async () => (await axe.run(document, {resultTypes: ['violations']})).violations"
                          ".map((v) => ({id: v.id, impact: v.impact, nodes: v.nodes.map((n) => n.target.join(' '))}))")
    return [v for v in found if v["impact"] in ("serious", "critical")]


def throttle(page, bytes_per_second: int) -> None:
    """Slow this page's uploads (Chromium's network emulation), so a large one's progress can be seen."""
    cdp = page.context.new_cdp_session(page)
    cdp.send("Network.enable")
    cdp.send("Network.emulateNetworkConditions", {"offline": False, "latency": 0, "downloadThroughput": -1,
                                                  "uploadThroughput": bytes_per_second})


def test_attach_by_picker_paste_and_drop_remove_one_and_send(served, people):
    page = people("oj", viewport=LAPTOP)
    goto(page, served, f"#/p/{ROOM}/room")
    composer = page.locator(".room-foot .composer")
    expect(composer.get_by_role("button", name="Attach images or files")).to_be_visible()
    assert composer.locator(".attach-input").get_attribute("accept").startswith("image/png,image/jpeg,image/webp")
    strip = composer.get_by_role("list", name="Attachments to send")
    expect(strip).to_be_hidden()
    hero, pasted = png(64, 40), png(30, 30, (20, 90, 200))
    notes = b"# Notes\n\nShip on Friday.\n"
    table = b"week,visits\n1,120\n2,180\n"

    # The picker: an image and a file; each goes up at once and the server's answer replaces the guess.
    composer.locator(".attach-input").set_input_files([
        {"name": "hero.png", "mimeType": "image/png", "buffer": hero},
        {"name": "notes.md", "mimeType": "text/markdown", "buffer": notes}])
    item = strip.locator('.attach-item[data-name="hero.png"]')
    expect(item.locator(".attach-size")).to_have_text(f"PNG image · 64×40 · {len(hero)} bytes")
    assert item.locator("img.attach-thumb").evaluate("img => img.complete && img.naturalWidth") == 64
    expect(strip.locator('.attach-item[data-name="notes.md"] .attach-size')).to_have_text(
        f"Markdown · {len(notes)} bytes")
    # Paste an image from the clipboard into the box; drop a file on the composer.
    dispatch_files(page, ".room-foot .composer textarea", "paste",
                   [{"name": "image.png", "type": "image/png", "b64": base64.b64encode(pasted).decode()}])
    expect(strip.locator('.attach-item[data-name="image.png"] .attach-size')).to_have_text(
        f"PNG image · 30×30 · {len(pasted)} bytes")
    dispatch_files(page, ".room-foot .composer", "drop",
                   [{"name": "numbers.csv", "type": "text/csv", "b64": base64.b64encode(table).decode()}])
    expect(strip.locator('.attach-item[data-name="numbers.csv"] .attach-size')).to_have_text(
        f"CSV · {len(table)} bytes")
    expect(strip.locator(".attach-item")).to_have_count(4)
    expect(strip.locator(".attach-item.uploading")).to_have_count(0)

    # A type the server refuses: its reason beside the composer, and it is not in the strip.
    composer.locator(".attach-input").set_input_files(
        [{"name": "anim.gif", "mimeType": "image/gif", "buffer": b"GIF89a\x01\x00\x01\x00\x00\x00\x00;"}])
    error = composer.locator(".error")
    expect(error).to_have_text("anim.gif was not attached: Name: '.gif' files are not accepted; send an image "
                               "(PNG, JPEG or WebP) or a file (PDF, or text named .txt, .md or .csv), at most 4 MiB.")
    expect(strip.locator(".attach-item")).to_have_count(4)
    # Too big: the server's limit, in its words.
    composer.locator(".attach-input").set_input_files(
        [{"name": "huge.txt", "mimeType": "text/plain", "buffer": b"x" * (4 * 1024 * 1024 + 1)}])
    expect(error).to_have_text("huge.txt was not attached: The request body is 4194305 bytes; the limit is 4194304.")
    shot(page, "files_strip_with_refusal", full_page=False)

    # Remove one before sending.
    strip.get_by_role("button", name="Remove notes.md").click()
    expect(strip.locator(".attach-item")).to_have_count(3)
    expect(strip.locator('.attach-item[data-name="notes.md"]')).to_have_count(0)

    box = composer.get_by_role("combobox", name="Message")
    box.fill("The hero, a pasted swatch and the numbers.")
    box.press("Enter")
    shown = page.locator(".msg", has_text="The hero, a pasted swatch and the numbers.")
    expect(shown.locator(".att-image")).to_have_count(2)
    expect(strip).to_be_hidden()
    expect(error).to_be_hidden()
    [message] = [m for m in room_messages(served) if m["body"] == "The hero, a pasted swatch and the numbers."]
    assert [(a["kind"], a["content_type"], a.get("name"), a.get("width")) for a in message["attachments"]] == [
        ("image", "image/png", None, 64), ("image", "image/png", None, 30), ("file", "text/csv", "numbers.csv", None)]
    thumbs = shown.locator(".att-image img")
    assert thumbs.evaluate_all("imgs => imgs.map((i) => i.naturalWidth)") == [64, 30]
    expect(thumbs.first).to_have_attribute("alt", "Image 1 of 2, 64×40")
    card = shown.locator(".att-file")
    expect(card.locator(".att-file-name")).to_have_text("numbers.csv")
    expect(card.locator(".att-file-kind")).to_have_text(f"CSV · {len(table)} bytes")
    csv_id = message["attachments"][2]["id"]
    expect(card.get_by_role("link", name="Download numbers.csv")).to_have_attribute("href", f"/api/attachments/{csv_id}")
    shot(page, "files_in_the_room", full_page=False)

    # An image opens full size over the page; Escape closes it and focus goes back to the thumbnail.
    shown.get_by_role("button", name="Open image 1 of 2 full size (64×40, 186 bytes)".replace(
        "186 bytes", f"{len(hero)} bytes")).click()
    viewer = page.get_by_role("dialog", name="Image 1 of 2")
    expect(viewer).to_be_visible()
    assert viewer.locator("img").evaluate("img => img.complete && img.naturalWidth") == 64
    expect(viewer.get_by_role("link", name="Open in a new tab")).to_have_attribute(
        "href", f"/api/attachments/{message['attachments'][0]['id']}")
    shot(page, "files_image_open", full_page=False)
    page.keyboard.press("Escape")
    expect(viewer).to_have_count(0)
    expect(shown.locator(".att-image").first).to_be_focused()

    # The download link: a real download under the file's name, with the headers that keep it inert.
    with page.expect_download() as download:
        card.get_by_role("link", name="Download numbers.csv").click()
    assert download.value.suggested_filename == "numbers.csv"
    assert Path(download.value.path()).read_bytes() == table
    response = page.request.get(f"{served.info['url']}/api/attachments/{csv_id}")
    assert response.status == 200 and response.body() == table
    assert (response.headers["content-disposition"], response.headers["x-content-type-options"],
            response.headers["content-security-policy"]) == (
        "attachment; filename*=UTF-8''numbers.csv", "nosniff", "default-src 'none'; sandbox")
    assert response.headers["content-type"].startswith("text/csv")
    image = page.request.get(f"{served.info['url']}/api/attachments/{message['attachments'][0]['id']}")
    assert (image.headers["content-type"], image.headers["content-disposition"], image.body()) == (
        "image/png", "inline", hero)

    # A team room's composer offers no attachments (the server takes them in private rooms only).
    goto(page, served, f"#/p/{PROJECT}/room")
    expect(page.locator(".room-foot .composer textarea")).to_be_visible()
    expect(page.locator(".attach-button")).to_have_count(0)


def test_a_large_upload_shows_its_progress_and_a_failed_one_sends_nothing(served, people):
    page = people("oj", viewport=LAPTOP)
    goto(page, served, f"#/p/{ROOM}/room")
    composer = page.locator(".room-foot .composer")
    strip = composer.get_by_role("list", name="Attachments to send")
    big = b"".join(b"line %06d of a long report\n" % n for n in range(112_000))  # about 3 MiB
    assert 3_000_000 < len(big) < 4 * 1024 * 1024
    throttle(page, 1024 * 1024)
    composer.locator(".attach-input").set_input_files([{"name": "report.txt", "mimeType": "text/plain", "buffer": big}])
    item = strip.locator('.attach-item[data-name="report.txt"]')
    progress = item.get_by_role("progressbar", name="Uploading report.txt")
    expect(progress).to_be_visible()
    expect(item).to_have_class("attach-item uploading")
    shot(page, "files_upload_progress", full_page=False)
    expect(progress).to_have_count(0, timeout=30_000)
    expect(item.locator(".attach-size")).to_have_text("Text · 3.1 MiB")
    strip.get_by_role("button", name="Remove report.txt").click()
    expect(strip).to_be_hidden()

    # Send while an upload is on its way and the server refuses it: the message is not posted.
    before = len(room_messages(served))
    broken = big[:-10] + b"\x00" + big[-9:]  # text with a NUL byte: refused once the server has read it
    composer.locator(".attach-input").set_input_files([{"name": "broken.txt", "mimeType": "text/plain", "buffer": broken}])
    box = composer.get_by_role("combobox", name="Message")
    box.fill("This should wait for the upload.")
    box.press("Enter")
    expect(composer.get_by_role("button", name="Uploading…")).to_be_visible()
    expect(composer.locator(".error")).to_have_text(
        "broken.txt was not attached: File: markup (SVG, HTML or XML) and binary data are not accepted; send an "
        "image (PNG, JPEG or WebP) or a file (PDF, or text named .txt, .md or .csv), at most 4 MiB.", timeout=30_000)
    expect(composer.get_by_role("button", name="Send")).to_be_enabled()
    expect(box).to_have_value("This should wait for the upload.")
    expect(strip).to_be_hidden()
    assert len(room_messages(served)) == before


def test_attachments_on_a_phone(served, people):
    with person_api(served, "oj") as oj:
        ids = [oj.post(f"/api/projects/{ROOM}/attachments", content=png(1200, 800, (40, 140, 90))).json()["attachment"]["id"],
               oj.post(f"/api/projects/{ROOM}/attachments?name=quarterly%20plan%20with%20a%20long%20name.pdf",
                       content=b"%PDF-1.4\n1 0 obj <<>> endobj\ntrailer <<>>\n%%EOF\n").json()["attachment"]["id"]]
        oj.post(f"/api/projects/{ROOM}/messages", json={"body": "From my phone: the plan and a photo.",
                                                          "attachments": ids})
    page = people("oj", viewport=PHONE)
    goto(page, served, f"#/p/{ROOM}/room")
    shown = page.locator(".msg", has_text="From my phone: the plan and a photo.")
    expect(shown.locator(".att-image img")).to_have_attribute("alt", "Image, 1200×800")
    expect(shown.locator(".att-file-name")).to_have_text("quarterly plan with a long name.pdf")
    expect(shown.locator(".att-file-kind")).to_have_text("PDF document · 48 bytes")
    composer = page.locator(".room-foot .composer")
    composer.locator(".attach-input").set_input_files([
        {"name": "photo.png", "mimeType": "image/png", "buffer": png(50, 80)},
        {"name": "a rather long file name for a phone.md", "mimeType": "text/markdown", "buffer": b"# Hi\n"}])
    expect(composer.locator(".attach-item:not(.uploading)")).to_have_count(2)
    assert shown.locator(".att-image img").evaluate("img => img.getBoundingClientRect().width") <= 192
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    shot(page, "files_phone", full_page=False)
    assert serious_axe_findings(page) == []  # the strip, the thumbnail and the file card
    shown.locator(".att-image").click()
    viewer = page.get_by_role("dialog", name="Image")
    expect(viewer).to_be_visible()
    assert viewer.locator("img").evaluate("img => img.getBoundingClientRect().width") <= PHONE["width"]
    shot(page, "files_phone_image_open", full_page=False)
    assert serious_axe_findings(page) == []  # the image viewer
    viewer.get_by_role("button", name="Close").click()
    expect(viewer).to_have_count(0)


def test_signed_in_with_a_personal_token_the_images_and_downloads_carry_it(served, people):
    from browser import cli_json

    with person_api(served, "oj") as oj:
        ids = [oj.post(f"/api/projects/{ROOM}/attachments", content=png(24, 12)).json()["attachment"]["id"],
               oj.post(f"/api/projects/{ROOM}/attachments?name=token.txt", content=b"by token\n").json()["attachment"]["id"]]
        oj.post(f"/api/projects/{ROOM}/messages", json={"body": "Seen with a token.", "attachments": ids})
    page = people(None, viewport=LAPTOP)
    page.get_by_label("Personal token", exact=True).fill(cli_json(served.db, "token", "create", "--person", "oj")["token"])
    page.get_by_role("button", name="Sign in with this token").click()
    expect(page.get_by_role("heading", name="Hello, Oj Okafor")).to_be_visible()
    goto(page, served, f"#/p/{ROOM}/room")
    shown = page.locator(".msg", has_text="Seen with a token.")
    img = shown.locator(".att-image img")
    expect(img).to_have_attribute("src", re.compile(r"^blob:"))  # fetched with the token: no cookie here
    page.wait_for_function("(img) => img.complete && img.naturalWidth === 24", arg=img.element_handle())
    with page.expect_download() as download:
        shown.get_by_role("link", name="Download token.txt").click()
    assert download.value.suggested_filename == "token.txt"
    assert Path(download.value.path()).read_bytes() == b"by token\n"
