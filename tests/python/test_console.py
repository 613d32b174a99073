"""The compliance console in a real browser: Debian's Chromium, headless, driven by Selenium
(the `chromium` and `chromium-driver` packages; no browser is downloaded), against a real Lethe
with a real Chroma. Two people of one tenant work an erasure through it; screenshots of the main
pages are saved under target/console-screenshots."""

import subprocess
import urllib.request
import uuid

import pytest

from conftest import GLOBEX, LETHE, REPO, TENANT, someone, two_tenant_lethe, wait_for

SHOTS = REPO / "target" / "console-screenshots"

@pytest.fixture
def lethe(chroma, tmp_path):
    erasure = '[erasure]\napprovals_required = 2\nretry_backoff = "200ms"\nsettle = "100ms"\n'
    instance = two_tenant_lethe(chroma, tmp_path, erasure)
    yield instance
    instance.stop()


def token(lethe, role, actor, tenant=TENANT):
    out = subprocess.run([str(LETHE), "token", "--role", role, "--tenant", tenant, "--actor", actor],
                         cwd=lethe.workdir, env=lethe.env, check=True, capture_output=True, text=True)
    return out.stdout.strip()


def press(driver, label):
    """Clicks the button with this text and waits for the page it leads to: a new document
    (the old one's marker gone), fully loaded."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    driver.execute_script("window.leaving = true")
    driver.find_element(By.XPATH, f"//button[normalize-space()='{label}']").click()
    WebDriverWait(driver, 10).until(lambda d: d.execute_script(
        "return window.leaving === undefined && document.readyState === 'complete'"))


def sign_in(driver, lethe, with_token):
    from selenium.webdriver.common.by import By
    driver.get(f"http://{lethe.control}/console/sign-in")
    driver.find_element(By.NAME, "token").send_keys(with_token)
    press(driver, "Sign in")


def shot(driver, name):
    """The whole page, at a laptop's width."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1280, max(900, height))
    driver.save_screenshot(str(SHOTS / f"{name}.png"))
    driver.set_window_size(1280, 900)


def text(driver):
    from selenium.webdriver.common.by import By
    return driver.find_element(By.TAG_NAME, "main").text


def test_two_people_work_an_erasure_through_the_console_to_a_verified_certificate(lethe, browsers, tmp_path):
    from selenium.webdriver.common.by import By
    alice, bob = browsers(), browsers()
    sign_in(alice, lethe, token(lethe, "compliance", "alice@dpo"))
    assert alice.title.startswith("Erasure requests") and "No erasure requests here" in text(alice)
    shot(alice, "requests-empty")

    # Consent granted in the console; the agent then writes through Lethe.
    subject = someone()
    alice.get(f"http://{lethe.control}/console/subjects?subject={subject}")
    assert "Lethe has no record" in text(alice)
    for name, value in (("purpose", "personalization"), ("category", "preference"), ("source", "console test")):
        alice.find_element(By.NAME, name).send_keys(value)
    for action in ("store", "retrieve"):
        alice.find_element(By.CSS_SELECTOR, f"input[name=actions][value={action}]").click()
    press(alice, "Grant")
    assert "personalization" in text(alice) and "active" in text(alice)
    name = f"console-{uuid.uuid4().hex[:8]}"
    lethe.client(lethe.token("admin")).create_collection(name, embedding_function=None)
    lethe.agent(subject).get_collection(name).add(ids=["m1", "m2"], embeddings=[[0.1, 0.2], [0.3, 0.4]],
                                                documents=["likes tea", "lives in Lisbon"])

    # The inventory is seen before the request is filed.
    def inventory_shown():
        alice.refresh()
        return "chroma" in text(alice) and "2 items of this subject in 1 stores" in text(alice)
    wait_for("the inventory to show the subject's records", inventory_shown, deadline=15)
    shot(alice, "subject")
    # The dry run: lineage's count and Chroma's own, before anything is filed.
    press(alice, "Count what it would erase")
    assert "chroma:chroma 2 2" in text(alice) and "2 records held in all." in text(alice), text(alice)
    shot(alice, "dry-run")
    assert lethe.call("GET", f"/v1/subjects/{TENANT}/{subject}")[1]["state"] == "active", "a dry run changes nothing"
    alice.find_element(By.NAME, "ticket").send_keys("DSR-CONSOLE")
    alice.find_element(By.NAME, "reason").send_keys("art. 17 request by e-mail")
    press(alice, "File the erasure request")
    request_url = alice.current_url
    request_id = request_url.rsplit("/", 1)[1]
    assert "requested" in text(alice) and "days left" in text(alice), text(alice)

    # The deadline, extended once with the reason told to the subject.
    alice.find_element(By.XPATH, "//summary[normalize-space()='Extend the deadline']").click()
    alice.find_element(By.ID, "extension-reason").send_keys("two processors to hear from")
    press(alice, "Extend the deadline")
    assert "The deadline was extended by 1 month" in text(alice), text(alice)
    filed = lethe.call("GET", f"/v1/erasures/{request_id}")[1]
    assert filed["extension"]["months"] == 1 and filed["deadline"] > filed["requested_at"]

    # Two approvals are required: the person who filed it is not one of them.
    assert "You filed this request: two other people must approve it." in text(alice)
    assert not alice.find_elements(By.CSS_SELECTOR, "form[action$='/approve']")

    # A form without its CSRF token is refused, and changes nothing.
    sign_in(bob, lethe, token(lethe, "compliance", "bob@dpo"))
    bob.get(request_url)
    bob.execute_script("document.querySelector('form[action$=\"/approve\"] input[name=csrf]').remove()")
    press(bob, "Approve the erasure")
    assert "Nothing was changed" in text(bob)
    shot(bob, "refused-without-csrf")
    assert lethe.call("GET", f"/v1/erasures/{request_id}")[1]["approvals"] == []

    bob.get(request_url)
    press(bob, "Approve the erasure")
    assert "another person must approve it too" in text(bob)
    # Alice signs out; Carol signs in on the same browser and gives the second approval.
    press(alice, "Sign out")
    sign_in(alice, lethe, token(lethe, "compliance", "carol@dpo"))
    alice.get(request_url)
    press(alice, "Approve the erasure")

    def completed():
        bob.refresh()
        return "State\ncompleted" in text(bob)
    wait_for("the erasure to complete", completed, deadline=60)
    current = bob.find_element(By.CSS_SELECTOR, "ol.steps [aria-current=step]").text
    assert current == "completed", current
    assert "bob@dpo, carol@dpo" in text(bob)
    page = text(bob)
    assert "s after the request" in page and "chroma:chroma: physical status" in page, page
    assert "Remaining copy" in page and "unknown:" in page, "every copy that remains, with why no date"
    shot(bob, "request-completed")
    bob.find_element(By.LINK_TEXT, "as a page").click()
    assert request_id in bob.page_source
    shot(bob, "certificate")
    bob.back()
    bob.get(f"http://{lethe.control}/console/requests")
    assert request_id in text(bob) and "closed" in text(bob) and "(extended)" in text(bob)
    shot(bob, "requests")

    # The certificate, downloaded with the session, verifies as a third party would check it.
    link = bob.find_element(By.LINK_TEXT, request_id)
    link.click()
    href = bob.find_element(By.LINK_TEXT, "The signed certificate").get_attribute("href")
    session = bob.get_cookie("lethe_console")
    assert session["httpOnly"] and session["sameSite"] == "Strict"
    download = urllib.request.Request(href, headers={"Cookie": f"lethe_console={session['value']}"})
    with urllib.request.urlopen(download) as answer:
        assert "attachment" in answer.headers["Content-Disposition"]
        document = answer.read()
    path = tmp_path / "certificate.json"
    path.write_bytes(document)
    key = lethe.cli("certificate", "public-key").stdout.decode().strip()
    assert f"--key {key}" in text(bob), "the page shows the key and the command that verifies it"
    verified = lethe.cli("certificate", "verify", str(path), "--key", key)
    assert verified.returncode == 0, verified.stdout + verified.stderr

    # The other main pages.
    bob.get(f"http://{lethe.control}/console/policy")
    assert "Retention rules" in text(bob) and "Place a hold" in text(bob), text(bob)
    shot(bob, "policy")
    bob.get(f"http://{lethe.control}/console/audit?verify")
    assert "is intact" in text(bob) and "erasure.extend_deadline" in text(bob), text(bob)
    shot(bob, "audit")


def test_an_agent_token_cannot_sign_in_and_a_tenant_sees_only_its_own(lethe, browsers):
    from selenium.webdriver.common.by import By
    s = someone()
    lethe.grant(s)
    status, filed = lethe.call("POST", "/v1/erasures", {"subject": s, "ticket": "DSR-ACME", "reason": "art. 17"})
    assert status == 201
    browser = browsers()
    sign_in(browser, lethe, lethe.token("agent", s))
    assert "Not signed in" in text(browser) and browser.get_cookie("lethe_console") is None
    shot(browser, "sign-in-refused")
    sign_in(browser, lethe, token(lethe, "compliance", "carol@globex", tenant=GLOBEX))
    assert "Erasure requests" in browser.title
    assert filed["id"] not in browser.page_source
    browser.get(f"http://{lethe.control}/console/requests/{filed['id']}")
    assert "No such erasure request" in text(browser)
    browser.get(f"http://{lethe.control}/console/subjects?subject={s}")
    assert "Lethe has no record" in text(browser), "acme's subject is not globex's to see"
    # Signed out, the pages send back to sign-in.
    browser.get(f"http://{lethe.control}/console/requests")
    press(browser, "Sign out")
    browser.get(f"http://{lethe.control}/console/requests")
    assert browser.current_url.endswith("/console/sign-in")
