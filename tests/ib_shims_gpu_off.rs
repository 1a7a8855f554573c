//! The exported vtable on IB comms (in-memory fabric) with the device path off
//! (`NCCL_ZIP_GPU=off`, the default). NCCL 2.28 hands GPU buffers to
//! `regMrDmaBuf` whenever a port offers `NCCL_PTR_DMABUF` and NCCL's own
//! DMA-BUF support is on; the plugin must refuse them while the switch is off.

mod ib_shims_util;

use std::ffi::c_void;
use std::os::fd::AsRawFd;
use std::ptr::null_mut;

use ib_shims_util::{ib_pair, ok, setup, some_fd, vt, warns_containing};
use nccl_net_zip::ffi::abi::{ncclResult_t, NCCL_PTR_CUDA, NCCL_PTR_HOST};

#[test]
fn reg_mr_dma_buf_refuses_cuda_memory_when_the_device_path_is_off() {
    let p = setup(&[("NCCL_ZIP_GPU", "off"), ("NCCL_ZIP_GPU_EMULATE", "0")]);
    assert!(!p.ib_gpu_enabled());
    let (sc, rc) = ib_pair(p);
    let mut buf = vec![0u8; 1 << 16];
    let fd = some_fd();
    let reg = vt().regMrDmaBuf.unwrap();
    for (comm, side) in [(sc, "send"), (rc, "recv")] {
        let mut mh = std::ptr::dangling_mut::<c_void>();
        let data = buf.as_mut_ptr() as *mut c_void;
        let r = unsafe {
            reg(
                comm,
                data,
                buf.len(),
                NCCL_PTR_CUDA as i32,
                0,
                fd.as_raw_fd(),
                &mut mh,
            )
        };
        assert_eq!(r, ncclResult_t::ncclInvalidArgument, "{side}");
        assert!(mh.is_null(), "{side}: no handle");
    }
    let w = warns_containing("regMrDmaBuf");
    assert_eq!(w.len(), 2, "one WARN per refusal: {w:?}");
    for w in &w {
        assert!(
            w.contains("NCCL_PTR_CUDA") && w.contains("NCCL_ZIP_GPU is off"),
            "the WARN names the switch: {w}"
        );
    }
    // Host memory through a DMA-BUF is not the device path: still registered.
    let mut mh = null_mut();
    unsafe {
        let data = buf.as_mut_ptr() as *mut c_void;
        ok(
            reg(
                sc,
                data,
                buf.len(),
                NCCL_PTR_HOST as i32,
                0,
                fd.as_raw_fd(),
                &mut mh,
            ),
            "regMrDmaBuf(NCCL_PTR_HOST)",
        );
        assert!(!mh.is_null());
        ok(vt().deregMr.unwrap()(sc, mh), "deregMr");
        ok(vt().closeSend.unwrap()(sc), "closeSend");
        ok(vt().closeRecv.unwrap()(rc), "closeRecv");
    }
}
