//! `fucina::data`: the IDX reader (valid files, and every way of corrupting one
//! is an `Err` naming the file, never a panic) and the `DataLoader` (seeded
//! order per epoch, ragged or dropped last batch, prefetch giving the same
//! batches, no heap allocation per step at steady state).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use fucina::data::{DataLoader, Idx, load_idx_images, load_mnist_dir, parse_idx, read_idx};
use fucina::{Error, ExecContext};

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static COUNTED: Cell<bool> = const { Cell::new(false) };
}

// SAFETY: every method forwards to the system allocator with the caller's
// arguments unchanged; the counter has no effect on the memory handed out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTED.with(Cell::get) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTED.with(Cell::get) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller upholds `GlobalAlloc::realloc`'s contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The bytes of an IDX file of unsigned bytes.
fn idx_bytes(dims: &[u32], data: &[u8]) -> Vec<u8> {
    let mut b = vec![0, 0, 0x08, dims.len() as u8];
    for d in dims {
        b.extend_from_slice(&d.to_be_bytes());
    }
    b.extend_from_slice(data);
    b
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fucina-data-loader-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn write(name: &str, bytes: &[u8]) -> PathBuf {
    let p = tmp(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn data_error(r: fucina::Result<impl std::fmt::Debug>) -> (String, String) {
    match r {
        Err(Error::Data { path, reason }) => (path, reason),
        other => panic!("expected Error::Data, got {other:?}"),
    }
}

/// Three 2x3 images with labels 0, 1, 2.
fn small_set() -> (Vec<u8>, Vec<u8>) {
    let pixels: Vec<u8> = (0..18).map(|i| (i * 15) as u8).collect();
    (idx_bytes(&[3, 2, 3], &pixels), idx_bytes(&[3], &[0, 1, 2]))
}

#[test]
fn idx_reads_plain_and_gzip_files() {
    let (img, lab) = small_set();
    let plain = write("plain.idx", &img);
    let gz = write("img.gz", &gzip(&img));
    let want = Idx {
        dims: vec![3, 2, 3],
        data: (0..18).map(|i| (i * 15) as u8).collect(),
    };
    assert_eq!(read_idx(&plain).unwrap(), want);
    assert_eq!(read_idx(&gz).unwrap(), want);
    let lab = write("lab.gz", &gzip(&lab));
    let set = load_idx_images(&gz, &lab, 10).unwrap();
    assert_eq!((set.len(), set.rows, set.cols, set.pixels()), (3, 2, 3, 6));
    assert_eq!(set.labels, [0, 1, 2]);
    assert_eq!(set.images[1], 15.0 / 255.0);
    assert_eq!(set.images[17], 1.0);
    let s = set.slice(1..3).unwrap();
    assert_eq!(s.labels, [1, 2]);
    assert_eq!(s.images[..], set.images[6..]);
    assert!(set.slice(2..2).is_err() && set.slice(0..4).is_err());
}

#[test]
fn idx_named_problems_are_errors_naming_the_file() {
    let p = Path::new("/some/where/x.idx");
    let cases: &[(&[u8], &str)] = &[
        (&[0, 0], "truncated IDX file: 2 bytes"),
        (&[1, 0, 8, 1, 0, 0, 0, 0], "magic number 0x01000801"),
        (
            &[0, 0, 0x0d, 1, 0, 0, 0, 1, 0, 0, 0, 0],
            "element type 0x0d",
        ),
        (&[0, 0, 8, 0], "zero dimensions"),
        (
            &[0, 0, 8, 2, 0, 0, 0, 1],
            "truncated IDX header: 2 dimensions need 12 bytes",
        ),
        (
            &[0, 0, 8, 2, 0, 0, 0, 2, 0, 0, 0, 3, 1, 2, 3],
            "truncated: IDX dimensions [2, 3] hold 6 bytes, the file has 3",
        ),
        (
            &[0, 0, 8, 1, 0, 0, 0, 1, 7, 7],
            "trailing bytes: IDX dimensions [1] hold 1 bytes, the file has 2",
        ),
    ];
    for (bytes, want) in cases {
        let (path, reason) = data_error(parse_idx(p, bytes));
        assert_eq!(path, "/some/where/x.idx");
        assert!(reason.contains(want), "{reason:?} lacks {want:?}");
    }
    // Label count differs from image count; a label outside the classes;
    // wrong ranks.
    let (img, _) = small_set();
    let img = write("img3.idx", &img);
    let two = write("lab2.idx", &idx_bytes(&[2], &[0, 1]));
    let (path, reason) = data_error(load_idx_images(&img, &two, 10));
    assert_eq!(path, two.display().to_string());
    assert!(reason.contains("2 labels for the 3 images"), "{reason}");
    let big = write("lab_big.idx", &idx_bytes(&[3], &[0, 10, 1]));
    let (path, reason) = data_error(load_idx_images(&img, &big, 10));
    assert_eq!(path, big.display().to_string());
    assert!(reason.contains("label 1 is 10"), "{reason}");
    let (path, reason) = data_error(load_idx_images(&two, &two, 10));
    assert_eq!(path, two.display().to_string());
    assert!(reason.contains("3 dimensions"), "{reason}");
    let (_, reason) = data_error(load_idx_images(&img, &img, 10));
    assert!(reason.contains("1 dimension"), "{reason}");
    // A missing file, a corrupt gzip stream.
    let (_, reason) = data_error(read_idx(tmp("absent.idx")));
    assert!(reason.contains("cannot open"), "{reason}");
    let mut gz = gzip(&idx_bytes(&[4], &[1, 2, 3, 4]));
    let n = gz.len();
    gz.truncate(n - 6);
    let (_, reason) = data_error(read_idx(write("cut.gz", &gz)));
    assert!(reason.contains("gzip"), "{reason}");
    // A directory without the files names the first one and the package.
    let (path, reason) = data_error(load_mnist_dir(tmp("")));
    assert!(path.ends_with("train-images-idx3-ubyte.gz"), "{path}");
    assert!(
        reason.contains("apt-get install dataset-fashion-mnist"),
        "{reason}"
    );
}

/// splitmix64, for the corruptions below.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[test]
fn corrupted_idx_bytes_never_panic_and_never_pass_inconsistent_data() {
    let (img, lab) = small_set();
    let gz_img = gzip(&img);
    let lab_path = write("fuzz_lab.idx", &lab);
    let mut errors = 0;
    for case in 0..600u64 {
        let r = mix(case);
        let (base, zipped) = if case % 2 == 0 {
            (&img, false)
        } else {
            (&gz_img, true)
        };
        let mut bytes = base.clone();
        match r % 4 {
            // Truncate anywhere.
            0 => bytes.truncate((mix(r) % bytes.len() as u64) as usize),
            // Flip one byte anywhere (most often in the header).
            1 => {
                let at = (mix(r) % (bytes.len() as u64).min(if r & 8 == 0 { 16 } else { 1 << 20 }))
                    as usize;
                bytes[at] ^= (mix(r ^ 1) % 255 + 1) as u8;
            }
            // Append garbage.
            2 => bytes.extend((0..1 + r % 5).map(|k| mix(r + k) as u8)),
            // Overwrite several bytes.
            _ => {
                for k in 0..1 + r % 4 {
                    let at = (mix(r + k) % bytes.len() as u64) as usize;
                    bytes[at] = mix(r ^ k) as u8;
                }
            }
        }
        let path = write(&format!("fuzz{case}.idx"), &bytes);
        match read_idx(&path) {
            Ok(idx) => {
                assert_eq!(idx.dims.iter().product::<usize>(), idx.data.len());
                if !zipped {
                    assert_eq!(4 + 4 * idx.dims.len() + idx.data.len(), bytes.len());
                }
                // A well-formed file with other dimensions is still refused
                // by the image-set reader unless it fits the labels.
                if let Ok(set) = load_idx_images(&path, &lab_path, 256) {
                    assert_eq!(set.len(), 3);
                    assert_eq!(set.images.len(), 3 * set.pixels());
                }
            }
            Err(Error::Data { path: p, .. }) => {
                assert_eq!(p, path.display().to_string());
                errors += 1;
            }
            Err(e) => panic!("case {case}: unexpected error kind {e:?}"),
        }
        std::fs::remove_file(&path).unwrap();
    }
    assert!(
        errors > 400,
        "only {errors} of 600 corruptions were refused"
    );
}

#[test]
fn fashion_mnist_loads_when_installed() {
    let dir = Path::new(fucina::data::FASHION_MNIST_DIR);
    if !dir.join(fucina::data::MNIST_FILES[0]).is_file() {
        eprintln!(
            "skipped: Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)"
        );
        return;
    }
    let (train, test) = load_mnist_dir(dir).unwrap();
    assert_eq!((train.len(), test.len()), (60_000, 10_000));
    assert_eq!((train.rows, train.cols), (28, 28));
    assert_eq!(train.images.len(), 60_000 * 784);
    let mut counts = [0usize; 10];
    for &l in &train.labels {
        counts[l as usize] += 1;
    }
    assert_eq!(counts, [6000; 10]);
    assert!(train.images.iter().all(|p| (0.0..=1.0).contains(p)));
}

fn epoch_batches(
    loader: &mut DataLoader<'_>,
    ctx: &ExecContext,
    epoch: u64,
) -> Vec<(Vec<f32>, Vec<i64>)> {
    let mut out = Vec::new();
    loader
        .for_each_batch(ctx, epoch, |b| {
            assert_eq!(b.index, out.len());
            assert_eq!(b.x.shape()[0], b.len());
            out.push((b.x.to_vec(), b.y.to_vec()));
            Ok(())
        })
        .unwrap();
    out
}

#[test]
fn loader_orders_batches_by_seed_and_epoch() {
    let ctx = ExecContext::new();
    let n = 23;
    let x: Vec<f32> = (0..n * 6).map(|i| i as f32).collect();
    let y: Vec<i64> = (0..n as i64).collect();
    let mut plain = DataLoader::new(&x, &y, &[2, 3], 5).unwrap();
    assert_eq!(plain.batches_per_epoch(), 5);
    let b = epoch_batches(&mut plain, &ctx, 0);
    assert_eq!(b.len(), 5);
    assert_eq!(b[4].1, [20, 21, 22]); // the ragged last batch
    assert_eq!(b[0].1, [0, 1, 2, 3, 4]);
    assert_eq!(b[1].0[..6], [30., 31., 32., 33., 34., 35.]);
    // Every sample's values travel with its label.
    let mut sh = DataLoader::new(&x, &y, &[2, 3], 5).unwrap().shuffle(9);
    let e0 = epoch_batches(&mut sh, &ctx, 0);
    for (xs, ys) in &e0 {
        for (k, &l) in ys.iter().enumerate() {
            let want: Vec<f32> = (0..6).map(|j| (l * 6 + j) as f32).collect();
            assert_eq!(xs[k * 6..(k + 1) * 6], want[..]);
        }
    }
    let mut all: Vec<i64> = e0.iter().flat_map(|b| b.1.clone()).collect();
    assert_ne!(all, y, "a shuffled epoch is not the stored order");
    all.sort();
    assert_eq!(all, y);
    // Same (seed, epoch): same batches, whatever ran before; another epoch or
    // seed: another order. The order is the documented permutation.
    let e1 = epoch_batches(&mut sh, &ctx, 1);
    assert_ne!(e0, e1);
    assert_eq!(epoch_batches(&mut sh, &ctx, 0), e0);
    let mut fresh = DataLoader::new(&x, &y, &[2, 3], 5).unwrap().shuffle(9);
    assert_eq!(epoch_batches(&mut fresh, &ctx, 1), e1);
    let mut perm = vec![0i64; n];
    fucina::rng::randperm_fill(fucina::nn::sub_seed(9, 1), &mut perm);
    assert_eq!(fresh.epoch_order(1), perm);
    let mut other = DataLoader::new(&x, &y, &[2, 3], 5).unwrap().shuffle(10);
    assert_ne!(epoch_batches(&mut other, &ctx, 1), e1);
    // Drop-last leaves out the short batch; prefetch off gives the same batches;
    // so do more threads.
    let mut dl = DataLoader::new(&x, &y, &[2, 3], 5)
        .unwrap()
        .shuffle(9)
        .drop_last(true);
    assert_eq!(dl.batches_per_epoch(), 4);
    assert_eq!(epoch_batches(&mut dl, &ctx, 1), e1[..4]);
    let mut np = DataLoader::new(&x, &y, &[2, 3], 5)
        .unwrap()
        .shuffle(9)
        .prefetch(false);
    assert_eq!(epoch_batches(&mut np, &ctx, 1), e1);
    let ctx4 = ExecContext::with_threads(4);
    assert_eq!(epoch_batches(&mut fresh, &ctx4, 1), e1);
    // A batch larger than the set: one ragged batch, or none with drop-last.
    let mut big = DataLoader::new(&x, &y, &[6], 100).unwrap();
    assert_eq!(epoch_batches(&mut big, &ctx, 0).len(), 1);
    let mut none = DataLoader::new(&x, &y, &[6], 100).unwrap().drop_last(true);
    assert!(epoch_batches(&mut none, &ctx, 0).is_empty());
}

#[test]
fn loader_refuses_bad_arguments_and_passes_on_errors() {
    let x = [0.0f32; 12];
    let y = [0i64; 4];
    let bad = |r: fucina::Result<DataLoader<'_>>, want: &str| match r {
        Err(Error::InvalidArgument { what, reason }) => {
            assert_eq!(what, "DataLoader::new");
            assert!(reason.contains(want), "{reason:?} lacks {want:?}");
        }
        other => panic!("expected an error, got {other:?}"),
    };
    bad(DataLoader::new(&x, &y, &[3], 0), "batch_size");
    bad(DataLoader::new(&x, &y[..0], &[3], 2), "no samples");
    bad(DataLoader::new(&x, &y, &[], 2), "sample shape");
    bad(DataLoader::new(&x, &y, &[3, 0], 2), "sample shape");
    bad(DataLoader::new(&x, &y, &[1; 8], 2), "sample shape");
    bad(
        DataLoader::new(&x, &y, &[2], 2),
        "x has 12 values; 4 samples",
    );
    bad(DataLoader::new(&x, &[0, -1, 0, 0], &[3], 2), "label -1");
    // The callback's error stops the epoch and comes back.
    let ctx = ExecContext::new();
    let mut seen = 0;
    let mut l = DataLoader::new(&x, &y, &[3], 1).unwrap();
    let r = l.for_each_batch(&ctx, 0, |b| {
        seen += 1;
        if b.index == 1 {
            return Err(Error::InvalidArgument {
                what: "callback",
                reason: "stop".into(),
            });
        }
        Ok(())
    });
    assert!(matches!(
        r,
        Err(Error::InvalidArgument {
            what: "callback",
            ..
        })
    ));
    assert_eq!(seen, 2);
}

#[test]
fn loader_steps_allocate_nothing_at_steady_state() {
    let ctx = ExecContext::new();
    let n = 200;
    let x: Vec<f32> = (0..n * 16).map(|i| i as f32).collect();
    let y: Vec<i64> = (0..n as i64).map(|i| i % 10).collect();
    for prefetch in [true, false] {
        let mut loader = DataLoader::new(&x, &y, &[4, 4], 32)
            .unwrap()
            .shuffle(3)
            .prefetch(prefetch);
        let mut sum = 0.0f32;
        let mut steps = 0;
        let mut step = |b: fucina::data::Batch| -> fucina::Result<()> {
            let h = b.x.relu(&ctx)?.sum_all(&ctx)?;
            sum += h.item()? + b.y.data()?[0] as f32;
            steps += 1;
            Ok(())
        };
        // Warm-up epoch: the pool fills, the one-shot worker starts.
        loader.for_each_batch(&ctx, 0, &mut step).unwrap();
        let before = ALLOCS.load(Ordering::Relaxed);
        COUNTED.with(|c| c.set(true));
        let r = loader.for_each_batch(&ctx, 1, &mut step);
        COUNTED.with(|c| c.set(false));
        r.unwrap();
        assert_eq!(steps, 14);
        let allocs = ALLOCS.load(Ordering::Relaxed) - before;
        assert_eq!(
            allocs, 0,
            "prefetch {prefetch}: {allocs} heap allocations in an epoch"
        );
        assert!(sum > 0.0);
    }
}

#[test]
fn a_cnn_training_step_through_the_loader_allocates_nothing_at_steady_state() {
    use fucina::nn::{
        BatchNorm2d, Conv2d, Flatten, Forward, Linear, MaxPool2d, Module, Relu, Sequential,
    };
    use fucina::optim::AdamW;
    use fucina::prelude::Conv2dOptions;

    let ctx = ExecContext::new();
    let same = Conv2dOptions {
        padding: [1, 1],
        ..Default::default()
    };
    let net = Sequential::new()
        .push(Conv2d::no_bias(&ctx, 1, 4, [3, 3], same, 1).unwrap())
        .push(BatchNorm2d::new(&ctx, 4).unwrap())
        .push(Relu)
        .push(MaxPool2d::new([2, 2]).unwrap())
        .push(Flatten::new())
        .push(Linear::new(&ctx, 4 * 4 * 4, 3, 2).unwrap());
    let mut opt = AdamW::new(net.parameters(), 0.01).unwrap();
    let n = 40;
    let x: Vec<f32> = (0..n * 64)
        .map(|i| ((i * 37) % 101) as f32 / 101.0)
        .collect();
    let y: Vec<i64> = (0..n as i64).map(|i| i % 3).collect();
    let mut loader = DataLoader::new(&x, &y, &[1, 8, 8], 16).unwrap().shuffle(5);
    let mut losses = Vec::with_capacity(16);
    let mut epoch = |e: u64, losses: &mut Vec<f32>| {
        loader
            .for_each_batch(&ctx, e, |b| {
                let loss = ctx.exec_scope(|ctx| -> fucina::Result<f32> {
                    let loss = net.forward(ctx, &b.x)?.cross_entropy(ctx, &b.y)?;
                    loss.backward(ctx)?;
                    Ok(loss.item()?)
                })?;
                drop(b);
                opt.step(&ctx)?;
                opt.zero_grad();
                losses.push(loss);
                Ok(())
            })
            .unwrap()
    };
    epoch(0, &mut losses);
    epoch(1, &mut losses);
    let rm_before = net.named_buffers()[0].1.to_vec();
    let before = ALLOCS.load(Ordering::Relaxed);
    COUNTED.with(|c| c.set(true));
    epoch(2, &mut losses);
    COUNTED.with(|c| c.set(false));
    let allocs = ALLOCS.load(Ordering::Relaxed) - before;
    assert_eq!(
        allocs, 0,
        "{allocs} heap allocations in an epoch of 3 CNN steps"
    );
    assert_eq!(losses.len(), 9);
    // The running statistics were updated in place during the counted epoch.
    assert_ne!(net.named_buffers()[0].1.to_vec(), rm_before);
}
