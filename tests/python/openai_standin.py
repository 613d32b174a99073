"""A local stand-in for an OpenAI-compatible provider, built from OpenAI's published API contract
(chat completions with and without server-sent events, embeddings, responses with `store`,
conversations and their items, files, models). It keeps what a provider keeps (stored responses,
stored chat completions, conversations, items, files) so their deletion can be observed.

Models with special names misbehave on purpose: `slow-stream` streams 40 chunks 50 ms apart,
`broken-sse` sends an event that is not JSON, `error-500` fails, `slow` answers after 1 s, `hang`
after 5 s. `GET /_stats` tells how many requests came, how many streams were cut by their client
and how many chat completions and responses are stored.

Answers echo the last user message, as a model's answer may repeat what it was given; `rewrite`
answers with every word of it spelt backwards (an answer made from the prompt that shares no run
of words with it). A chat completion asking for `response_format: json_object` is answered the
way Mem0's memory extraction expects: `{"memory": [{"id", "text"}]}`, one memory per user line of
the prompt's `## New Messages` section.

    python openai_standin.py PORT [CERT KEY]      (with CERT and KEY it speaks HTTPS)
"""

import hashlib
import json
import re
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()
RESPONSES, CHATS, CONVERSATIONS, FILES = {}, {}, {}, {}
STATS = {"cancelled_streams": 0, "requests": 0}


def new_id(prefix):
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def reply_text(text, model="gpt-test"):
    if model == "rewrite":
        return " ".join(word[::-1] for word in text.split())
    return f"echo: {text}"


def extracted_memories(text):
    """Mem0's extraction answer: the user lines of the `## New Messages` section."""
    section = text.split("## New Messages", 1)[-1].split("\n## ", 1)[0]
    lines = [line.strip()[len("user:"):].strip() for line in section.splitlines() if line.strip().startswith("user:")]
    return json.dumps({"memory": [{"id": str(i), "text": line} for i, line in enumerate(lines)]})


def last_user_text(messages):
    for message in reversed(messages or []):
        content = message.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return " ".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def input_text(value):
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return last_user_text([v for v in value if isinstance(v, dict)])
    return ""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    # -- plumbing ---------------------------------------------------------------------------
    def body(self):
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def json_body(self):
        raw = self.body()
        return json.loads(raw) if raw else {}

    def send_json(self, status, value):
        data = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def not_found(self, what):
        self.send_json(404, {"error": {"message": f"No {what} found", "type": "invalid_request_error", "code": None}})

    def start_events(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def event(self, data, name=None):
        text = (f"event: {name}\n" if name else "") + f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"
        chunk = text.encode()
        self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        self.wfile.flush()

    def end_events(self):
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def misbehave(self, model):
        if model == "error-500":
            self.send_json(500, {"error": {"message": "internal error", "type": "server_error"}})
            return True
        if model == "slow":
            time.sleep(1)
        if model == "hang":
            time.sleep(5)
        return False

    # -- routes -----------------------------------------------------------------------------
    def do_GET(self):
        self.route("GET")

    def do_POST(self):
        self.route("POST")

    def do_DELETE(self):
        self.route("DELETE")

    def route(self, method):
        with LOCK:
            STATS["requests"] += 1
        path = self.path.split("?")[0].rstrip("/")
        parts = path.strip("/").split("/")
        try:
            if path == "/_stats":
                with LOCK:
                    stats = {**STATS, "chats": len(CHATS), "responses": len(RESPONSES)}
                return self.send_json(200, stats)
            if path == "/v1/models" and method == "GET":
                return self.send_json(200, {"object": "list", "data": [{"id": "gpt-test", "object": "model", "created": 0, "owned_by": "standin"}]})
            if path == "/v1/chat/completions" and method == "POST":
                return self.chat(self.json_body())
            if parts[:3] == ["v1", "chat", "completions"] and len(parts) == 4:
                return self.stored(CHATS, parts[3], method, "chat.completion")
            if path == "/v1/embeddings" and method == "POST":
                return self.embeddings(self.json_body())
            if path == "/v1/responses" and method == "POST":
                return self.create_response(self.json_body())
            if parts[:2] == ["v1", "responses"] and len(parts) == 3:
                return self.stored(RESPONSES, parts[2], method, "response")
            if path == "/v1/conversations" and method == "POST":
                return self.create_conversation(self.json_body())
            if parts[:2] == ["v1", "conversations"] and len(parts) >= 3:
                return self.conversation(method, parts[2], parts[3:])
            if path == "/v1/files" and method == "POST":
                return self.upload()
            if path == "/v1/files" and method == "GET":
                return self.send_json(200, {"object": "list", "data": list(FILES.values()), "has_more": False})
            if parts[:2] == ["v1", "files"] and len(parts) == 3:
                return self.stored(FILES, parts[2], method, "file")
            self.not_found("route")
        except (BrokenPipeError, ConnectionResetError):
            with LOCK:
                STATS["cancelled_streams"] += 1

    def stored(self, table, object_id, method, kind):
        with LOCK:
            found = table.get(object_id)
            if method == "DELETE" and found:
                del table[object_id]
        if not found:
            return self.not_found(kind)
        if method == "DELETE":
            return self.send_json(200, {"id": object_id, "object": f"{kind}.deleted", "deleted": True})
        self.send_json(200, found)

    def chat(self, request):
        model = request.get("model", "gpt-test")
        if self.misbehave(model):
            return
        if (request.get("response_format") or {}).get("type") == "json_object":
            text = extracted_memories(last_user_text(request.get("messages")))
        else:
            text = reply_text(last_user_text(request.get("messages")), model)
        completion_id = new_id("chatcmpl-")
        created = int(time.time())
        if request.get("stream"):
            self.start_events()
            if model == "broken-sse":
                self.event("this is not json")
                return self.end_events()
            pieces = ["piece "] * 40 if model == "slow-stream" else [w + " " for w in text.split()]
            for piece in pieces:
                self.event({"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model,
                            "choices": [{"index": 0, "delta": {"role": "assistant", "content": piece}, "finish_reason": None}]})
                if model == "slow-stream":
                    time.sleep(0.05)
            self.event({"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model,
                        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
            self.event("[DONE]")
            return self.end_events()
        completion = {
            "id": completion_id, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
        if request.get("store"):
            with LOCK:
                CHATS[completion_id] = completion
        self.send_json(200, completion)

    def embeddings(self, request):
        inputs = request.get("input")
        inputs = inputs if isinstance(inputs, list) else [inputs]
        data = []
        for i, text in enumerate(inputs):
            digest = hashlib.sha256(json.dumps(text).encode()).digest()
            data.append({"object": "embedding", "index": i, "embedding": [b / 255 for b in digest[:8]]})
        self.send_json(200, {"object": "list", "data": data, "model": request.get("model", "emb-test"),
                             "usage": {"prompt_tokens": 1, "total_tokens": 1}})

    def create_response(self, request):
        model = request.get("model", "gpt-test")
        if self.misbehave(model):
            return
        previous = request.get("previous_response_id")
        if previous and previous not in RESPONSES:
            return self.not_found("previous response")
        store = request.get("store", True)
        text = reply_text(input_text(request.get("input")), model)
        response = {
            "id": new_id("resp_"), "object": "response", "created_at": int(time.time()), "status": "completed",
            "model": model, "store": store, "previous_response_id": previous,
            "output": [{"type": "message", "id": new_id("msg_"), "status": "completed", "role": "assistant",
                        "content": [{"type": "output_text", "text": text, "annotations": []}]}],
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "error": None, "incomplete_details": None,
            "instructions": None, "metadata": {}, "temperature": 1.0, "top_p": 1.0,
            "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2,
                      "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}},
        }
        conversation = request.get("conversation")
        conversation = conversation.get("id") if isinstance(conversation, dict) else conversation
        if conversation:
            if conversation not in CONVERSATIONS:
                return self.not_found("conversation")
            with LOCK:
                CONVERSATIONS[conversation]["items"].extend(response["output"])
        if store:
            with LOCK:
                RESPONSES[response["id"]] = response
        if request.get("stream"):
            self.start_events()
            created = {**response, "status": "in_progress", "output": []}
            self.event({"type": "response.created", "sequence_number": 0, "response": created}, "response.created")
            for n, word in enumerate(text.split()):
                self.event({"type": "response.output_text.delta", "sequence_number": n + 1, "item_id": response["output"][0]["id"],
                            "output_index": 0, "content_index": 0, "delta": word + " ", "logprobs": []}, "response.output_text.delta")
            self.event({"type": "response.completed", "sequence_number": 99, "response": response}, "response.completed")
            return self.end_events()
        self.send_json(200, response)

    def create_conversation(self, request):
        conversation = {"id": new_id("conv_"), "object": "conversation", "created_at": int(time.time()),
                        "metadata": request.get("metadata") or {}}
        items = [{**item, "id": new_id("msg_")} for item in request.get("items") or []]
        with LOCK:
            CONVERSATIONS[conversation["id"]] = {"conversation": conversation, "items": items}
        self.send_json(200, conversation)

    def conversation(self, method, conversation_id, rest):
        with LOCK:
            found = CONVERSATIONS.get(conversation_id)
        if not found:
            return self.not_found("conversation")
        if not rest:
            if method == "DELETE":
                with LOCK:
                    del CONVERSATIONS[conversation_id]
                return self.send_json(200, {"id": conversation_id, "object": "conversation.deleted", "deleted": True})
            if method == "POST":
                found["conversation"]["metadata"] = self.json_body().get("metadata") or {}
            return self.send_json(200, found["conversation"])
        if rest == ["items"]:
            if method == "POST":
                created = [{**item, "id": new_id("msg_")} for item in self.json_body().get("items") or []]
                with LOCK:
                    found["items"].extend(created)
                return self.send_json(200, {"object": "list", "data": created, "first_id": created[0]["id"] if created else None,
                                            "last_id": created[-1]["id"] if created else None, "has_more": False})
            return self.send_json(200, {"object": "list", "data": found["items"], "has_more": False})
        if len(rest) == 2 and rest[0] == "items":
            item = next((i for i in found["items"] if i["id"] == rest[1]), None)
            if not item:
                return self.not_found("item")
            if method == "DELETE":
                with LOCK:
                    found["items"].remove(item)
                return self.send_json(200, found["conversation"])
            return self.send_json(200, item)
        self.not_found("route")

    def upload(self):
        raw = self.body()
        purpose = re.search(rb'name="purpose"\r\n\r\n([^\r]*)\r\n', raw)
        filename = re.search(rb'filename="([^"]*)"', raw)
        record = {"id": new_id("file-"), "object": "file", "bytes": len(raw), "created_at": int(time.time()),
                  "filename": filename.group(1).decode() if filename else "upload",
                  "purpose": purpose.group(1).decode() if purpose else "user_data", "status": "processed"}
        with LOCK:
            FILES[record["id"]] = record
        self.send_json(200, record)


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    server.daemon_threads = True
    if len(sys.argv) > 3:
        import ssl
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(sys.argv[2], sys.argv[3])
        server.socket = context.wrap_socket(server.socket, server_side=True)
    server.serve_forever()
