//! Logging: `tracing` events forwarded to NCCL's logger.
//!
//! NCCL hands us a C variadic logger in `init`. Every `tracing` event becomes one
//! call `logger(level, NCCL_NET, file, line, "%s", message)`, so
//! `NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=NET` shows our lines with NCCL's prefixes.
//! Before `init` (or in tools with no NCCL), WARN and above go to stderr.

use std::ffi::CString;
use std::fmt::Write as _;
use std::sync::OnceLock;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::prelude::*;

use crate::ffi::abi::{ncclDebugLogLevel, ncclDebugLogger_t, NCCL_NET};

static LOGGER: OnceLock<ncclDebugLogger_t> = OnceLock::new();

/// Installs the bridge once per process. Later calls keep the first logger.
pub fn install(logger: ncclDebugLogger_t) {
    let _ = LOGGER.set(logger);
    let max = max_level_from_env();
    let _ = tracing::subscriber::set_global_default(
        tracing_subscriber::registry()
            .with(NcclLayer)
            .with(tracing_subscriber::filter::LevelFilter::from_level(max)),
    );
}

/// NCCL filters by `NCCL_DEBUG` itself; we only avoid formatting what it would drop.
fn max_level_from_env() -> Level {
    match std::env::var("NCCL_DEBUG")
        .unwrap_or_default()
        .to_ascii_uppercase()
        .as_str()
    {
        "TRACE" => Level::TRACE,
        "INFO" => Level::INFO,
        _ => Level::WARN,
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
        emit(
            level,
            meta.file().unwrap_or("nccl-net-zip"),
            meta.line().unwrap_or(0),
            &msg.0,
        );
    }
}

fn emit(level: ncclDebugLogLevel::Type, file: &str, line: u32, msg: &str) {
    let cmsg = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    match LOGGER.get().copied().flatten() {
        Some(logger) => {
            let cfile = CString::new(file).unwrap_or_default();
            // SAFETY: NCCL's logger is a printf-style variadic; "%s" with one
            // NUL-terminated string argument matches its contract.
            unsafe {
                logger(
                    level,
                    NCCL_NET as _,
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
