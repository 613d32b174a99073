//! An Azure AI Search `$filter` as a client sends it: parsed or refused, never a panic, and
//! nesting bounded by the parser, not by the stack.
#![no_main]

use lethe_stores::azure_search::odata;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = odata::parse(text);
    }
});
