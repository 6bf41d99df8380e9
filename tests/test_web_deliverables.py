"""The task page shows the files a run delivered: a Markdown file, an image, a CSV and a PDF previewed, each
with its sha256 checked in the browser and a download (Chromium, at a laptop's and a phone's width).

The run is a runner's (a paired device claims the task); the files go up with the run's credential
while its return_result waits for them, as ``prickle runner`` does it (tests/test_runner_deliverables.py).
"""

from __future__ import annotations

import hashlib
import io
import threading
import time
from pathlib import Path

import httpx
from browser import PROJECT, cli_json, expect, goto, mcp, shot

from helpers import pdf_bytes
from PIL import Image

AXE = Path(__file__).resolve().parent.parent / ".cache" / "axe" / "node_modules" / "axe-core" / "axe.min.js"
WIDE, PHONE = {"width": 1366, "height": 900}, {"width": 390, "height": 844}
POLICY = "# Refund policy\n\nRefunds within **30 days**, no questions asked.\n\n- Keep the receipt\n".encode()
TABLE = b'month,refunds,note\nJanuary,12,"calm, steady"\nFebruary,9,after the "fix"\n'


def chart() -> bytes:
    image = Image.new("RGB", (240, 120), (40, 110, 90))
    for x in range(20, 220, 40):
        for y in range(120 - x // 3, 120):
            for dx in range(24):
                image.putpixel((x + dx, y), (240, 200, 60))
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def delivered_task(served) -> tuple[str, dict[str, bytes]]:
    """A task ren/builder's runner ran, whose result names four files its runner uploaded."""
    base = served.info["url"]
    runner = cli_json(served.db, "device", "pair", "ren/builder", "--name", "ren-laptop")["token"]
    cli_json(served.db, "rule", "set", "ren", "--decision", "allow", "--from-owner", "oj")
    task = mcp(served, "oj/muse", "handoff", {"project": PROJECT, "to": "ren/builder", "packet": {
        "task": "Write the refund policy, with last quarter's numbers.", "deliverable_type": "doc",
        "acceptance_criteria": ["A policy a customer understands."]}})["task"]
    claim = mcp(served, "ren/builder", "claim_task", {"task_id": task["id"], "idempotency_key": "k1"}, key=runner)
    run = claim["execution_credential"]["token"]
    mcp(served, "ren/builder", "accept_task", {"task_id": task["id"]}, key=run)
    files = {"refund-policy.md": POLICY, "charts/refunds.png": chart(), "data/refunds.csv": TABLE,
             "legal/terms.pdf": pdf_bytes(2, (0.2, 0.4, 0.8))}
    done: dict = {}
    returning = threading.Thread(target=lambda: done.update(out=mcp(served, "ren/builder", "return_result", {
        "task_id": task["id"], "summary": "The refund policy, its chart and its numbers.",
        "evidence": [{"kind": "note", "summary": "The policy as delivered.", "artifact": 0, "criteria": [0]}],
        "artifacts": [{"ref": ref, "sha256": hashlib.sha256(data).hexdigest()} for ref, data in files.items()]},
        key=run)))
    returning.start()
    with httpx.Client(base_url=base, timeout=30) as http:
        for _ in range(200):  # what the runner reads in its device's state
            runs = http.get("/api/runner/state", headers={"Authorization": f"Bearer {runner}"}).json()["runs"]
            if runs and runs[0].get("files_wanted"):
                break
            time.sleep(0.05)
        for ref, data in files.items():
            r = http.post(f"/api/runner/tasks/{task['id']}/files", content=data, headers={
                "Authorization": f"Bearer {run}"}, params={"ref": ref, "sha256": hashlib.sha256(data).hexdigest()})
            assert r.status_code == 200, r.text
    returning.join(30)
    assert done["out"]["task"]["state"] == "verifying"
    return task["id"], files


def test_the_task_page_previews_delivered_files_and_offers_their_download(served, people, tmp_path):
    task_id, files = delivered_task(served)
    for name, viewport in (("deliverables-wide", WIDE), ("deliverables-phone", PHONE)):
        page = people("oj", viewport=viewport)
        goto(page, served, f"#/p/{PROJECT}/tasks/{task_id}")
        section = page.locator("section", has=page.get_by_role("heading", name="Delivered files"))
        expect(section).to_be_visible()
        cards = section.locator(".deliverable")
        expect(cards).to_have_count(4)
        expect(section.get_by_text("sha256 checked")).to_have_count(4)
        # Markdown rendered (never as raw HTML), the image shown, the CSV as a table.
        md = section.locator(".deliverable", has_text="refund-policy.md")
        expect(md.get_by_role("heading", name="Refund policy")).to_be_visible()
        expect(md.locator("strong")).to_have_text("30 days")
        image = section.get_by_role("img", name="Preview of refunds.png")
        expect(image).to_be_visible()
        assert image.evaluate("(img) => img.naturalWidth") == 240
        table = section.locator(".deliverable", has_text="data/refunds.csv").get_by_role("table")
        expect(table.get_by_role("columnheader")).to_have_text(["month", "refunds", "note"])
        expect(table.get_by_role("row").nth(1).get_by_role("cell")).to_have_text(["January", "12", "calm, steady"])
        expect(table.get_by_role("row").nth(2).get_by_role("cell")).to_have_text(["February", "9", 'after the "fix"'])
        # A PDF's pages, drawn by the server, one under the other.
        pdf = section.locator(".deliverable", has_text="legal/terms.pdf")
        for n in (1, 2):
            drawn = pdf.get_by_role("img", name=f"Page {n} of 2 of terms.pdf")
            expect(drawn).to_be_visible()
            assert drawn.evaluate("(img) => img.naturalWidth") == 1000
        expect(pdf.get_by_text("2 pages.")).to_be_visible()
        # The result's artifact leads to its file.
        page.get_by_role("button", name="Open data/refunds.csv below").click()
        expect(section.get_by_role("link", name="Download data/refunds.csv")).to_be_focused()
        assert page.evaluate("document.documentElement.scrollWidth <= document.documentElement.clientWidth")
        shot(page, name)
        # The download saves exactly the bytes whose sha256 was checked.
        with page.expect_download() as got:
            md.get_by_role("link", name="Download refund-policy.md").click()
        download = got.value
        assert download.suggested_filename == "refund-policy.md"
        saved = tmp_path / f"{name}.md"
        download.save_as(saved)
        assert saved.read_bytes() == files["refund-policy.md"]
        if AXE.exists():
            page.add_script_tag(path=str(AXE))
            found = page.evaluate("async () => (await axe.run(document, {resultTypes: ['violations']})).violations"
                                  ".filter((v) => ['serious', 'critical'].includes(v.impact)).map((v) => v.id)")
            assert found == []

