//! The plugin's internal API: what each vtable entry does, in safe Rust. The FFI
//! shims in [`crate::ffi`] only convert arguments and call these.

use std::collections::HashSet;
use std::ffi::CString;
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use tracing::info;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::net::{discover, Device};
use crate::proto::wire::{self, Handle, HANDLE_SIZE};
use crate::transport::tcp::{ConnectState, ListenComm, RecvComm, SendComm};

/// Process-wide plugin state, created by the first `init`.
pub struct Plugin {
    pub cfg: Arc<Config>,
    pub devices: Vec<Device>,
    /// C strings handed out in properties; they live as long as the process.
    names: Vec<(CString, Option<CString>)>,
    /// Connect states whose address we stored in an NCCL handle. Only these
    /// addresses are ever turned back into references.
    connecting: Mutex<HashSet<usize>>,
}

static PLUGIN: OnceLock<Plugin> = OnceLock::new();

pub fn init() -> Result<&'static Plugin> {
    if let Some(p) = PLUGIN.get() {
        return Ok(p);
    }
    let cfg = Config::from_env()?;
    let devices = discover(&cfg).map_err(|e| Error::io("listing network interfaces", e))?;
    if devices.is_empty() {
        return Err(Error::Internal(format!(
            "no usable network interface (NCCL_SOCKET_IFNAME={})",
            cfg.socket_ifname.as_deref().unwrap_or("<unset>")
        )));
    }
    let list: Vec<String> = devices
        .iter()
        .enumerate()
        .map(|(i, d)| format!("[{i}]{}:{}", d.name, d.addr))
        .collect();
    info!(
        "nccl-net-zip {} using {} ; compress={:?} dtype={:?} streams={} chunk={}",
        env!("CARGO_PKG_VERSION"),
        list.join(" "),
        cfg.compress,
        cfg.dtype,
        cfg.nstreams,
        cfg.max_chunk
    );
    let names = devices
        .iter()
        .map(|d| {
            (
                CString::new(d.name.clone()).unwrap_or_default(),
                d.pci_path
                    .as_ref()
                    .and_then(|p| CString::new(p.clone()).ok()),
            )
        })
        .collect();
    let p = Plugin {
        cfg: Arc::new(cfg),
        devices,
        names,
        connecting: Mutex::new(HashSet::new()),
    };
    Ok(PLUGIN.get_or_init(|| p))
}

pub fn get() -> Result<&'static Plugin> {
    PLUGIN
        .get()
        .ok_or_else(|| Error::InvalidUsage("plugin used before init".into()))
}

/// What getProperties reports.
pub struct Properties<'a> {
    pub name: &'a CString,
    pub pci_path: Option<&'a CString>,
    pub guid: u64,
    pub speed_mbps: i32,
    pub max_recvs: i32,
}

/// `irecv` accepts exactly one buffer per request.
pub const MAX_RECVS: i32 = 1;

impl Plugin {
    fn device(&self, dev: i32) -> Result<&Device> {
        usize::try_from(dev)
            .ok()
            .and_then(|d| self.devices.get(d))
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "device {dev} does not exist ({} devices)",
                    self.devices.len()
                ))
            })
    }

    pub fn properties(&self, dev: i32) -> Result<Properties<'_>> {
        let d = self.device(dev)?;
        let (name, pci) = &self.names[dev as usize];
        Ok(Properties {
            name,
            pci_path: pci.as_ref(),
            guid: dev as u64,
            speed_mbps: d.speed_mbps,
            max_recvs: MAX_RECVS,
        })
    }

    pub fn listen(&self, dev: i32, handle: &mut [u8; HANDLE_SIZE]) -> Result<ListenComm> {
        let d = self.device(dev)?;
        let l = ListenComm::bind(d.bind_addr(), self.cfg.clone())?;
        l.handle().encode(handle);
        Ok(l)
    }

    /// One non-blocking connect step; the progress is kept in `handle`.
    pub fn connect(&self, dev: i32, handle: &mut [u8; HANDLE_SIZE]) -> Result<Option<SendComm>> {
        let d = self.device(dev)?;
        let link_mbps = self.cfg.link_mbps.unwrap_or(d.speed_mbps as u64);
        let ptr = match wire::stage_get(handle).filter(|p| self.connecting.lock().contains(p)) {
            Some(p) => p as *mut ConnectState,
            None => {
                let h = Handle::decode(handle)?;
                let p = Box::into_raw(Box::new(ConnectState::start(
                    &h,
                    link_mbps,
                    self.cfg.clone(),
                )?));
                self.connecting.lock().insert(p as usize);
                wire::stage_set(handle, Some(p as usize));
                p
            }
        };
        // SAFETY: `ptr` came from Box::into_raw above and is still registered in
        // `connecting`, so it is live and only this (proxy) thread uses it.
        let progress = unsafe { (*ptr).progress() };
        if let Ok(false) = progress {
            return Ok(None);
        }
        self.connecting.lock().remove(&(ptr as usize));
        wire::stage_set(handle, None);
        // SAFETY: unregistered just above; we reclaim the box exactly once.
        let st = unsafe { Box::from_raw(ptr) };
        progress?;
        st.finish().map(Some)
    }
}

pub fn accept(l: &mut ListenComm) -> Result<Option<RecvComm>> {
    l.accept()
}
