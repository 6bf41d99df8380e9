"""A scripted stand-in for the model API on 127.0.0.1, so real agent CLIs make real tool calls.

It speaks both APIs the runner's CLIs use, each streamed:
- Claude Code asks ``POST /v1/messages`` (Anthropic Messages, ``stream: true``);
- Codex asks ``POST /v1/responses`` (OpenAI Responses) when a ``[model_providers.NAME]`` with
  ``wire_api = "responses"`` points its ``base_url`` here.
Each request carries the conversation so far. A request whose tools include Prickle's
(``mcp__prickle__<tool>`` for Claude Code, the ``mcp__prickle`` namespace for Codex) is a
run; the stand-in answers it from a script: a list of steps, each a function of what the
run has seen (the prompt and every tool result so far) returning ``(tool, input)`` for a
tool call or a string for the final text. Tools are named as Claude Code names them
(``mcp__prickle__accept_task``, ``Bash``), so one script drives either CLI. A step may
block until the test lets it go. Other requests (titles, summaries) get a one-word text answer.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

#: Codex groups an MCP server's tools in a namespace named so.
CODEX_NAMESPACE = "mcp__prickle"


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

    @classmethod
    def of_responses(cls, items: list[dict]) -> "Seen":
        """The same, from a Responses API ``input``: user messages, then calls and their outputs."""
        seen = cls([])
        for item in items:
            kind = item.get("type")
            if kind == "message" and item.get("role") == "user" and not seen.results:
                seen.prompt += "".join(c.get("text", "") for c in item.get("content", []))
            elif kind == "function_call_output":
                output = item.get("output")
                if isinstance(output, list):
                    output = "".join(c.get("text", "") for c in output)
                seen.results.append(str(output))
            elif kind == "function_call" or (kind == "message" and item.get("role") == "assistant"):
                seen.turn += 1
        return seen

    def find(self, pattern: str) -> str:
        return re.search(pattern, self.prompt).group(1)


def _is_run(tools: list[dict]) -> bool:
    """Whether a request offers Prickle's tools (either CLI's way of naming them)."""
    return any(t.get("name", "").startswith("mcp__prickle__") or t.get("name") == CODEX_NAMESPACE for t in tools)


class ModelStandIn:
    """The stand-in server; ``script`` steps answer a run's turns in order, ``calls`` keeps every answer.

    ``paths`` keeps the path of every model request (``/v1/messages?beta=true``, ``/v1/responses``), ``bodies``
    every run's request as sent (to look at what a tool result really carried, an image block say).
    """

    def __init__(self, script: list):
        self.script, self.calls, self.requests, self.paths, self.bodies = script, [], 0, [], []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                if "count_tokens" in self.path:
                    return self._json({"input_tokens": 100})
                outer.requests += 1
                outer.paths.append(self.path)
                responses = self.path.split("?")[0].endswith("/responses")
                answer: object = "ok"
                if _is_run(body.get("tools", [])):
                    outer.bodies.append(body)
                    seen = Seen.of_responses(body["input"]) if responses else Seen(body["messages"])
                    answer = outer.script[seen.turn](seen) if seen.turn < len(outer.script) else "Done."
                outer.calls.append(answer)
                if responses:
                    self._stream_responses(answer)
                else:
                    self._stream(answer, body.get("model", "stand-in"))

            def _json(self, data):
                raw = json.dumps(data).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def _events(self):
                """Start a ``text/event-stream`` (it ends when the connection closes); return a function that
                sends one event."""
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()

                def event(kind, data):
                    self.wfile.write(f"event: {kind}\ndata: {json.dumps(data | {'type': kind})}\n\n".encode())
                return event

            def _stream(self, answer, model):
                """An Anthropic Messages stream: one text or tool_use block."""
                event = self._events()
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

            def _stream_responses(self, answer):
                """An OpenAI Responses stream: one output item (an assistant message or a function call)."""
                n = outer.requests
                if isinstance(answer, str):
                    item = {"type": "message", "id": f"msg_{n}", "role": "assistant", "status": "completed",
                            "content": [{"type": "output_text", "text": answer, "annotations": []}]}
                else:
                    name, tool_input = answer
                    namespace, _, tool = name.rpartition("__") if name.startswith("mcp__") else ("", "", name)
                    item = {"type": "function_call", "id": f"fc_{n}", "call_id": f"call_{n:04d}", "name": tool,
                            "arguments": json.dumps(tool_input), "status": "completed"}
                    if namespace:
                        item["namespace"] = namespace
                event = self._events()
                event("response.created", {"response": {"id": f"resp_{n}"}})
                event("response.output_item.added", {"output_index": 0, "item": item})
                event("response.output_item.done", {"output_index": 0, "item": item})
                event("response.completed", {"response": {"id": f"resp_{n}", "usage": {
                    "input_tokens": 1, "output_tokens": 1, "total_tokens": 2}}})

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
