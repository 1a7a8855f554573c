//! Codec frame format agreement over TCP (issue 19 item 10): the listener's
//! handle says the highest format it decodes (1 where the GPU kernels may
//! decode, else 2), the connector writes the lower of that and its
//! `NCCL_ZIP_FORMAT`, states it in every hello, and the receiver refuses a hello
//! above what it offered and a frame above what was agreed. (IB: `ib_comm`,
//! `ib_fabric`.)

mod inproc_util;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use inproc_util::{bf16_gaussian, hdr, post, send, transfer_and_check, wait, wait_stream_ack};
use nccl_net_zip::codec::{self, DtypeHint, EncodeOptions};
use nccl_net_zip::config::{CompressMode, Config};
use nccl_net_zip::error::Error;
use nccl_net_zip::gpu::Emulation;
use nccl_net_zip::proto::wire::{
    ChunkHeader, Handle, Hello, PeerInfo, CHUNK_HEADER_SIZE, FLAG_COMPRESSED, HANDLE_SIZE,
    HELLO_SIZE,
};
use nccl_net_zip::transport::tcp::{ConnectState, ListenComm, RecvComm, SendComm};

const LO: &str = "127.0.0.1:0";

/// Settings of one side: it writes `format` at most; `gpu`: it offers CUDA
/// buffers (emulated here), so it decodes only what the kernels decode.
fn cfg(format: u8, gpu: bool) -> Arc<Config> {
    Arc::new(Config {
        format,
        compress: CompressMode::On,
        dtype: DtypeHint::Bf16,
        gpu,
        gpu_emulate: if gpu {
            Emulation::Kernels
        } else {
            Emulation::Off
        },
        ..Config::default()
    })
}

/// Connects to `h` with settings `c`, as NCCL does (non-blocking, retried),
/// and accepts on `l` meanwhile when given.
fn connect(
    h: &Handle,
    c: Arc<Config>,
    mut l: Option<&mut ListenComm>,
) -> (SendComm, Option<RecvComm>) {
    let mut st = Some(ConnectState::start(h, 10_000, c).unwrap());
    let (mut s, mut r) = (None, None);
    let t0 = Instant::now();
    while s.is_none() || (l.is_some() && r.is_none()) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "connect/accept hung"
        );
        if st.as_mut().is_some_and(|st| st.progress().unwrap()) {
            s = Some(st.take().unwrap().finish().unwrap());
        }
        if let Some(l) = l.as_deref_mut() {
            if r.is_none() {
                r = l.accept().unwrap();
            }
        }
        std::thread::yield_now();
    }
    (s.unwrap(), r)
}

/// A real listener and connector of every mix: the connector writes the lower
/// format; compressed bf16 goes through bit for bit (a frame above the
/// agreement would fail the receive, see below).
#[test]
fn peers_agree_on_the_lower_format_both_orders() {
    for (gpu, writes) in [(true, 2u8), (false, 1), (false, 2), (true, 1)] {
        let lc = cfg(1, gpu);
        let mut l = ListenComm::bind(LO.parse().unwrap(), lc).unwrap();
        let h = *l.handle();
        assert_eq!(h.decodes, if gpu { 1 } else { 2 }, "the listener's offer");
        let mut b = [0u8; HANDLE_SIZE];
        h.encode(&mut b);
        assert_eq!(
            Handle::decode(&b).unwrap(),
            h,
            "the offer crosses in the handle"
        );
        let (s, r) = connect(&h, cfg(writes, false), Some(&mut l));
        let r = r.unwrap();
        let msgs = vec![
            bf16_gaussian(1, 1 << 20, 0.02),
            bf16_gaussian(2, 300_000, 0.02),
        ];
        transfer_and_check(&s, &r, &msgs, 1 << 20);
        assert!(
            r.stats().chunks_compressed.load(Relaxed) > 0,
            "gpu {gpu}, writes v{writes}: nothing was compressed"
        );
    }
}

/// Reads exactly `n` bytes (10 s at most).
fn read_n(s: &mut TcpStream, n: usize) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut b = vec![0u8; n];
    s.read_exact(&mut b).unwrap();
    b
}

/// What goes on the wire, read by a hand-made listener: each hello states the
/// agreed format, and the compressed frames are of that format.
#[test]
fn the_connector_states_and_writes_the_agreed_format() {
    // (offered in the handle, NCCL_ZIP_FORMAT, expected); 0: an older listener.
    // Outlives every send comm, which may still read it when it closes.
    let m = bf16_gaussian(3, 256 << 10, 0.02);
    for (offer, writes, want) in [(2u8, 2u8, 2u8), (1, 2, 1), (2, 1, 1), (0, 2, 1)] {
        let fake = TcpListener::bind(LO).unwrap();
        let addr: SocketAddr = fake.local_addr().unwrap();
        let mut b = [0u8; HANDLE_SIZE];
        Handle {
            addr,
            secret: 77,
            decodes: offer,
        }
        .encode(&mut b);
        if offer == 0 {
            b[10..12].fill(0);
        }
        let h = Handle::decode(&b).unwrap();
        let (s, _) = connect(&h, cfg(writes, false), None);
        let (mut inline, _) = fake.accept().unwrap();
        let hello = read_n(&mut inline, HELLO_SIZE);
        let (_, info) = Hello::decode_info(&hello, 77).unwrap();
        assert_eq!(info.format, want as u16, "offer {offer}, writes {writes}");
        // A compressible message larger than the inline limit: data streams.
        let q = s.isend(m.as_ptr(), m.len(), None).unwrap().unwrap();
        let (mut d, _) = fake.accept().unwrap();
        let hello = read_n(&mut d, HELLO_SIZE);
        let (dh, info) = Hello::decode_info(&hello, 77).unwrap();
        assert!(dh.stream + 1 < dh.nstreams, "a data stream");
        assert_eq!(info.format, want as u16);
        d.write_all(&[nccl_net_zip::transport::tcp::STREAM_ACK])
            .unwrap();
        let ch = ChunkHeader::decode(
            read_n(&mut d, CHUNK_HEADER_SIZE)[..].try_into().unwrap(),
            1 << 24,
        )
        .unwrap();
        assert!(ch.flags & FLAG_COMPRESSED != 0, "bf16 compresses: {ch:?}");
        let frame = read_n(&mut d, ch.wire_len as usize);
        assert_eq!(
            frame[4], want,
            "the frame's format (offer {offer}, writes {writes})"
        );
        drop((d, inline, fake));
        let _ = q.test();
        drop(s);
    }
}

/// A hand-made connection of one data stream (0) and the inline stream (1)
/// whose hellos state `format`; the receive comm, the data stream, the inline
/// stream.
fn hand_made(format: u16, gpu: bool) -> Result<(RecvComm, TcpStream, TcpStream), Error> {
    let mut l = ListenComm::bind(LO.parse().unwrap(), cfg(1, gpu)).unwrap();
    let h = *l.handle();
    let hello = |stream| {
        Hello {
            secret: h.secret,
            conn_id: 0xF0F0,
            stream,
            nstreams: 2,
            max_chunk: 1 << 20,
        }
        .encode_with(PeerInfo {
            format,
            ..PeerInfo::ours()
        })
    };
    let mut inline = TcpStream::connect(h.addr).unwrap();
    inline.write_all(&hello(1)).unwrap();
    let t0 = Instant::now();
    let r = loop {
        if let Some(r) = l.accept()? {
            break r;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "accept hung");
        std::thread::yield_now();
    };
    let mut d = TcpStream::connect(h.addr).unwrap();
    d.write_all(&hello(0)).unwrap();
    wait_stream_ack(&d);
    Ok((r, d, inline))
}

/// A connector that states a format above the listener's offer fails
/// `accept`, naming both; one at or below it is taken.
#[test]
fn a_hello_above_the_offered_format_fails_accept() {
    let e = hand_made(2, true)
        .err()
        .expect("v2 to a listener that offered v1");
    assert!(matches!(e, Error::InvalidUsage(_)), "{e}");
    assert!(
        e.to_string().contains("v2") && e.to_string().contains("v1"),
        "{e}"
    );
    assert!(hand_made(1, true).is_ok());
    assert!(hand_made(2, false).is_ok());
}

/// A v2 frame on a connection that agreed on v1 fails the receive with the
/// format named, whether the frame is valid or corrupt (the check comes before
/// any decoder); on a v2 connection the valid one is delivered.
#[test]
fn a_frame_of_an_unagreed_format_fails_the_receive() {
    let m = bf16_gaussian(4, 64 << 10, 0.02);
    let mut frame = vec![0u8; codec::max_compressed_size(m.len())];
    let opts = EncodeOptions {
        dtype: DtypeHint::Bf16,
        format: 2,
        ..EncodeOptions::default()
    };
    let n = codec::compress(&m, &mut frame, &opts).unwrap();
    frame.truncate(n);
    assert_eq!(frame[4], 2);
    let mut corrupt = frame.clone();
    corrupt[codec::format::HEADER_LEN..]
        .iter_mut()
        .for_each(|b| *b ^= 0x5A);
    for (agreed, f, ok) in [
        (1u16, &frame, false),
        (1, &corrupt, false),
        (2, &frame, true),
    ] {
        let (r, mut d, _inline) = hand_made(agreed, false).unwrap();
        let mut buf = vec![0u8; m.len()];
        let q = post(&r, &mut buf);
        send(
            &mut d,
            hdr(FLAG_COMPRESSED, 0, m.len(), 0, m.len(), f.len()),
            f,
        );
        let got = wait(q);
        if ok {
            assert_eq!(got.unwrap(), m.len());
            assert!(buf == m);
        } else {
            let e = got.unwrap_err();
            assert!(matches!(e, Error::Remote(_)), "{e}");
            assert!(
                e.to_string().contains("format v2") && e.to_string().contains("agreed on v1"),
                "{e}"
            );
        }
    }
}

/// The same into (emulated) device memory, where a GPU lane would decode the
/// frame: a receiver that offers CUDA buffers offered v1, and a v2 frame fails
/// the receive before the lane (CPU stand-in or kernels) sees it; a v1 frame
/// is delivered.
#[test]
fn a_frame_of_an_unagreed_format_into_device_memory_fails_the_receive() {
    use nccl_net_zip::gpu::backend_for;
    let m = bf16_gaussian(5, 64 << 10, 0.02);
    let frame = |format: u8| {
        let mut f = vec![0u8; codec::max_compressed_size(m.len())];
        let opts = EncodeOptions {
            dtype: DtypeHint::Bf16,
            format,
            ..EncodeOptions::default()
        };
        let n = codec::compress(&m, &mut f, &opts).unwrap();
        f.truncate(n);
        assert_eq!(f[4], format);
        f
    };
    for emu in [Emulation::Kernels, Emulation::NoKernels] {
        for (format, ok) in [(2u8, false), (1, true)] {
            let (r, mut d, _inline) = hand_made(1, true).unwrap();
            let mut buf = vec![0u8; m.len()];
            let dev = backend_for(buf.as_ptr() as u64, emu).unwrap();
            let q = r
                .irecv(buf.as_mut_ptr(), buf.len(), Some(dev))
                .unwrap()
                .unwrap();
            let f = frame(format);
            send(
                &mut d,
                hdr(FLAG_COMPRESSED, 0, m.len(), 0, m.len(), f.len()),
                &f,
            );
            match (wait(q), ok) {
                (Ok(n), true) => {
                    assert_eq!(n, m.len());
                    assert!(buf == m, "{emu:?}");
                }
                (Err(e), false) => assert!(
                    e.to_string().contains("format v2") && e.to_string().contains("agreed on v1"),
                    "{emu:?}: {e}"
                ),
                (r, _) => panic!("{emu:?} v{format}: {r:?}"),
            }
        }
    }
}
