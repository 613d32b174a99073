"""Mem0 through Lethe, as an agent developer runs it: the official `mem0ai` library with its
Qdrant vector store given a `QdrantClient` pointed at Lethe's qdrant route, its OpenAI embedder
pointed at Lethe's openai route in front of the provider stand-in, and its `history.db` an
erasure target. Mem0 sends none of Lethe's headers: the route reads the subject from Mem0's
`user_id` and takes a default purpose and category; each user's token is bound to the user.
Counted straight in Qdrant and in the file's bytes."""

import os
import sqlite3
import uuid

import pytest
from qdrant_client import QdrantClient, models

from conftest import TENANT, own_lethe, someone

# Read when mem0 is imported: no call to its telemetry service.
os.environ["MEM0_TELEMETRY"] = "False"

DIM = 8  # the stand-in's embeddings


@pytest.fixture
def setup(chroma, qdrant, provider, tmp_path):
    history = tmp_path / "history.db"
    config = f'''
[erasure]
probes = ["{{subject}}"]

[[erasure.sqlite]]
name = "mem0_history"
path = "{history}"
table = "history"
id_column = "memory_id"
lineage_store = "mem0"

[[routes]]
name = "mem0"
prefix = "/mem0"
upstream = "{qdrant.url}"
adapter = "qdrant"
subject_field = "user_id"
text_fields = ["data"]
purpose = "personalization"
category = "preference"

[[routes]]
name = "embedder"
prefix = "/embedder"
upstream = "{provider}"
adapter = "openai"
timeout = "5s"
retention_window = "30d"
purpose = "personalization"
category = "preference"
credential = {{ header = "authorization", value = {{ value = "Bearer sk-standin" }} }}
'''
    instance = own_lethe(chroma, tmp_path, config)
    os.environ["MEM0_DIR"] = str(tmp_path / "mem0dir")
    yield instance, history
    instance.stop()


def memory_for(lethe, user, collection, history):
    """Mem0 as one user's agent runs it: every client given that user's token, nothing else."""
    from mem0 import Memory
    token = lethe.token("agent", user)
    client = QdrantClient(url=f"http://{lethe.data}", prefix="mem0", metadata={"Authorization": f"Bearer {token}"})
    return Memory.from_config({
        "vector_store": {"provider": "qdrant", "config": {
            "client": client, "collection_name": collection, "embedding_model_dims": DIM}},
        "embedder": {"provider": "openai", "config": {
            "model": "text-embedding-3-small", "api_key": token, "embedding_dims": DIM,
            "openai_base_url": f"http://{lethe.data}/embedder/v1"}},
        # Built at start even when nothing is inferred; never called with infer=False.
        "llm": {"provider": "openai", "config": {
            "model": "gpt-4o-mini", "api_key": token, "openai_base_url": f"http://{lethe.data}/embedder/v1"}},
        "history_db_path": str(history),
    })


def test_two_users_on_mem0_one_erased_the_other_keeps_everything(setup, qdrant):
    lethe, history = setup
    collection = f"mem0-{uuid.uuid4().hex[:8]}"
    # Mem0 would create its collection; through Lethe that is an admin's job, done once.
    QdrantClient(url=f"http://{lethe.data}", prefix="mem0",
                 metadata={"Authorization": f"Bearer {lethe.token('admin')}"}).create_collection(
        collection, vectors_config=models.VectorParams(size=DIM, distance=models.Distance.COSINE))
    alice, bob = someone(), someone()
    for user in (alice, bob):
        lethe.grant(user, actions=("store", "retrieve", "send_to_provider"))
    notes = {user: [f"{user} drinks green tea", f"{user} lives in Lisbon", f"{user} is allergic to nuts"]
             for user in (alice, bob)}
    mems = {user: memory_for(lethe, user, collection, history) for user in (alice, bob)}
    ids = {}
    for user, memory in mems.items():
        ids[user] = [memory.add(note, user_id=user, infer=False)["results"][0]["id"] for note in notes[user]]

    found = mems[alice].search("green tea", filters={"user_id": alice})["results"]
    assert {r["id"] for r in found} == set(ids[alice])
    assert mems[alice].search("green tea", filters={"user_id": bob})["results"] == [], "bob's memories stay bob's"
    assert mems[alice].get(ids[alice][0])["memory"] == notes[alice][0]
    assert mems[alice].get(ids[bob][0]) is None
    listed = mems[bob].get_all(filters={"user_id": bob})["results"]
    assert sorted(r["memory"] for r in listed) == sorted(notes[bob])
    mems[alice].update(ids[alice][1], f"{alice} moved to Porto")
    assert mems[alice].get(ids[alice][1])["memory"] == f"{alice} moved to Porto"
    mems[alice].delete(ids[alice][2])
    assert mems[alice].get(ids[alice][2]) is None
    with sqlite3.connect(history) as con:
        events = con.execute("SELECT event FROM history WHERE memory_id IN (?, ?, ?)", ids[alice]).fetchall()
    assert sorted(e for (e,) in events) == ["ADD", "ADD", "ADD", "DELETE", "UPDATE"]

    # Every embedding went through Lethe, which knows the provider received alice's data.
    processors = lethe.call("GET", f"/v1/subjects/{TENANT}/{alice}")[1]["processors"]
    assert [p["processor"] for p in processors] == ["embedder"]

    direct = qdrant.client()
    by_user = lambda user: direct.count(collection, count_filter=models.Filter(must=[
        models.FieldCondition(key="user_id", match=models.MatchValue(value=user))]), exact=True).count
    assert (by_user(alice), by_user(bob)) == (2, 3)
    stamped = direct.retrieve(collection, ids=[ids[alice][0]], with_payload=True)[0].payload
    assert (stamped["lethe_subject"], stamped["lethe_purpose"]) == (alice, "personalization")

    # Completing means the probe, alice's key matched in Mem0's `data`, found nothing left either.
    done, results = lethe.erase_to_completion(alice)
    assert results["qdrant:mem0"]["remaining"] == 0, results["qdrant:mem0"]
    assert results["sqlite:mem0_history"]["remaining"] == 0, results["sqlite:mem0_history"]
    assert by_user(alice) == 0
    assert direct.count(collection, count_filter=models.Filter(must=[
        models.FieldCondition(key="lethe_subject", match=models.MatchValue(value=alice))]), exact=True).count == 0
    with sqlite3.connect(history) as con:
        left = con.execute("SELECT count(*) FROM history WHERE memory_id IN (?, ?, ?)", ids[alice]).fetchone()[0]
        bobs = con.execute("SELECT count(*) FROM history WHERE memory_id IN (?, ?, ?)", ids[bob]).fetchone()[0]
    assert (left, bobs) == (0, 3)
    on_disk = b"".join(p.read_bytes() for p in history.parent.glob("history.db*"))
    for text in notes[alice] + [f"{alice} moved to Porto"]:
        assert text.encode() not in on_disk, f"{text!r} is still in the bytes of history.db"
    # Bob keeps all of it, and Mem0 still serves it to him.
    assert by_user(bob) == 3
    assert {r["id"] for r in mems[bob].search("tea", filters={"user_id": bob})["results"]} == set(ids[bob])


def test_facts_mem0_keeps_for_bob_from_a_conversation_quoting_alice_are_found_by_her_erasure(setup, qdrant):
    """Mem0 asks the model (through Lethe) which memories bob's conversation holds, and keeps
    them for bob: the conversation quoted alice's memory, so the facts derive from it, through the
    model's answer too. Alice's erasure finds them, hides them at once, and erases them once a
    person says so; bob's own memory stays."""
    from conftest import wait_for
    lethe, history = setup
    collection = f"mem0-{uuid.uuid4().hex[:8]}"
    QdrantClient(url=f"http://{lethe.data}", prefix="mem0",
                 metadata={"Authorization": f"Bearer {lethe.token('admin')}"}).create_collection(
        collection, vectors_config=models.VectorParams(size=DIM, distance=models.Distance.COSINE))
    alice, bob = someone(), someone()
    for user in (alice, bob):
        lethe.grant(user, actions=("store", "retrieve", "send_to_provider"))
    memory = ("alice mentioned she is training for the porto marathon in october and wants her "
              "runs planned around her physiotherapy sessions")
    mems = {user: memory_for(lethe, user, collection, history) for user in (alice, bob)}
    mems[alice].add(memory, user_id=alice, infer=False)
    bobs_own = mems[bob].add("bob prefers aisle seats", user_id=bob, infer=False)["results"][0]["id"]
    added = mems[bob].add([{"role": "user", "content": f"at lunch I heard that {memory}"}], user_id=bob)
    facts = [r["id"] for r in added["results"]]
    assert facts, added
    direct = qdrant.client()
    kept = direct.retrieve(collection, ids=facts, with_payload=True)
    assert all(p.payload["user_id"] == bob and p.payload["lethe_layer"] == "derived" for p in kept), kept
    status, lineage = lethe.call("GET", f"/v1/lineage/mem0/{collection}/{facts[0]}")
    assert status == 200, lineage
    hows = {(p["store"], p["how"]) for p in lineage["parents"]}
    assert ("mem0", "quote") in hows and ("embedder", "provider") in hows, hows

    history_of_facts = lambda: sqlite3.connect(history).execute(
        f"SELECT count(*) FROM history WHERE memory_id IN ({','.join('?' * len(facts))})", facts).fetchone()[0]
    assert history_of_facts() == len(facts), "Mem0 keeps each fact's history"

    erasure = lethe.flip(alice)
    # Hidden from bob at once, while still in Qdrant.
    assert all(mems[bob].get(f) is None for f in facts)
    assert len(direct.retrieve(collection, ids=facts)) == len(facts)
    listed = lethe.call("GET", f"/v1/erasures/{erasure}/derivatives")[1]["derivatives"]
    found = [d for d in listed if d["store"] == "mem0"]
    assert sorted(d["item"] for d in found) == sorted(facts), listed
    assert all(d["decision"] == "undecided" for d in found)
    request = lambda: lethe.call("GET", f"/v1/erasures/{erasure}")[1]
    wait_for("the purge to wait for the review", lambda: request()["state"] == "verifying", deadline=30)
    status, _ = lethe.call("POST", f"/v1/erasures/{erasure}/derivatives/decide",
                           {"refs": [d["ref"] for d in found], "decision": "erase", "reason": "alice's data"})
    assert status == 200
    wait_for("the erasure to complete", lambda: request()["state"] == "completed", deadline=30)
    assert direct.retrieve(collection, ids=facts) == []
    assert history_of_facts() == 0, "Mem0's history of the facts went with them"
    assert [p.id for p in direct.retrieve(collection, ids=[bobs_own])] == [bobs_own]
    assert mems[bob].get(bobs_own)["memory"] == "bob prefers aisle seats"
