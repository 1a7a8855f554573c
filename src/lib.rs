//! nccl-net-zip: an NCCL network plugin (`ncclNet_v8`) that compresses NCCL's
//! network traffic losslessly.
//!
//! Layout:
//! - [`ffi`]: the C boundary (vtable, shims, error table). Nothing else touches C.
//! - [`plugin`]: the plugin's safe internal API that the shims call.
//! - [`proto`]: pure protocol logic with no I/O (handshake, request slots, matching, chunking).
//! - [`transport`]: byte movers (TCP today), thin over the OS.
//! - [`net`]: network interface discovery and selection.
//! - [`config`], [`log`]: environment variables and the tracing → NCCL logger bridge.
//! - [`codec`]: the lossless float codec (re-exported `nccl-zip-codec` crate).

pub mod ffi;

pub use nccl_zip_codec as codec;
pub mod adapt;
pub mod budget;
pub mod codec_glue;
pub mod config;
pub mod devpath;
pub mod error;
pub mod gpu;
pub mod log;
pub mod net;
pub mod plugin;
pub mod proto;
pub mod stats;
pub mod stats_export;
pub mod transport;
