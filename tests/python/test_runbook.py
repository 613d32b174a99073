"""The validation scenario of the runbook (section 10) across the stores of an agent app: three
subjects with Chroma records, LangGraph threads and store items and Azure AI Search episodic
documents (written through Lethe), rows in the app's PostgreSQL tables with pgvector embeddings,
Redis session keys and Mem0's history.db; one is erased; counted straight in every store, the
erased subject has 0 everywhere and the other two keep 100% of their data."""

import sqlite3
import subprocess
import time
import uuid

import chromadb

from azure.search.documents.indexes.models import SearchableField, SearchFieldDataType, SearchIndex, SimpleField

from conftest import TENANT, azure_store, http, own_lethe, wait_for


def redis(*args):
    return subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", "6379", *args],
                          check=True, capture_output=True, text=True).stdout


def psql(url, sql):
    return subprocess.run(["psql", url, "-qtAc", sql], check=True, capture_output=True, text=True).stdout.strip()


def test_the_runbook_validation_scenario_across_every_store(chroma, langgraph, pgvector, azure_search, tmp_path):
    tag = uuid.uuid4().hex[:8]
    subjects = [f"runbook-{tag}-{i}" for i in range(3)]
    gone, kept = subjects[0], subjects[1:]

    app = pgvector()
    psql(app, "CREATE EXTENSION vector;"
              "CREATE TABLE memories (id bigserial PRIMARY KEY, tenant_id text, user_id text, fact text, embedding vector(3));"
              "CREATE INDEX memories_embedding ON memories USING hnsw (embedding vector_cosine_ops);"
              "CREATE TABLE messages (tenant_id text, user_id text, body text);"
              + "".join(f"INSERT INTO memories (tenant_id, user_id, fact, embedding) SELECT 'acme', '{s}', 'fact ' || i,"
                        f" ARRAY[random(), random(), random()]::vector FROM generate_series(1, 20) i;"
                        f"INSERT INTO messages SELECT 'acme', '{s}', 'message ' || i FROM generate_series(1, 15) i;"
                        for s in subjects))
    history = tmp_path / "history.db"
    con = sqlite3.connect(history)
    con.execute("CREATE TABLE history (id TEXT PRIMARY KEY, memory_id TEXT, old_memory TEXT, new_memory TEXT, event TEXT,"
                " created_at DATETIME, updated_at DATETIME, is_deleted INTEGER, actor_id TEXT, role TEXT)")
    con.commit()
    instance = own_lethe(chroma, tmp_path, f'''
[erasure]
retry_backoff = "200ms"
[[erasure.postgres]]
name = "app"
url = {{ value = "{app}" }}
count = "SELECT (SELECT count(*) FROM memories WHERE tenant_id = $1 AND user_id = $2) + (SELECT count(*) FROM messages WHERE tenant_id = $1 AND user_id = $2)"
delete = ["DELETE FROM memories WHERE tenant_id = $1 AND user_id = $2", "DELETE FROM messages WHERE tenant_id = $1 AND user_id = $2"]
subjects = "SELECT user_id FROM memories WHERE tenant_id = $1 UNION SELECT user_id FROM messages WHERE tenant_id = $1"
reindex = ["memories_embedding"]
vacuum = ["memories", "messages"]
[[erasure.redis]]
name = "sessions"
urls = ["redis://127.0.0.1:6379"]
patterns = ["{{tenant}}:{{subject}}:*"]
[[erasure.sqlite]]
name = "mem0_history"
path = "{history}"
table = "history"
id_column = "memory_id"
lineage_store = "chroma"
''', langgraph_url=langgraph, azure_search_url=azure_search, azure_search_settings='subject_field = "user_id"\n')
    try:
        name = f"memories-{tag}"
        instance.client(instance.token("admin")).create_collection(name, embedding_function=None)
        # The runbook's episodic index: its key, tenant and user fields, and the episode's text.
        episodes = f"episodes-{tag}"
        instance.azure_indexes(instance.token("admin")).create_index(SearchIndex(name=episodes, fields=[
            SimpleField(name="id", type=SearchFieldDataType.String, key=True),
            SimpleField(name="tenant_id", type=SearchFieldDataType.String, filterable=True),
            SimpleField(name="user_id", type=SearchFieldDataType.String, filterable=True),
            SearchableField(name="content")]))
        threads = {}
        for s in subjects:
            instance.grant(s)
            ids = [f"{s}-m{i}" for i in range(10)]
            instance.agent(s).get_collection(name).add(
                ids=ids, embeddings=[[0.1 * i, 0.2, 0.3] for i in range(10)], documents=[f"memory {i} of {s}" for i in range(10)])
            # Mem0 writes its history rows for the same memory ids.
            con.executemany("INSERT INTO history VALUES (?, ?, NULL, ?, 'ADD', NULL, NULL, 0, NULL, 'user')",
                            [(f"h-{i}", i, f"text of {i}") for i in ids])
            for i in range(25):
                redis("SET", f"acme:{s}:session:{i}", "context")
            graph = instance.graph_agent(s)
            threads[s] = [graph.threads.create(metadata={"n": i})["thread_id"] for i in range(3)]
            for t in threads[s]:
                graph.runs.wait(t, "agent", input={"messages": [f"conversation of {s}"]})
            for i in range(5):
                graph.store.put_item([TENANT, s, "profile"], f"fact{i}", {"text": f"fact {i} of {s}"})
            indexed = instance.azure_agent(episodes, s).upload_documents(
                [{"id": f"{s}-e{i}", "tenant_id": TENANT, "user_id": s, "content": f"episode {i} of {s}"} for i in range(12)])
            assert all(r.succeeded for r in indexed)
        con.commit()
        con.close()
        inventory = lambda s: instance.call("GET", f"/v1/subjects/{TENANT}/{s}")[1]["inventory"]
        wait_for("lineage of every write",
                 lambda: all(inventory(s) == {"azure_search": 12, "chroma": 10, "langgraph": 8} for s in subjects),
                 deadline=10)

        counted = instance.dry_run(gone)
        started = time.monotonic()
        status, filed = instance.call("POST", "/v1/erasures", {"subject": gone, "ticket": "DSR-10", "reason": "art. 17"})
        assert status == 201, filed
        assert instance.call("POST", f"/v1/erasures/{filed['id']}/approve")[0] == 200
        progress = lambda: instance.call("GET", f"/v1/erasures/{filed['id']}")[1]
        try:
            done = wait_for("the erasure to complete", lambda: (r := progress())["state"] == "completed" and r, deadline=60)
        except AssertionError:
            print(progress())
            raise
        completion = time.monotonic() - started

        host, port = chroma.removeprefix("http://").split(":")
        stored = chromadb.HttpClient(host=host, port=int(port)).get_collection(name)

        # The runbook's own check: the filtered query, its total count requested.
        search = azure_store(azure_search, episodes)
        runbook_query = lambda s: search.search(search_text="", filter=f"tenant_id eq '{TENANT}' and user_id eq '{s}'",
                                                select=["id"], include_total_count=True).get_count()

        def counts(s):
            found = http("POST", f"{langgraph}/threads/search", body={"metadata": {"lethe_subject": s}, "limit": 100})[1]
            items = http("POST", f"{langgraph}/store/items/search", body={"namespace_prefix": [TENANT, s], "limit": 100})[1]["items"]
            return {
                "chroma": len(stored.get(where={"lethe_subject": s})["ids"]),
                "postgres": int(psql(app, f"SELECT (SELECT count(*) FROM memories WHERE user_id = '{s}') + (SELECT count(*) FROM messages WHERE user_id = '{s}')")),
                "redis": len(redis("--scan", "--pattern", f"acme:{s}:*").split()),
                "history.db": sqlite3.connect(history).execute("SELECT count(*) FROM history WHERE memory_id LIKE ?", (f"{s}-%",)).fetchone()[0],
                "langgraph threads": len(found) + sum(http("GET", f"{langgraph}/threads/{t}")[0] == 200 for t in threads[s] if t not in {f['thread_id'] for f in found}),
                "langgraph items": len(items),
                "azure search": runbook_query(s),
            }
        assert counts(gone) == {"chroma": 0, "postgres": 0, "redis": 0, "history.db": 0, "langgraph threads": 0,
                                "langgraph items": 0, "azure search": 0}
        for s in kept:
            assert counts(s) == {"chroma": 10, "postgres": 35, "redis": 25, "history.db": 10, "langgraph threads": 3,
                                 "langgraph items": 5, "azure search": 12}, s
        targets = {t["target"]: t for t in done["targets"]}
        assert set(targets) == {"azure_search:azure_search", "chroma:chroma", "langgraph:langgraph", "postgres:app",
                                "redis:sessions", "sqlite:mem0_history"}
        assert all(t["state"] == "done" and t["result"]["remaining"] == 0 for t in targets.values())
        assert targets["postgres:app"]["result"]["before"] == 35
        assert targets["langgraph:langgraph"]["result"]["before"] == 8
        assert counted == {"azure_search:azure_search": 12, "chroma:chroma": 10, "langgraph:langgraph": 8,
                           "postgres:app": 35, "redis:sessions": 25, "sqlite:mem0_history": 10}, \
            "the dry run's counts, from each store itself"
        assert counted == {t: r["result"]["before"] for t, r in targets.items()}, "what the purge then found"
        print(f"\nrunbook scenario (6 stores): online latency {done['online_latency_ms']} ms, completion {completion:.2f} s")
    finally:
        instance.stop()
        for s in subjects:
            leftovers = redis("--scan", "--pattern", f"acme:{s}:*").split()
            if leftovers:
                redis("DEL", *leftovers)
