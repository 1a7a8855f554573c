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

/// For tests: a comm made in Rust as the pointer NCCL would hold, so that the
/// vtable entries can be called on it. Give it back with `closeSend` or
/// `closeRecv`.
#[doc(hidden)]
pub mod testing {
    use std::ffi::c_void;

    use super::boundary::Obj;
    use crate::plugin::{AnyRecv, AnySend};

    pub fn send_comm(c: AnySend) -> *mut c_void {
        Obj::into_raw(c)
    }

    pub fn recv_comm(c: AnyRecv) -> *mut c_void {
        Obj::into_raw(c)
    }
}
