//! Multi-threaded helpers for large buffers (not the plugin's hot path).
pub use crate::encode::compress as compress_parallel_placeholder;
