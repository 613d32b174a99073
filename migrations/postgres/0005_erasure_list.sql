-- The console lists a tenant's requests newest first.
CREATE INDEX erasure_requests_by_received ON erasure_requests (tenant, requested_at);
-- The console's timeline of a request: the audit events naming it or its purge jobs.
CREATE INDEX audit_events_by_target ON audit_events (tenant, target_ref);
