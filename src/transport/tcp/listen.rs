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
use crate::proto::wire::{Handle, Hello, HELLO_SIZE};

/// Most half-open connections we keep at once; beyond that the oldest is dropped.
const MAX_PENDING: usize = 256;

struct Pending {
    sock: Socket,
    peer: SocketAddr,
    buf: [u8; HELLO_SIZE],
    got: usize,
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
                        buf: [0; HELLO_SIZE],
                        got: 0,
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
            let outcome = match (&p.sock).read(&mut p.buf[p.got..]) {
                Ok(0) => Some(Err("closed before completing the handshake".to_string())),
                Ok(n) => {
                    p.got += n;
                    (p.got == HELLO_SIZE)
                        .then(|| Hello::decode(&p.buf, secret).map_err(|e| e.to_string()))
                }
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.kind() == io::ErrorKind::Interrupted =>
                {
                    (p.since.elapsed() > timeout)
                        .then(|| Err(format!("no handshake within {timeout:?}")))
                }
                Err(e) => Some(Err(e.to_string())),
            };
            match outcome {
                None => i += 1,
                Some(Err(why)) => {
                    let p = self.pending.swap_remove(i);
                    warn!("rejected connection from {}: {why}", p.peer);
                }
                Some(Ok(h)) => {
                    let p = self.pending.swap_remove(i);
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
