//! One direction of one comm, driven like NCCL's proxy progress loop: post up to
//! `inflight` requests (a NULL request means "retry later"), `test()` only the
//! oldest, verify what it delivered, repeat.

use std::collections::VecDeque;
use std::ffi::c_void;
use std::time::Instant;

use crate::bench::BenchClock;
use crate::cli::Opts;
use crate::data::{offset, Msg, Payloads};
use crate::mem::{Buf, Mem};
use crate::net::{Comm, NcclError, Net, Req};

/// Bytes around each message that must stay untouched by the plugin.
pub const GUARD: usize = 64;
const GUARD_BYTE: u8 = 0xA5;
const POISON_BYTE: u8 = 0x5A;

#[derive(Debug)]
pub enum Fail {
    Nccl(NcclError),
    Check(String),
    Timeout(String),
    /// Allocating, filling or reading a buffer failed (a CUDA error).
    Mem(String),
}

impl From<NcclError> for Fail {
    fn from(e: NcclError) -> Fail {
        Fail::Nccl(e)
    }
}

impl std::fmt::Display for Fail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fail::Nccl(e) => write!(f, "{e}"),
            Fail::Check(s) => write!(f, "check failed: {s}"),
            Fail::Timeout(s) => write!(f, "timed out: {s}"),
            Fail::Mem(s) => write!(f, "buffer memory: {s}"),
        }
    }
}

/// `inflight` buffers of `64 + cap + GUARD` bytes; message i uses buffer
/// `i % inflight` at its own 0..63-byte offset. Host buffers are filled and checked
/// in place; device buffers through one host scratch buffer of the same size.
pub struct Buffers {
    pub bufs: Vec<Buf>,
    /// Sender: which (key, size) a buffer currently holds, to skip refills.
    loaded: Vec<Option<(u64, usize)>>,
    /// Device receiver: the (offset, size) whose guards a buffer holds intact
    /// (checked after every message), so unpoisoned receives write nothing.
    guarded: Vec<Option<(usize, usize)>>,
    /// Device buffers: host image of a buffer's first bytes.
    scratch: Vec<u8>,
}

impl Buffers {
    /// Host buffers (the TCP baseline).
    pub fn new(n: usize, cap: usize) -> Buffers {
        Buffers::alloc(&Mem::Host, n, cap).expect("host allocation does not fail")
    }

    pub fn alloc(mem: &Mem, n: usize, cap: usize) -> Result<Buffers, Fail> {
        let len = 64 + cap + GUARD;
        let bufs = (0..n)
            .map(|_| mem.alloc(len))
            .collect::<Result<Vec<_>, _>>()
            .map_err(Fail::Mem)?;
        let device = bufs.iter().any(|b| b.host().is_none());
        Ok(Buffers {
            bufs,
            loaded: vec![None; n],
            guarded: vec![None; n],
            scratch: if device { vec![0u8; len] } else { Vec::new() },
        })
    }

    /// Sender: puts message `i`'s bytes in its buffer; returns the pointer.
    pub fn load(&mut self, i: usize, m: &Msg, seed: u64, p: &Payloads) -> Result<*mut u8, Fail> {
        let slot = i % self.bufs.len();
        let off = offset(seed, m.key);
        if self.loaded[slot] != Some((m.key, m.size)) {
            self.loaded[slot] = None;
            self.bufs[slot].load(off, p.get(m)).map_err(Fail::Mem)?;
            self.loaded[slot] = Some((m.key, m.size));
        }
        // SAFETY (host and device address alike): off + size <= 63 + cap < len.
        Ok(self.bufs[slot].ptr().wrapping_add(off))
    }

    /// Receiver: guards around and (unless benchmarking) poison inside message `i`'s
    /// region, so a missing or stray write shows.
    pub fn prepare_recv(
        &mut self,
        i: usize,
        m: &Msg,
        seed: u64,
        poison: bool,
    ) -> Result<*mut u8, Fail> {
        let slot = i % self.bufs.len();
        let off = offset(seed, m.key);
        let end = off + m.size + GUARD;
        let b = &mut self.bufs[slot];
        if let Some(h) = b.host_mut() {
            h[..off].fill(GUARD_BYTE);
            if poison {
                h[off..off + m.size].fill(POISON_BYTE);
            }
            h[off + m.size..end].fill(GUARD_BYTE);
        } else if poison {
            self.guarded[slot] = None;
            let s = &mut self.scratch[..end];
            s[..off].fill(GUARD_BYTE);
            s[off..off + m.size].fill(POISON_BYTE);
            s[off + m.size..].fill(GUARD_BYTE);
            b.load(0, s).map_err(Fail::Mem)?;
            self.guarded[slot] = Some((off, m.size));
        } else if self.guarded[slot] != Some((off, m.size)) {
            self.guarded[slot] = None;
            let s = &mut self.scratch[..end];
            s.fill(GUARD_BYTE);
            b.load(0, &s[..off]).map_err(Fail::Mem)?;
            b.load(off + m.size, &s[off + m.size..])
                .map_err(Fail::Mem)?;
            self.guarded[slot] = Some((off, m.size));
        }
        Ok(b.ptr().wrapping_add(off))
    }

    /// Receiver: checks message `i` against `want` and its guards.
    pub fn check_recv(
        &mut self,
        i: usize,
        m: &Msg,
        seed: u64,
        want: Option<&[u8]>,
    ) -> Result<(), Fail> {
        let slot = i % self.bufs.len();
        let off = offset(seed, m.key);
        let end = off + m.size + GUARD;
        let b = &self.bufs[slot];
        let image: &[u8] = match b.host() {
            Some(h) => h,
            None => {
                self.guarded[slot] = None;
                let s = &mut self.scratch[..end];
                if want.is_some() {
                    b.store(0, s).map_err(Fail::Mem)?;
                } else {
                    let (head, rest) = s.split_at_mut(off);
                    b.store(0, head).map_err(Fail::Mem)?;
                    b.store(off + m.size, &mut rest[m.size..])
                        .map_err(Fail::Mem)?;
                }
                s
            }
        };
        check_image(image, i, m, off, want).map_err(Fail::Check)?;
        if b.host().is_none() {
            self.guarded[slot] = Some((off, m.size));
        }
        Ok(())
    }
}

/// Checks the guards around message `i` at `off` in `b` (a buffer or its image)
/// and, with `want`, its bytes.
fn check_image(b: &[u8], i: usize, m: &Msg, off: usize, want: Option<&[u8]>) -> Result<(), String> {
    if b[..off].iter().any(|&x| x != GUARD_BYTE)
        || b[off + m.size..off + m.size + GUARD]
            .iter()
            .any(|&x| x != GUARD_BYTE)
    {
        return Err(format!(
            "message {i} ({} bytes at offset {off}): bytes outside the message were written",
            m.size
        ));
    }
    if let Some(want) = want {
        let got = &b[off..off + m.size];
        if got != want {
            let first = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
            let bad = got.iter().zip(want).filter(|(a, b)| a != b).count();
            return Err(format!(
                "message {i} ({} bytes at offset {off}): {bad} bytes differ, first at byte {first} (got {:#04x}, want {:#04x})",
                m.size, got[first], want[first]
            ));
        }
    }
    Ok(())
}

pub struct Pipe<'a> {
    net: &'a Net,
    pub comm: Comm,
    send: bool,
    msgs: &'a [Msg],
    seed: u64,
    verify: bool,
    poison: bool,
    cap: usize,
    inflight: usize,
    bufs: Buffers,
    pub mhandles: Vec<*mut c_void>,
    payloads: Payloads,
    posted: usize,
    pub done: usize,
    queue: VecDeque<(usize, Req)>,
    pub last_progress: Instant,
    pub clock: BenchClock,
}

impl<'a> Pipe<'a> {
    /// Registers one memory region per buffer (NCCL registers its whole buffer once).
    pub fn new(
        net: &'a Net,
        comm: Comm,
        send: bool,
        msgs: &'a [Msg],
        cap: usize,
        o: &Opts,
        mem: &Mem,
    ) -> Result<Pipe<'a>, Fail> {
        let max = msgs.iter().map(|m| m.size).max().unwrap_or(0);
        // Room for the largest message too: a receive smaller than its message
        // (the oversize test) still gets guards after where the message would end.
        let mut bufs = Buffers::alloc(mem, o.inflight, cap.max(max))?;
        let mut mhandles = Vec::new();
        for b in bufs.bufs.iter_mut() {
            match net.reg_mr(comm, b.ptr(), b.len(), mem.ptr_type()) {
                Ok(mh) => mhandles.push(mh),
                Err(e) => {
                    for mh in mhandles {
                        let _ = net.dereg_mr(comm, mh);
                    }
                    return Err(e.into());
                }
            }
        }
        Ok(Pipe {
            net,
            comm,
            send,
            msgs,
            seed: o.seed,
            verify: o.verify,
            poison: !o.bench,
            cap,
            inflight: o.inflight,
            bufs,
            mhandles,
            payloads: Payloads::new(o, max),
            posted: 0,
            done: 0,
            queue: VecDeque::new(),
            last_progress: Instant::now(),
            clock: BenchClock::new(o, if send { "send" } else { "recv" }, "zip"),
        })
    }

    pub fn finished(&self) -> bool {
        self.done == self.msgs.len()
    }

    /// Posts what it can and tests the oldest request once. `Ok(true)` on progress.
    pub fn step(&mut self) -> Result<bool, Fail> {
        let mut progress = false;
        while self.posted < self.msgs.len() && self.posted - self.done < self.inflight {
            let i = self.posted;
            let m = self.msgs[i];
            let mh = self.mhandles[i % self.inflight];
            let req = if self.send {
                let p = self.bufs.load(i, &m, self.seed, &self.payloads)?;
                // SAFETY: the buffer is not touched again until this request is done.
                unsafe { self.net.isend(self.comm, p, m.size, mh)? }
            } else {
                let p = self.bufs.prepare_recv(i, &m, self.seed, self.poison)?;
                // SAFETY: as above; cap bytes fit after the offset.
                unsafe { self.net.irecv(self.comm, p, self.cap, mh)? }
            };
            if req.is_null() {
                break; // the plugin asked us to retry later
            }
            if self.posted == 0 {
                self.clock.start();
            }
            self.queue.push_back((i, req));
            self.posted += 1;
            progress = true;
        }
        if let Some(&(i, req)) = self.queue.front() {
            if let Some(size) = self.net.test(req)? {
                let m = self.msgs[i];
                if size != m.size {
                    return Err(Fail::Check(format!(
                        "message {i}: test() reported {size} bytes, {} were sent",
                        m.size
                    )));
                }
                if !self.send {
                    let want = self.verify.then(|| self.payloads.get(&m));
                    self.bufs.check_recv(i, &m, self.seed, want)?;
                }
                self.queue.pop_front();
                self.done += 1;
                self.last_progress = Instant::now();
                self.clock.completed(&m, self.msgs.get(i + 1));
                progress = true;
            }
        }
        Ok(progress)
    }

    /// Deregisters the buffers (NCCL does this before closing the comm).
    pub fn dereg(&mut self) -> Result<(), NcclError> {
        let mut first = Ok(());
        for mh in self.mhandles.drain(..) {
            if let Err(e) = self.net.dereg_mr(self.comm, mh) {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }
}

/// Sender side of the baseline: same buffers, same bytes.
pub struct PlainSender {
    pub bufs: Buffers,
    pub payloads: Payloads,
}

impl PlainSender {
    pub fn new(o: &Opts, cap: usize) -> PlainSender {
        PlainSender {
            bufs: Buffers::new(o.inflight, cap),
            payloads: Payloads::new(o, cap),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::MemKind;

    /// Sender buffers to receiver buffers the way the plugin moves them (through
    /// the buffers' own copies), then the receiver's checks, on `mem`.
    fn round_trip(mem: &Mem) {
        let args: Vec<String> = ["nccl-zip-perf", "loop", "--data", "bf16", "--seed", "9"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let o = Opts::parse(&args).unwrap();
        let msgs: Vec<Msg> = [(12345, 3), (0, 4), (4096, 5), (12345, 3), (1, 11)]
            .iter()
            .map(|&(size, key)| Msg {
                size,
                key,
                block: 0,
                warmup: false,
            })
            .collect();
        let cap = 12345;
        let payloads = Payloads::new(&o, cap);
        let mut tx = Buffers::alloc(mem, 2, cap).unwrap();
        let mut rx = Buffers::alloc(mem, 2, cap).unwrap();
        for poison in [true, false] {
            for (i, m) in msgs.iter().enumerate() {
                let (slot, off) = (i % 2, offset(o.seed, m.key));
                let s = tx.load(i, m, o.seed, &payloads).unwrap();
                assert_eq!(s, tx.bufs[slot].ptr().wrapping_add(off));
                let r = rx.prepare_recv(i, m, o.seed, poison).unwrap();
                assert_eq!(r, rx.bufs[slot].ptr().wrapping_add(off));
                let want = payloads.get(m);
                if poison && m.size > 0 {
                    // Nothing delivered yet: the poison shows.
                    assert!(rx.check_recv(i, m, o.seed, Some(want)).is_err());
                }
                let mut bytes = vec![0u8; m.size];
                tx.bufs[slot].store(off, &mut bytes).unwrap();
                assert_eq!(bytes, want);
                rx.bufs[slot].load(off, &bytes).unwrap();
                rx.check_recv(i, m, o.seed, Some(want)).unwrap();
                rx.check_recv(i, m, o.seed, None).unwrap();
                // A stray write just past the message, then one inside it.
                rx.bufs[slot].load(off + m.size, &[0]).unwrap();
                let e = rx.check_recv(i, m, o.seed, None).unwrap_err();
                assert!(e.to_string().contains("outside the message"), "{e}");
                rx.prepare_recv(i, m, o.seed, poison).unwrap();
                rx.bufs[slot].load(off, &bytes).unwrap();
                rx.check_recv(i, m, o.seed, Some(want)).unwrap();
                if m.size > 0 {
                    rx.bufs[slot]
                        .load(off + m.size / 2, &[!want[m.size / 2]])
                        .unwrap();
                    let e = rx.check_recv(i, m, o.seed, Some(want)).unwrap_err();
                    assert!(e.to_string().contains("1 bytes differ"), "{e}");
                }
            }
        }
    }

    #[test]
    fn buffers_round_trip_host() {
        round_trip(&Mem::Host);
        round_trip(&Mem::Emulated {
            setting: "1".into(),
        });
    }

    #[test]
    fn buffers_round_trip_device() {
        if std::env::var_os("NCCL_ZIP_GPU_EMULATE").is_some() {
            println!("SKIP: NCCL_ZIP_GPU_EMULATE is set");
            return;
        }
        match Mem::open(MemKind::Cuda) {
            Ok(mem) => {
                println!("{}", mem.describe());
                round_trip(&mem);
            }
            Err(e) => println!("SKIP: {e}"),
        }
    }
}
