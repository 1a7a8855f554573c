//! The receive side of one TCP stream as a state machine with no I/O: bytes in,
//! progress out. No sockets, no threads, no clock. Every driver uses it: a data
//! stream's I/O thread (blocking reads, `recv.rs`) and the inline stream read by
//! NCCL's thread (non-blocking reads, `inline.rs`); tests feed it bytes directly
//! ([`StreamRx::handle_bytes`]).
//!
//! A stream carries chunks, each a [`ChunkHeader`] and `wire_len` payload bytes.
//! For each header the machine checks the header, finds the receive posted for
//! its message in the comm's [`Ring`], checks that the message fits that receive
//! and that the chunks tile the message ([`Slot::claim`]), then says where the
//! payload goes: straight into NCCL's buffer (raw chunks into host memory), into
//! its staging buffer to be decoded there (compressed chunks into host memory), or
//! into its staging buffer to be handed to the driver (device memory: the driver
//! owns the GPU lanes). Completed messages are marked in their slots.
//!
//! The driver's loop: ask [`StreamRx::want`]; on [`Want::Read`] read at most that
//! many bytes into the buffer it names and report them with
//! [`StreamRx::advance`]; on [`Want::Posted`] wait for the receive to be posted
//! (or give up for now); on [`Want::Device`] move the staged bytes to the device,
//! then [`StreamRx::device_done`]. At the end of the stream call
//! [`StreamRx::eof`], which tells a clean end (between chunks) from a cut.

use std::net::SocketAddr;

use crate::codec_glue::ChunkDecoder;
use crate::error::{Error, Result};
use crate::proto::slots::{Lookup, Ring, Slot};
use crate::proto::wire::{ChunkHeader, CHUNK_HEADER_SIZE};
use crate::stats::Stats;

/// What a stream may carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// A data stream: any chunk of any message, raw or compressed.
    Data,
    /// The inline stream: whole messages of at most the sender's chunk size, raw,
    /// each one chunk.
    Inline,
}

/// Where the payload of the current chunk goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dest {
    /// Straight into NCCL's (host) buffer at this address.
    Host(usize),
    /// A compressed frame into staging; decoded into the host buffer at this address.
    Frame(usize),
    /// Into staging, then the driver copies or decodes it into device memory.
    Device(u64),
}

/// The chunk being read.
#[derive(Clone, Copy, Debug)]
struct Cur {
    h: ChunkHeader,
    dest: Dest,
    /// Payload bytes read so far.
    got: usize,
}

/// What the stream needs from its driver next.
pub enum Want<'a> {
    /// Read up to `buf.len()` bytes (at least one) into `buf`, then
    /// [`StreamRx::advance`] by the count read.
    Read(&'a mut [u8]),
    /// A header for message `seq` arrived, whose receive is not posted yet: call
    /// `want` again once it may be (the stream must not be read meanwhile).
    Posted(u64),
    /// A chunk for device memory is staged: place it, then
    /// [`StreamRx::device_done`].
    Device(DeviceChunk<'a>),
}

/// A staged chunk whose destination is device memory.
pub struct DeviceChunk<'a> {
    pub seq: u64,
    /// The payload as it came: a codec frame when `compressed`, else the raw bytes.
    pub wire: &'a [u8],
    pub compressed: bool,
    /// Device address of the chunk's first byte, and its uncompressed length.
    pub dst: u64,
    pub raw_len: usize,
}

/// The receive posted for a message, seen by the stream: where its bytes go.
pub trait Placement {
    /// Whether the buffer posted for `seq` is device memory.
    fn is_device(&self, seq: u64) -> bool;
}

/// No posted buffer is device memory (tests, and host-only drivers).
pub struct HostOnly;

impl Placement for HostOnly {
    fn is_device(&self, _: u64) -> bool {
        false
    }
}

/// How [`StreamRx::handle_bytes`] stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fed {
    /// Every byte was taken.
    All,
    /// `used` bytes were taken; the rest waits for the receive of `seq` to be posted.
    Posted { used: usize, seq: u64 },
    /// `used` bytes were taken; a device chunk waits to be placed.
    Device { used: usize },
}

/// The receive state of one stream.
pub struct StreamRx {
    role: Role,
    peer: SocketAddr,
    /// The sender's chunk size (from its hello) and the largest compressed chunk.
    max_chunk: usize,
    max_wire: usize,
    hdr: [u8; CHUNK_HEADER_SIZE],
    hdr_got: usize,
    /// A decoded header whose receive is not posted yet.
    waiting: Option<ChunkHeader>,
    cur: Option<Cur>,
    /// Compressed frames, and chunks bound for device memory. Grows to the largest
    /// such chunk (bounded by `max_wire`); counted in [`HELD`] and the comm's stats.
    staging: super::pool::Staging,
    decoder: ChunkDecoder,
}

impl StreamRx {
    /// `max_chunk`: the sender's chunk size from its hello (it bounds an inline
    /// message and a device chunk); `peer` names the sender in errors; `format`:
    /// the codec frame format the sender agreed to write at most (its hello).
    pub fn new(role: Role, peer: SocketAddr, max_chunk: usize, format: u8) -> StreamRx {
        StreamRx {
            role,
            peer,
            max_chunk,
            max_wire: crate::codec_glue::max_wire(max_chunk),
            hdr: [0; CHUNK_HEADER_SIZE],
            hdr_got: 0,
            waiting: None,
            cur: None,
            staging: Default::default(),
            decoder: ChunkDecoder::agreed(format),
        }
    }

    /// Between chunks, with no byte of the next one read.
    pub fn at_boundary(&self) -> bool {
        self.hdr_got == 0 && self.waiting.is_none() && self.cur.is_none()
    }

    /// Bytes of staging this stream holds.
    pub fn staging_bytes(&self) -> usize {
        self.staging.len()
    }

    /// What the stream needs next. `ring` is the comm's; `place` says which posted
    /// buffers are device memory. Errors are the peer's (a corrupt stream, a
    /// message that does not fit its receive) and end the stream.
    pub fn want<'a>(
        &'a mut self,
        ring: &Ring,
        place: &dyn Placement,
        stats: &Stats,
    ) -> Result<Want<'a>> {
        if self.cur.is_none() {
            if self.waiting.is_none() {
                if self.hdr_got < CHUNK_HEADER_SIZE {
                    return Ok(Want::Read(&mut self.hdr[self.hdr_got..]));
                }
                self.hdr_got = 0;
                self.waiting = Some(self.check_header()?);
            }
            let h = self.waiting.expect("set above");
            let slot = match ring.lookup(h.seq) {
                Lookup::Ready(s) => s,
                Lookup::NotYet => return Ok(Want::Posted(h.seq)),
                Lookup::Stale => {
                    return Err(Error::Remote(match self.role {
                        Role::Data => format!(
                            "corrupt stream: chunk for message {}, which is not expected",
                            h.seq
                        ),
                        Role::Inline => format!(
                            "corrupt stream: inline message {}, which is not expected",
                            h.seq
                        ),
                    }))
                }
            };
            self.waiting = None;
            let buf = self.admit(slot, &h)?;
            let at = buf + h.offset as usize;
            let dest = if place.is_device(h.seq) {
                if h.raw_len as usize > self.max_chunk || h.wire_len as usize > self.max_wire {
                    return Err(Error::Remote(format!(
                        "corrupt stream: a {}-byte chunk ({} on the wire) is larger than the sender's chunk size {}",
                        h.raw_len, h.wire_len, self.max_chunk
                    )));
                }
                Dest::Device(at as u64)
            } else if h.compressed() {
                Dest::Frame(at)
            } else {
                Dest::Host(at)
            };
            if !matches!(dest, Dest::Host(_)) {
                self.staging.grow(h.wire_len as usize, stats);
            }
            self.cur = Some(Cur { h, dest, got: 0 });
        }
        let c = self.cur.expect("set above");
        let wire = c.h.wire_len as usize;
        if c.got < wire {
            return Ok(Want::Read(match c.dest {
                // SAFETY: the posted buffer holds cap >= total >= offset + raw_len
                // bytes (`admit`), and is ours until `test` reports the request
                // done, which is after this chunk's last byte. Chunks of one
                // message do not overlap (offsets come from one plan); a broken
                // peer's that do fail the receive before it completes (`admit`),
                // though their bytes may race into the buffer.
                Dest::Host(at) => unsafe {
                    std::slice::from_raw_parts_mut((at + c.got) as *mut u8, wire - c.got)
                },
                Dest::Frame(_) | Dest::Device(_) => &mut self.staging[c.got..wire],
            }));
        }
        match c.dest {
            Dest::Device(dst) => {
                if c.h.compressed() {
                    // The GPU lane decodes it: refuse a format not agreed first.
                    self.decoder.check(&self.staging[..wire])?;
                }
                Ok(Want::Device(DeviceChunk {
                    seq: c.h.seq,
                    wire: &self.staging[..wire],
                    compressed: c.h.compressed(),
                    dst,
                    raw_len: c.h.raw_len as usize,
                }))
            }
            // A chunk with no payload (an empty message) is complete as it is.
            _ => {
                self.complete(ring, stats)?;
                self.want(ring, place, stats)
            }
        }
    }

    /// `n` bytes were read into the buffer the last [`Want::Read`] named.
    pub fn advance(&mut self, n: usize, ring: &Ring, stats: &Stats) -> Result<()> {
        match &mut self.cur {
            None => {
                debug_assert!(self.hdr_got + n <= CHUNK_HEADER_SIZE);
                self.hdr_got += n;
                Ok(())
            }
            Some(c) => {
                c.got += n;
                debug_assert!(c.got <= c.h.wire_len as usize);
                if c.got == c.h.wire_len as usize && !matches!(c.dest, Dest::Device(_)) {
                    self.complete(ring, stats)?;
                }
                Ok(())
            }
        }
    }

    /// The driver placed the staged device chunk ([`Want::Device`]).
    pub fn device_done(&mut self, ring: &Ring, stats: &Stats) -> Result<()> {
        self.complete(ring, stats)
    }

    /// The stream ended. `Ok(())` if it ended cleanly between chunks (the peer
    /// closed), an error if it was cut in the middle of one.
    pub fn eof(&self) -> Result<()> {
        if self.at_boundary() {
            Ok(())
        } else {
            Err(Error::io(
                format!("receive from {} ({})", self.peer, self.name()),
                std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "peer closed the connection mid-message",
                ),
            ))
        }
    }

    fn name(&self) -> &'static str {
        match self.role {
            Role::Data => "data stream",
            Role::Inline => "inline stream",
        }
    }

    /// Feeds `data` (bytes as they came off the wire) through [`StreamRx::want`] and
    /// [`StreamRx::advance`], copying each piece where it goes, until every byte
    /// is taken or the stream must wait.
    pub fn handle_bytes(
        &mut self,
        mut data: &[u8],
        ring: &Ring,
        place: &dyn Placement,
        stats: &Stats,
    ) -> Result<Fed> {
        let total = data.len();
        loop {
            let n = match self.want(ring, place, stats)? {
                Want::Posted(seq) => {
                    return Ok(Fed::Posted {
                        used: total - data.len(),
                        seq,
                    })
                }
                Want::Device(_) => {
                    return Ok(Fed::Device {
                        used: total - data.len(),
                    })
                }
                Want::Read(_) if data.is_empty() => return Ok(Fed::All),
                Want::Read(buf) => {
                    let n = buf.len().min(data.len());
                    buf[..n].copy_from_slice(&data[..n]);
                    n
                }
            };
            data = &data[n..];
            self.advance(n, ring, stats)?;
        }
    }

    /// Decodes and checks the header just read.
    fn check_header(&self) -> Result<ChunkHeader> {
        let h = ChunkHeader::decode(&self.hdr, self.max_wire)?;
        if self.role == Role::Inline {
            if h.compressed() || h.offset != 0 || h.raw_len != h.total {
                return Err(Error::Remote(format!(
                    "corrupt stream: inline message {h:?} is not one raw chunk"
                )));
            }
            if h.raw_len as usize > self.max_chunk {
                return Err(Error::Remote(format!(
                    "corrupt stream: inline message of {} bytes, larger than the sender's chunk size {}",
                    h.raw_len, self.max_chunk
                )));
            }
        }
        Ok(h)
    }

    /// Checks that the message of chunk `h` fits the receive posted for it,
    /// records its size, admits the chunk (the chunks must tile the message:
    /// [`Slot::claim`]), and returns that receive's buffer address.
    fn admit(&self, slot: &Slot, h: &ChunkHeader) -> Result<usize> {
        let (buf, cap) = slot.recv_buffer();
        if h.total as usize > cap {
            return Err(Error::InvalidUsage(format!(
                "message {} from {} is {} bytes but the posted receive holds only {cap} bytes",
                h.seq, self.peer, h.total
            )));
        }
        slot.learn_size(h.total as usize)?;
        slot.claim(h.offset as usize, h.raw_len as usize)?;
        Ok(buf)
    }

    /// The current chunk's payload is all in: decode it if it is a frame, count
    /// it, and mark its bytes placed.
    fn complete(&mut self, ring: &Ring, stats: &Stats) -> Result<()> {
        let c = self.cur.take().expect("a chunk is being read");
        let h = c.h;
        if let Dest::Frame(at) = c.dest {
            let raw = h.raw_len as usize;
            // SAFETY: as for `Dest::Host` in `want`.
            let dst: &mut [u8] = if raw == 0 {
                &mut []
            } else {
                unsafe { std::slice::from_raw_parts_mut(at as *mut u8, raw) }
            };
            self.decoder
                .decode(&self.staging[..h.wire_len as usize], dst, stats)?;
        }
        let s = stats;
        s.add(
            if h.compressed() {
                &s.chunks_compressed
            } else {
                &s.chunks_raw
            },
            1,
        );
        if self.role == Role::Inline {
            s.add(&s.chunks_inline, 1);
        }
        s.add(&s.wire_bytes, h.wire_len as u64);
        s.add(&s.raw_bytes, h.raw_len as u64);
        // What this process received, for the adaptive policy (src/adapt.rs): a
        // peer's decode cost shows up in the sender's epoch figures.
        crate::adapt::RECEIVED.add(h.raw_len as u64);
        if ring.slot(h.seq).bytes_placed(h.raw_len as usize) {
            s.add(&s.messages, 1);
        }
        Ok(())
    }

    /// Between chunks, while its comm is idle: gives the staging buffer to the
    /// process's free list and drops the decode tables, so that a lightly used
    /// comm holds neither between messages. No-op inside a chunk.
    pub fn release_idle(&mut self, stats: &Stats) {
        if !self.at_boundary() {
            return;
        }
        self.staging.release(stats);
        self.decoder = ChunkDecoder::agreed(self.decoder.format());
    }

    /// Gives the staging buffer back (uncounted from `stats` and [`HELD`]).
    pub fn release(&mut self, stats: &Stats) {
        self.staging.release(stats);
    }
}

/// The verdict when stream `who` of a receiver ended cleanly: every stream has
/// ended (the peer closed), or a pending receive can no longer complete because
/// the streams left all hold later messages. `None`: the comm goes on.
pub fn stream_ended(ring: &Ring, who: usize, peer: SocketAddr) -> Option<Error> {
    let (all, stalled) = ring.producer_ended(who);
    if all {
        Some(Error::Remote(format!("{peer} closed the connection")))
    } else {
        stalled.map(|seq| stalled_error(seq, peer))
    }
}

/// The error of a receive, for message `seq`, that can no longer complete: the
/// streams that have not ended all hold a later message, not posted yet.
pub fn stalled_error(seq: u64, peer: SocketAddr) -> Error {
    Error::Remote(format!(
        "{peer} closed the connection before sending all of message {seq} (a later message already arrived)"
    ))
}
