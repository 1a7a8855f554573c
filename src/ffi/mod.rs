//! The C boundary: NCCL's v8 vtable and nothing else.
//!
//! Contract (see README "C contract"):
//! - Every entry point runs inside [`boundary::call`]: panics are caught and become
//!   `ncclInternalError`, errors become result codes through one table
//!   ([`error::to_nccl`]) and a WARN line.
//! - NULL out-pointers and NULL or foreign comm pointers are `ncclInvalidArgument`.
//! - Comm and memory-handle objects are owned by the plugin; NCCL gets opaque
//!   pointers and gives them back exactly once to close/dereg.

pub mod abi;
mod boundary;
pub mod error;
mod shims;

pub use shims::ncclNetPlugin_v8;
