//! Held sockets: WebSockets this node holds for the workers of namespaces
//! that opted in (the exchange is `pinned_wire::held`). The client's
//! connection ends here; its events go to the id's current owner through
//! the proxy, so a move of the id (a drain, a wind-down, a new deployment,
//! a failover) never closes it: the next event is placed like any request.
//!
//! Owns the sockets this node holds ([`HeldSockets`], bounded by the
//! connection cap: a held socket keeps its connection's slot), their tasks
//! ([`socket`]), and the sends that reach them ([`fanout::deliver`]).
//! Never resolves or places an id itself: an event is a request through
//! the [`Door`] the proxy provides. Nodes sharing one Redis relay their
//! sends to each other ([`relay`]), so a send reaches an id's sockets on
//! every node. A node that dies drops only the sockets it held; their
//! clients reconnect through another node.

pub mod door;
pub mod fanout;
pub mod publish;
pub mod registry;
pub mod relay;
pub mod socket;

pub use self::door::{Door, EventMark, HeldDoor};
pub use self::registry::{HeldSettings, HeldSocket, HeldSockets, Outgoing};
