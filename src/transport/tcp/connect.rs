//! Non-blocking, resumable connect. NCCL calls `connect` again and again with the
//! same handle until it returns a comm; our progress lives in a [`ConnectState`]
//! whose address we keep in the handle's stage area. Its stages (connect, then
//! the inline stream's hello; no reply) are the shared bootstrap's
//! (`proto::bootstrap::Dialer`).

use std::net::SocketAddr;
use std::sync::Arc;

use socket2::Socket;

use super::send::SendComm;
use super::sock::start_connect;
use crate::config::Config;
use crate::error::Result;
use crate::proto::bootstrap::Dialer;
use crate::proto::wire::{Handle, Hello, PeerInfo, HELLO_SIZE};
use crate::transport::boot::dial;

pub struct ConnectState {
    sock: Socket,
    dialer: Dialer,
    target: Target,
    link_mbps: u64,
    cfg: Arc<Config>,
}

/// Where a send comm opens its data streams later, and what they present.
#[derive(Clone, Copy, Debug)]
pub struct Target {
    pub peer: SocketAddr,
    pub secret: u64,
    pub conn_id: u64,
    /// Streams of the connection, the inline stream included (the hello's count).
    pub nstreams: u16,
    pub max_chunk: u32,
    /// The codec frame format this connection writes, at most (agreed from the
    /// handle: `codec_glue::agree_format`), stated in every stream's hello.
    pub format: u8,
}

impl Target {
    /// The hello of stream `stream` (the last index is the inline stream).
    pub fn hello(&self, stream: usize) -> [u8; HELLO_SIZE] {
        Hello {
            secret: self.secret,
            conn_id: self.conn_id,
            stream: stream as u16,
            nstreams: self.nstreams,
            max_chunk: self.max_chunk,
        }
        .encode_with(PeerInfo {
            format: self.format as u16,
            ..PeerInfo::ours()
        })
    }
}

impl ConnectState {
    /// Starts a non-blocking connect of the inline stream to the listener in
    /// `handle`. The data streams (`cfg.nstreams`) are opened later, on demand, by
    /// the send comm.
    pub fn start(handle: &Handle, link_mbps: u64, cfg: Arc<Config>) -> Result<ConnectState> {
        let target = Target {
            peer: handle.addr,
            secret: handle.secret,
            conn_id: rand::random(),
            nstreams: (cfg.nstreams + 1) as u16,
            max_chunk: cfg.max_chunk as u32,
            format: crate::codec_glue::agree_format(cfg.format, handle.decodes),
        };
        Ok(ConnectState {
            sock: start_connect(handle.addr)?,
            dialer: Dialer::new(target.hello(cfg.nstreams).to_vec(), None),
            target,
            link_mbps,
            cfg,
        })
    }

    /// Advances the connect as far as it goes without blocking. `Ok(true)` once
    /// the inline stream has sent its hello.
    pub fn progress(&mut self) -> Result<bool> {
        // No deadline of our own: NCCL calls connect again until the peer
        // accepts or the job aborts (runtime connect, 2.22+, may start long
        // before the peer accepts). Timeouts apply on the listen side only.
        dial(&self.sock, &mut self.dialer, self.target.peer)
    }

    /// Turns a finished connect into a send comm.
    pub fn finish(self) -> Result<SendComm> {
        SendComm::new(self.sock, self.target, self.link_mbps, self.cfg)
    }
}
