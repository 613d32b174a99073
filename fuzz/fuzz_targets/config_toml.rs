//! A configuration file: read or refused with its problems, never a panic.
#![no_main]

use lethe_data::config::Config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = Config::check(text);
    }
});
