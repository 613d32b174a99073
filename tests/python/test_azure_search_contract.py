"""The Azure AI Search stand-in (`azure_search_standin.py`) against the parts of the service's
published contract the route and connector of issue 26 will rely on, driven with the official
`azure-search-documents` SDK (and plain HTTP where the SDK hides the wire): batch limits and
per-item status, filter semantics and refusals, paging with `@search.nextPageParameters`, count,
get, suggest, autocomplete, vector queries, and what a delete leaves in storage."""

import uuid

import pytest
from azure.core.credentials import AzureKeyCredential
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.search.documents import SearchClient
from azure.search.documents.indexes import SearchIndexClient
from azure.search.documents.indexes.models import (HnswAlgorithmConfiguration, SearchableField, SearchField,
                                                   SearchFieldDataType, SearchIndex, SearchSuggester, SimpleField,
                                                   VectorSearch, VectorSearchProfile)

from conftest import AZURE_SEARCH_KEY, send

KEY = AzureKeyCredential(AZURE_SEARCH_KEY)
VERSION = "api-version=2026-04-01"


@pytest.fixture
def name():
    return f"episodes-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def episodes(azure_search, name):
    """A fresh index of episodic memories (`name`), as the runbook keeps them; its SearchClient."""
    SearchIndexClient(azure_search, KEY).create_index(SearchIndex(
        name=name,
        fields=[SimpleField(name="id", type=SearchFieldDataType.String, key=True),
                SimpleField(name="tenant", type=SearchFieldDataType.String, filterable=True),
                SimpleField(name="user", type=SearchFieldDataType.String, filterable=True, facetable=True),
                SimpleField(name="n", type=SearchFieldDataType.Int32, filterable=True, sortable=True),
                SearchableField(name="text"),
                SearchField(name="tags", type=SearchFieldDataType.Collection(SearchFieldDataType.String),
                            filterable=True),
                SearchField(name="vec", type=SearchFieldDataType.Collection(SearchFieldDataType.Single),
                            searchable=True, vector_search_dimensions=2, vector_search_profile_name="p")],
        suggesters=[SearchSuggester(name="sg", source_fields=["text"])],
        vector_search=VectorSearch(profiles=[VectorSearchProfile(name="p", algorithm_configuration_name="h")],
                                   algorithms=[HnswAlgorithmConfiguration(name="h")])))
    return SearchClient(azure_search, name, KEY)


def seed(client, user, n, tenant="acme"):
    docs = [{"id": f"{user}-{i}", "tenant": tenant, "user": user, "n": i, "text": f"{user} talked about trip {i}",
             "tags": ["travel"] if i % 2 else ["work"], "vec": [1.0, float(i)]} for i in range(n)]
    for start in range(0, n, 1000):
        results = client.upload_documents(docs[start:start + 1000])
        assert all(r.succeeded and r.status_code == 201 for r in results)
    return docs


def test_batches_answer_per_item_and_refuse_over_1000(episodes, azure_search, name):
    seed(episodes, "alice", 2)
    results = episodes.merge_documents([{"id": "alice-0", "n": 10}, {"id": "nobody", "n": 1}])
    assert [(r.key, r.succeeded, r.status_code) for r in results] == [("alice-0", True, 200), ("nobody", False, 404)]
    status, answer = send(azure_search, "POST", f"/indexes('{name}')/docs/search.index?{VERSION}",
                          {"value": [{"@search.action": "upload", "id": f"x{i}"} for i in range(1001)]},
                          headers={"api-key": AZURE_SEARCH_KEY})
    assert status == 400 and answer["error"]["message"], answer
    assert episodes.delete_documents([{"id": "alice-1"}, {"id": "never"}])[1].status_code == 200, "deletes are idempotent"
    assert episodes.get_document_count() == 1


def test_filters_select_what_they_say_and_refuse_what_azure_refuses(episodes):
    seed(episodes, "alice", 4)
    seed(episodes, "bob", 3)
    ids = lambda **kw: sorted(r["id"] for r in episodes.search(**kw))
    assert ids(filter="user eq 'alice' and n ge 2") == ["alice-2", "alice-3"]
    assert ids(filter="search.in(user, 'bob')") == ["bob-0", "bob-1", "bob-2"]
    assert ids(filter="tags/any(t: t eq 'travel') and user eq 'bob'") == ["bob-1"]
    assert ids(filter="not (user eq 'alice') and n lt 1") == ["bob-0"]
    assert ids(search_text="trip", filter="user eq 'nobody' or (user eq 'bob' and n eq 2)") == ["bob-2"]
    for refused in ["user eq 'alice' or", "(user eq 'alice'", "not n gt 1", "text eq 'x'", "n gt null", "user eq \"x\""]:
        with pytest.raises(HttpResponseError):
            list(episodes.search(filter=refused))


def test_results_page_with_next_page_parameters_and_count_facets_get_suggest(episodes, azure_search, name):
    seed(episodes, "alice", 70)
    seed(episodes, "bob", 5)
    results = episodes.search(filter="user eq 'alice'", include_total_count=True, facets=["user"])
    assert results.get_count() == 70
    assert len({r["id"] for r in results}) == 70, "the SDK followed @search.nextPageParameters"
    assert len(list(episodes.search(filter="user eq 'alice'", top=20))) == 20
    # On the wire: a POST's next page is its parameters, and the URL to post them to.
    status, page = send(azure_search, "POST", f"/indexes('{name}')/docs/search.post.search?{VERSION}",
                        {"search": "*", "filter": "user eq 'alice'"}, {"api-key": AZURE_SEARCH_KEY})
    assert status == 200 and len(page["value"]) == 50, page
    assert page["@search.nextPageParameters"] == {"search": "*", "filter": "user eq 'alice'", "skip": 50}
    assert page["@odata.nextLink"].endswith(f"/docs/search.post.search?{VERSION}")
    assert episodes.get_document("alice-3", selected_fields=["id", "n"]) == {"id": "alice-3", "n": 3}
    with pytest.raises(ResourceNotFoundError):
        episodes.get_document("nobody")
    assert episodes.get_document_count() == 75
    suggested = episodes.suggest("tal", "sg", filter="user eq 'bob'")
    assert suggested and all(s["id"].startswith("bob") for s in suggested)
    assert episodes.autocomplete("tri", "sg")[0]["text"] == "trip"


def test_vector_queries_rank_by_similarity_within_the_filter(episodes):
    from azure.search.documents.models import VectorizedQuery
    seed(episodes, "alice", 5)
    seed(episodes, "bob", 5)
    hits = list(episodes.search(vector_queries=[VectorizedQuery(vector=[1.0, 4.0], k_nearest_neighbors=2, fields="vec")],
                                filter="user eq 'bob'"))
    assert [h["id"] for h in hits] == ["bob-4", "bob-3"]


def test_a_delete_leaves_the_documents_bytes_in_storage_until_a_merge(episodes, azure_search, name):
    seed(episodes, "alice", 10)
    stats = lambda: send(azure_search, "GET", f"/indexes('{name}')/search.stats?{VERSION}",
                         headers={"api-key": AZURE_SEARCH_KEY})[1]
    before = stats()["storageSize"]
    episodes.delete_documents([{"id": f"alice-{i}"} for i in range(10)])
    assert episodes.get_document_count() == 0 and list(episodes.search()) == []
    assert stats()["storageSize"] == before, "gone from queries and count, not from storage"
    send(azure_search, "POST", "/_merge")
    assert stats()["storageSize"] == 0
