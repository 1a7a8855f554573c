//! Whether NCCL will register GPU buffers through `regMrDmaBuf`.
//!
//! NCCL (`dmaBufSupported` in its `src/init.cc`) uses the plugin's
//! `regMrDmaBuf` for GPU buffers only when all of these hold:
//! `NCCL_DMABUF_ENABLE` is not 0, the plugin has `regMrDmaBuf` (ours always
//! does), the CUDA driver is at least 11.7, and the rank's CUDA device reports
//! `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`. Otherwise it registers GPU buffers
//! with plain `regMr(NCCL_PTR_CUDA)`, which on IB needs a peer-memory module.
//! `getProperties` does not know which GPU the rank uses, so every visible
//! device must report the attribute.
//!
//! libcuda is loaded at run time through cudarc, as everywhere in this crate;
//! every call runs under [`crate::gpu::driver::guarded`].

use std::sync::OnceLock;

/// Whether NCCL reads `NCCL_DMABUF_ENABLE` (the variable's value, `None` when
/// unset) as enabled. NCCL's parameters default to 1 when unset or empty, and
/// are otherwise `strtoll(value, NULL, 0)`, errno only on overflow: a value with
/// no leading number ("no") reads as 0, and "1x" as 1.
pub fn nccl_dmabuf_enable(value: Option<&str>) -> bool {
    let Some(v) = value.filter(|v| !v.is_empty()) else {
        return true;
    };
    !strtoll_is_zero(v)
}

/// Whether C's `strtoll(s, NULL, 0)` returns 0 (an overflow returns a
/// non-zero bound).
fn strtoll_is_zero(s: &str) -> bool {
    let s = s.trim_start_matches([' ', '\t', '\n', '\x0b', '\x0c', '\r']);
    let s = s.strip_prefix(['+', '-']).unwrap_or(s);
    let b = s.as_bytes();
    let digits: &[u8] =
        if b.len() > 2 && b[0] == b'0' && (b[1] | 0x20) == b'x' && b[2].is_ascii_hexdigit() {
            &b[2..]
        } else {
            b
        };
    let hex = digits.len() != b.len();
    let octal = !hex && b.first() == Some(&b'0');
    digits
        .iter()
        .take_while(|c| {
            if hex {
                c.is_ascii_hexdigit()
            } else if octal {
                (b'0'..=b'7').contains(c)
            } else {
                c.is_ascii_digit()
            }
        })
        .all(|&c| c == b'0')
}

/// `Ok` when NCCL will register this process's GPU buffers through
/// `regMrDmaBuf`, else why not. Probed once per process.
pub fn nccl_uses_dmabuf() -> Result<(), String> {
    static ANSWER: OnceLock<Result<(), String>> = OnceLock::new();
    ANSWER
        .get_or_init(|| {
            if !crate::config::current().nccl_dmabuf_enable {
                return Err("NCCL_DMABUF_ENABLE=0".into());
            }
            cuda_devices_export_dmabuf()
        })
        .clone()
}

/// `Ok` when the CUDA driver is at least 11.7 and every visible device reports
/// `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`.
fn cuda_devices_export_dmabuf() -> Result<(), String> {
    use cudarc::driver::{result, sys};
    crate::gpu::driver::driver_library_present().map_err(|u| u.to_string())?;
    crate::gpu::driver::guarded("DMA-BUF support query", || {
        result::init().map_err(|e| format!("cuInit: {e}"))?;
        let mut version = 0i32;
        // SAFETY: plain query with a valid out pointer.
        unsafe { sys::cuDriverGetVersion(&mut version) }
            .result()
            .map_err(|e| format!("cuDriverGetVersion: {e}"))?;
        if version < 11070 {
            return Err(format!("CUDA driver {version} is older than 11.7"));
        }
        let n = result::device::get_count().map_err(|e| format!("cuDeviceGetCount: {e}"))?;
        if n == 0 {
            return Err("no CUDA device".into());
        }
        for i in 0..n {
            let dev = result::device::get(i).map_err(|e| format!("cuDeviceGet({i}): {e}"))?;
            // SAFETY: `dev` came from cuDeviceGet. A driver that does not know
            // the attribute fails the call: not supported, as NCCL reads it.
            let flag = unsafe {
                result::device::get_attribute(
                    dev,
                    sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
                )
            }
            .unwrap_or(0);
            if flag == 0 {
                return Err(format!(
                    "CUDA device {i} does not report CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED"
                ));
            }
        }
        Ok(())
    })
    .map_err(|u| u.to_string())?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dmabuf_enable_reads_the_value_as_nccl_does() {
        // Unset or empty: NCCL's default, 1.
        assert!(nccl_dmabuf_enable(None));
        assert!(nccl_dmabuf_enable(Some("")));
        for off in [
            "0", "00", "0x0", "-0", " 0", "+0", "0 ", "no", "x", " ", "08", "0x",
        ] {
            assert!(!nccl_dmabuf_enable(Some(off)), "{off:?} reads as 0");
        }
        for on in [
            "1",
            "2",
            "-1",
            "0x10",
            "010",
            "1x",
            " 1",
            "99999999999999999999",
        ] {
            assert!(nccl_dmabuf_enable(Some(on)), "{on:?} reads as non-zero");
        }
    }

    #[test]
    fn without_a_cuda_driver_nccl_uses_no_dmabuf() {
        if crate::gpu::driver::driver_library_present().is_err() {
            let why = nccl_uses_dmabuf().unwrap_err();
            assert!(
                why.contains("NCCL_DMABUF_ENABLE") || why.contains("CUDA driver"),
                "{why}"
            );
        }
    }
}
