//! Network devices: which interfaces the plugin exposes to NCCL, and their properties.

pub mod iface;

pub use iface::{discover, Device};
