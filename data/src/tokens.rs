//! Verified tokens, cached until they expire so the hot path verifies a signature once per token.

use std::sync::Arc;
use std::time::Duration;

use moka::sync::Cache;

use crate::auth::access::Tokens;
use crate::auth::{AuthError, Claims};

pub struct TokenCache {
    tokens: Tokens,
    verified: Cache<String, Arc<Claims>>,
}

impl TokenCache {
    pub fn new(tokens: Tokens) -> Self {
        let verified = Cache::builder()
            .max_capacity(100_000)
            .time_to_live(Duration::from_secs(300))
            .build();
        TokenCache { tokens, verified }
    }

    pub async fn verify(&self, token: &str) -> Result<Arc<Claims>, AuthError> {
        if let Some(claims) = self.verified.get(token) {
            if !Self::expired(&claims) {
                return Ok(claims);
            }
            self.verified.invalidate(token);
            return Err(AuthError::Expired);
        }
        let claims = Arc::new(self.tokens.verify(token).await?);
        self.verified.insert(token.to_owned(), Arc::clone(&claims));
        Ok(claims)
    }

    /// Whether a token verified earlier has expired since, as a cached token is judged: a
    /// long-lived connection asks before each command it serves.
    pub fn expired(claims: &Claims) -> bool {
        claims.exp <= jsonwebtoken::get_current_timestamp()
    }
}
