//! The control-plane layer: everything the worker says to and hears from
//! pinboard, and what it needs to keep its word. The registration loop
//! ([`registration`]), the session and its state ([`pinboard`]), the
//! lease ([`lease`]) and what an instance sees of it
//! ([`instance_lease`]), placement fences ([`fence`]), local mode or
//! pinboard ([`control`]), cluster calls between instances
//! ([`cluster`], in process through the [`switchboard`]), and what is
//! advertised ([`advertise`], [`headroom`]).
//!
//! It sits on the instance layer and knows nothing above it: the
//! namespaces it commands (pinboard's wind-downs, duplicates, drains) are
//! handed to the registration loop as [`Commanded`](registration::Commanded)
//! views, and a cluster client is given its switchboard and plane, never a
//! namespace.

pub(crate) mod advertise;
pub(crate) mod cluster;
pub(crate) mod control;
pub(crate) mod fence;
pub(crate) mod headroom;
pub(crate) mod instance_lease;
pub(crate) mod lease;
pub(crate) mod pinboard;
pub(crate) mod registration;
pub(crate) mod switchboard;
