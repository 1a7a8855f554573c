//! Byte movers. Each transport turns the protocol in [`crate::proto`] into I/O.
//! TCP is the only one today; InfiniBand verbs will sit beside it.

pub mod boot;
pub mod ib;
pub mod tcp;
