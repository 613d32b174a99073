"""Signing in to the console through a real OpenID provider (npm's oidc-provider, certified; its
own login and consent pages): a person's roles come from their groups, the audit log names them
by issuer and subject, and every way around the flow is refused. The happy path runs in Debian's
Chromium; the attacks are raw HTTP (httpx), each counted in what Lethe answers and audits."""

import base64
import contextlib
import html
import json
import re
import urllib.parse

import httpx
import pytest

from conftest import GLOBEX, REPO, TENANT, free_port, served, two_tenant_lethe, wait_for

PROVIDER = REPO / ".cache" / "oidc-provider"


PEOPLE = {
    "dpo-alice": {"name": "Alice Dupont", "email": "alice@acme.example", "groups": ["lethe-acme-dpo"]},
    "dpo-bob": {"name": "Bob Martin", "email": "bob@acme.example", "groups": ["lethe-acme-dpo"], "amr": ["pwd", "otp"]},
    "dpo-carl": {"name": "Carl Moved", "email": "carl@acme.example", "groups": ["lethe-acme-dpo"]},
    "globex-dpo": {"name": "Gina Globex", "email": "gina@globex.example", "groups": ["lethe-globex-dpo"]},
    "two-tenants": {"name": "Tess Two", "email": "tess@corp.example", "groups": ["lethe-acme-dpo", "lethe-globex-dpo"]},
    "ops-admin": {"name": "Olga Ops", "email": "olga@corp.example", "groups": ["lethe-admins"], "amr": ["pwd", "hwk"]},
    "nobody": {"name": "Ned Nobody", "email": "ned@corp.example", "groups": ["staff"]},
}


@contextlib.contextmanager
def openid_provider(folder, jwks=None):
    """The provider, and the control address its client is registered for; its directory is
    the file `people`, read at every sign-in; `jwks` (a file) holds its signing keys."""
    port, control = free_port(), f"127.0.0.1:{free_port()}"
    issuer = f"http://127.0.0.1:{port}"
    redirect = f"http://{control}/console/oidc/callback"
    people = folder / "people.json"
    people.write_text(json.dumps(PEOPLE))
    argv = ["node", str(PROVIDER / "provider.mjs"), str(port), redirect, str(people)]
    argv += [str(jwks)] if jwks else []
    ready = lambda: httpx.get(f"{issuer}/.well-known/openid-configuration").status_code == 200
    with served("the OpenID provider", argv, folder, ready, 30, cwd=PROVIDER):
        yield issuer, control, people


def console_sign_in(issuer, control):
    """The configuration of the console's sign-in through `issuer`, with the groups of `PEOPLE`
    mapped; approvals need two people, each with a second factor."""
    return f'''
[erasure]
approvals_required = 2
approval_requires_mfa = true

[control_plane.oidc]
issuer = "{issuer}"
name = "Corp SSO"
client_id = "lethe-console"
client_secret = {{ value = "console-secret" }}
redirect_url = "http://{control}/console/oidc/callback"
scopes = ["openid", "profile", "email", "groups"]
[[control_plane.oidc.roles]]
group = "lethe-acme-dpo"
role = "compliance"
tenant = "{TENANT}"
[[control_plane.oidc.roles]]
group = "lethe-globex-dpo"
role = "compliance"
tenant = "{GLOBEX}"
[[control_plane.oidc.roles]]
group = "lethe-admins"
role = "admin"
tenant = "{TENANT}"
'''


@pytest.fixture(scope="module")
def idp(tmp_path_factory):
    with openid_provider(tmp_path_factory.mktemp("idp")) as started:
        yield started


@pytest.fixture(scope="module")
def lethe(chroma, idp, tmp_path_factory):
    issuer, control, _ = idp
    instance = two_tenant_lethe(chroma, tmp_path_factory.mktemp("lethe-oidc"), console_sign_in(issuer, control),
                                control=control)
    yield instance
    instance.stop()


def provider_sign_in(browser, start, login):
    """Follows a sign-in from `start` through the provider's login and consent pages (any
    password); answers the provider's last answer: its redirect to Lethe's callback, unfollowed."""
    page = browser.get(start, follow_redirects=True)
    for prompt in ("login", "consent"):
        if f'value="{prompt}"' not in page.text:
            continue
        action = re.search(r'action="([^"]+)"', page.text).group(1)
        fields = {"prompt": prompt, "login": login, "password": "any"} if prompt == "login" else {"prompt": prompt}
        page = browser.post(urllib.parse.urljoin(str(page.url), action), data=fields)
        while page.is_redirect and "/console/oidc/callback" not in page.headers["location"]:
            page = browser.get(urllib.parse.urljoin(str(page.url), page.headers["location"]))
    assert page.is_redirect and "/console/oidc/callback" in page.headers["location"], page.text[:500]
    return page.headers["location"]


def browser():
    return httpx.Client(follow_redirects=False, timeout=30)


def started(lethe, tenant=None):
    """A browser that has started a sign-in at Lethe (holding its pending cookie), and the
    provider's URL Lethe sent it to."""
    b = browser()
    query = f"?tenant={tenant}" if tenant else ""
    answer = b.get(f"http://{lethe.control}/console/oidc/login{query}")
    assert answer.status_code == 303, answer.text
    return b, answer.headers["location"]


def sign_in_events(lethe):
    """Every sign-in through the provider the whole audit log holds (an admin reads it all)."""
    status, page = lethe.call("GET", "/v1/audit?limit=1000", token=lethe.token("admin"))
    assert status == 200, page
    return [e for e in page["items"] if e["action"] == "console.sign_in"]


def test_a_person_signs_in_with_their_organisations_account_in_a_real_browser(lethe, idp, browsers):
    from selenium.webdriver.common.by import By
    issuer, _, _ = idp
    driver = browsers()
    driver.get(f"http://{lethe.control}/console/sign-in")
    assert driver.find_elements(By.NAME, "token") == [], "token sign-in is off when a provider is configured"
    # A link, not a form: the console's CSP (`form-action 'self'`) holds a form's redirect too.
    driver.find_element(By.LINK_TEXT, "Sign in with Corp SSO").click()
    wait_for("the provider's login page", lambda: driver.find_elements(By.NAME, "login"))
    driver.find_element(By.NAME, "login").send_keys("dpo-alice")
    driver.find_element(By.NAME, "password").send_keys("any")
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait_for("the provider's consent page", lambda: "Continue" in driver.page_source)
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait_for("the console", lambda: driver.current_url.endswith("/console/requests"))
    assert "Alice Dupont" in driver.page_source
    assert any(e["actor"] == f"{issuer}#dpo-alice" and e["result"] == "ok" for e in sign_in_events(lethe))


def test_a_person_acts_as_issuer_and_subject_and_sees_only_their_tenant(lethe, idp):
    issuer, _, _ = idp
    b, to_provider = started(lethe)
    back = provider_sign_in(b, to_provider, "globex-dpo")
    signed = b.get(back)
    assert signed.status_code == 303 and signed.headers["location"] == "/console/requests", signed.text
    # A compliance officer of globex, not of acme: one request filed in each, only globex's shown.
    filed = {}
    for tenant in (TENANT, GLOBEX):
        status, body = lethe.call("POST", "/v1/erasures", {"tenant": tenant, "subject": f"oidc-{tenant}@x.example",
                                                           "ticket": "DSR-O", "reason": "art. 17"},
                                  token=lethe.token("compliance", tenant=tenant))
        assert status == 201, body
        filed[tenant] = body["id"]
    page = b.get(f"http://{lethe.control}/console/requests")
    assert page.status_code == 200 and "Gina Globex" in page.text
    assert filed[GLOBEX] in page.text and filed[TENANT] not in page.text
    assert b.get(f"http://{lethe.control}/console/requests/{filed[TENANT]}").status_code in (403, 404)
    events = sign_in_events(lethe)
    assert any(e["actor"] == f"{issuer}#globex-dpo" and e["tenant"] == GLOBEX for e in events), events


def test_a_person_in_no_mapped_group_is_refused_and_the_refusal_is_audited(lethe, idp):
    issuer, _, _ = idp
    b, to_provider = started(lethe)
    refused = b.get(provider_sign_in(b, to_provider, "nobody"))
    assert refused.status_code == 403 and "in no group" in refused.text
    assert "lethe_console=" not in refused.headers.get("set-cookie", "")
    assert b.get(f"http://{lethe.control}/console/requests").status_code == 303
    refusals = [e for e in sign_in_events(lethe) if e["result"] == "refused"]
    assert any(e["actor"] == f"{issuer}#nobody" for e in refusals), refusals


def test_a_person_of_two_tenants_chooses_one(lethe):
    b, to_provider = started(lethe)
    choice = b.get(provider_sign_in(b, to_provider, "two-tenants"))
    assert choice.status_code == 200
    assert f"/console/oidc/login?tenant={TENANT}" in choice.text and f"/console/oidc/login?tenant={GLOBEX}" in choice.text
    b2, to_provider = started(lethe, tenant=GLOBEX)
    signed = b2.get(provider_sign_in(b2, to_provider, "two-tenants"))
    assert signed.status_code == 303 and signed.headers["location"] == "/console/requests"


def test_an_answer_for_another_browser_or_another_sign_in_is_refused(lethe):
    # Browser A starts and completes the provider's part; its answer is taken to browser B,
    # which never started a sign-in, and to browser C, which started one of its own.
    a, to_provider = started(lethe)
    back = provider_sign_in(a, to_provider, "dpo-alice")
    b = browser()
    other = b.get(back)
    assert other.status_code == 403 and "not started in this browser" in other.text
    c, _ = started(lethe)
    crossed = c.get(back)
    assert crossed.status_code == 403 and "another sign-in" in crossed.text
    for refused in (other, crossed):
        assert "lethe_console=" not in refused.headers.get("set-cookie", "")
    # A forged pending cookie (its seal not Lethe's) is no sign-in either.
    forged = browser()
    forged.cookies.set("lethe_oidc", "eyJzdGF0ZSI6IngifQ.AAAA", domain="127.0.0.1", path="/console/oidc")
    assert forged.get(back).status_code == 403


def test_a_replayed_code_is_refused(lethe):
    a, to_provider = started(lethe)
    back = provider_sign_in(a, to_provider, "dpo-alice")
    pending = a.cookies.get("lethe_oidc", path="/console/oidc")
    assert a.get(back).status_code == 303
    replay = browser()
    replay.cookies.set("lethe_oidc", pending, domain="127.0.0.1", path="/console/oidc")
    again = replay.get(back)
    assert again.status_code == 403 and "invalid_grant" in again.text, again.text
    assert "lethe_console=" not in again.headers.get("set-cookie", "")


def test_a_provider_error_and_a_missing_code_sign_no_one_in(lethe):
    a, _ = started(lethe)
    state = a.cookies.get("lethe_oidc", path="/console/oidc")
    assert state
    denied = a.get(f"http://{lethe.control}/console/oidc/callback?error=access_denied&state=x")
    assert denied.status_code == 403 and "access_denied" in denied.text
    b, _ = started(lethe)
    assert b.get(f"http://{lethe.control}/console/oidc/callback?state=x").status_code in (400, 403)


def test_token_sign_in_is_off_when_a_provider_is_configured(lethe):
    b = browser()
    form = b.get(f"http://{lethe.control}/console/sign-in")
    assert 'name="token"' not in form.text and "Sign in with Corp SSO" in form.text
    csrf = b.cookies.get("lethe_console_sign_in")
    posted = b.post(f"http://{lethe.control}/console/sign-in",
                    data={"csrf": csrf or "", "token": lethe.token("admin")})
    assert posted.status_code == 403 and "turned off" in posted.text
    assert "lethe_console=" not in posted.headers.get("set-cookie", "")


def test_signing_out_at_the_provider_ends_every_console_session_of_that_person(lethe, idp):
    issuer, _, _ = idp
    # Alice signs in twice (two browsers: two Lethe sessions, one provider session each); Bob once.
    browsers_of = {}
    for who in ("dpo-alice", "dpo-alice", "dpo-bob"):
        b, to_provider = started(lethe)
        assert b.get(provider_sign_in(b, to_provider, who)).status_code == 303
        assert b.get(f"http://{lethe.control}/console/requests").status_code == 200
        browsers_of.setdefault(who, []).append(b)
    # Alice signs out at the provider, in her first browser: it calls Lethe back before it answers.
    first = browsers_of["dpo-alice"][0]
    confirm = first.get(f"{issuer}/session/end")
    assert confirm.status_code == 200, confirm.text[:300]
    action = re.search(r'id="op.logoutForm" method="post" action="([^"]+)"', confirm.text).group(1)
    xsrf = re.search(r'name="xsrf" value="([^"]+)"', confirm.text).group(1)
    done = first.post(urllib.parse.urljoin(str(confirm.url), action), data={"xsrf": xsrf, "logout": "yes"})
    assert done.status_code in (200, 303), done.text[:300]
    for b in browsers_of["dpo-alice"]:
        ended = b.get(f"http://{lethe.control}/console/requests")
        assert ended.status_code == 303 and "sign-in" in ended.headers["location"]
    # Bob's session stays; the sign-out is in the audit log, by Alice's issuer and subject.
    assert browsers_of["dpo-bob"][0].get(f"http://{lethe.control}/console/requests").status_code == 200
    status, page = lethe.call("GET", "/v1/audit?limit=1000", token=lethe.token("admin"))
    assert any(e["action"] == "console.sign_out" and e["actor"] == f"{issuer}#dpo-alice" for e in page["items"])


def test_a_forged_back_channel_logout_ends_nothing(lethe, idp):
    issuer, _, _ = idp
    b, to_provider = started(lethe)
    assert b.get(provider_sign_in(b, to_provider, "dpo-bob")).status_code == 303
    header = "eyJhbGciOiJub25lIn0"  # {"alg":"none"}
    body = base64.urlsafe_b64encode(json.dumps({
        "iss": issuer, "aud": "lethe-console", "sub": "dpo-bob", "iat": 1, "jti": "x",
        "events": {"http://schemas.openid.net/event/backchannel-logout": {}},
    }).encode()).rstrip(b"=").decode()
    for token in (f"{header}.{body}.", "not-a-jwt", ""):
        answer = httpx.post(f"http://{lethe.control}/console/oidc/backchannel-logout", data={"logout_token": token})
        assert answer.status_code == 400, answer.text
    assert b.get(f"http://{lethe.control}/console/requests").status_code == 200


def test_signing_out_of_lethe_offers_signing_out_of_the_provider(lethe, idp):
    issuer, _, _ = idp
    b, to_provider = started(lethe)
    assert b.get(provider_sign_in(b, to_provider, "dpo-bob")).status_code == 303
    page = b.get(f"http://{lethe.control}/console/requests")
    csrf = re.search(r'action="/console/sign-out"><input type="hidden" name="csrf" value="([^"]+)"', page.text).group(1)
    out = b.post(f"http://{lethe.control}/console/sign-out", data={"csrf": csrf})
    assert out.status_code == 200 and "You are signed out of Lethe" in out.text
    assert f'href="{issuer}/session/end?client_id=lethe-console"' in out.text
    assert b.get(f"http://{lethe.control}/console/requests").status_code == 303


def signed_in(lethe, who, tenant=None):
    """A browser signed in to the console as `who` through the provider, and its CSRF token."""
    b, to_provider = started(lethe, tenant)
    assert b.get(provider_sign_in(b, to_provider, who)).status_code == 303
    page = b.get(f"http://{lethe.control}/console/requests")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
    return b, csrf


def test_two_people_approve_as_themselves_and_no_one_approves_twice_or_their_own(lethe, idp):
    issuer, _, _ = idp
    alice, alice_csrf = signed_in(lethe, "dpo-alice")
    filed = alice.post(f"http://{lethe.control}/console/requests", data={
        "csrf": alice_csrf, "subject": "sso-subject@acme.example", "ticket": "DSR-SSO", "reason": "art. 17"})
    assert filed.status_code == 303, filed.text
    request_id = filed.headers["location"].rsplit("/", 1)[1]
    approve = lambda b, csrf: b.post(f"http://{lethe.control}/console/requests/{request_id}/approve", data={"csrf": csrf})
    state = lambda: lethe.call("GET", f"/v1/erasures/{request_id}")[1]
    approve(alice, alice_csrf)
    assert state()["approvals"] == [], "the requester approved her own request"
    bob, bob_csrf = signed_in(lethe, "dpo-bob")
    approve(bob, bob_csrf)
    # Bob again, in another browser and session: the same person by issuer and subject.
    bob_again, bob_again_csrf = signed_in(lethe, "dpo-bob")
    approve(bob_again, bob_again_csrf)
    assert state()["approvals"] == [f"{issuer}#dpo-bob"] and state()["state"] == "requested"
    olga, olga_csrf = signed_in(lethe, "ops-admin")
    approve(olga, olga_csrf)
    done = state()
    assert done["approvals"] == [f"{issuer}#dpo-bob", f"{issuer}#ops-admin"], done
    assert done["requested_by"] == f"{issuer}#dpo-alice" and done["state"] != "requested", done
    status, page = lethe.call("GET", "/v1/audit?limit=1000", token=lethe.token("admin"))
    steps = [(e["action"], e["actor"]) for e in page["items"] if e.get("target_ref") == request_id]
    assert ("erasure.request", f"{issuer}#dpo-alice") in steps
    assert ("erasure.approve", f"{issuer}#dpo-bob") in steps and ("erasure.approve", f"{issuer}#ops-admin") in steps


def test_a_group_removed_at_the_provider_leaves_no_role_at_the_next_sign_in(lethe, idp):
    _, _, people = idp
    signed_in(lethe, "dpo-carl")
    directory = json.loads(people.read_text())
    directory["dpo-carl"]["groups"] = ["staff"]
    people.write_text(json.dumps(directory))
    b, to_provider = started(lethe)
    refused = b.get(provider_sign_in(b, to_provider, "dpo-carl"))
    assert refused.status_code == 403 and "in no group" in refused.text


def test_an_approval_without_a_second_factor_waits_for_one(lethe, idp):
    issuer, _, people = idp
    status, filed = lethe.call("POST", "/v1/erasures", {"subject": "mfa-subject@acme.example", "ticket": "DSR-MFA",
                                                        "reason": "art. 17"})
    assert status == 201, filed
    request_id = filed["id"]
    state = lambda: lethe.call("GET", f"/v1/erasures/{request_id}")[1]
    # Alice signed in with a password only: the approval is refused, nothing changes, and the
    # page offers a fresh sign-in with a second factor that comes back to the request.
    alice, csrf = signed_in(lethe, "dpo-alice")
    refused = alice.post(f"http://{lethe.control}/console/requests/{request_id}/approve", data={"csrf": csrf})
    assert refused.status_code == 403 and "second factor" in refused.text
    assert state()["approvals"] == []
    found = re.search(r'href="([^"]*step_up[^"]*)"', refused.text)
    assert found, refused.text
    step_up = html.unescape(found.group(1))
    assert step_up.startswith("/console/oidc/login?step_up=true&back="), step_up
    to_provider = alice.get(f"http://{lethe.control}{step_up}")
    assert to_provider.status_code == 303
    asked = urllib.parse.parse_qs(urllib.parse.urlsplit(to_provider.headers["location"]).query)
    assert asked["max_age"] == ["0"] and asked["prompt"] == ["login"]
    # With a second factor this time (her provider asked for one): back at the request, she approves.
    directory = json.loads(people.read_text())
    directory["dpo-alice"]["amr"] = ["pwd", "otp"]
    people.write_text(json.dumps(directory))
    back = alice.get(provider_sign_in(alice, to_provider.headers["location"], "dpo-alice"))
    assert back.status_code == 303 and back.headers["location"] == f"/console/requests/{request_id}"
    page = alice.get(f"http://{lethe.control}{back.headers['location']}")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
    alice.post(f"http://{lethe.control}/console/requests/{request_id}/approve", data={"csrf": csrf})
    assert state()["approvals"] == [f"{issuer}#dpo-alice"]
    # A token carries no second factor: the API refuses it too.
    status, body = lethe.call("POST", f"/v1/erasures/{request_id}/approve", token=lethe.token("compliance"))
    assert status == 403 and "second factor" in body["error"]["message"]


def test_a_return_path_that_is_no_console_page_is_dropped_and_a_second_sign_in_ends_the_first(lethe):
    b, _ = signed_in(lethe, "two-tenants", tenant=TENANT)
    first = b.cookies.get("lethe_console")
    # Back to another site, a control character, a backslash: each sign-in ends on the requests.
    for back in ("//evil.example/x", "/console/\x01x", "/console/\\evil", "https://evil.example/console/"):
        query = urllib.parse.urlencode({"step_up": "true", "back": back, "tenant": GLOBEX})
        answer = b.get(f"http://{lethe.control}/console/oidc/login?{query}")
        assert answer.status_code == 303, answer.text
        signed = b.get(provider_sign_in(b, answer.headers["location"], "two-tenants"))
        assert signed.status_code == 303 and signed.headers["location"] == "/console/requests", (back, signed.text[:300])
    # The browser's first session ended when the next began.
    stale = browser()
    stale.cookies.set("lethe_console", first, domain="127.0.0.1", path="/console")
    assert stale.get(f"http://{lethe.control}/console/requests").status_code == 303
