//! Thin helpers over socket2: data-socket options and whole-buffer I/O without SIGPIPE.

use std::io::{self, IoSlice, Read};
use std::time::Duration;

use std::net::SocketAddr;

use socket2::{Domain, Protocol, Socket, TcpKeepalive, Type};

use crate::error::{Error, Result};

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

/// Writes what the socket takes of a chunk (`hdr`, then `payload`) whose first
/// `done` bytes went out already: one vectored send, without blocking unless
/// `block` (then it waits for room, as long as the socket's send timeout
/// allows: a blocking writer, see `workers`). (What the count means, 0
/// included, is the send machine's business: `stream_tx::StreamTx::wrote`.)
pub fn send_chunk_part(
    s: &Socket,
    hdr: &[u8],
    payload: &[u8],
    done: usize,
    block: bool,
) -> io::Result<usize> {
    let (h, p) = if done < hdr.len() {
        (&hdr[done..], payload)
    } else {
        (&[][..], &payload[done - hdr.len()..])
    };
    let flags = if block {
        libc::MSG_NOSIGNAL
    } else {
        libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT
    };
    s.send_vectored_with_flags(&[IoSlice::new(h), IoSlice::new(p)], flags)
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

/// A non-blocking, close-on-exec TCP socket for `addr`'s family.
pub fn nonblocking_socket(addr: SocketAddr) -> Result<Socket> {
    let s = Socket::new(
        Domain::for_address(addr),
        Type::STREAM.cloexec(),
        Some(Protocol::TCP),
    )
    .map_err(|e| Error::io("socket", e))?;
    s.set_nonblocking(true)
        .map_err(|e| Error::io("set_nonblocking", e))?;
    Ok(s)
}

/// Starts a non-blocking connect to `addr`; [`writable`] says when it is done.
pub fn start_connect(addr: SocketAddr) -> Result<Socket> {
    let s = nonblocking_socket(addr)?;
    match s.connect(&addr.into()) {
        Ok(()) => Ok(s),
        Err(e)
            if e.raw_os_error() == Some(libc::EINPROGRESS)
                || e.kind() == io::ErrorKind::WouldBlock =>
        {
            Ok(s)
        }
        Err(e) => Err(Error::io(format!("connect to {addr}"), e)),
    }
}

/// A non-blocking listener on `addr` (port 0: an ephemeral port) and its address.
pub fn bind_listener(addr: SocketAddr) -> Result<(Socket, SocketAddr)> {
    let s = nonblocking_socket(addr)?;
    s.set_reuse_address(true)
        .map_err(|e| Error::io("SO_REUSEADDR", e))?;
    s.bind(&addr.into())
        .map_err(|e| Error::io(format!("bind {addr}"), e))?;
    s.listen(1024).map_err(|e| Error::io("listen", e))?;
    let local = s
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .ok_or_else(|| Error::Internal("listener has no address".into()))?;
    Ok((s, local))
}

/// A listener's secret: random, never 0.
pub fn random_secret() -> u64 {
    loop {
        let v: u64 = rand::random();
        if v != 0 {
            return v;
        }
    }
}

/// True once a non-blocking connect has finished (or failed: `take_error` says).
pub fn writable(s: &Socket) -> io::Result<bool> {
    ready_now(s, libc::POLLOUT)
}

/// True while a listener has connections to accept (or an error to report).
pub fn readable(s: &Socket) -> io::Result<bool> {
    ready_now(s, libc::POLLIN)
}

fn ready_now(s: &Socket, events: libc::c_short) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    let mut p = libc::pollfd {
        fd: s.as_raw_fd(),
        events,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    let r = unsafe { libc::poll(&mut p, 1, 0) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(false)
        } else {
            Err(e)
        };
    }
    Ok(r > 0 && p.revents & (events | libc::POLLERR | libc::POLLHUP) != 0)
}
