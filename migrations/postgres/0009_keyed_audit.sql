-- The audit chain's links are keyed (HMAC-SHA256 with the audit key) from chain version 2 on. A
-- chain written before is verified and sealed again with the key when Lethe next starts with the
-- key; one with no event yet is keyed from its first.
ALTER TABLE audit_head ADD COLUMN chain_version INTEGER NOT NULL DEFAULT 1;
UPDATE audit_head SET chain_version = 2 WHERE seq = 0;
-- Heads of the chain (tenant '') and of each tenant's chain, signed with the certificates' key
-- (Ed25519) at every certificate and at a fixed interval, kept apart from the chain: a chain that
-- no longer holds one was cut or rewritten.
CREATE TABLE audit_signed_heads (
    tenant     TEXT    NOT NULL,
    seq        BIGINT  NOT NULL,
    hash       TEXT    NOT NULL,
    signed_at  TIMESTAMPTZ NOT NULL,
    public_key TEXT    NOT NULL,
    signature  TEXT    NOT NULL,
    PRIMARY KEY (tenant, seq)
);
