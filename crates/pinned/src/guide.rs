// The guide: every chapter in `crates/pinned/guide/`, one module each.
//
// The Markdown is written to be read on GitHub as it is; here it is
// included, so docs.rs renders the guide and every Rust block in it
// compiles as a doctest of this crate (an example that no longer matches
// the API fails the test suite). This module holds no code and must never
// hold any: chapters only.
#![doc = rustdoc_links!()]
#![doc = include_str!("../guide/README.md")]

/// One chapter: the shared link definitions, then the chapter's Markdown.
macro_rules! chapter {
    ($name:ident, $file:literal) => {
        #[doc = rustdoc_links!()]
        #[doc = include_str!(concat!("../guide/", $file))]
        pub mod $name {}
    };
}

chapter!(concepts, "concepts.md");
chapter!(first_object, "first-object.md");
chapter!(shared_state_and_auth, "shared-state-and-auth.md");
chapter!(durable_state_and_trays, "durable-state-and-trays.md");
chapter!(alarms_and_schedules, "alarms-and-schedules.md");
chapter!(sockets, "sockets.md");
chapter!(behind_pinboard, "behind-pinboard.md");
chapter!(operating_a_fleet, "operating-a-fleet.md");
chapter!(migrating_from_python, "migrating-from-python.md");
chapter!(guarantees_and_limits, "guarantees-and-limits.md");
chapter!(configuration, "configuration.md");
chapter!(wire, "wire.md");
chapter!(benchmarks, "benchmarks.md");
