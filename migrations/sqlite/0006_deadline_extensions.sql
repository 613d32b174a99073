-- A request's statutory deadline may be extended once, with a reason, by up to two further
-- months (GDPR art. 12(3)); the deadline is its receipt plus [erasure] deadline_months plus these.
ALTER TABLE erasure_requests ADD COLUMN extended_months INTEGER NOT NULL DEFAULT 0;
ALTER TABLE erasure_requests ADD COLUMN extension_reason TEXT;
ALTER TABLE erasure_requests ADD COLUMN extended_by TEXT;
ALTER TABLE erasure_requests ADD COLUMN extended_at TEXT;
