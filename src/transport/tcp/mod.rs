//! Multi-stream TCP: every comm has several sockets, each driven by its own I/O
//! thread; any stream may carry any chunk of any message.

mod connect;
mod core;
mod listen;
mod recv;
mod send;
pub mod sock;

pub use connect::ConnectState;
pub use listen::ListenComm;
pub use recv::RecvComm;
pub use send::SendComm;
