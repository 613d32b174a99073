//! OpenTelemetry traces (OTLP/HTTP): what agents export to their trace store (Phoenix, LangSmith,
//! any OTLP receiver), governed span by span. The adapter (`adapter.rs`) comes first; the route
//! and the trace stores' connectors are built on it (issue 24).

pub mod adapter;
