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
//! receiver matches them to posted receives by sequence number as usual. Both
//! directions run the streams' sans-IO machines: [`StreamTx`] and the receive
//! side's `StreamRx` (through `recv::pump_rx`).

use std::net::SocketAddr;

use parking_lot::Mutex;
use socket2::Socket;

use super::core::{Core, RxLimits};
use super::recv::{pump_rx, RxState};
use super::sock::send_chunk_part;
use super::stream::Role;
use super::stream_tx::{ChunkOut, Payload, StreamTx, Wrote};
use crate::error::{Error, Result};

pub struct Inline {
    sock: Socket,
    /// Senders only.
    tx: Option<Mutex<StreamTx>>,
    /// Receivers only.
    rx: Option<Mutex<RxState>>,
}

impl Inline {
    /// `sock` must already carry the data-socket options; it is made non-blocking.
    /// `peer`: the other end. `rx`: receivers only, the peer's limits (its chunk
    /// size is the largest inline message).
    pub fn new(sock: Socket, peer: SocketAddr, rx: Option<RxLimits>) -> Result<Inline> {
        sock.set_nonblocking(true)
            .map_err(|e| Error::io("set_nonblocking", e))?;
        Ok(Inline {
            sock,
            tx: rx
                .is_none()
                .then(|| Mutex::new(StreamTx::new(Role::Inline, peer, 0))),
            rx: rx.map(|lim| Mutex::new(RxState::inline(peer, lim))),
        })
    }

    pub fn socket(&self) -> &Socket {
        &self.sock
    }

    /// Sender: queues message `seq` (`len` bytes at `data`, valid until its request
    /// is done) and writes as much as the socket takes now.
    pub fn send(&self, core: &Core, seq: u64, data: *const u8, len: usize) {
        let Some(tx) = &self.tx else { return };
        let pushed = tx.lock().push(ChunkOut {
            seq,
            total: len as u32,
            offset: 0,
            raw_len: len as u32,
            wire_len: len as u32,
            compressed: false,
            payload: Payload::Nccl(data as usize),
        });
        match pushed {
            Ok(()) => self.progress_tx(core),
            Err(e) => core.fail(e),
        }
    }

    /// Sender: nothing is queued (every message so far is in the socket). False
    /// while another thread is writing.
    pub fn tx_idle(&self) -> bool {
        self.tx
            .as_ref()
            .and_then(|m| m.try_lock())
            .is_some_and(|q| q.is_idle())
    }

    /// Sender: writes queued messages until the socket is full.
    pub fn progress_tx(&self, core: &Core) {
        let Some(mut tx) = self.tx.as_ref().and_then(|m| m.try_lock()) else {
            return;
        };
        while let Some(w) = tx.want() {
            let r = send_chunk_part(&self.sock, w.hdr, w.payload, w.done, false);
            match tx.wrote(r, &core.ring, &core.stats) {
                // The socket may take more, unless it just took less than offered.
                Ok(Wrote::Bytes { full: false, .. }) => {}
                Ok(Wrote::Bytes { full: true, .. } | Wrote::Blocked) => return,
                Err(e) => {
                    drop(tx);
                    core.fail(e);
                    return;
                }
            }
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
            None,
            None,
        ) {
            drop(st);
            if !core.closing() {
                core.fail(e);
            }
        }
    }
}
