"""The OTLP route under attack: what another tenant, another subject, a forged stamp or a subject
under erasure can get into the trace store, or out of it through an erasure, counted straight in
Phoenix with its REST API."""

import uuid
from datetime import datetime, timedelta, timezone

from conftest import GLOBEX, TENANT, export_spans, phoenix_spans, someone
from test_otlp import (answered, by_trace, consent, endpoint, gate, post, protobuf,  # noqa: F401
                       stored)


def test_another_tenants_spans_in_the_same_trace_survive_an_erasure_and_take_nothing_of_acmes(gate, phoenix):
    """globex sends spans under a trace id of acme's (ids are the client's to choose): each
    tenant's erasure deletes its own subject's spans of that trace and nothing of the other's."""
    project, alice, carol = f"p-{uuid.uuid4().hex[:8]}", someone(), someone(GLOBEX)
    consent(gate, alice)
    consent(gate, carol, GLOBEX)
    ids, done = export_spans(endpoint(gate), [{"user.id": alice, "input.value": "alice's"}],
                             token=gate.token("agent"), project=project)
    shared = ids[0]
    theirs, _ = export_spans(endpoint(gate), [{"user.id": carol, "input.value": "carol's"}] * 2,
                             token=gate.token("agent", tenant=GLOBEX), project=project, trace_id=shared)
    assert theirs == [shared, shared]
    spans = stored(phoenix, project, [shared], count=3)
    assert sorted(s["attributes"]["lethe.tenant"] for s in spans) == [TENANT, GLOBEX, GLOBEX]

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


def test_spans_of_a_subject_under_erasure_reach_the_store_naming_her_nowhere(gate, phoenix):
    project, alice = f"p-{uuid.uuid4().hex[:8]}", someone()
    consent(gate, alice)
    agent = gate.token("agent")
    before, _ = export_spans(endpoint(gate), [{"user.id": alice, "input.value": "before"}], token=agent,
                             project=project)
    reference = by_trace(stored(phoenix, project, before))[before[0]]["lethe.subject_ref"]
    gate.flip(alice)
    late, done = export_spans(endpoint(gate), [{"user.id": alice, "enduser.id": alice, "input.value": "late"}],
                              token=agent, project=project)
    span = by_trace(stored(phoenix, project, late))[late[0]]
    assert span["lethe.content_withheld"] == "subject_suppressed"
    assert not {"user.id", "enduser.id", "lethe.subject_ref", "input.value"} & set(span), span
    for key in ("user.id", "lethe.subject_ref"):
        for value in (alice, reference):
            named = phoenix_spans(phoenix, project, attribute=f'{key}:"{value}"')
            assert all(s["context"]["trace_id"] in before for s in named), (key, named)
