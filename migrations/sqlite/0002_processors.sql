-- Which model providers (processors) received a subject's data, first and last time.
CREATE TABLE processors (
    tenant    TEXT NOT NULL,
    subject   TEXT NOT NULL,
    processor TEXT NOT NULL,
    first_at  TEXT NOT NULL,
    last_at   TEXT NOT NULL,
    PRIMARY KEY (tenant, subject, processor)
);
