"""Lethe's first five minutes: a real Chroma and the provider stand-in beside Lethe (embedded
SQLite state store), a small agent using the official `chromadb` and `openai` clients for two
users, one of whom is erased. Prints what each user can read before and after, the purge, the
certificate and `lethe certificate verify`'s verdict; stops everything it started.

Run through `scripts/demo`, which makes the venv and builds `lethe`. Exits 1, saying why, when
something does not behave as printed."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import chromadb
import openai
from chromadb.config import Settings

REPO = Path(__file__).resolve().parents[1]
LETHE = os.environ.get("LETHE_BIN") or str(REPO / "target" / "debug" / "lethe")
TENANT = "acme"
USERS = {
    "alice": ["prefers green tea in the morning", "is allergic to peanuts"],
    "bob": ["likes long walks on the beach", "runs a marathon every spring"],
}
MEMORY = {"X-Lethe-Purpose": "personalization", "X-Lethe-Category": "preference"}
CHAT = {"X-Lethe-Purpose": "support", "X-Lethe-Category": "conversation"}


class DemoFailed(Exception):
    pass


def expect(condition, what):
    if not condition:
        raise DemoFailed(what)


_handed_out = set()


def free_port():
    """A free port not handed out before: the kernel may give one port to two binds in a row."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def wait_for(what, check, deadline=60.0):
    """Polls `check` until it answers something truthy, or fails once the deadline passes."""
    end = time.monotonic() + deadline
    last = None
    while time.monotonic() < end:
        try:
            value = check()
            if value:
                return value
        except Exception as e:  # not up yet
            last = e
        time.sleep(0.1)
    raise DemoFailed(f"{what} not within {deadline:.0f} s (last error: {last})")


def status_of(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status
    except urllib.error.HTTPError as e:
        return e.code


def step(text):
    print(f"\n== {text}", flush=True)


class Demo:
    def __init__(self, home):
        self.home = home
        self.processes = []
        self.chroma = f"http://127.0.0.1:{free_port()}"
        self.provider = f"http://127.0.0.1:{free_port()}"
        self.data = f"127.0.0.1:{free_port()}"
        self.control = f"127.0.0.1:{free_port()}"
        self.config = home / "lethe.toml"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("LETHE_")}
        self.env.update({"LETHE_CONFIG": str(self.config), "LETHE_LOG": "warn"})

    def start(self, name, args, ready_url):
        log = open(self.home / f"{name}.log", "w")
        process = subprocess.Popen(args, cwd=self.home, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self.processes.append((name, process, log))
        wait_for(f"{name} to answer at {ready_url}", lambda: process.poll() is None and status_of(ready_url) == 200)
        expect(process.poll() is None, f"{name} exited (see {self.home / (name + '.log')})")

    def stop(self):
        for name, process, log in reversed(self.processes):
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            log.close()
        self.processes.clear()

    def lethe(self, *args):
        """`lethe ARGS` with the demo's configuration; answers stdout, fails on a non-zero exit."""
        done = subprocess.run([LETHE, *args], cwd=self.home, env=self.env, capture_output=True, text=True)
        expect(done.returncode == 0, f"lethe {' '.join(args[:2])} failed: {done.stderr.strip()}")
        return done.stdout

    def show(self, *args):
        """Prints the command a user would type, runs it and answers its output."""
        shown = " ".join(a if " " not in a else repr(a) for a in args)
        print(f"   $ lethe {shown}")
        return self.lethe(*args)

    def memories(self, token):
        client = chromadb.HttpClient(host=f"http://{self.data}/chroma",
                                     headers={"Authorization": f"Bearer {token}", **MEMORY},
                                     settings=Settings(anonymized_telemetry=False))
        return client.get_collection("memories", embedding_function=None)

    def model(self, token):
        return openai.OpenAI(base_url=f"http://{self.data}/openai/v1", api_key=token,
                             default_headers=CHAT, max_retries=0, timeout=30)

    def run(self):
        step("Starting a real Chroma, the OpenAI-compatible provider stand-in and Lethe")
        chroma_bin = shutil.which("chroma") or str(Path(sys.executable).parent / "chroma")
        self.start("chroma", [chroma_bin, "run", "--path", str(self.home / "chroma"), "--port",
                              self.chroma.rsplit(":", 1)[1]], f"{self.chroma}/api/v2/heartbeat")
        self.start("provider", [sys.executable, str(REPO / "tests" / "python" / "openai_standin.py"),
                                self.provider.rsplit(":", 1)[1]], f"{self.provider}/v1/models")
        self.config.write_text(f"""\
[data_plane]
listen = "{self.data}"

[control_plane]
listen = "{self.control}"

[admin]
listen = "127.0.0.1:{free_port()}"

[erasure]
settle = "200ms"
retry_backoff = "200ms"

# Chroma's backups, as this deployment keeps them: the certificate dates the last copy.
[[erasure.backups]]
target = "chroma:chroma"
retention = "7d"

[[routes]]
name = "chroma"
prefix = "/chroma"
upstream = "{self.chroma}"
adapter = "chroma"

[[routes]]
name = "openai"
prefix = "/openai"
upstream = "{self.provider}"
adapter = "openai"
retention_window = "30d"
credential = {{ header = "authorization", value = {{ value = "Bearer sk-standin" }} }}
""")
        self.start("lethe", [LETHE, "serve"], f"http://{self.control}/readyz")
        print(f"   Chroma {self.chroma}, provider {self.provider}")
        print(f"   Lethe: data plane http://{self.data}, control plane http://{self.control}, "
              f"state store {self.home / '.lethe' / 'state.db'}")

        step("Compliance sets a retention rule and records each user's consent")
        dpo = self.lethe("token", "--role", "compliance", "--tenant", TENANT).strip()
        rules = {"rules": [{"purpose": "personalization", "category": "preference", "max_age": "365d"},
                           {"purpose": "support", "category": "conversation", "max_age": "30d"}]}
        request = urllib.request.Request(f"http://{self.control}/v1/retention-rules", method="PUT",
                                         data=json.dumps(rules).encode(),
                                         headers={"Authorization": f"Bearer {dpo}",
                                                  "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            expect(answer.status == 200, "the retention rules were not accepted")
        print("   retention: preferences 365 days, conversations 30 days")
        for user in USERS:
            self.show("consent", "grant", "--tenant", TENANT, "--subject", user, "--purpose", "personalization",
                      "--category", "preference", "--actions", "store,retrieve", "--source", "signup-form")
            self.show("consent", "grant", "--tenant", TENANT, "--subject", user, "--purpose", "support",
                      "--category", "conversation", "--actions", "send_to_provider,provider_retention",
                      "--source", "signup-form")

        step("The agent writes each user's memories through Lethe (official chromadb client)")
        admin = self.lethe("token", "--role", "admin", "--tenant", TENANT).strip()
        chromadb.HttpClient(host=f"http://{self.data}/chroma", headers={"Authorization": f"Bearer {admin}"},
                            settings=Settings(anonymized_telemetry=False)
                            ).create_collection("memories", embedding_function=None)
        tokens = {user: self.lethe("token", "--role", "agent", "--tenant", TENANT, "--subject", user).strip()
                  for user in USERS}
        for user, texts in USERS.items():
            self.memories(tokens[user]).add(
                ids=[f"{user}-{i}" for i in range(len(texts))], documents=texts,
                embeddings=[[float(i), 1.0, 0.5] for i in range(len(texts))])
            print(f"   {user}: {len(texts)} memories stored, each stamped with its owner and expiry")

        step("Each user talks to the model through Lethe (official openai client); the provider keeps the answer")
        answers = {}
        for user, texts in USERS.items():
            response = self.model(tokens[user]).responses.create(model="gpt-test", input=f"Remember: {texts[0]}")
            answers[user] = response.id
            print(f"   {user}: response {response.id} stored by the provider: {response.store}")
        direct = chromadb.HttpClient(host=self.chroma.rsplit(":", 1)[0].removeprefix("http://"),
                                     port=int(self.chroma.rsplit(":", 1)[1]),
                                     settings=Settings(anonymized_telemetry=False))
        wait_for("the stored responses in lineage", lambda: all(self.inventory(dpo, user).get("openai") == 1
                                                                for user in USERS), deadline=15)

        step("What each user can read")
        before = self.readable(tokens)
        expect(before == {user: sorted(texts) for user, texts in USERS.items()},
               f"each user reads only their own memories (read {before})")

        step("Alice asks to be erased: compliance files and approves the request")
        filed = json.loads(self.show("erase", "--tenant", TENANT, "--subject", "alice",
                                     "--ticket", "DSR-1", "--reason", "GDPR art. 17 request"))
        started = time.monotonic()
        approved = json.loads(self.show("erase", "--tenant", TENANT, "--approve", filed["id"]))
        print(f"   state after approval: {approved['state']} "
              f"({(time.monotonic() - started) * 1000:.0f} ms after the approval was sent)")
        expect(approved["state"] == "suppressed", "the approval answers once the subject is suppressed")
        after = self.readable(tokens)
        expect(after.get("alice") == [] and after.get("bob") == sorted(USERS["bob"]),
               f"alice is gone from every read at once, bob keeps his memories (read {after})")
        try:
            self.memories(tokens["alice"]).add(ids=["alice-late"], documents=["a late write"],
                                               embeddings=[[0.0, 1.0, 0.5]])
            raise DemoFailed("a late write of alice's was accepted")
        except DemoFailed:
            raise
        except Exception as e:
            expect("subject_suppressed" in str(e), f"the late write is refused as suppressed ({e})")
            print("   alice's late write: refused (subject_suppressed), nothing reaches Chroma")

        step("The purge runs in the background, verified store by store")
        done = wait_for("the erasure to complete",
                        lambda: (s := json.loads(self.lethe("status", "--tenant", TENANT, filed["id"])))["state"]
                        == "completed" and s)
        for target in done["targets"]:
            result = target["result"]
            print(f"   {target['target']}: held {result.get('before')}, deleted {result.get('deleted')}, "
                  f"remaining {result.get('remaining')}")
            expect(result.get("remaining") == 0, f"{target['target']} verified empty")
        stored = {user: len(direct.get_collection("memories").get(where={"lethe_subject": user})["ids"])
                  for user in USERS}
        print(f"   counted straight in Chroma, bypassing Lethe: {stored}")
        expect(stored == {"alice": 0, "bob": len(USERS["bob"])}, "Chroma holds nothing of alice's, all of bob's")
        kept = {user: status_of(f"{self.provider}/v1/responses/{answers[user]}") for user in USERS}
        print(f"   the provider's stored responses (HTTP status asked straight): {kept}")
        expect(kept == {"alice": 404, "bob": 200}, "the provider deleted alice's response only")

        step("The certificate, checked as a third party would: the file and the public key")
        certificate = self.home / "certificate.json"
        # The signed bytes exactly: without the line end the command prints after them.
        certificate.write_text(self.show("certificate", "--tenant", TENANT, filed["id"]).rstrip("\n"))
        document = json.loads(certificate.read_text())["certificate"]
        expect("alice" not in certificate.read_text(), "the certificate names the subject only by its HMAC reference")
        print(f"   saved {certificate}: subject_ref {document['subject_ref'][:16]}..., "
              f"final backup expiry {document['final_backup_expiry']}")
        key = self.lethe("certificate", "public-key").strip()
        verdict = self.show("certificate", "verify", str(certificate), "--key", key)
        print("   " + verdict.strip().replace("\n", "\n   "))
        expect(verdict.startswith("valid:"), "the certificate verifies")

    def inventory(self, dpo, user):
        request = urllib.request.Request(f"http://{self.control}/v1/subjects/{TENANT}/{user}",
                                         headers={"Authorization": f"Bearer {dpo}"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.loads(answer.read())["inventory"]

    def readable(self, tokens):
        """What each user's own token reads back, printed and answered by user."""
        seen = {}
        for user, token in tokens.items():
            seen[user] = sorted(self.memories(token).get()["documents"])
            print(f"   {user} reads: {seen[user]}")
        return seen


def main():
    home = Path(tempfile.mkdtemp(prefix="lethe-demo-"))
    demo = Demo(home)
    try:
        demo.run()
    except DemoFailed as e:
        print(f"\nDEMO FAILED: {e} (logs and state kept in {home})", file=sys.stderr)
        return 1
    finally:
        demo.stop()
    print("\nDemo finished: alice is erased everywhere, bob is untouched, and the certificate verifies.")
    shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
