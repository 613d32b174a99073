-- An erasure's certificate, signed once when the request completes and served byte for byte
-- ever after.
CREATE TABLE certificates (
    request_id TEXT PRIMARY KEY REFERENCES erasure_requests (id),
    document   TEXT NOT NULL
);
