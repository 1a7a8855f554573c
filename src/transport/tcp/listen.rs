//! The listening side: one non-blocking listener per device address for the
//! whole process, shared by every listen comm and every live receive comm on
//! that address. It sorts incoming sockets by their hello, and drops anything
//! that does not present a secret we know.
//!
//! Why shared: a connection's data streams are opened by the sender on demand,
//! possibly long after `accept` returned, and NCCL calls `closeListen` right after
//! `accept` completes; so a late stream cannot rely on the listen comm's socket.
//! One listener per address costs 1 fd per device per process instead of one per
//! listen comm. It lives as long as the process (like the I/O workers), driven
//! by one of the shared I/O workers and polled by `accept` too.
//!
//! Sorting: the hello's secret (random per listen comm, also in the handle)
//! names the listen comm; its connection id names the connection. A connection's
//! inline stream (the last index) is the first to come: it makes a new connection,
//! handed out by that listen comm's `accept`. A data stream joins its live receive
//! comm, found by secret and connection id (after `closeListen` too), or waits
//! with its connection for `accept` if it came first.
//!
//! On a shared node anyone can connect to our port. A stranger's connection is
//! closed (with a WARN) without disturbing the listener or any real peer; a silent
//! one is dropped after `NCCL_ZIP_HANDSHAKE_TIMEOUT_MS`; at most [`MAX_HALF_OPEN`]
//! half-open connections are kept at once (the shared bootstrap,
//! `proto::bootstrap`, does the reading, the limit and the deadline).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use socket2::Socket;
use tracing::{info, warn};

use super::recv::RecvComm;
use super::sock::{bind_listener, random_secret, readable};
use super::workers::{workers, Driven, Next, Registration};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::proto::bootstrap::{Gate, Outcome, MAX_HALF_OPEN};
use crate::proto::wire::{Handle, Hello, HelloFraming, PeerInfo};
use crate::transport::boot::{accept_and_poll, Conn};

/// The byte a receiver writes on a data stream once it has attached it to its
/// comm: the sender writes no chunk on a data stream before it reads this.
pub const STREAM_ACK: u8 = 0xA5;

/// A connection that `accept` has not handed out yet.
struct Group {
    /// Set once the inline stream has come: the connection is then ready.
    inline: Option<Socket>,
    /// Data streams that came before `accept` took the connection.
    early: Vec<(usize, Socket)>,
    nstreams: u16,
    max_chunk: u32,
    /// The codec frame format the connector writes (its hello).
    format: u8,
    peer: SocketAddr,
    since: Instant,
}

/// What a listen comm's `accept` picks up.
#[derive(Default)]
struct Inbox {
    /// The highest codec frame format its receive comms decode (its handle).
    decodes: u8,
    groups: HashMap<u64, Group>,
    /// A peer that knows the secret but speaks another protocol version.
    errors: Vec<Error>,
}

/// A live receive comm, as the listener sees it: where its late data streams go.
pub(super) trait Attach: Send + Sync {
    /// Takes data stream `who`; false if the comm can no longer take it (the
    /// socket is then dropped).
    fn attach(&self, who: usize, sock: Socket) -> bool;
}

struct Live {
    nstreams: u16,
    max_chunk: u32,
    format: u8,
    comm: Weak<dyn Attach>,
}

struct State {
    /// Connections whose hello has not come yet (the shared bootstrap).
    pending: Gate<Conn>,
    /// By secret.
    listens: HashMap<u64, Inbox>,
    /// By (secret, connection id).
    conns: HashMap<(u64, u64), Live>,
}

/// The process's listener on one address.
pub struct Shared {
    sock: Socket,
    addr: SocketAddr,
    timeout: Duration,
    state: Mutex<State>,
}

static LISTENERS: Mutex<Vec<(SocketAddr, Arc<Shared>, Registration)>> =
    parking_lot::const_mutex(Vec::new());

/// The process's listener on `bind` (an address with port 0), made on first use.
fn shared(bind: SocketAddr, cfg: &Config) -> Result<Arc<Shared>> {
    let mut all = LISTENERS.lock();
    if let Some((_, s, _)) = all.iter().find(|(a, _, _)| *a == bind) {
        return Ok(s.clone());
    }
    let (sock, addr) = bind_listener(bind)?;
    let s = Arc::new(Shared {
        sock,
        addr,
        timeout: cfg.handshake_timeout,
        state: Mutex::new(State {
            pending: Gate::new(cfg.handshake_timeout, MAX_HALF_OPEN),
            listens: HashMap::new(),
            conns: HashMap::new(),
        }),
    });
    let reg = workers(cfg.io_threads)?.register(s.clone())?;
    info!(
        "listening on {addr} for every TCP comm of this process on {}",
        bind.ip()
    );
    all.push((bind, s.clone(), reg));
    Ok(s)
}

impl Driven for Shared {
    fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    fn run(&self) -> Next {
        let half_open = self.poll();
        if half_open {
            // Hellos still coming, or silent strangers to time out.
            Next::Retry
        } else if readable(&self.sock).unwrap_or(false) {
            // Accept stopped before `EAGAIN` (out of fds, say): the connections
            // still queued bring no new edge, so look again soon.
            Next::Retry
        } else {
            Next::Readable
        }
    }
}

impl Shared {
    /// One non-blocking step: takes new connections, reads hellos, sorts
    /// complete ones, and drops what timed out. True while connections are
    /// half-open.
    fn poll(&self) -> bool {
        let mut st = self.state.lock();
        let what = format!("TCP listener {}", self.addr);
        for o in accept_and_poll(&self.sock, &mut st.pending, &HelloFraming, &what) {
            if let Outcome::Hello { conn, record, .. } = o {
                sort(&mut st, conn, &record);
            }
        }
        let timeout = self.timeout;
        if st.listens.is_empty() && st.conns.is_empty() && !st.pending.is_empty() {
            // No listen comm and no receive comm left on this address: nothing
            // we wait for can come any more (as when a listen comm of its own was
            // closed, before the listener was shared).
            for p in st.pending.drain() {
                warn!(
                    "dropping half-open connection from {}: no comm left to connect to",
                    p.peer
                );
            }
        }
        for inbox in st.listens.values_mut() {
            inbox.groups.retain(|_, g| {
                let keep = g.inline.is_some() || g.since.elapsed() <= timeout;
                if !keep {
                    warn!("dropping incomplete connection from {}: its inline stream did not arrive within {timeout:?}", g.peer);
                }
                keep
            });
        }
        !st.pending.is_empty()
            || st
                .listens
                .values()
                .any(|i| i.groups.values().any(|g| g.inline.is_none()))
    }
}

/// Puts a socket whose whole hello `b` has arrived where it belongs, or drops it.
fn sort(st: &mut State, p: Conn, b: &[u8]) {
    // Bytes 16..32 are the secret and the connection id in every version.
    let claimed = u64::from_le_bytes(b[16..24].try_into().unwrap());
    let conn_id = u64::from_le_bytes(b[24..32].try_into().unwrap());
    let known = st.listens.contains_key(&claimed) || st.conns.contains_key(&(claimed, conn_id));
    if !known {
        warn!(
            "rejected connection from {}: hello with the wrong secret (or for a comm that is gone)",
            p.peer
        );
        return;
    }
    let (h, info) = match Hello::decode_info(b, claimed) {
        Ok(x) => x,
        // Our peer (it knows the secret) speaking another protocol version: the
        // listen comm's accept fails, naming both versions.
        Err(e @ Error::InvalidUsage(_)) => {
            let e = Error::InvalidUsage(format!("connection from {}: {e}", p.peer));
            match st.listens.get_mut(&claimed) {
                Some(inbox) => inbox.errors.push(e),
                None => warn!("{e}"),
            }
            return;
        }
        Err(why) => {
            warn!("rejected connection from {}: {why}", p.peer);
            return;
        }
    };
    let inline = h.stream + 1 == h.nstreams;
    let format = u8::try_from(info.format).unwrap_or(u8::MAX);
    if inline && info.plugin != PeerInfo::ours().plugin {
        info!(
            "connection from {} runs {info}, we run {}",
            p.peer,
            PeerInfo::ours()
        );
    }
    let disagrees = || {
        warn!(
            "rejected connection from {}: hello disagrees with its connection's other streams",
            p.peer
        )
    };
    if let Some(live) = st.conns.get(&(claimed, h.conn_id)) {
        if inline
            || live.nstreams != h.nstreams
            || live.max_chunk != h.max_chunk
            || live.format != format
        {
            return disagrees();
        }
        match live.comm.upgrade() {
            Some(c) => {
                if !c.attach(h.stream as usize, p.sock) {
                    info!(
                        "dropped data stream {} from {}: its comm no longer takes it",
                        h.stream, p.peer
                    );
                }
            }
            None => info!("dropped data stream from {}: its comm is closed", p.peer),
        }
        return;
    }
    let Some(inbox) = st.listens.get_mut(&claimed) else {
        warn!(
            "rejected connection from {}: its listen comm is closed",
            p.peer
        );
        return;
    };
    if format > inbox.decodes {
        // Our peer (it knows the secret) writes a format it was not offered.
        inbox.errors.push(Error::InvalidUsage(format!(
            "connection from {} states codec format v{format}, this listener offered v{} at most: a broken or mismatched peer",
            p.peer, inbox.decodes
        )));
        return;
    }
    let g = inbox.groups.entry(h.conn_id).or_insert_with(|| Group {
        inline: None,
        early: Vec::new(),
        nstreams: h.nstreams,
        max_chunk: h.max_chunk,
        format,
        peer: p.peer,
        since: Instant::now(),
    });
    let idx = h.stream as usize;
    let dup = if inline {
        g.inline.is_some()
    } else {
        g.early.iter().any(|(k, _)| *k == idx)
    };
    if g.nstreams != h.nstreams || g.max_chunk != h.max_chunk || g.format != format || dup {
        return disagrees();
    }
    if inline {
        g.inline = Some(p.sock);
    } else {
        g.early.push((idx, p.sock));
    }
}

pub struct ListenComm {
    shared: Arc<Shared>,
    handle: Handle,
    cfg: Arc<Config>,
}

impl ListenComm {
    /// A listen comm on `addr` (the device's address, port 0): the process's
    /// listener there, and a fresh secret.
    pub fn bind(addr: SocketAddr, cfg: Arc<Config>) -> Result<ListenComm> {
        let shared = shared(addr, &cfg)?;
        let decodes = crate::codec_glue::highest_decodable(&cfg);
        let secret = {
            let mut st = shared.state.lock();
            let secret = loop {
                let s = random_secret();
                if !st.listens.contains_key(&s) && !st.conns.keys().any(|(k, _)| *k == s) {
                    break s;
                }
            };
            st.listens.insert(
                secret,
                Inbox {
                    decodes,
                    ..Inbox::default()
                },
            );
            secret
        };
        Ok(ListenComm {
            handle: Handle {
                addr: shared.addr,
                secret,
                decodes,
            },
            shared,
            cfg,
        })
    }

    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// One non-blocking step: returns a comm once a connection's inline stream
    /// has arrived.
    pub fn accept(&mut self) -> Result<Option<RecvComm>> {
        self.shared.poll();
        let secret = self.handle.secret;
        let mut st = self.shared.state.lock();
        let inbox = st
            .listens
            .get_mut(&secret)
            .ok_or_else(|| Error::Internal("listen comm not registered".into()))?;
        if let Some(e) = inbox.errors.pop() {
            return Err(e);
        }
        let Some(id) = inbox
            .groups
            .iter()
            .find(|(_, g)| g.inline.is_some())
            .map(|(k, _)| *k)
        else {
            return Ok(None);
        };
        let g = inbox.groups.remove(&id).expect("group present");
        let inline = g.inline.expect("complete");
        info!(
            "accepted a connection from {} (up to {} data streams, {} here)",
            g.peer,
            g.nstreams - 1,
            g.early.len()
        );
        let (mut comm, attach) = RecvComm::new(
            inline,
            g.nstreams as usize - 1,
            g.peer,
            g.max_chunk as usize,
            g.format,
            self.cfg.clone(),
        )?;
        comm.remove = Some(Remove {
            shared: Arc::downgrade(&self.shared),
            key: (secret, id),
        });
        // Registered under the same lock that sorts streams: a data stream that
        // comes from now on finds the comm.
        st.conns.insert(
            (secret, id),
            Live {
                nstreams: g.nstreams,
                max_chunk: g.max_chunk,
                format: g.format,
                comm: attach.clone(),
            },
        );
        if let Some(c) = attach.upgrade() {
            for (k, s) in g.early {
                c.attach(k, s);
            }
        }
        Ok(Some(comm))
    }
}

impl Drop for ListenComm {
    fn drop(&mut self) {
        // Connections not accepted are closed; live comms keep their entries.
        let inbox = self.shared.state.lock().listens.remove(&self.handle.secret);
        drop(inbox);
        self.shared.poll();
    }
}

/// Takes a receive comm's entry out of its listener when the comm closes.
pub(super) struct Remove {
    shared: Weak<Shared>,
    key: (u64, u64),
}

impl Drop for Remove {
    fn drop(&mut self) {
        if let Some(s) = self.shared.upgrade() {
            s.state.lock().conns.remove(&self.key);
            s.poll();
        }
    }
}
