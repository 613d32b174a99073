"""Attacks on the LangGraph route, from the next tenant's and the next subject's point of view:
other spellings of a thread id, pre-claimed thread ids, claims of objects made around Lethe,
another namespace's store items, revival of expired items and widening searches. The official `langgraph_sdk` drives what it
can, hand-written HTTP the rest. Every case asserts what the LangGraph server itself holds
afterwards (plain HTTP straight to it, bypassing Lethe), and where lineage matters, what the state
store holds."""

import json
import subprocess
import time
import uuid

import httpx
import pytest

from conftest import GLOBEX, TENANT, send, someone, two_tenant_lethe, wait_for

HEADERS = {"X-Lethe-Purpose": "personalization", "X-Lethe-Category": "preference"}
RUN = {"assistant_id": "agent", "input": {"messages": ["injected"]}}


@pytest.fixture(scope="module")
def gate(chroma, langgraph, tmp_path_factory):
    erasure = '[erasure]\nretry_backoff = "200ms"\nsettle = "100ms"\nsweep_interval = "200ms"\n'
    instance = two_tenant_lethe(chroma, tmp_path_factory.mktemp("attack-langgraph"), erasure, langgraph_url=langgraph)
    yield instance
    instance.stop()



def granted(gate, tenant=TENANT):
    s = someone(tenant)
    gate.grant(s, tenant=tenant)
    return s


def sdk(gate, tenant, subject=None):
    """The official SDK with an agent token of `tenant` (bound to `subject` when given)."""
    return gate.graph(gate.token("agent", subject, tenant=tenant), **HEADERS)




def lethe(gate, token, method, path, body=None, raw_body=None, **headers):
    """A hand-written request to the route, for what the SDK would never send."""
    return send(f"http://{gate.data}/langgraph", method, path, body,
                {"Authorization": f"Bearer {token}", **HEADERS, **headers}, raw_body)


def server(langgraph, method, path, body=None):
    """Straight to the LangGraph server: what it really holds."""
    return send(langgraph, method, path, body)


def code(value):
    return (value.get("error") or {}).get("code") if isinstance(value, dict) else None


def refused(call):
    """The status and Lethe's error code of a call the SDK raised for."""
    with pytest.raises(httpx.HTTPStatusError) as e:
        call()
    try:
        body = e.value.response.json()
    except ValueError:
        body = None
    return e.value.response.status_code, code(body)


def attempt(call):
    """(status, Lethe's code) of a refused SDK call, or ("accepted", its result)."""
    try:
        return "accepted", call()
    except httpx.HTTPStatusError as e:
        try:
            body = e.response.json()
        except ValueError:
            body = None
        return e.response.status_code, code(body)


def held_thread(langgraph, thread_id):
    """What the server holds for a thread: (metadata, state values, number of runs), or None."""
    status, thread = server(langgraph, "GET", f"/threads/{thread_id}")
    if status == 404:
        return None
    assert status == 200, thread
    state = server(langgraph, "GET", f"/threads/{thread_id}/state")[1]
    runs = server(langgraph, "GET", f"/threads/{thread_id}/runs")[1]
    return thread["metadata"], state["values"], len(runs)


def idle_thread(langgraph, thread_id):
    """What the server holds for a thread once its last run is wholly done (the server finishes a
    run's bookkeeping just after `runs/wait` answers)."""
    wait_for("the thread to be idle", lambda: server(langgraph, "GET", f"/threads/{thread_id}")[1]["status"] == "idle",
             deadline=10)
    return held_thread(langgraph, thread_id)


def held_item(langgraph, namespace, key):
    """The value the server holds under a namespace and key, or None."""
    status, item = server(langgraph, "GET", f"/store/items?namespace={'.'.join(namespace)}&key={key}")
    assert status == 200, item
    return item and item["value"]


def lineage_rows(gate, collection, item_id):
    """Live lineage rows for an id, straight from the state store: (tenant, subject)."""
    sql = (f"SELECT tenant || '/' || subject FROM items WHERE collection = '{collection}' "
           f"AND item_id = '{item_id}' AND deleted_at IS NULL")
    return subprocess.run(["psql", gate.state_url, "-qtAc", sql], check=True, capture_output=True,
                          text=True).stdout.split()


def store_id(namespace, key):
    return json.dumps([*namespace, key], separators=(",", ":"))


def lineage_settles(gate, collection, item_id, expected):
    """Store items' lineage is written off the request path: waits until the rows are `expected`."""
    wait_for(f"lineage of {item_id} to be {expected}",
             lambda: lineage_rows(gate, collection, item_id) == expected, deadline=10)


def erase(gate, tenant, subject):
    """Each store's result of the subject's completed erasure."""
    return gate.erase_to_completion(subject, tenant)[1]


def spellings(thread_id):
    """Other spellings of one thread UUID; the server takes the plain ones as the same thread."""
    u = uuid.UUID(thread_id)
    return [
        thread_id.upper(),
        u.hex,
        u.hex.upper(),
        "{" + thread_id + "}",
        "urn:uuid:" + thread_id,
        "%20" + thread_id,
        thread_id + "%20",
        "%09" + thread_id,
        "%7B" + thread_id + "%7D",
        "%" + format(ord(thread_id[0]), "X") + thread_id[1:],
        thread_id.replace("-", "%2D", 1),
    ]


def thread_requests(spelling):
    return [
        ("GET", f"/threads/{spelling}", None),
        ("PATCH", f"/threads/{spelling}", {"metadata": {"claimed": True}}),
        ("GET", f"/threads/{spelling}/state", None),
        ("POST", f"/threads/{spelling}/state", {"values": {"messages": ["injected"]}}),
        ("GET", f"/threads/{spelling}/history", None),
        ("POST", f"/threads/{spelling}/history", {"limit": 10}),
        ("GET", f"/threads/{spelling}/runs", None),
        ("POST", f"/threads/{spelling}/runs", RUN),
        ("POST", f"/threads/{spelling}/runs/wait", RUN),
        ("DELETE", f"/threads/{spelling}", None),
    ]


# -- 1. other spellings of a thread id ---------------------------------------------------------

def test_another_spelling_of_a_thread_id_reaches_nothing(gate, langgraph):
    owner, neighbour, outsider = granted(gate), granted(gate), granted(gate, GLOBEX)
    mine = sdk(gate, TENANT, owner)
    thread = mine.threads.create(metadata={"topic": "tea"})["thread_id"]
    mine.runs.wait(thread, "agent", input={"messages": ["acme's secret"]})
    before = idle_thread(langgraph, thread)
    assert before[1]["messages"] == ["acme's secret", "noted: acme's secret"]
    variant_states = {v: server(langgraph, "GET", f"/threads/{v}/state") for v in spellings(thread)}

    tokens = {"owner": gate.token("agent", owner), "neighbour": gate.token("agent", neighbour),
              "globex": gate.token("agent", outsider, tenant=GLOBEX),
              "globex service": gate.token("agent", tenant=GLOBEX)}
    let_through = []
    for who, token in tokens.items():
        for spelling in spellings(thread):
            for method, path, body in thread_requests(spelling):
                status, answer = lethe(gate, token, method, path, body)
                if not 400 <= status < 500:
                    let_through.append((who, method, path, status, answer))
    assert let_through == []
    # The same through the SDK, which writes whatever id it is given into the path.
    for client in (mine, sdk(gate, GLOBEX, outsider)):
        for spelling in (thread.upper(), uuid.UUID(thread).hex, "urn:uuid:" + thread):
            assert refused(lambda: client.threads.get(spelling))[0] in (400, 403)
            assert refused(lambda: client.threads.get_state(spelling))[0] in (400, 403)
            assert refused(lambda: client.threads.update_state(spelling, {"messages": ["injected"]}))[0] in (400, 403)
            assert refused(lambda: client.runs.wait(spelling, "agent", input={"messages": ["injected"]}))[0] in (400, 403)

    assert held_thread(langgraph, thread) == before
    # The in-memory server keys checkpoints by the spelling: a write through one would show there.
    for spelling, state in variant_states.items():
        assert server(langgraph, "GET", f"/threads/{spelling}/state") == state, spelling
    assert lineage_rows(gate, "threads", thread) == [f"{TENANT}/{owner}"]


def test_percent_encoded_and_irregular_thread_paths_are_refused(gate, langgraph):
    owner = granted(gate)
    mine = sdk(gate, TENANT, owner)
    thread = mine.threads.create()["thread_id"]
    mine.runs.wait(thread, "agent", input={"messages": ["kept"]})
    before = idle_thread(langgraph, thread)
    token = gate.token("agent", owner)
    paths = [
        f"/thr%65ads/{thread}", f"/threads/{thread}%2Fstate", f"/threads/{thread}/st%61te",
        f"/threads%2F{thread}", f"/threads/{thread}/", f"/threads//{thread}", f"/threads/./{thread}",
        f"/threads/x/../{thread}", f"/threads/{thread}/runs%2Fwait", f"/threads/{thread}\\state",
    ]
    let_through = []
    for path in paths:
        for method, body in (("GET", None), ("POST", {"values": {"messages": ["injected"]}}),
                             ("PATCH", {"metadata": {"claimed": True}}), ("DELETE", None)):
            status, answer = lethe(gate, token, method, path, body)
            if (status, code(answer)) != (400, "invalid_request"):
                let_through.append((method, path, status, answer))
    assert let_through == []
    assert held_thread(langgraph, thread) == before


# -- 2. pre-claiming a thread id ---------------------------------------------------------------

def test_a_client_chosen_thread_id_cannot_be_claimed_twice(gate, langgraph):
    squatter, owner = granted(gate, GLOBEX), granted(gate)
    theirs, mine = sdk(gate, GLOBEX, squatter), sdk(gate, TENANT, owner)
    chosen = str(uuid.uuid4())
    theirs.threads.create(thread_id=chosen, metadata={"who": "globex"})
    theirs.runs.wait(chosen, "agent", input={"messages": ["globex's"]})
    before = idle_thread(langgraph, chosen)
    assert (before[0]["lethe_tenant"], before[0]["lethe_subject"]) == (GLOBEX, squatter)

    assert refused(lambda: mine.threads.create(thread_id=chosen, metadata={"who": "acme"}))[0] in (403, 409)
    assert refused(lambda: mine.threads.create(thread_id=chosen, if_exists="do_nothing")) == (400, "invalid_request")
    assert refused(lambda: mine.threads.create(thread_id=chosen.upper())) == (400, "invalid_request")
    assert refused(lambda: mine.threads.get(chosen)) == (403, "scope_violation")
    assert held_thread(langgraph, chosen) == before
    assert lineage_rows(gate, "threads", chosen) == [f"{GLOBEX}/{squatter}"]

    # Metadata naming another tenant's stamp is not taken at its word.
    status, created = lethe(gate, gate.token("agent", squatter, tenant=GLOBEX), "POST", "/threads",
                            {"metadata": {"lethe_tenant": TENANT, "lethe_subject": owner}})
    if status == 200:
        meta = held_thread(langgraph, created["thread_id"])[0]
        assert (meta["lethe_tenant"], meta["lethe_subject"]) == (GLOBEX, squatter)
        assert refused(lambda: mine.threads.get(created["thread_id"])) == (403, "scope_violation")
    else:
        assert 400 <= status < 500, created


def test_a_deleted_thread_id_taken_up_by_another_tenant_stays_theirs(gate, langgraph):
    first, second = granted(gate), granted(gate, GLOBEX)
    mine, theirs = sdk(gate, TENANT, first), sdk(gate, GLOBEX, second)
    reused = mine.threads.create(metadata={"who": "acme"})["thread_id"]
    mine.runs.wait(reused, "agent", input={"messages": ["acme's, deleted"]})
    mine.threads.delete(reused)
    assert held_thread(langgraph, reused) is None

    try:
        theirs.threads.create(thread_id=reused, metadata={"who": "globex"})
        taken = True
    except httpx.HTTPStatusError as e:
        assert e.response.status_code in (403, 409), e.response.text
        taken = False
    if not taken:
        # Refused: nothing was created, and the old owner cannot bring the id back either.
        assert held_thread(langgraph, reused) is None
        assert refused(lambda: mine.threads.get(reused))[0] == 403
        return
    theirs.runs.wait(reused, "agent", input={"messages": ["globex's now"]})
    meta, values, _ = held_thread(langgraph, reused)
    assert (meta["lethe_tenant"], meta["lethe_subject"], meta["who"]) == (GLOBEX, second, "globex")
    assert values["messages"] == ["globex's now", "noted: globex's now"]
    assert lineage_rows(gate, "threads", reused) == [f"{GLOBEX}/{second}"]
    # The old owner reaches nothing of it, and the old owner's erasure takes nothing of it.
    assert refused(lambda: mine.threads.get(reused))[0] == 403
    assert refused(lambda: mine.threads.get_state(reused))[0] == 403
    assert refused(lambda: mine.threads.delete(reused))[0] == 403
    assert erase(gate, TENANT, first)["langgraph:langgraph"]["before"] == 0
    assert held_thread(langgraph, reused)[1]["messages"][0] == "globex's now"
    assert theirs.threads.get(reused)["thread_id"] == reused


# -- 3. objects made around Lethe --------------------------------------------------------------

def test_a_thread_made_around_lethe_is_never_claimed(gate, langgraph):
    owner = granted(gate)
    mine = sdk(gate, TENANT, owner)
    status, stray = server(langgraph, "POST", "/threads",
                           {"metadata": {"lethe_tenant": TENANT, "lethe_subject": owner, "lethe_purpose": "personalization",
                                         "lethe_category": "preference", "lethe_expires_at": int(time.time()) + 3600,
                                         "lethe_epoch": 0}})
    assert status == 200
    stray = stray["thread_id"]
    before = held_thread(langgraph, stray)
    assert refused(lambda: mine.threads.get(stray)) == (403, "unstamped_item")
    assert refused(lambda: mine.threads.get_state(stray)) == (403, "unstamped_item")
    assert refused(lambda: mine.threads.update(stray, metadata={"mine": True})) == (403, "unstamped_item")
    assert refused(lambda: mine.threads.update_state(stray, {"messages": ["mine"]})) == (403, "unstamped_item")
    assert refused(lambda: mine.runs.wait(stray, "agent", input={"messages": ["mine"]})) == (403, "unstamped_item")
    assert refused(lambda: mine.threads.delete(stray)) == (403, "unstamped_item")
    # Registering it by creating its id: the server refuses the duplicate, lineage takes nothing.
    assert refused(lambda: mine.threads.create(thread_id=stray))[0] in (403, 409)
    assert refused(lambda: mine.threads.create(thread_id=stray, if_exists="do_nothing")) == (400, "invalid_request")
    assert held_thread(langgraph, stray) == before
    assert lineage_rows(gate, "threads", stray) == []
    assert stray not in {t["thread_id"] for t in mine.threads.search(limit=1000)}

    # A run that would create the thread it names (`if_not_exists: create`).
    fresh = str(uuid.uuid4())
    status, answer = lethe(gate, gate.token("agent", owner), "POST", f"/threads/{fresh}/runs/wait",
                           {**RUN, "if_not_exists": "create"})
    assert (status, code(answer)) == (403, "unstamped_item")
    assert held_thread(langgraph, fresh) is None


def test_a_store_item_made_around_lethe_is_never_claimed(gate, langgraph):
    owner = granted(gate)
    mine = sdk(gate, TENANT, owner)
    namespace = [TENANT, owner, "facts"]
    assert server(langgraph, "PUT", "/store/items", {"namespace": namespace, "key": "raw",
                                                     "value": {"text": "written around Lethe"}})[0] == 204
    outcome = attempt(lambda: mine.store.put_item(namespace, "raw", {"text": "mine now"}))
    assert (outcome, held_item(langgraph, namespace, "raw")) == ((403, "unstamped_item"), {"text": "written around Lethe"})
    assert mine.store.get_item(namespace, "raw") is None
    found = mine.store.search_items([TENANT, owner], limit=100)["items"]
    assert [i["key"] for i in found if i["key"] == "raw"] == []
    # Once a later write's lineage is in, a claim's would be too.
    mine.store.put_item(namespace, "mark", {"text": "mine"})
    lineage_settles(gate, "store", store_id(namespace, "mark"), [f"{TENANT}/{owner}"])
    assert lineage_rows(gate, "store", store_id(namespace, "raw")) == []


# -- 4. store items of another subject or tenant -----------------------------------------------

def test_another_namespaces_items_are_out_of_reach(gate, langgraph):
    victim, neighbour, outsider = granted(gate), granted(gate), granted(gate, GLOBEX)
    namespace = [TENANT, victim, "facts"]
    sdk(gate, TENANT, victim).store.put_item(namespace, "secret", {"text": "acme's secret"})
    before = held_item(langgraph, namespace, "secret")
    assert (before["text"], before["lethe_subject"], before["lethe_tenant"]) == ("acme's secret", victim, TENANT)
    readers = {"neighbour": sdk(gate, TENANT, neighbour), "globex": sdk(gate, GLOBEX, outsider),
               "globex service": sdk(gate, GLOBEX)}
    for who, reader in readers.items():
        assert refused(lambda: reader.store.put_item(namespace, "secret", {"text": "overwritten"}))[0] in (400, 403), who
        assert refused(lambda: reader.store.put_item(namespace, "planted", {"text": "planted"}))[0] in (400, 403), who
        assert refused(lambda: reader.store.get_item(namespace, "secret"))[0] in (400, 403), who
        assert refused(lambda: reader.store.delete_item(namespace, "secret"))[0] in (400, 403), who
    # Tokens naming the victim in X-Lethe-Subject: bound to another subject, or of another tenant.
    let_through = []
    for token in (gate.token("agent", neighbour), gate.token("agent", tenant=GLOBEX)):
        for method, path, body in (("PUT", "/store/items", {"namespace": namespace, "key": "secret", "value": {"text": "overwritten"}}),
                                   ("GET", f"/store/items?namespace={'.'.join(namespace)}&key=secret", None),
                                   ("DELETE", "/store/items", {"namespace": namespace, "key": "secret"})):
            status, answer = lethe(gate, token, method, path, body, **{"X-Lethe-Subject": victim})
            if not 400 <= status < 500:
                let_through.append((method, status, answer))
    assert let_through == []
    assert held_item(langgraph, namespace, "secret") == before
    assert held_item(langgraph, namespace, "planted") is None


def test_store_searches_and_listings_never_widen(gate, langgraph):
    victim, neighbour, outsider = granted(gate), granted(gate), granted(gate, GLOBEX)
    namespace = [TENANT, victim, "facts"]
    sdk(gate, TENANT, victim).store.put_item(namespace, "secret", {"text": "acme's secret about green tea"})
    readers = {"neighbour": sdk(gate, TENANT, neighbour), "globex": sdk(gate, GLOBEX, outsider),
               "globex service": sdk(gate, GLOBEX)}
    filters = [None, {"lethe_tenant": TENANT}, {"lethe_subject": victim},
               {"lethe_tenant": TENANT, "lethe_subject": victim}, {"lethe_tenant": {"$ne": "nobody"}},
               {"text": "acme's secret about green tea"}]
    seen = []
    for who, reader in readers.items():
        for prefix in ([TENANT], [TENANT, victim], namespace, ["*"], ["*", victim]):
            for where in filters:
                for query in (None, "green tea"):
                    try:
                        items = reader.store.search_items(prefix, filter=where, query=query, limit=100)["items"]
                    except httpx.HTTPStatusError as e:
                        assert 400 <= e.response.status_code < 500
                        continue
                    seen += [(who, prefix, where, i["namespace"]) for i in items if victim in i["namespace"]]
        for prefix, suffix in ((["*"], None), (None, ["*"]), ([TENANT], None), (["*", victim], None),
                               (None, ["facts"]), (None, [victim, "*"]), (None, None)):
            listed = reader.store.list_namespaces(prefix=prefix, suffix=suffix, limit=1000)["namespaces"]
            seen += [(who, prefix, suffix, ns) for ns in listed
                     if victim in ns or (who.startswith("globex") and ns[:1] == [TENANT])]
    assert seen == []
    assert held_item(langgraph, namespace, "secret")["text"] == "acme's secret about green tea"


def test_repeated_or_duplicated_item_parameters_never_reach_another_namespace(gate, langgraph):
    victim, neighbour, outsider = granted(gate), granted(gate), granted(gate, GLOBEX)
    namespace = [TENANT, victim, "facts"]
    sdk(gate, TENANT, victim).store.put_item(namespace, "secret", {"text": "acme's secret"})
    before = held_item(langgraph, namespace, "secret")
    reached = []
    for tenant, attacker in ((TENANT, neighbour), (GLOBEX, outsider)):
        own = [tenant, attacker, "facts"]
        sdk(gate, tenant, attacker).store.put_item(own, "secret", {"text": "the attacker's own"})
        token = gate.token("agent", attacker, tenant=tenant)
        theirs, other = ".".join(own), ".".join(namespace)
        for query in (f"namespace={theirs}&key=secret&namespace={other}",
                      f"namespace={other}&key=secret&namespace={theirs}",
                      f"namespace={theirs}&namespace={other}&key=secret&key=secret",
                      f"namespace={theirs}&key=x&key=secret&namespace={other}"):
            status, answer = lethe(gate, token, "GET", f"/store/items?{query}")
            if status == 200 and answer and answer.get("value", {}).get("text") == "acme's secret":
                reached.append((attacker, query, answer))
        # JSON with the namespace twice: whichever one each side takes, never the victim's.
        for method in ("PUT", "DELETE"):
            raw = ('{"namespace": %s, "key": "secret", "value": {"text": "overwritten"}, "namespace": %s}'
                   % (json.dumps(own), json.dumps(namespace)))
            status, answer = lethe(gate, token, method, "/store/items", raw_body=raw.encode())
            raw = ('{"namespace": %s, "key": "secret", "value": {"text": "overwritten"}, "namespace": %s}'
                   % (json.dumps(namespace), json.dumps(own)))
            lethe(gate, token, method, "/store/items", raw_body=raw.encode())
    assert reached == []
    assert held_item(langgraph, namespace, "secret") == before


# -- 5. revival and retention restart of store items -------------------------------------------

def test_a_rewrite_never_extends_an_items_retention(gate, langgraph):
    s = granted(gate)
    mine = sdk(gate, TENANT, s)
    namespace = [TENANT, s, "facts"]
    deadline = int(time.time()) + 3600
    mine.store.put_item(namespace, "long", {"text": "first", "lethe_expires_at": deadline})
    assert held_item(langgraph, namespace, "long")["lethe_expires_at"] == deadline
    observed = {}
    mine.store.put_item(namespace, "long", {"text": "rewritten"})
    observed["rewrite"] = held_item(langgraph, namespace, "long")["lethe_expires_at"] - deadline
    # Asking for a later deadline outright: refused, or kept to the first one.
    outcome = attempt(lambda: mine.store.put_item(namespace, "long", {"text": "longer", "lethe_expires_at": deadline + 7200}))
    observed["ask for later"] = held_item(langgraph, namespace, "long")["lethe_expires_at"] - deadline
    assert outcome[0] == "accepted" or 400 <= outcome[0] < 500, outcome
    # Seconds the deadline moved on the server: none.
    assert observed == {"rewrite": 0, "ask for later": 0}
    # An earlier one is the client's right.
    mine.store.put_item(namespace, "long", {"text": "shorter", "lethe_expires_at": deadline - 600})
    assert held_item(langgraph, namespace, "long")["lethe_expires_at"] == deadline - 600


def test_an_expired_item_stays_dead(gate, langgraph):
    s = granted(gate)
    mine = sdk(gate, TENANT, s)
    namespace = [TENANT, s, "facts"]
    # A legal hold keeps the sweeper away, so that the expired item is still on the server when
    # its owner tries to bring it back.
    status, hold = gate.call("POST", "/v1/legal-holds", {"subject": s, "reason": "litigation"})
    assert status == 201, hold
    soon = int(time.time()) + 2
    mine.store.put_item(namespace, "short", {"text": "short-lived", "lethe_expires_at": soon})
    mine.store.put_item(namespace, "kept", {"text": "lasting"})
    wait_for("the item to expire", lambda: time.time() > soon + 1, deadline=10)
    assert mine.store.get_item(namespace, "short") is None
    outcomes = [attempt(lambda: mine.store.put_item(namespace, "short", {"text": "revived"})),
                attempt(lambda: mine.store.put_item(namespace, "short", {"text": "revived", "lethe_expires_at": soon + 3600}))]
    value = held_item(langgraph, namespace, "short")
    assert (outcomes, value["text"], value["lethe_expires_at"]) == ([(403, "expired")] * 2, "short-lived", soon)
    assert mine.store.get_item(namespace, "short") is None
    # Once the hold is released the sweeper deletes it; the unexpired item stays.
    assert gate.call("POST", f"/v1/legal-holds/{hold['id']}/release")[0] == 200
    wait_for("the sweeper to delete the expired item", lambda: held_item(langgraph, namespace, "short") is None, deadline=15)
    assert held_item(langgraph, namespace, "kept")["text"] == "lasting"


# -- 6. thread searches and counts -------------------------------------------------------------

def test_thread_searches_and_counts_never_widen(gate, langgraph):
    victim, neighbour, outsider = granted(gate), granted(gate), granted(gate, GLOBEX)
    run = uuid.uuid4().hex
    theirs = sdk(gate, TENANT, victim)
    threads = [theirs.threads.create(metadata={"run": run})["thread_id"] for _ in range(2)]
    theirs.runs.wait(threads[0], "agent", input={"messages": ["acme's secret"]})
    readers = {"neighbour": sdk(gate, TENANT, neighbour), "globex": sdk(gate, GLOBEX, outsider),
               "globex service": sdk(gate, GLOBEX)}
    filters = [{"run": run}, {"run": run, "lethe_tenant": TENANT}, {"run": run, "lethe_subject": victim},
               {"run": run, "lethe_tenant": TENANT, "lethe_subject": victim}, {"lethe_tenant": TENANT}]
    seen = []
    for who, reader in readers.items():
        for metadata in filters:
            found = reader.threads.search(metadata=metadata, limit=1000)
            seen += [(who, metadata, t["thread_id"]) for t in found if t["thread_id"] in threads]
            if metadata.get("run"):
                assert reader.threads.count(metadata=metadata) == 0, (who, metadata)
        found = reader.threads.search(ids=threads, limit=1000)
        found += reader.threads.search(metadata={"run": run}, select=["metadata"], limit=1000)
        seen += [(who, "ids/values/select", t.get("thread_id")) for t in found]
        # A checkpoint of the victim's thread, asked for under the reader's own thread.
        checkpoint = server(langgraph, "GET", f"/threads/{threads[0]}/state")[1]["checkpoint"]["checkpoint_id"]
        if who != "globex service":
            own = reader.threads.create()["thread_id"]
            state = reader.threads.get_state(own, checkpoint_id=checkpoint)
            assert "acme's secret" not in json.dumps(state), who
            assert refused(lambda: reader.threads.get_state(threads[0], checkpoint_id=checkpoint))[0] == 403
    assert seen == []
    # Lethe's own count for the victim: both threads, so the filters above were not simply empty.
    assert theirs.threads.count(metadata={"run": run}) == 2
    assert sorted(t["thread_id"] for t in server(langgraph, "POST", "/threads/search", {"metadata": {"run": run}})[1]) == sorted(threads)
