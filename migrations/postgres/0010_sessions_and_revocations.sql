-- Console sessions, kept server-side: the cookie holds a random id, the store only its SHA-256,
-- with the claims of the token the person signed in with (never the token), the session's CSRF
-- token, and when it was last used. Sign-out deletes the row; an idle or expired one is refused.
CREATE TABLE console_sessions (
    id_hash      TEXT PRIMARY KEY,
    claims       TEXT NOT NULL,
    csrf         TEXT NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL,
    last_seen_at TIMESTAMPTZ NOT NULL,
    expires_at   TIMESTAMPTZ NOT NULL
);
CREATE INDEX console_sessions_by_expiry ON console_sessions (expires_at);
-- Tokens revoked before they expire, by id (`jti`): every replica refuses them.
CREATE TABLE revoked_tokens (
    jti        TEXT PRIMARY KEY,
    revoked_at TIMESTAMPTZ NOT NULL,
    revoked_by TEXT NOT NULL
);
