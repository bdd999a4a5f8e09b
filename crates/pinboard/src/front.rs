//! pinboard's service for the shared front ([`pinned_edge::front`]): the
//! proxied requests the front reads itself go to [`proxy::serve`] on the
//! connection's own task.
//!
//! Owns what the front's requests need beyond the front: which paths it
//! leaves to hyper (pinboard's own control paths, for the router of
//! [`server::router`](crate::server::router)), the `Host` check the front
//! counted for (RFC 9112 §3.2, so the proxy need not look again), a
//! broken body as the proxy's client-side error, and the connection's
//! timer for the worker's answer, reset per request. The read buffer, the
//! body deadline, keep-alive and the hand-over to hyper are the front's.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::body::Body;
use http::Request;
use pinned_edge::front::{Arrived, Service};
use tokio::time::Sleep;

use crate::app::App;
use crate::placement::PlacementStore;
use crate::proxy::headers::HostError;
use crate::proxy::{self, ClientAddr, Inbound, ProxyError};
use crate::server::paths;

/// One client connection's proxy, as the front serves it.
pub struct Front<S> {
    app: Arc<App<S>>,
    client: Arc<ClientAddr>,
    /// The deadline of each request's answer from its worker, reset per
    /// request (see `proxy::send::await_head`): one timer for the
    /// connection's life, not one per request.
    head_timer: Pin<Box<Sleep>>,
}

impl<S> Front<S> {
    /// The proxy of `app` for the connection from `client`.
    pub fn new(app: Arc<App<S>>, client: Arc<ClientAddr>) -> Self {
        let head_timer = Box::pin(tokio::time::sleep(app.proxy.body_timeout));
        Self {
            app,
            client,
            head_timer,
        }
    }
}

impl<S: PlacementStore> Service for Front<S> {
    type Body = Body;

    /// Every path but pinboard's own.
    fn takes(&self, path: &str) -> bool {
        !paths::is_control(path)
    }

    #[inline]
    fn call(&mut self, request: Arrived) -> impl Future<Output = http::Response<Body>> + Send {
        let Arrived { head, body, hosts } = request;
        let host = match hosts {
            1 => Ok(()),
            0 => Err(HostError::Missing),
            _ => Err(HostError::Repeated),
        };
        let inbound = match (body, host) {
            (Ok(_), Err(bad_host)) => Inbound::Refused(ProxyError::bad_host(bad_host)),
            (Ok(body), Ok(())) => {
                let body = match body {
                    Some(bytes) => Body::from(bytes),
                    None => Body::empty(),
                };
                Inbound::HostChecked(Request::from_parts(head, body))
            }
            (Err(fault), _) => Inbound::Refused(ProxyError::client_body(fault)),
        };
        proxy::serve(
            &self.app,
            Some(&self.client),
            inbound,
            Some(self.head_timer.as_mut()),
        )
    }
}
