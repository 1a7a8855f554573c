//! The socket side of the shared bootstrap (`proto::bootstrap`), for both
//! transports: non-blocking accept into a [`Gate`], reads and writes of
//! half-open connections, and one pass of a [`Dialer`] over its socket. The
//! clock is read here, by the callers, and handed in.

use std::io::{self, Read};
use std::net::SocketAddr;

use socket2::Socket;
use tracing::warn;

use crate::error::{Error, Result};
use crate::proto::bootstrap::{Dialer, Framing, Gate, Io, Outcome, Step};
use crate::transport::tcp::sock::writable;

/// A half-open connection at a listener; `built`: what the transport made of
/// it once its hello came, kept while its reply is written (IB).
pub struct Conn<X = ()> {
    pub sock: Socket,
    pub peer: SocketAddr,
    pub built: Option<X>,
}

fn again(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}

/// One non-blocking read; `what` names it in an error.
pub fn read_nb(mut s: &Socket, buf: &mut [u8], what: &str) -> Io {
    match s.read(buf) {
        Ok(0) => Io::Closed,
        Ok(n) => Io::Moved(n),
        Err(e) if again(&e) => Io::Blocked,
        Err(e) => Io::Failed(Error::io(what, e)),
    }
}

/// One non-blocking write (no SIGPIPE); `what` names it in an error.
pub fn write_nb(s: &Socket, buf: &[u8], what: &str) -> Io {
    match s.send_with_flags(buf, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) {
        Ok(0) => Io::Closed,
        Ok(n) => Io::Moved(n),
        Err(e) if again(&e) => Io::Blocked,
        Err(e) => Io::Failed(Error::io(what, e)),
    }
}

/// Takes every connection waiting on `listener` into `gate` (non-blocking),
/// then moves every half-open one along. Returns what became of them; the
/// dropped ones are already WARNed (`what` names the listener in the line).
pub fn accept_and_poll<X>(
    listener: &Socket,
    gate: &mut Gate<Conn<X>>,
    f: &dyn Framing,
    what: &str,
) -> Vec<Outcome<Conn<X>>> {
    let now = std::time::Instant::now();
    let mut out = Vec::new();
    loop {
        match listener.accept() {
            Ok((sock, addr)) => {
                let peer = addr.as_socket().unwrap_or_else(|| ([0, 0, 0, 0], 0).into());
                if let Err(e) = sock.set_nonblocking(true) {
                    warn!("{what}: dropping connection from {peer}: set_nonblocking: {e}");
                    continue;
                }
                let c = Conn {
                    sock,
                    peer,
                    built: None,
                };
                out.extend(gate.admit(c, f, now));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e)
                if e.kind() == io::ErrorKind::Interrupted
                    || e.kind() == io::ErrorKind::ConnectionAborted => {}
            Err(e) => {
                // EMFILE and the like: try again later, the others go on.
                warn!("{what}: accept: {e}");
                break;
            }
        }
    }
    out.extend(gate.poll(
        now,
        f,
        |c, b| read_nb(&c.sock, b, "reading a hello"),
        |c, b| write_nb(&c.sock, b, "writing a handshake reply"),
    ));
    out.retain(|o| match o {
        Outcome::Dropped(c, why) => {
            warn!("{what}: rejected connection from {}: {why}", c.peer);
            false
        }
        _ => true,
    });
    out
}

/// One non-blocking pass of `d` over `sock` (connecting to `peer`). True once
/// the dialer is done.
pub fn dial(sock: &Socket, d: &mut Dialer, peer: SocketAddr) -> Result<bool> {
    let what = format!("handshake with {peer}");
    loop {
        match d.want() {
            Step::Connect => {
                if !writable(sock).map_err(|e| Error::io("poll", e))? {
                    return Ok(false);
                }
                if let Some(e) = sock.take_error().map_err(|e| Error::io("getsockopt", e))? {
                    return Err(Error::io(format!("connect to {peer}"), e));
                }
                d.connected();
            }
            Step::Write(b) => match write_nb(sock, b, &what) {
                Io::Moved(n) => d.wrote(n),
                Io::Blocked => return Ok(false),
                Io::Closed => return Err(Error::Remote(format!("{what}: closed"))),
                Io::Failed(e) => return Err(e),
            },
            Step::Read(b) => match read_nb(sock, b, &what) {
                Io::Moved(n) => d.read(n)?,
                Io::Blocked => return Ok(false),
                Io::Closed => d.read(0)?,
                Io::Failed(e) => return Err(e),
            },
            Step::Done => return Ok(true),
        }
    }
}
