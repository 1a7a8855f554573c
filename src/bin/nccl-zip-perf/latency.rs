//! `loop --latency`: one-way latency of a single message in flight, the figure
//! NCCL's LL protocol and small inference collectives live on. One thread posts
//! `isend` and the matching `irecv` on a connected pair of the plugin's comms and
//! polls both with `test` until the receive is done, as NCCL's proxy does
//! (yielding the CPU when nothing moved; `--poll-sleep-us` sleeps instead). `--baseline tcp` does the same over one non-blocking TCP
//! socket pair, written and read from the polling thread itself: NCCL's Socket
//! transport with its default of no helper threads.
//!
//! Prints one line per size: median, p10 and p99 in microseconds, and the bytes
//! are checked on every iteration.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use nccl_net_zip::ffi::abi::NCCL_PTR_HOST;

use crate::cli::{DataKind, Opts};
use crate::data::fill;
use crate::net::{Comm, Net};
use crate::pipe::Fail;

/// Latencies of one size, in microseconds, sorted.
struct Samples(Vec<f64>);

impl Samples {
    fn pct(&self, p: f64) -> f64 {
        let i = ((self.0.len() - 1) as f64 * p).round() as usize;
        self.0[i]
    }
    fn line(&self, what: &str, size: usize) -> String {
        format!(
            "LAT {what} size {size} p50_us {:.2} p10_us {:.2} p99_us {:.2} n {}",
            self.pct(0.5),
            self.pct(0.1),
            self.pct(0.99),
            self.0.len()
        )
    }
}

fn payload(o: &Opts, size: usize, salt: u64) -> Vec<u8> {
    let mut v = vec![0u8; size];
    let kind = if o.data == DataKind::File {
        DataKind::Random
    } else {
        o.data
    };
    fill(kind, o.sigma, o.seed, salt, &mut v);
    v
}

fn check(got: &[u8], want: &[u8], what: &str, i: usize) -> Result<(), Fail> {
    if got != want {
        let at = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
        return Err(Fail::Check(format!(
            "{what}: iteration {i}: byte {at} of {} differs",
            want.len()
        )));
    }
    Ok(())
}

/// The plugin: `sc`/`rc` are a connected send comm and the recv comm it reaches.
pub fn plugin(o: &Opts, net: &Net, sc: Comm, rc: Comm) -> Result<Vec<String>, Fail> {
    let sizes = o.sizes.clone().expect("cli");
    let cap = sizes.iter().copied().max().unwrap_or(0).max(1);
    let mut src = vec![0u8; cap];
    let mut dst = vec![0u8; cap];
    let smh = net.reg_mr(sc, src.as_mut_ptr(), cap, NCCL_PTR_HOST as std::ffi::c_int)?;
    let rmh = net.reg_mr(rc, dst.as_mut_ptr(), cap, NCCL_PTR_HOST as std::ffi::c_int)?;
    let mut lines = Vec::new();
    let deadline = Instant::now() + o.timeout;
    let mut run = || -> Result<(), Fail> {
        for &size in &sizes {
            let want = payload(o, size, size as u64);
            src[..size].copy_from_slice(&want);
            let mut s = Vec::with_capacity(o.count);
            for i in 0..o.warmup + o.count {
                dst[..size].fill(0xA5);
                let t = Instant::now();
                // SAFETY: both buffers outlive the requests, which complete below
                // before either is touched again.
                let rr = unsafe { net.irecv(rc, dst.as_mut_ptr(), cap, rmh)? };
                let sr = unsafe { net.isend(sc, src.as_mut_ptr(), size, smh)? };
                if rr.is_null() || sr.is_null() {
                    return Err(Fail::Check(
                        "a request slot was busy with one in flight".into(),
                    ));
                }
                let (mut sdone, mut rdone) = (false, None);
                while !sdone || rdone.is_none() {
                    if !sdone {
                        sdone = net.test(sr)?.is_some();
                    }
                    if rdone.is_none() {
                        rdone = net.test(rr)?;
                        if rdone.is_some() && i >= o.warmup {
                            s.push(t.elapsed().as_secs_f64() * 1e6);
                        }
                    }
                    if Instant::now() > deadline {
                        return Err(Fail::Timeout(format!("latency at {size} bytes")));
                    }
                    if rdone.is_none() {
                        crate::idle(o);
                    }
                }
                if rdone != Some(size) {
                    return Err(Fail::Check(format!(
                        "size {size}: test reported {rdone:?} bytes received"
                    )));
                }
                if o.verify {
                    check(&dst[..size], &want, "plugin", i)?;
                }
            }
            s.sort_by(f64::total_cmp);
            let line = Samples(s).line("plugin", size);
            println!("{line}");
            lines.push(line);
        }
        Ok(())
    };
    let r = run();
    net.dereg_mr(sc, smh)?;
    net.dereg_mr(rc, rmh)?;
    r.map(|()| lines)
}

/// One step of a non-blocking transfer: `Ok(true)` while bytes remain.
fn step(r: std::io::Result<usize>, left: &mut usize, what: &str) -> Result<bool, Fail> {
    match r {
        Ok(0) if *left > 0 => Err(Fail::Check(format!("baseline {what}: peer closed"))),
        Ok(n) => {
            *left -= n;
            Ok(*left > 0)
        }
        Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(true),
        Err(e) => Err(Fail::Check(format!("baseline {what}: {e}"))),
    }
}

/// The baseline: one TCP connection over `ip`, 4-byte size then payload, both ends
/// non-blocking and driven by this thread. `one_write`: size and payload leave in
/// one write and are read as one buffer (a floor for any socket transport; NCCL
/// itself moves them in two operations each).
pub fn baseline(o: &Opts, ip: std::net::IpAddr, one_write: bool) -> Result<Vec<String>, Fail> {
    let io = |what: &'static str| move |e: std::io::Error| Fail::Check(format!("{what}: {e}"));
    let l = TcpListener::bind((ip, 0)).map_err(io("bind"))?;
    let addr = l.local_addr().map_err(io("local_addr"))?;
    let mut tx =
        TcpStream::connect_timeout(&addr, Duration::from_secs(10)).map_err(io("connect"))?;
    let (mut rx, _) = l.accept().map_err(io("accept"))?;
    for s in [&tx, &rx] {
        s.set_nodelay(true).map_err(io("nodelay"))?;
        s.set_nonblocking(true).map_err(io("nonblocking"))?;
    }
    let sizes = o.sizes.clone().expect("cli");
    let dl = Instant::now() + o.timeout;
    let mut lines = Vec::new();
    for &size in &sizes {
        let want = payload(o, size, size as u64);
        let mut s = Vec::with_capacity(o.count);
        let szb = (size as u32).to_le_bytes();
        let whole: Vec<u8> = szb.iter().chain(&want).copied().collect();
        let mut inb = vec![0u8; 4 + size];
        for i in 0..o.warmup + o.count {
            inb.fill(0xA5);
            let t = Instant::now();
            // As NCCL's Socket transport does per request: the 4-byte size, then
            // the payload, each its own socket operation, on both sides; writes
            // and reads interleaved so that a message larger than the socket
            // buffers cannot stall this one thread.
            let (mut wl0, mut wl1, mut rl0, mut rl1) = (4usize, size, 4usize, size);
            let (mut wmore, mut rmore) = (true, true);
            while one_write && (wmore || rmore) {
                let before = rl1;
                if wmore {
                    let off = whole.len() - wl1 - wl0;
                    let mut left = wl0 + wl1;
                    wmore = step(tx.write(&whole[off..]), &mut left, "write")?;
                    (wl0, wl1) = (0, left);
                }
                if rmore {
                    let mut left = rl0 + rl1;
                    let off = inb.len() - left;
                    rmore = step(rx.read(&mut inb[off..]), &mut left, "read")?;
                    (rl0, rl1) = (0, left);
                }
                if Instant::now() > dl {
                    return Err(Fail::Timeout(format!("baseline latency at {size} bytes")));
                }
                if rmore && rl1 == before {
                    crate::idle(o);
                }
            }
            while wmore || rmore {
                let before = rl0 + rl1;
                if wmore {
                    wmore = if wl0 > 0 {
                        step(tx.write(&szb[4 - wl0..]), &mut wl0, "write size")?;
                        true
                    } else {
                        size > 0 && step(tx.write(&want[size - wl1..]), &mut wl1, "write")?
                    };
                }
                if rmore {
                    rmore = if rl0 > 0 {
                        step(rx.read(&mut inb[4 - rl0..4]), &mut rl0, "read size")?;
                        true
                    } else {
                        let off = 4 + size - rl1;
                        size > 0 && step(rx.read(&mut inb[off..]), &mut rl1, "read")?
                    };
                }
                if Instant::now() > dl {
                    return Err(Fail::Timeout(format!("baseline latency at {size} bytes")));
                }
                if rmore && rl0 + rl1 == before {
                    crate::idle(o); // nothing arrived: NCCL's test returns here
                }
            }
            let n = u32::from_le_bytes(inb[..4].try_into().expect("4 bytes")) as usize;
            if n != size {
                return Err(Fail::Check(format!("baseline: size {n}, expected {size}")));
            }
            if i >= o.warmup {
                s.push(t.elapsed().as_secs_f64() * 1e6);
            }
            if o.verify {
                check(&inb[4..], &want, "baseline", i)?;
            }
        }
        s.sort_by(f64::total_cmp);
        let line = Samples(s).line(if one_write { "tcp1w" } else { "tcp" }, size);
        println!("{line}");
        lines.push(line);
    }
    Ok(lines)
}
