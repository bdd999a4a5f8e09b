//! libFuzzer entry for the `epoch` target; its body is shared with the
//! stable property tests (`crates/pinned-wire/tests/fuzz_targets`).
#![no_main]

#[path = "../../crates/pinned-wire/tests/fuzz_targets/mod.rs"]
mod targets;

libfuzzer_sys::fuzz_target!(|data: &[u8]| targets::epoch(data));
