//! Byte layouts that cross the wire or NCCL's handle exchange. All little-endian,
//! encoded field by field (no struct casts: NCCL's handle buffer has no alignment
//! guarantee). Documented in docs/PROTOCOL.md.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::error::{Error, Result};

pub const HANDLE_SIZE: usize = 128;
const _: () = assert!(HANDLE_SIZE <= crate::ffi::abi::NCCL_NET_HANDLE_MAXSIZE as usize);

/// Which transport a handle belongs to: its magic and protocol version. Every
/// transport's handle has the same layout (address, secret, connect stage).
pub struct HandleKind {
    pub magic: u32,
    pub version: u16,
    pub name: &'static str,
}

pub const TCP_HANDLE: HandleKind = HandleKind {
    magic: u32::from_le_bytes(*b"NZH1"),
    version: PROTOCOL_VERSION,
    name: "TCP",
};
/// Offset of the connect-stage area NCCL hands back to us on every connect retry.
pub const STAGE_OFFSET: usize = 64;
const STAGE_MAGIC: u64 = u64::from_le_bytes(*b"NZSTAGE1");

/// What a listener publishes: where to connect, the secret to present, and the
/// highest codec frame format its receive comms decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handle {
    pub addr: SocketAddr,
    pub secret: u64,
    /// The highest frame format the listener decodes (bytes 10..12; 0, which a
    /// listener before this field wrote, reads as `codec_glue::BASE_FORMAT`).
    pub decodes: u8,
}

impl Handle {
    /// Writes a TCP handle and zeroes the connect-stage area.
    pub fn encode(&self, out: &mut [u8; HANDLE_SIZE]) {
        self.encode_as(&TCP_HANDLE, out)
    }

    pub fn decode(b: &[u8; HANDLE_SIZE]) -> Result<Handle> {
        Self::decode_as(b, &TCP_HANDLE)
    }

    /// Writes the handle of transport `kind` and zeroes the connect-stage area.
    pub fn encode_as(&self, kind: &HandleKind, out: &mut [u8; HANDLE_SIZE]) {
        out.fill(0);
        out[0..4].copy_from_slice(&kind.magic.to_le_bytes());
        out[4..6].copy_from_slice(&kind.version.to_le_bytes());
        let (fam, ip): (u16, [u8; 16]) = match self.addr.ip() {
            IpAddr::V4(a) => (4, a.to_ipv6_mapped().octets()),
            IpAddr::V6(a) => (6, a.octets()),
        };
        out[6..8].copy_from_slice(&fam.to_le_bytes());
        out[8..10].copy_from_slice(&self.addr.port().to_le_bytes());
        out[10..12].copy_from_slice(&(self.decodes as u16).to_le_bytes());
        out[16..32].copy_from_slice(&ip);
        out[32..40].copy_from_slice(&self.secret.to_le_bytes());
    }

    pub fn decode_as(b: &[u8; HANDLE_SIZE], kind: &HandleKind) -> Result<Handle> {
        let magic = u32::from_le_bytes(b[0..4].try_into().unwrap());
        let version = u16::from_le_bytes(b[4..6].try_into().unwrap());
        if magic != kind.magic {
            return Err(Error::InvalidArgument(format!(
                "connect handle is not an nccl-net-zip {} handle (do all ranks use the same NCCL_ZIP_TRANSPORT?)",
                kind.name
            )));
        }
        if version != kind.version {
            return Err(Error::InvalidUsage(format!(
                "peer runs nccl-net-zip {} protocol v{version}, we run v{}: install the same plugin on every node",
                kind.name, kind.version
            )));
        }
        let fam = u16::from_le_bytes(b[6..8].try_into().unwrap());
        let port = u16::from_le_bytes(b[8..10].try_into().unwrap());
        let ip6 = Ipv6Addr::from(<[u8; 16]>::try_from(&b[16..32]).unwrap());
        let ip = match fam {
            4 => IpAddr::V4(ip6.to_ipv4_mapped().unwrap_or(Ipv4Addr::UNSPECIFIED)),
            6 => IpAddr::V6(ip6),
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "connect handle has unknown address family {fam}"
                )))
            }
        };
        let secret = u64::from_le_bytes(b[32..40].try_into().unwrap());
        let decodes = match u16::from_le_bytes(b[10..12].try_into().unwrap()) {
            0 => crate::codec_glue::BASE_FORMAT,
            f => u8::try_from(f).unwrap_or(u8::MAX),
        };
        Ok(Handle {
            addr: SocketAddr::new(ip, port),
            secret,
            decodes,
        })
    }
}

/// The connect stage NCCL keeps for us inside its copy of the handle: a pointer to
/// our in-progress connect state, tagged so a fresh handle reads as "no stage".
pub fn stage_get(b: &[u8; HANDLE_SIZE]) -> Option<usize> {
    let tag = u64::from_le_bytes(b[STAGE_OFFSET..STAGE_OFFSET + 8].try_into().unwrap());
    let ptr = u64::from_le_bytes(b[STAGE_OFFSET + 8..STAGE_OFFSET + 16].try_into().unwrap());
    (tag == STAGE_MAGIC && ptr != 0).then_some(ptr as usize)
}

pub fn stage_set(b: &mut [u8; HANDLE_SIZE], ptr: Option<usize>) {
    let (tag, p) = match ptr {
        Some(p) => (STAGE_MAGIC, p as u64),
        None => (0, 0),
    };
    b[STAGE_OFFSET..STAGE_OFFSET + 8].copy_from_slice(&tag.to_le_bytes());
    b[STAGE_OFFSET + 8..STAGE_OFFSET + 16].copy_from_slice(&p.to_le_bytes());
}

/// v2: a TCP connection has one more stream than its data streams, the last one:
/// the inline stream (`transport::tcp::inline`). v3: the hello states its own
/// length and carries the plugin version and the codec format version. v4: only
/// the inline stream is opened by `connect`; the sender opens data streams on
/// demand, to one listener per address shared by every comm of the process, and
/// writes on one only after the receiver's one-byte acknowledgement (same hello
/// layout as v3).
pub const PROTOCOL_VERSION: u16 = 4;

/// First bytes on every stream of a connection: proves the connector read our
/// handle (secret) and says which connection and stream this socket belongs to.
///
/// Extensible: bytes 0..32 keep their meaning in every version (magic, protocol
/// version, and the secret at 16..24), so a listener can tell a peer of another
/// version from a stranger and name both versions; from v3, bytes 10..12 give
/// the hello's length, so a later version can append fields that this one skips.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    pub secret: u64,
    /// Random per connect call; groups the streams of one comm at the listener.
    pub conn_id: u64,
    pub stream: u16,
    pub nstreams: u16,
    /// The connector's largest chunk: the receiver sizes its staging buffers from it.
    pub max_chunk: u32,
}

/// What a v3 hello says about the connector beyond [`Hello`] (ours when encoding).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerInfo {
    /// The highest codec frame format the connector writes on this connection
    /// (docs/FORMAT.md): the one it agreed on from the listener's handle.
    pub format: u16,
    /// The connector's plugin version, major.minor.patch.
    pub plugin: (u8, u8, u16),
}

impl PeerInfo {
    pub fn ours() -> PeerInfo {
        let v = |i: usize| -> u64 {
            env!("CARGO_PKG_VERSION")
                .split('.')
                .nth(i)
                .and_then(|x| x.parse().ok())
                .unwrap_or(0)
        };
        PeerInfo {
            format: nccl_zip_codec::format::VERSION as u16,
            plugin: (v(0) as u8, v(1) as u8, v(2) as u16),
        }
    }
}

impl std::fmt::Display for PeerInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (a, b, c) = self.plugin;
        write!(f, "plugin {a}.{b}.{c}, codec format v{}", self.format)
    }
}

/// The v3 hello's length; a later version's may be longer (up to [`HELLO_MAX`]).
pub const HELLO_SIZE: usize = 48;
/// Bytes that say a hello's length (and version).
pub const HELLO_PREFIX: usize = 12;
/// The longest hello a listener reads.
pub const HELLO_MAX: usize = 256;
/// The hello of protocol versions 1 and 2 (no length field).
const HELLO_V2_SIZE: usize = 32;
const HELLO_MAGIC: u32 = u32::from_le_bytes(*b"NZHI");

/// How a TCP hello says its length, for `proto::bootstrap`: its
/// [`HELLO_PREFIX`] bytes give it ([`Hello::length`]).
pub struct HelloFraming;

impl super::bootstrap::Framing for HelloFraming {
    fn prefix_len(&self) -> usize {
        HELLO_PREFIX
    }

    fn total_len(&self, prefix: &[u8]) -> Result<usize> {
        Hello::length(
            prefix
                .try_into()
                .map_err(|_| Error::Internal("hello prefix".into()))?,
        )
    }
}

impl Hello {
    /// Our hello: v3, with our plugin and format versions.
    pub fn encode(&self) -> [u8; HELLO_SIZE] {
        self.encode_with(PeerInfo::ours())
    }

    pub fn encode_with(&self, info: PeerInfo) -> [u8; HELLO_SIZE] {
        let mut b = [0u8; HELLO_SIZE];
        b[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
        b[6..8].copy_from_slice(&self.stream.to_le_bytes());
        b[8..10].copy_from_slice(&self.nstreams.to_le_bytes());
        b[10..12].copy_from_slice(&(HELLO_SIZE as u16).to_le_bytes());
        b[12..16].copy_from_slice(&self.max_chunk.to_le_bytes());
        b[16..24].copy_from_slice(&self.secret.to_le_bytes());
        b[24..32].copy_from_slice(&self.conn_id.to_le_bytes());
        b[32..34].copy_from_slice(&info.format.to_le_bytes());
        b[36] = info.plugin.0;
        b[37] = info.plugin.1;
        b[38..40].copy_from_slice(&info.plugin.2.to_le_bytes());
        b
    }

    /// The whole length of a hello whose first [`HELLO_PREFIX`] bytes are
    /// `prefix`: 32 for versions 1–2, else its length field (refused outside
    /// `HELLO_SIZE..=HELLO_MAX`).
    pub fn length(prefix: &[u8; HELLO_PREFIX]) -> Result<usize> {
        let magic = u32::from_le_bytes(prefix[0..4].try_into().unwrap());
        if magic != HELLO_MAGIC {
            return Err(Error::Remote(
                "not an nccl-net-zip hello (bad magic)".into(),
            ));
        }
        let version = u16::from_le_bytes(prefix[4..6].try_into().unwrap());
        if version < 3 {
            return Ok(HELLO_V2_SIZE);
        }
        let n = u16::from_le_bytes(prefix[10..12].try_into().unwrap()) as usize;
        if !(HELLO_SIZE..=HELLO_MAX).contains(&n) {
            return Err(Error::Remote(format!("hello of {n} bytes")));
        }
        Ok(n)
    }

    /// Validates everything a stranger could get wrong; `secret` is the
    /// listener's. `b` is the whole hello ([`Hello::length`] bytes). A peer that
    /// knows the secret but speaks another protocol version is an
    /// `InvalidUsage` naming both versions.
    pub fn decode(b: &[u8], secret: u64) -> Result<Hello> {
        Self::decode_info(b, secret).map(|(h, _)| h)
    }

    /// [`Hello::decode`], with what the peer says about itself.
    pub fn decode_info(b: &[u8], secret: u64) -> Result<(Hello, PeerInfo)> {
        if b.len() < HELLO_V2_SIZE {
            return Err(Error::Remote(format!("hello of {} bytes", b.len())));
        }
        let prefix: &[u8; HELLO_PREFIX] = b[..HELLO_PREFIX].try_into().unwrap();
        let len = Self::length(prefix)?;
        if len != b.len() {
            return Err(Error::Remote(format!(
                "hello of {} bytes, it says {len}",
                b.len()
            )));
        }
        let h = Hello {
            stream: u16::from_le_bytes(b[6..8].try_into().unwrap()),
            nstreams: u16::from_le_bytes(b[8..10].try_into().unwrap()),
            max_chunk: u32::from_le_bytes(b[12..16].try_into().unwrap()),
            secret: u64::from_le_bytes(b[16..24].try_into().unwrap()),
            conn_id: u64::from_le_bytes(b[24..32].try_into().unwrap()),
        };
        if h.secret != secret {
            return Err(Error::Remote("hello with the wrong secret".into()));
        }
        let version = u16::from_le_bytes(b[4..6].try_into().unwrap());
        if version != PROTOCOL_VERSION {
            return Err(Error::InvalidUsage(format!(
                "the peer speaks nccl-net-zip TCP protocol v{version}, we speak v{PROTOCOL_VERSION}: install the same plugin on every node"
            )));
        }
        let info = PeerInfo {
            format: u16::from_le_bytes(b[32..34].try_into().unwrap()),
            plugin: (
                b[36],
                b[37],
                u16::from_le_bytes(b[38..40].try_into().unwrap()),
            ),
        };
        if h.nstreams < 2
            || h.nstreams as usize > crate::config::MAX_STREAMS + 1
            || h.stream >= h.nstreams
        {
            return Err(Error::Remote(format!(
                "hello with stream {} of {}",
                h.stream, h.nstreams
            )));
        }
        if !(512..=crate::config::MAX_CHUNK_LIMIT as u32).contains(&h.max_chunk) {
            return Err(Error::Remote(format!(
                "hello with chunk size {}",
                h.max_chunk
            )));
        }
        if info.format == 0 {
            return Err(Error::Remote("hello with codec format v0".into()));
        }
        Ok((h, info))
    }
}

/// Precedes every piece of a message on a data stream. Any stream may carry any
/// chunk; the header says where its bytes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkHeader {
    pub flags: u16,
    /// Message sequence number on this comm, from 0, matched to irecv in posting order.
    pub seq: u64,
    /// Uncompressed size of the whole message.
    pub total: u32,
    /// Where this chunk's uncompressed bytes start in the message.
    pub offset: u32,
    /// Uncompressed bytes in this chunk.
    pub raw_len: u32,
    /// Bytes that follow the header on the wire (== raw_len unless compressed).
    pub wire_len: u32,
}

pub const CHUNK_HEADER_SIZE: usize = 32;
const CHUNK_MAGIC: u32 = u32::from_le_bytes(*b"NZCK");
/// The payload is one codec frame (see docs/FORMAT.md) rather than raw bytes.
pub const FLAG_COMPRESSED: u16 = 1;
const KNOWN_FLAGS: u16 = FLAG_COMPRESSED;
/// NCCL's v8 API carries sizes as int, and its v8 shim rejects sends above 1 GiB.
pub const MAX_MESSAGE: u32 = 1 << 30;
/// Larger sequence numbers are refused: no comm sends 2^62 messages, and the
/// receive ring keeps the values above for its own markers.
pub const MAX_SEQ: u64 = (1 << 62) - 1;

impl ChunkHeader {
    pub fn encode(&self) -> [u8; CHUNK_HEADER_SIZE] {
        let mut b = [0u8; CHUNK_HEADER_SIZE];
        b[0..4].copy_from_slice(&CHUNK_MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&self.flags.to_le_bytes());
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..20].copy_from_slice(&self.total.to_le_bytes());
        b[20..24].copy_from_slice(&self.offset.to_le_bytes());
        b[24..28].copy_from_slice(&self.raw_len.to_le_bytes());
        b[28..32].copy_from_slice(&self.wire_len.to_le_bytes());
        b
    }

    /// Checks internal consistency; `max_wire` bounds what we will buffer for one chunk.
    pub fn decode(b: &[u8; CHUNK_HEADER_SIZE], max_wire: usize) -> Result<ChunkHeader> {
        let magic = u32::from_le_bytes(b[0..4].try_into().unwrap());
        if magic != CHUNK_MAGIC {
            return Err(Error::Remote("corrupt stream: bad chunk magic".into()));
        }
        let h = ChunkHeader {
            flags: u16::from_le_bytes(b[4..6].try_into().unwrap()),
            seq: u64::from_le_bytes(b[8..16].try_into().unwrap()),
            total: u32::from_le_bytes(b[16..20].try_into().unwrap()),
            offset: u32::from_le_bytes(b[20..24].try_into().unwrap()),
            raw_len: u32::from_le_bytes(b[24..28].try_into().unwrap()),
            wire_len: u32::from_le_bytes(b[28..32].try_into().unwrap()),
        };
        let bad = |what: &str| {
            Err(Error::Remote(format!(
                "corrupt stream: {what} in chunk {h:?}"
            )))
        };
        if h.flags & !KNOWN_FLAGS != 0 {
            return bad("unknown flags");
        }
        if b[6..8] != [0, 0] {
            return bad("reserved bytes 6..8 not zero");
        }
        if h.total > MAX_MESSAGE {
            return bad("message over 1 GiB");
        }
        if h.seq > MAX_SEQ {
            return bad("sequence number out of range");
        }
        if h.offset as u64 + h.raw_len as u64 > h.total as u64 {
            return bad("chunk past the end of its message");
        }
        if h.raw_len == 0 && h.total != 0 {
            return bad("empty chunk in a non-empty message");
        }
        if h.flags & FLAG_COMPRESSED == 0 && h.wire_len != h.raw_len {
            return bad("raw chunk whose wire length differs");
        }
        if h.flags & FLAG_COMPRESSED != 0 && h.wire_len as usize > max_wire {
            return bad("compressed chunk larger than any we send");
        }
        Ok(h)
    }

    pub fn compressed(&self) -> bool {
        self.flags & FLAG_COMPRESSED != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn handle_roundtrip_v4_v6_and_stage() {
        for addr in ["10.1.2.3:4567", "[fd00::1]:80", "127.0.0.1:1"] {
            let h = Handle {
                addr: addr.parse().unwrap(),
                secret: 0xdead_beef_1234,
                decodes: 2,
            };
            let mut b = [0xAAu8; HANDLE_SIZE];
            h.encode(&mut b);
            assert_eq!(Handle::decode(&b).unwrap(), h);
            assert_eq!(stage_get(&b), None);
            stage_set(&mut b, Some(0x1234_5678));
            assert_eq!(stage_get(&b), Some(0x1234_5678));
            assert_eq!(
                Handle::decode(&b).unwrap(),
                h,
                "stage area must not disturb the address"
            );
            stage_set(&mut b, None);
            assert_eq!(stage_get(&b), None);
        }
    }

    #[test]
    fn handle_rejects_foreign_bytes() {
        assert!(Handle::decode(&[0u8; HANDLE_SIZE]).is_err());
        let mut b = [0u8; HANDLE_SIZE];
        Handle {
            addr: "1.2.3.4:5".parse().unwrap(),
            secret: 1,
            decodes: 2,
        }
        .encode(&mut b);
        assert_eq!(Handle::decode(&b).unwrap().decodes, 2);
        // A listener before the format field wrote 0 there: it decodes v1.
        b[10..12].fill(0);
        assert_eq!(Handle::decode(&b).unwrap().decodes, 1);
        b[4] = 9; // version
        assert!(matches!(Handle::decode(&b), Err(Error::InvalidUsage(_))));
    }

    #[test]
    fn hello_checks_secret_and_stream_range() {
        let h = Hello {
            secret: 42,
            conn_id: 7,
            stream: 1,
            nstreams: 4,
            max_chunk: 1 << 18,
        };
        assert_eq!(Hello::decode(&h.encode(), 42).unwrap(), h);
        assert!(Hello::decode(&h.encode(), 43).is_err());
        let bad = Hello { stream: 4, ..h };
        assert!(Hello::decode(&bad.encode(), 42).is_err());
        let bad = Hello {
            nstreams: 0,
            stream: 0,
            ..h
        };
        assert!(Hello::decode(&bad.encode(), 42).is_err());
        let bad = Hello {
            max_chunk: 64 << 20,
            ..h
        };
        assert!(Hello::decode(&bad.encode(), 42).is_err());
        assert!(Hello::decode(&[0x41; HELLO_SIZE], 42).is_err());
    }

    /// A peer of another protocol version that knows the secret is told apart
    /// from a stranger, with both versions named; a longer hello of a later
    /// version is read by its length, its extra bytes skipped.
    #[test]
    fn hello_versions_are_named_and_the_record_can_grow() {
        let h = Hello {
            secret: 42,
            conn_id: 7,
            stream: 1,
            nstreams: 4,
            max_chunk: 1 << 18,
        };
        let mut v2 = h.encode()[..32].to_vec();
        v2[4..6].copy_from_slice(&2u16.to_le_bytes());
        v2[10..12].fill(0);
        assert_eq!(Hello::length(v2[..12].try_into().unwrap()).unwrap(), 32);
        let e = Hello::decode(&v2, 42).unwrap_err();
        assert!(matches!(e, Error::InvalidUsage(_)), "{e}");
        assert!(
            e.to_string().contains("v2") && e.to_string().contains("v4"),
            "{e}"
        );
        // A stranger with the wrong secret stays a stranger.
        assert!(matches!(Hello::decode(&v2, 43), Err(Error::Remote(_))));
        // A longer hello (a later minor extension) decodes; its tail is ignored.
        let mut long = h.encode().to_vec();
        long.extend_from_slice(&[0xEE; 16]);
        long[10..12].copy_from_slice(&64u16.to_le_bytes());
        assert_eq!(Hello::length(long[..12].try_into().unwrap()).unwrap(), 64);
        let (d, info) = Hello::decode_info(&long, 42).unwrap();
        assert_eq!((d, info), (h, PeerInfo::ours()));
        // Another plugin version with the same protocol works.
        let other = PeerInfo {
            plugin: (9, 8, 7),
            ..PeerInfo::ours()
        };
        let (_, info) = Hello::decode_info(&h.encode_with(other), 42).unwrap();
        assert_eq!(info.plugin, (9, 8, 7));
        // Lengths out of range are refused.
        long[10..12].copy_from_slice(&4000u16.to_le_bytes());
        assert!(Hello::length(long[..12].try_into().unwrap()).is_err());
    }

    #[test]
    fn chunk_header_validation() {
        let ok = ChunkHeader {
            flags: 0,
            seq: 9,
            total: 100,
            offset: 40,
            raw_len: 60,
            wire_len: 60,
        };
        assert_eq!(ChunkHeader::decode(&ok.encode(), 1 << 20).unwrap(), ok);
        let zero = ChunkHeader {
            flags: 0,
            seq: 0,
            total: 0,
            offset: 0,
            raw_len: 0,
            wire_len: 0,
        };
        assert!(ChunkHeader::decode(&zero.encode(), 0).is_ok());
        for bad in [
            ChunkHeader { offset: 41, ..ok },
            ChunkHeader { wire_len: 61, ..ok },
            ChunkHeader { flags: 0x80, ..ok },
            ChunkHeader {
                raw_len: 0,
                wire_len: 0,
                ..ok
            },
            ChunkHeader {
                total: MAX_MESSAGE + 1,
                ..ok
            },
            ChunkHeader {
                seq: MAX_SEQ + 1,
                ..ok
            },
            ChunkHeader {
                flags: FLAG_COMPRESSED,
                wire_len: 2 << 20,
                ..ok
            },
        ] {
            assert!(
                ChunkHeader::decode(&bad.encode(), 1 << 20).is_err(),
                "{bad:?}"
            );
        }
        // Reserved bytes must be zero (room for later versions).
        for i in [6, 7] {
            let mut b = ok.encode();
            b[i] = 1;
            assert!(ChunkHeader::decode(&b, 1 << 20).is_err(), "byte {i}");
        }
    }

    proptest! {
        #[test]
        fn chunk_header_decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), CHUNK_HEADER_SIZE)) {
            let b: [u8; CHUNK_HEADER_SIZE] = bytes.try_into().unwrap();
            if let Ok(h) = ChunkHeader::decode(&b, 1 << 20) {
                prop_assert!(h.offset as u64 + h.raw_len as u64 <= h.total as u64);
            }
        }
    }
}
