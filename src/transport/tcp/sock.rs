//! Thin helpers over socket2: data-socket options and whole-buffer I/O without SIGPIPE.

use std::io::{self, IoSlice, Read};
use std::time::Duration;

use socket2::{Socket, TcpKeepalive};

/// Options for a socket that carries data: blocking, no Nagle, and dead-peer
/// detection within `peer_timeout` even when the link is silent.
pub fn configure_data_socket(s: &Socket, peer_timeout: Duration) -> io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_nodelay(true)?;
    let probes = 5u32;
    let interval = (peer_timeout / (probes + 1)).max(Duration::from_secs(1));
    let ka = TcpKeepalive::new()
        .with_time(interval)
        .with_interval(interval)
        .with_retries(probes);
    s.set_tcp_keepalive(&ka)?;
    s.set_tcp_user_timeout(Some(peer_timeout))?;
    Ok(())
}

/// Writes every byte of `bufs`. MSG_NOSIGNAL: a dead peer is an error, not a SIGPIPE
/// that would kill the training job.
pub fn send_all(s: &Socket, mut bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
    // Drop leading empty slices so the loop below ends on an empty remainder.
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        match s.send_vectored_with_flags(bufs, libc::MSG_NOSIGNAL) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Fills `buf`. `Ok(false)` if the stream ended cleanly before the first byte;
/// an end in the middle is `UnexpectedEof`.
pub fn recv_exact_or_eof(mut s: &Socket, buf: &mut [u8]) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "peer closed the connection mid-message",
                ))
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Fills `buf`; any end of stream is an error.
pub fn recv_exact(s: &Socket, buf: &mut [u8]) -> io::Result<()> {
    if buf.is_empty() || recv_exact_or_eof(s, buf)? {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "peer closed the connection mid-message",
        ))
    }
}
