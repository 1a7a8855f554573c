//! The one place where Rust meets C: panic capture, error mapping, pointer casts.

use std::panic::{catch_unwind, AssertUnwindSafe};

use tracing::warn;

use super::abi::ncclResult_t;
use super::error::to_nccl;
use crate::error::{Error, Result};

/// Runs one vtable entry: `Ok` → ncclSuccess; `Err` → WARN + mapped code; panic → WARN + ncclInternalError.
pub fn call(entry: &str, f: impl FnOnce() -> Result<()>) -> ncclResult_t {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => ncclResult_t::ncclSuccess,
        Ok(Err(e)) => {
            warn!("{entry} failed: {e}");
            to_nccl(&e)
        }
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            warn!("{entry}: internal panic caught at the NCCL boundary: {what}");
            ncclResult_t::ncclInternalError
        }
    }
}

/// How a data-path entry failed: `Warn` gets the usual WARN; `Logged` was
/// logged already (once per comm, see [`crate::proto::slots::Report`]) and only
/// its code is returned.
pub enum Fail {
    Warn(Error),
    Logged(Error),
}

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        Fail::Warn(e)
    }
}

impl Fail {
    /// `e` on a comm with report `r`: a WARN naming the comm the first time
    /// this comm fails, quiet after.
    pub fn per_comm(entry: &str, r: &crate::proto::slots::Report, e: Error) -> Fail {
        if r.first() {
            warn!("{entry} on {}: {e}", r.label());
        }
        Fail::Logged(e)
    }
}

/// [`call`] for entries whose errors may be logged already ([`Fail`]).
pub fn call_quiet(entry: &str, f: impl FnOnce() -> Result<(), Fail>) -> ncclResult_t {
    let mut quiet = None;
    let r = call(entry, || match f() {
        Ok(()) => Ok(()),
        Err(Fail::Warn(e)) => Err(e),
        Err(Fail::Logged(e)) => {
            quiet = Some(to_nccl(&e));
            Ok(())
        }
    });
    quiet.unwrap_or(r)
}

/// A plugin object behind an opaque pointer. The tag catches a pointer of the wrong
/// kind (a recv comm passed to isend) and, best effort, one already closed.
#[repr(C)]
pub struct Obj<T> {
    tag: u64,
    pub val: T,
}

/// Object kinds NCCL holds pointers to.
pub trait Kind {
    const TAG: u64;
    const NAME: &'static str;
}

impl<T: Kind> Obj<T> {
    /// Boxes `val` and hands out the pointer for NCCL to keep.
    pub fn into_raw(val: T) -> *mut std::ffi::c_void {
        Box::into_raw(Box::new(Obj { tag: T::TAG, val })) as *mut _
    }

    /// A shared reference: NCCL may use one comm from several threads at once
    /// (from 2.24 the proxy service thread registers memory on a comm while the
    /// progress thread is in `isend`/`test` on it), so comm and memory-handle
    /// objects are used through `&` only, and are `Sync`.
    ///
    /// # Safety
    /// `p` must be NULL or a pointer this plugin handed out (any kind), not yet freed.
    pub unsafe fn get<'a>(p: *mut std::ffi::c_void) -> Result<&'a T>
    where
        T: Sync,
    {
        Self::checked(p).map(|o| &(*o).val)
    }

    /// An exclusive reference, for objects NCCL uses from one thread only (a
    /// listen comm: `accept` runs on the proxy service thread).
    ///
    /// # Safety
    /// As [`Obj::get`], and no other reference to the object may be alive.
    pub unsafe fn get_mut<'a>(p: *mut std::ffi::c_void) -> Result<&'a mut T> {
        Self::checked(p).map(|o| &mut (*o).val)
    }

    /// `p` as an object of this kind, checked by its tag; never turned into a
    /// reference to the whole object (another thread may hold one to `val`).
    ///
    /// # Safety
    /// As [`Obj::get`].
    unsafe fn checked(p: *mut std::ffi::c_void) -> Result<*mut Obj<T>> {
        let o = p as *mut Obj<T>;
        if o.is_null() {
            return Err(Error::InvalidArgument(format!("NULL {}", T::NAME)));
        }
        let tag = std::ptr::addr_of!((*o).tag).read();
        if tag != T::TAG {
            return Err(Error::InvalidArgument(format!(
                "pointer {p:?} is not a live {}",
                T::NAME
            )));
        }
        Ok(o)
    }

    /// Takes the object back; dropping it closes it.
    ///
    /// # Safety
    /// As [`Obj::get`]; after this call NCCL must not use `p` again.
    pub unsafe fn take(p: *mut std::ffi::c_void) -> Result<T> {
        Self::checked(p)?;
        // Kill the tag before freeing: a later use of the stale pointer is then
        // likely (not certain) to be caught instead of touching freed memory.
        (*(p as *mut Obj<T>)).tag = 0;
        let b = Box::from_raw(p as *mut Obj<T>);
        Ok(b.val)
    }
}

/// `Some(&mut *p)` for a non-NULL out-pointer.
///
/// # Safety
/// `p` must be NULL or valid for writes of `T`.
pub unsafe fn out<'a, T>(p: *mut T, what: &str) -> Result<&'a mut T> {
    p.as_mut()
        .ok_or_else(|| Error::InvalidArgument(format!("NULL {what}")))
}
