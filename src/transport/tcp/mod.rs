//! Multi-stream TCP: every comm has several sockets, each driven by its own I/O
//! thread, plus the inline stream that NCCL's thread drives itself for small
//! messages; any stream may carry any chunk of any message.

mod connect;
mod core;
mod inline;
mod listen;
mod recv;
mod send;
pub mod sock;

pub use connect::ConnectState;
pub use listen::ListenComm;
pub use recv::RecvComm;
pub use send::SendComm;
