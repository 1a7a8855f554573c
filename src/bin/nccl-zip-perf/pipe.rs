//! One direction of one comm, driven like NCCL's proxy progress loop: post up to
//! `inflight` requests (a NULL request means "retry later"), `test()` only the
//! oldest, verify what it delivered, repeat.

use std::collections::VecDeque;
use std::ffi::c_void;
use std::time::Instant;

use crate::bench::BenchClock;
use crate::cli::Opts;
use crate::data::{offset, Msg, Payloads};
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
        }
    }
}

/// `inflight` buffers of `64 + cap + GUARD` bytes; message i uses buffer
/// `i % inflight` at its own 0..63-byte offset.
pub struct Buffers {
    pub bufs: Vec<Vec<u8>>,
    /// Sender: which (key, size) a buffer currently holds, to skip refills.
    loaded: Vec<Option<(u64, usize)>>,
}

impl Buffers {
    pub fn new(n: usize, cap: usize) -> Buffers {
        Buffers {
            bufs: (0..n).map(|_| vec![0u8; 64 + cap + GUARD]).collect(),
            loaded: vec![None; n],
        }
    }

    /// Sender: puts message `i`'s bytes in its buffer; returns the pointer.
    pub fn load(&mut self, i: usize, m: &Msg, seed: u64, p: &Payloads) -> *mut u8 {
        let slot = i % self.bufs.len();
        let off = offset(seed, m.key);
        if self.loaded[slot] != Some((m.key, m.size)) {
            let data = p.get(m);
            self.bufs[slot][off..off + m.size].copy_from_slice(data);
            self.loaded[slot] = Some((m.key, m.size));
        }
        // SAFETY: off + size <= 63 + cap < len.
        unsafe { self.bufs[slot].as_mut_ptr().add(off) }
    }

    /// Receiver: guards around and (unless benchmarking) poison inside message `i`'s
    /// region, so a missing or stray write shows.
    pub fn prepare_recv(&mut self, i: usize, m: &Msg, seed: u64, poison: bool) -> *mut u8 {
        let slot = i % self.bufs.len();
        let off = offset(seed, m.key);
        let b = &mut self.bufs[slot];
        b[..off].fill(GUARD_BYTE);
        if poison {
            b[off..off + m.size].fill(POISON_BYTE);
        }
        b[off + m.size..off + m.size + GUARD].fill(GUARD_BYTE);
        // SAFETY: off <= 63 < len.
        unsafe { b.as_mut_ptr().add(off) }
    }

    /// Receiver: checks message `i` against `want` and its guards.
    pub fn check_recv(
        &self,
        i: usize,
        m: &Msg,
        seed: u64,
        want: Option<&[u8]>,
    ) -> Result<(), String> {
        let slot = i % self.bufs.len();
        let off = offset(seed, m.key);
        let b = &self.bufs[slot];
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
    ) -> Result<Pipe<'a>, Fail> {
        let max = msgs.iter().map(|m| m.size).max().unwrap_or(0);
        // Room for the largest message too: a receive smaller than its message
        // (the oversize test) still gets guards after where the message would end.
        let mut bufs = Buffers::new(o.inflight, cap.max(max));
        let mut mhandles = Vec::new();
        for b in bufs.bufs.iter_mut() {
            mhandles.push(net.reg_mr(comm, b)?);
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
                let p = self.bufs.load(i, &m, self.seed, &self.payloads);
                // SAFETY: the buffer is not touched again until this request is done.
                unsafe { self.net.isend(self.comm, p, m.size, mh)? }
            } else {
                let p = self.bufs.prepare_recv(i, &m, self.seed, self.poison);
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
                    self.bufs
                        .check_recv(i, &m, self.seed, want)
                        .map_err(Fail::Check)?;
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
