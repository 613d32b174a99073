"""Attacks on the Azure AI Search route, from the next tenant's and the next subject's point of
view: filters that try to widen (in every read that takes one, in both request forms), fields of
Lethe's stamp named where a field goes, keys claimed, overwritten, merged or deleted across
owners, forged stamps, unstamped and expired documents, other spellings of names, the APIs the
route does not pass, and Azure's own key offered as a Lethe token. Every case asserts what the
stand-in itself holds afterwards (its admin key, bypassing Lethe)."""

import json
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.search.documents.indexes.models import SearchableField, SearchFieldDataType, SearchIndex, SimpleField

from conftest import (AZURE_SEARCH_KEY, GLOBEX, TENANT, azure_document, azure_store, send, someone, two_tenant_lethe,
                      wait_for)

VERSION = "api-version=2026-04-01"


@pytest.fixture(scope="module")
def gate(chroma, azure_search, tmp_path_factory):
    erasure = '[erasure]\nretry_backoff = "200ms"\nsettle = "100ms"\nsweep_interval = "200ms"\n'
    instance = two_tenant_lethe(chroma, tmp_path_factory.mktemp("attack-azure"), erasure,
                                azure_search_url=azure_search)
    yield instance
    instance.stop()


@pytest.fixture
def shared(gate):
    """An index both tenants' agents write to (Azure has no notion of Lethe's tenants)."""
    name = f"shared-{uuid.uuid4().hex[:10]}"
    gate.azure_indexes(gate.token("admin")).create_index(SearchIndex(name=name, fields=[
        SimpleField(name="id", type=SearchFieldDataType.String, key=True),
        SimpleField(name="n", type=SearchFieldDataType.Int32, filterable=True, sortable=True, facetable=True),
        SearchableField(name="text", filterable=True)]))
    return name


def owner(azure_search, index, key):
    doc = azure_document(azure_search, index, key) or {}
    return doc.get("lethe_tenant"), doc.get("lethe_subject")


def agent(gate, index, tenant, subject=None):
    return gate.azure_agent(index, subject, tenant=tenant)


def refused(call):
    """The status and Lethe's code of a call the SDK raised for."""
    with pytest.raises(HttpResponseError) as e:
        call()
    try:
        body = json.loads(e.value.response.text() or "{}")
    except ValueError:
        body = {}
    error = body.get("error") if isinstance(body.get("error"), dict) else {}
    return e.value.status_code, error.get("code")


def raw(gate, token, method, path, body=None, **headers):
    """A hand-written request to the route, for what the SDK would never send."""
    return send(f"http://{gate.data}/azure_search", method, path, body,
                {"api-key": token, "X-Lethe-Purpose": "personalization", "X-Lethe-Category": "preference", **headers})


def seeded(gate, index, tenant, n=3):
    subject = someone(tenant)
    gate.grant(subject, tenant=tenant)
    docs = [{"id": f"{subject.replace('-', '')}{i}", "n": i, "text": f"secret of {subject} number {i}"} for i in range(n)]
    assert all(r.succeeded for r in agent(gate, index, tenant, subject).upload_documents(docs))
    return subject, [d["id"] for d in docs]


def test_widening_filters_reach_nothing_of_another_tenant_or_subject(gate, azure_search, shared):
    victim, victims = seeded(gate, shared, "acme")
    attacker, mine = seeded(gate, shared, GLOBEX)
    thief = agent(gate, shared, GLOBEX, attacker)
    for widening in ["n ge 0 or true", "true or n ge 0", "(n ge 0) or (n lt 0)", "not (n lt 0)",
                     "search.in(id, '" + ",".join(victims) + "', ',')", "search.ismatch('secret')",
                     "search.ismatchscoring('secret')", "n eq 1 or n ne 1",
                     "text eq 'x'' or lethe_tenant eq ''acme'"]:
        found = [d["id"] for d in thief.search("*", filter=widening)]
        assert not set(found) & set(victims), (widening, found)
        assert set(found) <= set(mine)
    for hostile in ["lethe_tenant ne 'acme'", "lethe_tenant eq 'acme'", "n ge 0) or (true", "(n ge 0",
                    "n ge 0)", "text eq 'x", "text eq \"x\"",
                    "search.ismatch('acme', 'lethe_tenant')", "search.in(lethe_subject, 'a,b')",
                    "lethe_expires_at lt 2999-01-01T00:00:00Z", "n ge 0 or lethe_subject ne 'x'"]:
        assert refused(lambda: list(thief.search("*", filter=hostile))) == (400, "invalid_request"), hostile
        assert refused(lambda: thief.suggest("sec", "sg", filter=hostile))[0] == 400, hostile
    # The GET form, hand-written, is narrowed as the POST is.
    token = gate.token("agent", attacker, tenant=GLOBEX)
    status, page = raw(gate, token, "GET", f"/indexes/{shared}/docs?{VERSION}&search=*&%24filter=n%20ge%200%20or%20true")
    assert status == 200 and {d["id"] for d in page["value"]} <= set(mine), page
    # The stamp named where a field goes, or a vector query's own filter.
    for body in [{"select": "id,lethe_subject"}, {"searchFields": "lethe_subject"}, {"orderby": "lethe_tenant"},
                 {"facets": ["lethe_subject"]}, {"highlight": "lethe_subject"}, {"answers": "extractive|count-3"},
                 {"vectorQueries": [{"kind": "vector", "vector": [1.0], "fields": "text", "filterOverride": "true"}]}]:
        status, answer = raw(gate, token, "POST", f"/indexes('{shared}')/docs/search.post.search?{VERSION}",
                             {"search": "*", **body})
        assert status == 400 and answer["error"]["code"] == "invalid_request", (body, answer)
    # Counts and facets are never of what the caller may not see.
    assert thief.get_document_count() == 3
    assert thief.search("*", include_total_count=True, facets=["n"]).get_count() == 3
    assert azure_store(azure_search, shared).get_document_count() == 6, "nothing changed in the store"
    assert {owner(azure_search, shared, k) for k in victims} == {("acme", victim)}


def test_keys_of_another_owner_are_never_taken_overwritten_merged_or_deleted(gate, azure_search, shared):
    victim, victims = seeded(gate, shared, "acme")
    attacker = someone(GLOBEX)
    gate.grant(attacker, tenant=GLOBEX)
    thief = agent(gate, shared, GLOBEX, attacker)
    key = victims[0]
    for action in ("upload", "mergeOrUpload", "merge"):
        batch = raw(gate, gate.token("agent", attacker, tenant=GLOBEX), "POST",
                    f"/indexes('{shared}')/docs/search.index?{VERSION}",
                    {"value": [{"@search.action": action, "id": key, "text": "pwned"}]})
        assert batch[0] == 207 and batch[1]["value"][0]["statusCode"] == 403, (action, batch)
        assert "scope_violation" in batch[1]["value"][0]["errorMessage"]
    deleted = thief.delete_documents([{"id": key}])
    assert [(r.succeeded, r.status_code) for r in deleted] == [(True, 200)], "as for a key Azure does not hold"
    # Another subject of the same tenant: the same.
    neighbour = someone()
    gate.grant(neighbour)
    other = agent(gate, shared, "acme", neighbour)
    assert [r.status_code for r in other.merge_documents([{"id": key, "text": "pwned"}])] == [403]
    other.delete_documents([{"id": key}])
    doc = azure_document(azure_search, shared, key)
    assert doc["text"].startswith("secret of") and owner(azure_search, shared, key) == ("acme", victim)
    # A batch mixing an allowed write with a refused one writes nothing.
    mixed = thief.upload_documents([{"id": "fresh1", "text": "mine"}, {"id": key, "text": "pwned"}])
    assert [(r.succeeded, r.status_code) for r in mixed] == [(False, 400), (False, 403)]
    assert azure_document(azure_search, shared, "fresh1") is None


def test_forged_stamps_are_replaced_or_refused(gate, azure_search, shared):
    attacker = someone(GLOBEX)
    gate.grant(attacker, tenant=GLOBEX)
    thief = agent(gate, shared, GLOBEX, attacker)
    results = thief.upload_documents([{"id": "forged1", "text": "x", "lethe_tenant": "acme", "lethe_epoch": 99,
                                       "lethe_layer": "raw", "lethe_expires_at": "2999-01-01T00:00:00Z"}])
    assert results[0].succeeded
    doc = azure_document(azure_search, shared, "forged1")
    assert (doc["lethe_tenant"], doc["lethe_subject"], doc["lethe_epoch"]) == (GLOBEX, attacker, 0)
    deadline = datetime.fromisoformat(doc["lethe_expires_at"].replace("Z", "+00:00"))
    assert deadline < datetime.now(timezone.utc) + timedelta(days=31), "a later deadline is never granted"
    # A bound token naming another subject in the stamp: refused, nothing stored.
    other = thief.upload_documents([{"id": "forged2", "text": "x", "lethe_subject": someone(GLOBEX)}])
    assert (other[0].succeeded, other[0].status_code) == (False, 403) and "scope_violation" in other[0].error_message
    assert azure_document(azure_search, shared, "forged2") is None


def test_unstamped_and_expired_documents_are_never_read_claimed_or_deleted(gate, azure_search, shared):
    azure_store(azure_search, shared).upload_documents([{"id": "unstamped1", "text": "written around Lethe"}])
    subject = someone()
    gate.grant(subject)
    client = agent(gate, shared, "acme", subject)
    service = gate.azure(gate.token("agent"), shared)
    assert [d["id"] for d in service.search("*")] == []
    with pytest.raises(ResourceNotFoundError):
        service.get_document("unstamped1")
    claim = client.upload_documents([{"id": "unstamped1", "text": "mine now"}])
    assert (claim[0].succeeded, claim[0].status_code) == (False, 403)
    client.delete_documents([{"id": "unstamped1"}])
    assert azure_document(azure_search, shared, "unstamped1")["text"] == "written around Lethe"
    # A document asking for an early deadline is dead once it passes, to every read.
    soon = (datetime.now(timezone.utc) + timedelta(seconds=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert client.upload_documents([{"id": "brief1", "text": "brief", "lethe_expires_at": soon}])[0].succeeded
    assert [d["id"] for d in client.search("*")] == ["brief1"]
    wait_for("the deadline to pass", lambda: datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ") > soon)
    assert [d["id"] for d in client.search("*")] == []
    assert client.get_document_count() == 0
    with pytest.raises(ResourceNotFoundError):
        client.get_document("brief1")
    revived = client.merge_documents([{"id": "brief1", "text": "revived"}])
    assert not revived[0].succeeded, "an expired document is not brought back by a merge"
    wait_for("the sweeper to delete it", lambda: azure_document(azure_search, shared, "brief1") is None, deadline=20)


def test_other_spellings_and_other_apis_reach_nothing(gate, azure_search, shared):
    victim, victims = seeded(gate, shared, "acme")
    admin = gate.token("admin", tenant=GLOBEX)
    token = gate.token("agent", tenant=GLOBEX)
    for path in [f"/indexes('{shared.upper()}')/docs/$count?{VERSION}",
                 f"/indexes('{shared}')/docs('{victims[0]}%27%20or%20true')?{VERSION}",
                 f"/indexes('{shared}')/docs('%2E%2E%2F{victims[0]}')?{VERSION}",
                 f"/indexes('{shared}')/docs('_{victims[0]}')?{VERSION}"]:
        status, answer = raw(gate, token, "GET", path)
        assert status == 400 and answer["error"]["code"] == "invalid_request", (path, answer)
    for method, path in [("GET", "/indexers"), ("GET", "/skillsets"), ("GET", "/synonymmaps"), ("GET", "/aliases"),
                         ("GET", "/datasources"), ("GET", "/servicestats"), ("GET", f"/indexes('{shared}')/search.stats"),
                         ("POST", f"/indexes('{shared}')/search.analyze")]:
        status, answer = raw(gate, admin, method, f"{path}?{VERSION}", {} if method == "POST" else None)
        assert status == 404 and answer["error"]["code"] == "unknown_endpoint", (path, answer)
    status, answer = raw(gate, admin, "DELETE", f"/indexes('{shared}')?{VERSION}")
    assert status == 403, answer
    assert azure_store(azure_search, shared).get_document_count() == 3, "the index and its documents are there"
    assert raw(gate, token, "GET", f"/indexes('{shared}')/docs/$count?api-version=2019-05-06")[0] == 400
    assert raw(gate, token, "GET", f"/indexes('{shared}')/docs/$count")[0] == 400


def test_azures_own_key_is_not_a_lethe_token_and_a_token_is_sent_once(gate, azure_search, shared):
    seeded(gate, shared, "acme")
    status, answer = raw(gate, AZURE_SEARCH_KEY, "GET", f"/indexes('{shared}')/docs/$count?{VERSION}")
    assert status == 401 and answer["error"]["code"] == "unauthenticated", answer
    token = gate.token("agent")
    status, answer = raw(gate, token, "GET", f"/indexes('{shared}')/docs/$count?{VERSION}",
                         Authorization=f"Bearer {token}")
    assert status == 401, answer
    status, count = raw(gate, token, "GET", f"/indexes('{shared}')/docs/$count?{VERSION}")
    assert status == 200 and int(count) == 3
    # Azure is sent the route's key: the client's token (its api-key) never reaches it.
    assert azure_store(azure_search, shared).get_document_count() == 3


def test_an_index_made_around_lethe_is_never_read_or_written_through_it(gate, azure_search):
    from azure.core.credentials import AzureKeyCredential
    from azure.search.documents.indexes import SearchIndexClient
    name = f"around-{uuid.uuid4().hex[:8]}"
    SearchIndexClient(azure_search, AzureKeyCredential(AZURE_SEARCH_KEY)).create_index(SearchIndex(name=name, fields=[
        SimpleField(name="id", type=SearchFieldDataType.String, key=True, filterable=True), SearchableField(name="text")]))
    azure_store(azure_search, name).upload_documents([{"id": "x1", "text": "nobody's"}])
    subject = someone()
    gate.grant(subject)
    client = agent(gate, name, "acme", subject)
    for call in (lambda: list(client.search("*")), lambda: client.get_document_count(),
                 lambda: client.upload_documents([{"id": "x2", "text": "mine"}]), lambda: client.get_document("x1")):
        assert refused(call) == (400, "invalid_request")
    assert azure_store(azure_search, name).get_document_count() == 1


def test_the_stamp_is_in_no_suggester_or_scoring_profile_and_a_shared_index_is_no_one_tenants(gate, azure_search,
                                                                                              shared):
    """Issue 38, row 13: a suggester on `lethe_subject` made `suggest` answer the stamp's values, and
    a globex admin could PUT acme's shared index."""
    from azure.core.credentials import AzureKeyCredential
    from azure.search.documents.indexes import SearchIndexClient
    from azure.search.documents.indexes.models import ScoringProfile, SearchSuggester, TextWeights
    admin = gate.azure_indexes(gate.token("admin"))
    fields = [SimpleField(name="id", type=SearchFieldDataType.String, key=True), SearchableField(name="text")]
    for index in (
        SearchIndex(name=f"sug-{uuid.uuid4().hex[:8]}", fields=fields,
                    suggesters=[SearchSuggester(name="s", source_fields=["lethe_subject"])]),
        SearchIndex(name=f"score-{uuid.uuid4().hex[:8]}", fields=fields,
                    scoring_profiles=[ScoringProfile(name="p", text_weights=TextWeights(weights={"lethe_tenant": 5}))]),
    ):
        assert refused(lambda: admin.create_index(index)) == (400, "invalid_request")
        assert refused(lambda: admin.create_or_update_index(index)) == (400, "invalid_request")
    around = SearchIndexClient(azure_search, AzureKeyCredential(AZURE_SEARCH_KEY))
    assert not [n for n in around.list_index_names() if n.startswith(("sug-", "score-"))]

    seeded(gate, shared, "acme")
    before = around.get_index(shared)
    changed = admin.get_index(shared)
    changed.fields.append(SearchableField(name="globex_note"))
    globex_admin = gate.azure_indexes(gate.token("admin", tenant=GLOBEX))
    assert refused(lambda: globex_admin.create_or_update_index(changed)) == (403, "forbidden")
    assert [f.name for f in around.get_index(shared).fields] == [f.name for f in before.fields]
    # Acme's admin, whose tenant alone has documents there, may change it.
    mine = f"mine-{uuid.uuid4().hex[:8]}"
    admin.create_index(SearchIndex(name=mine, fields=fields))
    seeded_index = admin.get_index(mine)
    seeded_index.fields.append(SearchableField(name="note"))
    assert "note" in [f.name for f in admin.create_or_update_index(seeded_index).fields]


def searches(azure_search, index):
    """How many searches, suggests and autocompletes the stand-in has served on `index`."""
    return send(azure_search, "GET", "/_searches")[1].get(index, 0)


def test_counts_facets_and_terms_cost_two_searches_at_most_whatever_the_scope(gate, azure_search):
    """Row 16: `$count`, `count=true`, facets and autocomplete read the caller's whole scope page
    by page first (up to 101 searches for one request). Now: the subjects of the scope from one
    facet (none for a bound caller), their policy as a filter, and the read itself; counted over
    what the caller may see exactly: erased subjects, those whose consent is withdrawn or lets
    Lethe store but not retrieve left out."""
    from azure.search.documents.indexes.models import SearchSuggester
    index = f"scoped-{uuid.uuid4().hex[:10]}"
    gate.azure_indexes(gate.token("admin")).create_index(SearchIndex(name=index, fields=[
        SimpleField(name="id", type=SearchFieldDataType.String, key=True),
        SimpleField(name="n", type=SearchFieldDataType.Int32, filterable=True, facetable=True),
        SearchableField(name="text")], suggesters=[SearchSuggester(name="sg", source_fields=["text"])]))
    many, kept, gone, withdrawn, store_only = (someone() for _ in range(5))
    grants = {s: gate.grant(s) for s in (many, kept, gone, withdrawn)}
    gate.grant(store_only, actions=("store",))

    def upload(subject, n, start=0):
        docs = [{"id": f"{subject.replace('-', '')}{i}", "n": i % 3, "text": f"zebra {subject} {i}"}
                for i in range(start, start + n)]
        assert all(r.succeeded for r in agent(gate, index, TENANT, subject).upload_documents(docs))
    for start in range(0, 2500, 1000):
        upload(many, 1000 if start < 2000 else 500, start)
    for subject in (kept, gone, withdrawn, store_only):
        upload(subject, 3)
    gate.revoke(grants[withdrawn])
    # Erased before anything is counted: the purge's own searches are not the reads'.
    gate.erase_to_completion(gone)

    def costs(call):
        before = searches(azure_search, index)
        answer = call()
        return answer, searches(azure_search, index) - before

    service = gate.azure(gate.token("agent"), index, **{"X-Lethe-Purpose": "personalization"})
    assert costs(service.get_document_count) == (2503, 2)
    counted, cost = costs(lambda: service.search("*", include_total_count=True, top=1).get_count())
    assert (counted, cost) == (2503, 2)
    facets, cost = costs(lambda: service.search("*", facets=["n"], top=0).get_facets())
    assert sorted((f["value"], f["count"]) for f in facets["n"]) == [(0, 835), (1, 834), (2, 834)]
    assert cost == 2
    terms, cost = costs(lambda: {t["text"] for t in service.autocomplete(kept.split("-")[1][:5], "sg")})
    assert (terms, cost) == ({kept.split("-")[1]}, 2)
    terms, cost = costs(lambda: {t["text"] for t in service.autocomplete(withdrawn.split("-")[1][:5], "sg")})
    assert (terms, cost) == (set(), 2), "no term of one whose consent is withdrawn"

    # A caller bound to a subject: no facet first.
    bound = gate.azure_agent(index, kept)
    assert costs(bound.get_document_count) == (3, 1)
    assert costs(lambda: bound.search("*", include_total_count=True).get_count()) == (3, 1)
    assert costs(lambda: gate.azure_agent(index, gone).get_document_count()) == (0, 1)
    assert costs(lambda: gate.azure_agent(index, store_only).get_document_count()) == (0, 1)
    # Another tenant's service sees none of it, at the same cost.
    assert costs(gate.azure(gate.token("agent", tenant=GLOBEX), index).get_document_count) == (0, 2)
