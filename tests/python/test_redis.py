"""The Redis route, driven with the official `redis` client and LangChain's
`RedisChatMessageHistory`, against a real Redis (127.0.0.1:6379): every outcome is counted
straight in Redis, around Lethe."""

import subprocess
import time

import pytest
import redis
from langchain_community.chat_message_histories import RedisChatMessageHistory
from langchain_core.messages import AIMessage, HumanMessage

from conftest import GLOBEX, TENANT, certificates, free_port, own_lethe, someone, wait_for

REDIS = "redis://127.0.0.1:6379"
RETENTION_MS = 30 * 24 * 3600 * 1000
SLACK_MS = 60 * 1000


@pytest.fixture(scope="module")
def direct():
    """Redis itself, around Lethe."""
    return redis.Redis(host="127.0.0.1", port=6379, decode_responses=True)


@pytest.fixture(scope="module")
def lethe(chroma, tmp_path_factory):
    instance = own_lethe(chroma, tmp_path_factory.mktemp("lethe-redis"), '[erasure]\nsweep_interval = "200ms"\n',
                         redis_url=REDIS)
    rules = {"rules": [{"purpose": "support", "category": "conversation", "max_age": "30d"}]}
    for tenant in (TENANT, GLOBEX):
        token = instance.dpo if tenant == TENANT else instance.token("compliance", tenant=tenant)
        status, body = instance.call("PUT", "/v1/retention-rules", rules, token=token)
        assert status == 200, body
    yield instance
    instance.stop()


def consent(lethe, subject, actions=("store", "retrieve"), tenant=TENANT):
    dpo = lethe.dpo if tenant == TENANT else lethe.token("compliance", tenant=tenant)
    status, grant = lethe.call("POST", "/v1/consents", {
        "tenant": tenant, "subject": subject, "purpose": "support", "category": "conversation",
        "actions": list(actions), "source": "pytest", "policy_version": 1,
    }, token=dpo)
    assert status == 201, grant
    return grant["id"]


def client(lethe, token, protocol=None):
    """`redis-py` pointed at the route, the Lethe token as its password (RESP3, redis-py 8's
    default, unless `protocol=2`)."""
    host, port = lethe.listens["redis"].split(":")
    return redis.Redis(host=host, port=int(port), username="agent", password=token, decode_responses=True,
                       protocol=protocol)


def agent(lethe, subject=None, tenant=TENANT, protocol=None):
    return client(lethe, lethe.token("agent", subject, tenant=tenant), protocol)


def refused(code, call, what=""):
    """`call` is refused with Lethe's stable `code`, as redis-py raises a refusal."""
    with pytest.raises(redis.exceptions.ResponseError, match=f"lethe:{code}"):
        call()
        pytest.fail(f"not refused: {what}")


def test_writes_carry_the_deadline_lethe_computes_and_no_later_one(lethe, direct):
    alice = someone()
    consent(lethe, alice)
    r = agent(lethe, alice)
    key = f"{TENANT}:{alice}:session"
    assert r.set(key, "hello") is True
    pttl = direct.pttl(key)
    assert 0 < pttl <= RETENTION_MS and pttl > RETENTION_MS - SLACK_MS, pttl
    assert r.get(key) == "hello"

    # A client asking for ten years gets the deadline; one asking for less keeps its own.
    r.set(key, "again", ex=10 * 365 * 24 * 3600)
    assert direct.pttl(key) <= RETENTION_MS
    r.set(f"{key}:short", "brief", px=60_000)
    assert 0 < direct.pttl(f"{key}:short") <= 60_000
    r.set(f"{key}:short", "plain")
    assert 0 < direct.pttl(f"{key}:short") <= 60_000, "a plain SET keeps the earlier deadline its key holds"
    # An EXPIRE that would outlive the deadline, and a PERSIST, are clamped to it.
    r.expire(key, 10 * 365 * 24 * 3600)
    assert direct.pttl(key) <= RETENTION_MS
    r.persist(key)
    assert 0 < direct.pttl(key) <= RETENTION_MS
    # A rewrite does not move the deadline later than the first write's.
    first = direct.pexpiretime(key)
    time.sleep(0.01)
    r.set(key, "later")
    assert direct.pexpiretime(key) <= first
    # Lists, hashes and sets written through Lethe carry it too.
    r.rpush(f"{key}:list", "a", "b")
    r.hset(f"{key}:hash", mapping={"f": "v"})
    r.sadd(f"{key}:set", "m")
    for k in (f"{key}:list", f"{key}:hash", f"{key}:set"):
        assert 0 < direct.pttl(k) <= RETENTION_MS, k
    assert r.lrange(f"{key}:list", 0, -1) == ["a", "b"] and r.hgetall(f"{key}:hash") == {"f": "v"}


def test_without_consent_nothing_is_written(lethe, direct):
    carol = someone()
    r = agent(lethe, carol)
    key = f"{TENANT}:{carol}:session"
    refused("consent_required", lambda: r.set(key, "x"))
    refused("consent_required", lambda: r.rpush(key, "x"))
    assert direct.exists(key) == 0


def test_another_tenants_and_another_subjects_keys_are_never_touched(lethe, direct):
    alice, bob = someone(), someone()
    consent(lethe, alice)
    consent(lethe, bob)
    consent(lethe, bob, tenant=GLOBEX)
    bobs = f"{TENANT}:{bob}:notes"
    direct.set(bobs, "bob's", px=RETENTION_MS)
    theirs = f"{GLOBEX}:{bob}:notes"
    direct.set(theirs, "globex's", px=RETENTION_MS)
    r = agent(lethe, alice)
    for call in (
        lambda: r.get(bobs), lambda: r.set(bobs, "mine"), lambda: r.delete(bobs),
        lambda: r.expire(bobs, 1), lambda: r.rpush(bobs, "x"), lambda: r.hgetall(bobs),
        lambda: r.mget(f"{TENANT}:{alice}:a", bobs), lambda: r.rename(f"{TENANT}:{alice}:a", bobs),
        lambda: r.copy(f"{TENANT}:{alice}:a", bobs),
    ):
        refused("scope_violation", call)
    other = agent(lethe, bob, tenant=GLOBEX)
    unbound = agent(lethe, tenant=GLOBEX)
    for r2 in (other, unbound):
        refused("scope_violation", lambda: r2.get(bobs))
        refused("scope_violation", lambda: r2.set(bobs, "taken"))
        refused("scope_violation", lambda: r2.unlink(bobs))
    refused("unknown_endpoint", lambda: r.set("no-pattern-key", "x"))
    assert direct.get(bobs) == "bob's" and direct.get(theirs) == "globex's"
    assert direct.exists("no-pattern-key") == 0


def test_what_reaches_beyond_one_subject_is_refused_outright(lethe, direct):
    alice = someone()
    consent(lethe, alice)
    key = f"{TENANT}:{alice}:kept"
    r = agent(lethe, alice)
    r.set(key, "v")
    admin = client(lethe, lethe.token("admin"))
    for call in (
        lambda: r.keys("*"), lambda: r.flushall(), lambda: r.flushdb(),
        lambda: r.eval("return redis.call('GET', KEYS[1])", 1, key),
        lambda: r.config_get("*"), lambda: r.dbsize(), lambda: r.randomkey(),
        lambda: r.dump(key), lambda: r.object("encoding", key), lambda: admin.flushall(),
        lambda: r.client_list(), lambda: r.info(), lambda: r.time(), lambda: admin.config_get("*"),
        lambda: admin.slowlog_get(), lambda: admin.execute_command("MEMORY", "USAGE", key),
        lambda: admin.client_list(), lambda: admin.keys("*"), lambda: admin.eval("return 1", 0),
    ):
        refused("forbidden", call)
    refused("unknown_endpoint", lambda: r.execute_command("FROBNICATE", key))
    assert direct.get(key) == "v"
    # The harmless server commands serve admin tokens: they read no key and answer no stored data.
    assert admin.dbsize() == direct.dbsize() and admin.info("server")["redis_version"] == direct.info("server")["redis_version"]
    assert abs(admin.time()[0] - direct.time()[0]) <= 1 and admin.lastsave() is not None
    assert admin.command_count() > 100
    assert "peak.allocated" in admin.memory_stats()


def test_a_transaction_with_one_refused_command_writes_nothing(lethe, direct):
    alice, bob = someone(), someone()
    consent(lethe, alice)
    r = agent(lethe, alice)
    mine, bobs = f"{TENANT}:{alice}:tx", f"{TENANT}:{bob}:tx"
    pipe = r.pipeline(transaction=True)
    pipe.set(mine, "1")
    pipe.set(bobs, "2")
    with pytest.raises(redis.exceptions.ResponseError):
        pipe.execute()
    assert direct.exists(mine, bobs) == 0
    # A clean one runs whole, each command with its answer, the deadline on what it wrote.
    pipe = r.pipeline(transaction=True)
    pipe.set(mine, "1").incr(mine).get(mine)
    assert pipe.execute() == [True, 2, "2"]
    assert 0 < direct.pttl(mine) <= RETENTION_MS
    # Pipelined without a transaction: each command gets its own answer.
    pipe = r.pipeline(transaction=False)
    pipe.get(mine).get(bobs).set(f"{mine}:p", "x")
    answers = pipe.execute(raise_on_error=False)
    assert answers[0] == "2" and "lethe:scope_violation" in str(answers[1]) and answers[2] is True


def test_scan_answers_the_callers_keys_only(lethe, direct):
    alice, bob = someone(), someone()
    consent(lethe, alice)
    consent(lethe, bob)
    for subject in (alice, bob):
        agent(lethe, subject).set(f"{TENANT}:{subject}:s", "v")
    direct.set(f"{GLOBEX}:{alice}:s", "theirs", px=RETENTION_MS)
    direct.set("unowned-key", "x", px=RETENTION_MS)
    seen_unbound = set(agent(lethe).scan_iter(count=1000))
    assert {f"{TENANT}:{alice}:s", f"{TENANT}:{bob}:s"} <= seen_unbound
    assert not any(k.startswith(f"{GLOBEX}:") or k == "unowned-key" for k in seen_unbound)
    seen_alice = set(agent(lethe, alice).scan_iter(count=1000))
    assert f"{TENANT}:{alice}:s" in seen_alice and not any(bob in k for k in seen_alice)


def test_the_flip_hides_a_subject_at_once_and_completion_leaves_none_of_its_keys(lethe, direct):
    alice, bob = someone(), someone()
    consent(lethe, alice)
    consent(lethe, bob)
    for subject in (alice, bob):
        r = agent(lethe, subject)
        r.set(f"{TENANT}:{subject}:a", "1")
        r.rpush(f"{TENANT}:{subject}:b", "x", "y")
    reader = agent(lethe)
    assert reader.get(f"{TENANT}:{alice}:a") == "1"

    lethe.flip(alice)
    # Still in Redis, read as missing at once; writes refused.
    assert direct.get(f"{TENANT}:{alice}:a") == "1"
    assert reader.get(f"{TENANT}:{alice}:a") is None
    assert reader.lrange(f"{TENANT}:{alice}:b", 0, -1) == []
    assert reader.exists(f"{TENANT}:{alice}:a", f"{TENANT}:{bob}:a") == 1
    assert reader.mget(f"{TENANT}:{alice}:a", f"{TENANT}:{bob}:a") == [None, "1"]
    assert reader.ttl(f"{TENANT}:{alice}:a") == -2 and reader.type(f"{TENANT}:{alice}:b") == "none"
    assert not any(alice in k for k in reader.scan_iter(count=1000))
    refused("subject_suppressed", lambda: agent(lethe, alice).set(f"{TENANT}:{alice}:c", "late"))
    assert direct.exists(f"{TENANT}:{alice}:c") == 0

    wait_for("the purge", lambda: direct.exists(f"{TENANT}:{alice}:a", f"{TENANT}:{alice}:b") == 0)
    assert direct.get(f"{TENANT}:{bob}:a") == "1" and direct.lrange(f"{TENANT}:{bob}:b", 0, -1) == ["x", "y"]


def test_langchains_redis_chat_history_works_through_lethe_and_is_erased(lethe, direct):
    alice, bob = someone(), someone()
    consent(lethe, alice)
    consent(lethe, bob)
    host, port = lethe.listens["redis"].split(":")
    histories = {}
    for subject in (alice, bob):
        url = f"redis://agent:{lethe.token('agent', subject)}@{host}:{port}/0"
        history = RedisChatMessageHistory(session_id=subject, url=url, key_prefix=f"message_store:{TENANT}:")
        history.add_message(HumanMessage(content=f"hello from {subject}"))
        history.add_message(AIMessage(content="hello"))
        histories[subject] = history
    for subject, history in histories.items():
        assert [m.content for m in history.messages] == [f"hello from {subject}", "hello"]
        key = f"message_store:{TENANT}:{subject}"
        assert direct.llen(key) == 2 and 0 < direct.pttl(key) <= RETENTION_MS

    # Consent missing: the history cannot be kept.
    carol = someone()
    url = f"redis://agent:{lethe.token('agent', carol)}@{host}:{port}/0"
    with pytest.raises(redis.exceptions.ResponseError):
        RedisChatMessageHistory(session_id=carol, url=url, key_prefix=f"message_store:{TENANT}:").add_message(
            HumanMessage(content="not kept"))
    assert direct.exists(f"message_store:{TENANT}:{carol}") == 0

    done, results = lethe.erase_to_completion(alice)
    assert done["state"] == "completed"
    assert direct.exists(f"message_store:{TENANT}:{alice}") == 0
    assert direct.llen(f"message_store:{TENANT}:{bob}") == 2
    assert results["redis:redis"]["remaining"] == 0 and results["redis:redis"]["deleted"] >= 1


@pytest.mark.parametrize("protocol", [2, 3])
def test_both_protocols_get_redis_own_answers_and_a_hidden_subjects_keys_read_as_missing(lethe, direct, protocol):
    alice, bob = someone(), someone()
    consent(lethe, alice)
    consent(lethe, bob)
    for subject in (alice, bob):
        r = agent(lethe, subject, protocol=protocol)
        r.hset(f"{TENANT}:{subject}:h", mapping={"a": "1", "b": "2"})
        r.sadd(f"{TENANT}:{subject}:s", "x", "y")
        r.zadd(f"{TENANT}:{subject}:z", {"m": 1.5})
    reader = agent(lethe, protocol=protocol)
    assert reader.hgetall(f"{TENANT}:{alice}:h") == {"a": "1", "b": "2"}
    assert reader.smembers(f"{TENANT}:{alice}:s") == {"x", "y"}
    assert reader.zscore(f"{TENANT}:{alice}:z", "m") == 1.5
    assert reader.hmget(f"{TENANT}:{alice}:h", ["a", "c"]) == ["1", None]
    lethe.flip(alice)
    assert reader.hgetall(f"{TENANT}:{alice}:h") == {}
    assert reader.smembers(f"{TENANT}:{alice}:s") == set()
    assert reader.srandmember(f"{TENANT}:{alice}:s", 2) == [] and reader.srandmember(f"{TENANT}:{alice}:s") is None
    assert reader.zscore(f"{TENANT}:{alice}:z", "m") is None
    assert reader.hmget(f"{TENANT}:{alice}:h", ["a", "c"]) == [None, None]
    assert reader.hgetall(f"{TENANT}:{bob}:h") == {"a": "1", "b": "2"}
    assert direct.hgetall(f"{TENANT}:{alice}:h") == {"a": "1", "b": "2"}, "still in Redis until the purge"


def test_keys_are_in_lineage_and_a_revoked_consents_keys_are_unlinked_by_the_sweeper(lethe, direct):
    alice, bob = someone(), someone()
    grant = consent(lethe, alice)
    consent(lethe, bob)
    for subject in (alice, bob):
        r = agent(lethe, subject)
        r.set(f"{TENANT}:{subject}:a", "1")
        r.rpush(f"{TENANT}:{subject}:b", "x")
    inventory = lambda s: lethe.call("GET", f"/v1/subjects/{TENANT}/{s}")[1].get("inventory", {}).get("redis", 0)
    wait_for("the keys in lineage", lambda: inventory(alice) == 2 and inventory(bob) == 2)
    # A write that wrote nothing claims nothing: once a later real write is in (rows land in
    # order), lineage holds that one only.
    r = agent(lethe, bob)
    assert r.rpushx(f"{TENANT}:{bob}:none", "x") == 0 and r.expire(f"{TENANT}:{bob}:none2", 100) is False
    r.set(f"{TENANT}:{bob}:c", "1")
    wait_for("the later write in lineage", lambda: inventory(bob) >= 3)
    assert inventory(bob) == 3
    r.delete(f"{TENANT}:{bob}:b")
    wait_for("the deleted key out of the inventory", lambda: inventory(bob) == 2)
    assert lethe.dry_run(alice)["redis:redis"] == 2

    lethe.revoke(grant)
    assert agent(lethe).get(f"{TENANT}:{alice}:a") is None, "no retrieve consent: read as missing at once"
    wait_for("the sweeper", lambda: direct.exists(f"{TENANT}:{alice}:a", f"{TENANT}:{alice}:b") == 0)
    assert direct.get(f"{TENANT}:{bob}:a") == "1"
    wait_for("the swept keys out of the inventory", lambda: inventory(alice) == 0)

    # A key written again with the stamp it holds is one row, not one per write; a key that
    # came back after its row was marked deleted (by the sweeper here, behind the route's back;
    # by DEL through the route) is recorded again.
    for _ in range(3):
        r.set(f"{TENANT}:{bob}:c", "2")
    r.rpush(f"{TENANT}:{bob}:b", "again")
    wait_for("the key written again in lineage", lambda: inventory(bob) == 3)
    consent(lethe, alice)
    agent(lethe, alice).set(f"{TENANT}:{alice}:a", "back")
    wait_for("the swept key written again in lineage", lambda: inventory(alice) == 1)
    assert lethe.dry_run(alice)["redis:redis"] == 1


def calls(direct, command):
    """How many times Redis ran `command` (its own count, INFO commandstats)."""
    return direct.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0)


def test_a_plain_set_is_one_round_trip_and_a_user_without_scripting_gets_the_same_deadlines(
        lethe, direct, chroma, tmp_path):
    alice = someone()
    consent(lethe, alice)
    r = agent(lethe, alice)
    r.get(f"{TENANT}:{alice}:one")  # the route connects to Redis (and finds it runs scripts)
    # Lethe's own script reads the deadline the key holds and writes, at once (Redis counts
    # the commands a script runs too).
    counts = lambda: [calls(direct, c) for c in ("evalsha", "pexpiretime", "set")]  # noqa: E731
    before = counts()
    r.set(f"{TENANT}:{alice}:one", "v")
    assert counts() == [before[0] + 1, before[1] + 1, before[2] + 1]
    # Redis forgetting the script (SCRIPT FLUSH, a failover) costs the client nothing: the SET
    # is sent again with the script itself.
    direct.script_flush()
    evals = calls(direct, "eval")
    assert r.set(f"{TENANT}:{alice}:one", "after the flush") is True
    assert calls(direct, "eval") == evals + 1 and direct.get(f"{TENANT}:{alice}:one") == "after the flush"
    assert 0 < direct.pttl(f"{TENANT}:{alice}:one") <= RETENTION_MS
    before = counts()
    r.set(f"{TENANT}:{alice}:one", "v")
    assert counts()[0] == before[0] + 1, "loaded again: the digest serves"
    # A chat history's push, a hash and a set are one round trip too, with Redis' own answers.
    before = counts()
    assert r.rpush(f"{TENANT}:{alice}:list", "a", "b") == 2 and r.lpush(f"{TENANT}:{alice}:list", "c") == 3
    assert r.hset(f"{TENANT}:{alice}:hash", mapping={"f": "v", "g": "w"}) == 2
    assert r.sadd(f"{TENANT}:{alice}:set", "m") == 1 and r.sadd(f"{TENANT}:{alice}:set", "m") == 0
    assert counts() == [before[0] + 5, before[1] + 5, before[2]]
    for key in ("list", "hash", "set"):
        assert 0 < direct.pttl(f"{TENANT}:{alice}:{key}") <= RETENTION_MS, key
    assert r.lrange(f"{TENANT}:{alice}:list", 0, -1) == ["c", "a", "b"]
    # Redis' own refusals pass as Redis words them, and write nothing.
    with pytest.raises(redis.exceptions.ResponseError, match="^WRONGTYPE Operation against a key holding the wrong kind of value$"):
        r.lpush(f"{TENANT}:{alice}:one", "x")
    assert direct.get(f"{TENANT}:{alice}:one") == "v"
    assert 0 < direct.pttl(f"{TENANT}:{alice}:one") <= RETENTION_MS

    # A route whose Redis user may not run scripts reads the deadline first, to the same effect.
    user = f"lethe-noscripts-{alice}"
    direct.acl_setuser(user, enabled=True, passwords=["+no-scripts"], keys=["*"], channels=["*"],
                       commands=["+@all", "-@scripting"])
    credential = f'credential = {{ header = "{user}", value = {{ value = "no-scripts" }} }}\n'
    plain = own_lethe(chroma, tmp_path, "", redis_url=REDIS, redis_settings=credential)
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            redis.Redis(host="127.0.0.1", port=6379, username=user, password="no-scripts").eval("return 1", 0)
        status, body = plain.call("PUT", "/v1/retention-rules", {"rules": [
            {"purpose": "support", "category": "conversation", "max_age": "30d"}]})
        assert status == 200, body
        consent(plain, alice)
        p = agent(plain, alice)
        key, around = f"{TENANT}:{alice}:plain", f"{TENANT}:{alice}:around"
        before = counts()
        assert p.set(key, "v") is True
        assert counts() == [before[0], before[1] + 1, before[2] + 1], "no script: the deadline read first"
        assert 0 < direct.pttl(key) <= RETENTION_MS
        for route in (r, p):
            route.set(f"{key}:short", "brief", px=60_000)
            route.set(f"{key}:short", "plain")
            assert 0 < direct.pttl(f"{key}:short") <= 60_000, "the earlier deadline the key holds is kept"
            direct.set(around, "written around Lethe")
            refused("unstamped_item", lambda: route.set(around, "over it"))
            assert direct.get(around) == "written around Lethe" and direct.pttl(around) == -1
            direct.delete(around)
            direct.rpush(around, "written around Lethe")
            refused("unstamped_item", lambda: route.rpush(around, "over it"))
            assert direct.lrange(around, 0, -1) == ["written around Lethe"] and direct.pttl(around) == -1
            direct.delete(around)
    finally:
        plain.stop()
        direct.acl_deluser(user)


@pytest.fixture
def tls_redis(tmp_path):
    """A Redis of the test's own that speaks TLS only (a private CA signed its certificate) and
    wants a password; answers its URL, its CA and a client of it that verifies."""
    ca, cert, key = certificates(tmp_path)
    port = free_port()
    server = subprocess.Popen(["redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
                               "--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tls-ca-cert-file", str(ca),
                               "--tls-auth-clients", "no", "--requirepass", "tls-secret", "--save", "",
                               "--appendonly", "no"], stdout=subprocess.DEVNULL)
    direct = redis.Redis(host="127.0.0.1", port=port, password="tls-secret", ssl=True, ssl_ca_certs=str(ca),
                         decode_responses=True)
    try:
        wait_for("the TLS Redis", direct.ping)
        # The route's own ACL user; Redis' user names are case-sensitive.
        direct.acl_setuser("LetheRoute", enabled=True, passwords=["+route-secret"], keys=["*"], channels=["*"],
                           commands=["+@all"])
        yield f"rediss://127.0.0.1:{port}", ca, direct
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_a_tls_redis_is_reached_only_when_its_certificate_verifies(chroma, tmp_path, tls_redis):
    url, ca, direct = tls_redis
    credential = 'credential = { header = "LetheRoute", value = { value = "route-secret" } }\n'
    for folder in ("trusting", "doubting"):
        (tmp_path / folder).mkdir()
    trusting = own_lethe(chroma, tmp_path / "trusting", f'[data_plane]\nupstream_ca = {{ file = "{ca}" }}\n',
                         redis_url=url, redis_settings=credential)
    doubting = own_lethe(chroma, tmp_path / "doubting", "", redis_url=url, redis_settings=credential)
    try:
        for instance in (trusting, doubting):
            status, body = instance.call("PUT", "/v1/retention-rules", {"rules": [
                {"purpose": "support", "category": "conversation", "max_age": "30d"}]})
            assert status == 200, body
        alice, bob = someone(), someone()
        for subject in (alice, bob):
            consent(trusting, subject)
            agent(trusting, subject).rpush(f"message_store:{TENANT}:{subject}", "over TLS")
        assert agent(trusting).lrange(f"message_store:{TENANT}:{alice}", 0, -1) == ["over TLS"]
        key = f"message_store:{TENANT}:{alice}"
        assert direct.lrange(key, 0, -1) == ["over TLS"] and 0 < direct.pttl(key) <= RETENTION_MS

        # A certificate no trusted CA signed: refused, nothing sent in the clear instead.
        consent(doubting, alice)
        refused("upstream_unavailable", lambda: agent(doubting, alice).rpush(key, "unverified"))
        assert direct.llen(key) == 1

        # The purge reaches the same Redis over TLS, and counts there.
        assert trusting.dry_run(alice)["redis:redis"] == 1
        done, results = trusting.erase_to_completion(alice)
        assert results["redis:redis"]["deleted"] == 1 and results["redis:redis"]["remaining"] == 0
        assert direct.exists(key) == 0 and direct.llen(f"message_store:{TENANT}:{bob}") == 1
    finally:
        trusting.stop()
        doubting.stop()


def next_message(pubsub, kind="message", deadline=10.0):
    """The next frame of `kind` the subscription hears, within `deadline` seconds."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        message = pubsub.get_message(timeout=0.5)
        if message and message["type"] == kind:
            return message
    raise AssertionError(f"no {kind} within {deadline}s")


@pytest.mark.parametrize("protocol", [2, 3])
def test_pubsub_on_a_subjects_channels_is_decided_at_subscribe_publish_and_delivery(lethe, direct, protocol):
    alice, bob, carol = someone(), someone(), someone()
    consent(lethe, alice)
    consent(lethe, bob)
    channel = lambda subject: f"{TENANT}:{subject}:events"  # noqa: E731
    listener = agent(lethe, protocol=protocol).pubsub()
    listener.subscribe(channel(alice), channel(bob))
    assert {next_message(listener, "subscribe")["channel"] for _ in range(2)} == {channel(alice), channel(bob)}
    # Through Lethe and around it, messages on the caller's channels arrive.
    assert agent(lethe, alice, protocol=protocol).publish(channel(alice), "through Lethe") == 1
    assert next_message(listener)["data"] == "through Lethe"
    direct.publish(channel(bob), "around Lethe")
    assert next_message(listener)["data"] == "around Lethe"

    # Channels beyond the caller's scope, patterns and the channel listing are refused.
    for subscribe, code in (
        (lambda p: p.subscribe(channel(bob)), "scope_violation"),       # a token bound to alice
        (lambda p: p.subscribe(f"{GLOBEX}:{alice}:events"), "scope_violation"),
        (lambda p: p.subscribe("announcements"), "unknown_endpoint"),
        (lambda p: p.psubscribe(f"{TENANT}:*"), "forbidden"),
    ):
        other = agent(lethe, alice, protocol=protocol).pubsub()
        subscribe(other)
        refused(code, lambda: other.get_message(timeout=5))
    refused("forbidden", lambda: agent(lethe, protocol=protocol).pubsub_channels())
    refused("scope_violation", lambda: agent(lethe, bob, protocol=protocol).publish(channel(alice), "x"))
    refused("consent_required", lambda: agent(lethe, carol, protocol=protocol).publish(channel(carol), "x"))

    # The flip: alice's messages are no longer delivered, bob's still are; publishing refused.
    lethe.flip(alice)
    refused("subject_suppressed", lambda: agent(lethe, protocol=protocol).publish(channel(alice), "late"))
    assert direct.publish(channel(alice), "after the flip") == 1, "Redis still has the subscription"
    direct.publish(channel(bob), "bob after the flip")
    assert next_message(listener)["data"] == "bob after the flip", "alice's message, sent first, was dropped"
    listener.unsubscribe(channel(bob))
    assert next_message(listener, "unsubscribe")["channel"] == channel(bob)
    listener.close()


def test_blocking_pops_and_stream_reads_wait_for_the_callers_data_only(lethe, direct):
    import threading
    alice, bob = someone(), someone()
    consent(lethe, alice)
    consent(lethe, bob)
    queue, stream = f"{TENANT}:{alice}:queue", lambda s: f"{TENANT}:{s}:stream"  # noqa: E731

    # A pop that waits gets what another client pushes through Lethe.
    # redis-py 8 gives up on an answer after 5 s (its default socket_timeout) and sends the
    # command again, so every wait here ends well before that.
    got, popper, reader = {}, agent(lethe, alice), agent(lethe)
    waiter = threading.Thread(target=lambda: got.update(pop=popper.blpop([queue], timeout=10)))
    waiter.start()
    agent(lethe, alice).rpush(queue, "job-1")
    waiter.join(timeout=15)
    assert list(got["pop"]) == [queue, "job-1"] and direct.llen(queue) == 0
    assert agent(lethe, alice).blpop([queue], timeout=0.2) is None, "nothing came: nil once the wait is over"

    # A stream read that waits hears only the caller's streams.
    for subject in (alice, bob):
        agent(lethe, subject).xadd(stream(subject), {"n": "0"})
    waiter = threading.Thread(target=lambda: got.update(
        read=reader.xread({stream(alice): "$", stream(bob): "$"}, block=10000)))
    waiter.start()
    # "$" is what comes after the read reaches Redis: add once it waits there.
    wait_for("the read waiting in Redis",
             lambda: any(c.get("cmd") == "xread" and "b" in c.get("flags", "") for c in direct.client_list()))
    agent(lethe, bob).xadd(stream(bob), {"n": "1"})
    waiter.join(timeout=15)
    assert [(s, [f for _, f in entries]) for s, entries in got["read"]] == [(stream(bob), [{"n": "1"}])]

    # Another subject's keys, and a subject without retrieve consent, are refused.
    refused("scope_violation", lambda: agent(lethe, bob).blpop([queue], timeout=1))
    carol = someone()
    consent(lethe, carol, actions=("store",))
    refused("consent_required", lambda: agent(lethe, carol).blpop([f"{TENANT}:{carol}:q"], timeout=1))
    refused("forbidden", lambda: agent(lethe, alice).blmove(queue, f"{queue}2", 1))

    # After the flip: pops refused; alice's stream reads as missing, bob's does not.
    agent(lethe, alice).rpush(queue, "job-2")
    lethe.flip(alice)
    refused("subject_suppressed", lambda: agent(lethe).blpop([queue], timeout=1))
    assert not reader.xread({stream(alice): "0"}), "nothing read"
    assert [s for s, _ in reader.xread({stream(alice): "0", stream(bob): "0"})] == [stream(bob)]
    assert not reader.xread({stream(alice): "$"}, block=200), "waited, then nil"
    assert direct.llen(queue) == 1 and direct.xlen(stream(alice)) == 1, "hidden, not yet purged"


def test_a_client_that_leaves_while_waiting_takes_nothing(lethe, direct):
    import socket
    alice = someone()
    consent(lethe, alice)
    queue = f"{TENANT}:{alice}:queue"
    host, port = lethe.listens["redis"].split(":")
    token = lethe.token("agent", alice)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(f"*3\r\n$4\r\nAUTH\r\n$5\r\nagent\r\n${len(token)}\r\n{token}\r\n".encode())
        assert s.recv(100) == b"+OK\r\n"
        s.sendall(f"*3\r\n$5\r\nBLPOP\r\n${len(queue)}\r\n{queue}\r\n$1\r\n0\r\n".encode())
        blocked = lambda: [c for c in direct.client_list() if c.get("cmd") == "blpop" and "b" in c.get("flags", "")]  # noqa: E731
        wait_for("the pop waiting in Redis", blocked)
    # The client is gone: Lethe drops its connection to Redis, which stops waiting.
    wait_for("Redis no longer waiting for it", lambda: not blocked())
    agent(lethe, alice).rpush(queue, "for a client still there")
    assert direct.lrange(queue, 0, -1) == ["for a client still there"]


def test_sets_combine_only_what_the_caller_may_read_and_store_within_one_subject(lethe, direct):
    alice, bob = someone(), someone()
    consent(lethe, alice)
    consent(lethe, bob)
    key = lambda subject, name: f"{TENANT}:{subject}:{name}"  # noqa: E731
    for subject, members in ((alice, {"a", "both"}), (bob, {"b", "both"})):
        r = agent(lethe, subject)
        r.sadd(key(subject, "s"), *members)
        r.zadd(key(subject, "z"), {m: i for i, m in enumerate(sorted(members))})
    reader = agent(lethe)
    sets, zsets = [key(alice, "s"), key(bob, "s")], [key(alice, "z"), key(bob, "z")]
    assert reader.sunion(sets) == {"a", "b", "both"} and reader.sinter(sets) == {"both"}
    assert reader.sdiff(sets) == {"a"} and reader.sintercard(2, sets) == 1
    assert sorted(reader.zunion(zsets)) == ["a", "b", "both"]

    # Into a key of the same subject: written with its deadline; across subjects: refused.
    alice_agent = agent(lethe, alice)
    assert alice_agent.sunionstore(key(alice, "copy"), [key(alice, "s")]) == 2
    assert alice_agent.zrangestore(key(alice, "top"), key(alice, "z"), 0, 0) == 1
    for stored in (key(alice, "copy"), key(alice, "top")):
        assert 0 < direct.pttl(stored) <= RETENTION_MS, stored
    refused("scope_violation", lambda: reader.sunionstore(key(alice, "mixed"), sets))
    refused("scope_violation", lambda: reader.zunionstore(key(bob, "mixed"), zsets))
    assert direct.exists(key(alice, "mixed"), key(bob, "mixed")) == 0

    # A hidden subject's set counts as a missing one.
    lethe.flip(alice)
    assert reader.sunion(sets) == {"b", "both"} and reader.sinter(sets) == set()
    assert reader.sdiff(sets) == set() and reader.sdiff(list(reversed(sets))) == {"b", "both"}
    assert reader.sintercard(2, sets) == 0
    assert sorted(reader.zunion(zsets, aggregate="SUM")) == ["b", "both"] and reader.zinter(zsets) == []
    assert direct.smembers(key(alice, "s")) == {"a", "both"}, "hidden, not yet purged"
