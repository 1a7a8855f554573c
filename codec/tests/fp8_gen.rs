//! The fp8 test-data generator (`common::to_fp8`) that the benchmark's fp8 classes use:
//! every finite code round-trips, midpoints round to the even code, and values past
//! the largest finite one saturate.
#[path = "common/mod.rs"]
mod common;
use common::to_fp8;

/// Value of a non-negative fp8 code (finite codes only).
fn value(c: u8, e4m3: bool) -> f64 {
    let (mbits, bias) = if e4m3 { (3, 7) } else { (2, 15) };
    let e = (c >> mbits) as i32;
    let m = (c & ((1 << mbits) - 1)) as f64 / (1 << mbits) as f64;
    if e == 0 {
        m * 2f64.powi(1 - bias)
    } else {
        (1.0 + m) * 2f64.powi(e - bias)
    }
}

#[test]
fn fp8_codes_round_trip_ties_to_even_and_saturate() {
    for (e4m3, top, max) in [(true, 0x7Eu8, 448.0), (false, 0x7Bu8, 57344.0)] {
        assert_eq!(value(top, e4m3), max);
        for c in 0..=top {
            let v = value(c, e4m3);
            assert_eq!(to_fp8(v, e4m3), c, "e4m3={e4m3} code {c:#x}");
            assert_eq!(to_fp8(-v, e4m3), 0x80 | c, "e4m3={e4m3} code -{c:#x}");
            if c < top {
                let mid = (v + value(c + 1, e4m3)) / 2.0;
                let even = if c & 1 == 0 { c } else { c + 1 };
                assert_eq!(to_fp8(mid, e4m3), even, "e4m3={e4m3} midpoint above {c:#x}");
            }
        }
        assert_eq!(to_fp8(max * 4.0, e4m3), top);
        assert_eq!(to_fp8(-max * 4.0, e4m3), 0x80 | top);
    }
    // Known encodings: 1.0, 0.5, the smallest subnormal.
    assert_eq!(to_fp8(1.0, true), 0x38);
    assert_eq!(to_fp8(0.5, false), 0x38);
    assert_eq!(to_fp8(2f64.powi(-9), true), 0x01);
    assert_eq!(to_fp8(2f64.powi(-16), false), 0x01);
}
