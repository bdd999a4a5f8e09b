//! Examples live beside this crate; run them with `cargo run --example <name>`.
