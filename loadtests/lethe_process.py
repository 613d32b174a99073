"""A Lethe of a load test's own: its configuration written to a scratch folder, started, waited
for, and a compliance token minted for it. Shared by the Python load tests."""

import os
import socket
import subprocess
import time
import urllib.request

LETHE = os.environ.get("LETHE", "target/release/lethe")


def port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class Lethe:
    """`serve` with `config` (TOML, without the listeners and the state store, which are added);
    the state store is a SQLite file in `work`, or the database at `state`."""

    def __init__(self, work, config, state=None):
        self.work = work
        self.control = f"127.0.0.1:{port()}"
        (work / "lethe.toml").write_text(f'''
[data_plane]
listen = "127.0.0.1:{port()}"
# Every load generator's connection comes from 127.0.0.1: one address may hold them all.
max_connections_per_address = 4096
[control_plane]
listen = "{self.control}"
[admin]
listen = "127.0.0.1:{port()}"
[state]
url = "{state or f'sqlite://{work}/state.db'}"
{config}''')
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("LETHE_")}
        self.env.update({"LETHE_CONFIG": str(work / "lethe.toml"), "LETHE_LOG": "warn"})
        # On PostgreSQL only `lethe migrate` changes the schema.
        subprocess.run([LETHE, "migrate"], env=self.env, check=True, stdout=subprocess.DEVNULL)
        self.process = subprocess.Popen([LETHE, "serve"], env=self.env)
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://{self.control}/readyz")
                break
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError("lethe did not become ready")
                time.sleep(0.1)
        self.token = subprocess.run([LETHE, "token", "--role", "compliance", "--tenant", "acme", "--actor", "dpo"],
                                    env=self.env, capture_output=True, text=True, check=True).stdout.strip()

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=15)
