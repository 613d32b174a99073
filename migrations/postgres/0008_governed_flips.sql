-- A flip must also hold in every governed PostgreSQL database: the database has applied it and
-- no transaction that began before it (and may still read or write the subject there) is left.
-- One row per request and database, from the flip until it holds there; the request says
-- `suppressed` only once every row is applied.
CREATE TABLE erasure_flips (
    request_id TEXT NOT NULL REFERENCES erasure_requests (id),
    database   TEXT NOT NULL,
    applied_at TIMESTAMPTZ,
    PRIMARY KEY (request_id, database)
);
CREATE INDEX erasure_flips_pending ON erasure_flips (database, request_id) WHERE applied_at IS NULL;
