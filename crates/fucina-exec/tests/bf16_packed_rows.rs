//! `PackedBf16Matrix::row_to_f32`: the packed tiles give back every row of the
//! matrix, widened (subnormals as signed zeros), for shapes with partial panels and
//! depth blocks; bad rows and lengths are errors.

use fucina_exec::{ExecError, PackedBf16Matrix, WeightFormat, WeightMatrix};

/// A fixed sequence of bf16 bit patterns covering normals, zeros of both
/// signs, subnormals, infinities and NaNs.
fn patterns(n: usize) -> Vec<u16> {
    let mut s = 0x2545_f491_4f6c_dd1du64;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            match i % 11 {
                0 => 0x8000,
                1 => 0x0000,
                2 => (s as u16) & 0x807f | 1, // a subnormal
                3 => 0x7f80,
                _ => s as u16,
            }
        })
        .collect()
}

#[test]
fn every_row_comes_back() {
    for (n, k) in [
        (1usize, 1usize),
        (16, 32),
        (17, 33),
        (40, 70),
        (3, 100),
        (48, 576),
    ] {
        let h = patterns(n * k);
        let bytes: Vec<u8> = h.iter().flat_map(|v| v.to_le_bytes()).collect();
        let w =
            PackedBf16Matrix::new(&WeightMatrix::new(WeightFormat::BF16, n, k, &bytes).unwrap())
                .unwrap();
        let mut row = vec![0f32; k];
        for r in 0..n {
            w.row_to_f32(r, &mut row).unwrap();
            for (c, (&got, &want)) in row.iter().zip(&h[r * k..(r + 1) * k]).enumerate() {
                let want = if want & 0x7f80 == 0 {
                    want & 0x8000
                } else {
                    want
                };
                let want = f32::from_bits(u32::from(want) << 16);
                assert_eq!(got.to_bits(), want.to_bits(), "[{n}, {k}] row {r} col {c}");
            }
        }
    }
}

#[test]
fn bad_rows_and_lengths_are_errors() {
    let bytes = vec![0u8; 2 * 5 * 7];
    let w = PackedBf16Matrix::new(&WeightMatrix::new(WeightFormat::BF16, 5, 7, &bytes).unwrap())
        .unwrap();
    let mut row = vec![1f32; 7];
    for (r, len) in [(5usize, 7usize), (0, 6), (0, 8)] {
        let mut out = vec![1f32; len];
        match w.row_to_f32(r, &mut out) {
            Err(ExecError::InvalidArgument { op, .. }) => {
                assert_eq!(op, "PackedBf16Matrix::row_to_f32")
            }
            other => panic!("row {r} into {len}: {other:?}"),
        }
        assert!(out.iter().all(|&v| v == 1.0), "nothing written");
    }
    w.row_to_f32(4, &mut row).unwrap();
    assert_eq!(row, vec![0f32; 7]);
}
