"""PostgreSQL memory governed in the database itself: Lethe installs row-level security and a
stamping trigger on the app's `memories` table (pgvector), and keeps the policy they read in step
with its own. The app connects with `psycopg` as the app role Lethe created, as any client
would; every count of what is really there is made as the owner (a superuser)."""

import time
import urllib.request

import psycopg
import pytest

from conftest import GLOBEX, TENANT, someone, two_tenant_lethe, wait_for

REFUSED = "LTH01"


def governed_toml(url, flip_grace="1s"):
    """Lethe's config governing the app's `memories` table in the database at `url`."""
    return f'''
[erasure]
sweep_interval = "200ms"

[[postgres]]
name = "app"
url = {{ value = "{url}" }}
app_role = "lethe_app"
tenant_roles = {{ {GLOBEX} = "globex_app" }}
flip_grace = "{flip_grace}"

[[postgres.tables]]
table = "memories"
tenant = "tenant_id"
subject = "user_id"
purpose = "'personalization'"
category = "category"
'''


def start_governed(chroma, pgvector, tmp_path, flip_grace="1s"):
    """Lethe governing an app's `memories` table (pgvector) in a fresh database; answers Lethe,
    a factory of owner connections and one of connections as an app role."""
    url = pgvector()
    with psycopg.connect(url, autocommit=True) as owner:
        owner.execute("CREATE EXTENSION IF NOT EXISTS vector")
        owner.execute("""CREATE TABLE IF NOT EXISTS memories (id bigserial PRIMARY KEY, tenant_id text NOT NULL, user_id text NOT NULL,
                         category text NOT NULL, content text NOT NULL, embedding vector(3))""")
        owner.execute("CREATE INDEX IF NOT EXISTS memories_embedding_idx ON memories USING hnsw (embedding vector_l2_ops)")
    config = governed_toml(url, flip_grace)
    instance = two_tenant_lethe(chroma, tmp_path, config)
    return instance, (lambda: psycopg.connect(url, autocommit=True)), app_connector(url)


def app_connector(url):
    """Connections as an app role, autocommit unless told otherwise (psycopg's own default)."""
    return lambda role, autocommit=True: psycopg.connect(url.replace("postgres:@", f"{role}:@", 1), autocommit=autocommit)


@pytest.fixture
def governed(chroma, pgvector, tmp_path):
    instance, owner, as_role = start_governed(chroma, pgvector, tmp_path)
    yield instance, owner, as_role
    instance.stop()


@pytest.fixture
def governed_patient(chroma, pgvector, tmp_path):
    """A database whose flips give open transactions 30 s to end on their own."""
    instance, owner, as_role = start_governed(chroma, pgvector, tmp_path, flip_grace="30s")
    yield instance, owner, as_role
    instance.stop()


def lethe_url_of(connect):
    """The URL a connection factory of the fixture connects to."""
    with connect() as c:
        info = c.info
        return f"postgresql://{info.user}:@localhost/{info.dbname}?host={info.host}&port={info.port}"


def database_of(connect):
    with connect() as c:
        return c.info.dbname


def write(conn, tenant, user, content, category="preference"):
    conn.execute("INSERT INTO memories (tenant_id, user_id, category, content, embedding) VALUES (%s, %s, %s, %s, '[1,0.5,0.25]')",
                 (tenant, user, category, content))


def refusal(call):
    with pytest.raises(psycopg.Error) as e:
        call()
    return e.value.sqlstate, e.value.diag.message_primary


def visible(conn, user=None):
    """What the app sees, through several query shapes that must agree."""
    where, args = ("WHERE user_id = %s", (user,)) if user else ("", ())
    plain = conn.execute(f"SELECT content FROM memories {where} ORDER BY content", args).fetchall()
    nearest = conn.execute(f"SELECT content FROM memories {where} ORDER BY embedding <-> '[1,0.5,0.25]' LIMIT 100", args).fetchall()
    cte = conn.execute(f"WITH m AS (SELECT * FROM memories {where}) SELECT m.content FROM m JOIN memories n ON n.id = m.id", args).fetchall()
    assert sorted(plain) == sorted(nearest) == sorted(cte), (plain, nearest, cte)
    return [c for (c,) in plain]


def held(owner, user):
    return owner.execute("SELECT count(*) FROM memories WHERE user_id = %s", (user,)).fetchone()[0]


def test_writes_are_decided_and_stamped_reads_see_only_what_policy_allows(governed):
    lethe, owner_conn, as_role = governed
    alice, bob, dave = someone(), someone(), someone()
    app, owner = as_role("lethe_app"), owner_conn()

    assert refusal(lambda: write(app, TENANT, alice, "alice likes tea")) == (REFUSED, "lethe: consent_required")
    assert held(owner, alice) == 0, "a refused write writes nothing"

    lethe.grant(alice)  # answered once the grant has reached the database
    write(app, TENANT, alice, "alice likes tea")
    expires, epoch = owner.execute("SELECT lethe_expires_at, lethe_epoch FROM memories WHERE user_id = %s", (alice,)).fetchone()
    days = owner.execute("SELECT extract(epoch FROM %s - now()) / 86400", (expires,)).fetchone()[0]
    assert 29.9 < float(days) <= 30 and epoch == 0, (days, epoch)
    assert visible(app, alice) == ["alice likes tea"]

    # Store without retrieve: written, never read back.
    lethe.grant(bob, actions=("store",))
    write(app, TENANT, bob, "bob's secret")
    assert held(owner, bob) == 1 and visible(app, bob) == []

    # A row written past Lethe by a superuser (triggers off) is unstamped: no app role sees it.
    owner.execute("SET session_replication_role = replica")
    write(owner, TENANT, alice, "alice, written around Lethe")
    owner.execute("SET session_replication_role = DEFAULT")
    assert visible(app, alice) == ["alice likes tea"]

    # The app cannot move a row to another subject, or keep it longer.
    assert refusal(lambda: app.execute("UPDATE memories SET user_id = %s WHERE user_id = %s", (dave, alice)))[1] == "lethe: scope_violation"
    app.execute("UPDATE memories SET lethe_expires_at = now() + interval '10 years', content = 'alice likes green tea' WHERE user_id = %s", (alice,))
    later = owner.execute("SELECT lethe_expires_at FROM memories WHERE user_id = %s AND lethe_epoch IS NOT NULL", (alice,)).fetchone()[0]
    assert later <= expires and visible(app, alice) == ["alice likes green tea"]

    # What a client can try, and what it gets.
    for attempt, state in (("ALTER TABLE memories DISABLE ROW LEVEL SECURITY", "42501"),
                           ("ALTER TABLE memories DISABLE TRIGGER lethe_stamp", "42501"),
                           ("SELECT * FROM lethe.subjects", "42501"),
                           ("SELECT * FROM lethe.decide_write('acme', 'x', 'p', 'c', NULL)", "42501"),
                           ("SET session_replication_role = replica", "42501")):
        assert refusal(lambda: app.execute(attempt))[0] == state, attempt
    app.execute("SET row_security = off")
    assert refusal(lambda: app.execute("SELECT count(*) FROM memories"))[0] == "42501", "row security cannot be switched off"
    app.execute("SET row_security = on")
    # Large objects live outside every table, so outside the rules: an app role makes none.
    for attempt in ("SELECT lo_create(0)", "SELECT lo_creat(-1)", "SELECT lo_from_bytea(0, 'alice likes tea')"):
        assert refusal(lambda: app.execute(attempt))[0] == "42501", attempt
    assert owner.execute("SELECT count(*) FROM pg_largeobject_metadata").fetchone()[0] == 0


def test_a_revocation_and_an_erasure_hide_the_subject_at_once_and_refuse_late_writes(governed):
    lethe, owner_conn, as_role = governed
    alice, carol = someone(), someone()
    app, owner = as_role("lethe_app"), owner_conn()
    grant = lethe.grant(alice)
    lethe.grant(carol)
    write(app, TENANT, alice, "alice 1")
    write(app, TENANT, carol, "carol 1")
    assert visible(app) == ["alice 1", "carol 1"]

    assert lethe.call("POST", f"/v1/consents/{grant}/revoke")[0] == 200
    assert visible(app) == ["carol 1"], "the very next query: alice's consent is gone"
    assert refusal(lambda: write(app, TENANT, alice, "alice 2"))[1] == "lethe: consent_required"

    status, filed = lethe.call("POST", "/v1/erasures", {"subject": carol, "ticket": "DSR-PG", "reason": "art. 17"})
    assert status == 201
    assert lethe.call("POST", f"/v1/erasures/{filed['id']}/approve")[0] == 200
    assert visible(app) == [], "the very next query after the approval: carol is gone"
    assert refusal(lambda: write(app, TENANT, carol, "carol, late"))[1] == "lethe: subject_suppressed"
    # Hidden at once; then the purge deletes every row of carol's, the unstamped one written
    # around Lethe too, rebuilds the vector index and vacuums.
    owner.execute("SET session_replication_role = replica")
    write(owner, TENANT, carol, "carol, written around Lethe")
    owner.execute("SET session_replication_role = DEFAULT")
    done = wait_for("the erasure to complete",
                    lambda: (r := lethe.call("GET", f"/v1/erasures/{filed['id']}")[1])["state"] == "completed" and r,
                    deadline=60)
    result = next(t["result"] for t in done["targets"] if t["target"] == "postgres:app")
    assert (result["before"], result["deleted"], result["remaining"]) == (2, 2, 0), result
    assert held(owner, carol) == 0
    # Completed (the worker's change reaches the database a moment later): the database keeps no
    # copy of carol's key, and still takes nothing of hers.
    copies = lambda: sum(owner.execute(f"SELECT count(*) FROM {table} WHERE subject = %s", (carol,)).fetchone()[0]
                         for table in ("lethe.subjects", "lethe.consents", "lethe.holds"))
    wait_for("the database to drop carol's policy rows", lambda: copies() == 0, deadline=10)
    assert refusal(lambda: write(app, TENANT, carol, "carol, later"))[1] == "lethe: consent_required"
    # Alice's row went with her consent: the sweep deletes what no store consent covers.
    wait_for("the sweep to delete alice's row", lambda: held(owner, alice) == 0, deadline=10)
    assert any(line.startswith("index public.memories_embedding_idx rebuilt") for line in result["physical"]["done"]), result["physical"]


def test_a_tenant_role_sees_and_writes_its_tenant_only(governed):
    lethe, owner_conn, as_role = governed
    acme_user, globex_user = someone(), someone(GLOBEX)
    lethe.grant(acme_user)
    lethe.grant(globex_user, tenant=GLOBEX)
    app, globex = as_role("lethe_app"), as_role("globex_app")
    write(app, TENANT, acme_user, "acme's")
    write(globex, GLOBEX, globex_user, "globex's")
    assert refusal(lambda: write(globex, TENANT, acme_user, "into acme")) == (REFUSED, "lethe: scope_violation")
    assert visible(globex) == ["globex's"]
    assert visible(app) == ["acme's", "globex's"]
    assert globex.execute("UPDATE memories SET content = 'x' WHERE tenant_id = %s", (TENANT,)).rowcount == 0
    assert globex.execute("DELETE FROM memories WHERE tenant_id = %s", (TENANT,)).rowcount == 0
    assert held(owner_conn(), acme_user) == 1



def test_another_tenants_role_learns_nothing_from_any_lethe_function(governed):
    """Globex's role, asking about acme: every function in schema lethe either refuses it
    (42501) or answers as if acme's subjects did not exist; a write into acme is refused the same
    way whatever the acme subject's consent or state. Nothing in lethe is PUBLIC's."""
    lethe, owner_conn, as_role = governed
    consenting, suppressed, unknown = someone(), someone(), someone()
    lethe.grant(consenting)
    lethe.grant(suppressed)
    app, globex, owner = as_role("lethe_app"), as_role("globex_app"), owner_conn()
    write(app, TENANT, consenting, "acme's")
    lethe.flip(suppressed)
    expires, epoch = owner.execute("SELECT lethe_expires_at, lethe_epoch FROM memories WHERE user_id = %s", (consenting,)).fetchone()

    functions = [r[0] for r in owner.execute(
        "SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'lethe' ORDER BY 1").fetchall()]
    assert len(functions) >= 6, functions
    owner.execute("DROP ROLE IF EXISTS lethe_test_nobody")
    owner.execute("CREATE ROLE lethe_test_nobody")
    public = [f for f in functions
              if owner.execute("SELECT has_function_privilege('lethe_test_nobody', %s, 'EXECUTE')", (f,)).fetchone()[0]]
    assert public == [], f"executable by PUBLIC: {public}"
    callable_by_globex = [f for f in functions
                          if owner.execute("SELECT has_function_privilege('globex_app', %s, 'EXECUTE')", (f,)).fetchone()[0]]
    assert sorted(callable_by_globex) == ["lethe.readable(text,text,text,text,timestamp with time zone,bigint)",
                                          "lethe.unstored(tid)"], callable_by_globex
    # Each of the others, called by globex with what it would take: refused.
    calls = {
        "decide_write": "SELECT * FROM lethe.decide_write(%s, %s, 'personalization', 'preference', NULL)",
        "sweepable": "SELECT lethe.sweepable(%s, %s, 'personalization', 'preference', now())",
        "serves": "SELECT lethe.serves(%s::text) AND %s::text IS NOT NULL",
        "refuse": "SELECT lethe.refuse(%s::text || %s::text)",
    }
    for name, sql in calls.items():
        assert refusal(lambda: globex.execute(sql, (TENANT, consenting)))[0] == "42501", name
    readable = "SELECT lethe.readable(%s, %s, 'personalization', 'preference', %s, %s)"
    assert app.execute(readable, (TENANT, consenting, expires, epoch)).fetchone()[0] is True
    assert globex.execute(readable, (TENANT, consenting, expires, epoch)).fetchone()[0] is False
    # A write into acme tells globex nothing about the acme subject it names.
    answers = {refusal(lambda: write(globex, TENANT, who, "probe")) for who in (consenting, suppressed, unknown)}
    assert answers == {(REFUSED, "lethe: scope_violation")}, answers
    # Nor does a login role that acts as globex's through membership.
    owner.execute("DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'globex_login') THEN CREATE ROLE globex_login LOGIN; END IF; END $$")
    owner.execute("GRANT globex_app TO globex_login")
    member = as_role("globex_login")
    assert member.execute(readable, (TENANT, consenting, expires, epoch)).fetchone()[0] is False
    assert refusal(lambda: write(member, TENANT, consenting, "probe")) == (REFUSED, "lethe: scope_violation")
    assert held(owner, consenting) == 1 and held(owner, unknown) == 0


def test_a_lookalike_name_is_refused_in_the_database(governed):
    """A row names its subject, tenant and category in their one spelling, as Lethe keeps them,
    or it is refused: no second `carol` behind a trailing space, a decomposed accent or an
    invisible character, with or without consent."""
    import unicodedata
    lethe, owner_conn, as_role = governed
    carol = f"{someone()}-jos\u00e9"
    lethe.grant(carol)
    app, owner = as_role("lethe_app"), owner_conn()
    write(app, TENANT, carol, "carol's")
    lookalikes = [f"{carol} ", f" {carol}", unicodedata.normalize("NFD", carol), f"{carol}\u200b", f"\u202e{carol}"]
    for subject in lookalikes:
        assert refusal(lambda: write(app, TENANT, subject, "lookalike")) == (REFUSED, "lethe: invalid_name"), repr(subject)
    assert refusal(lambda: write(app, TENANT, carol, "x", category="prefer\u200bence")) == (REFUSED, "lethe: invalid_name")
    assert refusal(lambda: write(app, f"{TENANT} ", carol, "x"))[1] in ("lethe: invalid_name", "lethe: scope_violation")
    assert owner.execute("SELECT count(*) FROM memories WHERE user_id LIKE %s", (carol[:8] + "%",)).fetchone()[0] == 1

def test_the_sweep_deletes_expired_and_revoked_rows_unless_a_hold_keeps_them(governed):
    lethe, owner_conn, as_role = governed
    short, held_one, revoked = someone(), someone(), someone()
    app, owner = as_role("lethe_app"), owner_conn()
    for s in (short, held_one):
        lethe.grant(s)
    grant = lethe.grant(revoked)
    status, hold = lethe.call("POST", "/v1/legal-holds", {"subject": held_one, "reason": "litigation"})
    assert status == 201, hold
    for s in (short, held_one):
        # A client may ask for an earlier deadline than policy gives.
        app.execute("INSERT INTO memories (tenant_id, user_id, category, content, lethe_expires_at) VALUES (%s, %s, 'preference', 'soon', now() + interval '2 seconds')",
                    (TENANT, s))
    write(app, TENANT, revoked, "kept for 30 days, until the revocation")
    write(app, TENANT, short, "kept for 30 days")
    assert lethe.call("POST", f"/v1/consents/{grant}/revoke")[0] == 200
    wait_for("the sweep to delete the revoked subject's row", lambda: held(owner, revoked) == 0, deadline=10)
    wait_for("the sweep to delete the expired row", lambda: held(owner, short) == 1, deadline=15)
    assert owner.execute("SELECT content FROM memories WHERE user_id = %s", (short,)).fetchall() == [("kept for 30 days",)]
    assert held(owner, held_one) == 1, "the hold keeps the expired row"
    assert visible(app, held_one) == [], "but it is expired: no one reads it"
    assert lethe.call("POST", f"/v1/legal-holds/{hold['id']}/release")[0] == 200
    wait_for("the sweep to delete the released row", lambda: held(owner, held_one) == 0, deadline=10)


@pytest.fixture
def langgraph_db(chroma, pgvector, tmp_path):
    """The official LangGraph PostgresSaver and PostgresStore tables, made by their own
    migrations (as the app's deployment would, as the owner) before Lethe governs them."""
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.store.postgres import PostgresStore
    url = pgvector()
    with PostgresSaver.from_conn_string(url) as saver:
        saver.setup()
    with PostgresStore.from_conn_string(url) as store:
        store.setup()
    scope = "purpose = \"'personalization'\"\ncategory = \"'preference'\""
    config = f'''
[[postgres]]
name = "langgraph"
url = {{ value = "{url}" }}
app_role = "lethe_app"

[[postgres.tables]]
table = "store"
tenant = "split_part(prefix, '.', 1)"
subject = "split_part(prefix, '.', 2)"
{scope}

[[postgres.tables]]
table = "checkpoints"
tenant = "metadata->>'tenant_id'"
subject = "metadata->>'user_id'"
{scope}

[[postgres.tables]]
table = "checkpoint_blobs"
owner = "checkpoints"
key = ["thread_id"]

[[postgres.tables]]
table = "checkpoint_writes"
owner = "checkpoints"
key = ["thread_id"]
'''
    instance = two_tenant_lethe(chroma, tmp_path, config)
    yield instance, url
    instance.stop()


def graph(checkpointer):
    from typing import TypedDict
    from langgraph.graph import END, START, StateGraph

    class State(TypedDict):
        notes: list

    g = StateGraph(State)
    g.add_node("remember", lambda s: {"notes": s["notes"] + ["remembered"]})
    g.add_edge(START, "remember")
    g.add_edge("remember", END)
    return g.compile(checkpointer=checkpointer)


def test_langgraph_postgres_saver_and_store_run_as_the_app_role_governed(langgraph_db):
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.store.postgres import PostgresStore
    lethe, url = langgraph_db
    app_url = url.replace("postgres:@", "lethe_app:@", 1)
    alice, bob, carol = someone(), someone(), someone()
    for s in (alice, bob):
        lethe.grant(s)
    config = lambda user: {"configurable": {"thread_id": f"thread-{user}", "user_id": user, "tenant_id": TENANT}}

    def counts(user):
        """The user's rows in each of the four tables, counted as the owner."""
        thread = f"thread-{user}"
        with psycopg.connect(url) as owner:
            return [owner.execute(q, (a,)).fetchone()[0] for q, a in (
                ("SELECT count(*) FROM store WHERE prefix LIKE %s", f"{TENANT}.{user}.%"),
                ("SELECT count(*) FROM checkpoints WHERE thread_id = %s", thread),
                ("SELECT count(*) FROM checkpoint_blobs WHERE thread_id = %s", thread),
                ("SELECT count(*) FROM checkpoint_writes WHERE thread_id = %s", thread))]
    with PostgresSaver.from_conn_string(app_url) as saver, PostgresStore.from_conn_string(app_url) as store:
        app = graph(saver)
        for user in (alice, bob):
            store.put((TENANT, user, "memories"), "tea", {"text": f"{user} likes tea"})
            app.invoke({"notes": [f"{user} said hello"]}, config(user))
            assert app.get_state(config(user)).values["notes"] == [f"{user} said hello", "remembered"]
        assert {i.key for i in store.search((TENANT, alice))} == {"tea"}
        assert {tuple(i.namespace)[1] for i in store.search((TENANT,))} == {alice, bob}
        # No consent: neither a store item nor a thread is written (the thread's first rows are
        # refused on their own checkpoint, or, written before it, for having no owner). Each
        # attempt on a connection of its own: a refusal inside a pipeline aborts it.
        with pytest.raises(psycopg.Error) as e:
            store.put((TENANT, carol, "memories"), "x", {"text": "no"})
        assert (e.value.sqlstate, e.value.diag.message_primary) == (REFUSED, "lethe: consent_required")
        refused = []
        # The checkpointer's pipeline is left aborted, and its connection cannot be closed
        # cleanly either: both are the client's reaction to the refusal.
        with pytest.raises(psycopg.Error):
            with PostgresSaver.from_conn_string(app_url) as own:
                try:
                    graph(own).invoke({"notes": ["no"]}, config(carol))
                except psycopg.Error as e:
                    refused.append((e.sqlstate, e.diag.message_primary))
                    raise
        assert refused and refused[0][0] == REFUSED, refused
        assert refused[0][1] in ("lethe: consent_required", "lethe: owner_required"), refused

        bobs = counts(bob)
        assert all(n > 0 for n in bobs) and all(n > 0 for n in counts(alice)), bobs
        status, filed = lethe.call("POST", "/v1/erasures", {"subject": alice, "ticket": "DSR-LG", "reason": "art. 17"})
        assert status == 201 and lethe.call("POST", f"/v1/erasures/{filed['id']}/approve")[0] == 200
        assert store.search((TENANT, alice)) == [], "the very next read: alice is gone"
        assert app.get_state(config(alice)).values == {}
        assert app.get_state(config(bob)).values["notes"][0] == f"{bob} said hello"

    done = wait_for("the erasure to complete",
                    lambda: (r := lethe.call("GET", f"/v1/erasures/{filed['id']}")[1])["state"] == "completed" and r,
                    deadline=60)
    result = next(t["result"] for t in done["targets"] if t["target"] == "postgres:langgraph")
    assert result["remaining"] == 0 and result["deleted"] == result["before"] > 0, result
    assert counts(alice) == [0, 0, 0, 0] and counts(carol) == [0, 0, 0, 0]
    assert counts(bob) == bobs, "bob keeps every row of every table"


def test_the_installed_sql_the_live_schema_check_and_the_lag_are_there_to_see(governed, tmp_path):
    lethe, owner_conn, as_role = governed
    plan = lethe.cli("postgres", "plan", "app")
    assert plan.returncode == 0, plan.stderr
    assert b"CREATE TRIGGER lethe_stamp BEFORE INSERT OR UPDATE ON memories" in plan.stdout
    config = lethe.workdir / "lethe.toml"
    checked = lethe.cli("check-config", "--connect", str(config))
    assert checked.returncode == 0 and b": ok" in checked.stdout, checked.stdout + checked.stderr
    wrong = tmp_path / "wrong.toml"
    wrong.write_text(config.read_text().replace('subject = "user_id"', 'subject = "owner_id"'))
    checked = lethe.cli("check-config", "--connect", str(wrong))
    assert checked.returncode == 1 and b'column "owner_id" does not exist' in checked.stdout, checked.stdout
    assert 'lethe_governed_pending_changes{database="app"}' in urllib.request.urlopen(f"http://{lethe.control}/metrics").read().decode()
    s = someone()
    lethe.grant(s)
    status, filed = lethe.call("POST", "/v1/erasures", {"subject": s, "ticket": "DSR-L", "reason": "art. 17"})
    assert status == 201 and [g["database"] for g in filed["governed"]] == ["app"], filed
    # The change reached the database before the answer; the state store's own notification of
    # it may still be on its way, and is applied a moment later: nothing stays pending.
    wait_for("nothing pending for the database",
             lambda: lethe.call("GET", f"/v1/erasures/{filed['id']}")[1]["governed"] == [{"database": "app", "pending_changes": 0}],
             deadline=10)


def test_a_vector_search_through_the_rules_still_finds_k_readable_rows(governed):
    """Nine subjects in ten may store but not retrieve: an HNSW search filtered by row security
    would run out of candidates; the iterative scan Lethe sets for the app role finds 10, the
    same 10 an exact search finds."""
    import random
    lethe, owner_conn, as_role = governed
    readers = [someone() for _ in range(2)]
    hidden = [someone() for _ in range(18)]
    for s in readers:
        lethe.grant(s)
    for s in hidden:
        lethe.grant(s, actions=("store",))
    app = as_role("lethe_app")
    rng = random.Random(7)
    vec = lambda: "[" + ",".join(f"{rng.random():.4f}" for _ in range(3)) + "]"
    with app.cursor() as cur:
        cur.executemany("INSERT INTO memories (tenant_id, user_id, category, content, embedding) VALUES (%s, %s, 'preference', 'x', %s)",
                        [(TENANT, s, vec()) for s in readers + hidden for _ in range(100)])
    query = "SELECT id FROM memories ORDER BY embedding <-> %s LIMIT 10"
    for _ in range(5):
        q = vec()
        found = [r[0] for r in app.execute(query, (q,)).fetchall()]
        with app.transaction():
            app.execute("SET LOCAL enable_indexscan = off")
            exact = [r[0] for r in app.execute(query, (q,)).fetchall()]
        assert len(found) == 10 and found == exact, (found, exact)
    plan = "\n".join(r[0] for r in app.execute("EXPLAIN " + query, (vec(),)).fetchall())
    assert "memories_embedding_idx" in plan, plan
    # Without the iterative scan, the index's 40 candidates hold about 4 readable rows.
    with app.transaction():
        app.execute("SET LOCAL hnsw.iterative_scan = off")
        assert len(app.execute(query, (vec(),)).fetchall()) < 10


def test_a_database_that_cannot_be_reached_lags_visibly_and_catches_up(governed):
    lethe, owner_conn, as_role = governed
    admin = psycopg.connect(lethe_url_of(owner_conn).replace(f"/{database_of(owner_conn)}?", "/postgres?", 1), autocommit=True)
    name = database_of(owner_conn)
    s = someone()
    admin.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")
    admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", (name,))
    try:
        started = time.monotonic()
        grant = lethe.grant(s)  # answered after the wait, not applied
        assert time.monotonic() - started >= 4.5
        status, filed = lethe.call("POST", "/v1/erasures", {"subject": someone(), "ticket": "DSR-LAG", "reason": "art. 17"})
        assert status == 201
        pending = lethe.call("GET", f"/v1/erasures/{filed['id']}")[1]["governed"][0]["pending_changes"]
        assert pending >= 1, pending
        # The flip cannot reach the database: the approval says so, and never says suppressed.
        status, approved = lethe.call("POST", f"/v1/erasures/{filed['id']}/approve")
        assert status == 200 and approved["state"] == "propagating", approved
        assert approved["flip"] == [{"database": "app", "applied_at": None}], approved
        metrics = urllib.request.urlopen(f"http://{lethe.control}/metrics").read().decode()
        line = next(l for l in metrics.splitlines() if l.startswith('lethe_governed_pending_changes{database="app"}'))
        assert int(line.rsplit(" ", 1)[1]) >= 1, line
    finally:
        admin.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")
    wait_for("the database to catch up",
             lambda: lethe.call("GET", f"/v1/erasures/{filed['id']}")[1]["governed"][0]["pending_changes"] == 0, deadline=30)
    done = completed(lethe, filed["id"])
    assert done["flip"][0]["applied_at"] == done["suppressed_at"], done
    app = as_role("lethe_app")
    write(app, TENANT, s, "written once the grant arrived")
    assert visible(app, s) == ["written once the grant arrived"]
    assert grant


def completed(lethe, request_id, deadline=60):
    return wait_for("the erasure to complete",
                    lambda: (r := lethe.call("GET", f"/v1/erasures/{request_id}")[1])["state"] == "completed" and r,
                    deadline=deadline)


def file_erasure(lethe, subject, ticket="DSR-PG"):
    status, filed = lethe.call("POST", "/v1/erasures", {"subject": subject, "ticket": ticket, "reason": "art. 17"})
    assert status == 201, filed
    return filed["id"]


def test_writers_holding_and_overlapping_transactions_cannot_hold_off_a_flip(governed):
    """Two writers with overlapping 0.4 s transactions, a transaction left open after a write
    (psycopg's default), and a repeatable-read reader: none of them holds the flip off. The
    approval answers `suppressed` only once the flip holds (applied, every transaction from
    before it ended), and from that answer on nothing of the subject is read or committed; the
    certificate's counts are the table's."""
    import threading
    lethe, owner_conn, as_role = governed
    s = someone()
    lethe.grant(s)
    owner = owner_conn()
    write(as_role("lethe_app"), TENANT, s, "before it all")

    stop, refusals, commits = threading.Event(), [], []

    def writer(n):
        conn = as_role("lethe_app")
        while not stop.is_set():
            try:
                with conn.transaction():
                    write(conn, TENANT, s, f"writer {n}")
                    time.sleep(0.4)
                    ending = time.monotonic()  # the commit follows: it cannot be earlier
                commits.append(ending)
            except psycopg.Error as e:
                refusals.append(e.diag.message_primary or type(e).__name__)
                if conn.closed or conn.broken:
                    conn = as_role("lethe_app")
                time.sleep(0.05)
        conn.close()

    writers = [threading.Thread(target=writer, args=(n,)) for n in range(2)]
    writers[0].start()
    time.sleep(0.2)  # the second overlaps the first: one of them always holds a decided write
    writers[1].start()
    left_open = as_role("lethe_app", autocommit=False)
    write(left_open, TENANT, s, "decided before the flip, never committed")
    # A login role that acts as the app role through membership is held to the same.
    owner.execute("DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'app_login') THEN CREATE ROLE app_login LOGIN; END IF; END $$")
    owner.execute("GRANT lethe_app TO app_login")
    member = as_role("app_login", autocommit=False)
    write(member, TENANT, s, "decided before the flip by a member of the app role")
    reader = as_role("lethe_app", autocommit=False)
    reader.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    assert len(visible(reader, s)) >= 1
    wait_for("both writers to have committed", lambda: held(owner, s) >= 3, deadline=10)

    request = file_erasure(lethe, s)
    started = time.monotonic()
    status, approved = lethe.call("POST", f"/v1/erasures/{request}/approve")
    answered = time.monotonic()
    took = answered - started
    committed = held(owner, s)
    assert status == 200 and approved["state"] == "suppressed", approved
    assert took < 4, f"the flip was held off for {took:.1f}s"
    assert [f["database"] for f in approved["flip"]] == ["app"] and approved["flip"][0]["applied_at"], approved["flip"]
    fresh = as_role("lethe_app")
    assert visible(fresh, s) == []
    assert refusal(lambda: write(fresh, TENANT, s, "after the answer"))[1] == "lethe: subject_suppressed"
    for session in (left_open, member):
        with pytest.raises(psycopg.OperationalError):
            session.commit()  # its session was ended: the write decided before the flip never lands
    with pytest.raises(psycopg.OperationalError):
        visible(reader, s)  # its snapshot from before the flip is gone with its session
    time.sleep(1)  # the writers keep trying
    stop.set()
    for w in writers:
        w.join(timeout=10)
    assert "lethe: subject_suppressed" in refusals, refusals
    assert commits and max(commits) < answered, "no commit of the subject began after the answer"

    done = completed(lethe, request)
    result = next(t["result"] for t in done["targets"] if t["target"] == "postgres:app")
    assert (result["before"], result["deleted"], result["remaining"]) == (committed, committed, 0), (result, committed)
    assert held(owner, s) == 0
    certificate = lethe.call("GET", f"/v1/erasures/{request}/certificate")[1]["certificate"]
    stores = {st["target"]: st for st in certificate["stores"]}
    assert (stores["postgres:app"]["before"], stores["postgres:app"]["remaining"]) == (committed, 0)
    [flip] = certificate["governed"]
    assert flip["database"] == "app" and flip["online_latency_ms"] == certificate["online_latency_ms"], certificate
    assert flip["flip_held_at"] == done["suppressed_at"], (flip, done["suppressed_at"])

    # A backup taken before the erasure is restored: the rows are back, and replay purges them.
    owner.execute("SET session_replication_role = replica")
    write(owner, TENANT, s, "restored from a backup")
    owner.execute("SET session_replication_role = DEFAULT")
    again = lethe.cli("replay", "--since", done["requested_at"])
    assert again.returncode == 0, again.stdout + again.stderr
    assert held(owner, s) == 0


def test_a_flip_held_back_is_propagating_and_holds_back_no_other_change(governed_patient):
    """A transaction left open with a write of the subject, under a 30 s grace: the approval
    answers `propagating`, naming the database, never `suppressed`; the purge waits; a
    revocation of another subject is applied and answered at once meanwhile. Once the
    transaction commits, the flip holds, and the purge (which counts only then) takes its row."""
    lethe, owner_conn, as_role = governed_patient
    s, other = someone(), someone()
    lethe.grant(s)
    other_grant = lethe.grant(other)
    app, owner = as_role("lethe_app"), owner_conn()
    write(app, TENANT, s, "s, committed")
    write(app, TENANT, other, "other, committed")
    left_open = as_role("lethe_app", autocommit=False)
    write(left_open, TENANT, s, "s, decided before the flip")

    request = file_erasure(lethe, s)
    status, approved = lethe.call("POST", f"/v1/erasures/{request}/approve")
    assert status == 200, approved
    assert approved["state"] == "propagating" and approved["suppressed_at"] is None, approved
    assert approved["flip"] == [{"database": "app", "applied_at": None}], approved["flip"]
    assert approved["online_latency_ms"] is None
    # Every statement from now on sees the flip; only the open transaction is from before it.
    assert visible(app, s) == []
    assert refusal(lambda: write(app, TENANT, s, "late"))[1] == "lethe: subject_suppressed"

    started = time.monotonic()
    assert lethe.call("POST", f"/v1/consents/{other_grant}/revoke")[0] == 200
    assert time.monotonic() - started < 2, "the revocation did not queue behind the flip"
    assert visible(app, other) == []
    assert refusal(lambda: write(app, TENANT, other, "other, late"))[1] == "lethe: consent_required"

    view = lethe.call("GET", f"/v1/erasures/{request}")[1]
    assert view["state"] == "propagating" and all(t["result"] is None for t in view["targets"]), view

    left_open.commit()  # decided before the flip: it lands, and must be purged with the rest
    done = completed(lethe, request)
    result = next(t["result"] for t in done["targets"] if t["target"] == "postgres:app")
    assert (result["before"], result["deleted"], result["remaining"]) == (2, 2, 0), result
    assert held(owner, s) == 0
    flip = done["flip"][0]
    assert flip["applied_at"] == done["suppressed_at"] and done["online_latency_ms"] > 0, done




def test_lethe_starts_while_a_governed_database_is_down_and_governs_it_once_it_is_back(chroma, pgvector, tmp_path):
    url = pgvector()
    name = url.split("/")[3].split("?")[0]
    admin = psycopg.connect(url.replace(f"/{name}?", "/postgres?", 1), autocommit=True)
    with psycopg.connect(url, autocommit=True) as owner:
        owner.execute("CREATE EXTENSION IF NOT EXISTS vector")
    admin.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")
    try:
        lethe = two_tenant_lethe(chroma, tmp_path, governed_toml(url))
    except Exception:
        admin.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")
        raise
    metric = lambda: next(l for l in urllib.request.urlopen(f"http://{lethe.control}/metrics").read().decode().splitlines()
                          if l.startswith('lethe_governed_ready{database="app"}'))
    try:
        assert urllib.request.urlopen(f"http://{lethe.control}/readyz").status == 200
        assert metric().endswith(" 0"), metric()
    finally:
        admin.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")
    try:
        # The table appears once the database is back; the rules follow it as soon as Lethe
        # can install them (the live check would fail on a missing table).
        with psycopg.connect(url, autocommit=True) as owner:
            owner.execute("""CREATE TABLE memories (id bigserial PRIMARY KEY, tenant_id text NOT NULL, user_id text NOT NULL,
                             category text NOT NULL, content text NOT NULL, embedding vector(3))""")
        wait_for("the rules to be installed", lambda: metric().endswith(" 1"), deadline=30)
        app = app_connector(url)("lethe_app")
        assert refusal(lambda: write(app, TENANT, someone(), "no consent"))[1] == "lethe: consent_required"
    finally:
        lethe.stop()
