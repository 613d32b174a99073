-- The audit chain's links are keyed (HMAC-SHA256 with the audit key). The head moves to a table
-- of a new name, so that a replica of an earlier version, which would append unkeyed links, fails
-- instead. `chain_version` 2: keyed; 1: a chain written before, which `lethe audit key-chain`
-- verifies as written and seals again with the key, once (Lethe serves nothing before); a chain
-- with no event yet is keyed from its first. `key_check` tells the key the links are made with
-- (an HMAC of a fixed text), so that another key is refused rather than used.
ALTER TABLE audit_head RENAME TO audit_chain;
ALTER TABLE audit_chain ADD COLUMN chain_version INTEGER NOT NULL DEFAULT 1;
ALTER TABLE audit_chain ADD COLUMN key_check TEXT;
UPDATE audit_chain SET chain_version = 2 WHERE seq = 0;
-- A row's link as it was written before the chain was keyed: heads saved or certified before
-- (a certificate's audit_chain_head) still name it.
ALTER TABLE audit_events ADD COLUMN legacy_hash TEXT;
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
