//! The plugin as NCCL sees it: `dlopen(RTLD_NOW | RTLD_LOCAL)`, the
//! `ncclNetPlugin_v8` vtable, and one checked wrapper per entry point. Every
//! non-success result is printed with its name as soon as it comes out.

use std::ffi::{c_int, c_void, CStr};
use std::path::Path;
use std::ptr::null_mut;
use std::time::Instant;

use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
use nccl_net_zip::ffi::abi::*;

extern "C" {
    /// tools/test_logger.c, linked in by build.rs.
    fn nccl_zip_test_logger(
        level: ncclDebugLogLevel::Type,
        flags: std::ffi::c_ulong,
        file: *const std::ffi::c_char,
        line: c_int,
        fmt: *const std::ffi::c_char,
        ...
    );
    fn nccl_zip_test_logger_warns() -> std::ffi::c_ulong;
}

pub fn warns_logged() -> u64 {
    // SAFETY: reads an atomic counter.
    unsafe { nccl_zip_test_logger_warns() as u64 }
}

/// A failed vtable call.
#[derive(Debug)]
pub struct NcclError {
    pub call: &'static str,
    pub code: ncclResult_t,
    pub at: Instant,
}

impl std::fmt::Display for NcclError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} returned {:?} ({})",
            self.call, self.code, self.code as u32
        )
    }
}

pub type NResult<T> = Result<T, NcclError>;

fn ck(call: &'static str, r: ncclResult_t) -> NResult<()> {
    if r == ncclResult_t::ncclSuccess {
        return Ok(());
    }
    let e = NcclError {
        call,
        code: r,
        at: Instant::now(),
    };
    eprintln!("nccl-zip-perf: {e}");
    Err(e)
}

pub struct Net {
    /// Kept open for the whole run (the plugin is linked `-z nodelete` anyway).
    _lib: Library,
    v: &'static ncclNet_v8_t,
}

/// Opaque pointers NCCL holds.
pub type Comm = *mut c_void;
pub type Req = *mut c_void;

impl Net {
    pub fn open(path: &Path) -> Result<Net, String> {
        // SAFETY: loading our own plugin; its initialisers only set up statics.
        let lib = unsafe { Library::open(Some(path), RTLD_NOW | RTLD_LOCAL) }
            .map_err(|e| format!("dlopen {}: {e}", path.display()))?;
        // SAFETY: the symbol is a `ncclNet_v8_t` static (pinned layout in ffi::abi).
        let v: &'static ncclNet_v8_t = unsafe {
            let sym = lib
                .get::<*const ncclNet_v8_t>(b"ncclNetPlugin_v8\0")
                .map_err(|e| format!("{}: no ncclNetPlugin_v8: {e}", path.display()))?;
            &**sym
        };
        Ok(Net { _lib: lib, v })
    }

    pub fn name(&self) -> String {
        if self.v.name.is_null() {
            return "<null>".into();
        }
        // SAFETY: the plugin's name is a NUL-terminated static string.
        unsafe { CStr::from_ptr(self.v.name) }
            .to_string_lossy()
            .into_owned()
    }

    pub fn init(&self) -> NResult<()> {
        // SAFETY: a valid logger; init is called once per process.
        ck("init", unsafe {
            self.v.init.unwrap()(Some(nccl_zip_test_logger))
        })
    }

    pub fn devices(&self) -> NResult<i32> {
        let mut n = 0;
        ck("devices", unsafe { self.v.devices.unwrap()(&mut n) })?;
        Ok(n)
    }

    pub fn properties(&self, dev: i32) -> NResult<ncclNetProperties_v8_t> {
        let mut p = ncclNetProperties_v8_t::default();
        ck("getProperties", unsafe {
            self.v.getProperties.unwrap()(dev, &mut p)
        })?;
        Ok(p)
    }

    pub fn listen(&self, dev: i32, handle: &mut [u8; 128]) -> NResult<Comm> {
        let mut l = null_mut();
        ck("listen", unsafe {
            self.v.listen.unwrap()(dev, handle.as_mut_ptr().cast(), &mut l)
        })?;
        Ok(l)
    }

    /// One non-blocking connect step; NULL means "call again with the same handle".
    pub fn connect(&self, dev: i32, handle: &mut [u8; 128]) -> NResult<Comm> {
        let (mut c, mut d) = (null_mut(), null_mut());
        ck("connect", unsafe {
            self.v.connect.unwrap()(dev, handle.as_mut_ptr().cast(), &mut c, &mut d)
        })?;
        Ok(c)
    }

    /// One non-blocking accept step; NULL means "call again".
    pub fn accept(&self, listen: Comm) -> NResult<Comm> {
        let (mut c, mut d) = (null_mut(), null_mut());
        ck("accept", unsafe {
            self.v.accept.unwrap()(listen, &mut c, &mut d)
        })?;
        Ok(c)
    }

    /// `ty`: `NCCL_PTR_HOST` or `NCCL_PTR_CUDA` (then `data` is a device address).
    pub fn reg_mr(&self, comm: Comm, data: *mut u8, len: usize, ty: c_int) -> NResult<*mut c_void> {
        let mut mh = null_mut();
        // SAFETY: `data..data+len` is a live allocation of the kind `ty` names,
        // deregistered before it is freed.
        ck("regMr", unsafe {
            self.v.regMr.unwrap()(comm, data.cast(), len, ty, &mut mh)
        })?;
        Ok(mh)
    }

    pub fn dereg_mr(&self, comm: Comm, mh: *mut c_void) -> NResult<()> {
        ck("deregMr", unsafe { self.v.deregMr.unwrap()(comm, mh) })
    }

    /// # Safety
    /// `data..data+size` stays valid and unchanged until `test` reports done.
    pub unsafe fn isend(
        &self,
        comm: Comm,
        data: *mut u8,
        size: usize,
        mh: *mut c_void,
    ) -> NResult<Req> {
        let mut r = null_mut();
        ck(
            "isend",
            self.v.isend.unwrap()(comm, data.cast(), size as c_int, 0, mh, &mut r),
        )?;
        Ok(r)
    }

    /// # Safety
    /// `data..data+cap` stays valid and untouched by us until `test` reports done.
    pub unsafe fn irecv(
        &self,
        comm: Comm,
        data: *mut u8,
        cap: usize,
        mh: *mut c_void,
    ) -> NResult<Req> {
        let mut r = null_mut();
        let mut d = data.cast::<c_void>();
        let mut sz = cap as c_int;
        let mut tag: c_int = 0;
        let mut m = mh;
        ck(
            "irecv",
            self.v.irecv.unwrap()(comm, 1, &mut d, &mut sz, &mut tag, &mut m, &mut r),
        )?;
        Ok(r)
    }

    /// `Some(size)` once the request is done.
    pub fn test(&self, req: Req) -> NResult<Option<usize>> {
        let (mut done, mut size): (c_int, c_int) = (0, -1);
        ck("test", unsafe {
            self.v.test.unwrap()(req, &mut done, &mut size)
        })?;
        Ok((done != 0).then_some(size as usize))
    }

    pub fn close_send(&self, c: Comm) -> NResult<()> {
        ck("closeSend", unsafe { self.v.closeSend.unwrap()(c) })
    }
    pub fn close_recv(&self, c: Comm) -> NResult<()> {
        ck("closeRecv", unsafe { self.v.closeRecv.unwrap()(c) })
    }
    pub fn close_listen(&self, c: Comm) -> NResult<()> {
        ck("closeListen", unsafe { self.v.closeListen.unwrap()(c) })
    }
}
