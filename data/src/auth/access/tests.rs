use jsonwebtoken::Algorithm;
use serde_json::{Value, json};

use super::*;
use crate::auth::oidc::tests::{jwk, now, rsa, signed};
use crate::auth::{mint_hs256, oidc::Expected};

const ISSUER: &str = "https://idp.example";

fn mapping() -> Vec<GroupRole> {
    let mapping = |group: &str, role: &str, tenant: &str| GroupRole {
        group: group.into(),
        role: role.into(),
        tenant: tenant.into(),
    };
    vec![
        mapping("acme-dpo", "compliance", "acme"),
        mapping("acme-ops", "admin", "acme"),
        mapping("globex-dpo", "compliance", "globex"),
    ]
}

fn by_groups() -> Reading {
    Reading {
        issuer: ISSUER.into(),
        roles: RolesFrom::Groups {
            claim: "groups".into(),
            mapping: mapping(),
        },
        mfa_acr: None,
    }
}

fn by_app_roles() -> Reading {
    Reading {
        roles: RolesFrom::Claims {
            tenant: "lethe_tenant".into(),
            role: "roles".into(),
        },
        ..by_groups()
    }
}

fn token(changes: Value) -> Value {
    let mut body = json!({
        "iss": ISSUER, "aud": "api://lethe", "sub": "u-8412", "exp": now() + 300,
        "jti": "at-1", "name": "Alice Dupont", "groups": ["acme-dpo", "staff"],
    });
    for (k, v) in changes.as_object().unwrap() {
        match v {
            Value::Null => body.as_object_mut().unwrap().remove(k),
            _ => body.as_object_mut().unwrap().insert(k.clone(), v.clone()),
        };
    }
    body
}

#[test]
fn a_persons_access_token_acts_as_the_person_the_console_signs_in() {
    let claims = by_groups().claims(&token(json!({}))).unwrap();
    assert_eq!(claims.sub, "https://idp.example#u-8412");
    assert_eq!(
        (claims.tenant.as_str(), claims.role),
        ("acme", Role::Compliance)
    );
    assert_eq!(claims.name.as_deref(), Some("Alice Dupont"));
    assert_eq!(claims.jti.as_deref(), Some("at-1"));
    assert!(!claims.second_factor);
    let shown = by_groups().claims(&token(json!({"amr": ["pwd", "otp"]})));
    assert!(shown.unwrap().second_factor);
}

#[test]
fn roles_come_from_mapped_groups_an_admin_role_wins_and_several_tenants_are_refused() {
    let role = |groups: Value| {
        by_groups()
            .claims(&token(json!({ "groups": groups })))
            .map(|c| (c.tenant, c.role))
    };
    assert_eq!(
        role(json!(["acme-dpo", "acme-ops", "globex-dpo"])),
        Ok(("acme".into(), Role::Admin))
    );
    assert_eq!(
        role(json!("globex-dpo")),
        Ok(("globex".into(), Role::Compliance))
    );
    for (groups, why) in [
        (json!(["acme-dpo", "globex-dpo"]), "2 tenants"),
        (json!(["staff"]), "none of its groups"),
        (json!(["Acme-DPO"]), "none of its groups"),
        (json!(null), "none of its groups"),
    ] {
        match role(groups.clone()) {
            Err(AuthError::NoRole(message)) => {
                assert!(message.contains(why), "{groups}: {message}")
            }
            other => panic!("{groups}: {other:?}"),
        }
    }
}

#[test]
fn app_roles_name_one_lethe_role_and_a_canonical_tenant() {
    let read = |changes: Value| by_app_roles().claims(&token(changes));
    let agent = read(json!({"lethe_tenant": "acme", "roles": ["Reader", "agent"]})).unwrap();
    assert_eq!((agent.tenant.as_str(), agent.role), ("acme", Role::Agent));
    assert_eq!(
        read(json!({"lethe_tenant": "acme", "roles": "admin"})).map(|c| c.role),
        Ok(Role::Admin)
    );
    for changes in [
        json!({"lethe_tenant": "acme", "roles": ["agent", "admin"]}),
        json!({"lethe_tenant": "acme", "roles": ["Admin"]}),
        json!({"lethe_tenant": "acme"}),
        json!({"roles": ["agent"]}),
        json!({"lethe_tenant": 7, "roles": ["agent"]}),
    ] {
        assert!(
            matches!(read(changes.clone()), Err(AuthError::NoRole(_))),
            "{changes}"
        );
    }
    for changes in [
        json!({"lethe_tenant": "acme ", "roles": ["agent"]}),
        json!({"lethe_tenant": "a/b", "roles": ["agent"]}),
        json!({"lethe_tenant": "acme", "roles": ["agent"], "sub": ""}),
        json!({"lethe_tenant": "acme", "roles": ["agent"], "sub": "u\n1"}),
        json!({"lethe_tenant": "acme", "roles": ["agent"], "sub": "u".repeat(256)}),
        json!({"lethe_tenant": "acme", "roles": ["agent"], "exp": null}),
        json!({"lethe_tenant": "acme", "roles": ["agent"], "nonce": "n-1"}),
        json!({"lethe_tenant": "acme", "roles": ["agent"], "sub": "\u{202e}ecila-opd"}),
        json!({"lethe_tenant": "acme", "roles": ["agent"], "sub": " dpo-alice"}),
        json!({"lethe_tenant": "acme", "roles": ["agent"], "jti": "j".repeat(201)}),
        json!({"lethe_tenant": "acme", "roles": ["agent"], "jti": 7}),
    ] {
        assert!(
            matches!(read(changes.clone()), Err(AuthError::ProviderToken(_))),
            "{changes}"
        );
    }
}

/// An access token is for Lethe's API (`aud`), by the provider's key, within its times; the
/// client that asked for it (`azp`) is not Lethe.
#[test]
fn an_access_token_is_checked_for_the_configured_audience_and_not_for_a_client() {
    let expected = Expected {
        issuer: ISSUER,
        audience: "api://lethe",
        to_client: false,
    };
    let verify = |body: Value| {
        let token = signed(Algorithm::RS256, &rsa(), &body);
        verified_claims(&token, &jwk(), &expected, 0, &["exp", "iss", "aud", "sub"])
    };
    assert!(verify(token(json!({"azp": "lethe-cli"}))).is_ok());
    for changes in [
        json!({"aud": "lethe-console"}),
        json!({"iss": "https://other.example"}),
        json!({"exp": now() - 10}),
        json!({"nbf": now() + 600}),
        json!({"sub": null}),
    ] {
        assert!(verify(token(changes.clone())).is_err(), "{changes}");
    }
}

/// A token claiming the provider as its issuer is the provider's to verify, never Lethe's own
/// keys' (a development token naming the provider's issuer is not its), and a Lethe token
/// cannot act as one of the provider's people.
#[tokio::test]
async fn the_claimed_issuer_chooses_whose_keys_verify_a_token() {
    let secret = b"dev-secret";
    let lethe = Arc::new(Verifier::hs256(secret, "lethe", 0).unwrap());
    let config = AccessTokenConfig {
        issuer: "http://127.0.0.1:9".into(),
        audience: "api://lethe".into(),
        data_plane: false,
        tenant_claim: Some("lethe_tenant".into()),
        role_claim: Some("roles".into()),
        cli_client_id: None,
        cli_scopes: vec!["openid".into()],
        resource: None,
    };
    let tls = crate::forward::tls_client(None).unwrap();
    let provider = Arc::new(AccessTokens::new(&config, None, 0, &tls));
    let tokens = Tokens::new(lethe, Some(provider), vec![config.issuer.clone()]);
    let claims = |sub: &str| Claims {
        sub: sub.into(),
        tenant: "acme".into(),
        role: Role::Admin,
        subject: None,
        exp: now() + 300,
        jti: None,
        name: Some("Alice".into()),
        second_factor: true,
    };
    // Lethe's own token: verified by its key, with no name and no second factor.
    let own = mint_hs256(secret, "lethe", &claims("ops")).unwrap();
    let verified = tokens.verify(&own).await.unwrap();
    assert_eq!((verified.name, verified.second_factor), (None, false));
    // Signed with Lethe's development key but claiming the provider: the provider's keys
    // decide, and the provider (nothing listens on port 9) cannot be read.
    let forged = mint_hs256(secret, "http://127.0.0.1:9", &claims("ops")).unwrap();
    assert!(matches!(
        tokens.verify(&forged).await,
        Err(AuthError::ProviderUnavailable(_))
    ));
    let person = mint_hs256(secret, "lethe", &claims("http://127.0.0.1:9#alice")).unwrap();
    assert_eq!(
        tokens.verify(&person).await,
        Err(AuthError::PersonOfProvider)
    );
}
