-- Each audit event knows its tenant (hashed with it), and the events of a tenant form a chain of
-- their own beside the whole one, so that a tenant's compliance staff can read and verify their
-- events without seeing another tenant's. Events written before this have no tenant: admins see
-- them in the whole chain.
ALTER TABLE audit_events ADD COLUMN tenant TEXT;
ALTER TABLE audit_events ADD COLUMN tenant_seq BIGINT;
ALTER TABLE audit_events ADD COLUMN tenant_prev_hash TEXT;
ALTER TABLE audit_events ADD COLUMN tenant_hash TEXT;
CREATE UNIQUE INDEX audit_events_tenant_chain ON audit_events (tenant, tenant_seq);

-- The head of each tenant's chain, moved with every append (under the whole chain's head lock).
CREATE TABLE audit_tenant_heads (
    tenant TEXT    PRIMARY KEY,
    seq    BIGINT  NOT NULL,
    hash   TEXT    NOT NULL
);
