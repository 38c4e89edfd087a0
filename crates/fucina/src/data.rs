//! Data sets and their loading: the 1,797 8x8 handwritten digits shipped with
//! fucina (`data/digits/`, BSD-3) used by the `train_digits` examples, the IDX
//! format of MNIST-style sets ([`read_idx`], [`load_idx_images`],
//! [`load_mnist_dir`] for Fashion-MNIST), gzip-compressed files in general, and
//! the [`DataLoader`]: seeded shuffling per epoch, mini-batches in pooled
//! tensors, the next batch prefetched on the context's one-shot worker.
//!
//! ```
//! let d = fucina::data::load_digits(fucina::data::digits_path())?;
//! assert_eq!(d.len(), 1797);
//! assert_eq!(d.x.len(), 1797 * fucina::data::DIGITS_PIXELS);
//! # Ok::<(), fucina::Error>(())
//! ```

use std::io::Read as _;
use std::path::Path;

use crate::{Error, Result};

mod idx;
mod loader;

pub use idx::{
    FASHION_MNIST_CLASSES, FASHION_MNIST_DIR, IDX_U8, Idx, ImageSet, MNIST_FILES, load_idx_images,
    load_mnist_dir, parse_idx, read_idx,
};
pub use loader::{Batch, DataLoader, MAX_SAMPLE_RANK};

/// Pixels per digit image (8x8, row-major).
pub const DIGITS_PIXELS: usize = 64;

/// The digits data set in memory: `x` holds `len() * DIGITS_PIXELS` pixels
/// scaled to `[0, 1]`, `y` the labels (0..=9).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Digits {
    /// The pixels, `DIGITS_PIXELS` per image, scaled from 0..=16 to `[0, 1]`.
    pub x: Vec<f32>,
    /// The labels, one per image.
    pub y: Vec<i64>,
}

impl Digits {
    /// The number of images.
    pub fn len(&self) -> usize {
        self.y.len()
    }

    /// Whether there are no images.
    pub fn is_empty(&self) -> bool {
        self.y.is_empty()
    }

    /// The images at `indices`, in that order.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the first index that is negative or
    /// not below [`len`](Digits::len).
    pub fn subset(&self, indices: &[i64]) -> Result<Digits> {
        let mut s = Digits {
            x: Vec::with_capacity(indices.len() * DIGITS_PIXELS),
            y: Vec::with_capacity(indices.len()),
        };
        for &i in indices {
            let k = usize::try_from(i)
                .ok()
                .filter(|&k| k < self.len())
                .ok_or_else(|| {
                    Error::invalid(
                        "Digits::subset",
                        format!("index {i} is out of range for {} images", self.len()),
                    )
                })?;
            s.x.extend_from_slice(&self.x[k * DIGITS_PIXELS..(k + 1) * DIGITS_PIXELS]);
            s.y.push(self.y[k]);
        }
        Ok(s)
    }

    /// A seeded split into `(train, test)`: a permutation of the images drawn
    /// from `sub_seed(seed, 0)` (see [`crate::nn::sub_seed`]); its first `test`
    /// images are the test set, the rest the training set, so a seed names
    /// the same split in every program (`train_digits` and the distributed
    /// example hold out the same 360 images).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unless `test` leaves at least one training
    /// image.
    pub fn split(&self, seed: u64, test: usize) -> Result<(Digits, Digits)> {
        if test >= self.len() {
            return Err(Error::invalid(
                "Digits::split",
                format!(
                    "{test} test images leave none of {} to train on",
                    self.len()
                ),
            ));
        }
        let mut perm = vec![0i64; self.len()];
        crate::rng::randperm_fill(crate::nn::sub_seed(seed, 0), &mut perm);
        Ok((self.subset(&perm[test..])?, self.subset(&perm[..test])?))
    }
}

/// The path of the digits file shipped in the `fucina` crate
/// (`data/digits/digits.csv.gz`).
pub fn digits_path() -> &'static str {
    concat!(env!("CARGO_MANIFEST_DIR"), "/data/digits/digits.csv.gz")
}

/// An [`Error::Data`] naming `path`.
pub(crate) fn data_err(path: &Path, reason: impl Into<String>) -> Error {
    Error::Data {
        path: path.display().to_string(),
        reason: reason.into(),
    }
}

/// The decompressed bytes of a gzip-compressed file.
///
/// # Errors
/// [`Error::Data`] naming the file if it cannot be opened or is not a readable
/// gzip stream (truncated, corrupt, or not gzip at all).
pub fn read_gzip(path: impl AsRef<Path>) -> Result<Vec<u8>> {
    let path = path.as_ref();
    let file =
        std::fs::File::open(path).map_err(|e| data_err(path, format!("cannot open: {e}")))?;
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(file)
        .read_to_end(&mut bytes)
        .map_err(|e| data_err(path, format!("not a readable gzip-compressed file: {e}")))?;
    Ok(bytes)
}

/// Reads a gzip-compressed digits CSV: one image per line, 64 pixel values
/// (integers 0..=16) then the label (0..=9); blank lines are skipped.
///
/// # Errors
/// [`Error::Data`] naming the file (and the line and field) if it cannot be read
/// (see [`read_gzip`]), is not text, holds a line with the wrong number of
/// fields, a field that is not a number, or a pixel or label out of range, or
/// holds no image at all (an empty or blank file).
pub fn load_digits(path: impl AsRef<Path>) -> Result<Digits> {
    let path = path.as_ref();
    let bytes = read_gzip(path)?;
    let text = std::str::from_utf8(&bytes).map_err(|e| {
        data_err(
            path,
            format!("not a readable gzip-compressed text file: {e}"),
        )
    })?;
    let mut d = Digits::default();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let fields: Vec<&str> = line.split(',').collect();
        if fields.len() != DIGITS_PIXELS + 1 {
            return Err(data_err(
                path,
                format!(
                    "line {}: {} fields, expected {}",
                    i + 1,
                    fields.len(),
                    DIGITS_PIXELS + 1
                ),
            ));
        }
        for (j, f) in fields.iter().enumerate() {
            let v: f32 = f.trim().parse().map_err(|_| {
                data_err(
                    path,
                    format!("line {}, field {}: {f:?} is not a number", i + 1, j + 1),
                )
            })?;
            let (max, what) = if j < DIGITS_PIXELS {
                (16.0, "pixel")
            } else {
                (9.0, "label")
            };
            if !(0.0..=max).contains(&v) || v.fract() != 0.0 {
                return Err(data_err(
                    path,
                    format!(
                        "line {}, field {}: {what} {v} is not an integer in 0..={max}",
                        i + 1,
                        j + 1
                    ),
                ));
            }
            if j < DIGITS_PIXELS {
                d.x.push(v / 16.0);
            } else {
                d.y.push(v as i64);
            }
        }
    }
    if d.is_empty() {
        return Err(data_err(
            path,
            "holds no images (the file is empty or blank)",
        ));
    }
    Ok(d)
}
