-- The console lists a tenant's requests newest first.
CREATE INDEX erasure_requests_by_received ON erasure_requests (tenant, requested_at);
