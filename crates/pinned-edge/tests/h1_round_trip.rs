//! What the codec writes, it reads back: a response written by
//! [`write::response`] (length-framed or chunked, with trailers) and a
//! request head written by [`write::request_line`] and its kin parse to
//! the same status, fields and body.

mod fuzz_targets;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Method};
use http_body_util::{BodyExt, Full, StreamBody};
use pinned_edge::h1::head::{self, Fields};
use pinned_edge::h1::write::{self, After, Asked};
use proptest::prelude::*;

fn fields() -> impl Strategy<Value = Vec<(String, String)>> {
    prop::collection::vec(("x-[a-z]{1,8}", "[ -~]{0,16}"), 0..6).prop_map(|fields| {
        fields
            .into_iter()
            .map(|(name, value)| (name, value.trim().to_owned()))
            .collect()
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn responses_read_back_as_written(
        status in prop_oneof![Just(200u16), Just(201), Just(404), Just(503)],
        fields in fields(),
        pieces in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 0..4),
        streamed in any::<bool>(),
    ) {
        let whole: Vec<u8> = pieces.concat();
        let mut builder = http::Response::builder().status(status).header("trailer", "x-sum");
        for (name, value) in &fields {
            builder = builder.header(name.as_str(), value.as_str());
        }
        let body = if streamed {
            let mut frames: Vec<Result<_, std::io::Error>> = pieces
                .iter()
                .map(|p| Ok(http_body::Frame::data(Bytes::copy_from_slice(p))))
                .collect();
            let mut trailers = HeaderMap::new();
            trailers.insert("x-sum", HeaderValue::from(whole.len()));
            frames.push(Ok(http_body::Frame::trailers(trailers)));
            StreamBody::new(futures_util::stream::iter(frames)).boxed_unsync()
        } else {
            Full::new(Bytes::from(whole.clone())).map_err(|never| match never {}).boxed_unsync()
        };
        let res = builder.body(body).expect("response");
        let mut wire = std::io::Cursor::new(Vec::new());
        let asked = Asked { head_only: false, trailers: true };
        let after = runtime().block_on(write::response(&mut wire, &mut Vec::new(), res, asked, false));
        prop_assert_eq!(after, After::KeepAlive);
        let wire = wire.into_inner();

        let mut buf = BytesMut::from(&wire[..]);
        let parsed = head::response_head(&mut buf, &mut Fields::default(), false, &mut 0, 1 << 16)
            .expect("valid")
            .expect("complete");
        prop_assert_eq!(parsed.response.status().as_u16(), status);
        prop_assert!(parsed.keep_alive);
        for (name, value) in &fields {
            let name = HeaderName::from_bytes(name.as_bytes()).expect("name");
            let got: Vec<_> = parsed.response.headers().get_all(&name).iter().collect();
            prop_assert!(got.iter().any(|v| *v == value.as_str()), "{} lost", name);
        }
        let body = fuzz_targets::decode(parsed.framing, &buf, 5).expect("body");
        prop_assert_eq!(body, whole);
    }

    #[test]
    fn request_heads_read_back_as_written(
        method in prop_oneof![Just(Method::GET), Just(Method::POST), Just(Method::DELETE)],
        target in "/[a-z0-9/]{0,12}(\\?[a-z=&]{0,8})?",
        fields in fields(),
        body_len in 0usize..5000,
    ) {
        let mut headers = HeaderMap::new();
        for (name, value) in &fields {
            headers.append(
                HeaderName::from_bytes(name.as_bytes()).expect("name"),
                HeaderValue::from_str(value).expect("value"),
            );
        }
        let mut out = Vec::new();
        write::request_line(&mut out, &method, &target);
        write::fields(&mut out, &headers, |_| false);
        write::request_end(&mut out, &method, body_len);

        let mut parsed = Fields::default();
        let line = head::parse_request(&out, &mut parsed).expect("valid").expect("complete");
        prop_assert_eq!(line.len, out.len());
        let head = Bytes::from(out);
        let request = head::request_head(&head, &line, &parsed).expect("request");
        prop_assert_eq!(&request.parts.method, &method);
        prop_assert_eq!(request.parts.uri.to_string(), target);
        prop_assert_eq!(&request.parts.headers.len(), &(headers.len() + usize::from(request.notes.length.is_some())));
        let framing = request.notes.request_framing(request.parts.version).expect("framing");
        let announced = body_len > 0 || method == Method::POST;
        prop_assert_eq!(request.notes.length, announced.then_some(body_len as u64));
        prop_assert_eq!(framing, pinned_edge::h1::framing::Framing::Fixed(body_len as u64 * u64::from(announced)));
    }
}
