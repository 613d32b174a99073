"""What an SRE deploys Lethe with: the Kubernetes manifests (a sidecar beside an agent, and a shared
tier) are valid against the Kubernetes API's schemas, the configurations they carry pass `lethe
check-config`, their probes are the admin listener's, and none serves tokens in the clear off the
pod; the systemd unit's sandbox scores as systemd rates it; the Dockerfile runs a non-root
binary without a shell."""

import re
import subprocess
import tomllib

import pytest
import yaml

from conftest import LETHE, REPO

MANIFESTS = sorted((REPO / "deploy" / "kubernetes").glob("*/*.yaml"))


def documents():
    for path in MANIFESTS:
        for document in yaml.safe_load_all(path.read_text()):
            yield path, document


def lethe_configs():
    return [(path, text) for path, doc in documents() if doc["kind"] == "ConfigMap"
            for name, text in doc["data"].items() if name == "lethe.toml"]


def lethe_containers():
    for path, doc in documents():
        spec = doc.get("spec", {}).get("template", {}).get("spec", {})
        for container in spec.get("containers", []):
            if "lethe" in container["image"]:
                yield path, doc, container


def test_the_manifests_are_valid_kubernetes():
    assert len(MANIFESTS) >= 7
    done = subprocess.run([str(REPO / ".cache" / "venv" / "bin" / "kubernetes-validate"), "--strict",
                           "--kubernetes-version", "1.30.0", *map(str, MANIFESTS)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    kinds = {doc["kind"] for _, doc in documents()}
    assert {"Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy", "ConfigMap", "Job"} <= kinds


@pytest.mark.parametrize("index", range(2))
def test_every_configuration_in_the_manifests_passes_check_config(index, tmp_path):
    path, text = lethe_configs()[index]
    (tmp_path / "lethe.toml").write_text(text)
    done = subprocess.run([str(LETHE), "check-config", str(tmp_path / "lethe.toml")], capture_output=True, text=True)
    assert done.returncode == 0, f"{path}: {done.stdout}{done.stderr}"


def test_no_manifest_serves_tokens_in_the_clear_off_the_pod():
    for path, text in lethe_configs():
        config = tomllib.loads(text)
        for plane in ("data_plane", "control_plane"):
            section = config.get(plane, {})
            local = section.get("listen", "127.0.0.1").startswith("127.0.0.1")
            assert local or "tls" in section, f"{path}: {plane} listens off the pod in the clear"
        assert config["admin"]["listen"] == "0.0.0.0:7402", path


def test_probes_are_the_admin_listeners_and_containers_run_unprivileged():
    containers = list(lethe_containers())
    assert len(containers) == 3
    for path, doc, container in containers:
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] and not security["allowPrivilegeEscalation"], path
        assert security["capabilities"]["drop"] == ["ALL"], path
        assert doc["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"], path
        if container["args"] == ["serve"]:
            ports = {p["name"]: p["containerPort"] for p in container["ports"]}
            assert ports["admin"] == 7402, path
            assert container["livenessProbe"]["httpGet"] == {"path": "/live", "port": "admin"}, path
            assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "admin"}, path
        else:
            assert container["args"] == ["migrate"], path


def test_the_systemd_unit_is_sandboxed():
    done = subprocess.run(["systemd-analyze", "security", "--offline=true",
                           str(REPO / "deploy" / "systemd" / "lethe.service")], capture_output=True, text=True)
    score = re.search(r"Overall exposure level for lethe.service: ([0-9.]+)", done.stdout)
    assert score, done.stdout + done.stderr
    assert float(score.group(1)) <= 2.0, done.stdout


def test_the_image_runs_the_binary_as_a_non_root_user_without_a_shell():
    stages = (REPO / "Dockerfile").read_text().split("\nFROM ")
    final = stages[-1]
    assert final.startswith("gcr.io/distroless/"), "no shell, no package manager"
    assert re.search(r"^USER 65532:65532$", final, re.M)
    assert re.search(r'^ENTRYPOINT \["/usr/local/bin/lethe"\]$', final, re.M), "exec form"
    assert "--locked" in stages[-2], "built with the locked dependencies"
