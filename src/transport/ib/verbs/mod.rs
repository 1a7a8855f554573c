//! libibverbs in three layers (as cudarc does for CUDA): [`sys`] declarations,
//! [`loader`] (run-time `dlopen`), [`safe`] owners and the real `Fabric`.

pub mod loader;
pub mod safe;
pub mod sys;

pub use safe::{Context, MemReg, QpInfo, QpParams, VerbsFabric, VerbsOpener, VerbsRegistrar};
