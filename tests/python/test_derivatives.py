"""Derivative lineage end to end, as an agent app runs it: the official `chromadb`, `openai` and
`langgraph_sdk` clients, instrumented with OpenTelemetry's httpx instrumentation (it sends the
W3C `traceparent` on its own; no header is set by hand), against a real Chroma, a real LangGraph
server and the provider stand-in. What an erasure's closure reaches is checked in the stores
themselves: what the flip hides, what the request lists, what each decision does, what is left.
"""

import uuid

import pytest
from conftest import GLOBEX, TENANT, Lethe, http, new_database, someone, two_tenant_lethe, wait_for

EMBEDDING = [0.1, 0.2, 0.3]

# Alice's memories: long enough to be quoted (a quote is 12 consecutive words).
ALLERGY = ("alice told the assistant that she is severely allergic to peanuts and carries an "
           "epipen in her bag wherever she travels for work")
FAMILY = ("her daughter starts school in lisbon this september and alice wants reminders about "
          "the uniform fittings and the bus timetable")
WORK = ("alice is moving to the berlin office in march and asked the assistant to keep her "
        "visa appointment and the relocation checklist in mind")


@pytest.fixture
def setup(chroma, langgraph, provider, qdrant, tmp_path):
    erasure = '[erasure]\nretry_backoff = "200ms"\nsettle = "200ms"\nsweep_interval = "1h"\n'
    instance = two_tenant_lethe(chroma, tmp_path, erasure, langgraph_url=langgraph, openai_url=provider,
                                qdrant_url=qdrant.url)
    yield instance
    instance.stop()


def people(lethe, *names):
    subjects = {n: someone() for n in names}
    for s in subjects.values():
        lethe.grant(s)
        lethe.grant_provider(s)
    return subjects


def lineage(lethe, store, collection, item):
    status, body = lethe.call("GET", f"/v1/lineage/{store}/{collection}/{item}")
    assert status == 200, body
    return body


def parents(lethe, collection, item):
    """(store, collection, item, how) of an item's parents."""
    return {(p["store"], p["collection"], p["item"], p["how"]) for p in lineage(lethe, "chroma", collection, item)["parents"]}


def held(direct, name, ids):
    """The ids Chroma itself holds of `ids`."""
    return set(direct.get_collection(name).get(ids=list(ids))["ids"])


def readable(lethe, subject, name, ids):
    """The ids `subject`'s own agent is served."""
    return set(lethe.agent(subject).get_collection(name).get(ids=list(ids))["ids"])


def request(lethe, id):
    return lethe.call("GET", f"/v1/erasures/{id}")[1]


def derivatives(lethe, id):
    status, listed = lethe.call("GET", f"/v1/erasures/{id}/derivatives")
    assert status == 200, listed
    return listed["derivatives"]


def decide(lethe, id, refs, decision):
    status, body = lethe.call("POST", f"/v1/erasures/{id}/derivatives/decide",
                              {"refs": refs, "decision": decision, "reason": "reviewed by the DPO"})
    assert status == 200, body
    return body


def test_what_was_made_from_alices_data_goes_with_her_and_nothing_else_does(setup, direct, traced):
    lethe = setup
    who = people(lethe, "alice", "bob", "carol", "dave", "erin")
    alice, bob, carol, dave, erin = (who[n] for n in ("alice", "bob", "carol", "dave", "erin"))
    name, cid = lethe.new_collection()
    add = lambda subject, id, text: lethe.agent(subject).get_collection(name).add(
        ids=[id], embeddings=[EMBEDDING], documents=[text], metadatas=[{"user": subject}])
    add(alice, "a-allergy", ALLERGY)
    add(alice, "a-family", FAMILY)
    add(alice, "a-work", WORK)

    # A RAG chain for bob: it reads alice's memories, asks the model to summarise them, and
    # keeps the summary in bob's memory, all under one trace.
    service = lethe.agent().get_collection(name)
    with traced.start_as_current_span("summarise for bob"):
        memories = service.get(ids=["a-allergy", "a-family"], include=["documents"])["documents"]
        summary = lethe.openai(bob).chat.completions.create(
            model="rewrite", messages=[{"role": "user", "content": "summarise: " + " ".join(memories)}],
        ).choices[0].message.content
        add(bob, "b-summary", summary)
    # Bob's note quotes twenty words of hers, with no trace in common.
    add(bob, "b-note", "from the meeting: " + " ".join(ALLERGY.split()[:20]))
    # Carol's app asks the model about alice's move (one trace), and later, in another trace,
    # keeps what the model answered: carol's note derives from alice's data through the answer
    # only (the rewritten answer shares no run of words with alice's).
    with traced.start_as_current_span("carol asks"):
        answer = lethe.openai(carol).chat.completions.create(
            model="rewrite", messages=[{"role": "user", "content": WORK}]).choices[0].message.content
    with traced.start_as_current_span("carol keeps"):
        add(carol, "c-answer", answer)
    # Dave quotes bob's summary: a derivative of a derivative.
    add(dave, "d-quote", "dave copied: " + summary)
    # Erin shares a common phrase with alice, eight words: not a quote.
    add(erin, "e-phrase", "my colleague " + " ".join(ALLERGY.split()[8:16]) + " too")
    # Another tenant's note holds alice's very words: tenants never share lineage.
    globex = lethe.token("compliance", tenant=GLOBEX)
    gina = someone(GLOBEX)
    status, _ = lethe.call("POST", "/v1/consents", {"tenant": GLOBEX, "subject": gina, "purpose": "personalization",
                                                    "category": "preference", "actions": ["store", "retrieve"],
                                                    "source": "pytest", "policy_version": 1}, token=globex)
    assert status == 201
    globex_name = f"globex-{uuid.uuid4().hex[:8]}"
    lethe.client(lethe.token("admin")).create_collection(globex_name, embedding_function=None)
    lethe.client(lethe.token("agent", gina, tenant=GLOBEX), **{"X-Lethe-Purpose": "personalization",
                                                                 "X-Lethe-Category": "preference"}
                 ).get_collection(globex_name).add(ids=["g-copy"], embeddings=[EMBEDDING], documents=[ALLERGY])

    # The edges, as lineage recorded them.
    summary_parents = parents(lethe, cid, "b-summary")
    assert {("chroma", cid, "a-allergy", "trace"), ("chroma", cid, "a-family", "trace")} <= summary_parents
    assert any(p[0] == "openai" and p[1] == "answers" and p[3] in ("trace", "provider") for p in summary_parents), summary_parents
    assert parents(lethe, cid, "b-note") == {("chroma", cid, "a-allergy", "quote")}
    carol_parents = parents(lethe, cid, "c-answer")
    assert [p[:2] + (p[3],) for p in carol_parents] == [("openai", "answers", "provider")], carol_parents
    carols_answer = next(iter(carol_parents))[2]
    answer_lineage = lineage(lethe, "openai", "answers", carols_answer)
    assert [(p["item"], p["how"]) for p in answer_lineage["parents"]] == [("a-work", "quote")]
    dave_parents = parents(lethe, cid, "d-quote")
    assert ("chroma", cid, "b-summary", "quote") in dave_parents
    assert not any(p[2].startswith("a-") for p in dave_parents), "dave never read alice's memories"
    assert parents(lethe, cid, "e-phrase") == set()
    for layer_of, expected in (("b-summary", "derived"), ("e-phrase", "raw")):
        meta = direct.get_collection(name).get(ids=[layer_of], include=["metadatas"])["metadatas"][0]
        assert meta["lethe_layer"] == expected

    # Before filing, the dry run counts what the flip would hide.
    status, dry = lethe.call("POST", "/v1/erasures/dry-run", {"subject": alice})
    assert status == 200, dry
    by_store = {d["store"]: d for d in dry["derivatives"]}
    assert (by_store["chroma"]["own"], by_store["chroma"]["other"]) == (0, 4), dry

    derived = {"b-summary", "b-note", "c-answer", "d-quote"}
    assert parents(lethe, cid, "a-work") == set(), "her own memory derives from nothing"
    untouched = {"e-phrase"}
    id = lethe.flip(alice)
    # At once: every derivative is hidden from its own subject's reads, still in Chroma.
    owners = {"b-summary": bob, "b-note": bob, "c-answer": carol, "d-quote": dave, "e-phrase": erin}
    for item in derived | untouched:
        assert readable(lethe, owners[item], name, [item]) == ({item} if item in untouched else set()), item
    assert held(direct, name, derived | untouched) == derived | untouched
    listed = {(d["store"], d["item"]): d for d in derivatives(lethe, id)}
    for item in derived:
        assert listed[("chroma", item)]["decision"] == "undecided", listed
        assert listed[("chroma", item)]["own"] is False
    assert ("chroma", "e-phrase") not in listed
    assert {d["decision"] for (store, _), d in listed.items() if store == "openai"} == {"guard"}
    # Writes that would bring alice's data back are refused, and nothing is written.
    bobs = lethe.agent(bob).get_collection(name)
    with pytest.raises(Exception, match="derived_from_erased"):
        bobs.add(ids=["b-again"], embeddings=[EMBEDDING], documents=["again: " + ALLERGY])
    assert held(direct, name, {"b-again"}) == set()

    # Every store purged: the request waits for a person.
    wait_for("the purge to wait for the review", lambda: request(lethe, id)["state"] == "verifying", deadline=30)
    refs = {item: listed[("chroma", item)]["ref"] for item in derived}
    decide(lethe, id, [refs["b-note"]], "release")
    done = decide(lethe, id, [refs[i] for i in ("b-summary", "c-answer", "d-quote")], "erase")
    # Not completed by the decision itself: what it erases is purged and counted gone first.
    assert done["state"] != "completed", done
    wait_for("the erasure to complete", lambda: request(lethe, id)["state"] == "completed", deadline=30)

    # What Chroma holds now: the erased derivatives are gone, the released one and the others
    # stay, and bob reads his note again; it no longer derives from alice.
    assert held(direct, name, derived | untouched) == {"b-note"} | untouched
    assert readable(lethe, bob, name, ["b-note"]) == {"b-note"}
    assert parents(lethe, cid, "b-note") == set()
    assert direct.get_collection(globex_name).get(ids=["g-copy"])["ids"] == ["g-copy"]
    status, certificate = lethe.call("GET", f"/v1/erasures/{id}/certificate")
    assert status == 200, certificate
    counted = {d["store"]: d for d in certificate["certificate"]["derivatives"]}
    assert (counted["chroma"]["found"], counted["chroma"]["erased"], counted["chroma"]["released"]) == (4, 3, 1)
    assert counted["openai"]["guarded"] == 2
    chroma_store = next(s for s in certificate["certificate"]["stores"] if s["target"] == "chroma:chroma")
    assert chroma_store["derivatives"]["others_remaining"] == 0


def refused_code(call):
    """Lethe's error code of a call the LangGraph SDK raised for."""
    import httpx
    with pytest.raises(httpx.HTTPStatusError) as e:
        call()
    return e.value.response.json().get("error", {}).get("code")


def test_a_job_that_read_alices_thread_cannot_write_it_back_after_her_flip(setup, langgraph, traced):
    lethe = setup
    who = people(lethe, "alice", "bob")
    alice, bob = who["alice"], who["bob"]
    as_alice = lethe.graph_agent(alice)
    thread = as_alice.threads.create()["thread_id"]
    as_alice.runs.wait(thread, "agent", input={"messages": [ALLERGY]})
    # A nightly job reads the transcript and keeps the facts it finds, for bob's assistant.
    job = lethe.graph_agent()
    facts_for_bob = lethe.graph_agent(bob)
    with traced.start_as_current_span("nightly extraction"):
        transcript = job.threads.get_state(thread)["values"]["messages"]
        facts_for_bob.store.put_item([TENANT, bob, "facts"], "allergy", {"fact": transcript[0]})
        id = lethe.flip(alice)
        # Its replay, under the same trace, after the flip: refused, and nothing is written.
        assert refused_code(lambda: facts_for_bob.store.put_item(
            [TENANT, bob, "facts"], "allergy-again", {"fact": "as before"})) == "derived_from_erased"
    # Without its trace, the quote alone is enough.
    assert refused_code(lambda: facts_for_bob.store.put_item(
        [TENANT, bob, "facts"], "allergy-later", {"fact": transcript[0]})) == "derived_from_erased"
    items = lambda: {i["key"] for i in http("POST", f"{langgraph}/store/items/search",
                                           body={"namespace_prefix": [TENANT, bob], "limit": 100})[1]["items"]}
    assert items() == {"allergy"}
    listed = derivatives(lethe, id)
    fact = next(d for d in listed if d["store"] == "langgraph" and d["collection"] == "store")
    assert fact["decision"] == "undecided" and ("trace" in fact["how"] or "quote" in fact["how"])
    wait_for("the purge to wait for the review", lambda: request(lethe, id)["state"] == "verifying", deadline=30)
    decide(lethe, id, [fact["ref"]], "erase")
    wait_for("the erasure to complete", lambda: request(lethe, id)["state"] == "completed", deadline=30)
    assert items() == set(), "nothing of the job's work is left"


def test_two_replicas_on_one_state_store_link_a_read_and_a_write_under_one_trace(chroma, direct, traced, tmp_path):
    """A read served by one replica and a write received by another, under one trace: linked,
    through the PostgreSQL state store they share."""
    state = new_database()
    first = Lethe(state, chroma, tmp_path)
    second = Lethe(state, chroma, tmp_path)
    try:
        alice, bob = someone(), someone()
        for s in (alice, bob):
            first.grant(s)
        name = f"shared-{uuid.uuid4().hex[:8]}"
        cid = str(first.client(first.token("admin")).create_collection(name, embedding_function=None).id)
        first.agent(alice).get_collection(name).add(ids=["a1"], embeddings=[EMBEDDING], documents=["alice likes tea"])
        with traced.start_as_current_span("across replicas"):
            first.agent(alice).get_collection(name).get(ids=["a1"])
            second.agent(bob).get_collection(name).add(ids=["b1"], embeddings=[EMBEDDING], documents=["bob's unrelated words"])
        for replica in (first, second):
            body = replica.call("GET", f"/v1/lineage/chroma/{cid}/b1")[1]
            assert [(p["item"], p["how"]) for p in body["parents"]] == [("a1", "trace")], body
    finally:
        first.stop()
        second.stop()


def test_a_qdrant_batch_quoting_alice_derives_from_her_and_is_refused_after_her_flip(setup, qdrant, traced):
    import json
    from qdrant_client import models
    from qdrant_client.http.exceptions import UnexpectedResponse
    lethe = setup
    who = people(lethe, "alice", "bob")
    alice, bob = who["alice"], who["bob"]
    collection = f"facts-{uuid.uuid4().hex[:8]}"
    lethe.qdrant(lethe.token("admin")).create_collection(
        collection, vectors_config=models.VectorParams(size=3, distance=models.Distance.COSINE))
    lethe.qdrant_agent(alice).upsert(collection, [models.PointStruct(id=1, vector=EMBEDDING, payload={"text": ALLERGY})])
    bobs = lethe.qdrant_agent(bob)
    quote = lambda id: models.UpsertOperation(upsert=models.PointsList(points=[
        models.PointStruct(id=id, vector=EMBEDDING, payload={"text": "bob heard that " + ALLERGY})]))
    bobs.batch_update_points(collection, [quote(2)])
    direct = qdrant.client()
    assert direct.retrieve(collection, ids=[2], with_payload=True)[0].payload["lethe_layer"] == "derived"
    body = lineage(lethe, "qdrant", collection, "2")
    assert [(p["store"], p["item"], p["how"]) for p in body["parents"]] == [("qdrant", "1", "quote")]

    id = lethe.flip(alice)
    assert direct.retrieve(collection, ids=[2]) != [], "still in Qdrant, hidden"
    assert bobs.retrieve(collection, ids=[2]) == [], "hidden from bob at the flip"
    with pytest.raises(UnexpectedResponse) as refused:
        bobs.batch_update_points(collection, [quote(3)])
    assert (refused.value.status_code, json.loads(refused.value.content)["error"]["code"]) == (409, "derived_from_erased")
    assert direct.retrieve(collection, ids=[3]) == [], "nothing of the refused batch is written"
    listed = [d for d in derivatives(lethe, id) if d["store"] == "qdrant"]
    assert [(d["item"], d["decision"]) for d in listed] == [("2", "undecided")]


def test_a_qdrant_payload_edit_quoting_alice_derives_from_her_and_is_refused_after_her_flip(setup, qdrant):
    import json
    from qdrant_client import models
    from qdrant_client.http.exceptions import UnexpectedResponse
    lethe = setup
    who = people(lethe, "alice", "bob")
    alice, bob = who["alice"], who["bob"]
    collection = f"edits-{uuid.uuid4().hex[:8]}"
    lethe.qdrant(lethe.token("admin")).create_collection(
        collection, vectors_config=models.VectorParams(size=3, distance=models.Distance.COSINE))
    point = lambda id, payload: models.PointStruct(id=id, vector=EMBEDDING, payload=payload)
    lethe.qdrant_agent(alice).upsert(collection, [point(1, {"text": ALLERGY}), point(2, {"text": FAMILY})])
    bobs = lethe.qdrant_agent(bob)
    bobs.upsert(collection, [point(10, {"text": "bob's own reminder about the dentist"}),
                             point(11, {"text": "bob likes jazz", "kind": "note"}),
                             point(12, {"text": "bob's running plan"})])
    direct = qdrant.client()
    layers = lambda: {p.id: p.payload["lethe_layer"] for p in direct.retrieve(collection, ids=[10, 11, 12], with_payload=True)}
    assert layers() == {10: "raw", 11: "raw", 12: "raw"}
    # A payload set by id, an overwrite by filter, and an edit that quotes nobody.
    bobs.set_payload(collection, payload={"text": "bob heard that " + ALLERGY}, points=[10])
    notes = models.Filter(must=[models.FieldCondition(key="kind", match=models.MatchValue(value="note"))])
    bobs.overwrite_payload(collection, payload={"text": "summary: " + FAMILY, "kind": "note"},
                           points=models.FilterSelector(filter=notes))
    bobs.set_payload(collection, payload={"topic": "running"}, points=[12])
    assert layers() == {10: "derived", 11: "derived", 12: "raw"}
    found = lambda id: [(p["store"], p["item"], p["how"]) for p in lineage(lethe, "qdrant", collection, id)["parents"]]
    assert found("10") == [("qdrant", "1", "quote")]
    assert found("11") == [("qdrant", "2", "quote")]

    id = lethe.flip(alice)
    assert bobs.retrieve(collection, ids=[10, 11]) == [], "hidden from bob at the flip"
    assert [p.id for p in bobs.retrieve(collection, ids=[12])] == [12]
    listed = [d for d in derivatives(lethe, id) if d["store"] == "qdrant"]
    assert sorted((d["item"], d["decision"]) for d in listed) == [("10", "undecided"), ("11", "undecided")]
    with pytest.raises(UnexpectedResponse) as refused:
        bobs.set_payload(collection, payload={"text": "again: " + ALLERGY}, points=[12])
    assert (refused.value.status_code, json.loads(refused.value.content)["error"]["code"]) == (409, "derived_from_erased")
    kept = direct.retrieve(collection, ids=[12], with_payload=True)[0].payload
    assert (kept["text"], kept["topic"], kept["lethe_layer"]) == ("bob's running plan", "running", "raw"), "nothing written"


def test_conversation_items_quoting_alice_derive_from_her_and_are_refused_after_her_flip(setup, provider):
    import openai
    lethe = setup
    who = people(lethe, "alice", "bob")
    alice, bob = who["alice"], who["bob"]
    lethe.grant_provider(bob, ("send_to_provider", "provider_retention"))
    name, cid = lethe.new_collection()
    lethe.agent(alice).get_collection(name).add(ids=["a1", "a2"], embeddings=[EMBEDDING] * 2, documents=[ALLERGY, FAMILY])
    bobs = lethe.openai(bob)
    said = lambda text: [{"type": "message", "role": "user", "content": text}]
    # A conversation opened with a quote of hers, and an item added to another that quotes her.
    opened = bobs.conversations.create(items=said("my colleague mentioned that " + FAMILY))
    talk = bobs.conversations.create()
    added = bobs.conversations.items.create(talk.id, items=said("note for later: " + ALLERGY)).data[0].id
    own = bobs.conversations.items.create(talk.id, items=said("bob's own words about his weekend")).data[0].id
    found = lambda collection, item: [(p["store"], p["item"], p["how"])
                                      for p in lineage(lethe, "openai", collection, item)["parents"]]
    assert found("conversations", opened.id) == [("chroma", "a2", "quote")]
    assert found("conversation_items", f"{talk.id}/{added}") == [("chroma", "a1", "quote")]
    assert found("conversation_items", f"{talk.id}/{own}") == []
    # A response the provider stores has its edges before it is kept.
    stored = bobs.responses.create(model="gpt-test", input="remind me: " + FAMILY, store=True)
    # (its prompt quotes alice's memory, and the conversation that quoted it first)
    assert sorted(found("responses", stored.id)) == [("chroma", "a2", "quote"), ("openai", opened.id, "quote")]

    id = lethe.flip(alice)
    listed = sorted((d["collection"], d["item"]) for d in derivatives(lethe, id) if d["store"] == "openai")
    assert listed == sorted([("conversations", opened.id), ("conversation_items", f"{talk.id}/{added}"),
                             ("responses", stored.id)])
    with pytest.raises(openai.APIStatusError) as refused:
        bobs.conversations.items.create(talk.id, items=said("again: " + ALLERGY))
    assert (refused.value.status_code, refused.value.code) == (409, "derived_from_erased")
    status, held = http("GET", f"{provider}/v1/conversations/{talk.id}/items")
    assert status == 200 and [i["id"] for i in held["data"]] == [added, own], "nothing of the refused write was sent"
    # What the closure hides is not read back: not listed, not served, not built on.
    assert [i.id for i in bobs.conversations.items.list(talk.id).data] == [own]
    with pytest.raises(openai.APIStatusError) as hidden:
        bobs.conversations.items.retrieve(added, conversation_id=talk.id)
    assert hidden.value.code == "subject_suppressed"
    assert bobs.conversations.items.retrieve(own, conversation_id=talk.id).id == own
    with pytest.raises(openai.APIStatusError) as built_on:
        bobs.responses.create(model="gpt-test", conversation=talk.id, input="what did I note?")
    assert (built_on.value.status_code, built_on.value.code) == (409, "derived_from_erased")


def test_a_streamed_answer_is_remembered_and_a_write_quoting_it_derives_from_it(setup, traced):
    lethe = setup
    who = people(lethe, "alice", "bob")
    alice, bob = who["alice"], who["bob"]
    name, cid = lethe.new_collection()
    lethe.agent(alice).get_collection(name).add(ids=["a1"], embeddings=[EMBEDDING], documents=[FAMILY])
    with traced.start_as_current_span("bob asks"):
        chunks = lethe.openai(bob).chat.completions.create(
            model="rewrite", stream=True, messages=[{"role": "user", "content": FAMILY}])
        answer = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    # Kept later, in another trace: it derives from the streamed answer, and through it from alice.
    lethe.agent(bob).get_collection(name).add(ids=["b1"], embeddings=[EMBEDDING], documents=[answer])
    found = parents(lethe, cid, "b1")
    assert [(p[0], p[1], p[3]) for p in found] == [("openai", "answers", "provider")], found
    streamed = lineage(lethe, "openai", "answers", next(iter(found))[2])
    assert [(p["item"], p["how"]) for p in streamed["parents"]] == [("a1", "quote")]


@pytest.mark.parametrize("streamed", [True, False])
def test_an_answer_made_from_alices_data_stops_when_she_is_erased_while_it_comes(setup, provider, streamed):
    """Bob's prompt quotes alice's memory: the answer is decided on her state too, when it is
    sent. Erased while the provider works, a streamed answer ends at the next event with an
    `error` event `derived_from_erased`; one sent whole is refused with it."""
    import openai
    from concurrent.futures import ThreadPoolExecutor
    lethe = setup
    who = people(lethe, "alice", "bob")
    alice, bob = who["alice"], who["bob"]
    name, _ = lethe.new_collection()
    lethe.agent(alice).get_collection(name).add(ids=["a1"], embeddings=[EMBEDDING], documents=[FAMILY])

    def erase():
        status, filed = lethe.call("POST", "/v1/erasures", {"subject": alice, "ticket": "DSR-D", "reason": "art. 17"})
        assert status == 201, filed
        assert lethe.call("POST", f"/v1/erasures/{filed['id']}/approve")[0] == 200
    ask = lambda model, **kwargs: lethe.openai(bob).chat.completions.create(  # noqa: E731
        model=model, messages=[{"role": "user", "content": "remind me: " + FAMILY}], **kwargs)
    if streamed:
        received = 0
        with pytest.raises(openai.APIError) as stopped:
            for _ in ask("slow-stream", stream=True):
                received += 1
                if received == 3:
                    erase()
        assert 3 <= received < 41 and stopped.value.code == "derived_from_erased", (received, stopped.value)
        return
    requests = lambda: http("GET", f"{provider}/_stats")[1]["requests"]  # noqa: E731
    before = requests()
    with ThreadPoolExecutor(1) as pool:
        late = pool.submit(ask, "slow")
        wait_for("the provider to have the request", lambda: requests() > before, deadline=5)
        erase()
        with pytest.raises(openai.APIStatusError) as refused:
            late.result(timeout=10)
    assert (refused.value.status_code, refused.value.code) == (409, "derived_from_erased")


def test_a_run_whose_input_quotes_alice_is_refused_when_she_is_erased_while_it_runs(setup, langgraph):
    """A LangGraph run's answer is decided, when it is sent, on the subjects its input derives
    from too: bob's run quotes alice's memory, and her flip while it runs refuses its answer."""
    from concurrent.futures import ThreadPoolExecutor
    lethe = setup
    who = people(lethe, "alice", "bob")
    alice, bob = who["alice"], who["bob"]
    name, _ = lethe.new_collection()
    lethe.agent(alice).get_collection(name).add(ids=["a1"], embeddings=[EMBEDDING], documents=[FAMILY])
    as_bob = lethe.graph_agent(bob)
    thread = as_bob.threads.create()["thread_id"]
    with ThreadPoolExecutor(1) as pool:
        run = pool.submit(refused_code, lambda: as_bob.runs.wait(
            thread, "agent", input={"messages": ["remind me: " + FAMILY, "take 3"]}))
        wait_for("the run to start", lambda: http("GET", f"{langgraph}/threads/{thread}")[1]["status"] == "busy")
        lethe.flip(alice)
        assert run.result(timeout=30) == "derived_from_erased"
