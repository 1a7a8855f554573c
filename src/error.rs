//! The plugin's one error type. `ffi::error` maps it to `ncclResult_t` in one table.

use std::io;

/// Every failure the plugin can report to NCCL.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// NCCL passed something we cannot accept (null pointer, bad device, n > maxRecvs...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A legal call that breaks the contract at run time, e.g. a message larger than the posted receive.
    #[error("invalid usage: {0}")]
    InvalidUsage(String),
    /// The peer went away, sent something that is not our protocol, or reported an error.
    #[error("remote error: {0}")]
    Remote(String),
    /// An OS call failed for a local reason.
    #[error("{context}: {source}")]
    System {
        context: String,
        #[source]
        source: io::Error,
    },
    /// A CUDA driver call failed (or the driver could not be used at all).
    #[error("CUDA error: {0}")]
    Cuda(String),
    /// A bug or an impossible state inside the plugin.
    #[error("internal error: {0}")]
    Internal(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Classifies an I/O error the way an NCCL user expects to read it: connection
    /// failures are the peer's fault (`Remote`), anything else is local (`System`).
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        use io::ErrorKind::*;
        let context = context.into();
        match source.kind() {
            ConnectionReset | ConnectionAborted | ConnectionRefused | BrokenPipe
            | UnexpectedEof | NotConnected | TimedOut => {
                Error::Remote(format!("{context}: {source}"))
            }
            InvalidInput => Error::Internal(format!("{context}: {source}")),
            _ => Error::System { context, source },
        }
    }

    /// A copy suitable for handing to several waiters (requests of a failed comm).
    pub fn duplicate(&self) -> Self {
        match self {
            Error::InvalidArgument(s) => Error::InvalidArgument(s.clone()),
            Error::InvalidUsage(s) => Error::InvalidUsage(s.clone()),
            Error::Remote(s) => Error::Remote(s.clone()),
            Error::System { context, source } => Error::System {
                context: context.clone(),
                source: io::Error::new(source.kind(), source.to_string()),
            },
            Error::Cuda(s) => Error::Cuda(s.clone()),
            Error::Internal(s) => Error::Internal(s.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_are_classified() {
        let e = Error::io("read", io::Error::from(io::ErrorKind::ConnectionReset));
        assert!(matches!(e, Error::Remote(_)));
        let e = Error::io("read", io::Error::from(io::ErrorKind::UnexpectedEof));
        assert!(matches!(e, Error::Remote(_)));
        let e = Error::io("bind", io::Error::from(io::ErrorKind::AddrInUse));
        assert!(matches!(e, Error::System { .. }));
        assert!(matches!(e.duplicate(), Error::System { .. }));
    }
}
