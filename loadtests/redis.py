"""The Redis route's cost: the same redis-benchmark load (SET, GET and, with VERBS=LPUSH, a chat
history's LPUSH, on keys of one consented subject, random among 10 000) sent straight to Redis and through Lethe's RESP listener, in one
run. For each: requests/s, p50 and p99 (redis-benchmark's own), Lethe's CPU per request, and
Redis' own CPU per request when loaded directly (from /proc), with their ratio; and, when socat
is installed, the requests/s through a bare forwarder that decides nothing (socat), the most any
proxy on the same machine could keep of Redis' own throughput. Started by
loadtests/redis.sh; N requests over C connections (default 50 000 over 20), PIPELINE commands per
round trip (default 1)."""

import csv
import shutil
import io
import os
import pathlib
import subprocess
import tempfile
import time
import urllib.request
import json

from lethe_process import LETHE, Lethe, port

N = int(os.environ.get("N", 50_000))
C = int(os.environ.get("C", 20))
PIPELINE = int(os.environ.get("PIPELINE", 1))
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def redis_pid():
    return int(subprocess.run(["pgrep", "-o", "redis-server"], capture_output=True, text=True, check=True).stdout)


def bench(port_, command, auth=()):
    args = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port_), "-n", str(N), "-c", str(C), "-P", str(PIPELINE),
            "-r", "10000", "--csv", *auth, *command]
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"redis-benchmark failed: {done.stderr.strip() or done.stdout.strip()}")
    out = done.stdout
    rows = [r for r in csv.reader(io.StringIO(out)) if r and r[0] != "test"]
    row = rows[-1]
    return {"rps": float(row[1]), "p50": float(row[4]), "p99": float(row[6])}


def main():
    work = pathlib.Path(tempfile.mkdtemp())
    listen = f"127.0.0.1:{port()}"
    lethe = Lethe(work, f'''
[[routes]]
name = "sessions"
adapter = "redis"
listen = "{listen}"
upstream = "redis://127.0.0.1:6379"
keys = [{{ pattern = "{{tenant}}:{{subject}}:*", purpose = "support", category = "conversation" }}]
''')
    forwarder = None
    try:
        def api(method, path, body):
            request = urllib.request.Request(f"http://{lethe.control}{path}", method=method, data=json.dumps(body).encode(),
                                             headers={"Authorization": f"Bearer {lethe.token}",
                                                      "Content-Type": "application/json"})
            with urllib.request.urlopen(request) as answer:
                return json.loads(answer.read())
        api("PUT", "/v1/retention-rules", {"rules": [{"purpose": "support", "category": "conversation", "max_age": "30d"}]})
        api("POST", "/v1/consents", {"subject": "u1", "purpose": "support", "category": "conversation",
                                     "actions": ["store", "retrieve"], "source": "load test", "policy_version": 1})
        agent = subprocess.run([LETHE, "token", "--role", "agent", "--tenant", "acme", "--subject", "u1"],
                               env=lethe.env, capture_output=True, text=True, check=True).stdout.strip()
        auth = ("--user", "agent", "-a", agent)
        print(f"{N} requests over {C} connections, {PIPELINE} per round trip; 10 000 keys of one subject\n")
        if shutil.which("socat"):
            forwarder_port = port()
            forwarder = subprocess.Popen(["socat", f"TCP-LISTEN:{forwarder_port},fork,reuseaddr,bind=127.0.0.1",
                                          "TCP:127.0.0.1:6379"])
        print("| command | direct req/s | via req/s | via / direct | bare forwarder req/s | p50 direct -> via (ms) "
              "| p99 direct -> via (ms) | Redis CPU/req direct (us) | Lethe CPU/req (us) | Redis CPU/req via (us) "
              "| ratio Lethe/Redis |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        redis = redis_pid()
        host_port = int(listen.split(":")[1])
        # Keys of their own for each side: a key written around Lethe has no deadline, and Lethe
        # refuses to write over it (unstamped_item).
        run = os.getpid()
        for verb, *rest in [c for c in (["SET", "a-cached-answer-of-about-40-bytes-long.."], ["GET"],
                                       ["LPUSH", "a-chat-message-of-about-40-bytes-long..."]) if c[0] in os.environ.get("VERBS", "SET GET").split()]:
            # GET reads the keys SET wrote; a list is never written where a string is.
            family = "SET" if verb == "GET" else verb
            command = lambda side: [verb, f"acme:u1:{run}-{family}-{side}-__rand_int__", *rest]  # noqa: E731
            r0 = cpu_seconds(redis)
            direct = bench(6379, command("direct"))
            redis_direct = (cpu_seconds(redis) - r0) / N * 1e6
            r0, l0 = cpu_seconds(redis), cpu_seconds(lethe.process.pid)
            via = bench(host_port, command("lethe"), auth)
            redis_via = (cpu_seconds(redis) - r0) / N * 1e6
            lethe_cpu = (cpu_seconds(lethe.process.pid) - l0) / N * 1e6
            bare = f"{bench(forwarder_port, command('bare'))['rps']:.0f}" if forwarder else "-"
            print(f"| {verb} | {direct['rps']:.0f} | {via['rps']:.0f} | {via['rps'] / direct['rps']:.2f} | {bare} "
                  f"| {direct['p50']:.3f} -> {via['p50']:.3f} "
                  f"| {direct['p99']:.3f} -> {via['p99']:.3f} | {redis_direct:.1f} | {lethe_cpu:.1f} | {redis_via:.1f} "
                  f"| {lethe_cpu / max(redis_direct, 0.001):.1f}x |")
        rss = int(pathlib.Path(f"/proc/{lethe.process.pid}/status").read_text().split("VmRSS:")[1].split()[0])
        print(f"\nLethe's resident memory after the run: {rss / 1024:.0f} MB")
    finally:
        if forwarder:
            forwarder.terminate()
        lethe.stop()


if __name__ == "__main__":
    main()
