"""The LangSmith stand-in (`langsmith_standin.py`) against the parts of LangSmith's published
contract that the OTLP route and its LangSmith connector rely on, driven with the OpenTelemetry
SDK's exporter and plain HTTP: authentication, run ids made from span ids, which attributes become
run metadata, query limits and paging, and deletes that are queued, not done, when answered."""

import uuid

from conftest import LANGSMITH_KEY, export_spans, send, wait_for

KEY = {"x-api-key": LANGSMITH_KEY}


def runs(langsmith, **query):
    status, page = send(langsmith, "POST", "/api/v1/runs/query", {"limit": 100, **query}, headers=KEY)
    assert status == 200, page
    return page


def session_of(langsmith, name):
    status, listed = send(langsmith, "GET", f"/api/v1/sessions?name={name}&limit=1", headers=KEY)
    assert status == 200 and len(listed) == 1, listed
    return listed[0]["id"]


def test_spans_become_runs_with_the_metadata_langsmith_keeps(langsmith):
    project = f"p-{uuid.uuid4().hex[:8]}"
    endpoint = f"{langsmith}/otel/v1/traces"
    assert not export_spans(endpoint, [{"input.value": "x"}])[1], "no x-api-key: refused"
    ids, done = export_spans(endpoint, [{"input.value": "hello", "user.id": "alice", "langsmith.metadata.team": "a"}],
                             headers={**KEY, "Langsmith-Project": project})
    assert done
    session = wait_for("the project", lambda: session_of(langsmith, project))
    run = wait_for("the run", lambda: runs(langsmith, session=[session])["runs"])[0]
    # LangSmith's run id is the span id right-aligned in 16 zero bytes; a root run is its trace.
    assert run["id"].startswith("00000000-0000-0000-") and run["trace_id"] == run["id"]
    assert run["inputs"] == {"input": "hello"}
    assert run["extra"]["metadata"]["team"] == "a" and "user.id" not in run["extra"]["metadata"]
    found = runs(langsmith, session=[session], filter='and(eq(metadata_key, "team"), eq(metadata_value, "a"))')
    assert [r["id"] for r in found["runs"]] == [run["id"]]
    assert runs(langsmith, session=[session], filter='search("hello")')["runs"] != []
    assert runs(langsmith, session=[session], filter='search("nowhere")')["runs"] == []


def test_queries_page_by_at_most_100_and_deletes_are_queued(langsmith):
    project = f"p-{uuid.uuid4().hex[:8]}"
    ids, _ = export_spans(f"{langsmith}/otel/v1/traces", [{"n": i} for i in range(150)],
                          headers={**KEY, "Langsmith-Project": project})
    session = wait_for("the project", lambda: session_of(langsmith, project))
    wait_for("150 runs", lambda: len(runs(langsmith, session=[session])["runs"]) == 100)
    status, _ = send(langsmith, "POST", "/api/v1/runs/query", {"session": [session], "limit": 101}, headers=KEY)
    assert status == 400
    status, _ = send(langsmith, "POST", "/api/v1/runs/query", {"session": [session], "filter": "eq(("}, headers=KEY)
    assert status == 400
    first = runs(langsmith, session=[session])
    rest = runs(langsmith, session=[session], cursor=first["cursors"]["next"])
    every = [r["trace_id"] for r in first["runs"] + rest["runs"]]
    assert len(set(every)) == 150 and rest["cursors"]["next"] is None

    status, _ = send(langsmith, "POST", "/api/v1/runs/delete", {"trace_ids": every * 7, "session_id": session},
                     headers=KEY)
    assert status == 422, "at most 1 000 traces per request"
    status, answer = send(langsmith, "POST", "/api/v1/runs/delete", {"trace_ids": every[:100], "session_id": session},
                          headers=KEY)
    assert (status, answer) == (202, {"message": "Run deletes queued"})
    # Queued, not done: still there when answered, gone once the delete has run.
    assert len(runs(langsmith, session=[session])["runs"]) == 100
    wait_for("the queued delete", lambda: runs(langsmith, session=[session])["cursors"]["next"] is None
             and len(runs(langsmith, session=[session])["runs"]) == 50)
    status, _ = send(langsmith, "POST", "/api/v1/runs/delete", {"trace_ids": [str(uuid.uuid4())], "session_id": session},
                     headers=KEY)
    assert status == 202, "unknown ids are queued all the same"
