//! The send side of one TCP stream as a state machine with no I/O: chunks in,
//! bytes to write out, completions marked in the comm's ring. No sockets, no
//! threads, no clock. Both drivers use it: a data stream's I/O worker
//! (`send.rs`) and the inline stream written by NCCL's thread (`inline.rs`);
//! tests feed it write results directly.
//!
//! The driver's loop: [`StreamTx::push`] chunks (a header and where its payload
//! is: NCCL's buffer, or the stream's staging); ask [`StreamTx::want`] for the
//! bytes still to write of the first chunk; write what the socket takes; report
//! the result, bytes or error, with [`StreamTx::wrote`]. A chunk whose last byte
//! is written is counted and marked sent in its request's slot (the request is
//! done when all its chunks are); a write error is the comm's error, naming the
//! stream and the message.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;

use super::pool::Staging;
use super::stream::Role;
use crate::error::{Error, Result};
use crate::proto::slots::Ring;
use crate::proto::wire::{ChunkHeader, CHUNK_HEADER_SIZE, FLAG_COMPRESSED};
use crate::stats::Stats;

/// Where a chunk's payload is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Payload {
    /// NCCL's host buffer at this address (valid until the request is done;
    /// never read when the payload is empty).
    Nccl(usize),
    /// The first `wire_len` bytes of the stream's staging (a compressed frame or
    /// a device chunk's bytes): at most one such chunk is queued at a time.
    Staged,
}

/// A chunk to send.
#[derive(Clone, Copy, Debug)]
pub struct ChunkOut {
    pub seq: u64,
    /// The message's size, this chunk's offset in it and its raw length.
    pub total: u32,
    pub offset: u32,
    pub raw_len: u32,
    /// Payload bytes on the wire (`raw_len` unless compressed).
    pub wire_len: u32,
    pub compressed: bool,
    pub payload: Payload,
}

struct Queued {
    seq: u64,
    hdr: [u8; CHUNK_HEADER_SIZE],
    payload: Payload,
    len: usize,
    compressed: bool,
    /// Bytes of header + payload written so far.
    done: usize,
}

/// The rest of the first queued chunk: write from byte `done` of `hdr` then
/// `payload` (as one sequence).
pub struct Write<'a> {
    pub hdr: &'a [u8],
    pub payload: &'a [u8],
    pub done: usize,
}

/// What a write did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wrote {
    /// This many bytes went out; `chunk_done`: the chunk's last one among them;
    /// `full`: the socket took less than it was offered, so its send buffer is
    /// full and another write now would only find that out (a system call per
    /// refill saved: where one stream's window is the limit, every refill is on
    /// the path of the window's round trip).
    Bytes {
        n: usize,
        chunk_done: bool,
        full: bool,
    },
    /// The socket took nothing now: write again when it has room.
    Blocked,
}

/// The send state of one stream.
pub struct StreamTx {
    role: Role,
    /// Names the stream in errors: the receiver and the data stream's index.
    peer: SocketAddr,
    who: usize,
    queue: VecDeque<Queued>,
    /// Compressed frames and device chunks' bytes, counted in [`crate::stats::HELD`]
    /// and the comm's stats; host frames within the process's buffer budget.
    staging: Staging,
}

impl StreamTx {
    pub fn new(role: Role, peer: SocketAddr, who: usize) -> StreamTx {
        StreamTx {
            role,
            peer,
            who,
            queue: VecDeque::new(),
            staging: Staging::default(),
        }
    }

    /// Nothing queued: every chunk pushed is written.
    pub fn is_idle(&self) -> bool {
        self.queue.is_empty()
    }

    /// Bytes queued and not yet written (headers included).
    pub fn left(&self) -> usize {
        self.queue
            .iter()
            .map(|q| CHUNK_HEADER_SIZE + q.len - q.done)
            .sum()
    }

    /// Queues chunk `c` behind the others.
    pub fn push(&mut self, c: ChunkOut) -> Result<()> {
        if c.payload == Payload::Staged {
            if self.queue.iter().any(|q| q.payload == Payload::Staged) {
                return Err(Error::Internal(
                    "two staged chunks queued on one stream".into(),
                ));
            }
            if c.wire_len as usize > self.staging.len() {
                return Err(Error::Internal(format!(
                    "a {}-byte staged chunk in {} bytes of staging",
                    c.wire_len,
                    self.staging.len()
                )));
            }
        }
        if self.role == Role::Inline && (c.compressed || c.payload == Payload::Staged) {
            return Err(Error::Internal(
                "the inline stream carries raw chunks only".into(),
            ));
        }
        let hdr = ChunkHeader {
            flags: if c.compressed { FLAG_COMPRESSED } else { 0 },
            seq: c.seq,
            total: c.total,
            offset: c.offset,
            raw_len: c.raw_len,
            wire_len: c.wire_len,
        }
        .encode();
        self.queue.push_back(Queued {
            seq: c.seq,
            hdr,
            payload: c.payload,
            len: c.wire_len as usize,
            compressed: c.compressed,
            done: 0,
        });
        Ok(())
    }

    /// The bytes to write next; `None` when nothing is queued.
    pub fn want(&self) -> Option<Write<'_>> {
        let q = self.queue.front()?;
        let payload: &[u8] = match q.payload {
            _ if q.len == 0 => &[], // the buffer may be NULL
            Payload::Staged => &self.staging[..q.len],
            // SAFETY: NCCL keeps the send buffer alive and unchanged until `test`
            // reports the request done, which is only after the chunk's last
            // byte is written (`wrote`).
            Payload::Nccl(p) => unsafe { std::slice::from_raw_parts(p as *const u8, q.len) },
        };
        Some(Write {
            hdr: &q.hdr,
            payload,
            done: q.done,
        })
    }

    /// The result of writing what [`StreamTx::want`] gave. A chunk whose last
    /// byte went out is counted in `stats` and marked sent in `ring`. An error
    /// (a write that took nothing while bytes remained included) is the comm's.
    pub fn wrote(&mut self, r: io::Result<usize>, ring: &Ring, stats: &Stats) -> Result<Wrote> {
        let Some(q) = self.queue.front_mut() else {
            return Err(Error::Internal("a write with nothing queued".into()));
        };
        let total = CHUNK_HEADER_SIZE + q.len;
        let e = match r {
            Ok(n) if n > 0 && q.done + n <= total => {
                let full = q.done + n < total;
                q.done += n;
                let chunk_done = q.done == total;
                if chunk_done {
                    self.sent(ring, stats);
                }
                return Ok(Wrote::Bytes {
                    n,
                    chunk_done,
                    full,
                });
            }
            Ok(0) => io::ErrorKind::WriteZero.into(),
            Ok(n) => {
                return Err(Error::Internal(format!(
                    "wrote {n} bytes with {} left",
                    total - q.done
                )))
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                return Ok(Wrote::Blocked)
            }
            Err(e) => e,
        };
        let what = match self.role {
            Role::Data => format!("stream {}", self.who),
            Role::Inline => "inline stream".into(),
        };
        Err(Error::io(
            format!("send to {} ({what}, message {})", self.peer, q.seq),
            e,
        ))
    }

    /// The first chunk is all written.
    fn sent(&mut self, ring: &Ring, stats: &Stats) {
        let q = self.queue.pop_front().expect("a chunk is queued");
        stats.add(&stats.wire_bytes, q.len as u64);
        stats.add(
            if q.compressed {
                &stats.chunks_compressed
            } else {
                &stats.chunks_raw
            },
            1,
        );
        if self.role == Role::Inline {
            stats.add(&stats.chunks_inline, 1);
        }
        ring.slot(q.seq).chunk_sent();
    }

    /// The stream's staging, to fill with the next staged chunk (or to hand to a
    /// codec worker with `std::mem::take`, and put back).
    pub fn staging(&mut self) -> &mut Staging {
        &mut self.staging
    }

    /// Gives the staging (and its budget) back. No-op while a staged chunk is
    /// queued.
    pub fn release(&mut self, stats: &Stats) {
        if self.queue.iter().all(|q| q.payload != Payload::Staged) {
            self.staging.release(stats);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::slots::Slot;

    fn peer() -> SocketAddr {
        "10.0.0.2:4242".parse().unwrap()
    }

    /// A socket in memory: takes at most `room` bytes per write, keeps them all.
    struct Wire {
        bytes: Vec<u8>,
    }

    impl Wire {
        /// Writes what `tx` wants, at most `room` bytes at once, until it is idle.
        fn drain(&mut self, tx: &mut StreamTx, room: usize, ring: &Ring, stats: &Stats) -> usize {
            let mut writes = 0;
            while let Some(w) = tx.want() {
                let all: Vec<u8> = w.hdr.iter().chain(w.payload).copied().collect();
                let part = &all[w.done..(w.done + room).min(all.len())];
                self.bytes.extend_from_slice(part);
                let n = part.len();
                tx.wrote(Ok(n), ring, stats).unwrap();
                writes += 1;
            }
            writes
        }
    }

    fn post(ring: &Ring, size: usize, nchunks: usize) -> (u64, &Slot) {
        ring.post(Some(size), nchunks, None).expect("a free slot")
    }

    fn raw(seq: u64, data: &[u8], offset: usize, len: usize, total: usize) -> ChunkOut {
        ChunkOut {
            seq,
            total: total as u32,
            offset: offset as u32,
            raw_len: len as u32,
            wire_len: len as u32,
            compressed: false,
            payload: Payload::Nccl(data.as_ptr() as usize + offset),
        }
    }

    /// Parses `bytes` as chunks: (header, payload) pairs.
    fn chunks(mut bytes: &[u8]) -> Vec<(ChunkHeader, Vec<u8>)> {
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let h = ChunkHeader::decode(bytes[..CHUNK_HEADER_SIZE].try_into().unwrap(), 1 << 30)
                .unwrap();
            let end = CHUNK_HEADER_SIZE + h.wire_len as usize;
            out.push((h, bytes[CHUNK_HEADER_SIZE..end].to_vec()));
            bytes = &bytes[end..];
        }
        out
    }

    #[test]
    fn one_byte_writes_deliver_every_chunk_whole_and_complete_the_request() {
        let (ring, stats) = (Ring::default(), Stats::default());
        let msg: Vec<u8> = (0..1001u32).map(|i| (i * 7 + 3) as u8).collect();
        let (seq, slot) = post(&ring, msg.len(), 3);
        let mut tx = StreamTx::new(Role::Data, peer(), 0);
        for (off, len) in [(0, 500), (500, 500), (1000, 1)] {
            tx.push(raw(seq, &msg, off, len, msg.len())).unwrap();
        }
        let mut wire = Wire { bytes: Vec::new() };
        // Not done until the last byte of the last chunk.
        let mut writes = 0;
        while let Some(w) = tx.want() {
            assert_eq!(slot.test().unwrap(), None, "done before its last byte");
            let all: Vec<u8> = w.hdr.iter().chain(w.payload).copied().collect();
            wire.bytes.push(all[w.done]);
            tx.wrote(Ok(1), &ring, &stats).unwrap();
            writes += 1;
        }
        assert_eq!(writes, 3 * CHUNK_HEADER_SIZE + msg.len());
        assert_eq!(slot.test().unwrap(), Some(msg.len()));
        let got = chunks(&wire.bytes);
        assert_eq!(got.len(), 3);
        let joined: Vec<u8> = got.iter().flat_map(|(_, p)| p.clone()).collect();
        assert_eq!(joined, msg);
        assert_eq!(got[2].0.offset, 1000);
        assert_eq!(
            stats.chunks_raw.load(std::sync::atomic::Ordering::Relaxed),
            3
        );
        assert!(tx.is_idle());
    }

    #[test]
    fn zero_byte_messages_are_a_header_each_and_read_no_buffer() {
        let (ring, stats) = (Ring::default(), Stats::default());
        let mut tx = StreamTx::new(Role::Inline, peer(), 0);
        let mut slots = Vec::new();
        for _ in 0..3 {
            let (seq, slot) = post(&ring, 0, 1);
            // A NULL buffer: must never be read.
            tx.push(ChunkOut {
                seq,
                total: 0,
                offset: 0,
                raw_len: 0,
                wire_len: 0,
                compressed: false,
                payload: Payload::Nccl(0),
            })
            .unwrap();
            slots.push(slot);
        }
        let mut wire = Wire { bytes: Vec::new() };
        wire.drain(&mut tx, 7, &ring, &stats);
        assert_eq!(wire.bytes.len(), 3 * CHUNK_HEADER_SIZE);
        for s in slots {
            assert_eq!(s.test().unwrap(), Some(0));
        }
        assert_eq!(
            stats
                .chunks_inline
                .load(std::sync::atomic::Ordering::Relaxed),
            3
        );
    }

    #[test]
    fn an_error_mid_chunk_names_the_stream_and_leaves_the_request_pending() {
        let (ring, stats) = (Ring::default(), Stats::default());
        let msg = vec![5u8; 300];
        let (seq, slot) = post(&ring, msg.len(), 1);
        let mut tx = StreamTx::new(Role::Data, peer(), 3);
        tx.push(raw(seq, &msg, 0, 300, 300)).unwrap();
        assert_eq!(
            tx.wrote(Ok(40), &ring, &stats).unwrap(),
            Wrote::Bytes {
                n: 40,
                chunk_done: false,
                full: true
            }
        );
        let blocked = io::Error::from(io::ErrorKind::WouldBlock);
        assert_eq!(
            tx.wrote(Err(blocked), &ring, &stats).unwrap(),
            Wrote::Blocked
        );
        assert_eq!(
            tx.want().unwrap().done,
            40,
            "a blocked write moved the chunk"
        );
        let e = tx
            .wrote(
                Err(io::Error::from(io::ErrorKind::ConnectionReset)),
                &ring,
                &stats,
            )
            .unwrap_err();
        let s = e.to_string();
        assert!(s.contains("stream 3") && s.contains("message 0"), "{s}");
        // A write that takes nothing while bytes remain is an error, not a spin.
        let e = tx.wrote(Ok(0), &ring, &stats).unwrap_err();
        assert!(e.to_string().contains("stream 3"), "{e}");
        assert_eq!(slot.test().unwrap(), None);
        assert_eq!(
            stats.wire_bytes.load(std::sync::atomic::Ordering::Relaxed),
            0
        );
    }

    #[test]
    fn many_chunks_of_many_messages_in_order_with_a_staged_frame() {
        let (ring, stats) = (Ring::default(), Stats::default());
        let mut tx = StreamTx::new(Role::Data, peer(), 0);
        let msgs: Vec<Vec<u8>> = (0..6)
            .map(|i| (0..(i * 997 + 1)).map(|j| (i + j) as u8).collect())
            .collect();
        let mut slots = Vec::new();
        let mut wire = Wire { bytes: Vec::new() };
        for (i, m) in msgs.iter().enumerate() {
            let chunk = 1000;
            let n = m.len().div_ceil(chunk).max(1);
            let (seq, slot) = post(&ring, m.len(), n);
            slots.push(slot);
            for k in 0..n {
                let off = k * chunk;
                let len = chunk.min(m.len() - off);
                if i == 2 && k == 0 {
                    // A "frame" in the staging: its bytes, not NCCL's, go out.
                    tx.staging().grow(len, &stats);
                    tx.staging()[..len].fill(0xAB);
                    tx.push(ChunkOut {
                        compressed: true,
                        payload: Payload::Staged,
                        ..raw(seq, m, off, len, m.len())
                    })
                    .unwrap();
                    let again = ChunkOut {
                        payload: Payload::Staged,
                        ..raw(seq, m, off, len, m.len())
                    };
                    assert!(tx.push(again).is_err(), "two staged chunks");
                    wire.drain(&mut tx, 13, &ring, &stats);
                    tx.release(&stats);
                } else {
                    tx.push(raw(seq, m, off, len, m.len())).unwrap();
                }
            }
        }
        wire.drain(&mut tx, 4096, &ring, &stats);
        for (s, m) in slots.iter().zip(&msgs) {
            assert_eq!(s.test().unwrap(), Some(m.len()));
        }
        let got = chunks(&wire.bytes);
        for (h, p) in &got {
            let m = &msgs[h.seq as usize];
            let (o, l) = (h.offset as usize, h.raw_len as usize);
            if h.compressed() {
                assert!(p.iter().all(|&b| b == 0xAB));
            } else {
                assert_eq!(&p[..], &m[o..o + l], "message {} at {o}", h.seq);
            }
        }
        assert_eq!(
            stats
                .chunks_compressed
                .load(std::sync::atomic::Ordering::Relaxed),
            1
        );
        assert_eq!(
            stats
                .staging_bytes
                .load(std::sync::atomic::Ordering::Relaxed),
            0
        );
    }
}
