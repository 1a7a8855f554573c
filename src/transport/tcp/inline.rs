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
use std::net::SocketAddr;

use parking_lot::Mutex;
use socket2::Socket;

use super::core::{Core, RxLimits};
use super::recv::{pump_rx, would_block, RxState};
use super::sock::send_chunk_part;
use crate::error::{Error, Result};
use crate::proto::slots::NSLOTS;
use crate::proto::wire::{ChunkHeader, CHUNK_HEADER_SIZE};

/// A message on its way out: header, then `len` bytes of NCCL's buffer at `data`.
struct Out {
    seq: u64,
    hdr: [u8; CHUNK_HEADER_SIZE],
    data: usize,
    len: usize,
    /// Bytes of header + payload written so far.
    done: usize,
}

pub struct Inline {
    sock: Socket,
    tx: Mutex<VecDeque<Out>>,
    /// Receivers only.
    rx: Option<Mutex<RxState>>,
}

impl Inline {
    /// `sock` must already carry the data-socket options; it is made non-blocking.
    /// `rx`: receivers only, the peer and its chunk size (the largest inline message).
    pub fn new(sock: Socket, rx: Option<(SocketAddr, usize, u8)>) -> Result<Inline> {
        sock.set_nonblocking(true)
            .map_err(|e| Error::io("set_nonblocking", e))?;
        Ok(Inline {
            sock,
            tx: Mutex::new(VecDeque::with_capacity(NSLOTS)),
            rx: rx.map(|(peer, max_chunk, format)| {
                Mutex::new(RxState::inline(peer, max_chunk, format))
            }),
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
            match send_chunk_part(&self.sock, &o.hdr, payload, o.done) {
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
    /// buffer. Never blocks, never waits for a lane.
    pub fn progress_rx(&self, core: &Core, lim: RxLimits) {
        let Some(mut st) = self.rx.as_ref().and_then(|m| m.try_lock()) else {
            return;
        };
        if core.inline_ended() || core.stopped() {
            return;
        }
        if let Err(e) = pump_rx(
            &self.sock,
            core,
            core.inline_producer(),
            &mut st,
            lim,
            usize::MAX,
        ) {
            drop(st);
            if !core.closing() {
                core.fail(e);
            }
        }
    }
}
