"""Attacks on the OpenAI-compatible provider route, from the next tenant's and the next subject's
point of view: other spellings of an object id, another subject's or tenant's objects (named in
the path or inside a request), objects made around Lethe, and what is left of an erased subject.
The official `openai` SDK drives what it can, hand-written HTTP the rest. Every case asserts what
the stand-in provider itself holds afterwards (its own HTTP API, bypassing Lethe) and that a
refused request never reached it (its request counter)."""

import subprocess
import uuid

import openai
import pytest

from conftest import GLOBEX, TENANT, send, two_tenant_lethe

PURPOSE = {"X-Lethe-Purpose": "support", "X-Lethe-Category": "conversation"}
KEEPS = ("send_to_provider", "provider_retention")
MESSAGE = [{"type": "message", "role": "user", "content": "injected"}]


@pytest.fixture(scope="module")
def gate(chroma, provider, tmp_path_factory):
    erasure = '[erasure]\nretry_backoff = "200ms"\nsettle = "100ms"\n'
    instance = two_tenant_lethe(chroma, tmp_path_factory.mktemp("attack-openai"), erasure, openai_url=provider)
    yield instance
    instance.stop()


@pytest.fixture(scope="module")
def direct(provider):
    """The SDK straight at the stand-in, bypassing Lethe."""
    return openai.OpenAI(base_url=f"{provider}/v1", api_key="sk-standin", max_retries=0)


def granted(gate, tenant=TENANT, subject=None, actions=KEEPS):
    subject = subject or f"{tenant}-{uuid.uuid4().hex[:8]}"
    status, grant = gate.call("POST", "/v1/consents", {
        "tenant": tenant, "subject": subject, "purpose": "support", "category": "conversation",
        "actions": list(actions), "source": "pytest", "policy_version": 1,
    }, token=gate.token("compliance", tenant=tenant))
    assert status == 201, grant
    return subject


def client(gate, tenant, subject):
    return gate.openai(token=gate.token("agent", subject, tenant=tenant))




def lethe(gate, token, method, path, body=None, **headers):
    return send(f"http://{gate.data}/openai", method, path, body, {"Authorization": f"Bearer {token}", **PURPOSE, **headers})


def code(value):
    return (value.get("error") or {}).get("code") if isinstance(value, dict) else None


def outcome(call):
    """(status, Lethe's code) of a refused SDK call, or "accepted"."""
    try:
        call()
        return "accepted"
    except openai.APIStatusError as e:
        return e.status_code, e.code


def requests_seen(provider):
    """The stand-in's request counter, less the request that reads it."""
    return send(provider, "GET", "/_stats")[1]["requests"] - 1


def attack(provider, calls):
    """Runs `calls` (name -> call answering (status, code) or "accepted"): answers those that
    were not refused before the provider (accepted, or a request reached the stand-in), and
    every call's outcome."""
    reached, outcomes = {}, {}
    for name, call in calls.items():
        before = requests_seen(provider)
        outcomes[name] = result = call()
        after = requests_seen(provider) - 1
        if after != before or not isinstance(result, tuple) or not 400 <= result[0] < 500:
            reached[name] = (result, after - before)
    return reached, outcomes


def at_provider(provider, path):
    return send(provider, "GET", path)[0]


def objects(gate, tenant, subject):
    """A subject's objects the provider keeps, made through Lethe: their ids and paths at the
    stand-in."""
    mine = client(gate, tenant, subject)
    response = mine.responses.create(model="gpt-test", input=f"{subject}'s secret").id
    conversation = mine.conversations.create(metadata={"topic": "secret"}).id
    item = mine.conversations.items.create(conversation, items=[{"type": "message", "role": "user",
                                                                 "content": f"{subject}'s address"}]).data[0].id
    file = mine.files.create(file=("notes.jsonl", b'{"text": "secret"}\n'), purpose="user_data").id
    ids = {"response": response, "conversation": conversation, "item": item, "file": file}
    paths = {"response": f"/v1/responses/{response}", "conversation": f"/v1/conversations/{conversation}",
             "item": f"/v1/conversations/{conversation}/items/{item}", "file": f"/v1/files/{file}"}
    assert all(at_provider(gate_provider(gate), p) == 200 for p in paths.values())
    return ids, paths


def gate_provider(gate):
    return gate.env["LETHE_UPSTREAM_OPENAI"]


def object_requests(ids, spell=lambda x: x):
    """Every request naming one of the objects, with `spell` applied to the id in the path."""
    r, c, i, f = (spell(ids[k]) for k in ("response", "conversation", "item", "file"))
    return [
        ("GET", f"/v1/responses/{r}", None), ("GET", f"/v1/responses/{r}/input_items", None),
        ("POST", f"/v1/responses/{r}/cancel", None), ("DELETE", f"/v1/responses/{r}", None),
        ("GET", f"/v1/conversations/{c}", None), ("POST", f"/v1/conversations/{c}", {"metadata": {"claimed": "yes"}}),
        ("GET", f"/v1/conversations/{c}/items", None), ("POST", f"/v1/conversations/{c}/items", {"items": MESSAGE}),
        ("GET", f"/v1/conversations/{c}/items/{i}", None), ("DELETE", f"/v1/conversations/{c}/items/{i}", None),
        ("DELETE", f"/v1/conversations/{c}", None),
        ("GET", f"/v1/files/{f}", None), ("GET", f"/v1/files/{f}/content", None), ("DELETE", f"/v1/files/{f}", None),
    ]


def builds_on(ids):
    """Requests that name the objects inside their content."""
    r, c, f = ids["response"], ids["conversation"], ids["file"]
    file_input = [{"role": "user", "content": [{"type": "input_text", "text": "summarise"},
                                               {"type": "input_file", "file_id": f}]}]
    return {
        "previous_response_id": ("POST", "/v1/responses", {"model": "gpt-test", "input": "go on", "previous_response_id": r}),
        "conversation": ("POST", "/v1/responses", {"model": "gpt-test", "input": "x", "conversation": c}),
        "conversation object": ("POST", "/v1/responses", {"model": "gpt-test", "input": "x", "conversation": {"id": c}}),
        "streamed previous_response_id": ("POST", "/v1/responses", {"model": "gpt-test", "input": "x", "stream": True,
                                                                    "previous_response_id": r}),
        "input_file": ("POST", "/v1/responses", {"model": "gpt-test", "input": file_input}),
        "code interpreter files": ("POST", "/v1/responses", {"model": "gpt-test", "input": "x", "tools": [
            {"type": "code_interpreter", "container": {"type": "auto", "file_ids": [f]}}]}),
        "chat file": ("POST", "/v1/chat/completions", {"model": "gpt-test", "messages": [
            {"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "file", "file": {"file_id": f}}]}]}),
    }


def spellings(object_id):
    return {
        "upper case": object_id.upper(),
        "first letter upper": object_id[0].upper() + object_id[1:],
        "leading space": "%20" + object_id,
        "trailing space": object_id + "%20",
        "leading tab": "%09" + object_id,
        "percent-encoded letter": "%" + format(ord(object_id[0]), "X") + object_id[1:],
        "percent-encoded last": object_id[:-1] + "%" + format(ord(object_id[-1]), "X"),
        "trailing slash": object_id + "/",
        "double slash": "/" + object_id,
        "dot segment": "./" + object_id,
        "encoded slash": object_id + "%2F",
    }


def held_unchanged(provider, paths, items_before):
    status = {name: at_provider(provider, path) for name, path in paths.items()}
    conversation = paths["conversation"]
    return status, send(provider, "GET", f"{conversation}/items")[1]["data"] == items_before


# -- 1. other spellings of an object id --------------------------------------------------------

def test_another_spelling_of_an_object_id_reaches_nothing(gate, provider):
    owner = granted(gate)
    neighbour = granted(gate)
    same_name = granted(gate, GLOBEX, subject=owner)
    ids, paths = objects(gate, TENANT, owner)
    items = send(provider, "GET", f"{paths['conversation']}/items")[1]["data"]
    callers = {"owner": gate.token("agent", owner), "neighbour": gate.token("agent", neighbour),
               "globex, same subject name": gate.token("agent", same_name, tenant=GLOBEX)}
    calls = {}
    for who, token in callers.items():
        for name in spellings("x"):
            spell = lambda i, name=name: spellings(i)[name]
            for method, path, body in object_requests(ids, spell):
                calls[(who, name, method, path)] = lambda t=token, m=method, p=path, b=body: (
                    lambda s, a: (s, code(a)))(*lethe(gate, t, m, p, b))
        # Through the SDK, which percent-encodes what it puts into a path.
        sdk = gate.openai(token=token)
        for name, spelled in (("sdk upper", ids["response"].upper()), ("sdk space", " " + ids["response"]),
                              ("sdk slash", ids["response"] + "/")):
            calls[(who, name, "retrieve")] = lambda s=sdk, i=spelled: outcome(lambda: s.responses.retrieve(i))
            calls[(who, name, "delete")] = lambda s=sdk, i=spelled: outcome(lambda: s.responses.delete(i))
        calls[(who, "sdk upper", "conversation")] = lambda s=sdk: outcome(lambda: s.conversations.retrieve(ids["conversation"].upper()))
        calls[(who, "sdk upper", "file")] = lambda s=sdk: outcome(lambda: s.files.delete(ids["file"].upper()))
    reached, _ = attack(provider, calls)
    assert reached == {}
    assert held_unchanged(provider, paths, items) == ({k: 200 for k in paths}, True)


# -- 2. another subject's or tenant's objects --------------------------------------------------

def test_another_subjects_or_tenants_objects_are_out_of_reach(gate, provider):
    owner = granted(gate)
    ids, paths = objects(gate, TENANT, owner)
    items = send(provider, "GET", f"{paths['conversation']}/items")[1]["data"]
    attackers = {"neighbour": (TENANT, granted(gate)), "globex, same subject name": (GLOBEX, granted(gate, GLOBEX, subject=owner)),
                 "globex": (GLOBEX, granted(gate, GLOBEX))}
    calls = {}
    for who, (tenant, subject) in attackers.items():
        token = gate.token("agent", subject, tenant=tenant)
        for method, path, body in object_requests(ids):
            calls[(who, method, path)] = lambda t=token, m=method, p=path, b=body: (lambda s, a: (s, code(a)))(*lethe(gate, t, m, p, b))
        for name, (method, path, body) in builds_on(ids).items():
            calls[(who, name)] = lambda t=token, m=method, p=path, b=body: (lambda s, a: (s, code(a)))(*lethe(gate, t, m, p, b))
        sdk = client(gate, tenant, subject)
        r, c, i, f = ids["response"], ids["conversation"], ids["item"], ids["file"]
        for name, call in {
            "retrieve response": lambda: sdk.responses.retrieve(r),
            "input items": lambda: sdk.responses.input_items.list(r),
            "delete response": lambda: sdk.responses.delete(r),
            "retrieve conversation": lambda: sdk.conversations.retrieve(c),
            "update conversation": lambda: sdk.conversations.update(c, metadata={"claimed": "yes"}),
            "list items": lambda: sdk.conversations.items.list(c),
            "add items": lambda: sdk.conversations.items.create(c, items=MESSAGE),
            "retrieve item": lambda: sdk.conversations.items.retrieve(i, conversation_id=c),
            "delete item": lambda: sdk.conversations.items.delete(i, conversation_id=c),
            "delete conversation": lambda: sdk.conversations.delete(c),
            "retrieve file": lambda: sdk.files.retrieve(f),
            "delete file": lambda: sdk.files.delete(f),
            "chain": lambda: sdk.responses.create(model="gpt-test", input="go on", previous_response_id=r),
            "answer into": lambda: sdk.responses.create(model="gpt-test", input="x", conversation=c),
        }.items():
            calls[(who, "sdk", name)] = lambda call=call: outcome(call)
    # A token naming the owner in X-Lethe-Subject: bound to another subject, or of another tenant.
    for who, token in (("neighbour naming the owner", gate.token("agent", attackers["neighbour"][1])),
                       ("globex service naming the owner", gate.token("agent", tenant=GLOBEX))):
        for method, path, body in object_requests(ids):
            calls[(who, method, path)] = lambda t=token, m=method, p=path, b=body: (
                lambda s, a: (s, code(a)))(*lethe(gate, t, m, p, b, **{"X-Lethe-Subject": owner}))
    reached, outcomes = attack(provider, calls)
    assert reached == {}
    # Refused as another's, not merely as unknown.
    assert {k: v for k, v in outcomes.items() if v != (403, "scope_violation")} == {}
    assert held_unchanged(provider, paths, items) == ({k: 200 for k in paths}, True)
    # Listings of files show nothing of the owner's.
    for who, (tenant, subject) in attackers.items():
        assert ids["file"] not in [x.id for x in client(gate, tenant, subject).files.list()], who


# -- 3. objects Lethe never recorded -----------------------------------------------------------

def test_objects_made_around_lethe_are_never_claimed(gate, provider, direct):
    owner = granted(gate)
    stray_response = direct.responses.create(model="gpt-test", input="made around Lethe").id
    stray_conversation = direct.conversations.create().id
    stray_item = direct.conversations.items.create(stray_conversation, items=MESSAGE).data[0].id
    stray_file = direct.files.create(file=("raw.jsonl", b'{"text": "raw"}\n'), purpose="user_data").id
    ids = {"response": stray_response, "conversation": stray_conversation, "item": stray_item, "file": stray_file}
    paths = {"response": f"/v1/responses/{stray_response}", "conversation": f"/v1/conversations/{stray_conversation}",
             "item": f"/v1/conversations/{stray_conversation}/items/{stray_item}", "file": f"/v1/files/{stray_file}"}
    items = send(provider, "GET", f"{paths['conversation']}/items")[1]["data"]
    token = gate.token("agent", owner)
    calls = {}
    for method, path, body in object_requests(ids):
        calls[(method, path)] = lambda m=method, p=path, b=body: (lambda s, a: (s, code(a)))(*lethe(gate, token, m, p, b))
    for name, (method, path, body) in builds_on(ids).items():
        calls[name] = lambda m=method, p=path, b=body: (lambda s, a: (s, code(a)))(*lethe(gate, token, m, p, b))
    sdk = client(gate, TENANT, owner)
    calls["sdk retrieve"] = lambda: outcome(lambda: sdk.responses.retrieve(stray_response))
    calls["sdk chain"] = lambda: outcome(lambda: sdk.responses.create(model="gpt-test", input="x", previous_response_id=stray_response))
    calls["sdk delete file"] = lambda: outcome(lambda: sdk.files.delete(stray_file))
    reached, outcomes = attack(provider, calls)
    assert reached == {}
    assert {k: v for k, v in outcomes.items() if v != (403, "unstamped_item")} == {}
    assert held_unchanged(provider, paths, items) == ({k: 200 for k in paths}, True)
    assert stray_file not in [x.id for x in sdk.files.list()]
    rows = subprocess.run(["psql", gate.state_url, "-qtAc",
                           "SELECT count(*) FROM items WHERE item_id IN ('%s')" % "','".join(ids.values())],
                          check=True, capture_output=True, text=True).stdout.strip()
    assert rows == "0"


# -- 4. an erased subject's objects ------------------------------------------------------------

def erase(gate, tenant, subject):
    """The provider store's result of the subject's completed erasure, and what its certificate
    says of that store."""
    done, results = gate.erase_to_completion(subject, tenant)
    status, document = gate.call("GET", f"/v1/erasures/{done['id']}/certificate",
                                 token=gate.token("compliance", tenant=tenant))
    assert status == 200, document
    certified = next(s for s in document["certificate"]["stores"] if s["target"] == "openai:openai")
    return results["openai:openai"], certified


def live_rows(gate, tenant, subject):
    return subprocess.run(["psql", gate.state_url, "-qtAc",
                           f"SELECT count(*) FROM items WHERE tenant = '{tenant}' AND subject = '{subject}' AND deleted_at IS NULL"],
                          check=True, capture_output=True, text=True).stdout.strip()


def test_an_erased_subjects_objects_are_gone_and_the_certificate_counts_them(gate, provider):
    gone = granted(gate)
    namesake = granted(gate, GLOBEX, subject=gone)   # the same subject key in another tenant
    kept = granted(gate)
    mine = client(gate, TENANT, gone)
    ids, paths = objects(gate, TENANT, gone)
    streamed = mine.responses.create(model="gpt-test", input="streamed secret", stream=True)
    streamed_id = next(e.response.id for e in streamed if e.type == "response.created")
    stored_chat = mine.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": "x"}], store=True).id
    paths.update({"streamed": f"/v1/responses/{streamed_id}", "chat": f"/v1/chat/completions/{stored_chat}"})
    theirs_ids, theirs_paths = objects(gate, GLOBEX, namesake)
    kept_ids, kept_paths = objects(gate, TENANT, kept)
    held = [p for p in paths.values() if at_provider(provider, p) == 200]
    assert len(held) == len(paths) == 6

    # The namesake in globex goes first: nothing of acme's subject is touched.
    result, certified = erase(gate, GLOBEX, namesake)
    assert (result["before"], result["deleted"], result["remaining"]) == (4, 4, 0), result
    assert (certified["before"], certified["deleted"], certified["remaining"]) == (4, 4, 0), certified
    assert all(at_provider(provider, p) == 404 for p in theirs_paths.values())
    assert [p for p in paths.values() if at_provider(provider, p) != 200] == []

    result, certified = erase(gate, TENANT, gone)
    left = [p for p in paths.values() if at_provider(provider, p) != 404]
    counts = (result["before"], result["deleted"], result["remaining"])
    assert (counts, left) == ((len(held), len(held), 0), []), result
    assert (certified["before"], certified["deleted"], certified["remaining"]) == counts, certified
    assert live_rows(gate, TENANT, gone) == "0"
    # Nothing of the subject is served, to the subject or to a service token naming it.
    service = openai.OpenAI(base_url=f"http://{gate.data}/openai/v1", api_key=gate.token("agent"), max_retries=0,
                            default_headers={**PURPOSE, "X-Lethe-Subject": gone})
    for sdk in (mine, service):
        assert outcome(lambda: sdk.responses.retrieve(ids["response"]))[0] == 403
        assert outcome(lambda: sdk.conversations.retrieve(ids["conversation"]))[0] == 403
        assert outcome(lambda: sdk.files.retrieve(ids["file"]))[0] == 403
        assert outcome(lambda: sdk.files.list())[0] == 403
        assert outcome(lambda: sdk.responses.create(model="gpt-test", input="x"))[0] == 403
    # The other subject of acme keeps everything.
    assert all(at_provider(provider, p) == 200 for p in kept_paths.values())
    assert client(gate, TENANT, kept).responses.retrieve(kept_ids["response"]).id == kept_ids["response"]
