use super::*;
use crate::config::{PublicKeyConfig, Secret};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/keys");

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!("{FIXTURES}/{name}")).unwrap()
}

fn claims() -> Claims {
    Claims {
        sub: "svc-agent".into(),
        tenant: "acme".into(),
        role: Role::Compliance,
        subject: Some("u1".into()),
        exp: jsonwebtoken::get_current_timestamp() + 600,
        jti: None,
        name: None,
        second_factor: false,
    }
}

/// Signs arbitrary JSON claims with any key, to forge what a client could send.
fn sign(alg: Algorithm, key: &EncodingKey, kid: Option<&str>, body: serde_json::Value) -> String {
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_owned);
    encode(&header, &body, key).unwrap()
}

fn body(overrides: serde_json::Value) -> serde_json::Value {
    let mut body = serde_json::json!({
        "iss": "lethe", "aud": "lethe", "sub": "svc-agent", "tenant": "acme", "role": "agent",
        "exp": jsonwebtoken::get_current_timestamp() + 600,
    });
    body.as_object_mut()
        .unwrap()
        .extend(overrides.as_object().unwrap().clone());
    body
}

fn dev() -> Verifier {
    Verifier::hs256(b"dev-secret", "lethe", 0).unwrap()
}

#[test]
fn minted_development_tokens_verify() {
    let token = mint_hs256(b"dev-secret", "lethe", &claims()).unwrap();
    assert_eq!(dev().verify(&token), Ok(claims()));
}

#[test]
fn bad_development_tokens_are_refused_with_the_reason() {
    let secret = EncodingKey::from_secret(b"dev-secret").unwrap();
    let now = jsonwebtoken::get_current_timestamp();
    let cases = [
        (
            "expired",
            sign(
                Algorithm::HS256,
                &secret,
                None,
                body(serde_json::json!({"exp": now - 120})),
            ),
            AuthError::Expired,
        ),
        (
            "forged",
            sign(
                Algorithm::HS256,
                &EncodingKey::from_secret(b"guess").unwrap(),
                None,
                body(serde_json::json!({})),
            ),
            AuthError::BadSignature,
        ),
        (
            "other issuer",
            sign(
                Algorithm::HS256,
                &secret,
                None,
                body(serde_json::json!({"iss": "evil"})),
            ),
            AuthError::WrongIssuerOrAudience,
        ),
        (
            "other audience",
            sign(
                Algorithm::HS256,
                &secret,
                None,
                body(serde_json::json!({"aud": "chroma"})),
            ),
            AuthError::WrongIssuerOrAudience,
        ),
        (
            "no sub",
            sign(
                Algorithm::HS256,
                &secret,
                None,
                body(serde_json::json!({"sub": null})),
            ),
            AuthError::BadClaims,
        ),
        (
            "blank tenant",
            sign(
                Algorithm::HS256,
                &secret,
                None,
                body(serde_json::json!({"tenant": " "})),
            ),
            AuthError::BadClaims,
        ),
        (
            "unknown role",
            sign(
                Algorithm::HS256,
                &secret,
                None,
                body(serde_json::json!({"role": "root"})),
            ),
            AuthError::BadClaims,
        ),
        (
            "HS512 is not HS256",
            sign(Algorithm::HS512, &secret, None, body(serde_json::json!({}))),
            AuthError::AlgorithmNotAccepted,
        ),
        ("garbage", "not.a.token".to_owned(), AuthError::Malformed),
        ("empty", String::new(), AuthError::Malformed),
    ];
    let verifier = dev();
    for (case, token, expected) in cases {
        assert_eq!(verifier.verify(&token), Err(expected), "{case}");
    }
}

#[test]
fn alg_none_is_refused() {
    use base64_url as b64;
    let header = b64(br#"{"alg":"none","typ":"JWT"}"#);
    let payload = b64(body(serde_json::json!({})).to_string().as_bytes());
    for token in [
        format!("{header}.{payload}."),
        format!("{header}.{payload}"),
    ] {
        assert!(dev().verify(&token).is_err(), "{token}");
    }
}

/// Minimal unpadded base64url, so the test can hand-craft an unsigned token.
fn base64_url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

fn production(keys: Vec<PublicKeyConfig>, jwks: bool) -> Verifier {
    let config = AuthConfig {
        keys,
        jwks: jwks.then(|| format!("{FIXTURES}/jwks.json").into()),
        ..AuthConfig::default()
    };
    Verifier::public_keys(&config).unwrap()
}

fn pem_key(algorithm: PublicKeyAlgorithm, file: &str, kid: Option<&str>) -> PublicKeyConfig {
    PublicKeyConfig {
        algorithm,
        pem: Secret::File(format!("{FIXTURES}/{file}").into()),
        kid: kid.map(str::to_owned),
    }
}

#[test]
fn public_keys_verify_their_own_algorithm() {
    let verifier = production(
        vec![
            pem_key(PublicKeyAlgorithm::RS256, "rs256.pub.pem", None),
            pem_key(PublicKeyAlgorithm::ES256, "es256.pub.pem", None),
            pem_key(PublicKeyAlgorithm::EdDSA, "ed25519.pub.pem", None),
        ],
        false,
    );
    let signers = [
        (
            Algorithm::RS256,
            EncodingKey::from_rsa_pem(&fixture("rs256.key")).unwrap(),
        ),
        (
            Algorithm::ES256,
            EncodingKey::from_ec_pem(&fixture("es256.key")).unwrap(),
        ),
        (
            Algorithm::EdDSA,
            EncodingKey::from_ed_pem(&fixture("ed25519.key")).unwrap(),
        ),
    ];
    for (alg, key) in &signers {
        let claims = verifier
            .verify(&sign(*alg, key, None, body(serde_json::json!({}))))
            .unwrap();
        assert_eq!(
            (claims.tenant.as_str(), claims.role),
            ("acme", Role::Agent),
            "{alg:?}"
        );
    }
}

#[test]
fn an_hs256_token_made_with_the_public_key_is_refused() {
    // The classic confusion attack: sign HS256 with the RSA public key as the secret.
    let verifier = production(
        vec![pem_key(PublicKeyAlgorithm::RS256, "rs256.pub.pem", None)],
        false,
    );
    let forged = sign(
        Algorithm::HS256,
        &EncodingKey::from_secret(&fixture("rs256.pub.pem")).unwrap(),
        None,
        body(serde_json::json!({})),
    );
    assert_eq!(
        verifier.verify(&forged),
        Err(AuthError::AlgorithmNotAccepted)
    );
    // And a development token is worthless against production keys.
    let dev_token = mint_hs256(b"dev-secret", "lethe", &claims()).unwrap();
    assert_eq!(
        verifier.verify(&dev_token),
        Err(AuthError::AlgorithmNotAccepted)
    );
}

#[test]
fn jwks_keys_are_chosen_by_kid() {
    let verifier = production(vec![], true);
    let key = EncodingKey::from_rsa_pem(&fixture("rs256.key")).unwrap();
    assert!(
        verifier
            .verify(&sign(
                Algorithm::RS256,
                &key,
                Some("rsa-1"),
                body(serde_json::json!({}))
            ))
            .is_ok()
    );
    assert_eq!(
        verifier.verify(&sign(
            Algorithm::RS256,
            &key,
            Some("rsa-2"),
            body(serde_json::json!({}))
        )),
        Err(AuthError::AlgorithmNotAccepted),
        "no key has that kid"
    );
    let other = EncodingKey::from_ec_pem(&fixture("es256.key")).unwrap();
    assert!(
        verifier
            .verify(&sign(
                Algorithm::ES256,
                &other,
                Some("rsa-1"),
                body(serde_json::json!({}))
            ))
            .is_err()
    );
}

#[test]
fn bad_key_configuration_is_reported_key_by_key() {
    let config = AuthConfig {
        keys: vec![
            pem_key(PublicKeyAlgorithm::ES256, "rs256.pub.pem", None),
            pem_key(PublicKeyAlgorithm::RS256, "missing.pem", None),
        ],
        jwks: Some(format!("{FIXTURES}/rs256.pub.pem").into()),
        ..AuthConfig::default()
    };
    let problems = Verifier::public_keys(&config).err().unwrap();
    assert_eq!(problems.len(), 3, "{problems:#?}");
}
