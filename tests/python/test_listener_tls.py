"""TLS on Lethe's own listeners: the data plane, the control plane (console and API) and the admin
listener serve TLS 1.2+ with a certificate from files, read again when the files change; the admin
listener takes only clients with a certificate its CA signed; nothing is served in the clear on a
TLS port."""

import os
import socket
import ssl
import subprocess
import time

import httpx
import pytest

from conftest import LETHE, certificates, free_port, new_database, wait_for


def client_certificate(folder):
    """A client certificate the test CA signs (openssl)."""
    run = lambda *args: subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("req", *ec, "-keyout", "client.key", "-out", "client.csr", "-subj", "/CN=prometheus")
    (folder / "client.ext").write_text("basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\n"
                                       "extendedKeyUsage=clientAuth\n")
    run("x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "client.pem", "-days", "2", "-extfile", "client.ext")
    return folder / "client.pem", folder / "client.key"


def trusting(ca, client=None):
    """A client's TLS: the test CA trusted, and `client` (certificate, key) presented if given."""
    context = ssl.create_default_context(cafile=ca)
    if client:
        context.load_cert_chain(*client)
    return context


def reissue(folder, name):
    """A new certificate for 127.0.0.1 (with a new serial and `name`), put in place of leaf.pem
    and leaf.key as a deployment's renewal would: written aside, then moved."""
    run = lambda *args: subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("req", *ec, "-keyout", "next.key", "-out", "next.csr", "-subj", f"/CN={name}")
    run("x509", "-req", "-in", "next.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "next.pem", "-days", "2", "-extfile", "leaf.ext")
    os.replace(folder / "next.key", folder / "leaf.key")
    os.replace(folder / "next.pem", folder / "leaf.pem")


@pytest.fixture(scope="module")
def served(chroma, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tls")
    ca, leaf, key = certificates(folder)
    client = client_certificate(folder)
    data, control, admin = (f"127.0.0.1:{free_port()}" for _ in range(3))
    tls = f'cert = "{leaf}"\nkey = "{key}"\n'
    config = folder / "lethe.toml"
    config.write_text(f'''
[data_plane]
listen = "{data}"
[data_plane.tls]
{tls}
[control_plane]
listen = "{control}"
[control_plane.tls]
{tls}
[admin]
listen = "{admin}"
[admin.tls]
{tls}client_ca = "{ca}"

[[routes]]
name = "chroma"
prefix = "/chroma"
upstream = "{chroma}"
adapter = "chroma"
''')
    env = {k: v for k, v in os.environ.items() if not k.startswith("LETHE_")}
    env.update({"LETHE_CONFIG": str(config), "LETHE_STATE_URL": new_database(), "LETHE_LOG": "warn"})
    subprocess.run([str(LETHE), "migrate"], cwd=folder, env=env, check=True, capture_output=True)
    process = subprocess.Popen([str(LETHE), "serve"], cwd=folder, env=env)
    live = lambda: httpx.get(f"https://{admin}/live", verify=trusting(str(ca), tuple(map(str, client)))).status_code == 200
    try:
        wait_for("lethe over TLS", live)
        token = lambda role: subprocess.run([str(LETHE), "token", "--role", role, "--tenant", "acme"], cwd=folder,
                                            env=env, check=True, capture_output=True, text=True).stdout.strip()
        yield {"folder": folder, "ca": str(ca), "client": tuple(map(str, client)), "data": data,
               "control": control, "admin": admin, "token": token}
    finally:
        process.terminate()
        process.wait(timeout=15)


def served_certificate(address, ca):
    """The certificate the listener at `address` presents (DER)."""
    host, port = address.split(":")
    context = ssl.create_default_context(cafile=ca)
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname=host) as tls:
            return tls.getpeercert(binary_form=True)


def test_every_listener_serves_tls(served):
    agent = {"Authorization": f"Bearer {served['token']('agent')}"}
    answer = httpx.get(f"https://{served['data']}/chroma/api/v2/heartbeat", headers=agent, verify=trusting(served["ca"]))
    assert answer.status_code == 200, answer.text
    assert answer.http_version == "HTTP/1.1"
    compliance = {"Authorization": f"Bearer {served['token']('compliance')}"}
    answer = httpx.get(f"https://{served['control']}/v1/consents?subject=u-tls", headers=compliance,
                       verify=trusting(served["ca"]))
    assert answer.status_code == 200, answer.text
    answer = httpx.get(f"https://{served['admin']}/metrics", verify=trusting(served["ca"], served["client"]))
    assert answer.status_code == 200 and "lethe_open_connections" in answer.text


@pytest.mark.parametrize("listener", ["data", "control", "admin"])
def test_nothing_is_served_in_the_clear_on_a_tls_port(served, listener):
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://{served[listener]}/healthz", timeout=5)


def test_the_admin_listener_takes_only_clients_its_ca_signed(served):
    with pytest.raises((httpx.HTTPError, ssl.SSLError)):
        httpx.get(f"https://{served['admin']}/live", verify=trusting(served["ca"]), timeout=5)
    # A certificate the client made for itself is no better.
    folder = served["folder"]
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", "self.key", "-out", "self.pem", "-days", "1", "-subj", "/CN=intruder"],
                   cwd=folder, check=True, capture_output=True)
    with pytest.raises((httpx.HTTPError, ssl.SSLError)):
        httpx.get(f"https://{served['admin']}/live", timeout=5,
                  verify=trusting(served["ca"], (str(folder / "self.pem"), str(folder / "self.key"))))


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion:DeprecationWarning")
def test_versions_before_tls_1_2_are_refused(served):
    host, port = served["data"].split(":")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(served["ca"])
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    context.minimum_version = ssl.TLSVersion.TLSv1
    context.maximum_version = ssl.TLSVersion.TLSv1_1
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        with pytest.raises(ssl.SSLError):
            context.wrap_socket(raw, server_hostname=host)


def test_a_renewed_certificate_is_served_without_a_restart(served):
    before = {name: served_certificate(served[name], served["ca"]) for name in ("data", "control")}
    reissue(served["folder"], "127.0.0.1 renewed")
    for name in ("data", "control"):
        wait_for(f"the {name} listener's renewed certificate",
                 lambda: served_certificate(served[name], served["ca"]) != before[name], deadline=15)
    # Connections made since verify against the same CA, and requests still pass.
    answer = httpx.get(f"https://{served['control']}/healthz", verify=trusting(served["ca"]))
    assert answer.status_code == 200
