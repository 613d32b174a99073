//! The kit every store's adapter is built from: pure functions over a store's JSON that find
//! the facts a decision needs (the `lethe_*` stamp fields, the facts of a write's records, the
//! text an item serves), and rewrite requests and answers to what the decision allows. No I/O.

#[cfg(test)]
pub(crate) mod fixtures;
pub mod stamp;
pub mod text;
pub mod write;
