//! The inline stream: one more socket per comm, driven by NCCL's progress thread
//! itself, for small messages that go raw.
//!
//! Through the I/O threads a message costs two thread wake-ups (the sender's
//! thread, woken by `isend`, and the receiver's, woken by the socket) on top of the
//! socket itself. For a 64 KiB message that doubled or tripled the latency against
//! a single socket polled by one thread, which is what NCCL's own Socket transport
//! does by default. So a message of at most `NCCL_ZIP_INLINE_MAX` bytes that the
//! adaptive policy sends raw is written by `isend` straight to this non-blocking
//! socket, and read by `test` straight into the posted buffer; neither side's I/O
//! threads are involved. What does not fit the socket at once is finished by later
//! `isend`/`test` calls of the same comm (NCCL keeps testing a request until it is
//! done), so the progress thread never blocks.
//!
//! Messages go on this stream in `isend` order, each whole (one chunk, header as on
//! the other streams, never compressed); any stream may carry any message, so the
//! receiver matches them to posted receives by sequence number as usual.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::sync::Arc;

use parking_lot::Mutex;
use socket2::Socket;

use super::core::{Core, RxLimits};
use crate::devpath::Lanes;
use crate::error::{Error, Result};
use crate::gpu::pool::Dir;
use crate::gpu::Backend;
use crate::proto::slots::{Lookup, Slot, NSLOTS};
use crate::proto::wire::{ChunkHeader, CHUNK_HEADER_SIZE};
use crate::stats::HELD;

/// A message on its way out: header, then `len` bytes of NCCL's buffer at `data`.
struct Out {
    seq: u64,
    hdr: [u8; CHUNK_HEADER_SIZE],
    data: usize,
    len: usize,
    /// Bytes of header + payload written so far.
    done: usize,
}

/// The message being read.
struct In {
    hdr: ChunkHeader,
    slot: *const Slot,
    /// Payload bytes read so far.
    got: usize,
}

#[derive(Default)]
struct RxState {
    hdr: [u8; CHUNK_HEADER_SIZE],
    hdr_got: usize,
    cur: Option<In>,
    /// Payload bytes of a message whose posted buffer is device memory: read here,
    /// then copied up through a lane. At most the sender's chunk size.
    bounce: Vec<u8>,
    lanes: Option<Lanes>,
}

// SAFETY: `In::slot` points into the comm's own ring, which outlives this state.
unsafe impl Send for RxState {}

pub struct Inline {
    sock: Socket,
    tx: Mutex<VecDeque<Out>>,
    rx: Mutex<RxState>,
}

/// Whether `e` means "try again later".
fn would_block(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}

impl Inline {
    /// `sock` must already carry the data-socket options; it is made non-blocking.
    pub fn new(sock: Socket) -> Result<Inline> {
        sock.set_nonblocking(true)
            .map_err(|e| Error::io("set_nonblocking", e))?;
        Ok(Inline {
            sock,
            tx: Mutex::new(VecDeque::with_capacity(NSLOTS)),
            rx: Mutex::new(RxState::default()),
        })
    }

    pub fn socket(&self) -> &Socket {
        &self.sock
    }

    /// Sender: queues message `seq` (`len` bytes at `data`, valid until its request
    /// is done) and writes as much as the socket takes now.
    pub fn send(&self, core: &Core, seq: u64, data: *const u8, len: usize) {
        let hdr = ChunkHeader {
            flags: 0,
            seq,
            total: len as u32,
            offset: 0,
            raw_len: len as u32,
            wire_len: len as u32,
        }
        .encode();
        self.tx.lock().push_back(Out {
            seq,
            hdr,
            data: data as usize,
            len,
            done: 0,
        });
        self.progress_tx(core);
    }

    /// Sender: nothing is queued (every message so far is in the socket). False
    /// while another thread is writing.
    pub fn tx_idle(&self) -> bool {
        self.tx.try_lock().is_some_and(|q| q.is_empty())
    }

    /// Sender: writes queued messages until the socket is full.
    pub fn progress_tx(&self, core: &Core) {
        let Some(mut q) = self.tx.try_lock() else {
            return;
        };
        while let Some(o) = q.front_mut() {
            let total = CHUNK_HEADER_SIZE + o.len;
            // SAFETY: NCCL keeps the buffer alive and unchanged until `test`
            // reports this request done, which happens only after the last byte.
            let payload: &[u8] = if o.len == 0 {
                &[] // the buffer may be NULL
            } else {
                unsafe { std::slice::from_raw_parts(o.data as *const u8, o.len) }
            };
            let (h, p) = if o.done < CHUNK_HEADER_SIZE {
                (&o.hdr[o.done..], payload)
            } else {
                (&[][..], &payload[o.done - CHUNK_HEADER_SIZE..])
            };
            let r = self.sock.send_vectored_with_flags(
                &[IoSlice::new(h), IoSlice::new(p)],
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
            );
            let r = match r {
                Ok(0) if o.done < total => Err(io::ErrorKind::WriteZero.into()),
                r => r,
            };
            match r {
                Ok(n) => o.done += n,
                Err(e) if would_block(&e) => return,
                Err(e) => {
                    let seq = o.seq;
                    drop(q);
                    core.fail(Error::io(
                        format!("send to {} (inline stream, message {seq})", core.peer),
                        e,
                    ));
                    return;
                }
            }
            if o.done < total {
                continue; // the socket took part of it: try again, it may take more
            }
            let (seq, len) = (o.seq, o.len);
            q.pop_front();
            let st = &core.stats;
            st.add(&st.wire_bytes, len as u64);
            st.add(&st.chunks_raw, 1);
            st.add(&st.chunks_inline, 1);
            core.ring.slot(seq).chunk_sent();
        }
    }

    /// Receiver: reads whatever has arrived, placing each message in its posted
    /// buffer. `devs` gives the device of a posted buffer (None: host memory).
    pub fn progress_rx(
        &self,
        core: &Core,
        lim: RxLimits,
        dev_of: impl Fn(u64) -> Option<Arc<dyn Backend>>,
    ) {
        let Some(mut st) = self.rx.try_lock() else {
            return;
        };
        if core.inline_ended() || core.stopped() {
            return;
        }
        if let Err(e) = self.rx_step(&mut st, core, lim, &dev_of) {
            drop(st);
            if !core.closing() {
                core.fail(e);
            }
        }
    }

    fn rx_step(
        &self,
        st: &mut RxState,
        core: &Core,
        lim: RxLimits,
        dev_of: &impl Fn(u64) -> Option<Arc<dyn Backend>>,
    ) -> Result<()> {
        let max_chunk = lim.max_chunk;
        let peer = core.peer;
        let io_err = |e| Error::io(format!("receive from {peer} (inline stream)"), e);
        loop {
            if st.cur.is_none() {
                while st.hdr_got < CHUNK_HEADER_SIZE {
                    let at = st.hdr_got;
                    match read_some(&self.sock, &mut st.hdr[at..]) {
                        Ok(0) if at == 0 => {
                            // Closed between messages.
                            core.stream_ended(core.inline_producer());
                            return Ok(());
                        }
                        Ok(0) => {
                            return Err(io_err(io::Error::new(
                                io::ErrorKind::UnexpectedEof,
                                "peer closed the connection mid-message",
                            )))
                        }
                        Ok(n) => st.hdr_got += n,
                        Err(e) if would_block(&e) => return Ok(()),
                        Err(e) => return Err(io_err(e)),
                    }
                }
                let h = ChunkHeader::decode(&st.hdr, lim.max_wire)?;
                if h.compressed() || h.offset != 0 || h.raw_len != h.total {
                    return Err(Error::Remote(format!(
                        "corrupt stream: inline message {h:?} is not one raw chunk"
                    )));
                }
                if h.raw_len as usize > max_chunk {
                    return Err(Error::Remote(format!(
                        "corrupt stream: inline message of {} bytes, larger than the sender's chunk size {max_chunk}",
                        h.raw_len
                    )));
                }
                let me = core.inline_producer();
                let slot = match core.ring.lookup(h.seq) {
                    Lookup::Ready(s) => {
                        core.ring.producer_waits(me, None);
                        s
                    }
                    // Not posted yet: the header waits, and so does the socket,
                    // unless no other stream can bring the pending receives.
                    Lookup::NotYet => {
                        return match core.ring.producer_waits(me, Some(h.seq)) {
                            Some(seq) => Err(core.stalled(seq)),
                            None => Ok(()),
                        }
                    }
                    Lookup::Stale => {
                        return Err(Error::Remote(format!(
                            "corrupt stream: inline message {}, which is not expected",
                            h.seq
                        )))
                    }
                };
                core.admit(slot, &h)?;
                st.hdr_got = 0;
                st.cur = Some(In {
                    hdr: h,
                    slot,
                    got: 0,
                });
            }
            let (h, slot_ptr, got) = {
                let c = st.cur.as_ref().expect("set above");
                (c.hdr, c.slot, c.got)
            };
            // SAFETY: the slot is in this comm's ring.
            let slot = unsafe { &*slot_ptr };
            let len = h.raw_len as usize;
            let dev = dev_of(h.seq);
            let (buf, _) = slot.recv_buffer();
            let mut got = got;
            while got < len {
                let r = match &dev {
                    None => {
                        // SAFETY: the posted buffer holds cap >= total bytes (checked
                        // above) and is ours until `test` reports done.
                        let dst = unsafe {
                            std::slice::from_raw_parts_mut((buf + got) as *mut u8, len - got)
                        };
                        read_some(&self.sock, dst)
                    }
                    Some(_) => {
                        if st.bounce.len() < len {
                            let grow = (len - st.bounce.len()) as u64;
                            st.bounce.resize(len, 0);
                            core.stats.add(&core.stats.staging_bytes, grow);
                            HELD.staging_bytes
                                .fetch_add(grow, std::sync::atomic::Ordering::Relaxed);
                        }
                        read_some(&self.sock, &mut st.bounce[got..len])
                    }
                };
                match r {
                    Ok(0) => {
                        return Err(io_err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "peer closed the connection mid-message",
                        )))
                    }
                    Ok(n) => got += n,
                    Err(e) if would_block(&e) => {
                        st.cur.as_mut().expect("set above").got = got;
                        return Ok(());
                    }
                    Err(e) => return Err(io_err(e)),
                }
            }
            if let Some(b) = dev {
                if len > 0 {
                    let lanes = st
                        .lanes
                        .get_or_insert_with(|| Lanes::new(Dir::Recv, lim.max_wire, lim.lanes));
                    // Never wait for a lane, nor make one, on NCCL's thread (the pool
                    // was prewarmed for this reader): all busy, try on the next call.
                    let Some(mut lane) = lanes.try_take(&b)? else {
                        st.cur.as_mut().expect("set above").got = got;
                        return Ok(());
                    };
                    lane.staging(len)?.copy_from_slice(&st.bounce[..len]);
                    lane.upload(buf as u64, len)?;
                    core.stats.add(&core.stats.chunks_device, 1);
                }
            }
            st.cur = None;
            let s = &core.stats;
            s.add(&s.chunks_raw, 1);
            s.add(&s.chunks_inline, 1);
            s.add(&s.wire_bytes, len as u64);
            s.add(&s.raw_bytes, len as u64);
            crate::adapt::RECEIVED.add(len as u64);
            if slot.bytes_placed(len) {
                s.add(&s.messages, 1);
            }
        }
    }
}

impl Drop for Inline {
    fn drop(&mut self) {
        // The comm's own counters go with it; the plugin-wide one must not keep
        // the bounce buffer.
        let n = self.rx.get_mut().bounce.len() as u64;
        HELD.staging_bytes
            .fetch_sub(n, std::sync::atomic::Ordering::Relaxed);
    }
}

/// One non-blocking read.
fn read_some(s: &Socket, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: u8 and MaybeUninit<u8> have the same layout, and recv only writes.
    let b = unsafe {
        std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<MaybeUninit<u8>>(), buf.len())
    };
    s.recv_with_flags(b, libc::MSG_DONTWAIT)
}
