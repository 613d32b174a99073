"""The Qdrant route, driven with the official `qdrant-client` (REST) against a real Qdrant: points
are decided and stamped as they are written, every read is narrowed and decided again, and what
the caller may not see is neither read, counted, overwritten nor deleted (counted straight in
Qdrant). An erasure hides the subject at once and then deletes its points."""

import uuid
from datetime import datetime, timedelta, timezone

import pytest
from qdrant_client import models
from qdrant_client.http.exceptions import UnexpectedResponse

from conftest import GLOBEX, TENANT, own_lethe, someone, wait_for

DIM = 3


@pytest.fixture(scope="module")
def lethe(chroma, qdrant, tmp_path_factory):
    erasure = '[erasure]\nretry_backoff = "200ms"\n\n[[erasure.backups]]\ntarget = "qdrant:qdrant"\nretention = "35d"\n'
    instance = own_lethe(chroma, tmp_path_factory.mktemp("lethe-qdrant"), erasure, qdrant_url=qdrant.url)
    rules = {"rules": [{"purpose": "personalization", "category": "preference", "max_age": "30d"}]}
    status, _ = instance.call("PUT", "/v1/retention-rules", rules, token=instance.token("compliance", tenant=GLOBEX))
    assert status == 200
    yield instance
    instance.stop()


@pytest.fixture
def collection(lethe):
    name = f"memories-{uuid.uuid4().hex[:8]}"
    lethe.qdrant(lethe.token("admin")).create_collection(
        name, vectors_config=models.VectorParams(size=DIM, distance=models.Distance.COSINE))
    return name


def refused(call):
    """The status and Lethe's error code of a call the client raised for."""
    with pytest.raises(UnexpectedResponse) as e:
        call()
    import json
    body = json.loads(e.value.content or b"{}")
    return e.value.status_code, body.get("error", {}).get("code")


def points(n, text):
    return [models.PointStruct(id=str(uuid.uuid4()), vector=[1.0, float(i), 0.5], payload={"data": f"{text} {i}"})
            for i in range(n)]


def stored(qdrant, collection, subject):
    """The points Qdrant itself holds for a subject."""
    only = models.Filter(must=[models.FieldCondition(key="lethe_subject", match=models.MatchValue(value=subject))])
    return qdrant.client().scroll(collection, scroll_filter=only, limit=100, with_payload=True)[0]


def test_the_clients_version_check_passes_through_lethe(lethe):
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # the client only warns when it cannot read the version
        client = lethe.qdrant_agent(someone())
    assert [str(w.message) for w in caught if issubclass(w.category, UserWarning)] == []
    assert client.collection_exists("no-such-collection") is False


def test_points_are_stamped_and_each_subject_reads_only_its_own(lethe, qdrant, collection):
    alice, bob = someone(), someone()
    for s in (alice, bob):
        lethe.grant(s)
    lethe.qdrant_agent(alice).upsert(collection, points(3, "alice note"))
    bobs = points(2, "bob note")
    lethe.qdrant_agent(bob).upsert(collection, bobs)
    indexed = qdrant.client().get_collection(collection).payload_schema
    assert {"lethe_tenant", "lethe_subject", "lethe_expires_at"} <= set(indexed), "Lethe indexed the stamp"
    held = stored(qdrant, collection, alice)
    assert len(held) == 3
    stamp = held[0].payload
    assert (stamp["lethe_tenant"], stamp["lethe_purpose"], stamp["lethe_category"]) == (TENANT, "personalization", "preference")
    assert stamp["lethe_expires_at"] > 0

    as_alice = lethe.qdrant_agent(alice)
    found = as_alice.query_points(collection, query=[1.0, 0.0, 0.5], limit=10, with_payload=True).points
    assert len(found) == 3 and all(p.payload["data"].startswith("alice note") for p in found)
    bare = as_alice.query_points(collection, query=[1.0, 0.0, 0.5], limit=10, with_payload=False).points
    assert len(bare) == 3 and all(p.payload is None for p in bare), "no payload when none is asked for"
    prefetched = as_alice.query_points(collection, prefetch=[models.Prefetch(query=[1.0, 1.0, 0.5], limit=10)],
                                       query=models.FusionQuery(fusion=models.Fusion.RRF), limit=10).points
    assert len(prefetched) == 3
    batch = as_alice.query_batch_points(collection, requests=[
        models.QueryRequest(query=[1.0, 0.0, 0.5], limit=10, with_payload=True),
        models.QueryRequest(query=[0.0, 1.0, 0.5], limit=10)])
    assert [len(r.points) for r in batch] == [3, 3], "each query of a batch sees alice's points only"
    assert all(p.payload["data"].startswith("alice note") for p in batch[0].points)
    assert len(as_alice.scroll(collection, limit=100)[0]) == 3
    assert as_alice.count(collection, exact=True).count == 3
    got = as_alice.retrieve(collection, ids=[bobs[0].id, held[0].id])
    assert [p.id for p in got] == [held[0].id], "bob's point is not retrieved"
    assert got[0].payload["data"].startswith("alice note")
    assert refused(lambda: as_alice.http.points_api.get_point(collection, bobs[0].id))[0] == 404
    # Another tenant sees nothing, and counts nothing.
    carol = someone(GLOBEX)
    lethe.grant(carol, tenant=GLOBEX)
    as_carol = lethe.qdrant(lethe.token("agent", carol, tenant=GLOBEX),
                            **{"X-Lethe-Purpose": "personalization", "X-Lethe-Category": "preference"})
    assert as_carol.query_points(collection, query=[1.0, 0.0, 0.5], limit=10).points == []
    assert as_carol.count(collection).count == 0


def test_writes_that_would_take_over_or_escape_the_scope_are_refused_and_qdrant_is_untouched(lethe, qdrant, collection):
    alice, bob = someone(), someone()
    for s in (alice, bob):
        lethe.grant(s)
    bobs = points(1, "bob's secret")
    lethe.qdrant_agent(bob).upsert(collection, bobs)
    as_alice = lethe.qdrant_agent(alice)
    takeover = models.PointStruct(id=bobs[0].id, vector=[0.0, 0.0, 1.0], payload={"data": "mine now"})
    assert refused(lambda: as_alice.upsert(collection, [takeover])) == (403, "scope_violation")
    # A spelling of the same point that Qdrant would take.
    upper = models.PointStruct(id=bobs[0].id.upper(), vector=[0.0, 0.0, 1.0], payload={"data": "mine now"})
    assert refused(lambda: as_alice.upsert(collection, [upper]))[0] == 400
    named = models.PointStruct(id=str(uuid.uuid4()), vector=[0.0, 0.0, 1.0], payload={"lethe_subject": bob})
    assert refused(lambda: as_alice.upsert(collection, [named])) == (403, "scope_violation")
    # An unstamped point written straight into Qdrant is no one's to claim.
    loose = str(uuid.uuid4())
    qdrant.client().upsert(collection, [models.PointStruct(id=loose, vector=[1.0, 1.0, 1.0], payload={"data": "loose"})])
    claim = models.PointStruct(id=loose, vector=[1.0, 1.0, 1.0], payload={"data": "claimed"})
    assert refused(lambda: as_alice.upsert(collection, [claim])) == (403, "unstamped_item")
    direct = qdrant.client()
    assert direct.retrieve(collection, ids=[bobs[0].id], with_payload=True)[0].payload["data"] == "bob's secret 0"
    assert direct.retrieve(collection, ids=[loose], with_payload=True)[0].payload["data"] == "loose"
    assert stored(qdrant, collection, alice) == []
    # Managing collections needs admin; what Lethe does not govern yet is refused.
    assert refused(lambda: as_alice.create_collection(
        f"x-{uuid.uuid4().hex[:6]}", vectors_config=models.VectorParams(size=DIM, distance=models.Distance.COSINE)))[0] == 403
    assert refused(lambda: as_alice.set_payload(collection, payload={"lethe_subject": alice}, points=[bobs[0].id])) == \
        (400, "invalid_request")
    assert refused(lambda: as_alice.query_points(collection, query=bobs[0].id, limit=3))[0] == 404, \
        "a point id as the query would read bob's vector"


def test_every_search_api_sees_only_the_callers_points_and_names_only_its_own(lethe, qdrant, collection):
    alice, bob = someone(), someone()
    for s in (alice, bob):
        lethe.grant(s)
    topics = ["tea", "tea", "cake"]
    mine = [models.PointStruct(id=str(uuid.uuid4()), vector=[1.0, float(i), 0.5], payload={"data": f"alice {i}", "topic": t})
            for i, t in enumerate(topics)]
    as_alice = lethe.qdrant_agent(alice)
    as_alice.upsert(collection, mine)
    bobs = [models.PointStruct(id=str(uuid.uuid4()), vector=[1.0, float(i), 0.5], payload={"data": f"bob {i}", "topic": "tea"})
            for i in range(4)]
    lethe.qdrant_agent(bob).upsert(collection, bobs)
    own = {p.id for p in mine}
    ids = lambda found: {str(p.id) for p in found}

    # A point of one's own may be the query, an example or a target; another's may not.
    assert ids(as_alice.query_points(collection, query=mine[0].id, limit=10).points) == own - {mine[0].id}
    recommended = as_alice.query_points(collection, query=models.RecommendQuery(
        recommend=models.RecommendInput(positive=[mine[0].id], negative=[mine[2].id])), limit=10).points
    assert ids(recommended) <= own
    for names_bobs in (
            lambda: as_alice.query_points(collection, query=models.RecommendQuery(
                recommend=models.RecommendInput(positive=[mine[0].id, bobs[0].id])), limit=10),
            lambda: as_alice.query_points(collection, query=models.DiscoverQuery(discover=models.DiscoverInput(
                target=bobs[1].id, context=[models.ContextPair(positive=mine[0].id, negative=mine[1].id)])), limit=10),
            lambda: as_alice.query_points(collection, query=bobs[0].id, limit=3,
                                          lookup_from=models.LookupLocation(collection=collection))):
        assert refused(names_bobs)[0] == 404
    # The older routes the server still serves.
    api = as_alice.http.search_api
    old = api.search_points(collection, search_request=models.SearchRequest(vector=[1.0, 0.0, 0.5], limit=10, with_payload=True)).result
    assert ids(old) == own and all(p.payload["data"].startswith("alice") for p in old)
    batch = api.search_batch_points(collection, search_request_batch=models.SearchRequestBatch(searches=[
        models.SearchRequest(vector=[1.0, 0.0, 0.5], limit=10), models.SearchRequest(vector=[0.0, 1.0, 0.5], limit=10)])).result
    assert [ids(r) for r in batch] == [own, own]
    rec = api.recommend_points(collection, recommend_request=models.RecommendRequest(positive=[mine[1].id], limit=10)).result
    assert ids(rec) <= own and ids(rec)
    assert refused(lambda: api.recommend_points(collection, recommend_request=models.RecommendRequest(positive=[bobs[0].id], limit=10)))[0] == 404
    disc = api.discover_points(collection, discover_request=models.DiscoverRequest(
        target=mine[0].id, context=[models.ContextExamplePair(positive=mine[1].id, negative=mine[2].id)], limit=10)).result
    assert ids(disc) <= own
    # Groups: only alice's hits, and counts of alice's values only.
    groups = as_alice.query_points_groups(collection, group_by="topic", query=[1.0, 0.0, 0.5], limit=10, group_size=10).groups
    assert {g.id: len(g.hits) for g in groups} == {"tea": 2, "cake": 1}
    old_groups = api.search_point_groups(collection, search_groups_request=models.SearchGroupsRequest(
        vector=[1.0, 0.0, 0.5], group_by="topic", group_size=10, limit=10)).result.groups
    assert {g.id: len(g.hits) for g in old_groups} == {"tea": 2, "cake": 1}
    facet = as_alice.facet(collection, key="topic")
    assert {h.value: h.count for h in facet.hits} == {"tea": 2, "cake": 1}, "bob's four teas are not counted"
    assert {h.value: h.count for h in qdrant.client().facet(collection, key="lethe_subject").hits} == {alice: 3, bob: 4}
    pairs = as_alice.search_matrix_pairs(collection, sample=10, limit=5).pairs
    assert pairs and all({str(p.a), str(p.b)} <= own for p in pairs)
    offsets = as_alice.search_matrix_offsets(collection, sample=10, limit=5)
    assert set(map(str, offsets.ids)) == own and max(offsets.offsets_row) < len(offsets.ids)


STAMP = {"lethe_tenant", "lethe_subject", "lethe_purpose", "lethe_category", "lethe_expires_at", "lethe_epoch", "lethe_layer"}


def test_payload_and_vector_edits_reach_only_the_callers_points_and_keep_the_stamp(lethe, qdrant, collection):
    alice, bob = someone(), someone()
    for s in (alice, bob):
        lethe.grant(s)
    a1, a2 = points(2, "alice")
    as_alice = lethe.qdrant_agent(alice)
    as_alice.upsert(collection, [a1, a2])
    (b1,) = points(1, "bob")
    lethe.qdrant_agent(bob).upsert(collection, [b1])
    direct = qdrant.client()
    held = lambda pid: direct.retrieve(collection, ids=[pid], with_payload=True, with_vectors=True)[0]
    bobs_before = held(b1.id)

    as_alice.set_payload(collection, payload={"mood": "happy"}, points=[a1.id])
    assert held(a1.id).payload["mood"] == "happy" and STAMP <= set(held(a1.id).payload)
    as_alice.overwrite_payload(collection, payload={"data": "rewritten"}, points=[a1.id])
    assert set(held(a1.id).payload) == STAMP | {"data"}, "an overwrite keeps the stamp"
    as_alice.delete_payload(collection, keys=["data"], points=[a2.id])
    as_alice.clear_payload(collection, points_selector=models.PointIdsList(points=[a2.id]))
    assert set(held(a2.id).payload) == STAMP, "a clear keeps the stamp"
    as_alice.update_vectors(collection, points=[models.PointVectors(id=a1.id, vector=[0.0, 0.0, 1.0])])
    assert held(a1.id).vector != a1.vector
    # A filter selects only what the caller may see: bob's point stays as it was.
    as_alice.set_payload(collection, payload={"seen": True}, points=models.Filter(must=[]))
    as_alice.clear_payload(collection, points_selector=models.FilterSelector(filter=models.Filter(must=[])))
    assert held(b1.id) == bobs_before
    assert {k for p in (a1, a2) for k in held(p.id).payload} == STAMP
    # Bob's point cannot be named: not found, as if it did not exist; Qdrant is untouched.
    for edit in (lambda: as_alice.set_payload(collection, payload={"data": "mine"}, points=[b1.id]),
                 lambda: as_alice.overwrite_payload(collection, payload={}, points=[a1.id, b1.id]),
                 lambda: as_alice.update_vectors(collection, points=[models.PointVectors(id=b1.id, vector=[1.0, 1.0, 1.0])])):
        assert refused(edit)[0] == 404
    for stamp_edit in (lambda: as_alice.delete_payload(collection, keys=["lethe_expires_at"], points=[a1.id]),
                       lambda: as_alice.set_payload(collection, payload={"x": 1}, key="lethe_tenant", points=[a1.id])):
        assert refused(stamp_edit) == (400, "invalid_request")
    assert held(b1.id) == bobs_before and STAMP <= set(held(a1.id).payload)
    assert len(stored(qdrant, collection, alice)) == 2


def test_a_batch_is_decided_whole_before_qdrant_sees_it(lethe, qdrant, collection):
    alice, bob = someone(), someone()
    for s in (alice, bob):
        lethe.grant(s)
    a1, a2, a3 = points(3, "alice")
    as_alice = lethe.qdrant_agent(alice)
    as_alice.upsert(collection, [a1, a2])
    (b1,) = points(1, "bob")
    lethe.qdrant_agent(bob).upsert(collection, [b1])
    results = as_alice.batch_update_points(collection, update_operations=[
        models.UpsertOperation(upsert=models.PointsList(points=[a3])),
        models.SetPayloadOperation(set_payload=models.SetPayload(payload={"tag": "new"}, points=[a3.id])),
        models.DeleteOperation(delete=models.PointIdsList(points=[a2.id, b1.id])),
    ])
    assert [r.status for r in results] == [models.UpdateStatus.COMPLETED] * 3
    mine = {str(p.id): p.payload for p in stored(qdrant, collection, alice)}
    assert set(mine) == {a1.id, a3.id} and mine[a3.id]["tag"] == "new"
    assert len(stored(qdrant, collection, bob)) == 1, "bob's point was not deleted"
    assert lethe.call("GET", f"/v1/subjects/{TENANT}/{alice}")[1]["inventory"]["qdrant"] == 2
    # A takeover in the second operation refuses the whole batch: the first did not run either.
    takeover = models.PointStruct(id=b1.id, vector=[0.0, 0.0, 1.0], payload={"data": "mine"})
    assert refused(lambda: as_alice.batch_update_points(collection, update_operations=[
        models.DeleteOperation(delete=models.PointIdsList(points=[a1.id])),
        models.UpsertOperation(upsert=models.PointsList(points=[takeover])),
    ])) == (403, "scope_violation")
    assert {str(p.id) for p in stored(qdrant, collection, alice)} == {a1.id, a3.id}
    assert stored(qdrant, collection, bob)[0].payload["data"] == "bob 0"


def test_a_delete_removes_only_what_the_caller_may_see(lethe, qdrant, collection):
    alice, bob = someone(), someone()
    for s in (alice, bob):
        lethe.grant(s)
    lethe.qdrant_agent(alice).upsert(collection, points(2, "alice"))
    bobs = points(2, "bob")
    lethe.qdrant_agent(bob).upsert(collection, bobs)
    as_alice = lethe.qdrant_agent(alice)
    as_alice.delete(collection, points_selector=models.FilterSelector(filter=models.Filter(must=[])))
    as_alice.delete(collection, points_selector=models.PointIdsList(points=[bobs[0].id]))
    assert stored(qdrant, collection, alice) == []
    assert len(stored(qdrant, collection, bob)) == 2, "bob keeps everything"
    assert lethe.call("GET", f"/v1/subjects/{TENANT}/{alice}")[1]["inventory"].get("qdrant", 0) == 0


def test_an_erasure_hides_the_subject_at_once_then_deletes_its_points(lethe, qdrant, collection):
    gone, kept = someone(), someone()
    for s in (gone, kept):
        lethe.grant(s)
        lethe.qdrant_agent(s).upsert(collection, points(3, s))
    # An operator's snapshot, straight on Qdrant (the data plane refuses snapshots).
    snapshot = qdrant.client().create_snapshot(collection)
    assert lethe.dry_run(gone)["qdrant:qdrant"] == 3, "the dry run counts the subject's points in Qdrant"
    status, filed = lethe.call("POST", "/v1/erasures", {"subject": gone, "ticket": "DSR-Q", "reason": "art. 17"})
    assert status == 201
    status, _ = lethe.call("POST", f"/v1/erasures/{filed['id']}/approve")
    assert status == 200
    unbound = lethe.qdrant(lethe.token("agent"), **{"X-Lethe-Purpose": "personalization"})
    seen = unbound.scroll(collection, limit=100, with_payload=True)[0]
    assert {p.payload["lethe_subject"] for p in seen} == {kept}, "the very next read: the subject is gone"
    assert unbound.count(collection).count == 3
    assert refused(lambda: lethe.qdrant_agent(gone).upsert(collection, points(1, "late"))) == (403, "subject_suppressed")
    done = wait_for("the erasure to complete",
                    lambda: (r := lethe.call("GET", f"/v1/erasures/{filed['id']}")[1])["state"] == "completed" and r,
                    deadline=60)
    result = next(t["result"] for t in done["targets"] if t["target"] == "qdrant:qdrant")
    assert (result["before"], result["deleted"], result["remaining"]) == (3, 3, 0), result
    assert stored(qdrant, collection, gone) == [] and len(stored(qdrant, collection, kept)) == 3
    assert any("wal" in c["place"] for c in result["physical"]["remaining"]), "what Qdrant keeps is named"
    kept = next(c for c in result["physical"]["remaining"] if c["place"] == f"collection {collection}: snapshot {snapshot.name}")
    created = datetime.fromisoformat(snapshot.creation_time).replace(tzinfo=timezone.utc)
    until = datetime.fromisoformat(kept["until"].replace("Z", "+00:00"))
    assert abs(until - (created + timedelta(days=35))) < timedelta(seconds=1), (kept, snapshot.creation_time)
    assert [s.name for s in qdrant.client().list_snapshots(collection)] == [snapshot.name], "kept, as configured"


def test_a_route_may_delete_the_snapshots_that_hold_the_subject(chroma, qdrant, tmp_path):
    route = (f'[[routes]]\nname = "snap"\nprefix = "/snap"\nupstream = "{qdrant.url}"\nadapter = "qdrant"\n'
             'snapshots = "delete"\n')
    instance = own_lethe(chroma, tmp_path, '[erasure]\nretry_backoff = "200ms"\n' + route)
    try:
        from qdrant_client import QdrantClient
        client = lambda token, **h: QdrantClient(url=f"http://{instance.data}", prefix="snap",
                                                 metadata={"Authorization": f"Bearer {token}", **h})
        name = f"snap-{uuid.uuid4().hex[:8]}"
        client(instance.token("admin")).create_collection(
            name, vectors_config=models.VectorParams(size=DIM, distance=models.Distance.COSINE))
        gone = someone()
        instance.grant(gone)
        client(instance.token("agent", gone), **{"X-Lethe-Purpose": "personalization",
                                                 "X-Lethe-Category": "preference"}).upsert(name, points(2, gone))
        taken = qdrant.client().create_snapshot(name)
        done, results = instance.erase_to_completion(gone)
        result = results["qdrant:snap"]
        assert f"collection {name}: snapshot {taken.name} deleted" in result["physical"]["done"], result["physical"]
        assert qdrant.client().list_snapshots(name) == []
        assert not any("snapshot" in c["place"] for c in result["physical"]["remaining"])
    finally:
        instance.stop()


def test_the_purge_runs_the_optimizer_so_the_segments_no_longer_hold_the_subject(lethe, qdrant):
    """Enough points that Qdrant's segments pass the least vacuum size (100): once purged, the
    optimizer rebuilds them, and no segment file holds the erased subject's text; the WAL still
    does, and the certificate says so. The collection's own thresholds are put back."""
    name = f"big-{uuid.uuid4().hex[:8]}"
    lethe.qdrant(lethe.token("admin")).create_collection(
        name, vectors_config=models.VectorParams(size=DIM, distance=models.Distance.COSINE))
    gone, kept = someone(), someone()
    for s, n in ((gone, 80), (kept, 320)):
        lethe.grant(s)
        agent = lethe.qdrant_agent(s)
        for start in range(0, n, 100):
            agent.upsert(name, [models.PointStruct(id=str(uuid.uuid4()), vector=[1.0, float(i), 0.5],
                                                   payload={"data": f"{s} unique note {i}"}) for i in range(start, min(n, start + 100))])
    before = qdrant.client().get_collection(name).config.optimizer_config
    done, results = lethe.erase_to_completion(gone)
    result = results["qdrant:qdrant"]
    assert (result["before"], result["remaining"]) == (80, 0), result
    ran = [line for line in result["physical"]["done"] if line.startswith(f"collection {name}: optimizer run")]
    assert ran, result["physical"]["done"]
    after = qdrant.client().get_collection(name).config.optimizer_config
    assert (after.deleted_threshold, after.vacuum_min_vector_number) == (before.deleted_threshold, before.vacuum_min_vector_number)
    storage = qdrant.home / "storage" / "collections" / name
    needle = f"{gone} unique note".encode()
    holding = sorted(str(p.relative_to(storage)) for p in storage.rglob("*") if p.is_file() and needle in p.read_bytes())
    assert holding and all("/wal/" in f"/{h}" for h in holding), holding
    assert len(stored(qdrant, name, kept)) == 100 and qdrant.client().count(name, exact=True).count == 320



def test_a_client_that_keeps_the_subject_in_the_payload_needs_no_lethe_header(chroma, qdrant, tmp_path):
    """Mem0 keeps its user in the payload (`user_id`) and cannot send Lethe's headers: the route
    names that key and a default purpose and category. A token bound to the user still decides."""
    from qdrant_client import QdrantClient
    mem0_route = (f'[[routes]]\nname = "mem0"\nprefix = "/mem0"\nupstream = "{qdrant.url}"\nadapter = "qdrant"\n'
                  'subject_field = "user_id"\npurpose = "personalization"\ncategory = "preference"\n')
    instance = own_lethe(chroma, tmp_path, mem0_route)
    try:
        client = lambda token: QdrantClient(url=f"http://{instance.data}", prefix="mem0",
                                            metadata={"Authorization": f"Bearer {token}"})
        name = f"mem0-{uuid.uuid4().hex[:8]}"
        client(instance.token("admin")).create_collection(
            name, vectors_config=models.VectorParams(size=DIM, distance=models.Distance.COSINE))
        alice, bob = someone(), someone()
        for s in (alice, bob):
            instance.grant(s)
        as_alice = client(instance.token("agent", alice))
        memory = lambda user: models.PointStruct(id=str(uuid.uuid4()), vector=[1.0, 0.5, 0.25],
                                                 payload={"user_id": user, "data": f"{user} likes tea"})
        as_alice.upsert(name, [memory(alice)])
        assert refused(lambda: as_alice.upsert(name, [memory(bob)])) == (403, "scope_violation")
        client(instance.token("agent")).upsert(name, [memory(bob)])
        held = {p.payload["user_id"]: p.payload for p in qdrant.client().scroll(name, limit=10, with_payload=True)[0]}
        assert set(held) == {alice, bob}, "bob's point was written once, by the unbound service"
        assert all((p["lethe_subject"], p["lethe_purpose"]) == (u, "personalization") for u, p in held.items())
        found = as_alice.query_points(name, query=[1.0, 0.5, 0.25], limit=10).points
        assert [p.payload["user_id"] for p in found] == [alice]
    finally:
        instance.stop()


def test_the_lexical_probe_stops_an_erasure_that_left_an_unattributed_point(chroma, qdrant, tmp_path):
    """A batch job wrote a summary about the subject straight into Qdrant, without a stamp: the
    purge cannot attribute it, the probe matches the subject's key in the route's text field,
    and the erasure goes to exception for a person to review; once the copy is removed at its
    source and the erasure resumed, it completes. A point of another subject that mentions the
    erased one is that subject's, and stays."""
    route = (f'[[routes]]\nname = "notes"\nprefix = "/notes"\nupstream = "{qdrant.url}"\nadapter = "qdrant"\n'
             'text_fields = ["data"]\n')
    instance = own_lethe(chroma, tmp_path, '[erasure]\nretry_backoff = "100ms"\nmax_attempts = 2\nprobes = ["{subject}"]\n' + route)
    try:
        from qdrant_client import QdrantClient
        headers = {"X-Lethe-Purpose": "personalization", "X-Lethe-Category": "preference"}
        client = lambda token: QdrantClient(url=f"http://{instance.data}", prefix="notes",
                                            metadata={"Authorization": f"Bearer {token}", **headers})
        name = f"notes-{uuid.uuid4().hex[:8]}"
        client(instance.token("admin")).create_collection(
            name, vectors_config=models.VectorParams(size=DIM, distance=models.Distance.COSINE))
        gone, other = someone(), someone()
        for s in (gone, other):
            instance.grant(s)
        client(instance.token("agent", gone)).upsert(name, points(2, f"{gone} likes"))
        mention = models.PointStruct(id=str(uuid.uuid4()), vector=[0.3, 0.2, 0.1], payload={"data": f"met {gone} at the station"})
        client(instance.token("agent", other)).upsert(name, [mention])
        copy = models.PointStruct(id=str(uuid.uuid4()), vector=[0.4, 0.2, 0.1], payload={"data": f"summary of {gone}: likes tea"})
        direct = qdrant.client()
        direct.upsert(name, [copy])

        status, filed = instance.call("POST", "/v1/erasures", {"subject": gone, "ticket": "DSR-P", "reason": "art. 17"})
        assert status == 201
        assert instance.call("POST", f"/v1/erasures/{filed['id']}/approve")[0] == 200
        request = lambda: instance.call("GET", f"/v1/erasures/{filed['id']}")[1]
        wait_for("the erasure to stop for review", lambda: request()["state"] == "exception", deadline=30)
        target = next(t for t in request()["targets"] if t["target"] == "qdrant:notes")
        assert "verification probe found 1 records" in target["last_error"], target
        assert stored(qdrant, name, gone) == []
        assert {str(p.id) for p in direct.retrieve(name, ids=[mention.id, copy.id])} == {mention.id, copy.id}
        assert instance.cli("erase", "--tenant", TENANT, "--review", filed["id"]).returncode == 0
        direct.delete(name, points_selector=models.PointIdsList(points=[copy.id]))
        assert instance.cli("erase", "--tenant", TENANT, "--resume", filed["id"]).returncode == 0
        wait_for("the resumed erasure to complete", lambda: request()["state"] == "completed", deadline=30)
        assert [str(p.id) for p in direct.retrieve(name, ids=[mention.id])] == [mention.id]
    finally:
        instance.stop()


def test_a_snapshot_restored_after_the_erasure_is_purged_again_by_replay(lethe, qdrant, collection):
    """The operator recovers a collection from a snapshot taken before the erasure: the subject's
    points are back in Qdrant. `lethe replay` finds them again by their stamp (Lethe itself no
    longer holds the subject's key, only its reference) and deletes them; the other subject's
    points, restored as well, stay."""
    gone, kept = someone(), someone()
    for s in (gone, kept):
        lethe.grant(s)
        lethe.qdrant_agent(s).upsert(collection, points(3, s))
    direct = qdrant.client()
    snapshot = direct.create_snapshot(collection)
    done, results = lethe.erase_to_completion(gone)
    assert stored(qdrant, collection, gone) == []
    direct.recover_snapshot(collection, location=f"file://{qdrant.home / 'snapshots' / collection / snapshot.name}", wait=True)
    assert len(stored(qdrant, collection, gone)) == 3, "the restore brought the subject back"
    again = lethe.cli("replay", "--since", done["requested_at"])
    assert again.returncode == 0, again.stdout + again.stderr
    line = next(l for l in again.stdout.decode().splitlines() if "qdrant:qdrant" in l)
    assert "remaining 0" in line, line
    assert stored(qdrant, collection, gone) == [] and len(stored(qdrant, collection, kept)) == 3
