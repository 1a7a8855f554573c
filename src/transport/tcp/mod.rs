//! Multi-stream TCP: every comm has the inline stream, which NCCL's thread drives
//! itself for small messages, and up to `NCCL_ZIP_NSTREAMS` data streams that the
//! sender opens when bulk traffic needs them, driven by the process's shared I/O
//! workers; any data stream may carry any chunk of any message. One listener per
//! address serves the whole process (`listen`). What a stream
//! receives is decided by one sans-IO machine (`stream`), which every driver uses.

pub mod codec_workers;
mod connect;
mod core;
mod inline;
mod listen;
pub mod pool;
mod recv;
mod send;
pub mod sock;
pub mod stream;
pub mod stream_tx;
pub mod workers;

pub use connect::{ConnectState, Target};
pub use listen::{ListenComm, STREAM_ACK};
pub use recv::RecvComm;
pub use send::SendComm;
