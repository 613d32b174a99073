//! Azure AI Search (issue 26), being built: so far `odata.rs`, the `$filter` language a client's
//! filter is parsed in and written again from, and `adapter.rs`, the filter Azure is sent in its
//! place (the caller's scope and "not expired" added).

pub mod adapter;
pub mod odata;
