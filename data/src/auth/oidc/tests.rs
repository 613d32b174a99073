use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{EncodingKey, Header, encode};
use serde_json::{Value, json};

use super::*;
use crate::config::{GroupRole, Secret};

const KEYS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/keys");
const ISSUER: &str = "https://idp.example";

fn config() -> OidcConfig {
    let mapping = |group: &str, role: &str, tenant: &str| GroupRole {
        group: group.into(),
        role: role.into(),
        tenant: tenant.into(),
    };
    OidcConfig {
        issuer: ISSUER.into(),
        name: "Example".into(),
        client_id: "lethe-console".into(),
        client_secret: Secret::Value("s".into()),
        redirect_url: "https://lethe.example/console/oidc/callback".into(),
        scopes: vec!["openid".into()],
        groups_claim: "groups".into(),
        mfa_acr: None,
        roles: vec![
            mapping("acme-dpo", "compliance", "acme"),
            mapping("acme-ops", "admin", "acme"),
            mapping("globex-dpo", "compliance", "globex"),
        ],
    }
}

/// The provider's RSA key as its JWKS publishes it (`kid` `rsa-1`, `alg` RS256).
pub(in crate::auth) fn jwk() -> Jwk {
    let set: JwkSet =
        serde_json::from_slice(&std::fs::read(format!("{KEYS}/jwks.json")).unwrap()).unwrap();
    set.keys[0].clone()
}

pub(in crate::auth) fn rsa() -> EncodingKey {
    EncodingKey::from_rsa_pem(&std::fs::read(format!("{KEYS}/rs256.key")).unwrap()).unwrap()
}

pub(in crate::auth) fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn claims() -> Value {
    json!({
        "iss": ISSUER, "aud": "lethe-console", "sub": "u-8412", "exp": now() + 300,
        "iat": now(), "nonce": "n-1", "name": "Alice Dupont", "groups": ["acme-dpo", "staff"],
    })
}

pub(in crate::auth) fn signed(alg: Algorithm, key: &EncodingKey, body: &Value) -> String {
    let mut header = Header::new(alg);
    header.kid = Some("rsa-1".into());
    encode(&header, body, key).unwrap()
}

/// `body` with `changes`: each key set, or removed where it is null.
fn changed(mut body: Value, changes: Value) -> Value {
    for (k, v) in changes.as_object().unwrap() {
        match v {
            Value::Null => body.as_object_mut().unwrap().remove(k),
            _ => body.as_object_mut().unwrap().insert(k.clone(), v.clone()),
        };
    }
    body
}

fn with(changes: Value) -> Value {
    changed(claims(), changes)
}

#[test]
fn a_valid_id_token_names_the_person_by_issuer_and_subject() {
    let token = signed(Algorithm::RS256, &rsa(), &claims());
    let person = verify_id_token(&token, &jwk(), &config(), "n-1", 0).unwrap();
    assert_eq!(person.actor(), "https://idp.example#u-8412");
    assert_eq!(person.display.as_deref(), Some("Alice Dupont"));
    assert_eq!(person.groups, ["acme-dpo", "staff"]);
    assert_eq!(
        roles(&config().roles, &person.groups),
        [("acme".to_owned(), Role::Compliance)]
    );
}

#[test]
fn id_tokens_that_must_fail() {
    let public_pem = std::fs::read(format!("{KEYS}/rs256.pub.pem")).unwrap();
    let cases: Vec<(&str, String)> = vec![
        (
            "another issuer",
            signed(
                Algorithm::RS256,
                &rsa(),
                &with(json!({"iss": "https://evil.example"})),
            ),
        ),
        (
            "a wrong audience",
            signed(Algorithm::RS256, &rsa(), &with(json!({"aud": "other-app"}))),
        ),
        (
            "issued to another client",
            signed(
                Algorithm::RS256,
                &rsa(),
                &with(json!({"aud": ["lethe-console", "other-app"], "azp": "other-app"})),
            ),
        ),
        (
            "several audiences, no azp",
            signed(
                Algorithm::RS256,
                &rsa(),
                &with(json!({"aud": ["lethe-console", "other-app"]})),
            ),
        ),
        (
            "expired",
            signed(Algorithm::RS256, &rsa(), &with(json!({"exp": now() - 60}))),
        ),
        (
            "not yet valid",
            signed(Algorithm::RS256, &rsa(), &with(json!({"nbf": now() + 600}))),
        ),
        (
            "another sign-in's nonce",
            signed(Algorithm::RS256, &rsa(), &with(json!({"nonce": "n-2"}))),
        ),
        (
            "no nonce",
            signed(Algorithm::RS256, &rsa(), &with(json!({"nonce": null}))),
        ),
        (
            "no sub",
            signed(Algorithm::RS256, &rsa(), &with(json!({"sub": null}))),
        ),
        // Algorithm confusion: the provider's public key used as an HMAC secret.
        (
            "HS256 with the public key",
            signed(
                Algorithm::HS256,
                &EncodingKey::from_secret(&public_pem).unwrap(),
                &claims(),
            ),
        ),
        (
            "another key",
            signed(
                Algorithm::ES256,
                &EncodingKey::from_ec_pem(&std::fs::read(format!("{KEYS}/es256.key")).unwrap())
                    .unwrap(),
                &claims(),
            ),
        ),
    ];
    for (case, token) in cases {
        assert!(
            matches!(
                verify_id_token(&token, &jwk(), &config(), "n-1", 0),
                Err(OidcError::Invalid(_))
            ),
            "{case} was accepted"
        );
    }
    // `alg: none`, signature stripped.
    let valid = signed(Algorithm::RS256, &rsa(), &claims());
    let body = valid.split('.').nth(1).unwrap();
    let none = format!(
        "{}.{body}.",
        URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#)
    );
    assert!(verify_id_token(&none, &jwk(), &config(), "n-1", 0).is_err());
    // A signature over other claims.
    let other = signed(Algorithm::RS256, &rsa(), &with(json!({"sub": "u-1"})));
    let forged = format!(
        "{}.{}.{}",
        valid.split('.').next().unwrap(),
        other.split('.').nth(1).unwrap(),
        valid.split('.').nth(2).unwrap()
    );
    assert!(verify_id_token(&forged, &jwk(), &config(), "n-1", 0).is_err());
}

#[test]
fn groups_map_to_the_higher_role_per_tenant_and_nothing_else() {
    let groups = |g: &[&str]| g.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    assert_eq!(
        roles(
            &config().roles,
            &groups(&["acme-dpo", "acme-ops", "globex-dpo"])
        ),
        [
            ("acme".to_owned(), Role::Admin),
            ("globex".to_owned(), Role::Compliance)
        ]
    );
    assert_eq!(roles(&config().roles, &groups(&["Acme-DPO", "staff"])), []);
    assert_eq!(roles(&config().roles, &[]), []);
}

#[test]
fn the_pkce_challenge_is_rfc_7636s() {
    // RFC 7636, appendix B.
    assert_eq!(
        challenge("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"),
        "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
    );
}

fn logout(changes: Value) -> Value {
    let body = json!({
        "iss": ISSUER, "aud": "lethe-console", "sub": "u-8412", "iat": now(), "jti": "j-1",
        "events": {"http://schemas.openid.net/event/backchannel-logout": {}},
    });
    changed(body, changes)
}

#[test]
fn a_logout_token_names_the_person_it_signs_out_and_nothing_else_passes_for_one() {
    let token = signed(Algorithm::RS256, &rsa(), &logout(json!({})));
    assert_eq!(
        verify_logout_token(&token, &jwk(), &config(), 0, now())
            .unwrap()
            .actor,
        "https://idp.example#u-8412"
    );
    let cases = [
        (
            "another issuer",
            logout(json!({"iss": "https://evil.example"})),
        ),
        ("another audience", logout(json!({"aud": "other-app"}))),
        ("no logout event", logout(json!({"events": {}}))),
        ("an ID token (a nonce)", logout(json!({"nonce": "n-1"}))),
        (
            "only a provider session",
            logout(json!({"sub": null, "sid": "s-1"})),
        ),
        ("no jti", logout(json!({"jti": null}))),
        ("no iat", logout(json!({"iat": null}))),
        ("expired", logout(json!({"exp": now() - 60}))),
        (
            "issued six minutes ago, no exp",
            logout(json!({"iat": now() - 360})),
        ),
        ("issued in the future", logout(json!({"iat": now() + 120}))),
    ];
    for (case, body) in cases {
        let token = signed(Algorithm::RS256, &rsa(), &body);
        assert!(
            verify_logout_token(&token, &jwk(), &config(), 0, now()).is_err(),
            "{case} was accepted"
        );
    }
    // An ID token of the same provider is no logout token.
    let id_token = signed(Algorithm::RS256, &rsa(), &claims());
    assert!(verify_logout_token(&id_token, &jwk(), &config(), 0, now()).is_err());
}

#[test]
fn a_second_factor_is_what_the_provider_says_it_was() {
    let verify = |changes: Value, config: &OidcConfig| {
        let token = signed(Algorithm::RS256, &rsa(), &with(changes));
        verify_id_token(&token, &jwk(), config, "n-1", 0)
            .unwrap()
            .second_factor
    };
    let mut with_acr = config();
    with_acr.mfa_acr = Some("urn:corp:mfa".into());
    assert!(verify(json!({"amr": ["pwd", "otp"]}), &config()));
    assert!(verify(json!({"amr": ["hwk"]}), &config()));
    assert!(!verify(json!({"amr": ["pwd"]}), &config()));
    assert!(!verify(json!({}), &config()));
    assert!(!verify(json!({"amr": "mfa"}), &config()), "amr is a list");
    assert!(verify(json!({"acr": "urn:corp:mfa"}), &with_acr));
    assert!(
        !verify(json!({"acr": "urn:corp:mfa"}), &config()),
        "an acr counts only when configured"
    );
    assert!(!verify(json!({"acr": "urn:corp:pwd"}), &with_acr));
}
