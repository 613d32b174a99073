"""Attacks on the control plane from the next tenant: another tenant's compliance token reading
the audit log, verifying the chain and reaching erasures, subjects, consents, holds and rules; and
requests that would grow the metrics without bound. What the audit log holds is counted straight
in the state store."""

import json
import random
import string
import subprocess
import uuid

import chromadb
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
    assert methods <= {"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "_OTHER"}, methods


def test_a_certificate_anchors_the_audit_chain_so_a_cut_below_it_is_found(chroma, tmp_path):
    """Whoever can write the state store cuts the audit log back to before an erasure and moves
    every head (and every kept signed head) back with it: each remaining link is sound, but the
    certificate the subject was given carries the heads, and `lethe audit verify --head` with it
    fails, for the whole chain and for the tenant's."""
    import urllib.request
    from conftest import own_lethe
    gate = own_lethe(chroma, tmp_path, "[erasure]\nsettle = \"100ms\"\n")
    try:
        s = someone()
        gate.grant(s)
        done, _ = gate.erase_to_completion(s)
        request = urllib.request.Request(f"http://{gate.control}/v1/erasures/{done['id']}/certificate",
                                         headers={"Authorization": f"Bearer {gate.dpo}"})
        document = urllib.request.urlopen(request, timeout=10).read()
        path = tmp_path / "certificate.json"
        path.write_bytes(document)
        certificate = json.loads(document)["certificate"]
        head = certificate["audit_chain_head"]["seq"]
        assert certificate["audit_tenant_head"]["seq"] >= 1
        gate.grant(someone())  # the log goes on after the certificate
        for args in (("--head", str(path)), ("--tenant", TENANT, "--head", str(path))):
            ok = gate.cli("audit", "verify", *args)
            assert ok.returncode == 0, ok.stdout + ok.stderr

        cut = f"""DELETE FROM audit_events WHERE seq >= {head};
                  UPDATE audit_chain SET seq = e.seq, hash = e.hash FROM (SELECT seq, hash FROM audit_events ORDER BY seq DESC LIMIT 1) e;
                  UPDATE audit_tenant_heads t SET seq = e.tenant_seq, hash = e.tenant_hash
                    FROM (SELECT DISTINCT ON (tenant) tenant, tenant_seq, tenant_hash FROM audit_events
                           WHERE tenant IS NOT NULL ORDER BY tenant, seq DESC) e WHERE t.tenant = e.tenant;
                  DELETE FROM audit_signed_heads;"""
        subprocess.run(["psql", gate.state_url, "-qc", cut], check=True, capture_output=True)
        plain = gate.cli("audit", "verify")
        assert plain.returncode == 0, "nothing left in the state store tells: " + plain.stderr.decode()
        for args in (("--head", str(path)), ("--tenant", TENANT, "--head", str(path))):
            found = gate.cli("audit", "verify", *args)
            assert found.returncode == 1, (args, found.stdout)
            assert b"cut off" in found.stderr, found.stderr
    finally:
        gate.stop()


def test_confusable_names_are_one_subject_or_refused_and_an_erased_one_stays_erased(chroma, tmp_path):
    """`carol` written decomposed is `carol`; `carol ` and names with invisible characters are
    refused everywhere (control plane and data plane); after `carol`'s erasure none of her
    spellings can be granted again; a tenant with case-insensitive keys folds `Carol@X.com` to one
    subject, counted in Chroma."""
    import unicodedata
    from conftest import own_lethe
    gate = own_lethe(chroma, tmp_path, '[erasure]\nsettle = "100ms"\n\n[tenants.globex]\nsubject_keys = "case_insensitive"\n')
    try:
        globex_dpo = gate.token("compliance", tenant=GLOBEX)
        rules = {"rules": [{"purpose": "personalization", "category": "preference", "max_age": "30d"}]}
        assert gate.call("PUT", "/v1/retention-rules", rules, token=globex_dpo)[0] == 200

        def grant(subject, tenant=TENANT, purpose="personalization"):
            dpo = gate.dpo if tenant == TENANT else globex_dpo
            return gate.call("POST", "/v1/consents", {"tenant": tenant, "subject": subject, "purpose": purpose,
                                                      "category": "preference", "actions": ["store", "retrieve"],
                                                      "source": "pytest", "policy_version": 1}, token=dpo)

        tag = uuid.uuid4().hex[:6]
        composed = f"jos\u00e9-{tag}"
        decomposed = unicodedata.normalize("NFD", composed)
        assert decomposed != composed
        assert grant(composed)[0] == 201
        status, second = grant(decomposed)
        assert status == 201 and second["subject"] == composed, second
        from urllib.parse import quote
        assert len(gate.call("GET", f"/v1/subjects/{TENANT}/{quote(decomposed)}")[1]["grants"]) == 2
        for bad in (f"{composed} ", f" {composed}", f"{composed}\u200b", f"\u202e{composed}", f"jo\u00adse-{tag}"):
            status, refused = grant(bad)
            assert status == 422 and refused["error"]["code"] == "validation_failed", (bad, refused)
        for purpose in ("person\u202ealization", "personal\u200bization", "personalization "):
            assert grant(composed, purpose=purpose)[0] == 422, purpose

        # The data plane: a record naming its subject (its own `lethe_subject`, as an unbound
        # token's records do) is brought to the same spelling, or refused.
        name = f"names-{tag}"
        made = gate.client(gate.token("admin")).create_collection(name, embedding_function=None)
        use = {"X-Lethe-Purpose": "personalization", "X-Lethe-Category": "preference"}
        agent = lambda tenant=TENANT, **headers: gate.client(gate.token("agent", tenant=tenant), **use, **headers)
        add = lambda subject, id_: agent().get_collection(name).add(
            ids=[id_], embeddings=[[0.1, 0.2]], documents=["a note"], metadatas=[{"lethe_subject": subject}])
        add(decomposed, "j1")
        direct = chromadb.HttpClient(host=chroma.split("//")[1].split(":")[0], port=int(chroma.rsplit(":", 1)[1]))
        stamped = direct.get_collection(name).get(ids=["j1"], include=["metadatas"])["metadatas"][0]
        assert stamped["lethe_subject"] == composed, stamped
        for bad in (f"{composed} ", f"{composed}\u200b", f"\u202e{composed}"):
            with pytest.raises(Exception, match="invalid_request"):
                add(bad, "j2")
        assert direct.get_collection(name).get(ids=["j2"])["ids"] == []

        # Erased: no spelling of her can be granted again.
        done, _ = gate.erase_to_completion(composed)
        assert done["state"] == "completed"
        for again in (composed, decomposed):
            status, refused = grant(again)
            assert status == 409 and refused["error"]["code"] == "subject_suppressed", (again, refused)
        assert grant(f"{composed} ")[0] == 422

        # globex keys its subjects case-insensitively: one subject, kept in lower case.
        upper, lower = f"Carol-{tag}@X.com", f"carol-{tag}@x.com"
        status, granted = grant(upper, tenant=GLOBEX)
        assert status == 201 and granted["subject"] == lower, granted
        assert gate.call("GET", f"/v1/subjects/{GLOBEX}/{quote(upper.upper())}", token=globex_dpo)[1]["subject"] == lower
        agent(GLOBEX, **{"X-Lethe-Subject": upper.upper()}).get_collection(name).add(
            ids=["c1"], embeddings=[[0.1, 0.2]], documents=["mixed case"])
        assert direct.get_collection(name).get(ids=["c1"], include=["metadatas"])["metadatas"][0]["lethe_subject"] == lower
        # acme keeps case: Carol and carol are two people there.
        assert grant(upper)[1]["subject"] == upper
        del made
    finally:
        gate.stop()


def test_one_person_is_one_approver_and_the_requester_is_none(chroma, tmp_path):
    """Two approvals required: the requester cannot give one, in any spelling; an approver in
    another case or spacing is the same person; an id with edge whitespace is no actor at all.
    The approvals are counted in the state store."""
    from conftest import LETHE, own_lethe
    gate = own_lethe(chroma, tmp_path, '[erasure]\napprovals_required = 2\nsettle = "100ms"\n')
    try:
        def as_actor(actor):
            out = subprocess.run([str(LETHE), "token", "--role", "compliance", "--tenant", TENANT, "--actor", actor],
                                 cwd=gate.workdir, env=gate.env, capture_output=True, text=True)
            return out.stdout.strip() if out.returncode == 0 else None

        s = someone()
        gate.grant(s)
        status, filed = gate.call("POST", "/v1/erasures", {"subject": s, "ticket": "DSR-2", "reason": "art. 17"},
                                  token=as_actor("dpo-a"))
        assert status == 201, filed
        approve = lambda actor: gate.call("POST", f"/v1/erasures/{filed['id']}/approve", token=as_actor(actor))
        for requester in ("dpo-a", "DPO-A", "dpo -a"):
            status, refused = approve(requester)
            assert (status, refused["error"]["code"]) == (409, "requester_cannot_approve"), (requester, refused)
        assert approve("dpo-b")[1]["state"] == "requested"
        for again in ("DPO-B", "Dpo-b", "dpo- b"):
            status, refused = approve(again)
            assert (status, refused["error"]["code"]) == (409, "confusable_approver"), (again, refused)
        assert as_actor("dpo-c ") is None or approve("dpo-c ")[0] == 401, "no token names an actor with edge whitespace"
        stored = subprocess.run(["psql", gate.state_url, "-qtAc", f"SELECT approvals FROM erasure_requests WHERE id = '{filed['id']}'"],
                                check=True, capture_output=True, text=True).stdout.strip()
        assert json.loads(stored) == ["dpo-b"], stored
        status, approved = approve("dpo-c")
        assert status == 200 and approved["state"] == "suppressed" and approved["approvals"] == ["dpo-b", "dpo-c"], approved
    finally:
        gate.stop()
