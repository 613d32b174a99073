"""A local stand-in for LangSmith's tracing API, built from its published contract: what the OTLP
route sends it and what Lethe's LangSmith connector calls. Sources (read 2026-12): the docs'
"Trace with OpenTelemetry" (OTLP endpoint, headers, the attribute mapping table), "Data purging for
compliance" (trace deletes: by trace ids and project, at most 1 000 per request, queued and carried
out later, no confirmation: query again to verify), the trace query syntax page, the platform's
OpenAPI document (`/api/v1/sessions`, `/api/v1/runs/query`, `/api/v1/runs/delete`, `/api/v1/info`),
and the `langsmith` SDK 0.15.1 (run ids from span ids; `list_runs`' paging).

What it implements:
- `POST /otel/v1/traces` (and self-hosted `/api/v1/otel/v1/traces`): OTLP/HTTP protobuf, gzip or
  not, `x-api-key` required (401), project from `Langsmith-Project` (else `default`); answers 200
  and stores in the background as LangSmith does (runs readable a moment later). A span becomes a
  run: id = the span id right-aligned in 16 zero bytes as a UUID (the SDK's
  `langsmith_run_id_from_otel_span_id`), parent likewise; trace id = the id of the trace's root run
  (a run whose root has not arrived is not readable yet); `langsmith.metadata.<k>` and resource
  attributes -> `extra.metadata`; `input.value` / `output.value` -> inputs / outputs;
  `openinference.span.kind` or `langsmith.span.kind` -> run_type. Other span attributes are dropped
  (LangChain's own OTLP translator drops them unless told otherwise).
- `GET /api/v1/sessions` (`name`, `limit` <= 100, `offset`): the projects.
- `POST /api/v1/runs/query` (`session`, `trace`, `filter`, `limit` 1-100, else 400, `cursor`):
  `{"runs": [...], "cursors": {"next": ...}}`; filters `and`, `or`, `eq` on `id`, `trace_id`,
  `name`, `run_type`, `metadata_key` / `metadata_value` (one entry `k = v` when both are in one
  `and`), and `search("text")`; anything else is 400.
- `POST /api/v1/runs/delete` (`trace_ids` <= 1 000 with `session_id`): 202 `{"message": "Run
  deletes queued"}` even for unknown ids; the runs go DELETE_DELAY seconds later.
- `GET /api/v1/info`: a version, no batch ingest config. `GET /_stats`: deletes queued and done.

    python langsmith_standin.py PORT API_KEY [DELETE_DELAY_SECONDS]
"""

import gzip
import json
import re
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

LOCK = threading.Lock()
SESSIONS = {}          # name -> id
SPANS = {}             # (session id, otel trace hex) -> {run id: run}
STATS = {"deletes_queued": 0, "deletes_done": 0}
METADATA = "langsmith.metadata."


def run_id(span_id):
    return str(uuid.UUID(bytes=bytes(8) + span_id)) if span_id else None


def value_of(any_value):
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def ingest(request, project):
    with LOCK:
        session = SESSIONS.setdefault(project, str(uuid.uuid4()))
        for resource_spans in request.resource_spans:
            resource = {kv.key: value_of(kv.value) for kv in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    attributes = {kv.key: value_of(kv.value) for kv in span.attributes}
                    metadata = {**resource, **{k[len(METADATA):]: v for k, v in attributes.items()
                                               if k.startswith(METADATA)}}
                    kind = attributes.get("langsmith.span.kind") or attributes.get("openinference.span.kind") or "chain"
                    run = {
                        "id": run_id(span.span_id), "parent_run_id": run_id(span.parent_span_id),
                        "name": span.name, "run_type": str(kind).lower(), "session_id": session,
                        "status": "success", "app_path": "", "extra": {"metadata": metadata},
                        "inputs": {"input": attributes["input.value"]} if "input.value" in attributes else {},
                        "outputs": {"text": attributes["output.value"]} if "output.value" in attributes else {},
                    }
                    SPANS.setdefault((session, span.trace_id.hex()), {})[run["id"]] = run


def readable_runs():
    """Every run whose trace's root has arrived, with its trace id (the root run's id)."""
    runs = []
    for (_, _), by_id in SPANS.items():
        root = next((r for r in by_id.values() if r["parent_run_id"] is None), None)
        if root:
            runs += [{**r, "trace_id": root["id"], "dotted_order": r["id"]} for r in by_id.values()]
    return runs


class FilterError(ValueError):
    pass


def parse(text):
    """LangSmith's filter language (the subset above) into nested (name, args) tuples."""
    tokens = re.findall(r'"(?:[^"\\]|\\.)*"|\'[^\']*\'|[A-Za-z_][A-Za-z0-9_]*|[(),]|\S', text)
    position = 0

    def take():
        nonlocal position
        if position >= len(tokens):
            raise FilterError("unexpected end")
        position += 1
        return tokens[position - 1]

    def expression():
        token = take()
        if token.startswith('"'):
            return json.loads(token)
        if token.startswith("'"):
            return token[1:-1]
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", token):
            raise FilterError(f"unexpected {token!r}")
        if position < len(tokens) and tokens[position] == "(":
            take()
            args = []
            while tokens[position:position + 1] != [")"]:
                args.append(expression())
                if tokens[position:position + 1] == [","]:
                    take()
            take()
            return (token, args)
        return ("field", [token])

    tree = expression()
    if position != len(tokens):
        raise FilterError("trailing text")
    return tree


def is_eq(tree, field):
    return tree[0] == "eq" and len(tree[1]) == 2 and tree[1][0] == ("field", [field])


def matches(run, tree):
    name, args = tree
    metadata = run["extra"]["metadata"]
    if name == "and":
        keys = [a[1][1] for a in args if is_eq(a, "metadata_key")]
        values = [a[1][1] for a in args if is_eq(a, "metadata_value")]
        if keys and values:
            # One metadata entry: key and value together.
            others = [a for a in args if not (is_eq(a, "metadata_key") or is_eq(a, "metadata_value"))]
            pairs = all(k in metadata and str(metadata[k]) == str(v) for k, v in zip(keys, values))
            return pairs and all(matches(run, a) for a in others)
        return all(matches(run, a) for a in args)
    if name == "or":
        return any(matches(run, a) for a in args)
    if name == "search" and len(args) == 1 and isinstance(args[0], str):
        return args[0] in json.dumps(run)
    if is_eq(tree, "metadata_key"):
        return args[1] in metadata
    if is_eq(tree, "metadata_value"):
        return args[1] in [str(v) for v in metadata.values()]
    for field in ("id", "trace_id", "name", "run_type"):
        if is_eq(tree, field):
            return run[field] == args[1]
    raise FilterError(f"unsupported filter {name}")


def delete_later(session, trace_ids, delay):
    def apply():
        with LOCK:
            for key, by_id in list(SPANS.items()):
                root = next((r for r in by_id.values() if r["parent_run_id"] is None), None)
                if key[0] == session and root and root["id"] in trace_ids:
                    del SPANS[key]
            STATS["deletes_done"] += 1
    STATS["deletes_queued"] += 1
    threading.Timer(delay, apply).start()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    key, delay = "", 1.0

    def log_message(self, *args):
        pass

    def answer(self, status, body=None):
        raw = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def body(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        return gzip.decompress(raw) if self.headers.get("Content-Encoding") == "gzip" else raw

    def authorised(self):
        if self.headers.get("x-api-key") != self.key:
            self.answer(401, {"detail": "Invalid token"})
            return False
        return True

    def do_GET(self):
        url = urlsplit(self.path)
        path, query = url.path.removeprefix("/api/v1"), parse_qs(url.query)
        if path == "/info":
            return self.answer(200, {"version": "0.10.33", "instance_flags": {}})
        if path == "/_stats":
            return self.answer(200, STATS)
        if not self.authorised():
            return
        if path == "/sessions":
            limit, offset = int(query.get("limit", ["100"])[0]), int(query.get("offset", ["0"])[0])
            if not 1 <= limit <= 100:
                return self.answer(422, {"detail": "limit must be 1 to 100"})
            with LOCK:
                listed = [{"id": i, "name": n, "tenant_id": "t"} for n, i in sorted(SESSIONS.items())
                          if n == query.get("name", [n])[0]]
            return self.answer(200, listed[offset:offset + limit])
        self.answer(404, {"detail": "Not Found"})

    def do_POST(self):
        path = urlsplit(self.path).path
        if path in ("/otel/v1/traces", "/api/v1/otel/v1/traces"):
            if not self.authorised():
                return
            if self.headers.get("Content-Type") != "application/x-protobuf":
                return self.answer(415, {"error": "unsupported content type"})
            request = ExportTraceServiceRequest()
            request.ParseFromString(self.body())
            project = self.headers.get("Langsmith-Project") or "default"
            # Stored in the background, as LangSmith materialises runs after its answer.
            threading.Timer(0.05, ingest, (request, project)).start()
            return self.answer(200)
        path = path.removeprefix("/api/v1")
        if not self.authorised():
            return
        sent = json.loads(self.body() or b"{}")
        if path == "/runs/query":
            limit = sent.get("limit", 100)
            if not 1 <= limit <= 100:
                return self.answer(400, {"detail": "Limit exceeds maximum allowed value of 100"})
            try:
                tree = parse(sent["filter"]) if sent.get("filter") else None
                with LOCK:
                    runs = [r for r in readable_runs()
                            if (not sent.get("session") or r["session_id"] in sent["session"])
                            and (not sent.get("trace") or r["trace_id"] == sent["trace"])
                            and (tree is None or matches(r, tree))]
            except FilterError as e:
                return self.answer(400, {"detail": f"invalid filter: {e}"})
            runs.sort(key=lambda r: r["id"])
            start = int(sent.get("cursor") or 0)
            following = start + limit if start + limit < len(runs) else None
            return self.answer(200, {"runs": runs[start:start + limit],
                                     "cursors": {"next": None if following is None else str(following)}})
        if path == "/runs/delete":
            traces = sent.get("trace_ids") or []
            if len(traces) > 1000 or (traces and not sent.get("session_id")):
                return self.answer(422, {"detail": "at most 1000 trace_ids, with their session_id"})
            delete_later(sent.get("session_id"), set(traces), self.delay)
            return self.answer(202, {"message": "Run deletes queued"})
        self.answer(404, {"detail": "Not Found"})


if __name__ == "__main__":
    Handler.key = sys.argv[2]
    Handler.delay = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
