"""The OTLP route under attack: what another tenant, another subject, a forged stamp or a subject
under erasure can get into the trace store, or out of it through an erasure, counted straight in
Phoenix with its REST API."""

import json
import uuid
from datetime import datetime, timedelta, timezone

from conftest import (GLOBEX, TENANT, export_spans, phoenix_project_id, phoenix_spans, send, someone, stored_project,
                      stored_trace, wait_for)
from test_otlp import (ROUTE, answered, by_trace, consent, endpoint, gate, post, protobuf,  # noqa: F401
                       stored)


def test_a_trace_id_or_a_project_of_another_tenants_is_never_shared_with_it(gate, phoenix):
    """Row 15: trace ids and the project passed unchanged, so a globex span that used a trace id
    first pulled acme's later span with that id, content included, into globex's project. Each
    tenant's trace ids and projects are its own in the store now; each tenant's erasure takes
    its own subject's spans and nothing of the other's."""
    project, alice, carol = f"p-{uuid.uuid4().hex[:8]}", someone(), someone(GLOBEX)
    consent(gate, alice)
    consent(gate, carol, GLOBEX)
    shared = uuid.uuid4().hex
    # globex first, under the trace id acme will use, naming acme's project (resource and header).
    theirs, _ = export_spans(endpoint(gate), [{"user.id": carol, "input.value": "carol's"}] * 2,
                             token=gate.token("agent", tenant=GLOBEX), project=project, trace_id=shared,
                             headers={"x-project-name": project})
    ids, _ = export_spans(endpoint(gate), [{"user.id": alice, "input.value": "alice's"}],
                          token=gate.token("agent"), project=project, trace_id=shared)
    assert theirs == [shared, shared] and ids == [shared]
    mine = stored(phoenix, project, [shared])
    assert [(s["attributes"]["lethe.tenant"], s["attributes"]["input.value"]) for s in mine] == [(TENANT, "alice's")]
    assert len(stored(phoenix, project, [shared], count=2, tenant=GLOBEX)) == 2
    # In Phoenix itself: each tenant's trace under an id of its own, in a project of its own;
    # nothing under the exporter's id, and no project of the name the clients gave.
    for tenant, count in ((TENANT, 1), (GLOBEX, 2)):
        held = phoenix_spans(phoenix, stored_project(project, tenant), tenant=None, trace_id=stored_trace(shared, tenant))
        assert [s["attributes"]["lethe.tenant"] for s in held] == [tenant] * count
    assert phoenix_project_id(phoenix, project) is None
    assert "alice's" not in json.dumps(phoenix_spans(phoenix, project, tenant=GLOBEX))

    # globex's dry run and erasure of carol count her two spans only.
    assert gate.dry_run(carol, GLOBEX)["otlp:otlp"] == 2
    _, results = gate.erase_to_completion(carol, GLOBEX)
    assert (results["otlp:otlp"]["before"], results["otlp:otlp"]["remaining"]) == (2, 0)
    left = phoenix_spans(phoenix, project, trace_id=shared)
    assert [s["attributes"]["input.value"] for s in left] == ["alice's"], "acme's span untouched"

    _, results = gate.erase_to_completion(alice)
    assert results["otlp:otlp"]["before"] == 1
    assert phoenix_spans(phoenix, project, trace_id=shared) == []


def test_a_forged_stamp_is_replaced_by_lethes_own(gate, phoenix):
    project, alice, bob = f"p-{uuid.uuid4().hex[:8]}", someone(), someone()
    consent(gate, alice)
    ids, _ = export_spans(endpoint(gate), [{"user.id": bob, "input.value": "bob's, to learn his reference"}],
                          token=gate.token("agent"), project=project)
    bobs_ref = by_trace(stored(phoenix, project, ids))[ids[0]]["lethe.subject_ref"]
    # Alice's span claiming bob's reference, a deadline in 2999, her content withheld reason "no".
    forged, _ = export_spans(endpoint(gate), [{
        "user.id": alice, "input.value": "alice's", "lethe.subject_ref": bobs_ref,
        "lethe.expires_at": "2999-01-01T00:00:00.000Z", "lethe.content_withheld": "no", "lethe.purpose": "billing",
    }], token=gate.token("agent"), project=project)
    span = by_trace(stored(phoenix, project, forged))[forged[0]]
    assert span["lethe.subject_ref"] == span["user.id"] != bobs_ref
    assert span["lethe.purpose"] == "observability" and "lethe.content_withheld" not in span
    deadline = datetime.fromisoformat(span["lethe.expires_at"].replace("Z", "+00:00"))
    assert deadline < datetime.now(timezone.utc) + timedelta(days=31), "the tenant's 30-day rule, not 2999"
    # Bob's erasure does not reach alice's span, whatever it claimed.
    _, results = gate.erase_to_completion(bob)
    assert results["otlp:otlp"]["before"] == 1
    assert len(phoenix_spans(phoenix, project, trace_id=forged)) == 1


def test_a_bound_token_cannot_name_another_subject_even_from_the_resource(gate, phoenix):
    project, alice, bob = f"p-{uuid.uuid4().hex[:8]}", someone(), someone()
    consent(gate, alice)
    consent(gate, bob)
    # The SDK puts resource attributes on every span of the batch: bob named there, alice bound.
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"openinference.project.name": project, "user.id": bob}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    with provider.get_tracer("t").start_as_current_span("chat", attributes={"input.value": "bob's words"}):
        pass
    status, _, raw = post(gate, encode_spans(memory.get_finished_spans()).SerializeToString(),
                          token=gate.token("agent", alice))
    assert (status, answered(raw).partial_success.rejected_spans) == (200, 1)
    # A later span of the same client lands, so the refused one would be there by now.
    body, ids = protobuf([{"input.value": "alice's own"}], project)
    post(gate, body, token=gate.token("agent", alice))
    stored(phoenix, project, ids)
    assert [s["attributes"]["input.value"] for s in phoenix_spans(phoenix, project)] == ["alice's own"]


def test_spans_of_a_subject_under_erasure_are_refused_and_name_her_nowhere(gate, phoenix):
    """Row 10: after the flip a span naming her (nested content too) was forwarded without her
    id but with its text, and outlived the completed erasure. Now it is refused, as a late write."""
    project, alice = f"p-{uuid.uuid4().hex[:8]}", someone()
    consent(gate, alice)
    agent = gate.token("agent")
    before, _ = export_spans(endpoint(gate), [{"user.id": alice, "input.value": "before"}], token=agent,
                             project=project)
    reference = by_trace(stored(phoenix, project, before))[before[0]]["lethe.subject_ref"]
    gate.flip(alice)
    body, late = nested_request(project, {"user.id": alice, "input": {"value": "late, nested"}})
    status, _, raw = post(gate, body, token=agent)
    assert (status, answered(raw).partial_success.rejected_spans) == (200, 1)
    assert "subject_suppressed" in answered(raw).partial_success.error_message
    # A later span of another subject lands, so the refused one would be there by now.
    others, _ = export_spans(endpoint(gate), [{"input.value": "someone else's"}], token=agent, project=project)
    stored(phoenix, project, others)
    assert phoenix_spans(phoenix, project, trace_id=late) == []
    gate.erase_to_completion(alice)
    for key in ("user.id", "lethe.subject_ref"):
        for value in (alice, reference):
            assert phoenix_spans(phoenix, project, attribute=f'{key}:"{value}"') == [], (key, value)
    assert "late, nested" not in json.dumps(phoenix_spans(phoenix, project))


def any_value(value):
    """An OTLP AnyValue of a Python value, nested maps and lists included (what the SDK's API
    does not let an app send, but the wire does)."""
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
    if isinstance(value, dict):
        return AnyValue(kvlist_value=KeyValueList(values=[KeyValue(key=k, value=any_value(v))
                                                          for k, v in value.items()]))
    if isinstance(value, list):
        return AnyValue(array_value=ArrayValue(values=[any_value(v) for v in value]))
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    return AnyValue(string_value=value)


def nested_request(project, attributes, status_message=""):
    """An export request of one span with `attributes` as given (nested values kept), in
    protobuf; and its trace id."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import KeyValue
    from opentelemetry.proto.resource.v1.resource_pb2 import Resource
    from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status
    trace_id, now = uuid.uuid4().bytes, int(datetime.now(timezone.utc).timestamp() * 1e9)
    span = Span(trace_id=trace_id, span_id=uuid.uuid4().bytes[:8], name="chat", start_time_unix_nano=now,
                end_time_unix_nano=now + 1000, status=Status(code=2, message=status_message),
                attributes=[KeyValue(key=k, value=any_value(v)) for k, v in attributes.items()])
    resource = Resource(attributes=[KeyValue(key="openinference.project.name", value=any_value(project))])
    request = ExportTraceServiceRequest(resource_spans=[ResourceSpans(resource=resource,
                                                                      scope_spans=[ScopeSpans(spans=[span])])])
    return request.SerializeToString(), [trace_id.hex()]


SECRETS = ("my card is 4111", "the answer", "hello there", "secret prompt", "a document", "failed on 4111")


def nested_content(subject):
    """Row 9's attempts: content as nested maps, arrays, a GenAI map, under names no deny-list
    had, and in the status message."""
    return {
        "user.id": subject, "llm.model_name": "gpt-4o", "llm.token_count.total": 12,
        "input": {"value": SECRETS[0]},
        "llm": {"output_messages": [{"message": {"content": SECRETS[1]}}]},
        "llm.input_messages": [SECRETS[2]],
        "gen_ai": {"prompt": SECRETS[3]},
        "retrieval.documents": [{"document": {"content": SECRETS[4]}}],
    }


def test_nested_content_of_a_subject_without_consent_never_reaches_the_store(gate, phoenix):
    """Row 9: nested values, arrays and GenAI maps kept their text for a subject with no consent;
    now only the structural scalars pass, counted in Phoenix's own record of the span."""
    project, erin = f"p-{uuid.uuid4().hex[:8]}", someone()
    body, ids = nested_request(project, nested_content(erin), status_message=SECRETS[5])
    status, _, raw = post(gate, body, token=gate.token("agent"))
    assert (status, answered(raw).partial_success.rejected_spans) == (200, 0)
    span = stored(phoenix, project, ids)[0]
    held = json.dumps(span)
    assert not [secret for secret in SECRETS if secret in held], held
    assert erin not in held, "her id is her reference"
    attributes = span["attributes"]
    assert attributes["lethe.content_withheld"] == "consent_required"
    assert attributes["llm.model_name"] == "gpt-4o" and attributes["llm.token_count.total"] == 12
    # With consent, the same span keeps its content (the subject agreed to it).
    alice = someone()
    consent(gate, alice)
    body, ids = nested_request(project, nested_content(alice))
    post(gate, body, token=gate.token("agent"))
    assert SECRETS[3] in json.dumps(stored(phoenix, project, ids)[0])


def test_a_client_attribute_cannot_shadow_the_stamp_or_the_subject_in_the_store(gate, phoenix):
    """Row 11: a nested `lethe` or `user` attribute shadowed Lethe's stamp in Phoenix's stored
    JSON (another tenant, a forged reference, 2999), and the purge's filter then missed the span."""
    project, alice, bob = f"p-{uuid.uuid4().hex[:8]}", someone(), someone()
    consent(gate, alice)
    body, ids = nested_request(project, {
        "user.id": alice, "input.value": "alice's",
        "lethe": {"tenant": GLOBEX, "subject_ref": "forged", "expires_at": "2999-01-01T00:00:00Z"},
        "user": {"id": bob}, "enduser": {"id": bob}, "user.id.shadow": bob,
    })
    status, _, raw = post(gate, body, token=gate.token("agent"))
    assert (status, answered(raw).partial_success.rejected_spans) == (200, 0)
    attributes = stored(phoenix, project, ids)[0]["attributes"]
    assert attributes["lethe.tenant"] == TENANT
    assert attributes["lethe.subject_ref"] == attributes["user.id"] != "forged"
    assert not attributes["lethe.expires_at"].startswith("2999")
    assert bob not in json.dumps(attributes)
    # The purge's filter finds the span by its stamp, and the erasure takes it.
    named = phoenix_spans(phoenix, project, attribute=f'lethe.subject_ref:"{attributes["lethe.subject_ref"]}"')
    assert [s["context"]["trace_id"] for s in named] == [stored_trace(i) for i in ids]
    _, results = gate.erase_to_completion(alice)
    assert (results["otlp:otlp"]["before"], results["otlp:otlp"]["remaining"]) == (1, 0)
    assert phoenix_spans(phoenix, project, trace_id=ids) == []


def test_the_probe_names_no_subject_to_phoenix_and_still_finds_a_span_written_around_lethe(gate, phoenix):
    """Row 14: the verification probe asked Phoenix for `user.id:"<key>"` in its URL, so Phoenix's
    log held the erased subject's key in clear. It now reads the spans and matches them itself."""
    project, alice, carol = f"p-{uuid.uuid4().hex[:8]}", someone(), someone()
    consent(gate, alice)
    ids, _ = export_spans(endpoint(gate), [{"user.id": alice, "input.value": "alice's"}], token=gate.token("agent"),
                          project=project)
    stored(phoenix, project, ids)
    _, results = gate.erase_to_completion(alice)
    assert (results[ROUTE]["before"], results[ROUTE]["remaining"], results[ROUTE]["probe_hits"]) == (1, 0, 0)

    # Carol's span went straight to Phoenix, around Lethe: the probe finds it, and the erasure
    # stops for a person to review it.
    around, _ = export_spans(f"{phoenix}/v1/traces", [{"user.id": carol, "input.value": "around"}], project=project)
    stored(phoenix, project, around, tenant=None)
    status, filed = gate.call("POST", "/v1/erasures", {"subject": carol, "ticket": "DSR-14", "reason": "art. 17"})
    assert status == 201, filed
    assert gate.call("POST", f"/v1/erasures/{filed['id']}/approve")[0] == 200
    request = lambda: gate.call("GET", f"/v1/erasures/{filed['id']}")[1]  # noqa: E731
    target = lambda: next(t for t in request()["targets"] if t["target"] == ROUTE)  # noqa: E731
    # The probe's finding stops the purge (retried, then for a person to review).
    found = wait_for("the probe to find carol's span",
                     lambda: "verification probe found 1 records" in (target()["last_error"] or ""), deadline=30)
    assert found and target()["state"] in ("retrying", "exception") and request()["state"] != "completed"
    assert len(phoenix_spans(phoenix, project, tenant=None, trace_id=around)) == 1, "a span Lethe did not stamp is not deleted"

    log = phoenix.log.read_text(errors="replace")
    assert "/v1/projects/" in log, "Phoenix logs the requests it serves"
    assert alice not in log and carol not in log


def raw_export(project, trace_id=None, span_id=None, attributes=(), events=()):
    """One span as an exporter could send it, ids and keys as given (bytes, then key-value
    pairs), with `events` as (name, pairs)."""
    import os
    import time
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    request = ExportTraceServiceRequest()
    resource = request.resource_spans.add()
    resource.resource.attributes.append(KeyValue(key="openinference.project.name", value=AnyValue(string_value=project)))
    span = resource.scope_spans.add().spans.add()
    span.trace_id = os.urandom(16) if trace_id is None else trace_id
    span.span_id = os.urandom(8) if span_id is None else span_id
    span.name = "chat"
    span.start_time_unix_nano = time.time_ns()
    span.end_time_unix_nano = span.start_time_unix_nano + 1000
    for key, value in attributes:
        span.attributes.append(KeyValue(key=key, value=AnyValue(string_value=value)))
    for name, pairs in events:
        event = span.events.add(name=name, time_unix_nano=span.start_time_unix_nano)
        for key, value in pairs:
            event.attributes.append(KeyValue(key=key, value=AnyValue(string_value=value)))
    return request.SerializeToString(), span.trace_id.hex()


def test_a_session_of_one_tenants_is_never_anothers(gate, phoenix):
    """Second attack, O1: Phoenix keys sessions by `session.id` over the whole store, in the
    project of the first trace that named it: globex's trace joined acme's session. Each
    tenant's sessions are its own now, and a client's `session` map cannot stand for it."""
    project, alice, carol = f"p-{uuid.uuid4().hex[:8]}", someone(), someone(GLOBEX)
    consent(gate, alice)
    consent(gate, carol, GLOBEX)
    session = f"chat-{uuid.uuid4().hex[:6]}"
    ours, _ = export_spans(endpoint(gate), [{"user.id": alice, "input.value": "alice's", "session.id": session}],
                           token=gate.token("agent"), project=project)
    theirs, _ = export_spans(endpoint(gate), [{"user.id": carol, "input.value": "carol's", "session.id": session}],
                             token=gate.token("agent", tenant=GLOBEX), project=project)
    assert stored(phoenix, project, ours)[0]["attributes"]["session.id"] == f"{TENANT}/{session}"
    assert stored(phoenix, project, theirs, tenant=GLOBEX)[0]["attributes"]["session.id"] == f"{GLOBEX}/{session}"
    status, _ = send(phoenix, "GET", f"/v1/sessions/{session}")
    assert status == 404, "no session of the name the clients gave"
    body, ids = nested_request(project, {"user.id": alice, "input.value": "x", "session": {"id": session}})
    status, _, raw = post(gate, body, token=gate.token("agent"))
    assert (status, answered(raw).partial_success.rejected_spans) == (200, 0)
    assert "session" not in json.dumps(stored(phoenix, project, ids)[0]["attributes"]), "the shadow is dropped"


def test_a_key_the_store_reads_otherwise_or_an_id_that_is_not_otlps_is_refused(gate, phoenix):
    """Second attack, O2 and O3: Phoenix strips each dotted segment of a key, so `" user.id"`
    named bob (raw) on a span of a token bound to alice, and `" lethe"` shadowed the stamp; an
    all-zero or 15-byte trace id was left unmapped, and acme's span joined globex's trace in
    globex's project. Both are refused now, and Phoenix holds nothing of them."""
    project, alice, bob = f"p-{uuid.uuid4().hex[:8]}", someone(), someone()
    consent(gate, alice)
    for key in (" user.id", "user.id\u00a0", "lethe .tenant", " lethe.subject_ref"):
        body, trace = raw_export(project, attributes=[("user.id", alice), ("input.value", "alice's"), (key, bob)])
        status, _, raw = post(gate, body, token=gate.token("agent", alice))
        assert (status, answered(raw).partial_success.rejected_spans) == (200, 1), key
        assert "invalid_request" in answered(raw).partial_success.error_message
    for trace_id in (bytes(16), uuid.uuid4().bytes[:15]):
        for token in (gate.token("agent", tenant=GLOBEX), gate.token("agent")):
            body, _ = raw_export(project, trace_id=trace_id, attributes=[("input.value", "secret")])
            status, _, raw = post(gate, body, token=token)
            assert (status, answered(raw).partial_success.rejected_spans) == (200, 1)
    # What was sent after them lands: nothing of theirs did.
    body, last = raw_export(project, attributes=[("user.id", alice)])
    assert post(gate, body, token=gate.token("agent", alice))[0] == 200
    held = stored(phoenix, project, [last])
    everything = phoenix_spans(phoenix, project) + phoenix_spans(phoenix, project, tenant=GLOBEX)
    assert len(everything) == len(held) == 1 and bob not in json.dumps(everything)


def test_a_subject_named_only_in_an_event_is_the_spans(gate, phoenix):
    """Second attack, O4: a span naming alice only in an event kept her raw key, was not
    refused after her flip, and outlived her erasure (the probe read span attributes only).
    The span is hers now: pseudonymised, stamped, erased with her, refused once she is
    suppressed."""
    project, alice = f"p-{uuid.uuid4().hex[:8]}", someone()
    consent(gate, alice)
    body, trace = raw_export(project, attributes=[("input.value", "about her")],
                             events=[("note", [("user.id", alice)])])
    status, _, raw = post(gate, body, token=gate.token("agent"))
    assert (status, answered(raw).partial_success.rejected_spans) == (200, 0)
    span = stored(phoenix, project, [trace])[0]
    assert span["attributes"]["lethe.subject_ref"] == span["events"][0]["attributes"]["user.id"] != alice
    assert alice not in json.dumps(span)
    _, results = gate.erase_to_completion(alice)
    assert (results[ROUTE]["before"], results[ROUTE]["remaining"], results[ROUTE]["probe_hits"]) == (1, 0, 0)
    assert phoenix_spans(phoenix, project, trace_id=trace) == []
    body, _ = raw_export(project, events=[("note", [("user.id", alice)])])
    status, _, raw = post(gate, body, token=gate.token("agent"))
    assert (status, answered(raw).partial_success.rejected_spans) == (200, 1), "she is erased"


def test_a_withheld_span_keeps_no_text_of_the_clients_in_its_name_or_under_a_names_beginning(gate, phoenix):
    """Second attack, O5 and O6: bob (no consent) had his span named with what he said and an
    event named the same, both kept; 51 attributes under structural names' beginnings
    (`llm.token_count.*`) kept 10 373 characters of text. A withheld span is named by its kind
    now, an event other than an exception as `event`; under a name's beginning only a word of
    64 characters at most is kept, and 32 structural attributes at most."""
    project, bob = f"p-{uuid.uuid4().hex[:8]}", someone()
    said = "bob asked: my test came back positive"
    attributes = [("user.id", bob), ("llm.token_count.note", said), ("llm.token_count.prompt", "12"),
                  ("llm.model_name", "gpt")] + [(f"llm.token_count.w{i}", f"word{i}") for i in range(50)]
    body, trace = raw_export(project, attributes=attributes, events=[(said, []), ("exception", [])])
    status, _, raw = post(gate, body, token=gate.token("agent"))
    assert (status, answered(raw).partial_success.rejected_spans) == (200, 0)
    span = stored(phoenix, project, [trace])[0]
    assert span["name"] == "span" and [e["name"] for e in span["events"]] == ["event", "exception"]
    assert "positive" not in json.dumps(span)
    kept = [k for k in span["attributes"] if k.startswith("llm.")]
    assert len(kept) == 32 and "llm.model_name" in kept and "llm.token_count.prompt" in kept, kept


def test_a_genai_conversation_of_one_tenant_is_never_anothers_session(gate, phoenix):
    """Third attack, O-1: Phoenix takes `gen_ai.conversation.id` for a span's session when it
    names none, and keys sessions over the whole store; Lethe named only `session.id` under its
    tenant, so an acme span and a globex span of one conversation id shared a Phoenix session.
    Both attributes are named under the tenant now."""
    project, alice, carol = f"p-{uuid.uuid4().hex[:8]}", someone(), someone(GLOBEX)
    consent(gate, alice)
    consent(gate, carol, GLOBEX)
    conversation = f"conv-{uuid.uuid4().hex[:6]}"
    spans = lambda who, text: [{"user.id": who, "input.value": text, "gen_ai.operation.name": "chat",  # noqa: E731
                                "gen_ai.conversation.id": conversation}]
    ours, _ = export_spans(endpoint(gate), spans(alice, "alice's"), token=gate.token("agent"), project=project)
    theirs, _ = export_spans(endpoint(gate), spans(carol, "carol's"), token=gate.token("agent", tenant=GLOBEX),
                             project=project)
    held = stored(phoenix, project, ours)
    stored(phoenix, project, theirs, tenant=GLOBEX)
    status, session = send(phoenix, "GET", f"/v1/sessions/{conversation}")
    assert status == 404, f"a session of the client's name: {session}"
    # The session Phoenix made of it is the tenant's.
    assert [(s["attributes"]["gen_ai.conversation.id"], s["attributes"]["session.id"]) for s in held] == [
        (stored_project(conversation, TENANT),) * 2], held
