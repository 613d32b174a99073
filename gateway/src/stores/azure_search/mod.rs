//! Azure AI Search (issue 26), being built: `odata.rs`, the `$filter` language a client's
//! filter is parsed in and written again from, and `adapter`, the pure half of the route.

pub mod adapter;
pub mod odata;
