"""What the OTLP route and its trace-store connector rely on in Arize Phoenix (issue 24), checked
against the real server with the OpenTelemetry SDK's own OTLP/HTTP exporter: it takes protobuf
only; spans are readable by their attributes (where Lethe's stamp will be) once its background
writer has stored them; a trace deleted by its id is gone, and deleting it again is 404."""

import json

from conftest import export_spans, phoenix_spans, send, someone, wait_for


def export(phoenix, project, subject, gzip=False):
    """One agent run of `subject` exported to Phoenix's project `project`: answers its trace id."""
    ids, done = export_spans(f"{phoenix}/v1/traces", [{"user.id": subject, "input.value": f"what {subject} asked"}],
                             project=project, gzip=gzip)
    assert done
    return ids[0]


def test_phoenix_takes_protobuf_otlp_and_answers_spans_by_attribute(phoenix):
    project, alice, bob = someone("project"), someone(), someone()
    alices = export(phoenix, project, alice)
    export(phoenix, project, bob, gzip=True)
    # Stored by a background writer after the exporter's 200: readable a moment later.
    found = wait_for("alice's span", lambda: phoenix_spans(phoenix, project, tenant=None, attribute=f'user.id:"{alice}"'))
    assert [s["context"]["trace_id"] for s in found] == [alices]
    assert found[0]["attributes"]["input.value"] == f"what {alice} asked"
    wait_for("bob's gzipped span", lambda: phoenix_spans(phoenix, project, tenant=None, attribute=f'user.id:"{bob}"'))
    # OTLP/JSON is not taken: the route sends the trace store protobuf whatever it was sent.
    body = json.dumps({"resourceSpans": []}).encode()
    status, _ = send(phoenix, "POST", "/v1/traces", raw_body=body, headers={"Content-Type": "application/json"})
    assert status == 415


def test_a_trace_deleted_by_its_id_is_gone_and_deleting_it_again_is_404(phoenix):
    project, alice, bob = someone("project"), someone(), someone()
    alices, bobs = export(phoenix, project, alice), export(phoenix, project, bob)
    wait_for("both traces", lambda: len(phoenix_spans(phoenix, project, tenant=None, trace_id=[alices, bobs])) == 2)
    status, _ = send(phoenix, "DELETE", f"/v1/traces/{alices}")
    assert status == 204
    assert phoenix_spans(phoenix, project, tenant=None, trace_id=alices) == []
    assert phoenix_spans(phoenix, project, tenant=None, attribute=f'user.id:"{alice}"') == []
    assert len(phoenix_spans(phoenix, project, tenant=None, trace_id=bobs)) == 1, "another trace is not touched"
    status, _ = send(phoenix, "DELETE", f"/v1/traces/{alices}")
    assert status == 404
