//! The HTTP/1 codec's fuzz targets (`tests/fuzz_targets`) on stable:
//! proptest feeds each arbitrary bytes, and bytes shaped like a message
//! (a start line, framing fields with good and bad values, chunked bodies
//! with junk where lenient parsers skip it), so the checks reach past the
//! first line. cargo-fuzz runs the same targets from `fuzz/` (nightly).

mod fuzz_targets;

use proptest::prelude::*;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 512,
        ..ProptestConfig::default()
    }
}

/// A framing field, valid or not.
fn framing_field() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9]{1,3}".prop_map(|n| format!("content-length: {n}\r\n")),
        prop_oneof![
            Just("+2"),
            Just("2, 2"),
            Just("0x2"),
            Just("99999999999999999999"),
            Just("")
        ]
        .prop_map(|v| format!("content-length: {v}\r\n")),
        prop_oneof![
            Just("chunked"),
            Just("gzip, chunked"),
            Just("chunked, gzip"),
            Just("chunked,"),
            Just(", chunked"),
            Just(""),
        ]
        .prop_map(|v| format!("transfer-encoding: {v}\r\n")),
        Just("connection: close\r\n".to_owned()),
        Just("te: trailers\r\n".to_owned()),
    ]
}

/// A chunked body: chunks with sizes, extensions and junk, a last chunk,
/// trailers; or not quite.
fn chunked_body() -> impl Strategy<Value = Vec<u8>> {
    let chunk = (
        1usize..20,
        prop_oneof![Just(""), Just(";x=y"), Just(" "), Just("x"), Just("\r")],
        prop_oneof![Just("\r\n"), Just("\n"), Just(""), Just("x\r\n")],
    )
        .prop_map(|(n, ext, end)| format!("{n:x}{ext}\r\n{}{end}", "d".repeat(n)));
    (
        prop::collection::vec(chunk, 0..4),
        prop_oneof![
            Just("0\r\n\r\n"),
            Just("0\r\nx-t: 1\r\n\r\n"),
            Just("0\r\n"),
            Just("")
        ],
    )
        .prop_map(|(chunks, last)| (chunks.concat() + last).into_bytes())
}

fn request_shaped() -> impl Strategy<Value = Vec<u8>> {
    (
        prop_oneof![Just("GET"), Just("POST"), Just("HEAD")],
        prop_oneof![Just("1.1"), Just("1.0"), Just("1.2")],
        prop::collection::vec(framing_field(), 0..3),
        prop_oneof![chunked_body(), "[a-z]{0,8}".prop_map(String::into_bytes)],
    )
        .prop_map(|(method, version, fields, body)| {
            let mut wire = format!(
                "{method} /c/a HTTP/{version}\r\nhost: pb\r\n{}\r\n",
                fields.concat()
            )
            .into_bytes();
            wire.extend_from_slice(&body);
            wire
        })
}

fn response_shaped() -> impl Strategy<Value = Vec<u8>> {
    (
        any::<u8>(),
        prop_oneof![Just("200 OK"), Just("204 No Content"), Just("100 Continue")],
        prop::collection::vec(framing_field(), 0..3),
        prop_oneof![chunked_body(), "[a-z]{0,8}".prop_map(String::into_bytes)],
    )
        .prop_map(|(flags, status, fields, body)| {
            let mut wire = vec![flags];
            wire.extend_from_slice(
                format!("HTTP/1.1 {status}\r\n{}\r\n", fields.concat()).as_bytes(),
            );
            wire.extend_from_slice(&body);
            wire
        })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn request_any_bytes(data in prop::collection::vec(any::<u8>(), 0..256)) {
        fuzz_targets::request(&data);
    }

    #[test]
    fn request_shaped_bytes(data in request_shaped()) {
        fuzz_targets::request(&data);
    }

    #[test]
    fn response_any_bytes(data in prop::collection::vec(any::<u8>(), 0..256)) {
        fuzz_targets::response(&data);
    }

    #[test]
    fn response_shaped_bytes(data in response_shaped()) {
        fuzz_targets::response(&data);
    }

    #[test]
    fn chunked_any_bytes(data in prop::collection::vec(any::<u8>(), 0..128)) {
        fuzz_targets::chunked(&data);
    }

    #[test]
    fn chunked_shaped_bytes(data in chunked_body()) {
        fuzz_targets::chunked(&data);
    }

    #[test]
    fn trailers_any_bytes(data in prop::collection::vec(any::<u8>(), 0..128)) {
        fuzz_targets::trailers(&data);
    }
}
