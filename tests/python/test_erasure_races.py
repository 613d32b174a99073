"""Erasure under stress: writers racing the flip, and a Lethe killed in the middle of a purge."""

import subprocess
import threading
import time
import uuid

import chromadb

from conftest import own_lethe, wait_for


def erase(instance, subject):
    status, filed = instance.call("POST", "/v1/erasures", {"subject": subject, "ticket": "DSR-R", "reason": "art. 17"})
    assert status == 201, filed
    status, body = instance.call("POST", f"/v1/erasures/{filed['id']}/approve")
    assert status == 200, body
    return filed["id"]


def completed(instance, request_id, deadline=60):
    progress = lambda: instance.call("GET", f"/v1/erasures/{request_id}")[1]
    try:
        return wait_for("the erasure to complete", lambda: (r := progress())["state"] == "completed" and r, deadline=deadline)
    except AssertionError:
        print(progress())
        raise


def test_writers_racing_the_erasure_never_leave_an_item_behind_or_readable(chroma, tmp_path):
    instance = own_lethe(chroma, tmp_path, '[erasure]\nretry_backoff = "200ms"\n')
    host, port = chroma.removeprefix("http://").split(":")
    try:
        name = f"race-{uuid.uuid4().hex[:8]}"
        instance.client(instance.token("admin")).create_collection(name, embedding_function=None)
        stored = chromadb.HttpClient(host=host, port=int(port)).get_collection(name)
        rounds, accepted_in_all = 8, 0
        for round_ in range(rounds):
            s = f"racer-{round_}-{uuid.uuid4().hex[:6]}"
            instance.grant(s)
            accepted, refusals, unexpected = [], [], []

            def writer(w):
                collection = instance.agent(s).get_collection(name)
                for i in range(10_000):
                    record = f"{s}-w{w}-{i}"
                    try:
                        collection.add(ids=[record], embeddings=[[0.1, 0.2, float(i)]], documents=[f"memory {i}"])
                        accepted.append(record)
                    except Exception as e:  # the refusal that ends this writer
                        (refusals if "subject_suppressed" in str(e) or "stale_epoch" in str(e) else unexpected).append(str(e))
                        return

            writers = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
            for t in writers:
                t.start()
            wait_for("writes before the flip", lambda: len(accepted) >= 5, deadline=20)
            request = erase(instance, s)
            # Readable by nobody from the very next request on.
            assert instance.agent().get_collection(name).get(where={"lethe_subject": s})["ids"] == []
            for t in writers:
                t.join(timeout=30)
            assert not unexpected, unexpected[:3]
            assert len(refusals) == 3, "every writer was refused once the subject was suppressed"
            completed(instance, request)
            # Counted straight in Chroma: nothing of the subject, whatever was accepted.
            assert stored.get(where={"lethe_subject": s})["ids"] == []
            assert stored.get(ids=accepted)["ids"] == []
            accepted_in_all += len(accepted)
        print(f"\nracing writers: {rounds} rounds, {accepted_in_all} writes accepted before the flips, 0 left")
    finally:
        instance.stop()


def test_a_lethe_killed_in_the_middle_of_a_purge_completes_it_after_a_restart(chroma, tmp_path):
    s = f"crash-{uuid.uuid4().hex[:8]}"
    redis = lambda *args: subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", "6379", *args],
                                         check=True, capture_output=True, text=True).stdout
    keys = 300_000
    commands = "".join(f"SET acme:{s}:k{i} v\r\n" for i in range(keys))
    subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", "6379", "--pipe"], input=commands, text=True,
                   check=True, capture_output=True)
    count = lambda: len(redis("--scan", "--pattern", f"acme:{s}:*").split())
    assert count() == keys
    instance = own_lethe(chroma, tmp_path, '''
[erasure]
retry_backoff = "200ms"
settle = "100ms"
job_lease = "2s"
[[erasure.redis]]
name = "sessions"
urls = ["redis://127.0.0.1:6379"]
patterns = ["{tenant}:{subject}:*"]
''')
    try:
        size = lambda: int(redis("DBSIZE"))
        before = size()
        request = erase(instance, s)
        # Killed once the first keys are unlinked: in the middle of the deletion.
        deadline = time.monotonic() + 30
        while size() == before and time.monotonic() < deadline:
            time.sleep(0.002)
        instance.kill()
        left = count()
        assert 0 < left < keys, f"killed in the middle of the purge ({left} of {keys} keys left)"
        instance.start()
        done = completed(instance, request)
        assert count() == 0
        target = next(t for t in done["targets"] if t["target"] == "redis:sessions")
        assert target["attempts"] == 2 and target["result"]["remaining"] == 0
        print(f"\nkilled mid-purge with {left} of {keys} keys left; the restarted Lethe took the job over and completed")
    finally:
        instance.stop()
        leftovers = redis("--scan", "--pattern", f"acme:{s}:*").split()
        for i in range(0, len(leftovers), 1000):
            redis("DEL", *leftovers[i:i + 1000])
