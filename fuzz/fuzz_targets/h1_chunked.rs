//! libFuzzer entry for the `h1_chunked` target; its body is shared with the
//! stable property tests (`crates/pinned-edge/tests/fuzz_targets`).
#![no_main]

#[path = "../../crates/pinned-edge/tests/fuzz_targets/mod.rs"]
mod targets;

libfuzzer_sys::fuzz_target!(|data: &[u8]| targets::chunked(data));
