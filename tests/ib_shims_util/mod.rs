//! Shared by the test binaries that call the exported vtable on IB comms made
//! over the in-memory fabric (each binary has its own plugin configuration,
//! which is read once per process).
#![allow(dead_code)]

use std::ffi::c_void;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use nccl_net_zip::ffi::abi::{ncclNet_v8_t, ncclResult_t};
use nccl_net_zip::ffi::{ncclNetPlugin_v8, testing};
use nccl_net_zip::plugin::{self, AnyRecv, AnySend, Plugin};
use nccl_net_zip::proto::wire::HANDLE_SIZE;
use nccl_net_zip::transport::ib::comm::{IbConfig, IbConnect, IbHandle, IbListenComm};
use nccl_net_zip::transport::ib::mem_fabric::{MemFabric, MemOpener};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::prelude::*;

pub fn vt() -> &'static ncclNet_v8_t {
    &ncclNetPlugin_v8.0
}

/// WARN lines logged in this process so far (by any test of the binary).
static WARNS: Mutex<Vec<String>> = Mutex::new(Vec::new());

pub fn warns_containing(s: &str) -> Vec<String> {
    WARNS
        .lock()
        .unwrap()
        .iter()
        .filter(|w| w.contains(s))
        .cloned()
        .collect()
}

struct Capture;

struct Msg(String);

impl Visit for Msg {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0.push_str(&format!("{value:?}"));
        }
    }
}

impl<S: Subscriber> Layer<S> for Capture {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        if *event.metadata().level() <= Level::WARN {
            let mut m = Msg(String::new());
            event.record(&mut m);
            WARNS.lock().unwrap().push(m.0);
        }
    }
}

/// Sets `env` (once per process, before the plugin reads its configuration),
/// captures WARN lines, and initialises the plugin (TCP bootstrap on lo).
pub fn setup(env: &[(&str, &str)]) -> &'static Plugin {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
        for (k, v) in env {
            std::env::set_var(k, v);
        }
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Capture))
            .expect("no other subscriber");
    });
    plugin::try_init().expect("plugin init")
}

/// An IB send/recv comm pair over the threaded in-memory fabric, configured
/// as the plugin configures its IB comms, as the pointers NCCL holds.
pub fn ib_pair(p: &Plugin) -> (*mut c_void, *mut c_void) {
    let cfg = Arc::new(IbConfig::from_config(&p.cfg, 100_000));
    let opener = Arc::new(MemOpener);
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut l = IbListenComm::bind(addr, opener.clone(), cfg.clone()).unwrap();
    let mut handle = [0u8; HANDLE_SIZE];
    l.handle().encode(&mut handle);
    let h = IbHandle::decode(&handle).unwrap();
    let mut st: Option<IbConnect<MemFabric>> = Some(IbConnect::start(&h, &*opener, &cfg).unwrap());
    let (mut s, mut r) = (None, None);
    let t0 = Instant::now();
    while s.is_none() || r.is_none() {
        assert!(t0.elapsed() < Duration::from_secs(20), "bootstrap hung");
        if let Some(c) = st.as_mut() {
            if c.progress().unwrap() {
                s = Some(st.take().unwrap().finish().unwrap());
            }
        }
        if r.is_none() {
            r = l.accept().unwrap();
        }
        std::thread::yield_now();
    }
    (
        testing::send_comm(AnySend::Ib(s.unwrap())),
        testing::recv_comm(AnyRecv::Ib(r.unwrap())),
    )
}

/// A real file descriptor to stand for a DMA-BUF (the in-memory fabric only
/// checks that it is one).
pub fn some_fd() -> std::fs::File {
    std::fs::File::open("/dev/null").unwrap()
}

pub fn ok(r: ncclResult_t, what: &str) {
    assert_eq!(r, ncclResult_t::ncclSuccess, "{what}");
}
