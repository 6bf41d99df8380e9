"""A scripted stand-in for the model API on 127.0.0.1, so real Claude Code makes real tool calls.

Claude Code asks ``POST /v1/messages`` with ``stream: true``; each request carries the
conversation so far. The conversation's first request whose tools include Prickle's is a
run; the stand-in answers it from a script: a list of steps, each a function of what the
run has seen (the prompt and every tool result so far) returning ``(tool, input)`` for a
tool call or a string for the final text. A step may block until the test lets it go.
Other requests (titles, summaries) get a one-word text answer.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Seen:
    """What one run has seen so far: its prompt and the text of each tool result."""

    def __init__(self, messages: list[dict]):
        self.prompt = ""
        self.results: list[str] = []
        for m in messages:
            blocks = m["content"] if isinstance(m["content"], list) else [{"type": "text", "text": m["content"]}]
            for b in blocks:
                if b.get("type") == "text" and m["role"] == "user" and not self.results:
                    self.prompt += b["text"]
                if b.get("type") == "tool_result":
                    content = b.get("content")
                    if isinstance(content, list):
                        content = "".join(c.get("text", "") for c in content)
                    self.results.append(str(content))
        self.turn = sum(1 for m in messages if m["role"] == "assistant")

    def find(self, pattern: str) -> str:
        return re.search(pattern, self.prompt).group(1)


class ModelStandIn:
    """The stand-in server; ``script`` steps answer a run's turns in order, ``log`` keeps every tool call."""

    def __init__(self, script: list):
        self.script, self.calls, self.requests = script, [], 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                if "count_tokens" in self.path:
                    return self._json({"input_tokens": 100})
                outer.requests += 1
                tools = {t["name"] for t in body.get("tools", [])}
                answer: object = "ok"
                if any(name.startswith("mcp__prickle__") for name in tools):
                    seen = Seen(body["messages"])
                    answer = outer.script[seen.turn](seen) if seen.turn < len(outer.script) else "Done."
                self._stream(answer, body.get("model", "stand-in"))

            def _json(self, data):
                raw = json.dumps(data).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def _stream(self, answer, model):
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()

                def event(kind, data):
                    self.wfile.write(f"event: {kind}\ndata: {json.dumps(data | {'type': kind})}\n\n".encode())

                outer.calls.append(answer)
                event("message_start", {"message": {
                    "id": f"msg_{outer.requests}", "type": "message", "role": "assistant", "model": model,
                    "content": [], "stop_reason": None, "stop_sequence": None,
                    "usage": {"input_tokens": 1, "output_tokens": 1}}})
                if isinstance(answer, str):
                    event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
                    event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": answer}})
                    stop = "end_turn"
                else:
                    name, tool_input = answer
                    event("content_block_start", {"index": 0, "content_block": {
                        "type": "tool_use", "id": f"toolu_{outer.requests:04d}", "name": name, "input": {}}})
                    event("content_block_delta", {"index": 0, "delta": {
                        "type": "input_json_delta", "partial_json": json.dumps(tool_input)}})
                    stop = "tool_use"
                event("content_block_stop", {"index": 0})
                event("message_delta", {"delta": {"stop_reason": stop, "stop_sequence": None},
                                        "usage": {"output_tokens": 1}})
                event("message_stop", {})

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
