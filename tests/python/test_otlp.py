"""The OTLP traces route in front of a real Arize Phoenix, driven with the OpenTelemetry SDK's own
OTLP/HTTP exporter (and hand-written bodies for what no exporter sends): each span governed, as
Phoenix stores it (read back with its REST API); bad bodies refused before Phoenix sees a byte; a
Phoenix that is down answered with 503 and Retry-After, which the exporter retries; and a
subject's traces erased from Phoenix, another subject's kept, the certificate counting both."""

import gzip
import json
import re
import socket
import threading
import uuid
from http.client import HTTPConnection

import pytest
import requests

from conftest import (GLOBEX, TENANT, export_spans, free_port, own_lethe, phoenix_spans, send, someone,
                      stored_trace, traced_spans, wait_for)

ROUTE = "otlp:otlp"
LIMIT = 256 * 1024


def rules(lethe, tenant=TENANT, max_age="30d"):
    dpo = lethe.dpo if tenant == TENANT else lethe.token("compliance", tenant=tenant)
    status, _ = lethe.call("PUT", "/v1/retention-rules", {"rules": [
        {"purpose": "personalization", "category": "preference", "max_age": "30d"},
        {"purpose": "observability", "category": "trace", "max_age": max_age},
        {"purpose": "debugging", "category": "trace", "max_age": "30d"}]}, token=dpo)
    assert status == 200


def consent(lethe, subject, tenant=TENANT, purpose="observability"):
    dpo = lethe.dpo if tenant == TENANT else lethe.token("compliance", tenant=tenant)
    status, grant = lethe.call("POST", "/v1/consents", {
        "tenant": tenant, "subject": subject, "purpose": purpose, "category": "trace",
        "actions": ["store"], "source": "pytest", "policy_version": 1}, token=dpo)
    assert status == 201, grant
    return grant["id"]


@pytest.fixture(scope="module")
def gate(chroma, phoenix, tmp_path_factory):
    lethe = own_lethe(chroma, tmp_path_factory.mktemp("otlp"),
                      '[erasure]\nretry_backoff = "200ms"\nsettle = "100ms"\nsweep_interval = "500ms"\n',
                      otlp_url=phoenix, otlp_settings=f"max_body_bytes = {LIMIT}\n")
    for tenant in (TENANT, GLOBEX):
        rules(lethe, tenant)
    yield lethe
    lethe.stop()


def endpoint(lethe):
    return f"http://{lethe.data}/otlp/v1/traces"


def post(lethe, body, content_type="application/x-protobuf", token=None, **headers):
    """One hand-written export request: (status, headers by lowercase name, raw answer)."""
    host, port = lethe.data.split(":")
    connection = HTTPConnection(host, int(port), timeout=15)
    connection.request("POST", "/otlp/v1/traces", body=body, headers={
        "Authorization": f"Bearer {token or lethe.token('agent')}", "Content-Type": content_type, **headers})
    answer = connection.getresponse()
    raw = answer.read()
    connection.close()
    return answer.status, {k.lower(): v for k, v in answer.getheaders()}, raw


def protobuf(spans, project):
    """The export request the SDK's exporter would send for `spans` (attribute dicts)."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    finished, ids = traced_spans(spans, project)
    return encode_spans(finished).SerializeToString(), ids


def otlp_json(finished):
    """Finished spans in OTLP/JSON as JSON exporters write it (OTLP's JSON mapping: hex ids,
    enums as integers), not protobuf's JSON mapping (base64 ids)."""
    import base64
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    request = MessageToDict(encode_spans(finished), use_integers_for_enums=True)
    for resource in request["resourceSpans"]:
        for scope in resource["scopeSpans"]:
            for span in scope["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return request


def answered(raw):
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
    response = ExportTraceServiceResponse()
    response.ParseFromString(raw)
    return response


def stored(phoenix, project, trace_ids, count=None, tenant=TENANT):
    """The spans of `trace_ids` once Phoenix has stored `count` of them (all by default); as
    `phoenix_spans` finds them for `tenant`."""
    want = len(trace_ids) if count is None else count
    def found():
        spans = phoenix_spans(phoenix, project, tenant=tenant, trace_id=trace_ids)
        return spans if len(spans) == want else None
    return wait_for(f"{want} spans in Phoenix", found)


def by_trace(spans):
    return {s["context"]["trace_id"]: s["attributes"] for s in spans}


def test_a_consented_span_keeps_its_content_under_a_pseudonym_and_an_unconsented_one_loses_it(gate, phoenix):
    project, alice, bob = f"p-{uuid.uuid4().hex[:8]}", someone(), someone()
    consent(gate, alice)
    ids, done = export_spans(endpoint(gate), [
        {"user.id": alice, "input.value": "alice asked about her loan", "llm.model_name": "gpt"},
        {"user.id": bob, "input.value": "bob asked about his rash", "llm.output_messages.0.message.content": "x"},
        {"input.value": "nobody's question"},
    ], token=gate.token("agent"), project=project)
    assert done
    spans = by_trace(stored(phoenix, project, ids))
    alices, bobs, nobodys = (spans[i] for i in ids)

    assert alices["input.value"] == "alice asked about her loan"
    assert re.fullmatch(r"[0-9a-f]{64}", alices["user.id"]) and alices["user.id"] == alices["lethe.subject_ref"]
    assert (alices["lethe.tenant"], alices["lethe.purpose"]) == (TENANT, "observability")
    assert alices["lethe.expires_at"].startswith("20") and "lethe.content_withheld" not in alices

    assert "input.value" not in bobs and not any(k.startswith("llm.output_messages") for k in bobs), bobs
    assert bobs["lethe.content_withheld"] == "consent_required"
    assert bobs["user.id"] == bobs["lethe.subject_ref"] != bob
    assert "input.value" not in nobodys and nobodys["lethe.content_withheld"] == "unattributed"
    # Nothing in Phoenix names either by key.
    for key in (alice, bob):
        assert phoenix_spans(phoenix, project, attribute=f'user.id:"{key}"') == []

    # The same export as OTLP/JSON, gzipped: taken, and stored the same way (Phoenix takes protobuf only).
    finished, more = traced_spans([{"user.id": alice, "input.value": "sent as JSON"}], project)
    body = gzip.compress(json.dumps(otlp_json(finished)).encode())
    status, headers, raw = post(gate, body, "application/json", **{"Content-Encoding": "gzip"})
    assert (status, headers["content-type"]) == (200, "application/json"), raw
    assert json.loads(raw).get("partialSuccess") is None
    assert by_trace(stored(phoenix, project, more))[more[0]]["input.value"] == "sent as JSON"
    ids, done = export_spans(endpoint(gate), [{"user.id": alice, "input.value": "gzipped"}],
                             token=gate.token("agent"), project=project, gzip=True)
    assert done and by_trace(stored(phoenix, project, ids))[ids[0]]["input.value"] == "gzipped"


def test_spans_naming_another_subject_or_tenant_are_refused_and_counted_in_the_partial_success(gate, phoenix):
    project, alice, bob = f"p-{uuid.uuid4().hex[:8]}", someone(), someone()
    consent(gate, alice)
    # A token bound to alice: bob's span is refused, alice's and an unnamed one pass.
    body, ids = protobuf([{"user.id": alice, "input.value": "mine"}, {"user.id": bob, "input.value": "his"},
                          {"input.value": "unnamed"}], project)
    status, _, raw = post(gate, body, token=gate.token("agent", alice))
    partial = answered(raw).partial_success
    assert (status, partial.rejected_spans) == (200, 1) and "scope_violation" in partial.error_message
    spans = by_trace(stored(phoenix, project, [ids[0], ids[2]]))
    # The unnamed span of a bound token is the bound subject's, with its content.
    assert spans[ids[2]]["input.value"] == "unnamed" and spans[ids[2]]["lethe.subject_ref"] == spans[ids[0]]["lethe.subject_ref"]

    # Another tenant's token: a span claiming acme is refused; one naming "alice" is globex's own alice.
    body, theirs = protobuf([{"lethe.tenant": TENANT, "user.id": alice, "input.value": "forged"},
                             {"user.id": alice, "input.value": "namesake"}], project)
    status, _, raw = post(gate, body, token=gate.token("agent", tenant=GLOBEX))
    assert (status, answered(raw).partial_success.rejected_spans) == (200, 1)
    namesake = by_trace(stored(phoenix, project, [theirs[1]], tenant=GLOBEX))[theirs[1]]
    assert namesake["lethe.tenant"] == GLOBEX and namesake["lethe.subject_ref"] != spans[ids[0]]["lethe.subject_ref"]
    assert "input.value" not in namesake, "globex's alice gave no consent"
    # Spans that never reached Phoenix: the refused ones (the later export is stored, so they would be by now).
    assert phoenix_spans(phoenix, project, trace_id=ids[1]) == []
    assert phoenix_spans(phoenix, project, tenant=GLOBEX, trace_id=theirs[0]) == []

    # Every span refused: nothing is sent, and the answer says so.
    body, none = protobuf([{"user.id": bob}], project)
    status, _, raw = post(gate, body, token=gate.token("agent", alice))
    assert (status, answered(raw).partial_success.rejected_spans) == (200, 1)


def test_bad_bodies_are_refused_with_a_code_and_reach_nothing(gate, phoenix):
    project = f"p-{uuid.uuid4().hex[:8]}"
    body, _ = protobuf([{"input.value": "x"}], project)
    cases = {
        "malformed protobuf": (b"\x0a\xff\xff\xff", "application/x-protobuf", {}, 400, "invalid_request"),
        "malformed JSON": (b'{"resourceSpans": 3}', "application/json", {}, 400, "invalid_request"),
        "not OTLP": (body, "text/plain", {}, 415, "unsupported_media_type"),
        "unknown coding": (body, "application/x-protobuf", {"Content-Encoding": "br"}, 415, "unsupported_media_type"),
        "not gzip": (body, "application/x-protobuf", {"Content-Encoding": "gzip"}, 400, "invalid_request"),
        "over the limit": (b"\x00" * (LIMIT + 1), "application/x-protobuf", {}, 413, "body_too_large"),
        "inflates over the limit": (gzip.compress(b"\x00" * (50 * LIMIT)), "application/x-protobuf",
                                    {"Content-Encoding": "gzip"}, 413, "body_too_large"),
    }
    for name, (sent, content_type, headers, want, code) in cases.items():
        status, _, raw = post(gate, sent, content_type, **headers)
        assert (status, json.loads(raw)["error"]["code"]) == (want, code), name
    status, _, _ = post(gate, body, token="not-a-token")
    assert status == 401
    status, _, _ = post(gate, body, token=None, **{"Authorization": ""})
    assert status == 401
    # Nothing of it reached Phoenix: the project it names was never made.
    ids, done = export_spans(endpoint(gate), [{"input.value": "after"}], token=gate.token("agent"))
    assert done
    stored(phoenix, "default", ids)
    assert phoenix_spans(phoenix, project) == []


class Switch:
    """A TCP forwarder to Phoenix on a port of its own that can be started late: Phoenix, as
    Lethe's route sees it, is down until `up()`."""

    def __init__(self, target):
        self.port, self.target = free_port(), target
        self.server = None

    def up(self):
        self.server = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self.pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def pipe(a, b):
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            b.close()

    def down(self):
        if self.server:
            self.server.close()


def test_a_phoenix_that_is_down_is_503_with_retry_after_and_the_exporters_retry_lands(chroma, phoenix, tmp_path):
    host, port = phoenix.removeprefix("http://").split(":")
    switch = Switch((host, int(port)))
    lethe = own_lethe(chroma, tmp_path, "", otlp_url=f"http://127.0.0.1:{switch.port}")
    try:
        rules(lethe)
        alice, project = someone(), f"p-{uuid.uuid4().hex[:8]}"
        consent(lethe, alice)
        body, _ = protobuf([{"user.id": alice}], project)
        status, headers, raw = post(lethe, body)
        assert (status, headers.get("retry-after"), json.loads(raw)["error"]["code"]) == (503, "5", "upstream_unavailable")

        # The SDK's exporter, seeing 503 and Retry-After, waits and sends again: it lands once Phoenix is back.
        seen = []
        session = requests.Session()
        session.hooks["response"].append(lambda r, *a, **k: seen.append(r.status_code))
        result = {}
        exporting = threading.Thread(target=lambda: result.update(zip(("ids", "done"), export_spans(
            endpoint(lethe), [{"user.id": alice, "input.value": "retried"}], token=lethe.token("agent"),
            project=project, timeout=30, session=session))))
        exporting.start()
        wait_for("the exporter's first attempt", lambda: 503 in seen)
        switch.up()
        exporting.join(timeout=40)
        assert result["done"] and seen[-1] == 200, seen
        assert by_trace(stored(phoenix, project, result["ids"]))[result["ids"][0]]["input.value"] == "retried"
    finally:
        lethe.stop()
        switch.down()


def test_an_erasure_takes_every_trace_of_the_subject_from_phoenix_and_leaves_the_others(gate, phoenix):
    project, alice, bob = f"p-{uuid.uuid4().hex[:8]}", someone(), someone()
    for subject in (alice, bob):
        consent(gate, subject)
    agent = gate.token("agent")
    alices, done = export_spans(endpoint(gate), [{"user.id": alice, "input.value": f"alice {i}"} for i in range(3)]
                                + [{"user.id": alice}], token=agent, project=project)
    bobs, _ = export_spans(endpoint(gate), [{"user.id": bob, "input.value": f"bob {i}"} for i in range(2)],
                           token=agent, project=project)
    # Unconsented for this purpose: her span goes without content but still names her reference.
    withheld, _ = export_spans(endpoint(gate), [{"user.id": alice, "input.value": "debug"}], token=agent,
                               project=project, headers={"X-Lethe-Purpose": "debugging"})
    everything = alices + bobs + withheld
    stored(phoenix, project, everything)
    assert gate.dry_run(alice)[ROUTE] == 5

    done, results = gate.erase_to_completion(alice)
    result = results[ROUTE]
    assert (result["before"], result["deleted"], result["remaining"], result["probe_hits"]) == (5, 5, 0, 0), result
    assert phoenix_spans(phoenix, project, trace_id=alices + withheld) == []
    assert len(phoenix_spans(phoenix, project, trace_id=bobs)) == 2, "bob keeps all of his"
    status, document = gate.call("GET", f"/v1/erasures/{done['id']}/certificate")
    assert status == 200, document
    certified = next(s for s in document["certificate"]["stores"] if s["target"] == ROUTE)
    assert (certified["before"], certified["deleted"], certified["remaining"]) == (5, 5, 0), certified
    assert "phoenix.db" in json.dumps(certified), "the certificate names what Phoenix keeps on disk"


def test_the_sweeper_deletes_spans_past_their_deadline_and_no_others(gate, phoenix):
    project, carol, erin, dave = f"p-{uuid.uuid4().hex[:8]}", someone(GLOBEX), someone(GLOBEX), someone(GLOBEX)
    rules(gate, GLOBEX, max_age="3s")
    try:
        for subject in (carol, erin):
            consent(gate, subject, GLOBEX)
        consent(gate, dave, GLOBEX, purpose="debugging")
        token = gate.token("agent", tenant=GLOBEX)
        short, _ = export_spans(endpoint(gate), [{"user.id": carol, "input.value": "short-lived"}] * 2, token=token,
                                project=project)
        # A second subject in carol's trace, exported after her: swept at its own deadline too.
        shared, _ = export_spans(endpoint(gate), [{"user.id": erin, "input.value": "also short-lived"}], token=token,
                                 project=project, trace_id=short[0])
        assert shared == short[:1]
        long, _ = export_spans(endpoint(gate), [{"user.id": dave, "input.value": "kept a month"}], token=token,
                               project=project, headers={"X-Lethe-Purpose": "debugging"})
        stored(phoenix, project, short + long, count=4, tenant=GLOBEX)
        wait_for("the sweeper to delete carol's spans",
                 lambda: phoenix_spans(phoenix, project, tenant=GLOBEX, trace_id=short) == [], deadline=20)
        kept = by_trace(phoenix_spans(phoenix, project, tenant=GLOBEX, trace_id=long))
        assert kept[long[0]]["input.value"] == "kept a month"
    finally:
        rules(gate, GLOBEX)


def test_spans_phoenix_had_not_ingested_when_their_consent_was_withdrawn_are_swept_once_they_land(gate, phoenix):
    # Phoenix answers an export before it ingests it: a sweep that read it at once found nothing
    # of these and marked them deleted, and they landed after it and stayed.
    project, alice, bob = f"p-{uuid.uuid4().hex[:8]}", someone(), someone()
    grant = consent(gate, alice)
    agent = gate.token("agent")
    alices = []
    for batch in range(3):
        traces, done = export_spans(endpoint(gate), [{"user.id": alice, "input.value": f"hers {batch}.{i}"}
                                                     for i in range(20)], token=agent, project=project)
        assert done
        alices += traces
    status, body = gate.call("POST", f"/v1/consents/{grant}/revoke", token=gate.dpo)
    assert status == 200, body
    # Sent after hers, bob's lands after hers (Phoenix ingests in order).
    bobs, _ = export_spans(endpoint(gate), [{"user.id": bob}], token=agent, project=project)
    stored(phoenix, project, bobs)
    # 13 s alone; a Phoenix that holds every earlier test's projects searches slower (its cost
    # grows with them), and the full suite under load took over 20 s.
    wait_for("the sweeper to delete her spans, landed or not when it first looked",
             lambda: phoenix_spans(phoenix, project, trace_id=alices) == [], deadline=60)
    assert len(phoenix_spans(phoenix, project, trace_id=bobs)) == 1
    assert phoenix_spans(phoenix, "lethe.landed", tenant=None) == [], "the sweep's markers are deleted"


def test_two_users_agent_runs_instrumented_by_openinference_reach_phoenix_governed_and_one_is_erased(
        chroma, phoenix, provider, tmp_path):
    """The issue's end-to-end case: an app instruments the official OpenAI client (which talks to
    Lethe's provider route) with OpenInference and exports its spans with the SDK's exporter
    through Lethe's OTLP route into Phoenix."""
    from openinference.instrumentation import using_user
    from openinference.instrumentation.openai import OpenAIInstrumentor
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    lethe = own_lethe(chroma, tmp_path, '[erasure]\nretry_backoff = "200ms"\nsettle = "100ms"\n',
                      openai_url=provider, otlp_url=phoenix)
    try:
        rules(lethe)
        project, alice, bob = f"p-{uuid.uuid4().hex[:8]}", someone(), someone()
        for subject in (alice, bob):
            lethe.grant_provider(subject)
        consent(lethe, alice)   # alice lets her traces be kept; bob does not
        tracing = TracerProvider(resource=Resource.create({"openinference.project.name": project}))
        tracing.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(
            endpoint=endpoint(lethe), headers={"Authorization": f"Bearer {lethe.token('agent')}"})))
        instrumentor = OpenAIInstrumentor()
        instrumentor.instrument(tracer_provider=tracing)
        tracer = tracing.get_tracer("agent")
        runs = {}
        try:
            for subject in (alice, bob):
                with using_user(subject), tracer.start_as_current_span("agent-run", attributes={"user.id": subject}) as run:
                    lethe.openai(subject).chat.completions.create(
                        model="gpt-test", messages=[{"role": "user", "content": f"{subject} asks about her blood test"}])
                    runs[subject] = format(run.get_span_context().trace_id, "032x")
        finally:
            instrumentor.uninstrument()
            tracing.shutdown()

        spans = stored(phoenix, project, list(runs.values()), count=4)
        llm = {s["context"]["trace_id"]: s["attributes"] for s in spans if s["name"] != "agent-run"}
        alices, bobs = llm[runs[alice]], llm[runs[bob]]
        assert alices["llm.input_messages.0.message.content"] == f"{alice} asks about her blood test", alices
        assert alices["user.id"] == alices["lethe.subject_ref"] != alice
        assert not any(k.startswith(("llm.input_messages", "llm.output_messages"))
                       or k in ("input.value", "output.value") for k in bobs), bobs
        assert bobs["lethe.content_withheld"] == "consent_required"
        assert bobs["llm.model_name"] and bobs["user.id"] == bobs["lethe.subject_ref"] != bob, "operators keep the rest"
        assert phoenix_spans(phoenix, project, attribute=f'user.id:"{alice}"') == []

        done, results = lethe.erase_to_completion(alice)
        assert (results[ROUTE]["before"], results[ROUTE]["remaining"]) == (2, 0), results[ROUTE]
        assert phoenix_spans(phoenix, project, trace_id=runs[alice]) == []
        assert len(phoenix_spans(phoenix, project, trace_id=runs[bob])) == 2, "bob keeps all of his"
        status, document = lethe.call("GET", f"/v1/erasures/{done['id']}/certificate")
        stores = {s["target"]: s for s in document["certificate"]["stores"]}
        assert (stores[ROUTE]["deleted"], stores[ROUTE]["remaining"]) == (2, 0)
        assert stores["openai:openai"]["remaining"] == 0
        assert "phoenix.db" in json.dumps(stores[ROUTE])
    finally:
        lethe.stop()


ALLERGY = ("alice told the assistant that she is severely allergic to peanuts and carries an "
           "epipen in her bag wherever she travels for work")


def test_a_trace_that_read_or_quotes_a_subjects_memory_goes_with_her_erasure(chroma, phoenix, tmp_path, traced):
    """Trace content is served text for derivative lineage: bob's trace that read alice's memory
    through Lethe (same trace id), and bob's trace quoting it, derive from her; her erasure
    (other subjects' derivatives erased) takes them from Phoenix and leaves bob's others."""
    lethe = own_lethe(chroma, tmp_path, '[erasure]\nretry_backoff = "200ms"\nsettle = "100ms"\n'
                                        '[lineage]\ncross_subject = "erase"\n', otlp_url=phoenix)
    try:
        rules(lethe)
        project, alice, bob = f"p-{uuid.uuid4().hex[:8]}", someone(), someone()
        lethe.grant(alice)
        consent(lethe, bob)
        name, cid = lethe.new_collection()
        lethe.agent(alice).get_collection(name).add(ids=["a-1"], embeddings=[[0.1, 0.2, 0.3]], documents=[ALLERGY])
        # Bob's agent, instrumented (its httpx requests carry the W3C traceparent of the current
        # span), reads alice's memory in its run, then exports that run's spans.
        service = lethe.agent().get_collection(name)
        with traced.start_as_current_span("bob's run") as run:
            assert service.get(ids=["a-1"], include=["documents"])["documents"] == [ALLERGY]
        read_under = format(run.get_span_context().trace_id, "032x")
        agent = lethe.token("agent")
        read, _ = export_spans(endpoint(lethe), [{"user.id": bob, "input.value": "what should bob cook tonight"}],
                               token=agent, project=project, trace_id=read_under)
        quoting, _ = export_spans(endpoint(lethe), [{"user.id": bob, "output.value": "noted: " + " ".join(ALLERGY.split()[:20])}],
                                  token=agent, project=project)
        unrelated, _ = export_spans(endpoint(lethe), [{"user.id": bob, "input.value": "the weather in lyon"}],
                                    token=agent, project=project)
        stored(phoenix, project, read + quoting + unrelated)

        spans = by_trace(phoenix_spans(phoenix, project, trace_id=read + quoting + unrelated))

        def parents(trace):
            # Lineage keeps a trace's row per subject: `<trace as stored>:<subject reference>`.
            item = f"{stored_trace(trace)}:{spans[trace]['lethe.subject_ref']}"
            status, body = lethe.call("GET", f"/v1/lineage/otlp/traces/{item}")
            assert status == 200, body
            return {(p["store"], p["collection"], p["item"], p["how"]) for p in body["parents"]}
        assert parents(read[0]) == {("chroma", cid, "a-1", "trace")}
        assert parents(quoting[0]) == {("chroma", cid, "a-1", "quote")}
        assert parents(unrelated[0]) == set()

        done, results = lethe.erase_to_completion(alice)
        assert phoenix_spans(phoenix, project, trace_id=read + quoting) == [], "bob's derivatives went with her"
        assert len(phoenix_spans(phoenix, project, trace_id=unrelated)) == 1, "bob keeps the rest"
        status, certificate = lethe.call("GET", f"/v1/erasures/{done['id']}/certificate")
        counted = {d["store"]: d for d in certificate["certificate"]["derivatives"]}
        assert (counted["otlp"]["found"], counted["otlp"]["erased"]) == (2, 2), counted
        # Within the window, a span of the trace that read her memory keeps no content.
        again, _ = export_spans(endpoint(lethe), [{"user.id": bob, "input.value": "she had peanuts again"}],
                                token=agent, project=project, trace_id=read_under)
        span = by_trace(stored(phoenix, project, again))[again[0]]
        assert "input.value" not in span and span["lethe.content_withheld"] == "derived_from_erased", span
    finally:
        lethe.stop()


def langsmith_runs(langsmith, filter_):
    """The runs the LangSmith stand-in answers for a filter, in every project, every page."""
    from conftest import LANGSMITH_KEY
    headers = {"x-api-key": LANGSMITH_KEY}
    _, sessions = send(langsmith, "GET", "/api/v1/sessions?limit=100", headers=headers)
    runs = []
    for session in sessions:
        cursor = None
        while True:
            status, page = send(langsmith, "POST", "/api/v1/runs/query", {"session": [session["id"]], "filter": filter_,
                                                                         "limit": 100, "cursor": cursor}, headers=headers)
            assert status == 200, page
            runs += page["runs"]
            cursor = page["cursors"]["next"]
            if cursor is None:
                break
    return runs


def of_trace(langsmith, trace):
    """The runs of an exporter's trace of acme's (the trace Lethe stamped them with)."""
    stored = stored_trace(trace)
    return langsmith_runs(langsmith, f'and(eq(metadata_key, "lethe_trace"), eq(metadata_value, "{stored}"))')


def test_langsmith_runs_carry_the_stamp_in_their_metadata_and_an_erasure_deletes_her_traces(chroma, langsmith, tmp_path):
    """A route whose trace store is LangSmith (its stand-in): the stamp goes where LangSmith keeps
    attributes (run metadata); the erasure finds her runs there, deletes her traces, and waits for
    LangSmith's queued delete before it counts them gone."""
    from conftest import LANGSMITH_KEY
    lethe = own_lethe(chroma, tmp_path, '[erasure]\nretry_backoff = "200ms"\nsettle = "100ms"\n',
                      otlp_url=f"{langsmith}/otel",
                      otlp_settings=f'trace_store = "langsmith"\ncredential = {{ header = "x-api-key", value = '
                                    f'{{ value = "{LANGSMITH_KEY}" }} }}\n')
    try:
        rules(lethe)
        alice, bob = someone(), someone()
        for subject in (alice, bob):
            consent(lethe, subject)
        agent = lethe.token("agent")
        project = {"Langsmith-Project": f"p-{uuid.uuid4().hex[:8]}"}
        alices, done = export_spans(endpoint(lethe), [{"user.id": alice, "input.value": f"alice {i}"} for i in range(3)],
                                    token=agent, headers=project)
        assert done
        bobs, _ = export_spans(endpoint(lethe), [{"user.id": bob, "input.value": "bob's"}], token=agent, headers=project)
        # A stamp forged in LangSmith's metadata is Lethe's own by the time it lands; one claiming
        # another tenant there is refused, as in lethe.tenant.
        forged, _ = export_spans(endpoint(lethe), [{"user.id": bob, "langsmith.metadata.lethe_subject_ref": "x",
                                                    "langsmith.metadata.lethe_expires_at": "2999-01-01T00:00:00Z"}],
                                 token=agent, headers=project)
        body, claimed = protobuf([{"user.id": bob, "langsmith.metadata.lethe_tenant": GLOBEX}], "p")
        status, _, raw = post(lethe, body, **project)
        assert (status, answered(raw).partial_success.rejected_spans) == (200, 1)
        runs = {t: wait_for(f"the run of {t}", lambda t=t: of_trace(langsmith, t)) for t in alices + bobs + forged}
        mine = runs[alices[0]][0]
        assert mine["inputs"] == {"input": "alice 0"}
        metadata = mine["extra"]["metadata"]
        assert metadata["lethe_tenant"] == TENANT and re.fullmatch(r"[0-9a-f]{64}", metadata["lethe_subject_ref"])
        assert metadata["lethe_purpose"] == "observability" and metadata["lethe_expires_at"].startswith("20")
        forged_metadata = runs[forged[0]][0]["extra"]["metadata"]
        assert forged_metadata["lethe_subject_ref"] not in ("x", metadata["lethe_subject_ref"])
        assert not forged_metadata["lethe_expires_at"].startswith("2999")
        assert of_trace(langsmith, claimed[0]) == []
        assert lethe.dry_run(alice)[ROUTE] == 3

        done, results = lethe.erase_to_completion(alice, deadline=60)
        result = results[ROUTE]
        assert (result["before"], result["deleted"], result["remaining"]) == (3, 3, 0), result
        assert all(of_trace(langsmith, t) == [] for t in alices), "gone from LangSmith"
        assert all(len(of_trace(langsmith, t)) == 1 for t in bobs + forged), "bob keeps his"
        status, certificate = lethe.call("GET", f"/v1/erasures/{done['id']}/certificate")
        certified = next(s for s in certificate["certificate"]["stores"] if s["target"] == ROUTE)
        assert "LangSmith" in json.dumps(certified["physical"]), certified
    finally:
        lethe.stop()
