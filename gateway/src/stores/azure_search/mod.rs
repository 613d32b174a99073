//! Azure AI Search (issue 26), being built: so far `odata.rs`, the `$filter` language a client's
//! filter is parsed in and written again from before the caller's scope is added to it.

pub mod odata;
