//! Non-blocking, resumable connect. NCCL calls `connect` again and again with the
//! same handle until it returns a comm; our progress lives in a [`ConnectState`]
//! whose address we keep in the handle's stage area.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use socket2::Socket;

use super::send::SendComm;
use super::sock::{start_connect, writable};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::proto::wire::{Handle, Hello, HELLO_SIZE};

enum Stage {
    Connecting,
    /// Connected; this many hello bytes written.
    Hello(usize),
    Ready,
}

pub struct ConnectState {
    socks: Vec<(Socket, Stage)>,
    hello: Vec<[u8; HELLO_SIZE]>,
    peer: SocketAddr,
    link_mbps: u64,
    cfg: Arc<Config>,
}

impl ConnectState {
    /// Starts `cfg.nstreams` + 1 non-blocking connects to the listener in `handle`:
    /// the data streams, then the inline stream.
    pub fn start(handle: &Handle, link_mbps: u64, cfg: Arc<Config>) -> Result<ConnectState> {
        let conn_id: u64 = rand::random();
        let n = cfg.nstreams + 1;
        let mut socks = Vec::with_capacity(n);
        let mut hello = Vec::with_capacity(n);
        for i in 0..n {
            let s = start_connect(handle.addr)?;
            socks.push((s, Stage::Connecting));
            hello.push(
                Hello {
                    secret: handle.secret,
                    conn_id,
                    stream: i as u16,
                    nstreams: n as u16,
                    max_chunk: cfg.max_chunk as u32,
                }
                .encode(),
            );
        }
        Ok(ConnectState {
            socks,
            hello,
            peer: handle.addr,
            link_mbps,
            cfg,
        })
    }

    /// Advances every stream as far as it goes without blocking. `Ok(true)` when all
    /// streams have sent their hello.
    pub fn progress(&mut self) -> Result<bool> {
        let peer = self.peer;
        for (i, (s, stage)) in self.socks.iter_mut().enumerate() {
            if let Stage::Connecting = stage {
                if !writable(s).map_err(|e| Error::io("poll", e))? {
                    continue;
                }
                if let Some(e) = s.take_error().map_err(|e| Error::io("getsockopt", e))? {
                    return Err(Error::io(format!("connect to {peer}"), e));
                }
                *stage = Stage::Hello(0);
            }
            if let Stage::Hello(done) = stage {
                match s.send_with_flags(&self.hello[i][*done..], libc::MSG_NOSIGNAL) {
                    Ok(k) => *done += k,
                    Err(e)
                        if e.kind() == io::ErrorKind::WouldBlock
                            || e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(Error::io(format!("handshake with {peer}"), e)),
                }
                if *done == HELLO_SIZE {
                    *stage = Stage::Ready;
                }
            }
        }
        if self.socks.iter().all(|(_, st)| matches!(st, Stage::Ready)) {
            return Ok(true);
        }
        // No deadline of our own: NCCL calls connect again until the peer
        // accepts or the job aborts (runtime connect, 2.22+, may start long
        // before the peer accepts). Timeouts apply on the listen side only.
        Ok(false)
    }

    /// Turns a finished connect into a send comm.
    pub fn finish(self) -> Result<SendComm> {
        let socks = self.socks.into_iter().map(|(s, _)| s).collect();
        SendComm::new(socks, self.peer, self.link_mbps, self.cfg)
    }
}
