"""A model-based test of the OTLP route against Arize Phoenix: random sequences of exports by
callers of two tenants (one bound to a subject) naming three subjects (or none), with content or
without, into two projects, reusing each other's trace ids (another tenant's too), with erasures
(the flip and its purge), consent withdrawals and token revocations interleaved. Each export's
answer is checked against a model of who may write what, and at the end of each sequence every
span Phoenix holds in the sequence's projects is checked against it: the spans expected and no
other, each under its tenant's trace id and project, stamped with its tenant and its subject's
reference, its content kept exactly when the subject consented, no subject key anywhere in it,
and nothing left of a subject whose erasure completed. `LETHE_MODEL_CASES` sets how many
sequences (default 8)."""

import json
import os
import random
import uuid

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from conftest import (GLOBEX, TENANT, phoenix_project_id, send, someone, stored_project, stored_span, stored_trace,
                      wait_for)
from test_attack_redis import claims_of
from test_otlp import answered, gate  # noqa: F401

# (tenant, subject index) of each subject; (tenant, bound subject) of each caller.
SUBJECTS = [TENANT, TENANT, GLOBEX]
CALLERS = [(TENANT, None), (TENANT, 0), (GLOBEX, None)]

span = st.tuples(st.one_of(st.none(), st.integers(0, len(SUBJECTS) - 1)), st.booleans())
op = st.one_of(
    st.tuples(st.just("export"), st.integers(0, len(CALLERS) - 1), st.lists(span, min_size=1, max_size=3),
              st.one_of(st.none(), st.integers(0, 7)), st.integers(0, 1)),
    st.tuples(st.just("flip"), st.integers(0, len(SUBJECTS) - 1)),
    st.tuples(st.just("withdraw"), st.integers(0, len(SUBJECTS) - 1)),
    st.tuples(st.just("revoke"), st.integers(0, len(CALLERS) - 1)),
)


def grant(lethe, subject, tenant):
    dpo = lethe.dpo if tenant == TENANT else lethe.token("compliance", tenant=tenant)
    status, body = lethe.call("POST", "/v1/consents", {
        "tenant": tenant, "subject": subject, "purpose": "observability", "category": "trace",
        "actions": ["store"], "source": "model", "policy_version": 1}, token=dpo)
    assert status == 201, body
    return body["id"]


def post_raw(lethe, body, token):
    from http.client import HTTPConnection
    host, port = lethe.data.split(":")
    connection = HTTPConnection(host, int(port), timeout=15)
    connection.request("POST", "/otlp/v1/traces", body=body,
                       headers={"Authorization": f"Bearer {token}", "Content-Type": "application/x-protobuf"})
    answer = connection.getresponse()
    raw = answer.read()
    connection.close()
    return answer.status, raw


class Case:
    def __init__(self, lethe):
        # Hypothesis seeds Python's `random` the same way for every sequence, and the SDK draws
        # trace and span ids from it: without this, sequences would share trace ids (and a
        # trace stays in the project it was first seen in).
        random.seed(uuid.uuid4().int)
        self.lethe = lethe
        self.names = [someone(tenant) for tenant in SUBJECTS]
        self.grants = [grant(lethe, name, tenant) for name, tenant in zip(self.names, SUBJECTS)]
        self.projects = [f"m-{uuid.uuid4().hex[:8]}" for _ in range(2)]
        self.tokens = [lethe.token("agent", self.names[b] if b is not None else None, tenant=t) for t, b in CALLERS]
        self.revoked = [False] * len(CALLERS)
        self.flipped = [False] * len(SUBJECTS)
        self.withdrawn = [False] * len(SUBJECTS)
        self.traces = []  # every client trace id used, whichever tenant's
        self.expected = {}  # stored span id -> what Phoenix must hold of it (a withheld span loses its name)
        self.n = 0
        self.sentinels = set()  # stored span ids of the sentinels sent

    def owner(self, caller, named):
        """The subject a span of `caller` naming subject `named` (or none) is written for:
        (tenant, subject index or None, refused)."""
        tenant, bound = CALLERS[caller]
        if bound is not None and named is not None and named != bound:
            return tenant, None, True
        subject = bound if named is None else named
        if subject is not None and SUBJECTS[subject] != tenant:
            # Another tenant's subject's key, named by this tenant: a namesake of its own, which
            # never consented.
            return tenant, ("namesake", subject), False
        return tenant, subject, subject is not None and self.flipped[subject]

    def export(self, caller, spans, reuse, project):
        tenant, _ = CALLERS[caller]
        trace = self.traces[reuse % len(self.traces)] if reuse is not None and self.traces else None
        attributes, names = [], []
        for named, content in spans:
            name = f"s{self.n}"
            self.n += 1
            span = {}
            if named is not None:
                span["user.id"] = self.names[named]
            if content:
                span["input.value"] = f"content of {name}"
            attributes.append(span)
            names.append(name)
        body, ids, span_ids = protobuf_named(attributes, names, self.projects[project], trace)
        self.traces += ids
        status, raw = post_raw(self.lethe, body, self.tokens[caller])
        if self.revoked[caller]:
            assert status == 401, (status, raw)
            return
        assert status == 200, (status, raw)
        rejected = 0
        for (named, content), name, trace_id, span_id in zip(spans, names, ids, span_ids):
            tenant, subject, refused = self.owner(caller, named)
            if refused:
                rejected += 1
                continue
            consented = isinstance(subject, int) and not self.withdrawn[subject]
            stored = stored_trace(trace_id, tenant)
            # A trace stays in the project it was first seen in, while any span of it is held.
            first = (h["project"] for h in self.expected.values() if h["trace"] == stored and not h.get("gone"))
            self.expected[stored_span(span_id, tenant)] = {"name": name, "tenant": tenant, "subject": subject,
                                                           "named": named is not None,
                                   "project": next(first, self.projects[project]),
                                   "trace": stored, "kept": consented,
                                   "content": consented and content}
        assert answered(raw).partial_success.rejected_spans == rejected, (spans, raw)

    def flip(self, subject):
        """Her erasure, filed, approved and waited for: her spans go, and with them every span
        of a trace that held nothing else but content-free spans of no one of her tenant's."""
        if self.flipped[subject]:
            return
        tenant = SUBJECTS[subject]
        dpo = self.lethe.dpo if tenant == TENANT else self.lethe.token("compliance", tenant=tenant)
        status, filed = self.lethe.call("POST", "/v1/erasures", {"tenant": tenant, "subject": self.names[subject],
                                                                 "ticket": "M", "reason": "model"}, token=dpo)
        assert status == 201, filed
        status, _ = self.lethe.call("POST", f"/v1/erasures/{filed['id']}/approve", token=dpo)
        assert status == 200
        self.flipped[subject] = True
        wait_for("the erasure to complete",
                 lambda: self.lethe.call("GET", f"/v1/erasures/{filed['id']}", token=dpo)[1]["state"] == "completed")
        self.take(tenant, lambda h: h["subject"] == subject)

    def take(self, tenant, whose):
        """Marks gone the spans `whose` selects and every span of a trace of theirs that held
        nothing else but spans of no one of the tenant's kept without consent (a trace deleted
        whole);
        answers their ids."""
        held = [h for h in self.expected.values() if not h.get("gone")]
        doomed = [h for h in held if h["tenant"] == tenant and whose(h)]
        for trace in {h["trace"] for h in doomed}:
            theirs = [h for h in doomed if h["trace"] == trace]
            rest = [h for h in held if h["trace"] == trace and h not in theirs]
            nobodys = all(h["tenant"] == tenant and h["subject"] is None and not h["kept"] for h in rest)
            for h in theirs + (rest if nobodys else []):
                h["gone"] = True
        return {span for span, h in self.expected.items() if h.get("gone")}

    def withdraw(self, subject):
        """Her consent withdrawn: what was kept with its content under it is past its deadline,
        and the sweeper deletes it (waited for)."""
        if not self.withdrawn[subject]:
            tenant = SUBJECTS[subject]
            dpo = self.lethe.dpo if tenant == TENANT else self.lethe.token("compliance", tenant=tenant)
            status, body = self.lethe.call("POST", f"/v1/consents/{self.grants[subject]}/revoke", token=dpo)
            assert status == 200, body
            self.withdrawn[subject] = True
            gone = self.take(tenant, lambda h: h["subject"] == subject and h["kept"])
            # Landed first: a span not yet ingested is not yet deleted either.
            self.landed()
            wait_for("the sweeper to delete what her consent kept", lambda: not gone & set(self.held()))

    def revoke(self, caller):
        if not self.revoked[caller]:
            status, body = self.lethe.call("POST", "/v1/tokens/revoke", {"jti": claims_of(self.tokens[caller])["jti"]},
                                           token=self.lethe.token("admin", tenant=CALLERS[caller][0]))
            assert status == 200, body
            self.revoked[caller] = True

    def held(self):
        """Every span Phoenix holds in the case's projects, of both tenants, by span id."""
        spans = {}
        for tenant in (TENANT, GLOBEX):
            for project in self.projects:
                identifier = phoenix_project_id(self.lethe.phoenix, stored_project(project, tenant))
                if identifier is None:
                    continue
                status, page = send(self.lethe.phoenix, "GET", f"/v1/projects/{identifier}/spans?limit=1000")
                assert status == 200, page
                for held in page["data"]:
                    span = held["context"]["span_id"]
                    assert span not in spans, f"{span} held twice"
                    spans[span] = {**held, "project": project, "project_tenant": tenant}
        # And no project of a name a client gave, unnamespaced.
        assert all(phoenix_project_id(self.lethe.phoenix, p) is None for p in self.projects)
        return spans

    def forget(self):
        """Deletes the case's projects, once checked: Phoenix's searches read every project, so
        thousands of cases' projects would slow each erasure past the test's deadlines."""
        for tenant in (TENANT, GLOBEX):
            for project in self.projects:
                identifier = phoenix_project_id(self.lethe.phoenix, stored_project(project, tenant))
                if identifier is not None:
                    status, body = send(self.lethe.phoenix, "DELETE", f"/v1/projects/{identifier}")
                    assert status in (200, 204), body

    def landed(self):
        """Every span Phoenix holds in the case's projects, but sentinels, once a sentinel span of
        each tenant sent now has landed (Phoenix ingests in order: what was sent before it has
        landed too)."""
        sent = set()
        for tenant in (TENANT, GLOBEX):
            body, _, span_ids = protobuf_named([{}], [f"sentinel-{tenant}"], self.projects[0], None)
            status, raw = post_raw(self.lethe, body, self.lethe.token("agent", tenant=tenant))
            assert status == 200, raw
            sent.add(stored_span(span_ids[0], tenant))
        self.sentinels |= sent
        spans = wait_for("the sentinels to land", lambda: (s := self.held()) and sent <= set(s) and s)
        return {k: v for k, v in spans.items() if k not in self.sentinels}

    def check(self):
        """Phoenix holds what the model says, once everything sent has landed."""
        spans = self.landed()
        want = {span for span, held in self.expected.items() if not held.get("gone")}
        assert set(spans) == want, (sorted(set(spans) - want), sorted(want - set(spans)))
        references = {}
        for span, held in spans.items():
            model, attributes = self.expected[span], held["attributes"]
            name = model["name"]
            assert (held["project_tenant"], held["project"]) == (model["tenant"], model["project"]), name
            assert held["context"]["trace_id"] == model["trace"], name
            assert attributes["lethe.tenant"] == model["tenant"], name
            assert ("input.value" in attributes) == model["content"], (name, attributes)
            if model["subject"] is None:
                assert "lethe.subject_ref" not in attributes and "user.id" not in attributes, (name, attributes)
            else:
                reference = attributes["lethe.subject_ref"]
                # Her key, where the span named her, is her reference; a bound caller's span that
                # named no one is hers, and names no one still.
                assert attributes.get("user.id") == (reference if model["named"] else None), (name, attributes)
                owner = (model["tenant"], json.dumps(model["subject"]))
                assert references.setdefault(owner, reference) == reference, "one reference per subject"
            text = json.dumps(held)
            assert not any(key in text for key in self.names), (name, "a subject key in the store")
        assert len(set(references.values())) == len(references), "no two subjects share a reference"


@pytest.fixture(scope="module")
def model_gate(gate, phoenix):
    gate.phoenix = phoenix
    return gate


def protobuf_named(spans, names, project, trace_id):
    """`protobuf(spans, project)` with each span named as `names` says, in the trace
    `trace_id` (hex) when given, else each in a trace of its own; and the spans' trace and span
    ids (hex)."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    from conftest import traced_spans
    finished, ids = traced_spans(spans, project, trace_id)
    request = encode_spans(finished)
    span_ids = []
    for resource in request.resource_spans:
        for scope in resource.scope_spans:
            for span, name in zip(scope.spans, names):
                span.name = name
                span_ids.append(span.span_id.hex())
    return request.SerializeToString(), ids, span_ids


# No shrinking: each step talks to real servers, and the failing sequence is reported as it ran.
@settings(max_examples=int(os.environ.get("LETHE_MODEL_CASES", "8")), deadline=None, database=None,
          phases=[Phase.generate], suppress_health_check=list(HealthCheck))
@given(ops=st.lists(op, min_size=1, max_size=8))
def test_every_export_and_every_span_phoenix_holds_is_what_the_model_says(model_gate, ops):
    case = Case(model_gate)
    for step in ops:
        getattr(case, step[0])(*step[1:])
    case.check()
    case.forget()
