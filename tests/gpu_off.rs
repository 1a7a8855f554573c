//! With `NCCL_ZIP_GPU=off` (the default) the plugin never touches CUDA: a whole
//! TCP session through the exported vtable (init, devices, getProperties, listen,
//! connect/accept, regMr of host memory, a refused regMr of "CUDA" memory, isend,
//! irecv, test, close) never opens libcuda.
//!
//! How it can fail without a GPU: a stand-in `libcuda.so.1` (built here with `cc`,
//! no CUDA symbols) whose constructor appends to a marker file is put first on the
//! library path of a child process that runs the session. The marker must stay
//! empty and `/proc/self/maps` must not list the library. The same child with
//! `NCCL_ZIP_GPU=on` must load it (the control: without it the test could not fail).

mod ib_shims_util;

use std::ffi::c_void;
use std::path::Path;
use std::process::Command;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use ib_shims_util::{ok, vt};
use nccl_net_zip::ffi::abi::{ncclNetProperties_v8_t, ncclResult_t, NCCL_PTR_CUDA, NCCL_PTR_HOST};

const CHILD: &str = "NZC_GPU_OFF_CHILD";
const MARK: &str = "NZC_FAKE_LIBCUDA_MARK";

const FAKE_LIBCUDA: &str = r#"
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void nzc_fake_libcuda_loaded(void) {
  const char *p = getenv("NZC_FAKE_LIBCUDA_MARK");
  FILE *f = p ? fopen(p, "a") : NULL;
  if (f) { fputs("libcuda.so.1 loaded\n", f); fclose(f); }
}
"#;

/// Builds the stand-in library into `dir` (None, with the reason, without `cc`).
fn fake_libcuda(dir: &Path) -> Result<(), String> {
    let src = dir.join("fake_libcuda.c");
    std::fs::write(&src, FAKE_LIBCUDA).map_err(|e| e.to_string())?;
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = Command::new(&cc)
        .args(["-shared", "-fPIC", "-o"])
        .arg(dir.join("libcuda.so.1"))
        .arg(&src)
        .status()
        .map_err(|e| format!("{cc}: {e}"))?;
    if !st.success() {
        return Err(format!("{cc} failed: {st}"));
    }
    Ok(())
}

/// Runs the session in a child process; returns (marker contents, child's stderr).
fn run_child(dir: &Path, gpu: &str) -> (String, String) {
    let mark = dir.join(format!("mark-{gpu}"));
    let _ = std::fs::remove_file(&mark);
    let lib_path = match std::env::var("LD_LIBRARY_PATH") {
        Ok(p) if !p.is_empty() => format!("{}:{p}", dir.display()),
        _ => dir.display().to_string(),
    };
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "session_in_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env(MARK, &mark)
        .env("LD_LIBRARY_PATH", lib_path)
        .env("NCCL_ZIP_GPU", gpu)
        .env("NCCL_ZIP_GPU_EMULATE", "0")
        .env("NCCL_SOCKET_IFNAME", "lo")
        .output()
        .expect("run the child");
    let stderr =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child with NCCL_ZIP_GPU={gpu} failed: {}\n{stderr}",
        out.status
    );
    (std::fs::read_to_string(&mark).unwrap_or_default(), stderr)
}

#[test]
fn gpu_off_never_opens_libcuda() {
    if std::env::var_os(CHILD).is_some() {
        return; // the child runs session_in_child only
    }
    let dir = std::env::temp_dir().join(format!("nzc_gpu_off_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    if let Err(why) = fake_libcuda(&dir) {
        eprintln!("SKIP: cannot build the stand-in libcuda ({why}); a C compiler is needed");
        return;
    }
    let (mark, log) = run_child(&dir, "off");
    assert!(
        mark.is_empty(),
        "NCCL_ZIP_GPU=off: the plugin opened libcuda ({mark:?})\n{log}"
    );
    assert!(
        log.contains("maps: no libcuda"),
        "NCCL_ZIP_GPU=off: libcuda mapped or the session did not run:\n{log}"
    );
    // The control: the device path on does open it (and, finding no CUDA symbols
    // in it, offers host buffers only; the session still runs).
    let (mark, log) = run_child(&dir, "on");
    assert!(
        mark.contains("loaded"),
        "NCCL_ZIP_GPU=on did not open the stand-in libcuda: this test cannot see a load\n{log}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// One host-memory session through the vtable (child process only).
#[test]
fn session_in_child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let v = vt();
    unsafe {
        ok(v.init.unwrap()(None), "init");
        let mut n = 0;
        ok(v.devices.unwrap()(&mut n), "devices");
        assert!(n >= 1, "no device on lo");
        let mut props: ncclNetProperties_v8_t = std::mem::zeroed();
        ok(v.getProperties.unwrap()(0, &mut props), "getProperties");
        let gpu_on = std::env::var("NCCL_ZIP_GPU").as_deref() == Ok("on");
        if !gpu_on {
            assert_eq!(
                props.ptrSupport & NCCL_PTR_CUDA as i32,
                0,
                "NCCL_PTR_CUDA offered with the device path off"
            );
        }
        let mut handle = [0u8; 128];
        let mut lc = null_mut();
        ok(
            v.listen.unwrap()(0, handle.as_mut_ptr() as *mut c_void, &mut lc),
            "listen",
        );
        let (mut sc, mut rc): (*mut c_void, *mut c_void) = (null_mut(), null_mut());
        let (mut sdev, mut rdev) = (null_mut(), null_mut());
        let t0 = Instant::now();
        while sc.is_null() || rc.is_null() {
            assert!(t0.elapsed() < Duration::from_secs(20), "connect/accept");
            if sc.is_null() {
                ok(
                    v.connect.unwrap()(0, handle.as_mut_ptr() as *mut c_void, &mut sc, &mut sdev),
                    "connect",
                );
            }
            if rc.is_null() {
                ok(v.accept.unwrap()(lc, &mut rc, &mut rdev), "accept");
            }
        }
        let n = 1 << 20;
        let src: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
        let mut dst = vec![0u8; n];
        let (mut smh, mut rmh): (*mut c_void, *mut c_void) = (null_mut(), null_mut());
        ok(
            v.regMr.unwrap()(
                sc,
                src.as_ptr() as *mut c_void,
                n,
                NCCL_PTR_HOST as i32,
                &mut smh,
            ),
            "regMr(send)",
        );
        ok(
            v.regMr.unwrap()(
                rc,
                dst.as_mut_ptr() as *mut c_void,
                n,
                NCCL_PTR_HOST as i32,
                &mut rmh,
            ),
            "regMr(recv)",
        );
        if !gpu_on {
            // NCCL never does this when ptrSupport lacks CUDA; the plugin must refuse
            // it without asking the driver what the pointer is.
            let mut mh = null_mut();
            let r = v.regMr.unwrap()(
                rc,
                dst.as_mut_ptr() as *mut c_void,
                n,
                NCCL_PTR_CUDA as i32,
                &mut mh,
            );
            assert_eq!(r, ncclResult_t::ncclInvalidArgument);
        }
        let (mut sreq, mut rreq): (*mut c_void, *mut c_void) = (null_mut(), null_mut());
        let mut rbuf = dst.as_mut_ptr() as *mut c_void;
        let (mut cap, mut tag) = (n as i32, 0);
        let t0 = Instant::now();
        while rreq.is_null() {
            ok(
                v.irecv.unwrap()(rc, 1, &mut rbuf, &mut cap, &mut tag, &mut rmh, &mut rreq),
                "irecv",
            );
            assert!(t0.elapsed() < Duration::from_secs(20));
        }
        while sreq.is_null() {
            ok(
                v.isend.unwrap()(sc, src.as_ptr() as *mut c_void, n as i32, 0, smh, &mut sreq),
                "isend",
            );
            assert!(t0.elapsed() < Duration::from_secs(20));
        }
        let (mut sdone, mut rdone, mut got) = (0, 0, 0);
        while sdone == 0 || rdone == 0 {
            assert!(t0.elapsed() < Duration::from_secs(30), "transfer");
            if sdone == 0 {
                ok(v.test.unwrap()(sreq, &mut sdone, null_mut()), "test(send)");
            }
            if rdone == 0 {
                ok(v.test.unwrap()(rreq, &mut rdone, &mut got), "test(recv)");
            }
        }
        assert_eq!(got as usize, n);
        assert!(dst == src, "received bytes differ");
        ok(v.deregMr.unwrap()(sc, smh), "deregMr");
        ok(v.deregMr.unwrap()(rc, rmh), "deregMr");
        ok(v.closeSend.unwrap()(sc), "closeSend");
        ok(v.closeRecv.unwrap()(rc), "closeRecv");
        ok(v.closeListen.unwrap()(lc), "closeListen");
    }
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    match maps.lines().find(|l| l.contains("libcuda")) {
        Some(l) => eprintln!("maps: libcuda mapped: {l}"),
        None => eprintln!("maps: no libcuda"),
    }
}
