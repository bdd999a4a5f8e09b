//! The instance layer, the bottom of the worker: one instance's life as a
//! plain state machine ([`Slot`]: activating, live, closing, closed; its
//! in-flight count; its activity stamps; its turns) and its abort signal
//! ([`abort`]).
//!
//! It knows nothing above it: not the namespace that holds an instance,
//! not the store, not pinboard, not HTTP. Whoever holds a slot passes in
//! what a transition needs (the time, whether it is exclusive) and acts on
//! what a transition reports ([`Vacated`]).

pub(crate) mod abort;
mod slot;

pub(crate) use self::slot::{
    Activation, ActivationFuture, Id, Instance, Slot, Stage, Vacated, WindDown,
};
