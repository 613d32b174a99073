"""Attacks on the Chroma route, from the next tenant's and the next subject's point of view: other
spellings of a collection, pre-claimed ids, claims of unstamped records, squatting, revival of
expired data, widening filters and erasures that lineage alone would get wrong. Every case asserts
what Chroma itself holds afterwards (a client straight to the server, bypassing Lethe), and where
lineage matters, what the state store holds."""

import subprocess
import time
import uuid

import chromadb
import pytest
from chromadb.config import Settings

from conftest import GLOBEX, TENANT, send, someone, two_tenant_lethe, wait_for

HEADERS = {"X-Lethe-Purpose": "personalization", "X-Lethe-Category": "preference"}


@pytest.fixture(scope="module")
def gate(chroma, tmp_path_factory):
    erasure = '[erasure]\nretry_backoff = "200ms"\nsettle = "100ms"\nsweep_interval = "200ms"\n'
    instance = two_tenant_lethe(chroma, tmp_path_factory.mktemp("attack-chroma"), erasure)
    yield instance
    instance.stop()


@pytest.fixture(scope="module")
def raw_chroma(chroma):
    host, port = chroma.removeprefix("http://").split(":")
    return chromadb.HttpClient(host=host, port=int(port), settings=Settings(anonymized_telemetry=False))


@pytest.fixture
def shared(gate, raw_chroma):
    """A collection both tenants' agents use (Chroma itself has no notion of Lethe's tenants):
    its name, its id, and a view of it straight in Chroma."""
    name = f"shared-{uuid.uuid4().hex[:10]}"
    created = gate.client(gate.token("admin")).create_collection(name, embedding_function=None)
    return name, str(created.id), raw_chroma.get_collection(name, embedding_function=None)



def agent(gate, tenant, subject=None):
    return gate.client(gate.token("agent", subject, tenant=tenant), **HEADERS)


def records(gate, name, tenant, subject=None):
    return agent(gate, tenant, subject).get_collection(name, embedding_function=None)


def add(collection, ids, documents=None, metadatas=None):
    collection.add(ids=ids, embeddings=[[float(i), 1.0, 0.5] for i in range(len(ids))],
                   documents=documents or [f"doc {i}" for i in ids], metadatas=metadatas)


def held(stored, record_id):
    """What Chroma holds under an id: (metadata, document), or None."""
    found = stored.get(ids=[record_id], include=["metadatas", "documents"])
    return (found["metadatas"][0], found["documents"][0]) if found["ids"] else None


def owner(stored, record_id):
    meta = held(stored, record_id)[0] or {}
    return meta.get("lethe_tenant"), meta.get("lethe_subject")


def raw(gate, token, path, body):
    """A hand-written request to the route, for what the client library would never send."""
    return send(f"http://{gate.data}/chroma", "POST", path, body, {"Authorization": f"Bearer {token}", **HEADERS})


def code_of(call):
    """Lethe's error code of a call the client library raised for."""
    with pytest.raises(Exception) as e:
        call()
    for code in ("already_exists", "unstamped_item", "scope_violation", "expired", "invalid_request"):
        if code in str(e.value):
            return code
    raise AssertionError(f"no Lethe code in {e.value!r}")


def lineage_rows(gate, record_id):
    """Live lineage rows for an id, straight from the state store: (tenant, subject)."""
    out = subprocess.run(["psql", gate.state_url, "-qtAc",
                          f"SELECT tenant || '/' || subject FROM items WHERE item_id = '{record_id}' AND deleted_at IS NULL"],
                         check=True, capture_output=True, text=True).stdout.split()
    return out


def lineage_settles(gate, record_id, expected):
    """Lineage is written off the request path: waits until the id's rows are `expected`."""
    wait_for(f"lineage of {record_id} to be {expected}", lambda: lineage_rows(gate, record_id) == expected, deadline=10)


def erase(gate, tenant, subject):
    """Each store's result of the subject's completed erasure."""
    return gate.erase_to_completion(subject, tenant)[1]


def spellings(collection_id):
    u = uuid.UUID(collection_id)
    return [
        collection_id.upper(),
        u.hex,
        "{" + collection_id + "}",
        "urn:uuid:" + collection_id,
        "%7B" + collection_id + "%7D",
        "%" + format(ord(collection_id[0]), "X") + collection_id[1:],
        collection_id.replace("-", "%2D", 1),
    ]


def test_another_spelling_of_a_collection_reaches_nothing(gate, shared):
    name, collection_id, stored = shared
    victim = someone()
    gate.grant(victim)
    add(records(gate, name, TENANT, victim), ["a1"], documents=["acme's secret"])
    attacker = someone(GLOBEX)
    gate.grant(attacker, tenant=GLOBEX)
    token = gate.token("agent", attacker, tenant=GLOBEX)
    base = "/api/v2/tenants/default_tenant/databases/default_database/collections"
    for spelling in spellings(collection_id):
        for op, body in (("update", {"ids": ["a1"], "metadatas": [{"x": 1}], "documents": ["globex now"]}),
                         ("upsert", {"ids": ["a1"], "embeddings": [[0.0, 0.0, 0.0]], "documents": ["globex now"]}),
                         ("get", {"ids": ["a1"], "include": ["documents"]}),
                         ("delete", {"ids": ["a1"]})):
            status, answer = raw(gate, token, f"{base}/{spelling}/{op}", body)
            assert (status, answer["error"]["code"]) == (400, "invalid_request"), (spelling, op, answer)
    assert held(stored, "a1")[1] == "acme's secret"
    assert owner(stored, "a1") == (TENANT, victim)
    lineage_settles(gate, "a1", [f"{TENANT}/{victim}"])
    # The owner's own writes under another spelling are refused too: lineage only ever holds the
    # canonical id, which purges and the sweeper compare with.
    status, _ = raw(gate, gate.token("agent", victim), f"{base}/{collection_id.upper()}/add",
                    {"ids": ["a2"], "embeddings": [[1.0, 1.0, 1.0]], "documents": ["x"]})
    assert status == 400
    assert held(stored, "a2") is None


def test_an_update_of_a_missing_id_claims_nothing(gate, shared):
    name, _, stored = shared
    owner_subject, squatter, neighbour = someone(), someone(GLOBEX), someone()
    gate.grant(owner_subject)
    gate.grant(neighbour)
    gate.grant(squatter, tenant=GLOBEX)
    for subject, tenant, record_id in ((squatter, GLOBEX, "pre-1"), (neighbour, TENANT, "pre-2")):
        records(gate, name, tenant, subject).update(ids=[record_id], metadatas=[{"claim": True}])
        assert held(stored, record_id) is None

    mine = records(gate, name, TENANT, owner_subject)
    add(mine, ["pre-1", "pre-2"], documents=["the owner's 1", "the owner's 2"])
    for subject, tenant, record_id in ((squatter, GLOBEX, "pre-1"), (neighbour, TENANT, "pre-2")):
        theirs = records(gate, name, tenant, subject)
        assert theirs.get(ids=[record_id])["ids"] == []
        assert code_of(lambda: theirs.update(ids=[record_id], metadatas=[{"claim": True}])) == "scope_violation"
        assert code_of(lambda: theirs.upsert(ids=[record_id], embeddings=[[0.0, 0.0, 0.0]], documents=["mine"])) == "scope_violation"
        assert owner(stored, record_id) == (TENANT, owner_subject)
    mine.upsert(ids=["pre-1"], embeddings=[[2.0, 2.0, 2.0]], documents=["the owner's, again"])
    assert held(stored, "pre-1")[1] == "the owner's, again"
    # The would-be claimants' updates left no lineage that could outlive the owner's.
    lineage_settles(gate, "pre-1", [f"{TENANT}/{owner_subject}"])
    lineage_settles(gate, "pre-2", [f"{TENANT}/{owner_subject}"])

    # The squatter's erasure takes nothing of the owner's; the owner's takes everything.
    assert erase(gate, GLOBEX, squatter)["chroma:chroma"]["before"] == 0
    assert held(stored, "pre-1") is not None
    counts = erase(gate, TENANT, owner_subject)["chroma:chroma"]
    assert (counts["before"], counts["deleted"], counts["remaining"]) == (2, 2, 0)
    assert held(stored, "pre-1") is None and held(stored, "pre-2") is None


def test_an_unstamped_record_is_never_claimed(gate, shared):
    name, _, stored = shared
    stored.add(ids=["raw-1"], embeddings=[[1.0, 2.0, 3.0]], documents=["written around Lethe"])
    for tenant in (TENANT, GLOBEX):
        claimant = someone(tenant)
        gate.grant(claimant, tenant=tenant)
        theirs = records(gate, name, tenant, claimant)
        assert code_of(lambda: theirs.update(ids=["raw-1"], metadatas=[{"mine": True}])) == "unstamped_item"
        assert code_of(lambda: theirs.upsert(ids=["raw-1"], embeddings=[[0.0, 0.0, 0.0]])) == "unstamped_item"
        assert code_of(lambda: add(theirs, ["raw-1"])) == "already_exists"
        assert theirs.get(ids=["raw-1"])["ids"] == []
        # A write of its own after the refused ones: once its lineage is in, theirs would be too.
        mark = f"mark-{uuid.uuid4().hex[:8]}"
        add(theirs, [mark])
        lineage_settles(gate, mark, [f"{tenant}/{claimant}"])
    meta, document = held(stored, "raw-1")
    assert not (meta or {}).get("lethe_subject") and document == "written around Lethe"
    assert lineage_rows(gate, "raw-1") == []


def test_squatting_an_id_is_refused_and_writes_nothing(gate, shared):
    name, _, stored = shared
    first, second = someone(), someone(GLOBEX)
    gate.grant(first)
    gate.grant(second, tenant=GLOBEX)
    add(records(gate, name, TENANT, first), ["sq-1"], documents=["the first writer's"])
    theirs = records(gate, name, GLOBEX, second)
    assert code_of(lambda: add(theirs, ["sq-1"])) == "already_exists"
    # One taken id refuses the whole request: the free one is not written either.
    assert code_of(lambda: add(theirs, ["sq-free", "sq-1"])) == "already_exists"
    assert held(stored, "sq-free") is None
    # The owner's own second add of an id would be lost by Chroma: refused too.
    assert code_of(lambda: add(records(gate, name, TENANT, first), ["sq-1"], documents=["again"])) == "already_exists"
    assert held(stored, "sq-1")[1] == "the first writer's"
    assert owner(stored, "sq-1") == (TENANT, first)
    add(theirs, ["sq-after"])
    lineage_settles(gate, "sq-after", [f"{GLOBEX}/{second}"])
    assert lineage_rows(gate, "sq-1") == [f"{TENANT}/{first}"] and lineage_rows(gate, "sq-free") == []
    # Two records under one id in one request: Chroma would keep one of them silently.
    token = gate.token("agent", second, tenant=GLOBEX)
    status, answer = raw(gate, token, f"/api/v2/tenants/default_tenant/databases/default_database/collections/{shared[1]}/add",
                         {"ids": ["dup", "dup"], "embeddings": [[1.0], [2.0]], "documents": ["a", "b"]})
    assert (status, answer["error"]["code"]) == (400, "invalid_request")
    assert held(stored, "dup") is None


def test_retention_counts_from_the_first_write_and_an_expired_record_stays_dead(gate, shared):
    name, _, stored = shared
    s = someone()
    gate.grant(s)
    mine = records(gate, name, TENANT, s)
    deadline = int(time.time()) + 3600
    add(mine, ["ret-1"], metadatas=[{"lethe_expires_at": deadline}])
    mine.upsert(ids=["ret-1"], embeddings=[[5.0, 5.0, 5.0]], documents=["rewritten"])
    mine.update(ids=["ret-1"], metadatas=[{"topic": "tea"}])
    meta, document = held(stored, "ret-1")
    assert (meta["lethe_expires_at"], meta["topic"], document) == (deadline, "tea", "rewritten")

    # A legal hold keeps the sweeper away, so that the expired record is still in Chroma when
    # its owner tries to bring it back.
    status, hold = gate.call("POST", "/v1/legal-holds", {"subject": s, "reason": "litigation"})
    assert status == 201, hold
    soon = int(time.time()) + 2
    add(mine, ["exp-1"], documents=["short-lived"], metadatas=[{"lethe_expires_at": soon}])
    wait_for("the record to expire", lambda: time.time() > soon + 1, deadline=10)
    assert code_of(lambda: mine.update(ids=["exp-1"], metadatas=[{"topic": "tea"}])) == "expired"
    assert code_of(lambda: mine.upsert(ids=["exp-1"], embeddings=[[1.0, 1.0, 1.0]])) == "expired"
    assert code_of(lambda: mine.upsert(ids=["exp-1"], embeddings=[[1.0, 1.0, 1.0]], documents=["new"])) == "expired"
    assert mine.get(ids=["exp-1"])["ids"] == []
    meta, document = held(stored, "exp-1")
    assert (meta["lethe_expires_at"], meta.get("topic"), document) == (soon, None, "short-lived")
    # Once the hold is released the sweeper deletes it.
    status, _ = gate.call("POST", f"/v1/legal-holds/{hold['id']}/release")
    assert status == 200
    wait_for("the sweeper to delete the expired record", lambda: held(stored, "exp-1") is None, deadline=15)
    assert held(stored, "ret-1") is not None


def test_widening_filters_reach_nothing_of_another_tenant_or_subject(gate, shared):
    name, _, stored = shared
    victim, bound_neighbour = someone(), someone()
    gate.grant(victim)
    gate.grant(bound_neighbour)
    add(records(gate, name, TENANT, victim), ["w1", "w2"], documents=["acme w1", "acme w2"])
    service = agent(gate, GLOBEX).get_collection(name, embedding_function=None)  # a service token of globex
    neighbour = records(gate, name, TENANT, bound_neighbour)
    for reader in (service, neighbour):
        for where in ({"$or": [{"lethe_tenant": TENANT}, {"lethe_tenant": GLOBEX}]},
                      {"lethe_tenant": {"$ne": "nobody"}},
                      {"lethe_subject": victim},
                      {"lethe_owner": f"{TENANT}/{victim}"},
                      {"lethe_expires_at": {"$gt": 0}}):
            assert reader.get(where=where)["ids"] == []
            assert reader.query(query_embeddings=[[0.0, 1.0, 0.5]], n_results=5, where=where)["ids"] == [[]]
            reader.delete(where=where)
        assert reader.get(ids=["w1", "w2"])["ids"] == []
        assert reader.query(query_embeddings=[[0.0, 1.0, 0.5]], n_results=5, where_document={"$contains": "acme"})["ids"] == [[]]
        assert reader.count() == 0
        reader.delete(ids=["w1", "w2"])
    assert sorted(stored.get(ids=["w1", "w2"])["ids"]) == ["w1", "w2"]
    assert owner(stored, "w1") == (TENANT, victim)


def test_an_owner_key_only_finds_candidates_and_the_stamp_decides(gate, shared):
    """A subject's reads are found by its owner key (`tenant/subject`), but that key is only an
    index: a record stamped as another tenant's, planted straight in Chroma with this subject's
    owner key, is never served to it, counted for it, or deleted by it."""
    name, _, stored = shared
    s = someone()
    gate.grant(s)
    gate.grant(s, tenant=GLOBEX)
    add(records(gate, name, GLOBEX, s), ["theirs"], documents=["globex's own"])
    assert held(stored, "theirs")[0]["lethe_owner"] == f"{GLOBEX}/{s}"
    stored.update(ids=["theirs"], metadatas=[{"lethe_owner": f"{TENANT}/{s}"}])
    mine = records(gate, name, TENANT, s)
    assert mine.get()["ids"] == []
    assert mine.get(ids=["theirs"])["ids"] == []
    assert mine.query(query_embeddings=[[0.0, 1.0, 0.5]], n_results=5)["ids"] == [[]]
    assert mine.count() == 0
    mine.delete(ids=["theirs"])
    meta, document = held(stored, "theirs")
    assert (meta["lethe_tenant"], meta["lethe_subject"], document) == (GLOBEX, s, "globex's own")


def test_another_owners_retention_never_sweeps_a_record(gate, shared):
    """Lineage says an id is acme's and short-lived; Chroma holds it under globex's stamp (acme's
    record was deleted around Lethe, then globex wrote the free id). The sweeper acts on acme's
    lineage row but leaves globex's record: the stamp in the store decides whose it is."""
    name, _, stored = shared
    first, second = someone(), someone(GLOBEX)
    gate.grant(first)
    gate.grant(second, tenant=GLOBEX)
    soon = int(time.time()) + 2
    add(records(gate, name, TENANT, first), ["reused"], metadatas=[{"lethe_expires_at": soon}])
    lineage_settles(gate, "reused", [f"{TENANT}/{first}"])
    stored.delete(ids=["reused"])
    add(records(gate, name, GLOBEX, second), ["reused"], documents=["globex's, for 30 days"])
    assert owner(stored, "reused") == (GLOBEX, second)
    wait_for("the sweeper to take up acme's expired lineage row", lambda: lineage_rows(gate, "reused") == [], deadline=15)
    assert held(stored, "reused")[1] == "globex's, for 30 days"
    assert records(gate, name, GLOBEX, second).get(ids=["reused"])["ids"] == ["reused"]


def test_collections_of_their_own_tell_nothing_of_another_tenants(chroma, tmp_path):
    """`isolation = "collection_per_tenant"`: acme and globex both keep a collection they call
    `notes`, in Chroma databases of their own; each sees its own count and list, by its own names;
    another tenant's collection id (a global capability in Chroma itself) reaches nothing, by any
    operation; an erasure purges acme's records. Counted in Chroma."""
    from conftest import own_lethe
    gate = own_lethe(chroma, tmp_path, '[erasure]\nsettle = "100ms"\n',
                     chroma_settings='isolation = "collection_per_tenant"\n')
    try:
        rules = {"rules": [{"purpose": "personalization", "category": "preference", "max_age": "30d"}]}
        assert gate.call("PUT", "/v1/retention-rules", rules, token=gate.token("compliance", tenant=GLOBEX))[0] == 200
        name = f"notes-{uuid.uuid4().hex[:8]}"
        made = {t: gate.client(gate.token("admin", tenant=t)).create_collection(name, embedding_function=None)
                for t in (TENANT, GLOBEX)}
        ids = {t: str(c.id) for t, c in made.items()}
        assert ids[TENANT] != ids[GLOBEX]
        people = {TENANT: someone(), GLOBEX: someone(GLOBEX)}
        for tenant, s in people.items():
            gate.grant(s, tenant=tenant)
        add(records(gate, name, TENANT, people[TENANT]), ["a1", "a2", "a3"])
        add(records(gate, name, GLOBEX, people[GLOBEX]), ["g1"])

        # In Chroma: two databases of Lethe's, one collection `notes` in each.
        from conftest import http
        host, port = chroma.removeprefix("http://").split(":")
        in_database = lambda database: chromadb.HttpClient(host=host, port=int(port), database=database,
                                                           settings=Settings(anonymized_telemetry=False))
        databases = [d["name"] for d in http("GET", f"{chroma}/api/v2/tenants/default_tenant/databases")[1]
                     if d["name"].endswith("__default_database")]
        assert len(databases) >= 2, databases
        per_database = {}
        for database in databases:
            client = in_database(database)
            if name in [c.name for c in client.list_collections()]:
                per_database[database] = client.get_collection(name, embedding_function=None).count()
        assert sorted(per_database.values()) == [1, 3], per_database

        # Each tenant's own view, by its own names.
        for tenant, count in ((TENANT, 3), (GLOBEX, 1)):
            mine = records(gate, name, tenant, people[tenant])
            assert mine.count() == count and str(mine.id) == ids[tenant]
            assert mine.database == "default_database" and mine.tenant == "default_tenant"
            admin = gate.client(gate.token("admin", tenant=tenant))
            assert [c.name for c in admin.list_collections() if c.name.startswith("notes-")] == [name]
            listed = send(f"http://{gate.data}/chroma", "GET", "/api/v2/tenants/default_tenant/databases", None,
                          {"Authorization": f"Bearer {gate.token('admin', tenant=tenant)}"})[1]
            assert [d["name"] for d in listed] == ["default_database"], listed

        # acme's collection id, in globex's hands: nothing exists there, whatever the operation.
        theirs, path = ids[TENANT], f"/api/v2/tenants/default_tenant/databases/default_database/collections/{ids[TENANT]}"
        token, admin = gate.token("agent", people[GLOBEX], tenant=GLOBEX), gate.token("admin", tenant=GLOBEX)
        for op, body in (("get", {}), ("query", {"query_embeddings": [[1.0, 1.0, 0.5]], "n_results": 3}),
                         ("add", {"ids": ["x"], "embeddings": [[1.0, 1.0, 0.5]]}), ("delete", {"ids": ["a1"]})):
            status, answer = raw(gate, token, f"{path}/{op}", body)
            assert status == 404 and "lethe_" not in str(answer), (op, status, answer)
        status, answer = send(f"http://{gate.data}/chroma", "GET", f"{path}/count", None, {"Authorization": f"Bearer {token}", **HEADERS})
        assert status == 404, answer
        status, answer = send(f"http://{gate.data}/chroma", "PUT", path, {"new_metadata": {"pwn": 1}}, {"Authorization": f"Bearer {admin}"})
        assert status == 404, answer
        acme = in_database(next(d for d, n in per_database.items() if n == 3)).get_collection(name, embedding_function=None)
        assert acme.count() == 3 and not acme.metadata, "nothing of acme's was read, written or changed"

        # The erasure of acme's subject purges acme's records; globex's stays.
        gate.erase_to_completion(people[TENANT])
        assert acme.count() == 0
        globex = in_database(next(d for d, n in per_database.items() if n == 1)).get_collection(name, embedding_function=None)
        assert globex.count() == 1, "globex's record stays"

        # What the official client asks first (who am I) names the client's tenant and database.
        identity = gate.client(gate.token("admin", tenant=GLOBEX)).get_user_identity()
        assert (identity.tenant, identity.databases) == ("default_tenant", ["default_database"]), identity

        # A refused request (an agent managing collections) makes no database for a tenant new here.
        def physical_databases():
            return sorted(d["name"] for d in http("GET", f"{chroma}/api/v2/tenants/default_tenant/databases")[1])
        before = physical_databases()
        fresh = "initech"
        status, answer = send(f"http://{gate.data}/chroma", "POST",
                              "/api/v2/tenants/default_tenant/databases/default_database/collections", {"name": "x"},
                              {"Authorization": f"Bearer {gate.token('agent', someone(fresh), tenant=fresh)}", **HEADERS})
        assert status == 403, answer
        assert physical_databases() == before

        # globex drops its default database: its next use makes it again, empty.
        admin = gate.token("admin", tenant=GLOBEX)
        status, answer = send(f"http://{gate.data}/chroma", "DELETE",
                              "/api/v2/tenants/default_tenant/databases/default_database", None,
                              {"Authorization": f"Bearer {admin}"})
        assert status == 200, answer
        assert len(physical_databases()) == len(before) - 1
        again = gate.client(admin)
        assert [c.name for c in again.list_collections()] == []
        again.create_collection(name, embedding_function=None)
        assert [c.name for c in again.list_collections()] == [name]
    finally:
        gate.stop()
