"""What an SRE watches Lethe with: the alert rules pass promtool's checks and unit tests, and a real
Prometheus (Debian's) scraping a running, loaded Lethe's admin listener evaluates every alert
rule without error, holds the alerts the load should raise, and answers every query of the
Grafana dashboard with data."""

import json
import subprocess
import time
import urllib.parse

import httpx
import pytest

from conftest import REPO, TENANT, free_port, own_lethe, served, wait_for

RULES = REPO / "deploy" / "prometheus"
DASHBOARD = REPO / "deploy" / "grafana" / "lethe.json"


def test_the_alert_rules_pass_promtool():
    for argv in (["promtool", "check", "rules", "alerts.yml"], ["promtool", "test", "rules", "alerts_test.yml"]):
        done = subprocess.run(argv, cwd=RULES, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "SUCCESS" in done.stdout, done.stdout


@pytest.fixture(scope="module")
def observed(chroma, tmp_path_factory):
    """A Lethe whose Qdrant is down: every call to it fails, and so does its purge, at once."""
    erasure = '[erasure]\napprovals_required = 1\nmax_attempts = 1\nretry_backoff = "50ms"\nsettle = "50ms"\n'
    instance = own_lethe(chroma, tmp_path_factory.mktemp("observed"), erasure, qdrant_url="http://127.0.0.1:9")
    yield instance
    instance.stop()


def traffic(instance, served, refused, failed):
    """Requests served, refused (no token) and failed upstream (Qdrant is down)."""
    data = f"http://{instance.data}"
    agent = {"Authorization": f"Bearer {instance.token('agent')}"}
    with httpx.Client(timeout=10) as client:
        for _ in range(served):
            assert client.get(f"{data}/chroma/api/v2/heartbeat", headers=agent).status_code == 200
        for _ in range(refused):
            assert client.get(f"{data}/chroma/api/v2/heartbeat").status_code == 401
        for _ in range(failed):
            assert client.get(f"{data}/qdrant/collections", headers=agent).status_code == 502


def exception(instance):
    """An erasure request whose Qdrant purge gives up at once."""
    status, filed = instance.call("POST", "/v1/erasures", {"subject": "u-obs", "ticket": "T", "reason": "r"})
    assert status == 201, filed
    status, approved = instance.call("POST", f"/v1/erasures/{filed['id']}/approve")
    assert status == 200, approved
    wait_for("the request in exception",
             lambda: instance.call("GET", f"/v1/erasures/{filed['id']}")[1]["state"] == "exception")


@pytest.fixture(scope="module")
def prometheus(observed, tmp_path_factory):
    """Prometheus scraping the admin listener every second and evaluating the alert rules every
    second, from before the load to after it."""
    folder = tmp_path_factory.mktemp("prometheus")
    port = free_port()
    (folder / "prometheus.yml").write_text(json.dumps({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES / "alerts.yml")],
        "scrape_configs": [{"job_name": "lethe", "static_configs": [{"targets": [observed.admin]}]}],
    }))
    url = f"http://127.0.0.1:{port}"
    argv = ["prometheus", f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}"]
    ready = lambda: httpx.get(f"{url}/-/ready").status_code == 200
    scrapes = lambda: sum(float(r["value"][1]) for r in query(url, "count_over_time(lethe_state_store_up[5m])"))
    # Every series exists before the first scrape: a counter first seen at 400 counts no increase.
    traffic(observed, 1, 1, 1)
    with served("Prometheus", argv, folder, ready, 60):
        wait_for("two scrapes before the load", lambda: scrapes() >= 2)
        # Enough to pass the alerts' thresholds (rates over five minutes: 1.3 refusals and 0.2
        # upstream failures a second).
        traffic(observed, 10, 400, 60)
        exception(observed)
        after = scrapes()
        wait_for("three scrapes after it", lambda: scrapes() >= after + 3)
        yield url


def query(url, expr):
    answer = httpx.get(f"{url}/api/v1/query", params={"query": expr}).json()
    assert answer["status"] == "success", (expr, answer)
    return answer["data"]["result"]


def test_prometheus_scrapes_the_admin_listener_and_every_alert_rule_evaluates(prometheus):
    targets = httpx.get(f"{prometheus}/api/v1/targets").json()["data"]["activeTargets"]
    assert [t["health"] for t in targets] == ["up"], targets
    wait_for("every rule evaluated", lambda: all(
        rule.get("lastEvaluation", "").startswith("20") for group in rules(prometheus) for rule in group["rules"]))
    for group in rules(prometheus):
        for rule in group["rules"]:
            assert rule["health"] == "ok", rule
    # The load raises these three (each waits out its `for` as pending).
    raised = lambda: {a["labels"]["alertname"] for a in
                      httpx.get(f"{prometheus}/api/v1/alerts").json()["data"]["alerts"]}
    expected = {"LetheErasureException", "LetheRefusalsSpike", "LetheUpstreamErrors"}
    try:
        wait_for("the alerts the load raises", lambda: expected <= raised())
    except AssertionError:
        exprs = [r["query"] for g in rules(prometheus) for r in g["rules"]]
        raise AssertionError(f"raised {raised()}; " + "; ".join(f"{e} -> {query(prometheus, e)}" for e in exprs))
    alerts = httpx.get(f"{prometheus}/api/v1/alerts").json()["data"]["alerts"]
    upstream = [a for a in alerts if a["labels"]["alertname"] == "LetheUpstreamErrors"]
    assert [a["labels"]["lethe_route"] for a in upstream] == ["qdrant"], upstream
    assert "LetheStateStoreDown" not in raised() and "LetheErasureOverdue" not in raised()


def rules(url):
    return httpx.get(f"{url}/api/v1/rules").json()["data"]["groups"]


def test_every_dashboard_query_returns_data(prometheus):
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    assert len(exprs) == len(dashboard["panels"]) >= 10
    for expr in exprs:
        assert query(prometheus, expr), f"no data for {expr}"
    # No tenant, subject or collection reaches a series.
    series = httpx.get(f"{prometheus}/api/v1/series", params={"match[]": '{job="lethe"}'}).json()["data"]
    labels = {value for s in series for value in s.values()}
    assert TENANT not in labels and "u-obs" not in labels, sorted(labels)
