-- Derivative lineage, learnt in flight: each edge says an item (the child) was derived from
-- another (the parent), by a trace that read the parent, a quote of its text, or a model's answer
-- that did; with whose each was when the edge was recorded. A write that replaces an item's
-- content replaces its edges. Edges never cross tenants.
CREATE TABLE item_edges (
    tenant            TEXT NOT NULL,
    child_store       TEXT NOT NULL,
    child_collection  TEXT NOT NULL,
    child_item        TEXT NOT NULL,
    child_owner       TEXT NOT NULL,
    parent_store      TEXT NOT NULL,
    parent_collection TEXT NOT NULL,
    parent_item       TEXT NOT NULL,
    parent_owner      TEXT NOT NULL,
    how               TEXT NOT NULL CHECK (how IN ('trace', 'quote', 'provider')),
    at                TEXT NOT NULL,
    PRIMARY KEY (tenant, child_store, child_collection, child_item, parent_store, parent_collection, parent_item, how)
);
-- The closure of a subject walks from parents to children.
CREATE INDEX item_edges_by_parent ON item_edges (tenant, parent_store, parent_collection, parent_item);
CREATE INDEX item_edges_by_parent_owner ON item_edges (tenant, parent_owner);
CREATE INDEX item_edges_by_child_owner ON item_edges (tenant, child_owner);

-- What an erasure's flip (and its purge's later looks) found in the closure of its subject,
-- beyond the subject's own items, and what became of each: hidden from every read while the
-- request is open, erased or released by a person (or by policy), verified gone from its store.
CREATE TABLE erasure_derivatives (
    request_id TEXT NOT NULL REFERENCES erasure_requests (id),
    ref        TEXT NOT NULL,
    tenant     TEXT NOT NULL,
    store      TEXT NOT NULL,
    collection TEXT NOT NULL,
    item_id    TEXT NOT NULL,
    subject    TEXT,
    own        INTEGER NOT NULL CHECK (own IN (0, 1)),
    how        TEXT NOT NULL,
    parents    TEXT NOT NULL,
    decision   TEXT NOT NULL CHECK (decision IN ('guard', 'undecided', 'erase', 'release')),
    decided_by TEXT,
    decided_at TEXT,
    reason     TEXT,
    erased_at  TEXT,
    found_at   TEXT NOT NULL,
    PRIMARY KEY (request_id, ref)
);
-- Every read asks which of a tenant's items are hidden.
CREATE INDEX erasure_derivatives_by_tenant ON erasure_derivatives (tenant, decision);
CREATE INDEX erasure_derivatives_by_subject ON erasure_derivatives (tenant, subject);

-- (A PostgreSQL state store also keeps what each replica served and accepted in the window, for
-- the others; one SQLite process keeps it in memory.)
