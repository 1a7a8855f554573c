//! The verbs layer: the built plugin has no link-time dependency on libibverbs,
//! our struct layouts match the installed verbs.h, and (on hardware only, opt-in)
//! the protocol runs over real RC queue pairs. See docs/IB.md.

use std::process::Command;

use nccl_net_zip::transport::ib::verbs::sys::LAYOUT;

mod support;
use support::{needed_libs, plugin_so as plugin};

#[test]
fn plugin_has_no_libibverbs_dependency() {
    let so = plugin();
    for l in &needed_libs(&so) {
        for banned in ["libibverbs", "librdmacm", "libmlx5", "libcuda"] {
            assert!(!l.contains(banned), "{so:?} has a hard dependency: {l}");
        }
    }
}

#[test]
fn struct_layouts_match_the_installed_verbs_h() {
    let header = std::path::Path::new("/usr/include/infiniband/verbs.h");
    if !header.exists() {
        eprintln!("SKIPPED: {header:?} not installed (apt-get install libibverbs-dev); compile-time asserts still pin the v44 layout");
        return;
    }
    let dir = std::env::temp_dir().join(format!("nccl-zip-ib-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut c = String::from(
        "#include <infiniband/verbs.h>\n#include <stdio.h>\n#include <stddef.h>\nint main(void){\n",
    );
    for (name, _) in LAYOUT {
        let expr = if let Some(t) = name.strip_prefix("sizeof(") {
            format!("sizeof(struct {}", t)
        } else {
            let (ty, field) = name.split_once('.').unwrap();
            format!("offsetof(struct {ty}, {field})")
        };
        c.push_str(&format!("printf(\"%zu\\n\", (size_t){expr});\n"));
    }
    c.push_str("return 0;}\n");
    std::fs::write(dir.join("l.c"), c).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = Command::new(&cc)
        .arg(dir.join("l.c"))
        .arg("-o")
        .arg(dir.join("l"))
        .status()
        .expect("a C compiler");
    assert!(st.success(), "compiling the layout probe failed");
    let out = Command::new(dir.join("l")).output().unwrap();
    let got: Vec<usize> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(got.len(), LAYOUT.len());
    for ((name, ours), c) in LAYOUT.iter().zip(got) {
        assert_eq!(*ours, c, "{name}: ours {ours}, verbs.h {c}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Hardware: two fabrics on the first active port, connected to each other
/// (loopback through the HCA), running the real protocol with compressed and raw
/// chunks. Opt-in: `NCCL_ZIP_IB_HW_TEST=1 cargo test --test ib_verbs -- --ignored ib_hw`.
#[test]
#[ignore = "needs an RDMA device; see docs/IB.md"]
fn ib_hw_loopback_transfer() {
    use nccl_net_zip::adapt::Policy;
    use nccl_net_zip::codec::{DtypeHint, EncodeOptions};
    use nccl_net_zip::codec_glue::Coder;
    use nccl_net_zip::config::CompressMode;
    use nccl_net_zip::transport::ib::device::{enumerate, HcaFilter};
    use nccl_net_zip::transport::ib::fabric::Fabric;
    use nccl_net_zip::transport::ib::proto::{Coders, Event, Params, Receiver, Sender};
    use nccl_net_zip::transport::ib::verbs::{Context, QpParams, VerbsFabric};

    if std::env::var("NCCL_ZIP_IB_HW_TEST").as_deref() != Ok("1") {
        eprintln!("SKIPPED: set NCCL_ZIP_IB_HW_TEST=1 on a host with an RDMA device");
        return;
    }
    let hca = HcaFilter::parse(&std::env::var("NCCL_IB_HCA").unwrap_or_default());
    let gid_env = std::env::var("NCCL_IB_GID_INDEX")
        .ok()
        .and_then(|v| v.parse().ok());
    let devs = enumerate(&hca, gid_env).expect("no usable RDMA device");
    let d = devs.first().expect("no active port");
    eprintln!("using {d:?}");
    let p = Params::default();
    let qpp = QpParams {
        gid_index: d.gid_index,
        ..QpParams::default()
    };
    let nqps = 2;
    let mk = || {
        let ctx = Context::open(&d.name, d.port).unwrap();
        VerbsFabric::new(ctx, nqps, p.sq_depth, p.rq_depth(), qpp).unwrap()
    };
    let (mut fs, mut fr) = (mk(), mk());
    let (is, ir) = (fs.local_info().unwrap(), fr.local_info().unwrap());
    fs.connect(&ir).unwrap();
    fr.connect(&is).unwrap();
    let coder = || Coder {
        policy: Policy::new(CompressMode::On, Some(100_000), nqps),
        opts: EncodeOptions {
            dtype: DtypeHint::Bf16,
            ..EncodeOptions::default()
        },
    };
    let coders = Coders {
        host: coder(),
        dev: coder(),
    };
    let mut s = Sender::new(&mut fs, p.clone(), coders).unwrap();
    let mut r = Receiver::new(&mut fr, p).unwrap();
    s.connect(r.endpoint());
    r.connect(s.endpoint());
    let sizes = [0usize, 1, 4097, 12345, 128 << 10, 512 << 10, 1 << 20];
    let mut srcs: Vec<Vec<u8>> = sizes
        .iter()
        .map(|&n| {
            (0..n)
                .map(|i| if i % 2 == 0 { (i / 7) as u8 } else { 0x3c })
                .collect()
        })
        .collect();
    let mut dsts: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n + 64]).collect();
    for (i, _) in sizes.iter().enumerate() {
        // SAFETY: buffers outlive the fabrics' use of them (dropped after the loop).
        let sm = unsafe {
            fs.reg_mr(srcs[i].as_mut_ptr(), srcs[i].len().max(1))
                .unwrap()
        };
        let rm = unsafe { fr.reg_mr(dsts[i].as_mut_ptr(), dsts[i].len()).unwrap() };
        r.irecv(
            i as u64,
            dsts[i].as_ptr() as u64,
            dsts[i].len(),
            rm.rkey,
            None,
        )
        .unwrap();
        s.isend(i as u64, srcs[i].as_ptr() as u64, sizes[i], sm.lkey, None)
            .unwrap();
    }
    let (mut sent, mut recvd) = (0, vec![]);
    let t0 = std::time::Instant::now();
    while sent < sizes.len() || recvd.len() < sizes.len() {
        assert!(t0.elapsed().as_secs() < 30, "hardware transfer timed out");
        let mut ev = Vec::new();
        s.progress(&mut fs, &mut ev).unwrap();
        r.progress(&mut fr, &mut ev).unwrap();
        for e in ev {
            match e {
                Event::SendDone { .. } => sent += 1,
                Event::RecvDone { seq, size } => recvd.push((seq, size)),
            }
        }
    }
    recvd.sort();
    for (i, &n) in sizes.iter().enumerate() {
        assert_eq!(recvd[i], (i as u64, n));
        assert!(dsts[i][..n] == srcs[i][..], "message {i} differs");
    }
    eprintln!("sender: {}", s.stats.summary());
}
