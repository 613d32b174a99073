"""Attacks on the Qdrant route, from the next tenant's and the next subject's point of view: other
spellings of a point id or a collection, pre-claimed ids, claims of unstamped points, revival of
expired points, widening filters in every read and write that takes one, writes that wrote
nothing, the same subject key in two tenants, and erasures and sweeps that lineage alone would
get wrong. Every case asserts what Qdrant itself holds afterwards (a client straight to the
server, bypassing Lethe), and where lineage matters, what the state store holds."""

import subprocess
import time
import uuid

import pytest
from qdrant_client import models
from qdrant_client.http.exceptions import UnexpectedResponse

from conftest import GLOBEX, TENANT, own_lethe, send, someone, two_tenant_lethe, wait_for

HEADERS = {"X-Lethe-Purpose": "personalization", "X-Lethe-Category": "preference"}
DIM = 3


@pytest.fixture(scope="module")
def gate(chroma, qdrant, tmp_path_factory):
    erasure = '[erasure]\nretry_backoff = "200ms"\nsettle = "100ms"\nsweep_interval = "200ms"\n'
    instance = two_tenant_lethe(chroma, tmp_path_factory.mktemp("attack-qdrant"), erasure, qdrant_url=qdrant.url)
    yield instance
    instance.stop()


@pytest.fixture
def shared(gate, qdrant):
    """A collection both tenants' agents use (Qdrant has no notion of Lethe's tenants)."""
    name = f"shared-{uuid.uuid4().hex[:10]}"
    gate.qdrant(gate.token("admin")).create_collection(
        name, vectors_config=models.VectorParams(size=DIM, distance=models.Distance.COSINE))
    return name


def agent(gate, tenant, subject=None):
    return gate.qdrant(gate.token("agent", subject, tenant=tenant), **HEADERS)


def point(pid=None, text="note", **payload):
    return models.PointStruct(id=pid or str(uuid.uuid4()), vector=[1.0, 0.5, 0.25], payload={"data": text, **payload})


def held(qdrant, name, pid):
    """The payload Qdrant holds under an id, or None."""
    found = qdrant.client().retrieve(name, ids=[pid], with_payload=True)
    return found[0].payload if found else None


def owner(qdrant, name, pid):
    payload = held(qdrant, name, pid) or {}
    return payload.get("lethe_tenant"), payload.get("lethe_subject")


def status_of(call):
    """The status and Lethe's code (or None) of a call the client raised for."""
    import json
    with pytest.raises(UnexpectedResponse) as e:
        call()
    body = json.loads(e.value.content or b"{}")
    return e.value.status_code, (body.get("error") or {}).get("code") if isinstance(body.get("error"), dict) else None


def raw(gate, token, method, path, body):
    """A hand-written request to the route, for what the client library would never send."""
    return send(f"http://{gate.data}/qdrant", method, path, body, {"Authorization": f"Bearer {token}", **HEADERS})


def lineage_rows(gate, item_id):
    """Live lineage rows for an id, straight from the state store: tenant/subject."""
    return subprocess.run(["psql", gate.state_url, "-qtAc",
                           f"SELECT tenant || '/' || subject FROM items WHERE item_id = '{item_id}' AND deleted_at IS NULL"],
                          check=True, capture_output=True, text=True).stdout.split()


def test_other_spellings_of_an_id_or_a_collection_reach_nothing(gate, qdrant, shared):
    victim = someone()
    gate.grant(victim)
    pid = str(uuid.uuid4())
    agent(gate, TENANT, victim).upsert(shared, [point(pid, "victim's")])
    token = gate.token("agent", tenant=GLOBEX)
    u = uuid.UUID(pid)
    for spelling in (pid.upper(), u.hex, "{" + pid + "}", "urn:uuid:" + pid):
        for method, path, body in (
                ("POST", f"/collections/{shared}/points", {"ids": [spelling], "with_payload": True}),
                ("PUT", f"/collections/{shared}/points", {"points": [{"id": spelling, "vector": [0.0, 0.0, 1.0], "payload": {"data": "mine"}}]}),
                ("POST", f"/collections/{shared}/points/delete", {"points": [spelling]}),
                ("POST", f"/collections/{shared}/points/payload", {"payload": {"data": "mine"}, "points": [spelling]}),
                ("POST", f"/collections/{shared}/points/query", {"query": spelling, "limit": 3})):
            status, answer = raw(gate, token, method, path, body)
            assert status == 400, (spelling, path, status, answer)
        assert raw(gate, token, "GET", f"/collections/{shared}/points/{spelling}", None)[0] in (400, 404)
    for name in (shared.upper(), f"{shared}%2F..", "..", f"{shared}/../{shared}"):
        status, _ = raw(gate, token, "POST", f"/collections/{name}/points/scroll", {"limit": 10})
        assert status in (400, 404), name
    assert held(qdrant, shared, pid)["data"] == "victim's"
    assert owner(qdrant, shared, pid) == (TENANT, victim)


def test_a_pre_claimed_id_stays_its_first_owners(gate, qdrant, shared):
    """Globex writes an id first; acme's later write of that id (upsert, batch, edit) is refused
    or reaches nothing, and Qdrant and lineage keep globex's."""
    squatter, victim = someone(GLOBEX), someone()
    gate.grant(squatter, tenant=GLOBEX)
    gate.grant(victim)
    pid = str(uuid.uuid4())
    agent(gate, GLOBEX, squatter).upsert(shared, [point(pid, "globex's")])
    acme = agent(gate, TENANT, victim)
    assert status_of(lambda: acme.upsert(shared, [point(pid, "acme's")])) == (403, "scope_violation")
    assert status_of(lambda: acme.batch_update_points(shared, [
        models.UpsertOperation(upsert=models.PointsList(points=[point(str(uuid.uuid4()))])),
        models.UpsertOperation(upsert=models.PointsList(points=[point(pid, "acme's")]))])) == (403, "scope_violation")
    assert status_of(lambda: acme.overwrite_payload(shared, payload={"data": "acme's"}, points=[pid]))[0] == 404
    assert status_of(lambda: acme.update_vectors(shared, [models.PointVectors(id=pid, vector=[0.0, 1.0, 0.0])]))[0] == 404
    assert held(qdrant, shared, pid)["data"] == "globex's" and owner(qdrant, shared, pid) == (GLOBEX, squatter)
    assert qdrant.client().count(shared, exact=True).count == 1, "the refused batch wrote nothing"
    wait_for("globex's lineage row", lambda: lineage_rows(gate, pid) == [f"{GLOBEX}/{squatter}"], deadline=10)


def test_an_unstamped_point_is_never_claimed_read_or_deleted(gate, qdrant, shared):
    s = someone()
    gate.grant(s)
    loose = str(uuid.uuid4())
    qdrant.client().upsert(shared, [point(loose, "written around Lethe")])
    mine = agent(gate, TENANT, s)
    service = agent(gate, TENANT)
    assert status_of(lambda: mine.upsert(shared, [point(loose, "claimed")])) == (403, "unstamped_item")
    assert status_of(lambda: mine.set_payload(shared, payload={"data": "claimed"}, points=[loose]))[0] == 404
    for reader in (mine, service):
        assert reader.retrieve(shared, ids=[loose]) == []
        assert reader.scroll(shared, limit=10)[0] == []
        assert reader.count(shared).count == 0
        reader.delete(shared, points_selector=models.FilterSelector(filter=models.Filter(must=[])))
        reader.clear_payload(shared, points_selector=models.FilterSelector(filter=models.Filter(must=[])))
    assert held(qdrant, shared, loose) == {"data": "written around Lethe"}
    assert lineage_rows(gate, loose) == []


def test_an_expired_point_stays_dead_and_the_sweeper_takes_it(gate, qdrant, shared):
    s = someone()
    gate.grant(s)
    mine = agent(gate, TENANT, s)
    # A legal hold keeps the sweeper away, so that the expired point is still in Qdrant when its
    # owner tries to bring it back.
    status, hold = gate.call("POST", "/v1/legal-holds", {"subject": s, "reason": "litigation"})
    assert status == 201, hold
    soon = int(time.time()) + 2
    pid = str(uuid.uuid4())
    mine.upsert(shared, [point(pid, "short-lived", lethe_expires_at=soon)])
    wait_for("the point to expire", lambda: time.time() > soon + 1, deadline=10)
    assert status_of(lambda: mine.upsert(shared, [point(pid, "revived")])) == (403, "expired")
    assert status_of(lambda: mine.batch_update_points(shared, [
        models.UpsertOperation(upsert=models.PointsList(points=[point(pid, "revived")]))])) == (403, "expired")
    assert status_of(lambda: mine.set_payload(shared, payload={"data": "revived"}, points=[pid]))[0] == 404
    assert mine.retrieve(shared, ids=[pid]) == [] and mine.count(shared).count == 0
    assert mine.query_points(shared, query=[1.0, 0.5, 0.25], limit=5).points == []
    payload = held(qdrant, shared, pid)
    assert (payload["data"], payload["lethe_expires_at"]) == ("short-lived", soon)
    assert gate.call("POST", f"/v1/legal-holds/{hold['id']}/release")[0] == 200
    wait_for("the sweeper to delete the expired point", lambda: held(qdrant, shared, pid) is None, deadline=15)


def test_a_point_written_through_an_alias_is_swept_when_it_expires(gate, qdrant, shared):
    """Lineage names the point by the alias it was written through: the sweeper still finds it
    (and deletes it from the collection behind the alias), instead of taking it for gone."""
    s = someone()
    gate.grant(s)
    alias = f"{shared}-now"
    gate.qdrant(gate.token("admin")).update_collection_aliases(change_aliases_operations=[
        models.CreateAliasOperation(create_alias=models.CreateAlias(collection_name=shared, alias_name=alias))])
    pid = str(uuid.uuid4())
    agent(gate, TENANT, s).upsert(alias, [point(pid, "short-lived", lethe_expires_at=int(time.time()) + 2)])
    assert held(qdrant, shared, pid) is not None
    wait_for("the sweeper to delete the expired point", lambda: held(qdrant, shared, pid) is None, deadline=20)


def test_widening_filters_reach_nothing_of_another_tenant_or_subject(gate, qdrant, shared):
    victim, neighbour = someone(), someone()
    gate.grant(victim)
    gate.grant(neighbour)
    ids = [str(uuid.uuid4()), str(uuid.uuid4())]
    agent(gate, TENANT, victim).upsert(shared, [point(i, "acme secret", topic="tea") for i in ids])
    stamp_key = lambda key, value: models.FieldCondition(key=key, match=models.MatchValue(value=value))
    filters = [
        models.Filter(should=[stamp_key("lethe_tenant", TENANT), stamp_key("lethe_tenant", GLOBEX)]),
        models.Filter(must_not=[stamp_key("lethe_tenant", "nobody")]),
        models.Filter(must=[stamp_key("lethe_subject", victim)]),
        models.Filter(must=[models.HasIdCondition(has_id=ids)]),
        models.Filter(min_should=models.MinShould(conditions=[stamp_key("topic", "tea")], min_count=1)),
        models.Filter(must=[models.IsEmptyCondition(is_empty=models.PayloadField(key="lethe_tenant"))]),
        models.Filter(must=[models.FieldCondition(key="data", match=models.MatchText(text="acme"))]),
    ]
    readers = [agent(gate, GLOBEX), agent(gate, TENANT, neighbour)]
    for reader in readers:
        for f in filters:
            assert reader.scroll(shared, scroll_filter=f, limit=10)[0] == []
            assert reader.query_points(shared, query=[1.0, 0.5, 0.25], query_filter=f, limit=5).points == []
            assert reader.count(shared, count_filter=f).count == 0
            assert reader.facet(shared, key="topic", facet_filter=f).hits == []
            assert reader.query_points_groups(shared, group_by="topic", query=[1.0, 0.5, 0.25], query_filter=f).groups == []
            assert reader.search_matrix_pairs(shared, query_filter=f, sample=10, limit=3).pairs == []
            reader.delete(shared, points_selector=models.FilterSelector(filter=f))
            reader.set_payload(shared, payload={"data": "overwritten"}, points=f)
            reader.delete_payload(shared, keys=["data"], points=f)
        assert reader.retrieve(shared, ids=ids) == []
        reader.delete(shared, points_selector=models.PointIdsList(points=ids))
    assert {held(qdrant, shared, i)["data"] for i in ids} == {"acme secret"}
    assert qdrant.client().count(shared, exact=True).count == 2


def test_a_write_that_wrote_nothing_claims_nothing(gate, qdrant, shared):
    s = someone()
    gate.grant(s)
    mine = agent(gate, TENANT, s)
    wrong = models.PointStruct(id=str(uuid.uuid4()), vector=[1.0, 0.5], payload={"data": "two dimensions"})
    assert status_of(lambda: mine.upsert(shared, [wrong]))[0] == 400, "Qdrant refuses the vector's size"
    missing = str(uuid.uuid4())
    assert status_of(lambda: mine.update_vectors(shared, [models.PointVectors(id=missing, vector=[1.0, 0.0, 0.0])]))[0] == 404
    assert qdrant.client().count(shared, exact=True).count == 0
    # Qdrant applies a batch in order and stops at the first failure: the first upsert landed,
    # and lineage follows what Qdrant holds, not what was asked.
    first = point()
    assert status_of(lambda: mine.batch_update_points(shared, [
        models.UpsertOperation(upsert=models.PointsList(points=[first])),
        models.UpsertOperation(upsert=models.PointsList(points=[wrong]))]))[0] == 400
    assert [str(p.id) for p in qdrant.client().scroll(shared, limit=10)[0]] == [first.id]
    wait_for("the landed point's lineage", lambda: lineage_rows(gate, first.id) == [f"{TENANT}/{s}"], deadline=10)
    # Lineage is written off the request path, in order: once a later write's row is there,
    # any row of the failed ones would be too.
    later = point()
    mine.upsert(shared, [later])
    wait_for("the later write's lineage", lambda: lineage_rows(gate, later.id) == [f"{TENANT}/{s}"], deadline=10)
    assert lineage_rows(gate, wrong.id) == [] and lineage_rows(gate, missing) == []
    assert gate.call("GET", f"/v1/subjects/{TENANT}/{s}")[1]["inventory"].get("qdrant", 0) == 2


def test_the_same_subject_key_in_two_tenants_is_two_people(gate, qdrant, shared):
    """An erasure of acme's `key` deletes acme's points only, not globex's points of a subject
    that happens to share the key."""
    key = f"shared-{uuid.uuid4().hex[:8]}"
    gate.grant(key)
    gate.grant(key, tenant=GLOBEX)
    acme = [point(text="acme's") for _ in range(2)]
    globex = [point(text="globex's") for _ in range(3)]
    agent(gate, TENANT, key).upsert(shared, acme)
    agent(gate, GLOBEX, key).upsert(shared, globex)
    assert agent(gate, GLOBEX, key).count(shared).count == 3
    results = gate.erase_to_completion(key, TENANT)[1]
    assert results["qdrant:qdrant"]["deleted"] == 2, results["qdrant:qdrant"]
    assert all(held(qdrant, shared, p.id) is None for p in acme)
    assert [owner(qdrant, shared, p.id) for p in globex] == [(GLOBEX, key)] * 3
    assert agent(gate, GLOBEX, key).count(shared).count == 3


def test_another_owners_retention_never_sweeps_a_point(gate, qdrant, shared):
    """Lineage says an id is acme's and short-lived; Qdrant holds it under globex's stamp (acme's
    point was deleted around Lethe, then globex wrote the free id). The sweeper acts on acme's
    lineage row but leaves globex's point: the stamp in the store decides whose it is."""
    first, second = someone(), someone(GLOBEX)
    gate.grant(first)
    gate.grant(second, tenant=GLOBEX)
    soon = int(time.time()) + 2
    pid = str(uuid.uuid4())
    agent(gate, TENANT, first).upsert(shared, [point(pid, "acme's", lethe_expires_at=soon)])
    wait_for("acme's lineage row", lambda: lineage_rows(gate, pid) == [f"{TENANT}/{first}"], deadline=10)
    qdrant.client().delete(shared, points_selector=models.PointIdsList(points=[pid]))
    agent(gate, GLOBEX, second).upsert(shared, [point(pid, "globex's, for 30 days")])
    assert owner(qdrant, shared, pid) == (GLOBEX, second)
    wait_for("the sweeper to take up acme's expired lineage row",
             lambda: f"{TENANT}/{first}" not in lineage_rows(gate, pid), deadline=15)
    assert held(qdrant, shared, pid)["data"] == "globex's, for 30 days"
    assert [str(p.id) for p in agent(gate, GLOBEX, second).retrieve(shared, ids=[pid])] == [pid]


class Interposer:
    """An HTTP hop between Lethe and Qdrant that, once armed, runs a callback just before it
    forwards the next write to a path ending as armed: another writer's request landing between
    Lethe's read of what Qdrant holds and its write."""

    def __init__(self, upstream):
        import http.server
        import threading
        import urllib.request
        interposer = self
        self.armed = None

        class Hop(http.server.BaseHTTPRequestHandler):
            def forward(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                armed = interposer.armed
                if armed and self.command in ("PUT", "POST") and self.path.split("?")[0].endswith(armed[0]):
                    interposer.armed = None
                    armed[1]()
                request = urllib.request.Request(upstream + self.path, data=body or None, method=self.command,
                                                 headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(request, timeout=10) as answer:
                        status, data = answer.status, answer.read()
                except urllib.error.HTTPError as e:
                    status, data = e.code, e.read()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_PATCH = do_DELETE = forward

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hop)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()


def test_a_point_another_owner_writes_between_lethes_read_and_write_is_left_alone(chroma, qdrant, tmp_path):
    hop = Interposer(qdrant.url)
    route = f'[[routes]]\nname = "raced"\nprefix = "/raced"\nupstream = "{hop.url}"\nadapter = "qdrant"\n'
    instance = own_lethe(chroma, tmp_path, route)
    try:
        from qdrant_client import QdrantClient
        client = lambda token: QdrantClient(url=f"http://{instance.data}", prefix="raced",
                                            metadata={"Authorization": f"Bearer {token}", **HEADERS})
        name = f"raced-{uuid.uuid4().hex[:8]}"
        client(instance.token("admin")).create_collection(
            name, vectors_config=models.VectorParams(size=DIM, distance=models.Distance.COSINE))
        slow, fast = someone(), someone()
        for s in (slow, fast):
            instance.grant(s)
        contested, free = str(uuid.uuid4()), str(uuid.uuid4())
        # Fast's write goes straight to Qdrant, as another replica's would, once slow's Lethe has
        # found the id free.
        raced = []
        hop.armed = ("/points", lambda: raced.append(
            client(instance.token("agent", fast)).upsert(name, [point(contested, "fast's")])))
        client(instance.token("agent", slow)).upsert(name, [point(contested, "slow's"), point(free, "slow's")])
        assert len(raced) == 1, "fast's write ran between slow's read and write"
        assert held(qdrant, name, contested)["data"] == "fast's"
        assert owner(qdrant, name, contested) == (TENANT, fast)
        assert owner(qdrant, name, free) == (TENANT, slow), "a free id is still written"
        wait_for("lineage of the free id", lambda: lineage_rows(instance, free) == [f"{TENANT}/{slow}"], deadline=10)
        assert lineage_rows(instance, contested) == [f"{TENANT}/{fast}"], "the first writer's row stands"

        # An edit decided on slow's point, which changes hands before the edit lands (deleted
        # around Lethe, then written by fast): fast's point is left alone, stamp and all.
        hop.armed = ("/points/batch", lambda: raced.append((
            qdrant.client().delete(name, points_selector=models.PointIdsList(points=[free])),
            client(instance.token("agent", fast)).upsert(name, [point(free, "fast's now")]))))
        client(instance.token("agent", slow)).overwrite_payload(name, payload={"data": "slow's edit"}, points=[free])
        assert len(raced) == 2, "the point changed hands between slow's read and edit"
        assert held(qdrant, name, free)["data"] == "fast's now"
        assert owner(qdrant, name, free) == (TENANT, fast)
    finally:
        instance.stop()
        hop.stop()


def test_no_spelling_of_a_payload_path_reaches_the_stamp(gate, qdrant, shared):
    """Qdrant reads `"lethe_subject"` (quoted), `lethe_subject[]` and `"lethe_subject".x` as paths
    under the stamp's `lethe_subject`: a set under any of them or a delete of it, alone or in a
    batch, is refused and the point keeps its stamp whole; below the top they are the app's keys."""
    s = someone()
    gate.grant(s)
    pid = str(uuid.uuid4())
    mine = agent(gate, TENANT, s)
    mine.upsert(shared, [point(pid, "mine")])
    stamp = {k: v for k, v in held(qdrant, shared, pid).items() if k.startswith("lethe_")}
    token = gate.token("agent", s, tenant=TENANT)
    c = f"/collections/{shared}/points"
    for key in ('"lethe_subject"', '"lethe_tenant"', '"lethe_epoch"', '"lethe_expires_at"', '"lethe_subject".x',
                '"lethe_subject"[]', '"lethe_tenant"[0]', 'lethe_subject[]', '"lethe_"', '"lethe_subject', 'a..b'):
        for path, body in (
                (f"{c}/payload", {"payload": {"x": 1}, "points": [pid], "key": key}),
                (f"{c}/payload/delete", {"keys": ["data", key], "points": [pid]}),
                (f"{c}/batch", {"operations": [{"set_payload": {"payload": {"x": 1}, "points": [pid], "key": key}}]}),
                (f"{c}/batch", {"operations": [{"delete_payload": {"keys": [key], "points": [pid]}}]})):
            status, answer = raw(gate, token, "POST", path, body)
            assert status == 400, (key, path, status, answer)
    now = held(qdrant, shared, pid)
    assert {k: v for k, v in now.items() if k.startswith("lethe_")} == stamp and now["data"] == "mine"
    mine.set_payload(shared, payload={"x": 1}, points=[pid], key='meta."lethe_subject"')
    assert held(qdrant, shared, pid)["meta"] == {"lethe_subject": {"x": 1}}
    assert owner(qdrant, shared, pid) == (TENANT, s)


def test_collections_of_their_own_tell_nothing_of_another_tenants(chroma, qdrant, tmp_path):
    """`isolation = "collection_per_tenant"`: acme and globex both keep a collection they call
    `memories`; each sees its own size and list and aliases only, cannot reach the other's by its
    physical name (in a path or a lookup), and an erasure purges acme's own. Counted in Qdrant."""
    gate = two_tenant_lethe(chroma, tmp_path, '[erasure]\nsettle = "100ms"\n', qdrant_url=qdrant.url,
                            qdrant_settings='isolation = "collection_per_tenant"\n')
    try:
        name = f"memories-{uuid.uuid4().hex[:8]}"
        admins = {t: gate.qdrant(gate.token("admin", tenant=t)) for t in (TENANT, GLOBEX)}
        for admin in admins.values():
            admin.create_collection(name, vectors_config=models.VectorParams(size=DIM, distance=models.Distance.COSINE))
        people = {TENANT: someone(), GLOBEX: someone(GLOBEX)}
        for tenant, s in people.items():
            gate.grant(s, tenant=tenant)
        agent(gate, TENANT, people[TENANT]).upsert(name, [point(text=f"acme {i}") for i in range(3)])
        agent(gate, GLOBEX, people[GLOBEX]).upsert(name, [point(text="globex 0")])

        direct = qdrant.client()
        physical = {c.name for c in direct.get_collections().collections if c.name.endswith(f"__{name}")}
        assert len(physical) == 2 and name not in {c.name for c in direct.get_collections().collections}
        counts = sorted(direct.count(c, exact=True).count for c in physical)
        assert counts == [1, 3], counts
        acme_physical = next(c for c in physical if direct.count(c, exact=True).count == 3)

        # Each tenant's view: its own size, its own list, by the names it gave.
        assert admins[TENANT].get_collection(name).points_count == 3
        assert admins[GLOBEX].get_collection(name).points_count == 1
        for admin in admins.values():
            listed = [c.name for c in admin.get_collections().collections]
            assert name in listed and not any(n.startswith("lethe_") for n in listed), listed
        # Another tenant's physical name is only a name in globex's namespace: nothing there.
        theirs = admins[GLOBEX]
        assert status_of(lambda: theirs.get_collection(acme_physical))[0] == 404
        assert not theirs.collection_exists(acme_physical)
        token = gate.token("agent", people[GLOBEX], tenant=GLOBEX)
        # (An error may name what the client sent, and nothing else of Lethe's.)
        nothing_else = lambda answer: "lethe_" not in str(answer).replace(acme_physical, "")
        status, answer = raw(gate, token, "POST", f"/collections/{acme_physical}/points/scroll", {"limit": 10})
        assert status == 404 and nothing_else(answer), answer
        status, answer = raw(gate, token, "POST", f"/collections/{name}/points/query",
                             {"query": {"recommend": {"positive": [1]}}, "lookup_from": {"collection": acme_physical}})
        assert status >= 400 and nothing_else(answer), (status, answer)
        # A collection made as a copy of acme's (by its physical name) is refused, and not made.
        copy = f"copy-{uuid.uuid4().hex[:8]}"
        status, answer = raw(gate, gate.token("admin", tenant=GLOBEX), "PUT", f"/collections/{copy}",
                             {"vectors": {"size": DIM, "distance": "Cosine"}, "init_from": {"collection": acme_physical}})
        assert status == 400 and "init_from" in str(answer), (status, answer)
        assert not any(c.name.endswith(f"__{copy}") for c in direct.get_collections().collections)
        # Errors name the client's own names.
        status, answer = raw(gate, token, "GET", "/collections/nowhere", None)
        assert status == 404 and "nowhere" in str(answer) and "lethe_" not in str(answer), answer

        # Aliases: each tenant's, and only in its own namespace.
        admins[TENANT].update_collection_aliases(change_aliases_operations=[
            models.CreateAliasOperation(create_alias=models.CreateAlias(collection_name=name, alias_name=f"{name}-now"))])
        assert [a.alias_name for a in admins[TENANT].get_aliases().aliases] == [f"{name}-now"]
        assert [a.alias_name for a in admins[GLOBEX].get_aliases().aliases if a.alias_name.startswith(name)] == []
        assert admins[TENANT].get_collection(f"{name}-now").points_count == 3

        # The erasure of acme's subject purges acme's collection; globex's point stays.
        gate.erase_to_completion(people[TENANT])
        assert direct.count(acme_physical, exact=True).count == 0
        assert sum(direct.count(c, exact=True).count for c in physical) == 1
    finally:
        gate.stop()
