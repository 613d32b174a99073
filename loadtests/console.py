"""Page timings of the compliance console with REQUESTS erasure requests in the state store
(SQLite, or with STATE=postgres://... a fresh database on that PostgreSQL server): each page
fetched N times, one after another, by a signed-in person; p50 and p99 of the whole exchange on
the loopback (the server's time plus a few tens of microseconds). Started by
loadtests/console.sh."""

import json
import os
import pathlib
import sys
import tempfile
import time
import urllib.parse
import urllib.request

from lethe_process import Lethe

REQUESTS = int(os.environ.get("REQUESTS", 10_000))
N = int(os.environ.get("N", 200))
STATE = os.environ.get("STATE")


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args):
        return None


def spread(state):
    """Receipts spread over the last 120 days and every tenth deadline extended, as a busy
    tenant's would be: the deadline filters then have requests to find. `state`: the SQLite
    file, or the PostgreSQL database's URL."""
    import calendar
    import datetime

    def months_after(at, months):
        year, month = divmod(at.month - 1 + months, 12)
        year, month = at.year + year, month + 1
        return at.replace(year=year, month=month, day=min(at.day, calendar.monthrange(year, month)[1]))

    if str(state).startswith("postgres"):
        import psycopg
        db, mark, stamp = psycopg.connect(state), "%s", lambda at: at
    else:
        import sqlite3
        # sqlx's text form of a timestamp, which the store compares as text.
        db, mark, stamp = sqlite3.connect(state), "?", lambda at: at.strftime("%Y-%m-%dT%H:%M:%S.%f+00:00")
    now = datetime.datetime.now(datetime.timezone.utc)
    ids = [row[0] for row in db.execute("SELECT id FROM erasure_requests ORDER BY requested_at").fetchall()]
    rows = []
    for i, request_id in enumerate(ids):
        received = now - datetime.timedelta(days=i % 120, minutes=i)
        extended = 2 if i % 10 == 0 else 0
        at, due = stamp(received), stamp(months_after(received, 1 + extended))
        rows.append((at, due, extended, "load" if extended else None, "dpo" if extended else None, at if extended else None, request_id))
    db.cursor().executemany("UPDATE erasure_requests SET requested_at = {0}, due_at = {0}, extended_months = {0}, extension_reason = {0}, extended_by = {0}, extended_at = {0} WHERE id = {0}".format(mark), rows)
    db.commit()
    db.close()


def main():
    work = pathlib.Path(tempfile.mkdtemp())
    database = None
    if STATE:
        import uuid
        import psycopg
        database = f"lethe_console_load_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(STATE, autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {database}")
    state = STATE and STATE.rsplit("/", 1)[0] + "/" + database
    lethe = Lethe(work, "", state)
    control, token = lethe.control, lethe.token
    try:
        def api(method, path, body):
            request = urllib.request.Request(f"http://{control}{path}", method=method, data=json.dumps(body).encode(),
                                             headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
            with urllib.request.urlopen(request) as answer:
                return json.loads(answer.read())

        started = time.perf_counter()
        first = None
        for i in range(REQUESTS):
            filed = api("POST", "/v1/erasures", {"subject": f"subject-{i}", "ticket": f"DSR-{i}", "reason": "load"})
            first = first or filed["id"]
        seeded = time.perf_counter() - started
        spread(state or lethe.work / "state.db")
        opener = urllib.request.build_opener(NoRedirect)
        try:
            opener.open(urllib.request.Request(f"http://{control}/console/sign-in", method="POST",
                                               data=urllib.parse.urlencode({"token": token}).encode()))
        except urllib.error.HTTPError as redirect:
            cookie = redirect.headers["Set-Cookie"].split(";")[0]
        pages = {
            "requests (first page)": "/console/requests",
            "requests, filtered (overdue)": "/console/requests?due=overdue",
            "requests, due within 7 days": "/console/requests?due=week",
            "requests, page 50": "/console/requests?page=50",
            "a request": f"/console/requests/{first}",
            "a subject": "/console/subjects?subject=subject-1",
            "audit (first page)": "/console/audit",
        }
        with urllib.request.urlopen(urllib.request.Request(f"http://{control}/console/requests", headers={"Cookie": cookie})) as answer:
            page = answer.read().decode()
        csrf = page.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        # A POST: the dry run (with no store configured here, lineage and its audit event only).
        forms = {"dry run (lineage only)": ("/console/requests/dry-run",
                                            urllib.parse.urlencode({"csrf": csrf, "subject": "subject-1"}).encode())}
        backend = "PostgreSQL" if STATE else "SQLite"
        print(f"\n{REQUESTS} erasure requests in the {backend} state store (seeded in {seeded:.0f} s), {N} fetches of each page\n")
        print(f"{'page':<30} {'p50':>9} {'p99':>9} {'bytes':>8}")
        fetches = {name: (path, None) for name, path in pages.items()} | forms
        for name, (path, form) in fetches.items():
            times, size = [], 0
            for _ in range(N):
                t = time.perf_counter()
                with urllib.request.urlopen(urllib.request.Request(f"http://{control}{path}", data=form,
                                                                   headers={"Cookie": cookie})) as answer:
                    size = len(answer.read())
                    assert answer.status == 200
                times.append((time.perf_counter() - t) * 1000)
            times.sort()
            print(f"{name:<30} {times[len(times) // 2]:>7.2f}ms {times[int(len(times) * 0.99)]:>7.2f}ms {size:>8}")
    finally:
        lethe.stop()
        if database:
            import psycopg
            with psycopg.connect(STATE, autocommit=True) as admin:
                admin.execute(f"DROP DATABASE {database} WITH (FORCE)")


if __name__ == "__main__":
    sys.exit(main())
