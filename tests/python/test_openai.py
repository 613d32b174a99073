"""The OpenAI-compatible route, driven with the official `openai` SDK (base_url pointed at Lethe,
Lethe's token as the key, Lethe's headers through `default_headers`) against a local stand-in
built from OpenAI's published API contract."""

import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import openai
import pytest

from conftest import TENANT, certificates, http, own_lethe, wait_for


@pytest.fixture(scope="module")
def lethe_ai(chroma, provider, tmp_path_factory):
    erasure = ('[erasure]\nretry_backoff = "200ms"\nsettle = "100ms"\n'
               '[[erasure.backups]]\ntarget = "chroma:chroma"\nretention = "7d"\n')
    instance = own_lethe(chroma, tmp_path_factory.mktemp("openai"), erasure, openai_url=provider)
    yield instance
    instance.stop()


def subject():
    return f"ai-{uuid.uuid4().hex[:10]}"


def refused(call):
    """The status and Lethe's error code of a call the SDK raised for."""
    with pytest.raises(openai.APIStatusError) as e:
        call()
    return e.value.status_code, e.value.code


def chat(client, text, **kwargs):
    return client.chat.completions.create(model=kwargs.pop("model", "gpt-test"),
                                          messages=[{"role": "user", "content": text}], **kwargs)


def test_a_chat_completion_and_its_stream_pass_through_event_by_event(lethe_ai, provider):
    s = subject()
    lethe_ai.grant_provider(s)
    client = lethe_ai.openai(s)
    assert chat(client, "hello there").choices[0].message.content == "echo: hello there"
    chunks = list(chat(client, "one two three four", stream=True))
    direct = openai.OpenAI(base_url=f"{provider}/v1", api_key="sk-standin", max_retries=0)
    direct_chunks = list(chat(direct, "one two three four", stream=True))
    assert len(chunks) == len(direct_chunks) == 6
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "echo: one two three four "
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert [m.id for m in client.models.list()] == ["gpt-test"]
    # Processors are recorded in the lineage recorder's batches: waited for, not assumed.
    view = wait_for("the provider to be named as a processor",
                    lambda: (v := lethe_ai.call("GET", f"/v1/subjects/{TENANT}/{s}")[1])["processors"] and v, deadline=10)
    assert [p["processor"] for p in view["processors"]] == ["openai"]
    assert view["processors"][0]["first_at"] <= view["processors"][0]["last_at"]


def test_requests_without_consent_or_scope_are_refused_before_the_provider_sees_them(lethe_ai, provider):
    s, unconsented = subject(), subject()
    lethe_ai.grant_provider(s)
    before = http("GET", f"{provider}/_stats")[1]["requests"]
    assert refused(lambda: chat(lethe_ai.openai(unconsented), "hi")) == (403, "consent_required")
    assert refused(lambda: chat(lethe_ai.openai(s, purpose="marketing"), "hi")) == (403, "consent_required")
    assert refused(lambda: chat(lethe_ai.openai(token=lethe_ai.token("agent")), "hi")) == (422, "missing_scope")
    assert refused(lambda: lethe_ai.openai(s).fine_tuning.jobs.list()) == (404, "unknown_endpoint")
    assert refused(lambda: lethe_ai.openai(s).completions.create(model="m", prompt="x")) == (404, "unknown_endpoint")
    # A prompt beyond the body limit (10 MiB) is refused before it is read.
    assert refused(lambda: chat(lethe_ai.openai(s), "x" * (11 * 1024 * 1024))) == (413, "body_too_large")
    assert http("GET", f"{provider}/_stats")[1]["requests"] == before + 1, "only the /_stats call itself"
    # Nothing was sent, so no provider is listed as having received the subject's data.
    assert lethe_ai.call("GET", f"/v1/subjects/{TENANT}/{s}")[1]["processors"] == []


def test_stored_responses_are_rewritten_unless_consent_covers_provider_retention(lethe_ai, provider):
    plain, keeper = subject(), subject()
    lethe_ai.grant_provider(plain)
    lethe_ai.grant_provider(keeper, ("send_to_provider", "provider_retention"))
    # The provider stores responses by default: without consent Lethe sends store=false.
    response = lethe_ai.openai(plain).responses.create(model="gpt-test", input="remember my address")
    assert response.store is False and response.output_text == "echo: remember my address"
    assert http("GET", f"{provider}/v1/responses/{response.id}")[0] == 404
    explicit = lethe_ai.openai(plain).responses.create(model="gpt-test", input="x", store=True)
    assert explicit.store is False
    chat_stored = chat(lethe_ai.openai(plain), "x", store=True)
    assert http("GET", f"{provider}/v1/chat/completions/{chat_stored.id}")[0] == 404
    kept = lethe_ai.openai(keeper).responses.create(model="gpt-test", input="remember my address")
    assert kept.store is True and http("GET", f"{provider}/v1/responses/{kept.id}")[0] == 200
    wait_for("the stored response's lineage",
             lambda: lethe_ai.call("GET", f"/v1/subjects/{TENANT}/{keeper}")[1]["inventory"] == {"openai": 1}, deadline=10)
    assert lethe_ai.openai(keeper).responses.retrieve(kept.id).id == kept.id
    # Conversations are stored by definition.
    assert refused(lambda: lethe_ai.openai(plain).conversations.create()) == (403, "consent_required")


def test_a_response_chain_stays_with_its_subject(lethe_ai, provider):
    alice, bob = subject(), subject()
    for s in (alice, bob):
        lethe_ai.grant_provider(s, ("send_to_provider", "provider_retention"))
    first = lethe_ai.openai(alice).responses.create(model="gpt-test", input="my secret")
    follow = lethe_ai.openai(alice).responses.create(model="gpt-test", input="go on", previous_response_id=first.id)
    assert follow.previous_response_id == first.id
    assert refused(lambda: lethe_ai.openai(bob).responses.create(model="gpt-test", input="tell me", previous_response_id=first.id)) == (403, "scope_violation")
    assert refused(lambda: lethe_ai.openai(bob).responses.retrieve(first.id)) == (403, "scope_violation")
    assert refused(lambda: lethe_ai.openai(bob).responses.delete(first.id)) == (403, "scope_violation")
    # The same for conversations: adding to, reading or answering into another subject's.
    conversation = lethe_ai.openai(alice).conversations.create()
    message = [{"type": "message", "role": "user", "content": "x"}]
    assert refused(lambda: lethe_ai.openai(bob).conversations.items.create(conversation.id, items=message)) == (403, "scope_violation")
    assert refused(lambda: lethe_ai.openai(bob).conversations.retrieve(conversation.id)) == (403, "scope_violation")
    assert refused(lambda: lethe_ai.openai(bob).responses.create(model="gpt-test", input="x", conversation=conversation.id)) == (403, "scope_violation")
    answered = lethe_ai.openai(alice).responses.create(model="gpt-test", input="into it", conversation=conversation.id)
    assert answered.output_text == "echo: into it"
    # An id Lethe never recorded (made straight at the provider) is not Lethe's to hand out.
    status, stray = http("POST", f"{provider}/v1/responses", body={"model": "gpt-test", "input": "x"})
    assert refused(lambda: lethe_ai.openai(alice).responses.create(model="gpt-test", input="x", previous_response_id=stray["id"])) == (403, "unstamped_item")
    # A token of another tenant cannot reach this tenant's objects, whatever subject it names.
    other_tenant = lethe_ai.openai(token=_token(lethe_ai, "globex", alice))
    assert refused(lambda: other_tenant.responses.retrieve(first.id)) == (403, "scope_violation")


def _token(instance, tenant, s):
    import subprocess
    from conftest import LETHE
    out = subprocess.run([str(LETHE), "token", "--role", "agent", "--tenant", tenant, "--subject", s],
                         cwd=instance.workdir, env=instance.env, check=True, capture_output=True, text=True)
    return out.stdout.strip()


def stopped_mid_stream(lethe_ai, provider, client, act):
    """A 40-event stream of `client`, with `act()` done after its third event: the `error`
    event's code that ended it, once the provider's request was dropped."""
    cancelled = http("GET", f"{provider}/_stats")[1]["cancelled_streams"]
    stream = chat(client, "x", model="slow-stream", stream=True)
    received = 0
    with pytest.raises(openai.APIError) as e:
        for _ in stream:
            received += 1
            if received == 3:
                act()
    assert 3 <= received < 41
    wait_for("the provider's stream to be dropped",
             lambda: http("GET", f"{provider}/_stats")[1]["cancelled_streams"] > cancelled, deadline=10)
    return e.value.code


def test_a_stream_in_flight_is_stopped_when_its_subject_is_suppressed(lethe_ai, provider):
    """Decided: a stream about a subject that gets suppressed stops at the next event with an
    `error` event `subject_suppressed` (the SDK raises it); the provider's request is dropped."""
    s = subject()
    lethe_ai.grant_provider(s)

    def erase():
        status, filed = lethe_ai.call("POST", "/v1/erasures", {"subject": s, "ticket": "DSR-S", "reason": "art. 17"})
        assert status == 201, filed
        assert lethe_ai.call("POST", f"/v1/erasures/{filed['id']}/approve")[0] == 200
    assert stopped_mid_stream(lethe_ai, provider, lethe_ai.openai(s), erase) == "subject_suppressed"
    assert refused(lambda: chat(lethe_ai.openai(s), "again")) == (403, "subject_suppressed")


def test_a_stream_in_flight_is_stopped_when_its_callers_token_is_revoked(lethe_ai, provider):
    """Each event is sent only while the caller's token holds: revoked mid-stream, the stream
    ends at the next event with an `error` event `unauthenticated`."""
    from test_attack_redis import claims_of
    s = subject()
    lethe_ai.grant_provider(s)
    token = lethe_ai.token("agent", s)

    def revoke():
        status, body = lethe_ai.call("POST", "/v1/tokens/revoke", {"jti": claims_of(token)["jti"]},
                                     token=lethe_ai.token("admin"))
        assert status == 200, body
    assert stopped_mid_stream(lethe_ai, provider, lethe_ai.openai(s, token=token), revoke) == "unauthenticated"
    assert refused(lambda: chat(lethe_ai.openai(s, token=token), "again"))[0] == 401


def test_a_stream_in_flight_is_stopped_when_the_subjects_consent_is_withdrawn(lethe_ai, provider):
    """The consent a stream was decided on must hold for each event: withdrawn mid-stream, the
    stream ends at the next event with an `error` event `consent_required`."""
    s = subject()
    grant = lethe_ai.grant_provider(s)

    def withdraw():
        status, body = lethe_ai.call("POST", f"/v1/consents/{grant}/revoke")
        assert status == 200, body
    assert stopped_mid_stream(lethe_ai, provider, lethe_ai.openai(s), withdraw) == "consent_required"
    assert refused(lambda: chat(lethe_ai.openai(s), "again")) == (403, "consent_required")


@pytest.mark.parametrize("act,store", [("erase", False), ("erase", True), ("withdraw", False), ("withdraw", True),
                                       ("revoke", False)])
def test_an_answer_sent_whole_is_decided_when_the_provider_gives_it(lethe_ai, provider, act, store):
    """A chat completion the provider takes a second over is answered only if, when the answer
    comes, its subject is still active, her consent still holds and the caller's token too;
    refused, a completion the provider stored (her consent covering provider retention) is
    deleted there again."""
    from concurrent.futures import ThreadPoolExecutor

    from test_attack_redis import claims_of
    s, other = subject(), subject()
    grants = {who: lethe_ai.grant_provider(who, ("send_to_provider", "provider_retention")) for who in (s, other)}
    token = lethe_ai.token("agent", s)
    stats = lambda: http("GET", f"{provider}/_stats")[1]  # noqa: E731

    def erase():
        status, filed = lethe_ai.call("POST", "/v1/erasures", {"subject": s, "ticket": "DSR-W", "reason": "art. 17"})
        assert status == 201, filed
        return lethe_ai.call("POST", f"/v1/erasures/{filed['id']}/approve")
    acts = {
        "erase": (erase, (403, "subject_suppressed")),
        "withdraw": (lambda: lethe_ai.call("POST", f"/v1/consents/{grants[s]}/revoke"), (403, "consent_required")),
        "revoke": (lambda: lethe_ai.call("POST", "/v1/tokens/revoke", {"jti": claims_of(token)["jti"]},
                                         token=lethe_ai.token("admin")), (401, "unauthenticated")),
    }
    # Left alone, the same request is answered (and its completion kept when stored).
    kept = chat(lethe_ai.openai(other), "mine", model="slow", store=store)
    assert kept.choices[0].message.content == "echo: mine"
    assert http("GET", f"{provider}/v1/chat/completions/{kept.id}")[0] == (200 if store else 404)
    act, expected = acts[act]
    before = stats()
    with ThreadPoolExecutor(1) as pool:
        late = pool.submit(lambda: refused(lambda: chat(lethe_ai.openai(s, token=token), "late", model="slow",
                                                        store=store)))
        wait_for("the provider to have the request", lambda: stats()["requests"] > before["requests"], deadline=5)
        assert act()[0] == 200
        assert late.result(timeout=10) == expected
    # What the provider stored for the refused answer was deleted there again.
    assert stats()["chats"] == before["chats"]


def test_a_client_that_goes_away_cancels_the_provider_request(lethe_ai, provider):
    s = subject()
    lethe_ai.grant_provider(s)
    cancelled = http("GET", f"{provider}/_stats")[1]["cancelled_streams"]
    stream = chat(lethe_ai.openai(s), "x", model="slow-stream", stream=True)
    for n, _ in enumerate(stream):
        if n == 2:
            break
    stream.close()
    wait_for("the provider's stream to be dropped",
             lambda: http("GET", f"{provider}/_stats")[1]["cancelled_streams"] > cancelled, deadline=10)


def test_provider_failures_are_clear(lethe_ai):
    s = subject()
    lethe_ai.grant_provider(s)
    client = lethe_ai.openai(s)
    with pytest.raises(openai.APIError) as e:
        list(chat(client, "x", model="broken-sse", stream=True))
    assert e.value.code == "upstream_invalid"
    assert refused(lambda: chat(client, "x", model="error-500")) == (502, "upstream_unavailable")
    started = time.monotonic()
    assert refused(lambda: chat(client, "x", model="hang")) == (502, "upstream_unavailable")
    assert time.monotonic() - started < 4, "the route's 2 s timeout, not the provider's 5 s"


def test_embeddings_are_recorded_by_fingerprint_and_uploads_need_their_consent(lethe_ai):
    s, trainer = subject(), subject()
    lethe_ai.grant_provider(s, ("send_to_provider", "provider_retention"))
    lethe_ai.grant_provider(trainer, ("send_to_provider", "provider_retention", "train"))
    vectors = lethe_ai.openai(s).embeddings.create(model="emb-test", input=["likes tea", "lives in Lyon"])
    assert len(vectors.data) == 2
    # Lineage is written a moment after the answer, in batches.
    wait_for("the embeddings' lineage",
             lambda: lethe_ai.call("GET", f"/v1/subjects/{TENANT}/{s}")[1]["inventory"] == {"openai": 2}, deadline=10)
    upload = lambda who, purpose: lethe_ai.openai(who).files.create(file=("data.jsonl", b'{"text": "x"}\n'), purpose=purpose)
    assert refused(lambda: upload(s, "fine-tune")) == (403, "consent_required")
    assert upload(trainer, "fine-tune").purpose == "fine-tune"
    mine = upload(s, "user_data")
    assert [f.id for f in lethe_ai.openai(s).files.list()] == [mine.id], "only the subject's own files are listed"


def test_an_erasure_deletes_the_subjects_provider_objects_and_certifies_the_window(lethe_ai, provider):
    s, other = subject(), subject()
    for who in (s, other):
        lethe_ai.grant_provider(who, ("send_to_provider", "provider_retention"))
    client = lethe_ai.openai(s)
    responses = [client.responses.create(model="gpt-test", input=f"fact {i}").id for i in range(2)]
    streamed = client.responses.create(model="gpt-test", input="streamed fact", stream=True)
    streamed_id = next(e.response.id for e in streamed if e.type == "response.created")
    conversation = client.conversations.create(metadata={"topic": "x"})
    items = client.conversations.items.create(conversation.id, items=[{"type": "message", "role": "user", "content": "my address"}])
    file = client.files.create(file=("notes.jsonl", b'{"text": "x"}\n'), purpose="user_data")
    kept = lethe_ai.openai(other).responses.create(model="gpt-test", input="other's fact").id
    paths = ([f"/v1/responses/{r}" for r in responses + [streamed_id]] + [f"/v1/conversations/{conversation.id}",
             f"/v1/conversations/{conversation.id}/items/{items.data[0].id}", f"/v1/files/{file.id}"])
    assert all(http("GET", provider + p)[0] == 200 for p in paths)

    assert lethe_ai.dry_run(s)["openai:openai"] == 6, "the dry run asks the provider for each object"
    status, filed = lethe_ai.call("POST", "/v1/erasures", {"subject": s, "ticket": "DSR-AI", "reason": "art. 17"})
    assert lethe_ai.call("POST", f"/v1/erasures/{filed['id']}/approve")[0] == 200
    done = wait_for("the erasure to complete",
                    lambda: (r := lethe_ai.call("GET", f"/v1/erasures/{filed['id']}")[1])["state"] == "completed" and r,
                    deadline=30)
    target = next(t for t in done["targets"] if t["target"] == "openai:openai")
    assert target["result"]["before"] == 6 and target["result"]["remaining"] == 0, target
    assert all(http("GET", provider + p)[0] == 404 for p in paths)
    assert http("GET", f"{provider}/v1/responses/{kept}")[0] == 200
    status, document = lethe_ai.call("GET", f"/v1/erasures/{filed['id']}/certificate")
    assert status == 200
    certificate = document["certificate"]
    store = next(x for x in certificate["stores"] if x["target"] == "openai:openai")
    assert store["backup_retention"] == "30d", store
    # The provider's copies outlast the 7 days of Chroma's backups: they set the final expiry.
    assert certificate["final_backup_expiry"] == store["backup_expires_at"]
    provider_copies = store["physical"]["remaining"]
    assert [c["until"] is not None for c in provider_copies] == [True], "the provider's copies are dated"
    assert provider_copies[0]["until"] >= certificate["completed_at"]
    # Only Chroma's copies, which Chroma gives no date for, are exceptions; then no final copy
    # expiry can be claimed.
    assert certificate["exceptions"] and all(e.startswith("chroma:chroma: ") and "with no date" in e
                                             for e in certificate["exceptions"]), certificate["exceptions"]
    assert certificate["final_copy_expiry"] is None


def test_a_provider_behind_tls_is_reached_only_when_its_certificate_verifies(chroma, tmp_path):
    import ssl
    import sys
    from conftest import free_port
    ca, cert, key = certificates(tmp_path)
    port = free_port()
    standin = subprocess.Popen([sys.executable, str(Path(__file__).parent / "openai_standin.py"), str(port), str(cert), str(key)])
    trusted = ssl.create_default_context(cafile=str(ca))
    wait_for("the TLS stand-in", lambda: urllib.request.urlopen(f"https://127.0.0.1:{port}/v1/models", context=trusted).status == 200)
    provider = f"https://127.0.0.1:{port}"
    for folder in ("trusting", "doubting"):
        (tmp_path / folder).mkdir()
    trusting = own_lethe(chroma, tmp_path / "trusting", f'[data_plane]\nupstream_ca = {{ file = "{ca}" }}\n', openai_url=provider)
    doubting = own_lethe(chroma, tmp_path / "doubting", "", openai_url=provider)
    try:
        for instance in (trusting, doubting):
            instance.grant_provider("tls-user")
        assert chat(trusting.openai("tls-user"), "over TLS").choices[0].message.content == "echo: over TLS"
        streamed = "".join(c.choices[0].delta.content or "" for c in chat(trusting.openai("tls-user"), "a b", stream=True))
        assert streamed == "echo: a b "
        # A certificate no trusted CA signed: refused, nothing sent in the clear instead.
        assert refused(lambda: chat(doubting.openai("tls-user"), "x")) == (502, "upstream_unavailable")
    finally:
        trusting.stop()
        doubting.stop()
        standin.terminate()
        standin.wait(timeout=10)
