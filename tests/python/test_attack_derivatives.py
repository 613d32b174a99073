"""Derivative lineage as the next tenant, or a careless app, would try it: riding another
tenant's trace, claiming a derived write is raw, reading a hidden derivative through every read
shape, disguising a quote, a write that wrote nothing, another tenant's compliance staff. What the
store holds is counted in Chroma itself."""

import uuid

import pytest
from conftest import GLOBEX, TENANT, someone, two_tenant_lethe, wait_for

EMBEDDING = [0.1, 0.2, 0.3]
PLAN = ("alice confided to the assistant that she is planning to leave the company in june "
        "and has not told her manager or anyone on her team yet").split()


def secret():
    """A confidence of the test's own: a word of its own every four, so that no run of twelve of
    its words is in any other test's (an erased one's would refuse the quote)."""
    tag = uuid.uuid4().hex[:6]
    return " ".join(f"{w} {tag}{i}" if i % 4 == 3 else w for i, w in enumerate(PLAN))


@pytest.fixture(scope="module")
def gate(chroma, traced, tmp_path_factory):
    erasure = '[erasure]\nretry_backoff = "200ms"\nsettle = "100ms"\nsweep_interval = "1h"\n'
    instance = two_tenant_lethe(chroma, tmp_path_factory.mktemp("attack-derivatives"), erasure)
    yield instance, traced
    instance.stop()


def tenant_agent(lethe, subject, tenant):
    return lethe.client(lethe.token("agent", subject, tenant=tenant),
                        **{"X-Lethe-Purpose": "personalization", "X-Lethe-Category": "preference"})


def granted(lethe, tenant=TENANT):
    subject = someone(tenant)
    lethe.grant(subject, tenant=tenant)
    return subject


def alice_confided(lethe):
    """Alice's confidence, kept as "a1" in a fresh collection, and bob, who may quote it: the
    confidence, alice, bob, the collection's name and its id."""
    confided = secret()
    alice, bob = granted(lethe), granted(lethe)
    name, cid = lethe.new_collection()
    lethe.agent(alice).get_collection(name).add(ids=["a1"], embeddings=[EMBEDDING], documents=[confided])
    return confided, alice, bob, name, cid


def parents(lethe, cid, item, tenant=TENANT):
    dpo = lethe.token("compliance", tenant=tenant)
    status, body = lethe.call("GET", f"/v1/lineage/chroma/{cid}/{item}", token=dpo)
    return status, [(p["item"], p["how"]) for p in body.get("parents", [])] if status == 200 else body


def test_another_tenant_riding_acmes_trace_derives_from_nothing_of_acmes(gate, direct):
    lethe, tracer = gate
    confided = secret()
    alice, gina = granted(lethe), granted(lethe, GLOBEX)
    name, cid = lethe.new_collection()
    lethe.agent(alice).get_collection(name).add(ids=["a1"], embeddings=[EMBEDDING], documents=[confided])
    globex = tenant_agent(lethe, gina, GLOBEX).get_collection(name)
    with tracer.start_as_current_span("one trace, two tenants"):
        lethe.agent().get_collection(name).get(ids=["a1"])
        globex.add(ids=["g1"], embeddings=[EMBEDDING], documents=["gina copies: " + confided])
        # A plain write's lineage row lands with its group commit (up to 25 ms later): waited for.
        recorded = wait_for("g1's lineage row", lambda: (p := parents(lethe, cid, "g1", tenant=GLOBEX))[0] == 200 and p,
                            deadline=10)
        assert recorded == (200, [])
        lethe.flip(alice)
        # Acme's erasure is nothing to globex: the same trace, the same words, still written.
        globex.add(ids=["g2"], embeddings=[EMBEDDING], documents=["and again: " + confided])
    assert set(direct.get_collection(name).get(ids=["g1", "g2"])["ids"]) == {"g1", "g2"}
    # What it derives from is globex's own copy, never acme's.
    assert parents(lethe, cid, "g2", tenant=GLOBEX) == (200, [("g1", "quote")])


def test_a_client_cannot_have_a_derived_write_stamped_raw(gate, direct):
    lethe, _ = gate
    confided, alice, bob, name, _ = alice_confided(lethe)
    lethe.agent(bob).get_collection(name).add(ids=["b1"], embeddings=[EMBEDDING], documents=["bob: " + confided],
                                              metadatas=[{"lethe_layer": "raw"}])
    meta = direct.get_collection(name).get(ids=["b1"], include=["metadatas"])["metadatas"][0]
    assert meta["lethe_layer"] == "derived"


def test_a_derivative_hidden_at_the_flip_is_in_no_read_shape(gate, direct):
    lethe, _ = gate
    confided, alice, bob, name, _ = alice_confided(lethe)
    bobs = lethe.agent(bob).get_collection(name)
    bobs.add(ids=["b-derived", "b-own"], embeddings=[EMBEDDING, EMBEDDING],
             documents=["notes: " + confided, "bob's own words, nothing of anyone else's"])
    lethe.flip(alice)
    service = lethe.agent().get_collection(name)
    for reader in (bobs, service):
        assert reader.get(ids=["b-derived"])["ids"] == []
        assert "b-derived" not in reader.get()["ids"]
        assert "b-derived" not in reader.get(where={"lethe_subject": bob})["ids"]
        hits = reader.query(query_embeddings=[EMBEDDING], n_results=10)["ids"][0]
        assert "b-derived" not in hits and "b-own" in hits
        assert "b-derived" not in reader.peek()["ids"]
    assert bobs.count() == 1
    assert direct.get_collection(name).get(ids=["b-derived"])["ids"] == ["b-derived"], "hidden, not yet erased"


@pytest.mark.parametrize("disguise", [
    str.upper,
    lambda t: t.replace(" ", ",  ").replace("june", "JUNE!"),
    lambda t: "".join(chr(ord(c) + 0xFEE0) if "a" <= c <= "z" else c for c in t),  # full-width letters
])
def test_a_quote_disguised_by_case_punctuation_or_width_is_still_a_quote(gate, disguise):
    lethe, _ = gate
    confided, alice, bob, name, cid = alice_confided(lethe)
    bobs = lethe.agent(bob).get_collection(name)
    bobs.add(ids=["b1"], embeddings=[EMBEDDING], documents=[disguise(confided)])
    assert parents(lethe, cid, "b1") == (200, [("a1", "quote")])
    lethe.flip(alice)
    with pytest.raises(Exception, match="derived_from_erased"):
        bobs.add(ids=["b2"], embeddings=[EMBEDDING], documents=[disguise(confided)])


def test_a_write_that_wrote_nothing_claims_nothing(gate, direct):
    lethe, _ = gate
    confided, alice, bob, name, cid = alice_confided(lethe)
    # An update of an id Chroma does not hold writes nothing, and leaves no edge behind.
    lethe.agent(bob).get_collection(name).update(ids=["nothing-here"], embeddings=[EMBEDDING], documents=["bob: " + confided])
    assert direct.get_collection(name).get(ids=["nothing-here"])["ids"] == []
    assert parents(lethe, cid, "nothing-here")[0] == 404


def test_another_tenants_staff_see_no_lineage_nor_derivatives_and_decide_nothing(gate):
    lethe, _ = gate
    confided, alice, bob, name, cid = alice_confided(lethe)
    lethe.agent(bob).get_collection(name).add(ids=["b1"], embeddings=[EMBEDDING], documents=["bob: " + confided])
    id = lethe.flip(alice)
    globex = lethe.token("compliance", tenant=GLOBEX)
    assert lethe.call("GET", f"/v1/lineage/chroma/{cid}/b1", token=globex)[0] == 404
    assert lethe.call("GET", f"/v1/lineage/chroma/{cid}/b1?tenant={TENANT}", token=globex)[0] == 403
    assert lethe.call("GET", f"/v1/erasures/{id}/derivatives", token=globex)[0] == 404
    listed = lethe.call("GET", f"/v1/erasures/{id}/derivatives")[1]["derivatives"]
    ref = next(d["ref"] for d in listed if d["item"] == "b1")
    status, _ = lethe.call("POST", f"/v1/erasures/{id}/derivatives/decide",
                           {"refs": [ref], "decision": "release", "reason": "mine"}, token=globex)
    assert status == 404
    listed = lethe.call("GET", f"/v1/erasures/{id}/derivatives")[1]["derivatives"]
    assert next(d["decision"] for d in listed if d["item"] == "b1") == "undecided"
    # Nor can an agent of acme's own tenant: deciding is a person's.
    status, _ = lethe.call("POST", f"/v1/erasures/{id}/derivatives/decide",
                           {"refs": [ref], "decision": "release", "reason": "mine"}, token=lethe.token("agent", bob))
    assert status in (401, 403)


def test_once_the_erasure_completed_a_quote_of_the_erased_is_still_refused(gate, direct):
    lethe, _ = gate
    confided, alice, bob, name, _ = alice_confided(lethe)
    _, results = lethe.erase_to_completion(alice)
    assert results["chroma:chroma"]["remaining"] == 0, results
    # The store and the memory of the window know alice by reference only now, and by it
    # still refuse what re-derives her words.
    with pytest.raises(Exception, match="derived_from_erased"):
        lethe.agent(bob).get_collection(name).add(ids=["b1"], embeddings=[EMBEDDING], documents=["bob: " + confided])
    assert direct.get_collection(name).get(ids=["a1", "b1"])["ids"] == []


def test_a_derived_record_stays_derived_through_an_update_and_a_refused_rewrite(gate, direct):
    lethe, _ = gate
    confided, alice, bob, name, cid = alice_confided(lethe)
    bobs = lethe.agent(bob).get_collection(name)
    bobs.add(ids=["b1"], embeddings=[EMBEDDING], documents=["bob: " + confided])
    held = lambda: direct.get_collection(name).get(ids=["b1"], include=["metadatas", "documents"])
    # Its metadata changed only: the document (alice's words) stays, and so do its stamp and edges.
    bobs.update(ids=["b1"], metadatas=[{"topic": "work"}])
    meta = held()["metadatas"][0]
    assert (meta["lethe_layer"], meta["topic"]) == ("derived", "work")
    assert parents(lethe, cid, "b1") == (200, [("a1", "quote")])
    # A rewrite Chroma refuses (an embedding of another dimension) changes nothing, edges included.
    with pytest.raises(Exception):
        bobs.upsert(ids=["b1"], embeddings=[[0.1, 0.2]], documents=["bob's own words now"])
    assert held()["documents"] == ["bob: " + confided]
    assert parents(lethe, cid, "b1") == (200, [("a1", "quote")])
    # A rewrite Chroma takes derives from what it says now only.
    bobs.upsert(ids=["b1"], embeddings=[EMBEDDING], documents=["bob's own words now"])
    assert held()["metadatas"][0]["lethe_layer"] == "raw"
    assert parents(lethe, cid, "b1") == (200, [])
    lethe.flip(alice)
    assert bobs.get(ids=["b1"])["ids"] == ["b1"], "no longer derived from alice's data"
