//! libibverbs, opened at run time with `dlopen("libibverbs.so.1")` so the plugin
//! has no DT_NEEDED on it and loads on nodes without rdma-core (then IB is simply
//! unavailable and the plugin uses TCP).

use std::sync::OnceLock;

use libloading::Library;

use super::sys::*;

/// The resolved entry points. The `Library` is kept alive with them.
pub struct Lib {
    _lib: Library,
    pub get_device_list: GetDeviceListFn,
    pub free_device_list: FreeDeviceListFn,
    pub get_device_name: GetDeviceNameFn,
    pub open_device: OpenDeviceFn,
    pub close_device: CloseDeviceFn,
    pub query_device: QueryDeviceFn,
    pub query_port: QueryPortFn,
    pub query_gid: QueryGidFn,
    pub alloc_pd: AllocPdFn,
    pub dealloc_pd: DeallocPdFn,
    pub reg_mr: RegMrFn,
    /// rdma-core >= 34 only.
    pub reg_dmabuf_mr: Option<RegDmabufMrFn>,
    pub dereg_mr: DeregMrFn,
    pub create_cq: CreateCqFn,
    pub destroy_cq: DestroyCqFn,
    pub create_qp: CreateQpFn,
    pub modify_qp: ModifyQpFn,
    pub destroy_qp: DestroyQpFn,
}

pub const LIBRARY: &str = "libibverbs.so.1";

static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();

/// The process-wide libibverbs, loaded on first use; `Err` says why it is not usable.
pub fn lib() -> Result<&'static Lib, String> {
    LIB.get_or_init(load).as_ref().map_err(Clone::clone)
}

fn load() -> Result<Lib, String> {
    // SAFETY: libibverbs' initialisers only read the environment and sysfs.
    let l = unsafe { Library::new(LIBRARY) }.map_err(|e| format!("cannot load {LIBRARY}: {e}"))?;
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: the symbol's C signature is the one declared in sys.rs for
            // the field it is assigned to.
            *unsafe { l.get(concat!($name, "\0").as_bytes()) }
                .map_err(|e| format!("{LIBRARY} lacks {}: {e}", $name))?
        };
    }
    // SAFETY: as above; absent in old rdma-core, which is fine.
    let reg_dmabuf_mr = unsafe { l.get::<RegDmabufMrFn>(b"ibv_reg_dmabuf_mr\0") }
        .ok()
        .map(|s| *s);
    Ok(Lib {
        get_device_list: sym!("ibv_get_device_list"),
        free_device_list: sym!("ibv_free_device_list"),
        get_device_name: sym!("ibv_get_device_name"),
        open_device: sym!("ibv_open_device"),
        close_device: sym!("ibv_close_device"),
        query_device: sym!("ibv_query_device"),
        query_port: sym!("ibv_query_port"),
        query_gid: sym!("ibv_query_gid"),
        alloc_pd: sym!("ibv_alloc_pd"),
        dealloc_pd: sym!("ibv_dealloc_pd"),
        reg_mr: sym!("ibv_reg_mr"),
        reg_dmabuf_mr,
        dereg_mr: sym!("ibv_dereg_mr"),
        create_cq: sym!("ibv_create_cq"),
        destroy_cq: sym!("ibv_destroy_cq"),
        create_qp: sym!("ibv_create_qp"),
        modify_qp: sym!("ibv_modify_qp"),
        destroy_qp: sym!("ibv_destroy_qp"),
        _lib: l,
    })
}
