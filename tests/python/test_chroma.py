"""Lethe in front of a real Chroma server, driven with the official `chromadb` client."""

import json
import time
import uuid
from pathlib import Path

import chromadb
import pytest

from conftest import TENANT, new_database, own_lethe, wait_for


def subject():
    return f"user-{uuid.uuid4().hex[:8]}"


def memories(client, name):
    return client.get_collection(name, embedding_function=None)


def add(client, name, ids, **kwargs):
    memories(client, name).add(
        ids=ids,
        embeddings=[[float(i), 1.0, 0.5] for i in range(len(ids))],
        documents=[f"fact {i}" for i in ids],
        **kwargs,
    )


def test_a_consented_write_is_stored_with_its_stamp(lethe, direct, collection):
    s = subject()
    lethe.grant(s)
    add(lethe.agent(s), collection, ["m1", "m2"], metadatas=[{"topic": "tea"}, None])

    stored = direct.get_collection(collection).get(include=["metadatas"])
    assert sorted(stored["ids"]) == ["m1", "m2"]
    for meta in stored["metadatas"]:
        assert meta["lethe_subject"] == s and meta["lethe_tenant"] == TENANT
        assert (meta["lethe_purpose"], meta["lethe_category"], meta["lethe_epoch"]) == ("personalization", "preference", 0)
        assert abs(meta["lethe_expires_at"] - (time.time() + 30 * 86400)) < 120

    seen = memories(lethe.agent(s), collection).get(include=["metadatas", "documents"])
    assert sorted(seen["ids"]) == ["m1", "m2"]
    assert sorted(seen["documents"]) == ["fact m1", "fact m2"]


def test_a_write_without_consent_is_refused_and_nothing_reaches_chroma(lethe, direct, collection):
    s = subject()
    with pytest.raises(Exception, match="consent_required"):
        add(lethe.agent(s), collection, ["m1"])
    assert direct.get_collection(collection).count() == 0
    # Consent for another action does not help.
    lethe.grant(s, actions=["retrieve"])
    with pytest.raises(Exception, match="consent_required"):
        add(lethe.agent(s), collection, ["m1"])
    assert direct.get_collection(collection).count() == 0


def test_revoking_consent_hides_the_records_on_the_next_read(lethe, direct, collection):
    s = subject()
    grant = lethe.grant(s)
    client = lethe.agent(s)
    add(client, collection, ["m1", "m2"])
    assert len(memories(client, collection).get()["ids"]) == 2
    lethe.revoke(grant)
    assert memories(client, collection).get()["ids"] == []
    assert memories(client, collection).query(query_embeddings=[[0.0, 1.0, 0.5]], n_results=2)["ids"] == [[]]
    assert memories(client, collection).count() == 0
    # Hidden at once; the sweeper deletes them from Chroma later (see the sweeper test).


def test_an_expired_record_is_never_returned(lethe, direct, collection):
    s = subject()
    lethe.grant(s)
    client = lethe.agent(s)
    soon = int(time.time()) + 2
    add(client, collection, ["short", "long"], metadatas=[{"lethe_expires_at": soon}, None])
    stored = {m["lethe_expires_at"] for m in direct.get_collection(collection).get(include=["metadatas"])["metadatas"]}
    assert soon in stored, "a client may ask for an earlier expiry"
    # A record stamped as already expired, written straight into Chroma.
    direct.get_collection(collection).add(
        ids=["stale"], embeddings=[[9.0, 9.0, 9.0]], documents=["old"],
        metadatas=[{"lethe_subject": s, "lethe_tenant": TENANT, "lethe_purpose": "personalization",
                    "lethe_category": "preference", "lethe_expires_at": int(time.time()) - 10, "lethe_epoch": 0}],
    )
    assert sorted(memories(client, collection).get()["ids"]) == ["long", "short"]
    wait_for("the short record to expire", lambda: time.time() > soon + 1, deadline=10)
    assert memories(client, collection).get()["ids"] == ["long"]
    ids = memories(client, collection).query(query_embeddings=[[9.0, 9.0, 9.0]], n_results=3)["ids"]
    assert ids == [["long"]]


def test_a_suppressed_subjects_records_vanish_from_query_and_get(lethe, direct, collection):
    keep, gone = subject(), subject()
    for s in (keep, gone):
        lethe.grant(s)
        add(lethe.agent(s), collection, [f"{s}-1", f"{s}-2"])
    service = lethe.agent()  # a service token: reads across subjects of the tenant
    assert len(memories(service, collection).get()["ids"]) == 4
    status, filed = lethe.call("POST", "/v1/erasures", {"subject": gone, "ticket": "DSR-42", "reason": "erasure request"})
    assert status == 201, filed
    status, flipped = lethe.call("POST", f"/v1/erasures/{filed['id']}/approve")
    assert (status, flipped["state"]) == (200, "suppressed"), flipped
    # The flip was committed and broadcast before approve answered: no waiting.
    assert len(memories(service, collection).get()["ids"]) == 2
    assert all(i.startswith(keep) for i in memories(service, collection).get()["ids"])
    queried = memories(service, collection).query(query_embeddings=[[0.0, 1.0, 0.5]], n_results=4)["ids"][0]
    assert sorted(queried) == sorted([f"{keep}-1", f"{keep}-2"])
    with pytest.raises(Exception, match="subject_suppressed"):
        add(lethe.agent(gone), collection, ["late-write"])
    assert "late-write" not in direct.get_collection(collection).get()["ids"], "the late write never reached Chroma"


def test_unstamped_records_are_not_served(lethe, direct, collection):
    s = subject()
    lethe.grant(s)
    add(lethe.agent(s), collection, ["stamped"])
    direct.get_collection(collection).add(ids=["raw-1", "raw-2"], embeddings=[[1, 1, 1], [2, 2, 2]], documents=["a", "b"])
    for client in (lethe.agent(s), lethe.agent()):
        assert memories(client, collection).get()["ids"] == ["stamped"]
        assert memories(client, collection).query(query_embeddings=[[1, 1, 1]], n_results=3)["ids"] == [["stamped"]]
        assert memories(client, collection).count() == 1


def test_subject_bound_tokens_never_see_each_other(lethe, direct, collection):
    alice, bob = subject(), subject()
    for s in (alice, bob):
        lethe.grant(s)
        add(lethe.agent(s), collection, [f"{s}-1", f"{s}-2", f"{s}-3"])
    for me, other in ((alice, bob), (bob, alice)):
        mine = memories(lethe.agent(me), collection)
        assert all(i.startswith(me) for i in mine.get()["ids"])
        assert all(i.startswith(me) for i in mine.query(query_embeddings=[[0.0, 1.0, 0.5]], n_results=6)["ids"][0])
        assert mine.count() == 3
        assert mine.get(ids=[f"{other}-1"])["ids"] == []
        # Neither can a bound token delete, nor overwrite, the other's records.
        mine.delete(ids=[f"{other}-1"])
        with pytest.raises(Exception, match="scope_violation"):
            mine.upsert(ids=[f"{other}-2"], embeddings=[[0.0, 0.0, 0.0]], documents=["taken"])
    assert direct.get_collection(collection).count() == 6
    # The subject header cannot widen a bound token.
    with pytest.raises(Exception, match="scope_violation"):
        memories(lethe.agent(alice, **{"X-Lethe-Subject": bob}), collection).get()


def test_a_subject_deletes_its_own_records_and_lineage_follows(lethe, direct, collection):
    s = subject()
    lethe.grant(s)
    client = lethe.agent(s)
    add(client, collection, ["d1", "d2", "d3"])
    view = lambda: lethe.call("GET", f"/v1/subjects/{TENANT}/{s}")[1]["inventory"].get("chroma", 0)
    wait_for("lineage of three records", lambda: view() == 3, deadline=5)
    memories(client, collection).delete(ids=["d1"])
    memories(client, collection).delete(where={"lethe_subject": s})
    assert direct.get_collection(collection).count() == 0
    assert view() == 0


def test_collections_are_managed_by_admins_only(lethe):
    s = subject()
    with pytest.raises(Exception, match="forbidden"):
        lethe.agent(s).create_collection(f"agent-made-{uuid.uuid4().hex[:8]}", embedding_function=None)
    name = f"admin-made-{uuid.uuid4().hex[:8]}"
    lethe.client(lethe.token("admin")).create_collection(name, embedding_function=None)
    assert memories(lethe.agent(s), name).name == name, "agents may open an existing collection"


def erase(lethe, subject, **extra):
    status, filed = lethe.call("POST", "/v1/erasures", {"subject": subject, "ticket": "DSR-7", "reason": "art. 17", **extra})
    assert status == 201, filed
    status, approved = lethe.call("POST", f"/v1/erasures/{filed['id']}/approve")
    assert status == 200, approved
    return filed["id"]


def erasure(lethe, request_id):
    return lethe.call("GET", f"/v1/erasures/{request_id}")[1]


def test_an_erasure_reaches_records_in_every_database(lethe, chroma):
    """Records written through Lethe into a database other than Chroma's default one are
    purged too: the connector searches every database of the configured Chroma tenants."""
    from chromadb.config import Settings
    from conftest import http
    s = subject()
    lethe.grant(s)
    database = f"db_{uuid.uuid4().hex[:8]}"
    assert http("POST", f"{chroma}/api/v2/tenants/default_tenant/databases", body={"name": database})[0] == 200
    through = lambda token, **headers: chromadb.HttpClient(
        host=f"http://{lethe.data}/chroma", database=database, settings=Settings(anonymized_telemetry=False),
        headers={"Authorization": f"Bearer {token}", **headers})
    through(lethe.token("admin")).create_collection("notes", embedding_function=None)
    agent = through(lethe.token("agent", s), **{"X-Lethe-Purpose": "personalization", "X-Lethe-Category": "preference"})
    agent.get_collection("notes").add(ids=["n1", "n2"], embeddings=[[0.1], [0.2]], documents=["likes tea", "lives in Lyon"])
    host, port = chroma.removeprefix("http://").split(":")
    stored = chromadb.HttpClient(host=host, port=int(port), database=database).get_collection("notes")
    # A stamped record lineage does not know (as after restoring that database from a backup):
    # only a search of that database by stamp finds it.
    stored.add(ids=["n3"], embeddings=[[0.3]], metadatas=[{"lethe_subject": s, "lethe_tenant": TENANT}])
    assert len(stored.get(where={"lethe_subject": s})["ids"]) == 3
    request = erase(lethe, s)
    wait_for("the erasure to complete", lambda: erasure(lethe, request)["state"] == "completed", deadline=30)
    assert stored.get(ids=["n1", "n2", "n3"])["ids"] == []


def stamped_by(direct, collection, subject):
    # Ids only: Chroma cannot answer the records of more than ~32 000 ids at once.
    return direct.get_collection(collection).get(where={"lethe_subject": subject}, include=[])["ids"]


def test_an_erasure_purges_chroma_verifies_and_completes(lethe, direct, collection):
    gone, kept = subject(), subject()
    for s in (gone, kept):
        lethe.grant(s)
        add(lethe.agent(s), collection, [f"{s}-1", f"{s}-2", f"{s}-3"])
    request = erase(lethe, gone)
    done = wait_for("the erasure to complete", lambda: erasure(lethe, request)["state"] == "completed" and erasure(lethe, request), deadline=30)
    assert stamped_by(direct, collection, gone) == [], "counted directly in Chroma: nothing left"
    assert sorted(stamped_by(direct, collection, kept)) == [f"{kept}-1", f"{kept}-2", f"{kept}-3"], "the other subject keeps all"
    target = done["targets"][0]
    assert (target["state"], target["result"]["remaining"]) == ("done", 0)
    assert target["result"]["deleted"] >= 3
    remaining = target["result"]["physical"]["remaining"]
    assert {c["place"].split(" ")[0] for c in remaining} >= {"chroma.sqlite3", "<collection"}, \
        "logical and physical deletion are reported apart, each remaining copy named"
    assert all(c["until"] is None and c["unknown"] for c in remaining), "no date Chroma cannot give"
    view = lethe.call("GET", f"/v1/subjects/{TENANT}/{gone}")[1]
    assert (view["state"], view["inventory"].get("chroma", 0)) == ("erased", 0)

    # The certificate, checked as a third party would: the file and the public key only.
    fetched = lethe.cli("certificate", request, "--tenant", TENANT)
    assert fetched.returncode == 0, fetched.stderr
    document = fetched.stdout.strip()
    key = lethe.cli("certificate", "public-key").stdout.decode().strip()
    path = Path(lethe.workdir) / f"{request}.json"
    path.write_bytes(document)
    ok = lethe.cli("certificate", "verify", str(path), "--key", key)
    assert ok.returncode == 0, ok.stderr
    assert b"final backup expiry" in ok.stdout
    assert b"final copy expiry unknown" in ok.stdout and b"exception: chroma:chroma: " in ok.stdout, ok.stdout
    certificate = json.loads(document)["certificate"]
    assert certificate["stores"][0]["remaining"] == 0 and certificate["online_latency_ms"] >= 0
    assert gone not in document.decode(), "the subject appears only as an HMAC reference"
    edited = bytearray(document)
    at = document.index(b'"deleted":') + len(b'"deleted":')
    edited[at] = ord("9") if edited[at] != ord("9") else ord("8")
    path.write_bytes(bytes(edited))
    bad = lethe.cli("certificate", "verify", str(path), "--key", key)
    assert bad.returncode == 1 and b"INVALID" in bad.stderr

    # Issued once: downloads before and after a restart (and after more audit events) are the
    # same bytes, and the file as downloaded verifies.
    def download():
        import urllib.request
        request_ = urllib.request.Request(f"http://{lethe.control}/v1/erasures/{request}/certificate",
                                          headers={"Authorization": f"Bearer {lethe.dpo}"})
        with urllib.request.urlopen(request_, timeout=10) as answer:
            return answer.read()
    first = download()
    lethe.grant(subject())
    lethe.stop()
    lethe.start()
    second = download()
    assert first == second == document
    path.write_bytes(second)
    assert lethe.cli("certificate", "verify", str(path), "--key", key).returncode == 0


def test_an_erasure_purges_more_records_than_chroma_takes_in_one_call(lethe, direct, collection):
    """Chroma answers 500 to a `get` naming more than 32 763 ids: a subject with more records
    than that, all known to lineage, is purged call by call, counted again, and completes."""
    many, kept = subject(), subject()
    for s in (many, kept):
        lethe.grant(s)
    agent = memories(lethe.agent(many), collection)
    total = 33_000
    for first in range(0, total, 3000):
        ids = [f"{many}-{i}" for i in range(first, min(total, first + 3000))]
        agent.add(ids=ids, embeddings=[[float(i % 97), 1.0, 0.5] for i in range(len(ids))],
                  documents=[f"note {i}" for i in ids])
    add(lethe.agent(kept), collection, [f"{kept}-1"])
    assert len(stamped_by(direct, collection, many)) == total
    # (33 000 records are deleted and counted again a thousand at a time.)
    _, results = lethe.erase_to_completion(many, deadline=120)
    assert stamped_by(direct, collection, many) == [], "counted directly in Chroma: nothing left"
    assert stamped_by(direct, collection, kept) == [f"{kept}-1"]
    result = results["chroma:chroma"]
    assert (result["before"], result["deleted"], result["remaining"]) == (total, total, 0)
    assert lethe.call("GET", f"/v1/subjects/{TENANT}/{many}")[1]["inventory"].get("chroma", 0) == 0, \
        "every lineage row is marked deleted"


def test_records_stamped_before_owner_keys_are_found_again_after_a_restart(lethe, direct, collection):
    """Reads of a subject find its records by their owner key; a record stamped by an earlier
    Lethe has none, and stays hidden (never served to anyone else) until the sweeper's first
    pass after a start gives it the key its stamp names."""
    s = subject()
    lethe.grant(s)
    add(lethe.agent(s), collection, [f"{s}-new"])
    stored = direct.get_collection(collection)
    meta = stored.get(ids=[f"{s}-new"], include=["metadatas"])["metadatas"][0]
    assert meta["lethe_owner"] == f"{TENANT}/{s}"
    earlier = {k: v for k, v in meta.items() if k != "lethe_owner"}
    stored.add(ids=[f"{s}-old"], embeddings=[[0.5, 1.0, 0.5]], documents=["written by an earlier Lethe"],
               metadatas=[earlier])
    reader = lambda: sorted(memories(lethe.agent(s), collection).get()["ids"])
    assert reader() == [f"{s}-new"]
    lethe.stop()
    lethe.start()
    wait_for("the earlier record to be found again", lambda: reader() == [f"{s}-new", f"{s}-old"], deadline=30)
    upgraded = stored.get(ids=[f"{s}-old"], include=["metadatas"])["metadatas"][0]
    assert upgraded == {**earlier, "lethe_owner": f"{TENANT}/{s}"}, "only the owner key is added"


class Stoppable:
    """A Chroma server of the test's own, that it can stop and start again on the same data."""

    def __init__(self, tmp):
        from conftest import free_port, http
        import shutil, subprocess, os
        self.path, self.port = str(tmp), free_port()
        self.bin = shutil.which("chroma") or str(Path(os.sys.executable).parent / "chroma")
        self.url = f"http://127.0.0.1:{self.port}"
        self._http, self._subprocess = http, subprocess
        self.start()

    def start(self):
        self.process = self._subprocess.Popen([self.bin, "run", "--path", self.path, "--port", str(self.port)],
                                              stdout=self._subprocess.DEVNULL, stderr=self._subprocess.DEVNULL)
        wait_for("chroma", lambda: self._http("GET", f"{self.url}/api/v2/heartbeat")[0] == 200)

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=15)


def test_a_store_that_is_down_during_the_purge_is_retried_until_it_is_back(tmp_path):
    chroma = Stoppable(tmp_path / "chroma")
    instance = own_lethe(chroma.url, tmp_path, '[erasure]\nmax_attempts = 30\nretry_backoff = "200ms"\n')
    try:
        s = subject()
        instance.grant(s)
        name = f"memories-{uuid.uuid4().hex[:8]}"
        instance.client(instance.token("admin")).create_collection(name, embedding_function=None)
        add(instance.agent(s), name, ["x1", "x2"])
        chroma.stop()
        request = erase(instance, s)
        wait_for("a failed attempt", lambda: erasure(instance, request)["targets"][0]["attempts"] >= 2, deadline=20)
        assert erasure(instance, request)["state"] in ("retrying", "propagating")
        chroma.start()
        wait_for("the erasure to complete", lambda: erasure(instance, request)["state"] == "completed", deadline=30)
        import chromadb
        direct = chromadb.HttpClient(host="127.0.0.1", port=chroma.port)
        assert direct.get_collection(name).get(where={"lethe_subject": s})["ids"] == []
    finally:
        instance.stop()
        chroma.stop()


def test_one_erasure_purges_chroma_and_the_apps_postgres_tables_and_certifies_both(chroma, tmp_path):
    import subprocess
    app = new_database()
    gone, kept = subject(), subject()
    subprocess.run(["psql", app, "-qc",
                    "CREATE TABLE memories (tenant_id text, user_id text, fact text);"
                    f"INSERT INTO memories SELECT 'acme', u, 'fact ' || i FROM generate_series(1, 5) i, (VALUES ('{gone}'), ('{kept}')) v(u);"],
                   check=True)
    instance = own_lethe(chroma, tmp_path, f'''
[erasure]
retry_backoff = "200ms"
[[erasure.postgres]]
name = "app"
url = {{ value = "{app}" }}
count = "SELECT count(*) FROM memories WHERE tenant_id = $1 AND user_id = $2"
delete = ["DELETE FROM memories WHERE tenant_id = $1 AND user_id = $2"]
subjects = "SELECT DISTINCT user_id FROM memories WHERE tenant_id = $1"
vacuum = ["memories"]
[[erasure.backups]]
target = "chroma:chroma"
retention = "35d"
[[erasure.backups]]
target = "postgres:app"
retention = "7d"
''')
    try:
        name = f"memories-{uuid.uuid4().hex[:8]}"
        instance.client(instance.token("admin")).create_collection(name, embedding_function=None)
        for s in (gone, kept):
            instance.grant(s)
            add(instance.agent(s), name, [f"{s}-a", f"{s}-b"])
        request = erase(instance, gone)
        done = wait_for("the erasure to complete", lambda: erasure(instance, request)["state"] == "completed" and erasure(instance, request), deadline=30)
        results = {t["target"]: t["result"] for t in done["targets"]}
        assert results["postgres:app"]["before"] == 5 and results["postgres:app"]["remaining"] == 0
        assert "table memories vacuumed and analyzed" in " ".join(results["postgres:app"]["physical"]["done"])
        rows = subprocess.run(["psql", app, "-qtAc", "SELECT user_id, count(*) FROM memories GROUP BY user_id"],
                              check=True, capture_output=True, text=True).stdout.split()
        assert rows == [f"{kept}|5"], "counted directly in PostgreSQL: the other subject keeps all"
        fetched = instance.cli("certificate", request, "--tenant", TENANT)
        certificate = json.loads(fetched.stdout)["certificate"]
        assert sorted(s["target"] for s in certificate["stores"]) == ["chroma:chroma", "postgres:app"]
        # Every copy either store could not remove is named; those without a date are exceptions.
        undated = [f"{s['target']}: {c['place']}" for s in certificate["stores"] for c in s["physical"]["remaining"]
                   if c["until"] is None]
        assert undated and all(any(e.startswith(u) for e in certificate["exceptions"]) for u in undated)
        assert any(u.startswith("postgres:app: pg_wal (segments from LSN ") for u in undated), undated
        assert certificate["final_copy_expiry"] is None, "no final date while some copy has none"
        completed = certificate["completed_at"][:10]
        assert certificate["final_backup_expiry"] > completed, "the latest backup expiry: 35 days after completion"

        # A backup from before the erasure is restored: the subject's data is back in both stores.
        import chromadb
        host, port = chroma.removeprefix("http://").split(":")
        restored = chromadb.HttpClient(host=host, port=int(port)).get_collection(name)
        restored.add(ids=[f"{gone}-a", f"{gone}-b"], embeddings=[[1.0, 1.0, 1.0]] * 2, documents=["back", "again"],
                     metadatas=[{"lethe_subject": gone, "lethe_tenant": TENANT}] * 2)
        subprocess.run(["psql", app, "-qc", f"INSERT INTO memories VALUES ('acme', '{gone}', 'restored')"], check=True)
        replay = instance.cli("replay", "--since", done["requested_at"])
        assert replay.returncode == 0, replay.stdout + replay.stderr
        assert b"1 erasure(s)" in replay.stdout and b"remaining 0" in replay.stdout, replay.stdout
        assert restored.get(where={"lethe_subject": gone})["ids"] == []
        assert restored.get(ids=[f"{gone}-a"])["ids"] == [], "found by lineage id too"
        rows = subprocess.run(["psql", app, "-qtAc", f"SELECT count(*) FROM memories WHERE user_id = '{gone}'"],
                              check=True, capture_output=True, text=True).stdout.strip()
        assert rows == "0"
        assert sorted(restored.get(where={"lethe_subject": kept})["ids"]) == [f"{kept}-a", f"{kept}-b"]
    finally:
        instance.stop()


def test_the_sweeper_deletes_expired_and_revoked_records_but_not_held_ones(chroma, tmp_path):
    import chromadb
    instance = own_lethe(chroma, tmp_path, '[erasure]\nsweep_interval = "200ms"\n')
    try:
        held, free = subject(), subject()
        name = f"memories-{uuid.uuid4().hex[:8]}"
        instance.client(instance.token("admin")).create_collection(name, embedding_function=None)
        grants = {s: instance.grant(s) for s in (held, free)}
        status, _ = instance.call("POST", "/v1/legal-holds", {"subject": held, "reason": "litigation"})
        assert status == 201
        soon = int(time.time()) + 2
        for s in (held, free):
            add(instance.agent(s), name, [f"{s}-short"], metadatas=[{"lethe_expires_at": soon}])
        add(instance.agent(free), name, [f"{free}-long"])
        host, port = chroma.removeprefix("http://").split(":")
        stored = chromadb.HttpClient(host=host, port=int(port)).get_collection(name)
        present = lambda i: stored.get(ids=[i])["ids"] == [i]
        wait_for("the expired record to be swept", lambda: not present(f"{free}-short"), deadline=20)
        # The same pass saw the held subject's record, expired at the same second: it stays.
        assert present(f"{held}-short"), "a legal hold stops the sweeper"
        assert present(f"{free}-long")
        instance.revoke(grants[free])
        wait_for("the revoked subject's records to be swept", lambda: not present(f"{free}-long"), deadline=20)
        assert present(f"{held}-short")
    finally:
        instance.stop()


def test_the_verification_probe_stops_an_erasure_for_review_until_the_copy_is_dealt_with(chroma, tmp_path):
    """A batch job wrote a summary about the subject straight into Chroma, without a stamp: the
    purge cannot attribute it, the probe built from the subject's key finds it, and the erasure
    goes to exception for a person to review instead of completing."""
    instance = own_lethe(chroma, tmp_path, '[erasure]\nretry_backoff = "100ms"\nmax_attempts = 2\nprobes = ["{subject}"]\n')
    try:
        s, other = subject(), subject()
        for who in (s, other):
            instance.grant(who)
        name = f"memories-{uuid.uuid4().hex[:8]}"
        instance.client(instance.token("admin")).create_collection(name, embedding_function=None)
        instance.agent(s).get_collection(name).add(ids=["own-1", "own-2"], embeddings=[[0.1], [0.2]], documents=["likes tea", "lives in Lyon"])
        # Another subject's memory that mentions the erased one is the other subject's: kept.
        instance.agent(other).get_collection(name).add(ids=["mention"], embeddings=[[0.3]], documents=[f"met {s} at the station"])
        host, port = chroma.removeprefix("http://").split(":")
        stored = chromadb.HttpClient(host=host, port=int(port)).get_collection(name)
        stored.add(ids=["copy"], embeddings=[[0.4]], documents=[f"summary of {s}: likes tea, lives in Lyon"])

        request = erase(instance, s)
        target = lambda: next(t for t in erasure(instance, request)["targets"] if t["target"] == "chroma:chroma")
        wait_for("the erasure to stop for review", lambda: erasure(instance, request)["state"] == "exception", deadline=30)
        assert "verification probe found 1 records" in target()["last_error"]
        assert stored.get(ids=["own-1", "own-2"])["ids"] == []
        assert sorted(stored.get(ids=["mention", "copy"])["ids"]) == ["copy", "mention"]
        # Still suppressed: the copy is unstamped, so Lethe never serves it anyway.
        assert instance.agent().get_collection(name).get(ids=["copy"])["ids"] == []
        # A person takes it, removes the copy at its source, and resumes: the store is purged and
        # verified again, and the erasure completes.
        assert instance.cli("erase", "--tenant", TENANT, "--review", request).returncode == 0
        assert erasure(instance, request)["state"] == "manual_review"
        stored.delete(ids=["copy"])
        assert instance.cli("erase", "--tenant", TENANT, "--resume", request).returncode == 0
        wait_for("the resumed erasure to complete", lambda: erasure(instance, request)["state"] == "completed", deadline=30)
        assert stored.get(ids=["mention"])["ids"] == ["mention"]
    finally:
        instance.stop()
