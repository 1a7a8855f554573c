//! The receive side of one TCP stream as a state machine with no I/O: bytes in,
//! progress out. No sockets, no threads, no clock. Every driver uses it: a data
//! stream's I/O worker (non-blocking reads, `recv.rs`) and the inline stream
//! read by NCCL's thread (non-blocking reads, `inline.rs`); tests feed it bytes
//! directly ([`StreamRx::handle_bytes`]). The send side's machine is
//! `stream_tx.rs`.
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
//! then [`StreamRx::device_done`]; on [`Want::Decode`] take the frame
//! ([`StreamRx::take_frame`]), decode it anywhere (a codec worker), and hand it
//! back ([`StreamRx::frame_done`]), or do all three here
//! ([`StreamRx::decode_here`]); on [`Want::Budget`] try again later. At the end
//! of the stream call [`StreamRx::eof`], which tells a clean end (between
//! chunks) from a cut.
//!
//! Staging comes from the process's buffer budget ([`crate::budget`]) and is
//! held for one chunk: taken when its header is read, given back once its bytes
//! are placed. When the budget is spent the stream stops before the chunk's
//! payload ([`Want::Budget`]): its own socket applies backpressure to its own
//! sender; no other stream or comm waits, and no byte is lost.

use std::net::SocketAddr;

use super::pool::Staging;
use crate::codec_glue::{check_format, ChunkDecoder};
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
    /// The staging for the payload is held (dests other than `Host`).
    staged: bool,
    /// The frame is out being decoded ([`StreamRx::take_frame`]).
    decoding: bool,
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
    /// A compressed frame is in: decode it ([`StreamRx::take_frame`] and
    /// [`StreamRx::frame_done`], or [`StreamRx::decode_here`]).
    Decode,
    /// The frame taken by [`StreamRx::take_frame`] is not back yet.
    Decoding,
    /// The process's buffer budget has no room for this chunk's staging now: try
    /// again later (without reading the stream meanwhile).
    Budget,
}

/// A compressed frame taken out of a stream to be decoded elsewhere (a codec
/// worker): the stream's staging with the frame, and where it decodes to. Or a
/// staged device chunk ([`StreamRx::take_device`]), compressed or not, to be
/// placed in device memory elsewhere.
pub struct Frame {
    staging: Staging,
    wire_len: usize,
    /// The codec frame format the sender agreed to write at most.
    format: u8,
    /// NCCL's host buffer (a device address for a device chunk) at the chunk's
    /// first byte, and the chunk's raw length.
    dst: usize,
    raw_len: usize,
    /// A device chunk: whether its payload is a codec frame.
    device: Option<bool>,
}

impl Frame {
    /// A device chunk's view for its placement: `None` for a host frame.
    pub fn device_chunk(&self, seq: u64) -> Option<DeviceChunk<'_>> {
        Some(DeviceChunk {
            seq,
            wire: &self.staging[..self.wire_len],
            compressed: self.device?,
            dst: self.dst as u64,
            raw_len: self.raw_len,
        })
    }

    /// Decodes the frame into NCCL's buffer with `dec` (a decoder of any format:
    /// the frame is checked against its connection's agreement first).
    pub fn decode(&self, dec: &mut ChunkDecoder, stats: &Stats) -> Result<()> {
        let frame = &self.staging[..self.wire_len];
        check_format(frame, self.format)?;
        // SAFETY: the posted buffer holds the chunk (`StreamRx::admit`) and is ours
        // until `test` reports the request done, which is after `frame_done`; a
        // comm that closes first waits for its codec jobs (`CommQueue::close`).
        let dst: &mut [u8] = if self.raw_len == 0 {
            &mut []
        } else {
            unsafe { std::slice::from_raw_parts_mut(self.dst as *mut u8, self.raw_len) }
        };
        dec.decode(frame, dst, stats)
    }
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
    /// `used` bytes were taken; the next chunk waits for room in the buffer budget.
    Budget { used: usize },
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
    /// Compressed frames, and chunks bound for device memory: one chunk's
    /// (bounded by `max_wire`), from the buffer budget, held for that chunk only;
    /// counted in [`HELD`] and the comm's stats.
    staging: Staging,
    /// The process's buffer budget in bytes ([`crate::budget`]).
    buffer_cap: u64,
    /// The codec frame format the sender agreed to write at most (its hello).
    format: u8,
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
            buffer_cap: u64::MAX,
            format,
        }
    }

    /// Takes staging within a buffer budget of `cap` bytes (default: no limit).
    pub fn with_budget(mut self, cap: u64) -> StreamRx {
        self.buffer_cap = cap;
        self
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
            self.cur = Some(Cur {
                h,
                dest,
                got: 0,
                staged: matches!(dest, Dest::Host(_)) || h.wire_len == 0,
                decoding: false,
            });
        }
        let c = self.cur.as_mut().expect("set above");
        let wire = c.h.wire_len as usize;
        if c.decoding {
            return Ok(Want::Decoding);
        }
        if !c.staged {
            // Refused: wait, if the receivers' reserve can hold the chunk (it
            // then comes back in the end); a larger chunk takes its staging
            // outside the budget (`budget::receiver_reserve`).
            if !self.staging.try_grow(wire, stats, self.buffer_cap) {
                if wire as u64 <= crate::budget::receiver_reserve(self.buffer_cap) {
                    return Ok(Want::Budget);
                }
                self.staging.grow(wire, stats);
            }
            c.staged = true;
        }
        let c = *c;
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
                    check_format(&self.staging[..wire], self.format)?;
                }
                Ok(Want::Device(DeviceChunk {
                    seq: c.h.seq,
                    wire: &self.staging[..wire],
                    compressed: c.h.compressed(),
                    dst,
                    raw_len: c.h.raw_len as usize,
                }))
            }
            Dest::Frame(_) => Ok(Want::Decode),
            // A chunk with no payload (an empty message) is complete as it is.
            Dest::Host(_) => {
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
                if c.got == c.h.wire_len as usize && matches!(c.dest, Dest::Host(_)) {
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

    /// Takes the frame [`Want::Decode`] announced, to be decoded elsewhere; the
    /// stream says [`Want::Decoding`] until [`StreamRx::frame_done`].
    pub fn take_frame(&mut self) -> Result<Frame> {
        self.take(false)
    }

    /// Takes the device chunk [`Want::Device`] announced (its format already
    /// checked), to be placed elsewhere; the stream says [`Want::Decoding`] until
    /// [`StreamRx::frame_done`].
    pub fn take_device(&mut self) -> Result<Frame> {
        self.take(true)
    }

    fn take(&mut self, device: bool) -> Result<Frame> {
        let what = if device { "device chunk" } else { "frame" };
        let c = match &mut self.cur {
            Some(c) if !c.decoding && c.got == c.h.wire_len as usize => c,
            _ => return Err(Error::Internal(format!("no {what} to take"))),
        };
        let dst = match (c.dest, device) {
            (Dest::Frame(dst), false) => dst,
            (Dest::Device(dst), true) => dst as usize,
            _ => return Err(Error::Internal(format!("no {what} to take"))),
        };
        c.decoding = true;
        Ok(Frame {
            staging: std::mem::take(&mut self.staging),
            wire_len: c.h.wire_len as usize,
            format: self.format,
            dst,
            raw_len: c.h.raw_len as usize,
            device: device.then(|| c.h.compressed()),
        })
    }

    /// The frame taken by [`StreamRx::take_frame`] is back, decoded (`decoded`:
    /// how that went; a corrupt frame ends the stream).
    pub fn frame_done(
        &mut self,
        frame: Frame,
        decoded: Result<()>,
        ring: &Ring,
        stats: &Stats,
    ) -> Result<()> {
        match &mut self.cur {
            Some(c) if c.decoding => c.decoding = false,
            _ => return Err(Error::Internal("no frame out".into())),
        }
        self.staging = frame.staging;
        decoded?;
        self.complete(ring, stats)
    }

    /// [`StreamRx::take_frame`], decode on this thread, [`StreamRx::frame_done`].
    /// (Drivers without codec workers: tests. The decode tables are made for
    /// this frame alone.)
    pub fn decode_here(&mut self, ring: &Ring, stats: &Stats) -> Result<()> {
        let frame = self.take_frame()?;
        let r = frame.decode(&mut ChunkDecoder::agreed(u8::MAX), stats);
        self.frame_done(frame, r, ring, stats)
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
                Want::Budget => {
                    return Ok(Fed::Budget {
                        used: total - data.len(),
                    })
                }
                Want::Decode => {
                    self.decode_here(ring, stats)?;
                    continue;
                }
                Want::Decoding => return Err(Error::Internal("a frame is out".into())),
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

    /// The current chunk's payload is all placed (a frame decoded): give its
    /// staging back, count it, and mark its bytes placed.
    fn complete(&mut self, ring: &Ring, stats: &Stats) -> Result<()> {
        let c = self.cur.take().expect("a chunk is being read");
        let h = c.h;
        self.staging.release(stats);
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

    /// Gives the staging buffer back (uncounted from `stats` and `HELD`).
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
