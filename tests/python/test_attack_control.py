"""Attacks on the control plane from the next tenant: another tenant's compliance token reading
the audit log, verifying the chain and reaching erasures, subjects, consents, holds and rules; and
requests that would grow the metrics without bound. What the audit log holds is counted straight
in the state store."""

import json
import random
import string
import subprocess
import uuid

import pytest

from conftest import GLOBEX, TENANT, send, someone, two_tenant_lethe


@pytest.fixture(scope="module")
def gate(chroma, tmp_path_factory):
    instance = two_tenant_lethe(chroma, tmp_path_factory.mktemp("attack-control"), "[erasure]\nsettle = \"100ms\"\n")
    yield instance
    instance.stop()


def audit_rows(gate, tenant):
    """How many audit events of a tenant the state store holds."""
    out = subprocess.run(["psql", gate.state_url, "-qtAc", f"SELECT count(*) FROM audit_events WHERE tenant = '{tenant}'"],
                         check=True, capture_output=True, text=True).stdout
    return int(out.strip())


def control(gate, method, path, body=None, token=None, request_id=None):
    headers = {"Authorization": f"Bearer {token or gate.dpo}"}
    if request_id:
        headers["X-Request-Id"] = request_id
    return send(f"http://{gate.control}", method, path, body, headers)


def audit_pages(gate, token):
    events, after = [], 0
    while True:
        status, page = control(gate, "GET", f"/v1/audit?after={after}&limit=1000", token=token)
        assert status == 200, page
        events += page["items"]
        if page["next_cursor"] is None:
            return events
        after = page["next_cursor"]


def test_the_audit_log_of_another_tenant_is_not_shown(gate):
    globex_dpo = gate.token("compliance", tenant=GLOBEX)
    tag = uuid.uuid4().hex[:8]
    assert control(gate, "POST", "/v1/consents", {"tenant": GLOBEX, "subject": someone(GLOBEX), "purpose": "personalization",
                                                  "category": "preference", "actions": ["store"], "source": "pytest",
                                                  "policy_version": 1}, token=globex_dpo, request_id=f"globex-{tag}")[0] == 201
    seen_before = audit_pages(gate, globex_dpo)
    verified_before = control(gate, "GET", "/v1/audit/verify", token=globex_dpo)
    assert verified_before[0] == 200 and verified_before[1]["ok"] is True, verified_before

    # acme's activity, each request tagged with a request id of its own.
    victim = someone()
    acme_ids = [f"acme-{tag}-{n}" for n in range(3)]
    assert control(gate, "POST", "/v1/consents", {"subject": victim, "purpose": "personalization", "category": "preference",
                                                  "actions": ["store"], "source": "pytest", "policy_version": 1},
                   request_id=acme_ids[0])[0] == 201
    assert control(gate, "POST", "/v1/legal-holds", {"subject": victim, "reason": "x"}, request_id=acme_ids[1])[0] == 201
    assert control(gate, "POST", "/v1/erasures", {"subject": victim, "ticket": "DSR-A", "reason": "art. 17"},
                   request_id=acme_ids[2])[0] == 201

    seen = audit_pages(gate, globex_dpo)
    assert f"globex-{tag}" in {e["request_id"] for e in seen}
    assert len(seen) == audit_rows(gate, GLOBEX), "every globex event the store holds, and nothing else"
    assert audit_rows(gate, TENANT) >= 3
    verified = control(gate, "GET", "/v1/audit/verify", token=globex_dpo)
    problems = {
        "acme's tagged events shown": [e["action"] for e in seen if e["request_id"] in acme_ids],
        "events not marked as globex's": len([e for e in seen if e.get("tenant") != GLOBEX]),
        "events shown before and after acme's activity": (len(seen_before), len(seen)),
        # Verifying globex's chain reveals nothing of acme's activity either.
        "verify before and after acme's activity": (verified_before, verified),
    }
    assert problems == {"acme's tagged events shown": [], "events not marked as globex's": 0,
                        "events shown before and after acme's activity": (len(seen_before), len(seen_before)),
                        "verify before and after acme's activity": (verified_before, verified_before)}


def test_another_tenants_control_plane_objects_are_out_of_reach(gate):
    globex_dpo = gate.token("compliance", tenant=GLOBEX)
    victim = someone()
    grant = gate.grant(victim)
    status, hold = gate.call("POST", "/v1/legal-holds", {"subject": victim, "reason": "x"})
    assert status == 201
    status, filed = gate.call("POST", "/v1/erasures", {"subject": victim, "ticket": "DSR-X", "reason": "art. 17"})
    assert status == 201
    answers = {
        "erasure": control(gate, "GET", f"/v1/erasures/{filed['id']}", token=globex_dpo),
        "certificate": control(gate, "GET", f"/v1/erasures/{filed['id']}/certificate", token=globex_dpo),
        "approve": control(gate, "POST", f"/v1/erasures/{filed['id']}/approve", token=globex_dpo),
        "review": control(gate, "POST", f"/v1/erasures/{filed['id']}/review", token=globex_dpo),
        "resume": control(gate, "POST", f"/v1/erasures/{filed['id']}/resume", token=globex_dpo),
        "extend": control(gate, "POST", f"/v1/erasures/{filed['id']}/extend", {"months": 2, "reason": "x"},
                          token=globex_dpo),
        "dry run": control(gate, "POST", "/v1/erasures/dry-run", {"tenant": TENANT, "subject": victim}, token=globex_dpo),
        "reject": control(gate, "POST", f"/v1/erasures/{filed['id']}/reject", {"reason": "x"}, token=globex_dpo),
        "subject": control(gate, "GET", f"/v1/subjects/{TENANT}/{victim}", token=globex_dpo),
        "consents": control(gate, "GET", f"/v1/consents?tenant={TENANT}&subject={victim}", token=globex_dpo),
        "revoke": control(gate, "POST", f"/v1/consents/{grant}/revoke", token=globex_dpo),
        "holds": control(gate, "GET", f"/v1/legal-holds?tenant={TENANT}", token=globex_dpo),
        "release": control(gate, "POST", f"/v1/legal-holds/{hold['id']}/release", token=globex_dpo),
        "rules": control(gate, "GET", f"/v1/retention-rules?tenant={TENANT}", token=globex_dpo),
        "replace rules": control(gate, "PUT", f"/v1/retention-rules?tenant={TENANT}", {"rules": []}, token=globex_dpo),
    }
    shown = {what: a for what, a in answers.items() if a[0] not in (403, 404)}
    assert shown == {}
    # globex's own listings name nothing of acme's.
    for path in (f"/v1/consents?subject={victim}", "/v1/legal-holds", f"/v1/legal-holds?subject={victim}"):
        status, listed = control(gate, "GET", path, token=globex_dpo)
        assert status in (200, 404) and victim not in json.dumps(listed), (path, listed)
    # Nothing changed for acme.
    now = gate.call("GET", f"/v1/erasures/{filed['id']}")[1]
    assert (now["state"], now["deadline"], now["extension"]) == (filed["state"], filed["deadline"], None)
    view = gate.call("GET", f"/v1/subjects/{TENANT}/{victim}")[1]
    assert [g["id"] for g in view["grants"] if not g.get("revoked_at")] == [grant]
    assert [(h["id"], h["active"]) for h in view["legal_holds"]] == [(hold["id"], True)]
    assert gate.call("GET", "/v1/retention-rules")[1]["rules"] != []


def test_invented_methods_and_paths_never_grow_the_metrics(gate):
    """Unauthenticated requests with invented methods and paths: the metrics keep a bounded set
    of series (route templates and known methods)."""
    def series():
        status, text = send(f"http://{gate.control}", "GET", "/metrics")
        assert status == 200
        return {line.rsplit(" ", 1)[0] for line in text.splitlines() if line.startswith("lethe_control_requests_total{")}
    before = series()
    for _ in range(100):
        method = "".join(random.choices(string.ascii_uppercase, k=12))
        send(f"http://{gate.control}", method, f"/{uuid.uuid4().hex}")
        send(f"http://{gate.control}", method, "/v1/audit")
    after = series()
    assert len(after - before) <= 4, sorted(after - before)
    methods = {line.split('method="')[1].split('"')[0] for line in after}
    assert methods <= {"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "other"}, methods
