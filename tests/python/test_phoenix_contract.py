"""What the OTLP route and its trace-store connector rely on in Arize Phoenix (issue 24), checked
against the real server with the OpenTelemetry SDK's own OTLP/HTTP exporter: it takes protobuf
only; spans are readable by their attributes (where Lethe's stamp will be) once its background
writer has stored them; a trace deleted by its id is gone, and deleting it again is 404."""

import json
import urllib.parse

from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from conftest import send, someone, wait_for


def export(phoenix, project, subject, gzip=False):
    """One agent run of `subject` exported to Phoenix's project `project`: answers its trace id
    (lowercase hex)."""
    exporter = OTLPSpanExporter(endpoint=f"{phoenix}/v1/traces",
                                compression=Compression.Gzip if gzip else Compression.NoCompression)
    provider = TracerProvider(resource=Resource.create({"openinference.project.name": project}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("lethe.contract")
    with tracer.start_as_current_span("chat") as span:
        span.set_attribute("user.id", subject)
        span.set_attribute("input.value", f"what {subject} asked")
        trace_id = format(span.get_span_context().trace_id, "032x")
    provider.shutdown()
    return trace_id


def spans(phoenix, project, **query):
    """The project's spans Phoenix answers for `query` (its REST filters), every page."""
    found, cursor = [], None
    while True:
        params = [(k, v) for k, values in query.items() for v in ([values] if isinstance(values, str) else values)]
        params += [("limit", "100")] + ([("cursor", cursor)] if cursor else [])
        status, page = send(phoenix, "GET", f"/v1/projects/{project}/spans?{urllib.parse.urlencode(params)}")
        assert status == 200, page
        found += page["data"]
        cursor = page.get("next_cursor")
        if not cursor:
            return found


def test_phoenix_takes_protobuf_otlp_and_answers_spans_by_attribute(phoenix):
    project, alice, bob = someone("project"), someone(), someone()
    alices = export(phoenix, project, alice)
    export(phoenix, project, bob, gzip=True)
    # Stored by a background writer after the exporter's 200: readable a moment later.
    found = wait_for("alice's span", lambda: spans(phoenix, project, attribute=f'user.id:"{alice}"'))
    assert [s["context"]["trace_id"] for s in found] == [alices]
    assert found[0]["attributes"]["input.value"] == f"what {alice} asked"
    wait_for("bob's gzipped span", lambda: spans(phoenix, project, attribute=f'user.id:"{bob}"'))
    # OTLP/JSON is not taken: the route sends the trace store protobuf whatever it was sent.
    body = json.dumps({"resourceSpans": []}).encode()
    status, _ = send(phoenix, "POST", "/v1/traces", raw_body=body, headers={"Content-Type": "application/json"})
    assert status == 415


def test_a_trace_deleted_by_its_id_is_gone_and_deleting_it_again_is_404(phoenix):
    project, alice, bob = someone("project"), someone(), someone()
    alices, bobs = export(phoenix, project, alice), export(phoenix, project, bob)
    wait_for("both traces", lambda: len(spans(phoenix, project, trace_id=[alices, bobs])) == 2)
    status, _ = send(phoenix, "DELETE", f"/v1/traces/{alices}")
    assert status == 204
    assert spans(phoenix, project, trace_id=alices) == []
    assert spans(phoenix, project, attribute=f'user.id:"{alice}"') == []
    assert len(spans(phoenix, project, trace_id=bobs)) == 1, "another trace is not touched"
    status, _ = send(phoenix, "DELETE", f"/v1/traces/{alices}")
    assert status == 404
