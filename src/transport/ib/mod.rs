//! InfiniBand / RoCE verbs transport (issue 7). See docs/IB.md.
//!
//! - [`proto`]: the data protocol as pure state machines (CTS FIFO, credits,
//!   split-send of compressed chunks), driving a [`fabric::Fabric`].
//! - [`mem_fabric`]: an in-memory RC model the protocol is tested against.
//! - [`verbs`]: libibverbs loaded at run time (no link-time dependency).
//! - [`device`]: HCA enumeration and `NCCL_IB_HCA` parsing.
//! - [`comm`]: the listen/send/recv comms NCCL holds: TCP bootstrap, progress
//!   driven by [`progress`]'s shared workers, memory registration cache.
//! - [`progress`]: the process-wide IB progress workers.
//! - [`dmabuf`]: whether NCCL will register GPU buffers through `regMrDmaBuf`.

pub mod comm;
pub mod device;
pub mod dmabuf;
pub mod fabric;
pub mod gdr;
pub mod mem_fabric;
pub mod progress;
pub mod proto;
pub mod region;
pub mod verbs;
