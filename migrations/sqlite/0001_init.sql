-- Lethe state store, SQLite. Same meaning as migrations/postgres/0001_init.sql.

CREATE TABLE subjects (
    tenant      TEXT        NOT NULL,
    subject     TEXT        NOT NULL,
    status      TEXT        NOT NULL CHECK (status IN ('active', 'suppressed', 'erased')),
    epoch       INTEGER     NOT NULL CHECK (epoch >= 0),
    created_at  TEXT        NOT NULL,
    updated_at  TEXT        NOT NULL,
    PRIMARY KEY (tenant, subject)
);

CREATE TABLE consent_grants (
    id             TEXT        PRIMARY KEY,
    tenant         TEXT        NOT NULL,
    subject        TEXT        NOT NULL,
    purpose        TEXT        NOT NULL,
    category       TEXT        NOT NULL,
    actions        TEXT        NOT NULL,
    granted_at     TEXT        NOT NULL,
    expires_at     TEXT       ,
    revoked_at     TEXT       ,
    policy_version INTEGER     NOT NULL,
    source         TEXT        NOT NULL,
    FOREIGN KEY (tenant, subject) REFERENCES subjects (tenant, subject)
);
CREATE INDEX consent_grants_by_subject ON consent_grants (tenant, subject);

CREATE TABLE retention_rule_sets (
    tenant     TEXT        NOT NULL,
    version    INTEGER     NOT NULL CHECK (version > 0),
    policy     TEXT        NOT NULL,
    created_at TEXT        NOT NULL,
    created_by TEXT        NOT NULL,
    PRIMARY KEY (tenant, version)
);

CREATE TABLE legal_holds (
    id          TEXT        PRIMARY KEY,
    tenant      TEXT        NOT NULL,
    subject     TEXT,
    reason      TEXT        NOT NULL,
    placed_at   TEXT        NOT NULL,
    placed_by   TEXT        NOT NULL,
    released_at TEXT       ,
    released_by TEXT
);
CREATE INDEX legal_holds_by_tenant ON legal_holds (tenant, subject);

-- Lineage: which stored item belongs to whom and was derived from what.
CREATE TABLE items (
    store      TEXT        NOT NULL,
    collection TEXT        NOT NULL,
    item_id    TEXT        NOT NULL,
    tenant     TEXT        NOT NULL,
    subject    TEXT        NOT NULL,
    purpose    TEXT        NOT NULL,
    category   TEXT        NOT NULL,
    layer      TEXT        NOT NULL CHECK (layer IN ('raw', 'derived', 'cache')),
    created_at TEXT        NOT NULL,
    expires_at TEXT        NOT NULL,
    epoch      INTEGER     NOT NULL,
    source_ref TEXT,
    parents    TEXT        NOT NULL,
    deleted_at TEXT       ,
    PRIMARY KEY (store, collection, item_id)
);
CREATE INDEX items_by_subject ON items (tenant, subject);
CREATE INDEX items_by_expiry ON items (expires_at) WHERE deleted_at IS NULL;

-- Which thread (LangGraph, provider conversation) belongs to which subject.
CREATE TABLE threads (
    store      TEXT        NOT NULL,
    thread_id  TEXT        NOT NULL,
    tenant     TEXT        NOT NULL,
    subject    TEXT        NOT NULL,
    created_at TEXT        NOT NULL,
    deleted_at TEXT       ,
    PRIMARY KEY (store, thread_id)
);
CREATE INDEX threads_by_subject ON threads (tenant, subject);

CREATE TABLE erasure_requests (
    id              TEXT        PRIMARY KEY,
    tenant          TEXT        NOT NULL,
    subject         TEXT        NOT NULL,
    aliases         TEXT        NOT NULL,
    ticket          TEXT        NOT NULL,
    reason          TEXT        NOT NULL,
    state           TEXT        NOT NULL,
    requested_by    TEXT        NOT NULL,
    requested_at    TEXT        NOT NULL,
    approvals       TEXT        NOT NULL,
    suppressed_at   TEXT       ,
    completed_at    TEXT       ,
    updated_at      TEXT        NOT NULL
);
CREATE INDEX erasure_requests_by_subject ON erasure_requests (tenant, subject);

CREATE TABLE purge_jobs (
    id              TEXT        PRIMARY KEY,
    request_id      TEXT        NOT NULL REFERENCES erasure_requests (id),
    target          TEXT        NOT NULL,
    state           TEXT        NOT NULL,
    attempts        INTEGER     NOT NULL DEFAULT 0,
    next_attempt_at TEXT        NOT NULL,
    claimed_by      TEXT,
    claimed_until   TEXT       ,
    last_error      TEXT,
    result          TEXT,
    updated_at      TEXT        NOT NULL,
    UNIQUE (request_id, target)
);

CREATE TABLE tombstones (
    request_id TEXT        PRIMARY KEY REFERENCES erasure_requests (id),
    tenant     TEXT        NOT NULL,
    subject    TEXT        NOT NULL,
    scope      TEXT        NOT NULL,
    erased_at  TEXT        NOT NULL
);

CREATE TABLE audit_events (
    seq         INTEGER     PRIMARY KEY,
    at          TEXT        NOT NULL,
    actor       TEXT        NOT NULL,
    action      TEXT        NOT NULL,
    request_id  TEXT        NOT NULL,
    subject_ref TEXT,
    target      TEXT        NOT NULL,
    target_ref  TEXT,
    result      TEXT        NOT NULL,
    attempt     INTEGER     NOT NULL,
    prev_hash   TEXT        NOT NULL,
    hash        TEXT        NOT NULL
);

-- One row; appends lock it so the chain is written strictly one event after another.
CREATE TABLE audit_head (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    seq  INTEGER NOT NULL,
    hash TEXT    NOT NULL
);
INSERT INTO audit_head (id, seq, hash)
VALUES (1, 0, '0000000000000000000000000000000000000000000000000000000000000000');

-- Key material Lethe generates for itself when the config names none (development keys).
CREATE TABLE generated_secrets (
    name       TEXT        PRIMARY KEY,
    value      BLOB        NOT NULL,
    created_at TEXT        NOT NULL
);
