//! Key material at start-up: from the config, else from the environment, else generated once and
//! kept in the state store (so that every replica and the CLI share it).

use crate::auth::Verifier;
use crate::config::Config;
use crate::state::Store;

pub const JWT_SECRET_ENV: &str = "LETHE_JWT_SECRET";
pub const AUDIT_KEY_ENV: &str = "LETHE_AUDIT_KEY";

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("{0}")]
    Config(String),
    #[error("the state store could not provide generated key material: {0}")]
    Store(#[from] crate::state::StoreError),
    #[error("the system random number generator failed: {0}")]
    Random(String),
}

async fn secret_or_generated(
    configured: Option<&crate::config::Secret>,
    env: &str,
    generated_name: &str,
    store: &dyn Store,
) -> Result<Vec<u8>, KeyError> {
    if let Some(secret) = configured {
        return secret.resolve().map_err(KeyError::Config);
    }
    if let Ok(value) = std::env::var(env)
        && !value.is_empty()
    {
        return Ok(value.into_bytes());
    }
    let mut fresh = [0u8; 32];
    getrandom::fill(&mut fresh).map_err(|e| KeyError::Random(e.to_string()))?;
    Ok(store
        .generated_secret(generated_name, &fresh, crate::now())
        .await?)
}

/// The key of `subject_ref = HMAC(key, tenant/subject)`.
pub async fn audit_key(config: &Config, store: &dyn Store) -> Result<Vec<u8>, KeyError> {
    secret_or_generated(
        config.audit.hmac_key.as_ref(),
        AUDIT_KEY_ENV,
        "audit_hmac_key",
        store,
    )
    .await
}

/// The development HS256 secret; an error when the config uses public keys.
pub async fn development_secret(config: &Config, store: &dyn Store) -> Result<Vec<u8>, KeyError> {
    if config.auth.uses_public_keys() {
        return Err(KeyError::Config(
            "this configuration verifies tokens with public keys; development tokens cannot be minted".into(),
        ));
    }
    secret_or_generated(
        config.auth.hs256_secret.as_ref(),
        JWT_SECRET_ENV,
        "jwt_hs256_secret",
        store,
    )
    .await
}

pub async fn verifier(config: &Config, store: &dyn Store) -> Result<Verifier, KeyError> {
    let auth = &config.auth;
    if auth.uses_public_keys() {
        Verifier::public_keys(auth).map_err(|problems| KeyError::Config(problems.join("\n")))
    } else {
        let secret = development_secret(config, store).await?;
        Verifier::hs256(&secret, &auth.issuer, auth.leeway_seconds).map_err(KeyError::Config)
    }
}

/// The key erasure certificates are signed with: the configured seed (hex), else one generated
/// once and kept in the state store.
pub async fn certificate_signer(
    config: &Config,
    store: &dyn Store,
) -> Result<crate::erasure::certificate::Signer, KeyError> {
    let seed = match &config.erasure.signing_key {
        Some(secret) => {
            let text = secret.resolve().map_err(KeyError::Config)?;
            hex::decode(String::from_utf8_lossy(&text).trim()).map_err(|_| {
                KeyError::Config("erasure.signing_key: must be 32 bytes in hex".into())
            })?
        }
        None => {
            let mut fresh = [0u8; 32];
            getrandom::fill(&mut fresh).map_err(|e| KeyError::Random(e.to_string()))?;
            store
                .generated_secret("certificate_signing_key", &fresh, crate::now())
                .await?
        }
    };
    crate::erasure::certificate::Signer::from_seed(&seed).map_err(KeyError::Config)
}
