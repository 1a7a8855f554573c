//! Multi-stream TCP: every comm has several sockets, driven by the process's
//! shared I/O workers, plus the inline stream that NCCL's thread drives itself for
//! small messages; any stream may carry any chunk of any message. What a stream
//! receives is decided by one sans-IO machine (`stream`), which every driver uses.

mod connect;
mod core;
mod inline;
mod listen;
mod recv;
mod send;
pub mod sock;
pub mod stream;
pub mod workers;

pub use connect::ConnectState;
pub use listen::ListenComm;
pub use recv::RecvComm;
pub use send::SendComm;
