//! The IDX format of MNIST-style data sets, plain or gzip-compressed, and the
//! labelled image sets built from a pair of IDX files.
//!
//! An IDX file is a 4-byte magic number — two zero bytes, an element-type code
//! (`0x08` for unsigned bytes, the only type such image sets use) and the
//! number of dimensions — then each dimension as a big-endian `u32`, then the
//! elements in row-major order. Nothing may follow them.

use std::io::Read as _;
use std::ops::Range;
use std::path::Path;

use super::data_err;
use crate::{Error, Result};

/// The element-type code of unsigned bytes, the one element type read.
pub const IDX_U8: u8 = 0x08;

/// The contents of an IDX file of unsigned bytes: its dimensions and its
/// elements (`dims.iter().product()` of them, row-major).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Idx {
    /// The dimensions (for MNIST images `[count, rows, cols]`, for labels
    /// `[count]`).
    pub dims: Vec<usize>,
    /// The elements, row-major.
    pub data: Vec<u8>,
}

/// Reads an IDX file of unsigned bytes, gzip-compressed (recognised by its
/// first two bytes, `1f 8b`) or not.
///
/// # Errors
/// [`Error::Data`] naming the file if it cannot be read, is a truncated or
/// corrupt gzip stream, or is not a well-formed IDX file (see [`parse_idx`]).
pub fn read_idx(path: impl AsRef<Path>) -> Result<Idx> {
    let path = path.as_ref();
    let raw = std::fs::read(path).map_err(|e| data_err(path, format!("cannot open: {e}")))?;
    if raw.starts_with(&[0x1f, 0x8b]) {
        let mut bytes = Vec::new();
        flate2::read::GzDecoder::new(raw.as_slice())
            .read_to_end(&mut bytes)
            .map_err(|e| data_err(path, format!("not a readable gzip-compressed file: {e}")))?;
        parse_idx(path, &bytes)
    } else {
        parse_idx(path, &raw)
    }
}

/// Parses the (decompressed) bytes of an IDX file of unsigned bytes; `path`
/// names the file in errors.
///
/// # Errors
/// [`Error::Data`] naming `path` and the problem: fewer than 4 bytes, a magic
/// number whose first two bytes are not zero, an element type other than
/// unsigned bytes (`0x08`), zero dimensions, a header cut short, a product of
/// dimensions that overflows, or an element count different from the product
/// of the dimensions (a truncated file, or bytes after the last element).
pub fn parse_idx(path: impl AsRef<Path>, bytes: &[u8]) -> Result<Idx> {
    let path = path.as_ref();
    let err = |reason: String| data_err(path, reason);
    if bytes.len() < 4 {
        return Err(err(format!(
            "truncated IDX file: {} bytes, the magic number alone takes 4",
            bytes.len()
        )));
    }
    let magic = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    if bytes[0] != 0 || bytes[1] != 0 {
        return Err(err(format!(
            "not an IDX file: magic number 0x{magic:08x} does not start with two zero bytes"
        )));
    }
    if bytes[2] != IDX_U8 {
        return Err(err(format!(
            "IDX element type 0x{:02x} (magic 0x{magic:08x}) is not supported: only unsigned bytes (0x08)",
            bytes[2]
        )));
    }
    let rank = usize::from(bytes[3]);
    if rank == 0 {
        return Err(err("IDX magic number declares zero dimensions".into()));
    }
    let header = 4 + 4 * rank;
    if bytes.len() < header {
        return Err(err(format!(
            "truncated IDX header: {rank} dimensions need {header} bytes, the file has {}",
            bytes.len()
        )));
    }
    let dims: Vec<usize> = bytes[4..header]
        .chunks_exact(4)
        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as usize)
        .collect();
    let numel = dims
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| {
            err(format!(
                "IDX dimensions {dims:?}: the element count overflows"
            ))
        })?;
    let body = bytes.len() - header;
    if body != numel {
        let what = if body < numel {
            "truncated"
        } else {
            "trailing bytes"
        };
        return Err(err(format!(
            "{what}: IDX dimensions {dims:?} hold {numel} bytes, the file has {body} after its {header}-byte header"
        )));
    }
    Ok(Idx {
        dims,
        data: bytes[header..].to_vec(),
    })
}

/// Labelled greyscale images in memory: `images` holds `len() * rows * cols`
/// pixels scaled from 0..=255 to `[0, 1]` (row-major, one image after the
/// other), `labels` one class per image.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ImageSet {
    /// The pixels, `rows * cols` per image, in `[0, 1]`.
    pub images: Vec<f32>,
    /// The labels, one per image.
    pub labels: Vec<i64>,
    /// Image height.
    pub rows: usize,
    /// Image width.
    pub cols: usize,
}

impl ImageSet {
    /// The number of images.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there are no images.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Pixels per image (`rows * cols`).
    pub fn pixels(&self) -> usize {
        self.rows * self.cols
    }

    /// The images at `range` (a copy), e.g. a short slice for a quick run.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `range` is empty or reaches past the end.
    pub fn slice(&self, range: Range<usize>) -> Result<ImageSet> {
        if range.start >= range.end || range.end > self.len() {
            return Err(Error::invalid(
                "ImageSet::slice",
                format!(
                    "range {range:?} is empty or outside the {} images",
                    self.len()
                ),
            ));
        }
        let p = self.pixels();
        Ok(ImageSet {
            images: self.images[range.start * p..range.end * p].to_vec(),
            labels: self.labels[range.clone()].to_vec(),
            rows: self.rows,
            cols: self.cols,
        })
    }
}

/// Reads a pair of IDX files — images `[count, rows, cols]` and labels
/// `[count]`, unsigned bytes, gzip-compressed or not — into an [`ImageSet`]
/// whose labels are all below `classes`.
///
/// # Errors
/// [`Error::Data`] naming the file and the problem: the errors of
/// [`read_idx`], an image file whose rank is not 3, a label file whose rank
/// is not 1, a label count different from the image count, a label of
/// `classes` or more, or no image at all.
pub fn load_idx_images(
    images: impl AsRef<Path>,
    labels: impl AsRef<Path>,
    classes: usize,
) -> Result<ImageSet> {
    let (ipath, lpath) = (images.as_ref(), labels.as_ref());
    let img = read_idx(ipath)?;
    let lab = read_idx(lpath)?;
    image_set(ipath, img, lpath, lab, classes)
}

/// [`load_idx_images`] on parsed files (`ipath` and `lpath` name them in errors).
pub(crate) fn image_set(
    ipath: &Path,
    img: Idx,
    lpath: &Path,
    lab: Idx,
    classes: usize,
) -> Result<ImageSet> {
    let [count, rows, cols] = img.dims[..] else {
        return Err(data_err(
            ipath,
            format!(
                "an image file has 3 dimensions [count, rows, cols], this one has {:?}",
                img.dims
            ),
        ));
    };
    let [nlabels] = lab.dims[..] else {
        return Err(data_err(
            lpath,
            format!(
                "a label file has 1 dimension [count], this one has {:?}",
                lab.dims
            ),
        ));
    };
    if nlabels != count {
        return Err(data_err(
            lpath,
            format!(
                "{nlabels} labels for the {count} images of {}",
                ipath.display()
            ),
        ));
    }
    if count == 0 || rows == 0 || cols == 0 {
        return Err(data_err(
            ipath,
            format!("holds no image (dimensions {:?})", img.dims),
        ));
    }
    if let Some((i, &l)) = lab
        .data
        .iter()
        .enumerate()
        .find(|&(_, &l)| usize::from(l) >= classes)
    {
        return Err(data_err(
            lpath,
            format!(
                "label {i} is {l}, outside the {classes} classes 0..={}",
                classes - 1
            ),
        ));
    }
    Ok(ImageSet {
        images: img.data.iter().map(|&p| f32::from(p) / 255.0).collect(),
        labels: lab.data.iter().map(|&l| i64::from(l)).collect(),
        rows,
        cols,
    })
}

/// Where Debian's `dataset-fashion-mnist` package installs Fashion-MNIST.
pub const FASHION_MNIST_DIR: &str = "/usr/share/datasets/fashion-mnist";

/// The ten classes of Fashion-MNIST, by label.
pub const FASHION_MNIST_CLASSES: [&str; 10] = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
];

/// The four file names of an MNIST-style directory: training images and
/// labels, test images and labels.
pub const MNIST_FILES: [&str; 4] = [
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
];

/// Reads an MNIST-style directory (the four [`MNIST_FILES`], ten classes) such
/// as Fashion-MNIST's ([`FASHION_MNIST_DIR`]): the training set and the test
/// set.
///
/// # Errors
/// [`Error::Data`] naming the first missing file (and saying that
/// `apt-get install dataset-fashion-mnist` provides them), or the errors of
/// [`load_idx_images`]; a test set whose image size differs from the
/// training set's.
pub fn load_mnist_dir(dir: impl AsRef<Path>) -> Result<(ImageSet, ImageSet)> {
    let dir = dir.as_ref();
    let paths = MNIST_FILES.map(|f| dir.join(f));
    if let Some(p) = paths.iter().find(|p| !p.is_file()) {
        return Err(data_err(
            p,
            "not found (Fashion-MNIST comes with Debian's package: `apt-get install dataset-fashion-mnist`)",
        ));
    }
    let train = load_idx_images(&paths[0], &paths[1], 10)?;
    let test = load_idx_images(&paths[2], &paths[3], 10)?;
    if (test.rows, test.cols) != (train.rows, train.cols) {
        return Err(data_err(
            &paths[2],
            format!(
                "images of {}x{}, the training images are {}x{}",
                test.rows, test.cols, train.rows, train.cols
            ),
        ));
    }
    Ok((train, test))
}
