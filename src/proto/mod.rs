//! Protocol logic with no I/O: wire layouts, the connect handle, the connection
//! bootstrap, request slots and the chunk plan. Everything here is deterministic and unit-tested without sockets.

pub mod bootstrap;
pub mod plan;
pub mod slots;
pub mod wire;
