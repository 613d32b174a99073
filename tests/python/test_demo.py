"""`scripts/demo`, the README's first five minutes, run as a newcomer would (with the binary the
tests use): it must finish, show the erasure, and leave nothing it started running."""

import os
import re
import socket
import subprocess

from conftest import LETHE, REPO


def test_the_demo_erases_one_user_certifies_it_and_stops_what_it_started():
    env = {k: v for k, v in os.environ.items() if not k.startswith("LETHE_")}
    env["LETHE_BIN"] = str(LETHE)
    done = subprocess.run([str(REPO / "scripts" / "demo")], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    before, after = out.split("== Alice asks to be erased")
    assert "alice reads: ['is allergic to peanuts', 'prefers green tea in the morning']" in before
    assert "alice reads: []" in after and "bob reads: ['likes long walks on the beach'" in after
    assert "state after approval: suppressed" in after
    assert "counted straight in Chroma, bypassing Lethe: {'alice': 0, 'bob': 2}" in after
    assert re.search(r"chroma:chroma: held 2, deleted 2, remaining 0", after), after
    assert "valid: erasure " in after and "Demo finished" in after
    started = re.findall(r"http://127\.0\.0\.1:(\d+)", out)
    assert len(set(started)) >= 4, "Chroma, the provider and Lethe's two planes are named"
    for port in set(started):
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", int(port))) != 0, f"port {port} still answers after the demo"
