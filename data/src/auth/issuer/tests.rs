//! The provider's discovery and keys against a provider on a local port that answers, fails or
//! hangs as a test says, counting what Lethe asks it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use http_body_util::Full;
use hyper::{Response, StatusCode};

use super::*;
use crate::auth::oidc::tests::{jwk, now, rsa};

const OK: u8 = 0;
const FAILS: u8 = 1;
const HANGS: u8 = 2;
/// The keys are published without `rsa-1`.
const WITHDRAWN: u8 = 3;

#[derive(Default)]
struct Provider {
    discovery: AtomicU8,
    keys: AtomicU8,
    discovered: AtomicUsize,
    keys_read: AtomicUsize,
}

/// A provider at `http://127.0.0.1:<port>`, publishing the fixture key `rsa-1`.
async fn provider() -> (String, Arc<Provider>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let state = Arc::new(Provider::default());
    let (issuer, shared) = (url.clone(), Arc::clone(&state));
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let (issuer, state) = (issuer.clone(), Arc::clone(&shared));
            let service = hyper::service::service_fn(move |request: hyper::Request<_>| {
                let (issuer, state) = (issuer.clone(), Arc::clone(&state));
                async move {
                    let (mode, body) = match request.uri().path() {
                        "/.well-known/openid-configuration" => {
                            state.discovered.fetch_add(1, Ordering::SeqCst);
                            let metadata = serde_json::json!({
                                "issuer": issuer, "authorization_endpoint": format!("{issuer}/auth"),
                                "token_endpoint": format!("{issuer}/token"), "jwks_uri": format!("{issuer}/jwks"),
                            });
                            (state.discovery.load(Ordering::SeqCst), metadata.to_string())
                        }
                        _ => {
                            state.keys_read.fetch_add(1, Ordering::SeqCst);
                            let mode = state.keys.load(Ordering::SeqCst);
                            let published = if mode == WITHDRAWN {
                                vec![]
                            } else {
                                vec![jwk()]
                            };
                            let keys = serde_json::json!({ "keys": published });
                            (state.keys.load(Ordering::SeqCst), keys.to_string())
                        }
                    };
                    if mode == HANGS {
                        tokio::time::sleep(Duration::from_secs(60)).await;
                    }
                    let status = if mode == FAILS {
                        StatusCode::INTERNAL_SERVER_ERROR
                    } else {
                        StatusCode::OK
                    };
                    Response::builder()
                        .status(status)
                        .body(Full::new(Bytes::from(body)))
                }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service),
            );
        }
    });
    (url, state)
}

fn issuer(url: &str) -> Issuer {
    Issuer::new(url, &crate::forward::tls_client(None).unwrap())
}

/// A token naming `kid`, signed with the fixture key.
fn token(kid: &str) -> String {
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
    header.kid = Some(kid.into());
    let body = serde_json::json!({ "sub": "u", "exp": now() + 60 });
    jsonwebtoken::encode(&header, &body, &rsa()).unwrap()
}

#[tokio::test]
async fn a_failed_discovery_is_not_tried_again_for_every_request() {
    let (url, provider) = provider().await;
    provider.discovery.store(FAILS, Ordering::SeqCst);
    let issuer = issuer(&url);
    for _ in 0..40 {
        assert!(matches!(
            issuer.key_of(&token("rsa-1")).await,
            Err(OidcError::Unavailable(_))
        ));
    }
    assert_eq!(provider.discovered.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn unknown_kids_read_the_keys_at_most_once_a_minute_even_when_reading_fails() {
    let (url, provider) = provider().await;
    provider.keys.store(FAILS, Ordering::SeqCst);
    let issuer = issuer(&url);
    for i in 0..40 {
        let answer = issuer.key_of(&token(&format!("unknown-{i}"))).await;
        assert!(
            matches!(answer, Err(OidcError::Unavailable(_))),
            "{answer:?}"
        );
    }
    assert_eq!(provider.keys_read.load(Ordering::SeqCst), 1);
    // Readable again, the keys are still not read before the minute is out.
    provider.keys.store(OK, Ordering::SeqCst);
    assert!(issuer.key_of(&token("rsa-1")).await.is_err());
    assert_eq!(provider.keys_read.load(Ordering::SeqCst), 1);
}

/// While a token naming an unknown `kid` waits for the keys (the provider hangs), a token whose
/// key is known is answered at once, and the waiting ones do not queue a reading each.
#[tokio::test]
async fn a_known_key_never_waits_for_a_reading_of_the_keys() {
    let (url, provider) = provider().await;
    let issuer = Arc::new(issuer(&url));
    let known = issuer.key_of(&token("rsa-1")).await.unwrap();
    assert_eq!(known.common.key_id.as_deref(), Some("rsa-1"));
    // The next reading is due for an unknown kid: the keys were tried over a minute ago.
    age(&issuer, Duration::from_secs(61));
    provider.keys.store(HANGS, Ordering::SeqCst);
    let waiting: Vec<_> = (0..3)
        .map(|i| {
            let issuer = Arc::clone(&issuer);
            tokio::spawn(async move { issuer.key_of(&token(&format!("new-{i}"))).await })
        })
        .collect();
    // The reading under way (the provider hangs it), a known key is asked for.
    let deadline = Instant::now() + Duration::from_secs(5);
    while provider.keys_read.load(Ordering::SeqCst) < 2 {
        assert!(Instant::now() < deadline, "the keys were not read again");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let started = Instant::now();
    assert!(issuer.key_of(&token("rsa-1")).await.is_ok());
    assert!(started.elapsed() < Duration::from_secs(1));
    for waiter in waiting {
        // The reading times out once (after 10 s); the others find it tried and do not read.
        assert!(waiter.await.unwrap().is_err());
    }
    assert_eq!(provider.keys_read.load(Ordering::SeqCst), 2);
}

/// Keys older than five minutes are read again before they verify: a key the provider withdrew
/// stops verifying even when no token names an unknown `kid`.
#[tokio::test]
async fn a_withdrawn_key_stops_verifying_once_the_keys_are_five_minutes_old() {
    let (url, provider) = provider().await;
    let issuer = issuer(&url);
    assert!(issuer.key_of(&token("rsa-1")).await.is_ok());
    provider.keys.store(WITHDRAWN, Ordering::SeqCst);
    assert!(
        issuer.key_of(&token("rsa-1")).await.is_ok(),
        "fresh keys are not read again"
    );
    age(&issuer, Duration::from_secs(301));
    let answer = issuer.key_of(&token("rsa-1")).await;
    assert!(matches!(answer, Err(OidcError::Invalid(_))), "{answer:?}");
    assert_eq!(provider.keys_read.load(Ordering::SeqCst), 2);
}

/// Makes the keys' last reading (and last try) `by` older.
fn age(issuer: &Issuer, by: Duration) {
    let mut keys = issuer.keys.write().unwrap();
    keys.tried_at = keys.tried_at.and_then(|at| at.checked_sub(by));
    keys.read_at = keys.read_at.and_then(|at| at.checked_sub(by));
}
