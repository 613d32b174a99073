-- A request's statutory deadline, set at receipt ([erasure] deadline_months after it) and
-- extendable once, with a reason, by up to two further months (GDPR art. 12(3)). Requests filed
-- before this migration are given the default month by `lethe` right after it.
ALTER TABLE erasure_requests ADD COLUMN due_at TEXT;
ALTER TABLE erasure_requests ADD COLUMN extended_months INTEGER NOT NULL DEFAULT 0;
ALTER TABLE erasure_requests ADD COLUMN extension_reason TEXT;
ALTER TABLE erasure_requests ADD COLUMN extended_by TEXT;
ALTER TABLE erasure_requests ADD COLUMN extended_at TEXT;
-- A request refused before its flip (identity not confirmed, an exemption of art. 17(3)): who
-- refused it, when and why, as the data subject is told (art. 12(4)).
ALTER TABLE erasure_requests ADD COLUMN rejection_reason TEXT;
ALTER TABLE erasure_requests ADD COLUMN rejected_by TEXT;
ALTER TABLE erasure_requests ADD COLUMN rejected_at TEXT;
-- The console's summary and deadline filters read open requests, newest first, from this index;
-- its list pages walk the tenant's requests newest first without sorting them.
CREATE INDEX erasure_requests_open ON erasure_requests (tenant, requested_at, id, due_at, state)
    WHERE state NOT IN ('completed', 'rejected');
DROP INDEX erasure_requests_by_received;
CREATE INDEX erasure_requests_by_received ON erasure_requests (tenant, requested_at, id);
