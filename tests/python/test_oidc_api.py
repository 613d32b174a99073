"""The API and the CLI take the organisation's OpenID provider's tokens (`[auth.oidc]`): a person
signs the CLI in with `lethe login` through the real provider (npm's oidc-provider; its own device
code, login and consent pages, in Debian's Chromium), and every verb then acts as that person,
`<issuer>#<sub>`, as the console's sign-in does. Tokens the provider's key signed but that must
not pass (another audience, expired, not yet valid, no mapped group, another tenant), and tokens
that only claim the provider (another issuer, `alg: none`, HS256 keyed with its public key), are
refused, each counted in what Lethe answers."""

import base64
import hashlib
import hmac
import json
import os
import re
import stat
import subprocess
import time

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization

from conftest import GLOBEX, LETHE, REPO, TENANT, own_lethe, two_tenant_lethe, wait_for
from test_oidc import console_sign_in, openid_provider

API = "urn:lethe:api"
KEY = REPO / "data" / "tests" / "fixtures" / "keys" / "rs256.key"


@pytest.fixture(scope="module")
def idp(tmp_path_factory):
    """The provider, signing with the fixture key the tests hold too."""
    folder = tmp_path_factory.mktemp("idp-api")
    private = serialization.load_pem_private_key(KEY.read_bytes(), password=None)
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(private))
    jwk.update({"kid": "rsa-1", "alg": "RS256", "use": "sig"})
    (folder / "jwks.json").write_text(json.dumps({"keys": [jwk]}))
    with openid_provider(folder, folder / "jwks.json") as started:
        yield started


@pytest.fixture(scope="module")
def lethe(chroma, idp, tmp_path_factory):
    issuer, control, _ = idp
    access = f'''
[auth.oidc]
issuer = "{issuer}"
audience = "{API}"
cli_client_id = "lethe-cli"
cli_scopes = ["openid", "profile", "email", "offline_access", "lethe"]
resource = "{API}"
'''
    instance = two_tenant_lethe(chroma, tmp_path_factory.mktemp("lethe-oidc-api"),
                                console_sign_in(issuer, control) + access, control=control)
    yield instance
    instance.stop()


def cli(lethe, home, *args, **popen):
    """`lethe ARGS` as the person whose config directory is `home`: a process, still running."""
    env = {**lethe.env, "XDG_CONFIG_HOME": str(home)}
    argv = [str(LETHE), *args]
    if args[0] in ("erase", "status", "consent"):
        argv += ["--url", f"http://{lethe.control}"]
    return subprocess.Popen(argv, cwd=lethe.workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **popen)


def ran(process, timeout=60):
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def address_shown(process):
    """The first http:// address `lethe login` shows on stderr."""
    lines = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        assert line, f"lethe login ended without showing where to sign in: {''.join(lines)}"
        lines.append(line)
        found = re.search(r"(http://\S+?)\)?$", line.strip())
        if found:
            return found.group(1)
    raise AssertionError("no address shown")


def sign_in_at_provider(driver, who):
    """The provider's login and consent pages, as a person fills them in (any password)."""
    from selenium.webdriver.common.by import By
    wait_for("the provider's login page", lambda: driver.find_elements(By.NAME, "login"))
    driver.find_element(By.NAME, "login").send_keys(who)
    driver.find_element(By.NAME, "password").send_keys("any")
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait_for("the provider's consent page", lambda: "Continue" in driver.page_source)
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()


def logged_in(lethe, browsers, home, who):
    """`lethe login` with a device code, which `who` confirms in a real browser."""
    from selenium.webdriver.common.by import By
    process = cli(lethe, home, "login")
    driver = browsers()
    driver.get(address_shown(process))
    wait_for("the provider's device confirmation", lambda: "Confirm Device" in driver.page_source)
    driver.find_element(By.CSS_SELECTOR, "button[autofocus]").click()
    sign_in_at_provider(driver, who)
    wait_for("the provider's success page", lambda: "Sign-in Success" in driver.page_source)
    code, _, err = ran(process)
    assert code == 0, err
    assert "Signed in through" in err
    return home / "lethe" / "credentials.json"


def audit(lethe):
    status, page = lethe.call("GET", "/v1/audit?limit=1000", token=lethe.token("admin"))
    assert status == 200, page
    return page["items"]


def test_a_person_signs_the_cli_in_with_a_device_code_and_every_verb_acts_as_them(lethe, idp, browsers,
                                                                                  tmp_path):
    issuer, _, _ = idp
    alice, bob = tmp_path / "alice", tmp_path / "bob"
    kept = logged_in(lethe, browsers, alice, "dpo-alice")
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert stat.S_IMODE(kept.parent.stat().st_mode) == 0o700
    code, out, err = ran(cli(lethe, alice, "erase", "--subject", "u-cli-1", "--ticket", "DSR-7",
                             "--reason", "art. 17"))
    assert code == 0, err
    request = json.loads(out)
    filed = [e for e in audit(lethe) if e["target_ref"] == request["id"] and e["action"] == "erasure.request"]
    assert [e["actor"] for e in filed] == [f"{issuer}#dpo-alice"]
    # Approving needs a second factor here, which Alice's sign-in did not show.
    code, _, err = ran(cli(lethe, alice, "erase", "--approve", request["id"]))
    assert code == 1 and "second factor" in err, err
    # Bob signs in through a browser sent back to this machine; his sign-in showed a second
    # factor (amr otp), which approving needs here.
    process = cli(lethe, bob, "login", "--browser")
    driver = browsers()
    driver.get(address_shown(process))
    sign_in_at_provider(driver, "dpo-bob")
    wait_for("the loopback's answer", lambda: "Signed in" in driver.page_source)
    code, _, err = ran(process)
    assert code == 0, err
    code, out, err = ran(cli(lethe, bob, "erase", "--approve", request["id"]))
    assert code == 0, err
    assert json.loads(out)["approvals"] == [f"{issuer}#dpo-bob"], out
    # Signed out, the CLI acts as nobody: not as a development token's name either.
    code, _, err = ran(cli(lethe, alice, "logout"))
    assert code == 0 and not (alice / "lethe" / "credentials.json").exists()
    code, _, err = ran(cli(lethe, alice, "status", request["id"]))
    assert code == 2 and "lethe login" in err, err


def test_an_expiring_sign_in_is_renewed_and_credentials_others_can_read_are_refused(lethe, browsers, tmp_path):
    kept = logged_in(lethe, browsers, tmp_path / "carl", "dpo-carl")
    before = json.loads(kept.read_text())
    assert before["refresh_token"]
    before["expires_at"] = 0
    kept.write_text(json.dumps(before))
    code, out, err = ran(cli(lethe, tmp_path / "carl", "consent", "list", "--subject", "u-cli-2"))
    assert code == 0, err
    after = json.loads(kept.read_text())
    assert after["access_token"] != before["access_token"] and after["expires_at"] > time.time() + 60
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    # Verbs renewing at once spend the refresh token once: the provider rotates refresh tokens
    # and, seeing one spent twice, would end the whole sign-in.
    kept.write_text(json.dumps({**after, "expires_at": 0}))
    verbs = [cli(lethe, tmp_path / "carl", "consent", "list", "--subject", "u-cli-2") for _ in range(4)]
    for verb in verbs:
        code, _, err = ran(verb)
        assert code == 0, err
    assert json.loads(kept.read_text())["refresh_token"] != after["refresh_token"]
    os.chmod(kept, 0o644)
    code, _, err = ran(cli(lethe, tmp_path / "carl", "consent", "list", "--subject", "u-cli-2"))
    assert code == 2 and "others can read" in err, err


def signed(claims, headers=None):
    """A token signed with the provider's own key."""
    return jwt.encode(claims, KEY.read_bytes(), algorithm="RS256", headers={"kid": "rsa-1", **(headers or {})})


def unsigned(claims, alg, key=b""):
    """A token with header `alg`, HMAC-signed with `key` (or bare for `none`), built by hand: the
    libraries refuse to."""
    part = lambda value: base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()
    head = f"{part({'alg': alg, 'typ': 'JWT', 'kid': 'rsa-1'})}.{part(claims)}"
    if alg == "none":
        return head + "."
    mac = hmac.new(key, head.encode(), hashlib.sha256).digest()
    return head + "." + base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


def test_only_the_providers_valid_tokens_for_lethe_pass_and_each_acts_within_its_tenant(lethe, idp):
    issuer, _, _ = idp
    now = int(time.time())
    good = {"iss": issuer, "aud": API, "sub": "dpo-alice", "exp": now + 300, "iat": now,
            "groups": ["lethe-acme-dpo"], "jti": "at-ok"}
    reads = lambda token, tenant=TENANT: httpx.get(f"http://{lethe.control}/v1/consents?tenant={tenant}&subject=u-1",
                                                   headers={"Authorization": f"Bearer {token}"})
    assert reads(signed(good)).status_code == 200, "the provider's key signs what passes"
    public = serialization.load_pem_private_key(KEY.read_bytes(), password=None).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    refused = {
        "another audience": signed({**good, "aud": "urn:other:api"}),
        "the console's ID token audience": signed({**good, "aud": "lethe-console", "nonce": "n"}),
        "expired beyond the leeway": signed({**good, "exp": now - 120}),
        "not yet valid": signed({**good, "nbf": now + 600}),
        "no mapped group": signed({**good, "groups": ["staff"]}),
        "no sub": signed({k: v for k, v in good.items() if k != "sub"}),
        "another issuer": signed({**good, "iss": "http://127.0.0.1:1"}),
        "alg none": unsigned(good, "none"),
        "HS256 keyed with the provider's public key": unsigned(good, "HS256", public),
        "a key the provider does not publish": signed(good, {"kid": "rsa-2"}),
        "a development token acting as the provider's person": jwt.encode(
            {"iss": "lethe", "aud": "lethe", "sub": f"{issuer}#dpo-alice", "exp": now + 300, "tenant": TENANT,
             "role": "admin"}, b"not-lethe-s-development-key-0000", algorithm="HS256"),
    }
    for case, token in refused.items():
        answer = reads(token)
        assert answer.status_code == 401, f"{case}: {answer.status_code} {answer.text}"
        assert answer.json()["error"]["code"] == "unauthenticated", case
    # A person of the other tenant reads nothing of this one.
    globex = signed({**good, "sub": "globex-dpo", "groups": ["lethe-globex-dpo"]})
    assert reads(globex, GLOBEX).status_code == 200
    assert reads(globex, TENANT).status_code == 403
    # A group removed at the provider: the next token gives no role.
    assert reads(signed({**good, "groups": []})).status_code == 401
    # The data plane takes no provider token unless `[auth.oidc] data_plane` says so.
    answer = httpx.get(f"http://{lethe.data}/chroma/api/v2/heartbeat", headers={"Authorization": f"Bearer {signed(good)}"})
    assert answer.status_code == 401, answer.text


def test_service_accounts_reach_the_data_plane_with_the_app_role_their_token_names(chroma, idp, tmp_path):
    """`[auth.oidc] data_plane` with `tenant_claim` and `role_claim`: a service account's token
    (client credentials, no person) acts as an agent of its tenant on the data plane, and as
    nothing on the control plane."""
    issuer, _, _ = idp
    access = f'''
[auth.oidc]
issuer = "{issuer}"
audience = "{API}"
tenant_claim = "lethe_tenant"
role_claim = "roles"
data_plane = true
'''
    instance = own_lethe(chroma, tmp_path, access)
    try:
        now = int(time.time())
        account = {"iss": issuer, "aud": API, "sub": "svc-agent-7", "exp": now + 300, "lethe_tenant": TENANT}
        heartbeat = lambda token: httpx.get(f"http://{instance.data}/chroma/api/v2/heartbeat",
                                            headers={"Authorization": f"Bearer {token}"})
        assert heartbeat(signed({**account, "roles": ["Reader", "agent"]})).status_code == 200
        for case, claims in {
            "no Lethe role": {**account, "roles": ["Reader"]},
            "two Lethe roles": {**account, "roles": ["agent", "admin"]},
            "no tenant": {k: v for k, v in account.items() if k != "lethe_tenant"} | {"roles": ["agent"]},
            "another audience": {**account, "aud": "urn:other:api", "roles": ["agent"]},
        }.items():
            answer = heartbeat(signed(claims))
            assert answer.status_code == 401, f"{case}: {answer.text}"
        answer = httpx.get(f"http://{instance.control}/v1/consents?subject=u-1",
                           headers={"Authorization": f"Bearer {signed({**account, 'roles': ['agent']})}"})
        assert answer.status_code == 403, answer.text
    finally:
        instance.stop()
