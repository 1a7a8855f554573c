//! Memory that a NIC (or the peer, through RDMA) writes behind the compiler's back:
//! the CTS FIFO, the info records, the staging pools. Owned, page-aligned, zeroed,
//! and only ever touched through raw pointers, so no Rust reference aliases bytes
//! that DMA may be changing.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;
use std::sync::atomic::{fence, Ordering};

use crate::error::{Error, Result};

pub struct Region {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: a Region is plain owned memory; all access goes through its methods,
// which the owning protocol object calls from one thread at a time.
unsafe impl Send for Region {}

impl Region {
    pub fn new(len: usize) -> Result<Region> {
        let layout = Layout::from_size_align(len.max(1), 4096)
            .map_err(|e| Error::Internal(format!("region of {len} bytes: {e}")))?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(p)
            .ok_or_else(|| Error::Internal(format!("out of memory for a {len}-byte region")))?;
        Ok(Region { ptr, layout })
    }

    pub fn len(&self) -> usize {
        self.layout.size()
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    fn check(&self, off: usize, len: usize) {
        assert!(
            off.checked_add(len).is_some_and(|e| e <= self.len()),
            "region access {off}+{len} beyond {}",
            self.len()
        );
    }

    /// Copies bytes out with volatile reads (the peer may be writing them), then an
    /// acquire fence so later reads see data that landed before these bytes.
    pub fn read_volatile(&self, off: usize, out: &mut [u8]) {
        self.check(off, out.len());
        for (i, b) in out.iter_mut().enumerate() {
            // SAFETY: in bounds (checked above); the memory is owned and initialised.
            *b = unsafe { std::ptr::read_volatile(self.ptr.as_ptr().add(off + i)) };
        }
        fence(Ordering::Acquire);
    }

    /// Writes bytes that a later RDMA write will read.
    pub fn write(&self, off: usize, data: &[u8]) {
        self.check(off, data.len());
        fence(Ordering::Release);
        // SAFETY: in bounds; the source is a distinct Rust slice.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(off), data.len())
        };
    }

    /// A view of bytes that no DMA is writing any more (their completion was seen).
    ///
    /// # Safety
    /// Nothing may write `off..off + len` while the slice lives.
    pub unsafe fn settled(&self, off: usize, len: usize) -> &[u8] {
        self.check(off, len);
        fence(Ordering::Acquire);
        std::slice::from_raw_parts(self.ptr.as_ptr().add(off), len)
    }

    /// A mutable view for filling a send staging buffer.
    ///
    /// # Safety
    /// No work request that reads these bytes may be outstanding, and no other view
    /// of them may be alive.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn scratch(&self, off: usize, len: usize) -> &mut [u8] {
        self.check(off, len);
        std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(off), len)
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}
