//! Lethe's decision core.
//!
//! Pure on purpose: no I/O, no clock (every function that depends on time takes `now`), no
//! panics. The gateway feeds it a policy snapshot and the facts of a request and gets back a
//! decision; everything here can be tested with plain data.

#![forbid(unsafe_code)]
// The decision core must not be able to panic: these are errors in CI (clippy -D warnings);
// tests may (clippy.toml).
#![warn(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

pub mod audit;
pub mod consent;
pub mod decision;
pub mod derivation;
pub mod erasure;
pub mod hold;
pub mod names;
pub mod progress;
pub mod retention;
pub mod subject;

pub use consent::{Action, ConsentGrant, ConsentStatus};
pub use decision::{
    Held, Overwrite, PolicySnapshot, PolicyView, ProviderGrant, ReadContext, Refusal, Stamp,
    SubjectPolicy, WriteFacts, decide_provider, decide_read, decide_read_item, decide_write,
    decide_write_over, still_current,
};
pub use derivation::{How, ItemRef, Parent, TraceId, decide_derivation};
pub use erasure::{ApprovalError, ErasureEvent, ErasureState, IllegalTransition};
pub use hold::LegalHold;
pub use retention::{Layer, MaxAge, RetentionBounds, RetentionPolicy, RetentionRule, retain_until};
pub use subject::{SubjectState, SubjectStatus};
