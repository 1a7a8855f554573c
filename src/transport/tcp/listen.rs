//! The listening side: a non-blocking listener that sorts incoming sockets into
//! comms by their hello, and drops anything that does not present our secret.
//!
//! On a shared node anyone can connect to our port. A stranger's connection is
//! closed (with a WARN) without disturbing the listener or the real peer; a silent
//! one is dropped after `NCCL_ZIP_HANDSHAKE_TIMEOUT_MS`.

use std::collections::HashMap;
use std::io::{self, Read};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use socket2::Socket;
use tracing::{info, warn};

use super::recv::RecvComm;
use super::sock::{bind_listener, random_secret};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::proto::wire::{Handle, Hello, PeerInfo, HELLO_MAX, HELLO_PREFIX};

/// Most half-open connections we keep at once; beyond that the oldest is dropped.
const MAX_PENDING: usize = 256;

struct Pending {
    sock: Socket,
    peer: SocketAddr,
    buf: [u8; HELLO_MAX],
    got: usize,
    /// The hello's length, once its prefix is in.
    want: usize,
    since: Instant,
}

struct Group {
    streams: Vec<Option<Socket>>,
    max_chunk: u32,
    peer: SocketAddr,
    since: Instant,
}

pub struct ListenComm {
    listener: Socket,
    handle: Handle,
    pending: Vec<Pending>,
    groups: HashMap<u64, Group>,
    cfg: Arc<Config>,
}

impl ListenComm {
    /// Binds an ephemeral port on `addr` (the device's address).
    pub fn bind(addr: SocketAddr, cfg: Arc<Config>) -> Result<ListenComm> {
        let (s, local) = bind_listener(addr)?;
        let secret = random_secret();
        Ok(ListenComm {
            listener: s,
            handle: Handle {
                addr: local,
                secret,
            },
            pending: Vec::new(),
            groups: HashMap::new(),
            cfg,
        })
    }

    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// One non-blocking step: takes new connections, reads hellos, and returns a comm
    /// once every stream of one connector has arrived.
    pub fn accept(&mut self) -> Result<Option<RecvComm>> {
        loop {
            match self.listener.accept() {
                Ok((sock, addr)) => {
                    let peer = addr.as_socket().unwrap_or_else(|| ([0, 0, 0, 0], 0).into());
                    sock.set_nonblocking(true)
                        .map_err(|e| Error::io("set_nonblocking", e))?;
                    if self.pending.len() >= MAX_PENDING {
                        let old = self.pending.remove(0);
                        warn!("dropping half-open connection from {} (more than {MAX_PENDING} pending)", old.peer);
                    }
                    self.pending.push(Pending {
                        sock,
                        peer,
                        buf: [0; HELLO_MAX],
                        got: 0,
                        want: HELLO_PREFIX,
                        since: Instant::now(),
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e)
                    if e.kind() == io::ErrorKind::Interrupted
                        || e.kind() == io::ErrorKind::ConnectionAborted => {}
                Err(e) => return Err(Error::io("accept", e)),
            }
        }
        let timeout = self.cfg.handshake_timeout;
        let secret = self.handle.secret;
        let mut i = 0;
        while i < self.pending.len() {
            let p = &mut self.pending[i];
            let outcome: Option<Result<(Hello, PeerInfo)>> =
                match (&p.sock).read(&mut p.buf[p.got..p.want]) {
                    Ok(0) => Some(Err(Error::Remote(
                        "closed before completing the handshake".into(),
                    ))),
                    Ok(n) => {
                        p.got += n;
                        if p.got < p.want {
                            None
                        } else if p.want == HELLO_PREFIX {
                            // The prefix says how long the whole hello is.
                            match Hello::length(p.buf[..HELLO_PREFIX].try_into().unwrap()) {
                                Ok(len) => {
                                    p.want = len;
                                    None
                                }
                                Err(e) => Some(Err(e)),
                            }
                        } else {
                            Some(Hello::decode_info(&p.buf[..p.want], secret))
                        }
                    }
                    Err(e)
                        if e.kind() == io::ErrorKind::WouldBlock
                            || e.kind() == io::ErrorKind::Interrupted =>
                    {
                        (p.since.elapsed() > timeout)
                            .then(|| Err(Error::Remote(format!("no handshake within {timeout:?}"))))
                    }
                    Err(e) => Some(Err(Error::io("reading a hello", e))),
                };
            match outcome {
                None => i += 1,
                // Our peer (it knows the secret) speaking another protocol
                // version: the accept fails, naming both versions.
                Some(Err(e @ Error::InvalidUsage(_))) => {
                    let p = self.pending.swap_remove(i);
                    return Err(Error::InvalidUsage(format!(
                        "connection from {}: {e}",
                        p.peer
                    )));
                }
                Some(Err(why)) => {
                    let p = self.pending.swap_remove(i);
                    warn!("rejected connection from {}: {why}", p.peer);
                }
                Some(Ok((h, info))) => {
                    let p = self.pending.swap_remove(i);
                    if h.stream == 0 && info != PeerInfo::ours() {
                        info!(
                            "connection from {} runs {info}, we run {}",
                            p.peer,
                            PeerInfo::ours()
                        );
                    }
                    self.add_stream(h, p.sock, p.peer);
                }
            }
        }
        self.groups.retain(|_, g| {
            let keep = g.since.elapsed() <= timeout;
            if !keep {
                warn!("dropping incomplete connection from {}: not all streams arrived within {timeout:?}", g.peer);
            }
            keep
        });
        let done = self
            .groups
            .iter()
            .find(|(_, g)| g.streams.iter().all(Option::is_some))
            .map(|(k, _)| *k);
        match done {
            None => Ok(None),
            Some(id) => {
                let g = self.groups.remove(&id).expect("group present");
                let socks: Vec<Socket> = g
                    .streams
                    .into_iter()
                    .map(|s| s.expect("complete"))
                    .collect();
                info!("accepted {} streams from {}", socks.len(), g.peer);
                RecvComm::new(socks, g.peer, g.max_chunk as usize, self.cfg.clone()).map(Some)
            }
        }
    }

    fn add_stream(&mut self, h: Hello, sock: Socket, peer: SocketAddr) {
        let g = self.groups.entry(h.conn_id).or_insert_with(|| Group {
            streams: (0..h.nstreams).map(|_| None).collect(),
            max_chunk: h.max_chunk,
            peer,
            since: Instant::now(),
        });
        let idx = h.stream as usize;
        if g.streams.len() != h.nstreams as usize
            || g.max_chunk != h.max_chunk
            || g.streams[idx].is_some()
        {
            warn!("rejected connection from {peer}: hello disagrees with its connection's other streams");
            return;
        }
        g.streams[idx] = Some(sock);
    }
}
