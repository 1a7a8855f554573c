//! The one table from internal errors to NCCL result codes.

use super::abi::ncclResult_t;
use crate::error::Error;

pub fn to_nccl(e: &Error) -> ncclResult_t {
    match e {
        Error::InvalidArgument(_) => ncclResult_t::ncclInvalidArgument,
        Error::InvalidUsage(_) => ncclResult_t::ncclInvalidUsage,
        Error::Remote(_) => ncclResult_t::ncclRemoteError,
        Error::System { .. } => ncclResult_t::ncclSystemError,
        Error::Cuda(_) => ncclResult_t::ncclUnhandledCudaError,
        Error::Internal(_) => ncclResult_t::ncclInternalError,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_total_and_distinct() {
        let all = [
            Error::InvalidArgument("a".into()),
            Error::InvalidUsage("b".into()),
            Error::Remote("c".into()),
            Error::System {
                context: "d".into(),
                source: std::io::Error::other("x"),
            },
            Error::Internal("e".into()),
            Error::Cuda("f".into()),
        ];
        let codes: Vec<u32> = all.iter().map(|e| to_nccl(e) as u32).collect();
        assert_eq!(codes, vec![4, 5, 6, 2, 3, 1]);
    }
}
