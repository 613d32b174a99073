"""The Redis route under attack: what another tenant, another subject, an unauthenticated or
malformed client, or a suppressed subject can reach through it, counted straight in Redis."""

import base64
import json
import socket
import subprocess
import threading
import time

import pytest
import redis

from conftest import GLOBEX, LETHE, TENANT, someone, wait_for
from test_redis import RETENTION_MS, agent, client, consent, direct, lethe, refused  # noqa: F401

WEEK_MS = 7 * 24 * 3600 * 1000


def raw(lethe, payload, read=True):
    """Sends `payload` on a fresh socket to the route; answers what came back until it closed
    (or 2 s passed)."""
    host, port = lethe.listens["redis"].split(":")
    with socket.create_connection((host, int(port)), timeout=2) as s:
        try:
            s.sendall(payload)
        except OSError:
            pass  # Lethe stopped reading (an oversized command): its answer is still there.
        if not read:
            return b""
        got = b""
        try:
            while chunk := s.recv(65536):
                got += chunk
        except (socket.timeout, ConnectionResetError):
            pass
        return got


def command(*args):
    out = f"*{len(args)}\r\n".encode()
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out


@pytest.fixture
def victims(lethe, direct):
    """bob of acme with a key of each family, written around Lethe with a week's deadline."""
    bob = someone()
    consent(lethe, bob)
    keys = {
        "string": f"{TENANT}:{bob}:s", "list": f"{TENANT}:{bob}:l", "hash": f"{TENANT}:{bob}:h",
        "set": f"{TENANT}:{bob}:set", "zset": f"{TENANT}:{bob}:z",
    }
    direct.set(keys["string"], "bob's", px=WEEK_MS)
    direct.rpush(keys["list"], "a")
    direct.hset(keys["hash"], "f", "v")
    direct.sadd(keys["set"], "m")
    direct.zadd(keys["zset"], {"m": 1})
    for k in keys.values():
        direct.pexpire(k, WEEK_MS)
    return bob, keys


def untouched(direct, keys):
    """Every victim key as it was written, deadline included."""
    assert direct.get(keys["string"]) == "bob's"
    assert direct.lrange(keys["list"], 0, -1) == ["a"]
    assert direct.hgetall(keys["hash"]) == {"f": "v"}
    assert direct.smembers(keys["set"]) == {"m"}
    assert direct.zscore(keys["zset"], "m") == 1
    for k in keys.values():
        assert 0 < direct.pttl(k) <= WEEK_MS, k


def every_family(r, keys, mine):
    """One call per command family on the victim's keys (and one moving `mine` onto them)."""
    s, lst, h, st, z = keys["string"], keys["list"], keys["hash"], keys["set"], keys["zset"]
    return [
        lambda: r.get(s), lambda: r.set(s, "x"), lambda: r.append(s, "x"), lambda: r.incr(s),
        lambda: r.getdel(s), lambda: r.getex(s, persist=True), lambda: r.delete(s), lambda: r.unlink(s),
        lambda: r.expire(s, 1), lambda: r.persist(s), lambda: r.ttl(s), lambda: r.type(s),
        lambda: r.exists(s), lambda: r.mget(mine, s), lambda: r.mset({mine: "1", s: "2"}),
        lambda: r.lpush(lst, "x"), lambda: r.lrange(lst, 0, -1), lambda: r.lpop(lst),
        lambda: r.hset(h, "f", "x"), lambda: r.hgetall(h), lambda: r.hdel(h, "f"),
        lambda: r.sadd(st, "x"), lambda: r.smembers(st), lambda: r.spop(st),
        lambda: r.zadd(z, {"x": 2}), lambda: r.zrange(z, 0, -1), lambda: r.zrem(z, "m"),
        lambda: r.rename(mine, s), lambda: r.copy(mine, s, replace=True), lambda: r.lmove(mine, lst),
        lambda: r.smove(mine, st, "m"), lambda: r.execute_command("WATCH", s), lambda: r.hscan(h), lambda: r.xadd(s, {"f": "v"}),
        lambda: r.sunion(st, mine), lambda: r.sinterstore(mine, [st]), lambda: r.zunion([z]),
        lambda: r.zunionstore(mine, [z]), lambda: r.zrangestore(mine, z, 0, -1), lambda: r.sintercard(1, [st]),
        lambda: r.blpop([lst], timeout=1), lambda: r.xread({s: "0"}, block=100), lambda: r.publish(s, "x"),
    ]


def test_another_tenant_reaches_none_of_acmes_keys(lethe, direct, victims):
    bob, keys = victims
    theirs = someone()
    consent(lethe, theirs, tenant=GLOBEX)
    for r in (agent(lethe, theirs, tenant=GLOBEX), agent(lethe, tenant=GLOBEX),
              client(lethe, lethe.token("admin", tenant=GLOBEX))):
        mine = f"{GLOBEX}:{theirs}:mine"
        for i, call in enumerate(every_family(r, keys, mine)):
            refused("scope_violation", call, f"family call #{i}")
    untouched(direct, keys)


def test_a_bound_token_reaches_none_of_another_subjects_keys(lethe, direct, victims):
    bob, keys = victims
    alice = someone()
    consent(lethe, alice)
    r = agent(lethe, alice)
    mine = f"{TENANT}:{alice}:mine"
    r.set(mine, "alice's")
    for i, call in enumerate(every_family(r, keys, mine)):
        refused("scope_violation", call, f"family call #{i}")
    untouched(direct, keys)
    assert direct.get(mine) == "alice's", "a refused MSET wrote none of its keys"
    # SCAN with a pattern naming bob's keys answers none of them.
    seen = set()
    for page in r.scan_iter(match=f"{TENANT}:{bob}:*", count=1000):
        seen.add(page)
    assert seen == set()


def test_keys_the_route_cannot_own_are_refused(lethe, direct):
    alice = someone()
    consent(lethe, alice)
    r = agent(lethe)
    for key, code in (
        (f"{TENANT}-{alice}-x", "unknown_endpoint"),
        (f"{TENANT}::x", "unknown_endpoint"),
        (f"{TENANT}:{alice}", "unknown_endpoint"),
        # Two spellings of one subject would keep keys the purge of the other does not find.
        (f"{TENANT}:a\u0301{alice}:x", "invalid_request"),
    ):
        refused(code, lambda: r.set(key, "x"))
        assert direct.exists(key) == 0, key
    # Non-UTF-8 keys match no pattern.
    refused("unknown_endpoint", lambda: r.set(b"acme:\xff:x", "x"))


def test_unauthenticated_revoked_and_compliance_callers_reach_nothing(lethe, direct):
    alice = someone()
    consent(lethe, alice)
    key = f"{TENANT}:{alice}:k"
    answer = raw(lethe, command("SET", key, "x") + command("GET", key) + command("SCAN", 0), read=True)
    assert answer.count(b"-NOAUTH") == 3, answer
    with pytest.raises(redis.exceptions.AuthenticationError):
        client(lethe, "not-a-token").ping()
    with pytest.raises(redis.exceptions.AuthenticationError):
        client(lethe, lethe.token("agent", alice, tenant="acme") + "x").ping()
    refused("forbidden", lambda: client(lethe, lethe.token("compliance")).set(key, "x"))
    assert direct.exists(key) == 0


def test_malformed_oversized_and_half_commands_close_only_their_connection(lethe, direct):
    alice = someone()
    consent(lethe, alice)
    steady = agent(lethe, alice)
    steady.set(f"{TENANT}:{alice}:steady", "1")
    token = lethe.token("agent", alice)
    auth = command("AUTH", "agent", token)
    big = f"{TENANT}:{alice}:big"
    answer = raw(lethe, auth + command("SET", big, "x" * (1024 * 1024 + 64 * 1024)))
    assert b"+OK" in answer and b"lethe:invalid_request" in answer and b"larger than" in answer, answer[:200]
    assert direct.exists(big) == 0
    assert b"not RESP" in raw(lethe, auth + b"*x\r\n")
    assert b"lethe:invalid_request" in raw(lethe, auth + b"GET inline\r\n")
    half = f"{TENANT}:{alice}:half"
    raw(lethe, auth + command("SET", half, "v")[:-5], read=False)
    assert direct.exists(half) == 0
    # The other client's connection goes on.
    assert steady.get(f"{TENANT}:{alice}:steady") == "1"


def test_a_transaction_refused_anywhere_writes_nothing_and_selects_no_other_database(lethe, direct, victims):
    bob, keys = victims
    alice = someone()
    consent(lethe, alice)
    r = agent(lethe, alice)
    first, last = f"{TENANT}:{alice}:first", f"{TENANT}:{alice}:last"
    pipe = r.pipeline(transaction=True)
    pipe.set(first, "1").rpush(keys["list"], "x").set(last, "2")
    with pytest.raises(redis.exceptions.ResponseError):
        pipe.execute()
    assert direct.exists(first, last) == 0
    untouched(direct, keys)
    refused("forbidden", lambda: r.execute_command("SELECT", 1))
    with pytest.raises(redis.exceptions.ResponseError):
        r.execute_command("MULTI")
        r.execute_command("MULTI")
    r.execute_command("DISCARD")


def test_a_long_pipeline_is_answered_in_order(lethe, direct):
    alice = someone()
    consent(lethe, alice)
    r = agent(lethe, alice)
    pipe = r.pipeline(transaction=False)
    for i in range(500):
        pipe.set(f"{TENANT}:{alice}:p{i}", i).get(f"{TENANT}:{alice}:p{i}")
    answers = pipe.execute()
    assert answers == [x for i in range(500) for x in (True, str(i))]
    assert all(0 < direct.pttl(f"{TENANT}:{alice}:p{i}") <= RETENTION_MS for i in (0, 499))


def test_in_a_pipeline_each_command_is_decided_alone_and_refusals_refuse_only_themselves(lethe, direct, victims):
    """Lethe answers a pipeline's commands read together in one exchange with Redis: a refused
    command among them must neither stop nor leak into its neighbours, and a write's deadline
    and a hidden key's answer hold as they do one command at a time."""
    alice, carol = someone(), someone()
    consent(lethe, alice)
    bob, keys = victims
    around = f"{TENANT}:{alice}:around"
    direct.set(around, "written around Lethe")
    mine = f"{TENANT}:{alice}:p"
    r = agent(lethe, alice)
    pipe = r.pipeline(transaction=False)
    pipe.set(mine, "1", ex=10 * 365 * 24 * 3600)   # clamped
    pipe.set(keys["string"], "not alice's")       # another subject: scope_violation
    pipe.set(around, "over it")                   # nobody's key: unstamped_item
    pipe.get(mine)
    pipe.set(f"{GLOBEX}:{alice}:x", "1")          # another tenant
    pipe.set(f"{TENANT}:{carol}:x", "1")          # another subject, no consent
    pipe.append(mine, "2")
    pipe.get(mine)
    answers = pipe.execute(raise_on_error=False)
    codes = [str(a).split()[0].removeprefix("lethe:") if isinstance(a, Exception) else a for a in answers]
    assert codes == [True, "scope_violation", "unstamped_item", "1", "scope_violation", "scope_violation", 2, "12"], codes
    assert 0 < direct.pttl(mine) <= RETENTION_MS
    assert direct.get(around) == "written around Lethe" and direct.pttl(around) == -1
    assert direct.exists(f"{GLOBEX}:{alice}:x", f"{TENANT}:{carol}:x") == 0
    untouched(direct, keys)

    # A transaction in the middle of a pipeline keeps its place and its all-or-nothing.
    pipe = r.pipeline(transaction=False)
    pipe.set(f"{mine}:before", "b")
    pipe.execute_command("MULTI")
    pipe.set(f"{mine}:inside", "i")
    pipe.set(keys["string"], "x")
    pipe.execute_command("EXEC")
    pipe.get(f"{mine}:before")
    answers = pipe.execute(raise_on_error=False)
    assert answers[0] is True and answers[1] == "OK" and answers[-1] == "b", answers
    assert isinstance(answers[3], redis.exceptions.NoPermissionError), answers
    assert isinstance(answers[4], redis.exceptions.ExecAbortError), answers
    assert direct.exists(f"{mine}:inside") == 0
    untouched(direct, keys)

    # A hidden subject's keys read as missing in the middle of a pipeline, the others' do not.
    consent(lethe, carol)
    agent(lethe, carol).set(f"{TENANT}:{carol}:x", "c")
    lethe.flip(alice)
    pipe = agent(lethe).pipeline(transaction=False)
    pipe.get(mine).get(f"{TENANT}:{carol}:x").exists(mine).get(mine)
    assert pipe.execute() == [None, "c", 0, None]
    assert direct.get(mine) == "12", "hidden, not yet purged"


def test_a_suppressed_subject_is_gone_from_every_read_and_writes_nothing(lethe, direct):
    alice = someone()
    consent(lethe, alice)
    r = agent(lethe, alice)
    r.set(f"{TENANT}:{alice}:s", "v")
    r.rpush(f"{TENANT}:{alice}:l", "a")
    r.hset(f"{TENANT}:{alice}:h", "f", "v")
    lethe.flip(alice)
    reader = agent(lethe)
    assert reader.get(f"{TENANT}:{alice}:s") is None
    assert reader.lrange(f"{TENANT}:{alice}:l", 0, -1) == []
    assert reader.hgetall(f"{TENANT}:{alice}:h") == {}
    assert reader.exists(f"{TENANT}:{alice}:s", f"{TENANT}:{alice}:l") == 0
    assert not any(alice in k for k in reader.scan_iter(match=f"{TENANT}:{alice}:*", count=1000))
    for call in (
        lambda: r.set(f"{TENANT}:{alice}:new", "late"), lambda: r.rpush(f"{TENANT}:{alice}:l", "late"),
        lambda: r.expire(f"{TENANT}:{alice}:s", 100), lambda: r.persist(f"{TENANT}:{alice}:s"),
    ):
        refused("subject_suppressed", call)
    assert direct.exists(f"{TENANT}:{alice}:new") == 0
    wait_for("the purge", lambda: direct.exists(f"{TENANT}:{alice}:s", f"{TENANT}:{alice}:l",
                                                 f"{TENANT}:{alice}:h") == 0)


def test_a_key_written_around_lethe_is_nobodys(lethe, direct):
    alice = someone()
    consent(lethe, alice)
    key = f"{TENANT}:{alice}:around"
    direct.set(key, "no deadline")
    refused("unstamped_item", lambda: agent(lethe, alice).set(key, "claimed"))
    assert direct.get(key) == "no deadline" and direct.pttl(key) == -1


@pytest.fixture(scope="module")
def unreachable(chroma, tmp_path_factory):
    """A Lethe whose Redis route leads nowhere, and holds at most 5 commands in a transaction."""
    from conftest import own_lethe
    instance = own_lethe(chroma, tmp_path_factory.mktemp("lethe-redis-down"), "", redis_url="redis://127.0.0.1:1",
                         redis_settings="max_transaction_commands = 5\n")
    rules = {"rules": [{"purpose": "support", "category": "conversation", "max_age": "30d"}]}
    assert instance.call("PUT", "/v1/retention-rules", rules)[0] == 200
    yield instance
    instance.stop()


def test_redis_down_is_a_clear_error_and_a_transaction_is_bounded(unreachable):
    alice = someone()
    consent(unreachable, alice)
    r = agent(unreachable, alice)
    with pytest.raises(redis.exceptions.ResponseError, match="lethe:upstream_unavailable"):
        r.set(f"{TENANT}:{alice}:k", "v")
    with pytest.raises(redis.exceptions.ResponseError, match="lethe:upstream_unavailable"):
        r.get(f"{TENANT}:{alice}:k")
    # Queued commands are held by Lethe until EXEC: one more than the route allows discards them.
    answer = raw(unreachable, command("AUTH", "agent", unreachable.token("agent", alice)) + command("MULTI")
                 + b"".join(command("GET", f"{TENANT}:{alice}:{i}") for i in range(6)) + command("EXEC"))
    assert answer.count(b"+QUEUED") == 5, answer
    assert b"more than 5 commands in one transaction" in answer and b"-EXECABORT" in answer, answer


def test_a_write_that_answers_with_stored_data_needs_retrieve_consent(lethe, direct):
    """A writer with `store` consent only cannot read through a write's answer."""
    carol = someone()
    consent(lethe, carol, actions=("store",))
    r = agent(lethe, carol)
    key, counter, stack = f"{TENANT}:{carol}:k", f"{TENANT}:{carol}:n", f"{TENANT}:{carol}:l"
    assert r.set(key, "secret") is True and r.set(counter, 41) is True
    direct.rpush(stack, "secret")
    direct.pexpire(stack, RETENTION_MS)
    for call in (
        lambda: r.getset(key, "x"), lambda: r.set(key, "x", get=True), lambda: r.getdel(key),
        lambda: r.lpop(stack), lambda: r.incr(counter),
    ):
        with pytest.raises(redis.exceptions.ResponseError, match="lethe:consent_required"):
            call()
    assert r.get(key) is None, "read as missing without retrieve consent"
    assert direct.get(key) == "secret" and direct.lrange(stack, 0, -1) == ["secret"] and direct.get(counter) == "41"


def test_writers_racing_the_erasure_leave_none_of_the_subjects_keys(lethe, direct):
    """Four clients write the subject's keys in a loop while its erasure is filed, approved and
    completed (two a new key each time, two an MSET of a key they write again and a new one, so
    that keys lineage already holds and keys it does not are overtaken together): what a flip
    overtook is undone, what comes after it is refused, and once the request says completed Redis
    holds none of the subject's keys, counted there."""
    import threading
    alice = someone()
    consent(lethe, alice)
    stop, written = threading.Event(), []

    def write(n):
        r = agent(lethe, alice)
        i = 0
        while not stop.is_set():
            try:
                if n % 2:
                    r.mset({f"{TENANT}:{alice}:hot{n}": "v", f"{TENANT}:{alice}:race{n}:{i}": "v"})
                else:
                    r.set(f"{TENANT}:{alice}:race{n}:{i}", "v")
                written.append(1)
            except redis.exceptions.ResponseError:
                pass
            i += 1

    writers = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for w in writers:
        w.start()
    wait_for("writes landing", lambda: len(written) >= 50)
    done, results = lethe.erase_to_completion(alice)
    remaining = len(list(direct.scan_iter(match=f"{TENANT}:{alice}:*", count=1000)))
    stop.set()
    for w in writers:
        w.join()
    assert done["state"] == "completed" and results["redis:redis"]["remaining"] == 0
    assert remaining == 0, f"{remaining} keys of the erased subject in Redis at completion"
    assert not list(direct.scan_iter(match=f"{TENANT}:{alice}:*", count=1000)), "nothing landed after it"


# The second outside attack (issue 38): each row's attempt, counted in Redis.

def one_connection(lethe, token, protocol=None):
    """redis-py on one connection the whole test long, as a long-lived worker holds it."""
    host, port = lethe.listens["redis"].split(":")
    return redis.Redis(host=host, port=int(port), username="agent", password=token, decode_responses=True,
                       protocol=protocol, single_connection_client=True)


def claims_of(token):
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


def short_lived(lethe, subject, ttl):
    """An agent token bound to `subject` that expires after `ttl`."""
    return subprocess.run([str(LETHE), "token", "--role", "agent", "--tenant", TENANT, "--subject", subject,
                           "--ttl", ttl], cwd=lethe.workdir, env=lethe.env, check=True, capture_output=True,
                          text=True).stdout.strip()


def test_twenty_thousand_nested_arrays_before_auth_are_one_refusal_not_a_crash(lethe, direct):
    """Row 1: the decoder recursed once per level; 20 000 levels aborted the process."""
    alice = someone()
    consent(lethe, alice)
    steady = agent(lethe, alice)
    answer = raw(lethe, b"*1\r\n" * 20_000 + command("PING"))
    assert b"lethe:invalid_request" in answer and b"not RESP" in answer, answer[:200]
    # The process and every other connection go on.
    assert b"+PONG" in raw(lethe, command("PING"))
    steady.set(f"{TENANT}:{alice}:alive", "1")
    assert direct.get(f"{TENANT}:{alice}:alive") == "1"


def test_a_command_in_tiny_pieces_is_read_once(lethe, direct):
    """Row 8 cost every read a re-parse of the whole buffer: a 200 KB command in 256-byte pieces
    is answered as one sent at once. That no byte is decoded twice is the decoder's (its unit
    tests and the `resp_command` fuzz target); this checks the route end to end."""
    alice = someone()
    consent(lethe, alice)
    key = f"{TENANT}:{alice}:pieces"
    payload = command("AUTH", "agent", lethe.token("agent", alice)) + command("SET", key, "x" * 200_000)
    host, port = lethe.listens["redis"].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        for i in range(0, len(payload), 256):
            s.sendall(payload[i:i + 256])
        got = b""
        while got.count(b"+OK") < 2:
            got += s.recv(4096)
    assert direct.strlen(key) == 200_000


def test_copy_into_another_database_is_refused(lethe, direct):
    """Row 2: `COPY k k DB 1` put the subject's text where the purge never looked."""
    carol = someone()
    consent(lethe, carol)
    r = agent(lethe, carol)
    key = f"{TENANT}:{carol}:k"
    r.set(key, "carol's")
    for db in (1, 2):
        refused("forbidden", lambda: r.copy(key, key, destination_db=db))
        refused("forbidden", lambda: r.execute_command("COPY", key, key, "REPLACE", "db", db))
    for db in (1, 2):
        assert redis.Redis(host="127.0.0.1", port=6379, db=db).exists(key) == 0
    lethe.erase_to_completion(carol)
    assert direct.exists(key) == 0


def test_a_token_revoked_or_expired_on_an_open_connection_is_refused_at_its_next_command(lethe, direct):
    """Row 4: only new connections were refused; one authenticated before went on writing."""
    alice = someone()
    consent(lethe, alice)
    token = lethe.token("agent", alice)
    r = one_connection(lethe, token)
    key = f"{TENANT}:{alice}:k"
    r.set(key, "before")
    subscriber = one_connection(lethe, token).pubsub()
    subscriber.subscribe(key)
    assert subscriber.get_message(timeout=5)["type"] == "subscribe"
    status, body = lethe.call("POST", "/v1/tokens/revoke", {"jti": claims_of(token)["jti"]}, token=lethe.token("admin"))
    assert status == 200, body
    with pytest.raises(redis.exceptions.RedisError, match="lethe:unauthenticated|revoked|closed|invalid"):
        r.set(key, "after")
    assert direct.get(key) == "before"
    # A message published on the channel reaches the revoked subscriber no more.
    agent(lethe, alice).publish(key, "for a revoked reader")
    delivered = []
    try:
        while (message := subscriber.get_message(timeout=2)) is not None:
            delivered.append(message)
    except redis.exceptions.RedisError:
        pass  # refused, and the connection closed
    assert not [m for m in delivered if m["type"] == "message"], delivered

    short = short_lived(lethe, alice, "2s")
    r = one_connection(lethe, short)
    r.set(key, "short")
    wait_for("the token to expire", lambda: time.time() >= claims_of(short)["exp"] + 1, deadline=10)
    with pytest.raises(redis.exceptions.RedisError, match="lethe:unauthenticated|expired|closed"):
        r.set(key, "expired")
    assert direct.get(key) == "short"


def test_reads_queued_in_multi_are_decided_at_exec(lethe, direct):
    """Row 5: queue a subject's reads, flip her, EXEC answered her data."""
    dora = someone()
    consent(lethe, dora)
    key, lst = f"{TENANT}:{dora}:s", f"{TENANT}:{dora}:l"
    writer = agent(lethe, dora)
    writer.set(key, "dora's")
    writer.rpush(lst, "a", "b")
    r = one_connection(lethe, lethe.token("agent"))
    assert r.execute_command("MULTI") == "OK"
    assert r.execute_command("GET", key) == "QUEUED"
    assert r.execute_command("LRANGE", lst, 0, -1) == "QUEUED"
    lethe.flip(dora)
    assert r.execute_command("EXEC") == [None, []]
    # A write queued before the flip is refused at EXEC, and nothing of the transaction is sent.
    erin = someone()
    consent(lethe, erin)
    r.execute_command("MULTI")
    r.execute_command("SET", f"{TENANT}:{erin}:first", "1")
    r.execute_command("SET", f"{TENANT}:{erin}:second", "2")
    lethe.flip(erin)
    with pytest.raises(redis.exceptions.ResponseError, match="lethe:subject_suppressed"):
        r.execute_command("EXEC")
    assert direct.exists(f"{TENANT}:{erin}:first", f"{TENANT}:{erin}:second") == 0


def test_a_wait_begun_before_a_flip_delivers_nothing_of_the_subject(lethe, direct):
    """Row 6: BLPOP, BZPOPMIN and XREAD BLOCK begun before a flip delivered data written after it."""
    fay = someone()
    consent(lethe, fay)
    lst, zset, stream = f"{TENANT}:{fay}:l", f"{TENANT}:{fay}:z", f"{TENANT}:{fay}:x"
    writer = agent(lethe, fay)
    writer.xadd(stream, {"f": "before"})
    reader = agent(lethe)
    got = {}
    waits = {
        "blpop": lambda: reader.blpop([lst], timeout=20),
        "bzpopmin": lambda: reader.bzpopmin([zset], timeout=20),
        "xread": lambda: reader.xread({stream: "$"}, block=20_000),
    }
    blocked_before = int(direct.info("clients")["blocked_clients"])
    threads = [threading.Thread(target=lambda n=n, w=w: got.__setitem__(n, w())) for n, w in waits.items()]
    for t in threads:
        t.start()
    wait_for("three waiting commands in Redis",
             lambda: int(direct.info("clients")["blocked_clients"]) >= blocked_before + 3)
    lethe.flip(fay)
    # Written after the flip, around Lethe (Lethe refuses her writes now).
    direct.rpush(lst, "after the flip")
    direct.zadd(zset, {"after the flip": 1})
    direct.xadd(stream, {"f": "after the flip"})
    for t in threads:
        t.join(timeout=30)
    assert set(got) == set(waits), got
    assert all(not answer for answer in got.values()), got
    assert direct.llen(lst) == 0, "BLPOP took her element: hers, and being erased"


@pytest.fixture(scope="module")
def bounded(chroma, tmp_path_factory):
    """A Lethe whose listeners hold 4 connections per address, give 1 s to authenticate, 2 s
    to finish a command begun, and close a connection idle for 2 s."""
    from conftest import own_lethe
    from test_redis import REDIS
    limits = ('[data_plane]\nmax_connections_per_address = 4\nauth_timeout = "1s"\nrequest_timeout = "2s"\n'
              'idle_timeout = "2s"\n')
    instance = own_lethe(chroma, tmp_path_factory.mktemp("lethe-redis-bounded"), limits, redis_url=REDIS)
    rules = {"rules": [{"purpose": "support", "category": "conversation", "max_age": "30d"}]}
    assert instance.call("PUT", "/v1/retention-rules", rules)[0] == 200
    yield instance
    instance.stop()


def test_connections_are_bounded_per_address_and_in_time(bounded, direct):
    """Row 7: no connection cap, no idle or pre-AUTH timeout: a half command was held 65 s, and
    40 connections of ~1 MiB each took 87 MB."""
    host, port = bounded.listens["redis"].split(":")
    held = [socket.create_connection((host, int(port)), timeout=5) for _ in range(4)]
    try:
        # Each is admitted before the fifth comes: a PING answered on each says so.
        for s in held:
            s.sendall(command("PING"))
            assert s.recv(100) == b"+PONG\r\n"
        fifth = raw(bounded, command("PING"))
        assert fifth.startswith(b"-ERR lethe:overloaded") and b"address" in fifth, fifth
        # Never authenticated: given up after 1 s, with the reason.
        s = held[0]
        s.settimeout(10)
        assert s.recv(200).startswith(b"-ERR lethe:timeout no command came in time")
        assert s.recv(1) == b"", "and closed"
    finally:
        for s in held:
            s.close()
    # A closed connection gives its place back.
    wait_for("a place on the listener", lambda: raw(bounded, command("PING")).startswith(b"+PONG\r\n"), deadline=10)

    alice = someone()
    consent(bounded, alice)
    key = f"{TENANT}:{alice}:half"
    auth = command("AUTH", "agent", bounded.token("agent", alice))
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(auth + command("SET", key, "v")[:-5])
        answer = b""
        while chunk := s.recv(200):
            answer += chunk
        assert answer.startswith(b"+OK\r\n-ERR lethe:timeout a command did not arrive whole in time"), answer
    assert direct.exists(key) == 0
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(auth)
        answer = b""
        while chunk := s.recv(200):
            answer += chunk
        assert answer == b"+OK\r\n-ERR lethe:timeout no command came in time\r\n", answer
    # A subscriber waits for its messages as long as it likes: it is not idle.
    subscriber = one_connection(bounded, bounded.token("agent", alice)).pubsub()
    subscriber.subscribe(key)
    assert subscriber.get_message(timeout=5)["type"] == "subscribe"
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        assert subscriber.get_message(timeout=0.5) is None
    agent(bounded, alice).publish(key, "still there")
    message = wait_for("the message", lambda: subscriber.get_message(timeout=1))
    assert message["data"] == "still there"


def waiting_on(direct, command_name):
    """How many of Redis' clients wait in `command_name` now."""
    return sum(1 for c in direct.client_list() if c.get("cmd") == command_name)


def test_a_client_that_leaves_behind_a_waiting_command_takes_nothing_and_frees_its_place(bounded, direct):
    """Second attack, R1: a client that sent one byte more behind `BLPOP k 0` and closed was
    never seen to leave (Lethe peeked the byte and waited for ever): Redis went on waiting on
    Lethe's connection and popped the next element for nobody, and four such clients held an
    address's every place on the listener for good."""
    alice = someone()
    consent(bounded, alice)
    key = f"{TENANT}:{alice}:queue"
    host, port = bounded.listens["redis"].split(":")
    before = waiting_on(direct, "blpop")
    for _ in range(4):
        s = socket.create_connection((host, int(port)), timeout=5)
        s.sendall(command("AUTH", "agent", bounded.token("agent", alice)) + command("BLPOP", key, "0"))
        assert s.recv(5) == b"+OK\r\n"
        wait_for("the BLPOP to wait in Redis", lambda: waiting_on(direct, "blpop") > before)
        s.sendall(b"*")  # the beginning of a next command, while the BLPOP waits
        s.close()
        wait_for("Lethe to stop Redis' wait for a client gone", lambda: waiting_on(direct, "blpop") == before)
    direct.rpush(key, "for whoever comes")
    direct.pexpire(key, RETENTION_MS)
    assert direct.llen(key) == 1, "a client that left took the element"
    # Every place came back: a new client is served.
    wait_for("a place on the listener", lambda: raw(bounded, command("PING")).startswith(b"+PONG\r\n"), deadline=10)


def test_a_transaction_queue_is_bounded_in_bytes(lethe, direct):
    """Second attack, R2: MULTI then 800 commands of ~1 MiB each (each under the command limit,
    together under the count limit) took Lethe from 50 to 916 MB on one connection. The queue
    holds at most `max_command_bytes` together now: one more discards the transaction."""
    pid = lethe.process.pid
    rss = lambda: int(next(l for l in open(f"/proc/{pid}/status") if l.startswith("VmRSS:")).split()[1]) // 1024  # noqa: E731,E741
    before = rss()
    host, port = lethe.listens["redis"].split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        def answer(lines=1):
            got = b""
            while got.count(b"\r\n") < lines:
                got += s.recv(200)
            return got
        s.sendall(command("AUTH", "agent", lethe.token("agent", tenant=GLOBEX)) + command("MULTI"))
        assert answer(2) == b"+OK\r\n+OK\r\n"
        answers = []
        for _ in range(8):
            s.sendall(command("ECHO", b"x" * (300 * 1024)))
            answers.append(answer())
        assert answers[:3] == [b"+QUEUED\r\n"] * 3, answers
        assert all(a.startswith(b"-ERR lethe:invalid_request more than 1048576 bytes") for a in answers[3:]), answers
        s.sendall(command("EXEC"))
        assert answer().startswith(b"-EXECABORT"), "discarded"
    assert rss() - before < 64, "one connection's queue holds a command's worth at most"


def test_a_writer_without_retrieve_consent_reads_nothing_through_what_a_write_answers(lethe, direct):
    """Second attack, R3: with `store` consent only, `ZADD ... XX INCR 0` answered the stored
    score (42.5), and SADD, HSETNX, APPEND and SETRANGE told whether a member or a field was
    there, or a string's length. They need `retrieve` too now; Redis holds what it held."""
    carol = someone()
    consent(lethe, carol, actions=("store",))
    z, s, h, st = (f"{TENANT}:{carol}:{n}" for n in ("z", "set", "h", "str"))
    direct.zadd(z, {"diagnosis": 42.5})
    direct.sadd(s, "condition")
    direct.hset(h, "ssn", "123-45-6789")
    direct.set(st, "a secret of 23 chars!!!")
    for key in (z, s, h, st):
        direct.pexpire(key, RETENTION_MS)
    r = agent(lethe, carol)
    for args in (("ZADD", z, "XX", "INCR", 0, "diagnosis"), ("ZADD", z, "NX", 1, "diagnosis"),
                 ("SADD", s, "condition"), ("SREM", s, "other"), ("HSETNX", h, "ssn", "x"),
                 ("LREM", f"{TENANT}:{carol}:l", 0, "x"), ("APPEND", st, ""), ("SETRANGE", st, 0, "")):
        with pytest.raises(redis.exceptions.ResponseError, match="lethe:consent_required"):
            r.execute_command(*args)
    assert (direct.zscore(z, "diagnosis"), direct.smembers(s), direct.hget(h, "ssn"), direct.strlen(st)) == (
        42.5, {"condition"}, "123-45-6789", 23)
    assert r.set(f"{TENANT}:{carol}:l2", "kept") is True, "a write that answers nothing of hers is served"


def test_one_scan_walks_a_bounded_part_of_the_keyspace(lethe, direct):
    """Second attack, R4: `SCAN 0 COUNT 2147483647` walked every tenant's keys in one command,
    what `KEYS` is refused for. One SCAN asks Redis to walk 1 000 at most now."""
    filler = f"{TENANT}:{someone()}:f"
    with direct.pipeline(transaction=False) as p:
        for i in range(2500):
            p.set(f"{filler}{i}", "x", px=RETENTION_MS)
        p.execute()
    cursor, _ = agent(lethe, tenant=GLOBEX).execute_command("SCAN", 0, "COUNT", 2**31 - 1)
    assert int(cursor) != 0, "the whole keyspace walked in one command"


def test_no_write_but_the_four_that_answer_ok_serves_a_writer_without_retrieve_consent(lethe, direct):
    """Third attack, R-1: with `store` consent only, ZREMRANGEBYSCORE answered whether a score
    was held, XDEL whether an entry was, RPUSHX and LSET a list's length, SETNX, SET NX, MSETNX,
    RENAMENX, EXPIRE and PERSIST whether a key existed, XADD with an id the stream's order; and
    COPY copied a key she could not read. Every write needs `retrieve` now but SET (with no
    option but its deadline's), SETEX, PSETEX and MSET; Redis holds what it held."""
    carol = someone()
    consent(lethe, carol, actions=("store",))
    k = lambda n: f"{TENANT}:{carol}:{n}"  # noqa: E731
    direct.zadd(k("z"), {"diagnosis": 42.5, "hiv": 7})
    direct.rpush(k("l"), "a", "b", "c")
    direct.set(k("s"), "secret")
    direct.xadd(k("x"), {"f": "v"}, id="1700000000000-0")
    for n in ("z", "l", "s", "x"):
        direct.pexpire(k(n), RETENTION_MS)
    r = agent(lethe, carol)
    assert r.get(k("s")) is None and r.exists(k("s")) == 0, "reads hide her keys: no retrieve consent"
    for args in (
        ("ZREMRANGEBYLEX", k("z"), "[hiv", "[hiv"), ("ZREMRANGEBYSCORE", k("z"), "42.5", "42.5"),
        ("XDEL", k("x"), "1700000000000-0"), ("XADD", k("x"), "1-0", "f", "v"), ("RPUSHX", k("l"), "d"),
        ("RPUSH", k("l"), "d"), ("LSET", k("l"), "10", "x"), ("SETNX", k("s"), "x"), ("SET", k("s"), "x", "NX"),
        ("MSETNX", k("s"), "x", k("new"), "y"), ("RENAMENX", k("l"), k("s")), ("COPY", k("s"), k("copy")),
        ("EXPIRE", k("s"), "100000000", "GT"), ("EXPIRE", k("missing"), "100"), ("PERSIST", k("s")),
        ("HSET", k("h"), "f", "v"), ("DEL", k("s")),
        # Newer servers (Redis 8.4, Valkey 8.1) answer OK or nil as the value equals a guess.
        ("SET", k("s"), "x", "IFEQ", "secret"), ("SET", k("s"), "x", "EX", "100", "IFNE", "secret"),
    ):
        with pytest.raises(redis.exceptions.ResponseError, match="lethe:consent_required"):
            r.execute_command(*args)
    assert direct.zrange(k("z"), 0, -1, withscores=True) == [("hiv", 7.0), ("diagnosis", 42.5)]
    assert direct.lrange(k("l"), 0, -1) == ["a", "b", "c"] and direct.get(k("s")) == "secret"
    assert direct.xlen(k("x")) == 1 and not direct.exists(k("copy"), k("new"), k("h"))
    for args in (("SET", k("a"), "1"), ("SET", k("a"), "1", "PX", "100000"), ("SETEX", k("b"), "100", "2"),
                 ("PSETEX", k("c"), "100000", "3"), ("MSET", k("d"), "4", k("e"), "5")):
        assert r.execute_command(*args) in (True, "OK", b"OK"), args
    assert direct.mget(k("a"), k("b"), k("c"), k("d"), k("e")) == ["1", "2", "3", "4", "5"]


def test_watch_on_a_key_the_caller_cannot_read_is_refused(lethe, direct):
    """Third attack, R-2: WATCH was served on a key Lethe hides (no consent, or suppressed), and
    EXEC's nil then told the watcher it was written. It is decided as a read now."""
    alice, dan, erin = someone(), someone(), someone()
    consent(lethe, alice)
    consent(lethe, erin)
    hidden = f"{TENANT}:{dan}:s"  # dan: no consent, so his keys read as missing
    direct.set(hidden, "dan's", px=WEEK_MS)
    host, port = lethe.listens["redis"].split(":")
    # One connection: WATCH, MULTI and EXEC are one connection's.
    r = redis.Redis(host=host, port=int(port), username="agent", password=lethe.token("agent"),
                    decode_responses=True, single_connection_client=True)
    assert r.get(hidden) is None and r.exists(hidden) == 0
    with pytest.raises(redis.exceptions.ResponseError, match="lethe:consent_required"):
        r.execute_command("WATCH", hidden)
    direct.set(hidden, "dan wrote again", px=WEEK_MS)
    r.execute_command("MULTI")
    r.execute_command("SET", f"{TENANT}:{alice}:mine", "x")
    assert r.execute_command("EXEC") is not None, "nothing was watched: EXEC ran"
    # A suppressed subject's key, alike; her own readable key is watched as Redis does.
    lethe.flip(erin)
    with pytest.raises(redis.exceptions.ResponseError, match="lethe:subject_suppressed"):
        r.execute_command("WATCH", f"{TENANT}:{erin}:s")
    mine = f"{TENANT}:{alice}:w"
    assert r.execute_command("WATCH", mine) in (True, "OK", b"OK")
    direct.set(mine, "changed", px=WEEK_MS)
    r.execute_command("MULTI")
    r.execute_command("SET", f"{TENANT}:{alice}:mine", "y")
    assert r.execute_command("EXEC") is None, "a readable key's write aborts the transaction"
