"""A stand-in for GitHub's REST API on 127.0.0.1, for the project story's tests.

It serves what the story reads: ``GET /repos/OWNER/NAME`` (the repository), ``/releases`` and
``/pulls?state=closed`` in pages of ``per_page`` items (its own small page size, whatever is asked),
each page with a ``Link`` header naming the next and last, as GitHub's does. A repository it does
not hold answers 404 ``Not Found``. ``limited`` makes every answer a rate limit: ``"403"`` as GitHub's
primary limit (``x-ratelimit-remaining: 0`` and ``x-ratelimit-reset``), ``"429"`` with
``retry-after``. With ``token`` set, a request without that bearer token gets 401 ``Bad credentials``;
``delay`` slows each page of a list; ``garbled`` answers a list's pages with what GitHub never sends. ``requests`` keeps each request's path and ``Authorization`` header.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def release(n: int, day: str, draft: bool = False) -> dict:
    return {"id": 1000 + n, "tag_name": f"v{n}.0", "name": f"Version {n}.0", "draft": draft,
            "published_at": None if draft else f"{day}T12:00:00Z", "created_at": f"{day}T11:00:00Z",
            "html_url": f"https://github.com/octo/site/releases/tag/v{n}.0"}


def pull(n: int, day: str, merged: bool = True) -> dict:
    return {"number": n, "title": f"Pull {n}", "state": "closed", "user": {"login": "octocat"},
            "merged_at": f"{day}T15:30:00Z" if merged else None, "closed_at": f"{day}T15:30:00Z",
            "html_url": f"https://github.com/octo/site/pull/{n}"}


class GitHub:
    """The stand-in server: ``repos`` maps ``owner/name`` to ``{"releases": [...], "pulls": [...]}``."""

    def __init__(self, per_page: int = 2):
        self.repos: dict[str, dict] = {}
        self.per_page = per_page
        self.limited: str | None = None
        self.token: str | None = None
        self.garbled = False
        self.delay = 0.0  # seconds each page of a list takes  # when set, any other Authorization is refused (401)
        self.reset_at = 0
        self.requests: list[dict] = []
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                standin.answer(self)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/api"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def answer(self, h: BaseHTTPRequestHandler) -> None:
        parts = urllib.parse.urlsplit(h.path)
        self.requests.append({"path": parts.path, "query": parts.query, "authorization": h.headers.get("Authorization")})
        if self.limited == "403":
            return self.send(h, 403, {"message": "API rate limit exceeded"},
                             {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(self.reset_at)})
        if self.token is not None and h.headers.get("Authorization") != f"Bearer {self.token}":
            return self.send(h, 401, {"message": "Bad credentials"})
        if self.limited == "429":
            return self.send(h, 429, {"message": "secondary rate limit"}, {"retry-after": "90"})
        path = parts.path.removeprefix("/api/repos/").split("/")
        repo = self.repos.get("/".join(path[:2]).lower())
        if repo is None or len(path) not in (2, 3) or (len(path) == 3 and path[2] not in ("releases", "pulls")):
            return self.send(h, 404, {"message": "Not Found"})
        if len(path) == 2:
            return self.send(h, 200, {"full_name": repo["name"], "html_url": f"https://github.com/{repo['name']}",
                                      "private": False})
        if self.garbled:
            return self.send(h, 200, [{"number": 1, "merged_at": "2026-11-01T00:00:00Z", "user": "not an object"}])
        time.sleep(self.delay)
        items = repo[path[2]]
        page = int(urllib.parse.parse_qs(parts.query).get("page", ["1"])[0])
        last = max(1, -(-len(items) // self.per_page))
        links = []
        for rel, n in (("next", page + 1), ("last", last)):
            if n <= last and not (rel == "next" and page >= last):
                query = urllib.parse.parse_qs(parts.query) | {"page": [str(n)]}
                links.append(f'<http://{h.headers["Host"]}{parts.path}?{urllib.parse.urlencode(query, doseq=True)}>; '
                             f'rel="{rel}"')
        chunk = items[(page - 1) * self.per_page:page * self.per_page]
        self.send(h, 200, chunk, {"Link": ", ".join(links)} if links else {})

    @staticmethod
    def send(h: BaseHTTPRequestHandler, status: int, body, headers: dict | None = None) -> None:
        data = json.dumps(body).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(data)

    def add(self, name: str, releases: list[dict], pulls: list[dict]) -> None:
        self.repos[name.lower()] = {"name": name, "releases": releases, "pulls": pulls}

    def reset_in(self, now: dt.datetime, seconds: int) -> None:
        """A 403 rate limit that resets ``seconds`` after ``now``."""
        self.limited, self.reset_at = "403", int(now.timestamp()) + seconds

    def fetched(self, kind: str) -> list[str]:
        """The page numbers asked of each list of ``kind`` (releases or pulls), in order."""
        return [urllib.parse.parse_qs(r["query"]).get("page", ["1"])[0] for r in self.requests
                if r["path"].endswith("/" + kind)]
