//! The exported vtable on IB comms (in-memory fabric) with the device path on,
//! emulated (`NCCL_ZIP_GPU_EMULATE=1`: device memory is host memory): what
//! NCCL 2.28 does on a DMA-BUF-capable host, where every GPU buffer of a
//! connection is registered through `regMrDmaBuf` and none through `regMr`,
//! and NCCL's NULL `deregMr`.

mod ib_shims_util;
mod inproc_util;

use std::ffi::c_void;
use std::os::fd::AsRawFd;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use ib_shims_util::{ib_pair, ok, setup, some_fd, vt, warns_containing};
use nccl_net_zip::codec_glue::max_wire;
use nccl_net_zip::ffi::abi::{ncclResult_t, NCCL_PTR_CUDA};
use nccl_net_zip::gpu::backend_for;
use nccl_net_zip::gpu::pool::{pool, Dir};
use nccl_net_zip::plugin::Plugin;

fn plugin() -> &'static Plugin {
    let p = setup(&[("NCCL_ZIP_GPU_EMULATE", "1")]);
    assert!(p.ib_gpu_enabled(), "emulation turns the device path on");
    p
}

/// `regMrDmaBuf(NCCL_PTR_CUDA)` makes the lane each comm's progress thread
/// will code on, as `regMr(NCCL_PTR_CUDA)` does: otherwise the first chunk
/// allocates pinned and device memory on the data path while NCCL's kernel
/// waits. Then the handles carry a message from "device" to "device".
#[test]
fn reg_mr_dma_buf_of_cuda_memory_prewarms_lanes_and_moves_data() {
    let p = plugin();
    let b = backend_for(0, p.cfg.gpu_emulate).unwrap();
    let mw = max_wire(p.cfg.max_chunk);
    let send_lanes = pool(&b, Dir::Send, mw, p.cfg.gpu_lanes);
    let recv_lanes = pool(&b, Dir::Recv, mw, p.cfg.gpu_lanes);
    assert_eq!(
        (send_lanes.made(), recv_lanes.made()),
        (0, 0),
        "no lane before registration"
    );

    let (sc, rc) = ib_pair(p);
    let n = (3 << 20) + 5;
    let src = inproc_util::bf16_gaussian(7, n, 0.02);
    let mut dst = vec![0xA5u8; n + 64];
    let fd = some_fd();
    let (mut smh, mut rmh) = (null_mut::<c_void>(), null_mut::<c_void>());
    unsafe {
        let reg = vt().regMrDmaBuf.unwrap();
        let cuda = NCCL_PTR_CUDA as i32;
        let s = src.as_ptr() as *mut c_void;
        ok(
            reg(sc, s, n, cuda, 0, fd.as_raw_fd(), &mut smh),
            "send regMrDmaBuf",
        );
        let d = dst.as_mut_ptr() as *mut c_void;
        ok(
            reg(rc, d, dst.len(), cuda, 0, fd.as_raw_fd(), &mut rmh),
            "recv regMrDmaBuf",
        );
    }
    assert!(!smh.is_null() && !rmh.is_null());
    assert_eq!(
        send_lanes.made(),
        1,
        "regMrDmaBuf on the send comm made its lane"
    );
    assert_eq!(
        recv_lanes.made(),
        1,
        "regMrDmaBuf on the recv comm made its lane"
    );

    let (mut sreq, mut rreq) = (null_mut::<c_void>(), null_mut::<c_void>());
    let mut rbuf = dst.as_mut_ptr() as *mut c_void;
    let mut cap = dst.len() as i32;
    let mut tag = 0;
    unsafe {
        let s = src.as_ptr() as *mut c_void;
        ok(
            vt().irecv.unwrap()(rc, 1, &mut rbuf, &mut cap, &mut tag, &mut rmh, &mut rreq),
            "irecv",
        );
        ok(
            vt().isend.unwrap()(sc, s, n as i32, 0, smh, &mut sreq),
            "isend",
        );
    }
    assert!(!sreq.is_null() && !rreq.is_null(), "requests posted");
    let (mut sdone, mut rdone, mut got) = (0, 0, 0);
    let t0 = Instant::now();
    while sdone == 0 || rdone == 0 {
        assert!(t0.elapsed() < Duration::from_secs(60), "transfer stuck");
        unsafe {
            if sdone == 0 {
                ok(
                    vt().test.unwrap()(sreq, &mut sdone, null_mut()),
                    "test(send)",
                );
            }
            if rdone == 0 {
                ok(vt().test.unwrap()(rreq, &mut rdone, &mut got), "test(recv)");
            }
        }
        std::thread::yield_now();
    }
    assert_eq!(got as usize, n, "true size");
    assert!(dst[..n] == src[..], "bytes differ");
    assert!(
        dst[n..].iter().all(|&x| x == 0xA5),
        "written past the message"
    );
    assert_eq!(
        (send_lanes.made(), recv_lanes.made()),
        (1, 1),
        "the data path made no lane"
    );

    unsafe {
        ok(vt().deregMr.unwrap()(sc, smh), "deregMr(send)");
        ok(vt().deregMr.unwrap()(rc, rmh), "deregMr(recv)");
        ok(vt().closeSend.unwrap()(sc), "closeSend");
        ok(vt().closeRecv.unwrap()(rc), "closeRecv");
    }
}

/// NCCL's proxy calls `deregMr(comm, NULL)` when a user buffer had no handle
/// (`send/recvProxyDeregBuffer`); anything but success fails the communicator.
#[test]
fn dereg_mr_of_a_null_handle_succeeds_without_a_warning() {
    let p = plugin();
    let dereg = vt().deregMr.unwrap();
    unsafe {
        ok(dereg(null_mut(), null_mut()), "deregMr(NULL, NULL)");
        let (sc, rc) = ib_pair(p);
        ok(dereg(sc, null_mut()), "deregMr(send comm, NULL)");
        ok(dereg(rc, null_mut()), "deregMr(recv comm, NULL)");
        assert!(
            warns_containing("deregMr").is_empty(),
            "{:?}",
            warns_containing("deregMr")
        );
        // Only NULL is nothing: a pointer that is no memory handle is still refused.
        assert_eq!(dereg(sc, sc), ncclResult_t::ncclInvalidArgument);
        ok(vt().closeSend.unwrap()(sc), "closeSend");
        ok(vt().closeRecv.unwrap()(rc), "closeRecv");
    }
}
