"""Azure AI Search through Lethe's `azure_search` route, driven with the official
`azure-search-documents` SDK against the local stand-in (`azure_search_standin.py`): the runbook's
episodic index made through Lethe, two users' documents governed on every read and write, the
flip hiding a subject at once, the erasure deleting the subject's 2 500 documents by key in
batches of at most 1 000 and certifying it, the sweeper deleting documents past their deadline.
What the store holds is counted straight in the stand-in with its admin key."""

import uuid

import pytest
from azure.core.credentials import AzureKeyCredential
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.search.documents import SearchClient
from azure.search.documents.indexes import SearchIndexClient
from azure.search.documents.indexes.models import (HnswAlgorithmConfiguration, SearchableField, SearchField,
                                                   SearchFieldDataType, SearchIndex, SearchSuggester, SimpleField,
                                                   VectorSearch, VectorSearchProfile)
from azure.search.documents.models import VectorizedQuery

from conftest import (AZURE_SEARCH_KEY, GLOBEX, azure_document, azure_store, http, own_lethe, send, someone,
                      wait_for)

ROUTE = "azure_search:azure_search"


@pytest.fixture(scope="module")
def gate(chroma, azure_search, tmp_path_factory):
    lethe = own_lethe(chroma, tmp_path_factory.mktemp("azure"),
                      '[erasure]\nretry_backoff = "200ms"\nsettle = "100ms"\nsweep_interval = "500ms"\n',
                      azure_search_url=azure_search, azure_search_settings='text_fields = ["text"]\n')
    yield lethe
    lethe.stop()


def definition(name):
    """The runbook's episodic index: key, the user it is about, its text, a mood to facet on,
    and an embedding."""
    return SearchIndex(
        name=name,
        fields=[SimpleField(name="id", type=SearchFieldDataType.String, key=True),
                SimpleField(name="user_id", type=SearchFieldDataType.String, filterable=True),
                SimpleField(name="mood", type=SearchFieldDataType.String, filterable=True, facetable=True),
                SearchableField(name="text"),
                SearchField(name="vec", type=SearchFieldDataType.Collection(SearchFieldDataType.Single),
                            searchable=True, vector_search_dimensions=2, vector_search_profile_name="p")],
        suggesters=[SearchSuggester(name="sg", source_fields=["text"])],
        vector_search=VectorSearch(profiles=[VectorSearchProfile(name="p", algorithm_configuration_name="h")],
                                   algorithms=[HnswAlgorithmConfiguration(name="h")]))


@pytest.fixture
def index(gate):
    name = f"episodes-{uuid.uuid4().hex[:8]}"
    gate.azure_indexes(gate.token("admin")).create_index(definition(name))
    return name


def held(azure_search, index, subject):
    """How many documents the store holds stamped as the subject's."""
    return azure_store(azure_search, index).search("*", filter=f"lethe_subject eq '{subject}'",
                                              include_total_count=True, top=0).get_count()


def episodes(subject, n, start=0):
    return [{"id": f"{subject}-{i}", "user_id": subject, "mood": "calm" if i % 2 else "tense",
             "text": f"{subject} talked about trip {i}", "vec": [1.0, float(i)]} for i in range(start, start + n)]


def upload(gate, index, subject, n, start=0):
    results = gate.azure_agent(index, subject).upload_documents(episodes(subject, n, start))
    assert all(r.succeeded for r in results), [(r.key, r.status_code, r.error_message) for r in results]


def keys(results):
    return sorted(d["id"] for d in results)


def test_an_index_is_made_by_an_admin_with_the_stamp_fields_and_shown_without_them(gate, azure_search):
    name = f"episodes-{uuid.uuid4().hex[:8]}"
    with pytest.raises(HttpResponseError) as refused:
        gate.azure_indexes(gate.token("agent")).create_index(definition(name))
    assert refused.value.status_code == 403
    admin = gate.azure_indexes(gate.token("admin"))
    made = admin.create_index(definition(name))
    assert all(not f.name.startswith("lethe_") for f in made.fields)
    real = SearchIndexClient(azure_search, AzureKeyCredential(AZURE_SEARCH_KEY)).get_index(name)
    stamp = {f.name: f for f in real.fields if f.name.startswith("lethe_")}
    assert set(stamp) == {"lethe_tenant", "lethe_subject", "lethe_purpose", "lethe_category", "lethe_layer",
                          "lethe_expires_at", "lethe_epoch"}, stamp
    assert all(f.filterable and not f.searchable and not f.sortable for f in stamp.values())
    # Only the subject is facetable: Lethe learns a scope's subjects from it; no client names it.
    assert [n for n, f in stamp.items() if f.facetable] == ["lethe_subject"]
    assert stamp["lethe_expires_at"].type == "Edm.DateTimeOffset"
    shown = admin.get_index(name)
    assert [f.name for f in shown.fields] == ["id", "user_id", "mood", "text", "vec"]
    assert name in admin.list_index_names()
    # Updated with what the client was shown: the stamp fields are added again, none is lost.
    shown.fields.append(SimpleField(name="topic", type=SearchFieldDataType.String, filterable=True))
    admin.create_or_update_index(shown)
    real = SearchIndexClient(azure_search, AzureKeyCredential(AZURE_SEARCH_KEY)).get_index(name)
    assert {"topic", "lethe_subject"} <= {f.name for f in real.fields}


def test_two_users_each_see_only_their_own_in_every_read(gate, azure_search, index):
    alice, bob, carol = someone(), someone(), someone()
    for s in (alice, bob):
        gate.grant(s)
    upload(gate, index, alice, 3)
    upload(gate, index, bob, 4)
    # carol never consented: every action refused, nothing stored.
    results = gate.azure_agent(index, carol).upload_documents(episodes(carol, 2))
    assert [(r.succeeded, r.status_code) for r in results] == [(False, 403)] * 2
    assert "consent_required" in results[0].error_message
    assert held(azure_search, index, carol) == 0
    assert (held(azure_search, index, alice), held(azure_search, index, bob)) == (3, 4)

    client = gate.azure_agent(index, alice)
    found = list(client.search("trip"))
    assert keys(found) == [f"{alice}-{i}" for i in range(3)]
    assert all(not k.startswith("lethe_") for d in found for k in d), "the stamp is Lethe's"
    counted = client.search("*", include_total_count=True)
    assert counted.get_count() == 3
    vector = client.search(None, vector_queries=[VectorizedQuery(vector=[1.0, 5.0], k_nearest_neighbors=10,
                                                                  fields="vec")])
    assert keys(vector) == [f"{alice}-{i}" for i in range(3)]
    hybrid = client.search("trip", vector_filter_mode="postFilter",
                           vector_queries=[VectorizedQuery(vector=[1.0, 5.0], k_nearest_neighbors=50, fields="vec")])
    assert keys(hybrid) == [f"{alice}-{i}" for i in range(3)]
    suggested = client.suggest("tal", "sg")
    assert sorted(s["id"] for s in suggested) == [f"{alice}-{i}" for i in range(3)]
    assert client.autocomplete(alice.split("-")[1][:4], "sg") != []
    assert client.autocomplete(bob.split("-")[1][:4], "sg") == [], "no term of bob's documents"
    assert client.get_document(f"{alice}-1")["text"] == f"{alice} talked about trip 1"
    with pytest.raises(ResourceNotFoundError):
        client.get_document(f"{bob}-1")
    assert client.get_document_count() == 3
    facets = client.search("*", facets=["mood"]).get_facets()
    assert sorted((f["value"], f["count"]) for f in facets["mood"]) == [("calm", 1), ("tense", 2)]

    # The tenant's service (no subject) sees both, in one count; another tenant neither.
    service = gate.azure(gate.token("agent"), index, **{"X-Lethe-Purpose": "personalization"})
    assert service.get_document_count() == 7
    assert len(keys(service.search("*"))) == 7
    globex = gate.azure(gate.token("agent", tenant=GLOBEX), index)
    assert list(globex.search("*")) == [] and globex.get_document_count() == 0


def test_paging_follows_the_next_page_narrowed_again(gate, azure_search, index):
    alice, bob = someone(), someone()
    for s in (alice, bob):
        gate.grant(s)
    upload(gate, index, alice, 120)
    upload(gate, index, bob, 5)
    # No top: Azure pages by 50 and the SDK posts @search.nextPageParameters back.
    seen = keys(gate.azure_agent(index, alice).search("*"))
    assert seen == sorted(f"{alice}-{i}" for i in range(120))
    # On the wire: the next page is the client's own request; Azure's link is not passed on.
    asked = {"search": "*", "filter": "mood eq 'calm'"}
    status, page = send(f"http://{gate.data}/azure_search", "POST",
                        f"/indexes('{index}')/docs/search.post.search?api-version=2026-04-01", asked,
                        {"api-key": gate.token("agent", alice), "X-Lethe-Purpose": "personalization"})
    assert status == 200 and len(page["value"]) == 50, page
    assert page["@search.nextPageParameters"] == {**asked, "skip": 50}
    assert "@odata.nextLink" not in page


def test_the_flip_hides_the_subject_at_once_and_refuses_late_writes(gate, azure_search, index):
    gone, kept = someone(), someone()
    for s in (gone, kept):
        gate.grant(s)
    upload(gate, index, gone, 3)
    upload(gate, index, kept, 2)
    gate.flip(gone)
    service = gate.azure(gate.token("agent"), index, **{"X-Lethe-Purpose": "personalization"})
    assert keys(service.search("*")) == [f"{kept}-0", f"{kept}-1"], "the very next read"
    assert service.search("*", include_total_count=True).get_count() == 2
    assert service.get_document_count() == 2
    facets = service.search("*", facets=["mood"]).get_facets()
    assert sorted((f["value"], f["count"]) for f in facets["mood"]) == [("calm", 1), ("tense", 1)]
    assert service.autocomplete(kept.split("-")[1][:4], "sg") != []
    assert service.autocomplete(gone.split("-")[1][:4], "sg") == [], "no term of the subject's documents"
    assert list(gate.azure_agent(index, gone).search("*")) == []
    with pytest.raises(ResourceNotFoundError):
        service.get_document(f"{gone}-0")
    late = gate.azure_agent(index, gone).upload_documents(episodes(gone, 1, start=10))
    assert [(r.succeeded, r.status_code) for r in late] == [(False, 403)]
    assert "subject_suppressed" in late[0].error_message


def test_the_erasure_deletes_2500_documents_by_key_in_batches_of_at_most_1000(gate, azure_search, index):
    gone, kept = someone(), someone()
    for s in (gone, kept):
        gate.grant(s)
    for start in range(0, 2500, 1000):
        upload(gate, index, gone, min(1000, 2500 - start), start=start)
    upload(gate, index, kept, 7)
    assert (held(azure_search, index, gone), held(azure_search, index, kept)) == (2500, 7)
    status, _ = send(azure_search, "POST", "/indexers?api-version=2026-04-01",
                     {"name": f"feed-{index}", "dataSourceName": "episodes-blob", "targetIndexName": index},
                     {"api-key": AZURE_SEARCH_KEY})
    assert status == 201
    assert gate.dry_run(gone)[ROUTE] == 2500
    before = len(http("GET", f"{azure_search}/_batches")[1].get(index, []))
    done, results = gate.erase_to_completion(gone, deadline=120)
    result = results[ROUTE]
    assert (result["before"], result["deleted"], result["remaining"]) == (2500, 2500, 0), result
    assert (held(azure_search, index, gone), held(azure_search, index, kept)) == (0, 7), "counted in the store"
    purge = http("GET", f"{azure_search}/_batches")[1][index][before:]
    assert sum(purge) == 2500 and max(purge) <= 1000, purge
    status, document = gate.call("GET", f"/v1/erasures/{done['id']}/certificate")
    assert status == 200, document
    certified = next(s for s in document["certificate"]["stores"] if s["target"] == ROUTE)
    assert (certified["before"], certified["deleted"], certified["remaining"]) == (2500, 2500, 0), certified
    segments = [c for c in result["physical"]["remaining"] if c["place"] == f"index {index}: its segments"]
    assert segments and segments[0]["unknown"] and "merge" in segments[0]["why"], result["physical"]
    # An indexer feeding the index (made straight on the service): its data source is named.
    fed = [c for c in result["physical"]["remaining"] if c["place"].startswith("data source episodes-blob")]
    assert fed and fed[0]["unknown"] and f"feeds index {index}" in fed[0]["place"], result["physical"]


def test_the_sweeper_deletes_documents_past_their_deadline_and_no_others(gate, azure_search, index):
    short, long = someone(GLOBEX), someone(GLOBEX)
    dpo = gate.token("compliance", tenant=GLOBEX)
    rules = lambda age: gate.call("PUT", "/v1/retention-rules", {"rules": [
        {"purpose": "personalization", "category": "preference", "max_age": age},
        {"purpose": "support", "category": "preference", "max_age": "30d"}]}, token=dpo)
    assert rules("3s")[0] == 200
    try:
        for s, purpose in ((short, "personalization"), (long, "support")):
            status, grant = gate.call("POST", "/v1/consents", {
                "tenant": GLOBEX, "subject": s, "purpose": purpose, "category": "preference",
                "actions": ["store", "retrieve"], "source": "pytest", "policy_version": 1}, token=dpo)
            assert status == 201, grant
        gate.azure_agent(index, short, tenant=GLOBEX).upload_documents(episodes(short, 2))
        gate.azure_agent(index, long, purpose="support", tenant=GLOBEX).upload_documents(episodes(long, 2))
        assert (held(azure_search, index, short), held(azure_search, index, long)) == (2, 2)
        wait_for("the sweeper to delete the short-lived documents", lambda: held(azure_search, index, short) == 0,
                 deadline=20)
        assert held(azure_search, index, long) == 2
    finally:
        assert rules("30d")[0] == 200


def test_the_lexical_probe_stops_an_erasure_that_left_an_unattributed_document(chroma, azure_search, tmp_path):
    """A batch job wrote a summary about the subject straight into Azure, without a stamp: the
    purge cannot attribute it, the probe finds the subject's key through `search=` in the route's
    text field, and the erasure goes to exception for a person to review; once the copy is removed
    at its source and the erasure resumed, it completes. Another subject's document that mentions
    the erased one is that subject's, and stays."""
    instance = own_lethe(chroma, tmp_path, '[erasure]\nretry_backoff = "100ms"\nmax_attempts = 2\nprobes = ["{subject}"]\n',
                         azure_search_url=azure_search, azure_search_settings='text_fields = ["text"]\n')
    try:
        name = f"episodes-{uuid.uuid4().hex[:8]}"
        instance.azure_indexes(instance.token("admin")).create_index(definition(name))
        gone, other = someone(), someone()
        for s in (gone, other):
            instance.grant(s)
        upload(instance, name, gone, 2)
        mention = {"id": "mention1", "user_id": other, "text": f"met {gone} at the station"}
        assert instance.azure_agent(name, other).upload_documents([mention])[0].succeeded
        azure_store(azure_search, name).upload_documents([{"id": "copy1", "text": f"summary of {gone}: likes tea"}])

        status, filed = instance.call("POST", "/v1/erasures", {"subject": gone, "ticket": "DSR-P", "reason": "art. 17"})
        assert status == 201
        assert instance.call("POST", f"/v1/erasures/{filed['id']}/approve")[0] == 200
        request = lambda: instance.call("GET", f"/v1/erasures/{filed['id']}")[1]
        wait_for("the erasure to stop for review", lambda: request()["state"] == "exception", deadline=30)
        target = next(t for t in request()["targets"] if t["target"] == ROUTE)
        assert "verification probe found 1 records" in target["last_error"], target
        assert held(azure_search, name, gone) == 0
        assert instance.cli("erase", "--tenant", "acme", "--review", filed["id"]).returncode == 0
        azure_store(azure_search, name).delete_documents([{"id": "copy1"}])
        assert instance.cli("erase", "--tenant", "acme", "--resume", filed["id"]).returncode == 0
        wait_for("the resumed erasure to complete", lambda: request()["state"] == "completed", deadline=30)
        assert azure_store(azure_search, name).get_document("mention1")["text"] == mention["text"]
    finally:
        instance.stop()


def test_the_runbooks_app_needs_no_lethe_header(chroma, azure_search, tmp_path):
    """The runbook's app, unchanged but for the endpoint and key: no Lethe header; the route names
    the subject field (`user_id`) and a default purpose and category. Its own erasure query
    (`search_text="", filter=user_id eq ..., select=["id"]`) answers within the token's tenant."""
    settings = 'subject_field = "user_id"\npurpose = "personalization"\ncategory = "preference"\n'
    instance = own_lethe(chroma, tmp_path, "", azure_search_url=azure_search, azure_search_settings=settings)
    try:
        name = f"episodes-{uuid.uuid4().hex[:8]}"
        instance.azure_indexes(instance.token("admin")).create_index(definition(name))
        u1, u2 = someone(), someone()
        instance.grant(u1)
        app = SearchClient(f"http://{instance.data}/azure_search", name, AzureKeyCredential(instance.token("agent")))
        assert all(r.succeeded for r in app.upload_documents(episodes(u1, 3)))
        refused = app.upload_documents(episodes(u2, 1))
        assert (refused[0].succeeded, refused[0].status_code) == (False, 403), "u2 never consented"
        assert held(azure_search, name, u1) == 3 and held(azure_search, name, u2) == 0
        found = app.search(search_text="", filter=f"user_id eq '{u1}'", select=["id"])
        assert keys(found) == [f"{u1}-{i}" for i in range(3)]
        globex = SearchClient(f"http://{instance.data}/azure_search", name,
                              AzureKeyCredential(instance.token("agent", tenant=GLOBEX)))
        assert list(globex.search(search_text="", filter=f"user_id eq '{u1}'", select=["id"])) == []
    finally:
        instance.stop()


# Long enough to be quoted (a quote is 12 consecutive words).
ALLERGY = ("alice told the assistant that she is severely allergic to peanuts and carries an "
           "epipen in her bag wherever she travels for work")


def test_a_document_quoting_another_subjects_derives_from_it_and_is_refused_after_her_flip(gate, azure_search, index):
    alice, bob = someone(), someone()
    for s in (alice, bob):
        gate.grant(s)
    assert gate.azure_agent(index, alice).upload_documents([{"id": "a1", "text": ALLERGY}])[0].succeeded
    bobs = gate.azure_agent(index, bob)
    assert bobs.upload_documents([{"id": "b1", "text": "bob heard that " + ALLERGY}])[0].succeeded
    assert azure_store(azure_search, index).get_document("b1")["lethe_layer"] == "derived"
    status, lineage = gate.call("GET", f"/v1/lineage/azure_search/{index}/b1")
    assert status == 200 and [(p["store"], p["item"], p["how"]) for p in lineage["parents"]] == \
        [("azure_search", "a1", "quote")], lineage

    erasure = gate.flip(alice)
    assert keys(bobs.search("*")) == [], "bob's derivative is hidden at the flip"
    late = bobs.upload_documents([{"id": "b2", "text": "again: " + ALLERGY}])
    assert (late[0].succeeded, late[0].status_code) == (False, 403) and "derived_from_erased" in late[0].error_message
    assert azure_document(azure_search, index, "b2") is None, "nothing of the refused batch is written"
    status, listed = gate.call("GET", f"/v1/erasures/{erasure}/derivatives")
    assert status == 200, listed
    assert [(d["item"], d["decision"]) for d in listed["derivatives"] if d["store"] == "azure_search"] == \
        [("b1", "undecided")]


def test_writers_racing_the_erasure_never_leave_a_document_behind_or_readable(gate, azure_search, index):
    import threading
    rounds, accepted_in_all = 4, 0
    for round_ in range(rounds):
        subject = someone()
        gate.grant(subject)
        accepted, refusals, unexpected = [], [], []

        def writer(w):
            client = gate.azure_agent(index, subject)
            for i in range(10_000):
                key = f"{subject}-w{w}-{i}"
                try:
                    result = client.upload_documents([{"id": key, "user_id": subject, "text": f"memory {i}"}])[0]
                except Exception as e:
                    unexpected.append(str(e))
                    return
                if result.succeeded:
                    accepted.append(key)
                    continue
                message = result.error_message or ""
                (refusals if "subject_suppressed" in message or "stale_epoch" in message else unexpected).append(message)
                return

        writers = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
        for t in writers:
            t.start()
        wait_for("writes before the flip", lambda: len(accepted) >= 5, deadline=20)
        request = gate.flip(subject)
        service = gate.azure(gate.token("agent"), index, **{"X-Lethe-Purpose": "personalization"})
        assert list(service.search("*", filter=f"user_id eq '{subject}'")) == [], "readable by nobody at once"
        for t in writers:
            t.join(timeout=30)
        assert not unexpected, unexpected[:3]
        assert len(refusals) == 3, "every writer was refused once the subject was suppressed"
        wait_for("the erasure to complete",
                 lambda: gate.call("GET", f"/v1/erasures/{request}")[1]["state"] == "completed", deadline=60)
        # Counted straight in the store: nothing of the subject, whatever was accepted.
        assert held(azure_search, index, subject) == 0
        assert [k for k in accepted if azure_document(azure_search, index, k)] == []
        accepted_in_all += len(accepted)
    print(f"\nracing writers: {rounds} rounds, {accepted_in_all} documents accepted before the flips, 0 left")
