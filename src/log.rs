//! Logging: `tracing` events forwarded to NCCL's logger.
//!
//! NCCL hands us a C variadic logger in `init`. Every `tracing` event becomes one
//! call `logger(level, flags, file, line, "%s", message)`, with NCCL's prefixes.
//! NCCL filters lines by `NCCL_DEBUG_SUBSYS` as well as by level, and its default
//! mask has `INIT` but not `NET`, so:
//! - WARN lines carry `NCCL_ALL`, as NCCL's own WARNs do: always shown;
//! - the init banner (events with target [`BANNER`]) carries `NCCL_INIT|NCCL_NET`,
//!   so plain `NCCL_DEBUG=INFO` shows it;
//! - every other line carries `NCCL_NET` (`NCCL_DEBUG_SUBSYS=NET` shows them).
//!
//! Before `init` (or in tools with no NCCL), WARN and above go to stderr.

use std::ffi::CString;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Once;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::prelude::*;

use crate::ffi::abi::{ncclDebugLogLevel, ncclDebugLogger_t, NCCL_ALL, NCCL_INIT, NCCL_NET};

/// The `tracing` target of the init banner: logged with `NCCL_INIT|NCCL_NET`.
pub const BANNER: &str = "nccl_zip_banner";

/// The logger of the latest `init` (0: none). NCCL's logger lives in libnccl,
/// which outlives us; a reloaded NCCL hands its new one to the next `init`.
static LOGGER: AtomicUsize = AtomicUsize::new(0);

/// Installs the bridge: the `tracing` subscriber once per process, and `logger`
/// as the one every line goes to from now on.
pub fn install(logger: ncclDebugLogger_t) {
    if let Some(f) = logger {
        LOGGER.store(f as usize, Ordering::Release);
    }
    static SUBSCRIBER: Once = Once::new();
    SUBSCRIBER.call_once(|| {
        let max = crate::config::nccl_debug_level();
        let _ = tracing::subscriber::set_global_default(
            tracing_subscriber::registry()
                .with(NcclLayer)
                .with(tracing_subscriber::filter::LevelFilter::from_level(max)),
        );
    });
}

fn logger() -> ncclDebugLogger_t {
    match LOGGER.load(Ordering::Acquire) {
        0 => None,
        // SAFETY: only ever stored from a non-NULL `ncclDebugLogger_t` above
        // (an `Option` of a function pointer has the pointer's layout).
        f => unsafe { std::mem::transmute::<usize, ncclDebugLogger_t>(f) },
    }
}

struct NcclLayer;

#[derive(Default)]
struct Message(String);

impl Visit for Message {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0.push_str(value);
        } else {
            let _ = write!(self.0, " {}={}", field.name(), value);
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        } else {
            let _ = write!(self.0, " {}={:?}", field.name(), value);
        }
    }
}

impl<S: Subscriber> Layer<S> for NcclLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let meta = event.metadata();
        let mut msg = Message(String::from("NET/Zip : "));
        event.record(&mut msg);
        let level = match *meta.level() {
            Level::ERROR | Level::WARN => ncclDebugLogLevel::NCCL_LOG_WARN,
            Level::INFO => ncclDebugLogLevel::NCCL_LOG_INFO,
            _ => ncclDebugLogLevel::NCCL_LOG_TRACE,
        };
        let flags = if level == ncclDebugLogLevel::NCCL_LOG_WARN {
            NCCL_ALL as u64
        } else if meta.target() == BANNER {
            (NCCL_INIT | NCCL_NET) as u64
        } else {
            NCCL_NET as u64
        };
        emit(
            level,
            flags,
            meta.file().unwrap_or("nccl-net-zip"),
            meta.line().unwrap_or(0),
            &msg.0,
        );
    }
}

fn emit(level: ncclDebugLogLevel::Type, flags: u64, file: &str, line: u32, msg: &str) {
    let cmsg = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    match logger() {
        Some(logger) => {
            let cfile = CString::new(file).unwrap_or_default();
            // SAFETY: NCCL's logger is a printf-style variadic; "%s" with one
            // NUL-terminated string argument matches its contract.
            unsafe {
                logger(
                    level,
                    flags as _,
                    cfile.as_ptr(),
                    line as i32,
                    c"%s".as_ptr(),
                    cmsg.as_ptr(),
                );
            }
        }
        None if level == ncclDebugLogLevel::NCCL_LOG_WARN => eprintln!("{msg}"),
        None => {}
    }
}
