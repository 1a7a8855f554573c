//! Shared by the GPU test binaries (`mod gpu_util;`).
#![allow(dead_code)]

use std::io::Write;
use std::time::Duration;

use nccl_net_zip::gpu::{GpuBatch, JobOutcome};

/// Waits up to `limit` for the batch just launched. A kernel that does not finish
/// ends the whole process (status 3) after one clear line, instead of a panic:
/// libtest would run the next test in this process, whose synchronous copies on the
/// legacy stream (and the frees while unwinding this one) would block behind the
/// hung kernel until the caller's time limit. `_exit` skips atexit handlers (the
/// CUDA driver's teardown could wait for the kernel as well).
pub fn wait_or_exit(batch: &GpuBatch, what: &str, limit: Duration) -> Vec<JobOutcome> {
    match batch.wait(limit) {
        Ok(r) => r,
        Err(e) => {
            let test = std::thread::current()
                .name()
                .map(|t| format!("test {t}, "))
                .unwrap_or_default();
            let _ = std::io::stdout().flush();
            eprintln!(
                "KERNEL DID NOT FINISH: {test}{what}: no result within {limit:?} ({e}); \
                 exiting with status 3 (later tests of this binary would block behind it)"
            );
            let _ = std::io::stderr().flush();
            // SAFETY: ends the process at once; nothing is shared with other processes.
            unsafe { libc::_exit(3) }
        }
    }
}
