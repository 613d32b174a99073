-- Who each console session is (its claims' `sub`: for a person signed in through an OpenID
-- provider, `<issuer>#<subject>`), so that the provider's back-channel logout ends every session
-- of that person on every replica. Sessions from before carry no actor and simply run out.
ALTER TABLE console_sessions ADD COLUMN actor TEXT NOT NULL DEFAULT '';
CREATE INDEX console_sessions_by_actor ON console_sessions (actor);
-- The back-channel logout tokens taken, by `jti`, until they could no longer pass: one replayed
-- to any replica ends nothing more.
CREATE TABLE logout_tokens (
    jti   TEXT PRIMARY KEY,
    until TIMESTAMPTZ NOT NULL
);
