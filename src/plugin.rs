//! The plugin's internal API: what each vtable entry does, in safe Rust. The FFI
//! shims in [`crate::ffi`] only convert arguments and call these.

use std::collections::HashSet;
use std::ffi::CString;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use tracing::{info, warn};

use crate::config::{Config, TransportChoice};
use crate::error::{Error, Result};
use crate::net::{discover, Device};
use crate::proto::wire::{self, Handle, HANDLE_SIZE};
use crate::transport::ib::comm::{
    IbConfig, IbConnect, IbHandle, IbListenComm, IbRecvComm, IbSendComm,
};
use crate::transport::ib::device::{enumerate, HcaFilter, IbDevice};
use crate::transport::ib::verbs::{Context, QpParams, VerbsFabric, VerbsOpener};
use crate::transport::tcp::{ConnectState, ListenComm, RecvComm, SendComm};

/// The comms NCCL holds, of whichever transport `init` chose.
pub enum AnyListen {
    Tcp(ListenComm),
    Ib(IbListenComm<VerbsOpener>),
}
pub enum AnySend {
    Tcp(SendComm),
    Ib(IbSendComm),
}
pub enum AnyRecv {
    Tcp(RecvComm),
    Ib(IbRecvComm),
}

impl AnySend {
    /// The comm's failure report (one WARN per comm).
    pub fn report(&self) -> &crate::proto::slots::Report {
        match self {
            AnySend::Tcp(c) => c.report(),
            AnySend::Ib(c) => c.report(),
        }
    }
}

impl AnyRecv {
    /// The comm's failure report (one WARN per comm).
    pub fn report(&self) -> &crate::proto::slots::Report {
        match self {
            AnyRecv::Tcp(c) => c.report(),
            AnyRecv::Ib(c) => c.report(),
        }
    }
}

/// The IB side of the plugin when `init` chose verbs.
pub struct IbState {
    pub devices: Vec<IbDevice>,
    names: Vec<(CString, Option<CString>)>,
    /// One opened device (PD) per port, on first use.
    openers: Vec<Mutex<Option<Arc<VerbsOpener>>>>,
}

/// Process-wide plugin state, created by the first `init`.
pub struct Plugin {
    pub cfg: Arc<Config>,
    pub devices: Vec<Device>,
    /// C strings handed out in properties; they live as long as the process.
    names: Vec<(CString, Option<CString>)>,
    /// Connect states whose address we stored in an NCCL handle. Only these
    /// addresses are ever turned back into references.
    connecting: Mutex<HashSet<usize>>,
    /// `Some` when the data moves over IB verbs (TCP then only bootstraps).
    pub ib: Option<IbState>,
    /// Why `init` left the plugin without devices.
    pub disabled: Option<String>,
}

impl Plugin {
    /// A plugin with 0 devices: what a failed initialization leaves.
    fn disabled(why: String) -> Plugin {
        Plugin {
            cfg: Arc::new(Config::default()),
            devices: Vec::new(),
            names: Vec::new(),
            connecting: Mutex::new(HashSet::new()),
            ib: None,
            disabled: Some(why),
        }
    }
}

static PLUGIN: OnceLock<Plugin> = OnceLock::new();

/// `init`: builds the plugin once per process (later calls, after a reload or
/// from NCCL 2.28+'s per-communicator init, find it built). Never fails: a bad
/// variable, no usable interface or no IB port where `NCCL_ZIP_TRANSPORT=ib`
/// asks for one leaves a plugin with 0 devices, logged with one WARN, so that
/// every NCCL version disables it cleanly (a failed `init` makes NCCL
/// 2.28.3–2.29.3 call a NULL `finalize`). A panic while building does the same.
pub fn init() -> &'static Plugin {
    PLUGIN.get_or_init(|| {
        let built = std::panic::catch_unwind(build)
            .unwrap_or_else(|_| Err(Error::Internal("panic while initializing".into())));
        match built {
            Ok(p) => p,
            Err(e) => {
                warn!(
                    "nccl-net-zip {} is disabled (0 devices), NCCL will not use it: {e}",
                    env!("CARGO_PKG_VERSION")
                );
                Plugin::disabled(e.to_string())
            }
        }
    })
}

/// [`init`], with a disabled plugin as the error that disabled it (for tests
/// and tools that need devices).
pub fn try_init() -> Result<&'static Plugin> {
    let p = init();
    match &p.disabled {
        Some(why) => Err(Error::InvalidUsage(format!("plugin disabled: {why}"))),
        None => Ok(p),
    }
}

fn build() -> Result<Plugin> {
    let cfg = Arc::new(Config::from_env()?);
    crate::config::install(cfg.clone());
    if let Some(path) = &cfg.stats_file {
        crate::stats_export::start(path, cfg.stats_interval, cfg.stats_per_comm);
    }
    let devices = discover(&cfg).map_err(|e| Error::io("listing network interfaces", e))?;
    if devices.is_empty() {
        return Err(Error::Internal(format!(
            "no usable network interface (NCCL_SOCKET_IFNAME={})",
            cfg.socket_ifname.as_deref().unwrap_or("<unset>")
        )));
    }
    let ib = choose_ib(&cfg)?;
    let list: Vec<String> = devices
        .iter()
        .enumerate()
        .map(|(i, d)| format!("[{i}]{}:{}", d.name, d.addr))
        .collect();
    let changed = cfg.non_defaults();
    info!(
        target: crate::log::BANNER,
        "nccl-net-zip {} (commit {}, GPU kernels {}) transport {} over {} ; compress={:?} ; settings changed from default: {}",
        env!("CARGO_PKG_VERSION"),
        env!("NZC_GIT_COMMIT"),
        if crate::gpu::codec::kernels_embedded() { "embedded" } else { "not embedded (NVRTC only)" },
        if ib.is_some() { "IB verbs" } else { "TCP" },
        list.join(" "),
        cfg.compress,
        if changed.is_empty() { "none".to_string() } else { changed.join(" ") },
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
    Ok(Plugin {
        cfg,
        devices,
        names,
        connecting: Mutex::new(HashSet::new()),
        ib,
        disabled: None,
    })
}

/// `NCCL_ZIP_TRANSPORT`: `tcp` never looks for IB; `auto` uses IB when an active
/// port exists and says why not otherwise; `ib` without a port is an error.
fn choose_ib(cfg: &Config) -> Result<Option<IbState>> {
    if cfg.transport == TransportChoice::Tcp {
        // An INFO under NCCL_INIT, not a WARN: NCCL keeps the last WARN as the
        // job's error text, and nothing is wrong. sysfs only: TCP loads no verbs.
        let active = crate::transport::ib::device::active_ports_in_sysfs(Path::new("/"));
        if !active.is_empty() {
            info!(
                target: crate::log::BANNER,
                "nccl-net-zip: this host has active InfiniBand/RoCE ports ({}) but the plugin runs over TCP (NCCL_ZIP_TRANSPORT=tcp, the default): NCCL's own IB transport (NCCL_NET=IB, no plugin) is likely faster there; NCCL_ZIP_TRANSPORT=auto uses these ports with compression (verbs path not yet run on RDMA hardware, docs/IB.md)",
                active.join(" ")
            );
        }
        return Ok(None);
    }
    let filter = HcaFilter::parse(cfg.ib_hca.as_deref().unwrap_or(""));
    let found = enumerate(&filter, cfg.ib_gid_index).and_then(|d| {
        if d.is_empty() {
            Err(format!(
                "no active IB/RoCE port (NCCL_IB_HCA={})",
                cfg.ib_hca.as_deref().unwrap_or("<unset>")
            ))
        } else {
            Ok(d)
        }
    });
    match (found, cfg.transport) {
        (Ok(devices), _) => {
            let list: Vec<String> = devices
                .iter()
                .enumerate()
                .map(|(i, d)| format!("[{i}]{}:{} {} Mbps", d.name, d.port, d.speed_mbps))
                .collect();
            info!(
                "nccl-net-zip: IB verbs transport on {} ; {} QPs per connection",
                list.join(" "),
                cfg.ib_qps
            );
            let names = devices
                .iter()
                .map(|d| {
                    (
                        CString::new(format!("{}:{}", d.name, d.port)).unwrap_or_default(),
                        d.pci_path
                            .as_ref()
                            .and_then(|p| CString::new(p.clone()).ok()),
                    )
                })
                .collect();
            let openers = devices.iter().map(|_| Mutex::new(None)).collect();
            Ok(Some(IbState {
                devices,
                names,
                openers,
            }))
        }
        (Err(why), TransportChoice::Ib) => Err(Error::Internal(format!(
            "NCCL_ZIP_TRANSPORT=ib but no usable InfiniBand/RoCE device: {why}"
        ))),
        (Err(why), _) => {
            info!("nccl-net-zip: NCCL_ZIP_TRANSPORT=auto: using TCP because IB is unusable: {why}");
            Ok(None)
        }
    }
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
    /// `NCCL_PTR_*` bits.
    pub ptr_support: i32,
    pub port: i32,
}

/// `irecv` accepts exactly one buffer per request.
pub const MAX_RECVS: i32 = 1;

/// What an IB port's `ptrSupport` depends on ([`Plugin::ib_gdr_facts`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IbGdrFacts {
    /// `NCCL_ZIP_GPU=on` (or emulation) and a CUDA device
    /// ([`Plugin::ib_gpu_enabled`]).
    pub gpu_path: bool,
    /// Emulated device memory (`NCCL_ZIP_GPU_EMULATE`): host memory, which any
    /// HCA reaches.
    pub emulated: bool,
    /// A peer-memory module (nvidia-peermem) is loaded: `ibv_reg_mr` of GPU
    /// memory works, so plain `regMr(NCCL_PTR_CUDA)` does.
    pub peermem: bool,
    /// The port can register a DMA-BUF (`ibv_reg_dmabuf_mr`).
    pub hca_dmabuf: bool,
    /// NCCL itself will hand GPU buffers to `regMrDmaBuf` rather than `regMr`:
    /// `NCCL_DMABUF_ENABLE` is not 0 and the CUDA devices report DMA-BUF
    /// support ([`crate::transport::ib::dmabuf::nccl_uses_dmabuf`]).
    pub nccl_dmabuf: bool,
}

/// The `NCCL_PTR_*` bits an IB port offers.
///
/// NCCL (`ncclTopoPopulateNics`, 2.28) treats a NIC as GPUDirect-capable when
/// `ptrSupport` has `NCCL_PTR_CUDA`, **or** when it has `NCCL_PTR_DMABUF` and
/// NCCL's own DMA-BUF support is on; it then registers GPU buffers with
/// `regMrDmaBuf` when both hold, and with plain `regMr(NCCL_PTR_CUDA)` otherwise.
/// So:
/// - `NCCL_PTR_DMABUF` is offered only together with `NCCL_PTR_CUDA`: alone it
///   would make NCCL hand over GPU buffers with the device path off;
/// - `NCCL_PTR_CUDA` is offered only when the registration NCCL will make can
///   succeed: emulated memory, nvidia-peermem (`regMr`), or a DMA-BUF-capable
///   port **and** NCCL using `regMrDmaBuf` (without it NCCL calls `regMr`,
///   which needs peermem).
pub fn ib_ptr_support(f: &IbGdrFacts) -> i32 {
    use crate::ffi::abi::{NCCL_PTR_CUDA, NCCL_PTR_DMABUF, NCCL_PTR_HOST};
    let cuda = f.gpu_path && (f.emulated || f.peermem || (f.hca_dmabuf && f.nccl_dmabuf));
    let mut bits = NCCL_PTR_HOST as i32;
    if cuda {
        bits |= NCCL_PTR_CUDA as i32;
        if f.hca_dmabuf {
            bits |= NCCL_PTR_DMABUF as i32;
        }
    }
    bits
}

impl Plugin {
    fn device(&self, dev: i32) -> Result<&Device> {
        usize::try_from(dev)
            .ok()
            .and_then(|d| self.devices.get(d))
            .ok_or_else(|| {
                Error::InvalidArgument(match &self.disabled {
                    Some(why) => {
                        format!("device {dev} does not exist: the plugin is disabled ({why})")
                    }
                    None => format!(
                        "device {dev} does not exist ({} devices)",
                        self.devices.len()
                    ),
                })
            })
    }

    /// Devices NCCL sees: IB ports, or TCP interfaces.
    pub fn ndevs(&self) -> usize {
        self.ib
            .as_ref()
            .map_or(self.devices.len(), |ib| ib.devices.len())
    }

    pub fn properties(&self, dev: i32) -> Result<Properties<'_>> {
        if let Some(ib) = &self.ib {
            let i = ib_index(ib, dev)?;
            let d = &ib.devices[i];
            let (name, pci) = &ib.names[i];
            let hca_dmabuf = self.ib_opener(dev).is_ok_and(|o| o.ctx.supports_dmabuf());
            return Ok(Properties {
                name,
                pci_path: pci.as_ref(),
                guid: d.guid,
                speed_mbps: d.speed_mbps.min(i32::MAX as u32) as i32,
                max_recvs: MAX_RECVS,
                ptr_support: ib_ptr_support(&self.ib_gdr_facts(hca_dmabuf)),
                port: d.port as i32,
            });
        }
        let d = self.device(dev)?;
        let (name, pci) = &self.names[dev as usize];
        Ok(Properties {
            name,
            pci_path: pci.as_ref(),
            guid: dev as u64,
            speed_mbps: d.speed_mbps,
            max_recvs: MAX_RECVS,
            ptr_support: crate::ffi::abi::NCCL_PTR_HOST as i32
                | if self.tcp_offers_cuda() {
                    crate::ffi::abi::NCCL_PTR_CUDA as i32
                } else {
                    0
                },
            port: 0,
        })
    }

    /// TCP comms accept CUDA buffers (staged through the device path) with
    /// `NCCL_ZIP_GPU=on` (or emulation) and a CUDA device.
    pub fn tcp_offers_cuda(&self) -> bool {
        self.cfg.gpu && crate::gpu::cuda_offered(self.cfg.gpu_emulate)
    }

    /// IB comms handle CUDA buffers (their compressed chunks through GPU lanes)
    /// with `NCCL_ZIP_GPU=on` (or emulation) and a CUDA device.
    pub fn ib_gpu_enabled(&self) -> bool {
        self.cfg.gpu && crate::gpu::cuda_offered(self.cfg.gpu_emulate)
    }

    /// What an IB port's `ptrSupport` depends on, probed only as far as needed:
    /// facts that cannot change [`ib_ptr_support`]'s answer stay `false`.
    /// `hca_dmabuf`: the port can register a DMA-BUF (`ibv_reg_dmabuf_mr`).
    pub fn ib_gdr_facts(&self, hca_dmabuf: bool) -> IbGdrFacts {
        let mut f = IbGdrFacts {
            gpu_path: self.ib_gpu_enabled(),
            hca_dmabuf,
            ..IbGdrFacts::default()
        };
        if !f.gpu_path {
            return f;
        }
        f.emulated = self.cfg.gpu_emulate != crate::gpu::Emulation::Off;
        if f.emulated {
            return f;
        }
        f.peermem = crate::transport::ib::device::peermem_loaded();
        if f.peermem {
            return f;
        }
        let why = if hca_dmabuf {
            match crate::transport::ib::dmabuf::nccl_uses_dmabuf() {
                Ok(()) => {
                    f.nccl_dmabuf = true;
                    return f;
                }
                Err(why) => format!("NCCL will not register GPU memory through DMA-BUF ({why})"),
            }
        } else {
            "no DMA-BUF registration (libibverbs without ibv_reg_dmabuf_mr)".to_string()
        };
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            info!("nccl-net-zip: NCCL_PTR_CUDA not offered on IB: no GPUDirect RDMA: no nvidia-peermem module, and {why}")
        });
        f
    }

    /// The opened IB port `dev` (opened on first use, then shared).
    fn ib_opener(&self, dev: i32) -> Result<Arc<VerbsOpener>> {
        let ib = self
            .ib
            .as_ref()
            .ok_or_else(|| Error::Internal("IB is not in use".into()))?;
        let i = ib_index(ib, dev)?;
        let mut g = ib.openers[i].lock();
        if let Some(o) = g.as_ref() {
            return Ok(o.clone());
        }
        let d = &ib.devices[i];
        let o = Arc::new(VerbsOpener {
            ctx: Context::open(&d.name, d.port)?,
            qp_params: QpParams {
                gid_index: d.gid_index,
                ..QpParams::default()
            },
        });
        *g = Some(o.clone());
        Ok(o)
    }

    fn ib_config(&self, dev: i32) -> Result<IbConfig> {
        let ib = self.ib.as_ref().expect("IB in use");
        let speed = ib.devices[ib_index(ib, dev)?].speed_mbps as u64;
        Ok(IbConfig::from_config(&self.cfg, speed))
    }

    /// `listen` on the chosen transport. IB bootstraps over the first TCP device.
    pub fn listen_any(&self, dev: i32, handle: &mut [u8; HANDLE_SIZE]) -> Result<AnyListen> {
        if self.ib.is_none() {
            return self.listen(dev, handle).map(AnyListen::Tcp);
        }
        let opener = self.ib_opener(dev)?;
        let boot = self.device(0)?.bind_addr();
        let l = IbListenComm::bind(boot, opener, Arc::new(self.ib_config(dev)?))?;
        l.handle().encode(handle);
        Ok(AnyListen::Ib(l))
    }

    /// `connect` on the chosen transport; non-blocking, resumed from `handle`.
    pub fn connect_any(&self, dev: i32, handle: &mut [u8; HANDLE_SIZE]) -> Result<Option<AnySend>> {
        if self.ib.is_none() {
            return Ok(self.connect(dev, handle)?.map(AnySend::Tcp));
        }
        let done = self.resume_connect(
            handle,
            |h| {
                let opener = self.ib_opener(dev)?;
                IbConnect::<VerbsFabric>::start(
                    &IbHandle::decode(h)?,
                    &*opener,
                    &self.ib_config(dev)?,
                )
            },
            |st| st.progress(),
        )?;
        done.map(|st| st.finish().map(AnySend::Ib)).transpose()
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
        let cfg = self.cfg.clone();
        let done = self.resume_connect(
            handle,
            |h| ConnectState::start(&Handle::decode(h)?, link_mbps, cfg),
            |st| st.progress(),
        )?;
        done.map(|st| st.finish()).transpose()
    }

    /// One step of a non-blocking connect whose state lives behind NCCL's handle
    /// (its stage area holds the state's address between calls). `start` makes the
    /// state on the first call; `progress` returns true once connected. Returns the
    /// finished state, or `None` to be called again.
    fn resume_connect<S>(
        &self,
        handle: &mut [u8; HANDLE_SIZE],
        start: impl FnOnce(&[u8; HANDLE_SIZE]) -> Result<S>,
        progress: impl FnOnce(&mut S) -> Result<bool>,
    ) -> Result<Option<Box<S>>> {
        let ptr = match wire::stage_get(handle).filter(|p| self.connecting.lock().contains(p)) {
            Some(p) => p as *mut S,
            None => {
                let p = Box::into_raw(Box::new(start(handle)?));
                self.connecting.lock().insert(p as usize);
                wire::stage_set(handle, Some(p as usize));
                p
            }
        };
        // SAFETY: `ptr` came from Box::into_raw here and is still registered in
        // `connecting`, so it is live and only the proxy thread uses it. It is an
        // `S`: the transport, and so the state type, is chosen once per process.
        let r = progress(unsafe { &mut *ptr });
        if let Ok(false) = r {
            return Ok(None);
        }
        self.connecting.lock().remove(&(ptr as usize));
        wire::stage_set(handle, None);
        // SAFETY: unregistered just above; the box is reclaimed exactly once.
        let st = unsafe { Box::from_raw(ptr) };
        r?;
        Ok(Some(st))
    }
}

pub fn accept(l: &mut ListenComm) -> Result<Option<RecvComm>> {
    l.accept()
}

/// `accept` on either transport.
pub fn accept_any(l: &mut AnyListen) -> Result<Option<AnyRecv>> {
    match l {
        AnyListen::Tcp(l) => Ok(l.accept()?.map(AnyRecv::Tcp)),
        AnyListen::Ib(l) => Ok(l.accept()?.map(AnyRecv::Ib)),
    }
}

fn ib_index(ib: &IbState, dev: i32) -> Result<usize> {
    usize::try_from(dev)
        .ok()
        .filter(|&d| d < ib.devices.len())
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "device {dev} does not exist ({} IB devices)",
                ib.devices.len()
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::abi::{NCCL_PTR_CUDA, NCCL_PTR_DMABUF, NCCL_PTR_HOST};

    const HOST: i32 = NCCL_PTR_HOST as i32;
    const CUDA: i32 = NCCL_PTR_CUDA as i32;
    const DMABUF: i32 = NCCL_PTR_DMABUF as i32;

    fn facts(gpu_path: bool, peermem: bool, hca_dmabuf: bool, nccl_dmabuf: bool) -> IbGdrFacts {
        IbGdrFacts {
            gpu_path,
            emulated: false,
            peermem,
            hca_dmabuf,
            nccl_dmabuf,
        }
    }

    /// NCCL counts `DMABUF` (with its own DMA-BUF support) as GPUDirect-capable
    /// and then hands GPU buffers to regMrDmaBuf: with the device path off, no
    /// DMA-BUF-capable port may say so.
    #[test]
    fn dmabuf_is_never_offered_without_cuda() {
        for peermem in [false, true] {
            for nccl_dmabuf in [false, true] {
                let bits = ib_ptr_support(&facts(false, peermem, true, nccl_dmabuf));
                assert_eq!(
                    bits, HOST,
                    "device path off, peermem {peermem}, NCCL dmabuf {nccl_dmabuf}"
                );
            }
        }
        let off = IbGdrFacts {
            emulated: true,
            hca_dmabuf: true,
            ..IbGdrFacts::default()
        };
        assert_eq!(ib_ptr_support(&off), HOST);
    }

    /// Without NCCL's own DMA-BUF support NCCL registers GPU buffers with plain
    /// regMr, which needs nvidia-peermem: a DMA-BUF-capable HCA alone is not
    /// enough to offer CUDA.
    #[test]
    fn cuda_needs_a_registration_nccl_will_make_work() {
        assert_eq!(ib_ptr_support(&facts(true, false, true, false)), HOST);
        assert_eq!(ib_ptr_support(&facts(true, false, false, false)), HOST);
        // NCCL uses regMrDmaBuf: both bits.
        assert_eq!(
            ib_ptr_support(&facts(true, false, true, true)),
            HOST | CUDA | DMABUF
        );
        // nvidia-peermem: plain regMr works; DMABUF only where the port has it.
        assert_eq!(
            ib_ptr_support(&facts(true, true, false, false)),
            HOST | CUDA
        );
        assert_eq!(
            ib_ptr_support(&facts(true, true, true, false)),
            HOST | CUDA | DMABUF
        );
        // A port without DMA-BUF: NCCL's own support does not matter.
        assert_eq!(ib_ptr_support(&facts(true, false, false, true)), HOST);
        // Emulated device memory is host memory: any port reaches it.
        let emu = IbGdrFacts {
            gpu_path: true,
            emulated: true,
            ..IbGdrFacts::default()
        };
        assert_eq!(ib_ptr_support(&emu), HOST | CUDA);
        let emu_dmabuf = IbGdrFacts {
            hca_dmabuf: true,
            ..emu
        };
        assert_eq!(ib_ptr_support(&emu_dmabuf), HOST | CUDA | DMABUF);
    }
}
