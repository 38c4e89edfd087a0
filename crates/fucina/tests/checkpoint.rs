//! Checkpoints: bit-exact round trips, and every refused file leaves every
//! target unchanged.

use std::path::PathBuf;

use fucina::checkpoint::{self, CheckpointError, LoadOptions};
use fucina_autograd::Tensor;
use fucina_exec::ExecContext;

type Res = Result<(), Box<dyn std::error::Error>>;

/// The bit patterns of a tensor's elements in logical order.
fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec().iter().map(|v| v.to_bits()).collect()
}

/// Values that a lossy round trip would change: signed zeros, a subnormal,
/// infinities, NaNs with payloads, and ordinary numbers.
fn awkward_values(n: usize, salt: u32) -> Vec<f32> {
    let special = [
        0.0,
        -0.0,
        f32::from_bits(1),
        f32::MIN_POSITIVE,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::from_bits(0x7fc0_1234),
        f32::from_bits(0xffa0_0001),
        f32::MAX,
        -1.5e-7,
    ];
    (0..n)
        .map(|i| {
            let i = i as u32;
            if i.is_multiple_of(3) {
                special[(i as usize / 3 + salt as usize) % special.len()]
            } else {
                (i ^ salt).wrapping_mul(2_654_435_761) as f32 / 3.7e6 - 200.0
            }
        })
        .collect()
}

/// A small model-like set: two variables and a constant state tensor.
struct Set {
    w: Tensor,
    b: Tensor,
    m: Tensor,
}

fn make_set(ctx: &ExecContext, salt: u32) -> Set {
    Set {
        w: Tensor::variable_from_slice(ctx, &[3, 4], &awkward_values(12, salt)).unwrap(),
        b: Tensor::variable_from_slice(ctx, &[4], &awkward_values(4, salt ^ 0x55)).unwrap(),
        m: Tensor::from_slice(ctx, &[2, 2, 3], &awkward_values(12, salt ^ 0xaa)).unwrap(),
    }
}

fn save_set(s: &Set) -> Vec<u8> {
    checkpoint::save_to_bytes(
        &[
            ("fc.weight", &s.w),
            ("fc.bias", &s.b),
            ("adam.m.fc.weight", &s.m),
        ],
        &[("step", "42"), ("format", "test")],
    )
    .unwrap()
}

fn set_bits(s: &Set) -> [Vec<u32>; 3] {
    [bits(&s.w), bits(&s.b), bits(&s.m)]
}

fn load_set(bytes: &[u8], s: &mut Set) -> Result<checkpoint::Metadata, CheckpointError> {
    checkpoint::load_into_from_bytes(
        bytes,
        &mut [
            ("fc.weight", &mut s.w),
            ("fc.bias", &mut s.b),
            ("adam.m.fc.weight", &mut s.m),
        ],
    )
}

/// A safetensors file from a JSON header and a data section.
fn st_file(header: &str, data: &[u8]) -> Vec<u8> {
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header.as_bytes());
    v.extend_from_slice(data);
    v
}

fn tmp_dir(test: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("checkpoint-{test}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn round_trip_is_bit_exact_and_keeps_variables() -> Res {
    let ctx = ExecContext::new();
    let src = make_set(&ctx, 1);
    let bytes = save_set(&src);
    let mut dst = make_set(&ctx, 2);
    assert_ne!(set_bits(&src), set_bits(&dst));
    let meta = load_set(&bytes, &mut dst)?;
    assert_eq!(set_bits(&src), set_bits(&dst));
    assert_eq!(meta.get("step"), Some("42"));
    assert_eq!(meta.get("format"), Some("test"));
    assert_eq!(meta.len(), 2);
    assert!(dst.w.is_variable() && dst.b.is_variable());
    assert!(!dst.m.is_variable());
    Ok(())
}

#[test]
fn save_is_independent_of_the_listing_order() {
    let ctx = ExecContext::new();
    let s = make_set(&ctx, 3);
    let a = checkpoint::save_to_bytes(&[("a", &s.w), ("b", &s.b)], &[("x", "1"), ("y", "2")]);
    let b = checkpoint::save_to_bytes(&[("b", &s.b), ("a", &s.w)], &[("y", "2"), ("x", "1")]);
    assert_eq!(a.unwrap(), b.unwrap());
}

#[test]
fn file_round_trip_and_read() -> Res {
    let ctx = ExecContext::new();
    let dir = tmp_dir("file_round_trip");
    let path = dir.join("model.safetensors");
    let src = make_set(&ctx, 4);
    checkpoint::save(
        &path,
        &[
            ("fc.weight", &src.w),
            ("fc.bias", &src.b),
            ("adam.m.fc.weight", &src.m),
        ],
        &[("step", "7")],
    )?;
    // Only the checkpoint is left in the directory (no temporary file).
    let entries: Vec<_> = std::fs::read_dir(&dir)?.collect::<Result<_, _>>()?;
    assert_eq!(entries.len(), 1, "{entries:?}");

    let mut dst = make_set(&ctx, 5);
    let meta = checkpoint::load_into(
        &path,
        &mut [
            ("fc.weight", &mut dst.w),
            ("fc.bias", &mut dst.b),
            ("adam.m.fc.weight", &mut dst.m),
        ],
    )?;
    assert_eq!(set_bits(&src), set_bits(&dst));
    assert_eq!(meta.get("step"), Some("7"));

    let (tensors, meta) = checkpoint::read(&ctx, &path)?;
    let names: Vec<&str> = tensors.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["adam.m.fc.weight", "fc.bias", "fc.weight"]);
    assert_eq!(tensors[0].1.shape(), [2, 2, 3]);
    assert_eq!(bits(&tensors[0].1), bits(&src.m));
    assert_eq!(bits(&tensors[1].1), bits(&src.b));
    assert_eq!(bits(&tensors[2].1), bits(&src.w));
    assert!(tensors.iter().all(|(_, t)| !t.is_variable()));
    assert_eq!(meta.get("step"), Some("7"));

    // Saving again replaces the file atomically (still one entry).
    checkpoint::save(&path, &[("fc.bias", &src.b)], &[])?;
    assert_eq!(std::fs::read_dir(&dir)?.count(), 1);
    let (tensors, meta) = checkpoint::read(&ctx, &path)?;
    assert_eq!(tensors.len(), 1);
    assert!(meta.is_empty());
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

#[test]
fn non_contiguous_tensors_save_in_logical_order() -> Res {
    let ctx = ExecContext::new();
    let base = ctx.from_slice(&[3, 4], &awkward_values(12, 9))?;
    let transposed = Tensor::constant(base.transpose(0, 1)?);
    let narrowed = Tensor::constant(base.narrow(1, 1, 2)?);
    let broadcast = Tensor::constant(
        ctx.from_slice(&[1, 3], &[1., 2., 3.])?
            .broadcast_to(&[2, 3])?,
    );
    assert!(transposed.data().is_err() && narrowed.data().is_err() && broadcast.data().is_err());
    let bytes = checkpoint::save_to_bytes(
        &[("t", &transposed), ("n", &narrowed), ("b", &broadcast)],
        &[],
    )?;
    let (tensors, _) = checkpoint::read_from_bytes(&ctx, &bytes)?;
    let get = |n: &str| &tensors.iter().find(|(name, _)| name == n).unwrap().1;
    assert_eq!(get("t").shape(), [4, 3]);
    assert_eq!(bits(get("t")), bits(&transposed));
    assert_eq!(get("n").shape(), [3, 2]);
    assert_eq!(bits(get("n")), bits(&narrowed));
    assert_eq!(get("b").to_vec(), [1., 2., 3., 1., 2., 3.]);

    // A non-contiguous target is loaded in its logical order too.
    let mut target = Tensor::constant(ctx.zeros(&[3, 4])?.transpose(0, 1)?);
    checkpoint::load_into_from_bytes(&bytes, &mut [("t", &mut target)])?;
    assert_eq!(bits(&target), bits(&transposed));
    Ok(())
}

#[test]
fn load_is_copy_on_write_and_keeps_the_gradient() -> Res {
    let ctx = ExecContext::new();
    let src = Tensor::from_slice(&ctx, &[3], &[7., 8., 9.])?;
    let bytes = checkpoint::save_to_bytes(&[("w", &src)], &[])?;
    let mut w = Tensor::variable_from_slice(&ctx, &[3], &[1., 2., 3.])?;
    let before = w.clone();
    let loss = w.mul(&ctx, &w)?.sum_all(&ctx)?;
    loss.backward(&ctx)?;
    checkpoint::load_into_from_bytes(&bytes, &mut [("w", &mut w)])?;
    assert_eq!(w.to_vec(), [7., 8., 9.]);
    assert_eq!(
        before.to_vec(),
        [1., 2., 3.],
        "another handle keeps the old values"
    );
    assert!(w.is_variable());
    assert_eq!(w.grad(&ctx)?.expect("kept").to_vec(), [2., 4., 6.]);
    Ok(())
}

/// Runs `load` on fresh targets and checks that it fails with an error that
/// `check` accepts and that no target changed.
fn refused(bytes: &[u8], check: impl Fn(&CheckpointError) -> bool) {
    let ctx = ExecContext::new();
    let mut dst = make_set(&ctx, 77);
    let before = set_bits(&dst);
    match load_set(bytes, &mut dst) {
        Ok(_) => panic!("a refused checkpoint was loaded"),
        Err(e) => assert!(check(&e), "unexpected error: {e:?}"),
    }
    assert_eq!(set_bits(&dst), before, "a target changed on error");
}

#[test]
fn missing_tensor_changes_nothing() {
    let ctx = ExecContext::new();
    let s = make_set(&ctx, 10);
    // "fc.weight" and "fc.bias" are there (and listed first), the third is not.
    let bytes = checkpoint::save_to_bytes(&[("fc.weight", &s.w), ("fc.bias", &s.b)], &[]).unwrap();
    refused(
        &bytes,
        |e| matches!(e, CheckpointError::MissingTensor { name } if name == "adam.m.fc.weight"),
    );
}

#[test]
fn wrong_shape_changes_nothing() {
    let ctx = ExecContext::new();
    let s = make_set(&ctx, 11);
    let m = Tensor::from_slice(&ctx, &[3, 2, 2], &[0.5; 12]).unwrap();
    let bytes = checkpoint::save_to_bytes(
        &[
            ("fc.weight", &s.w),
            ("fc.bias", &s.b),
            ("adam.m.fc.weight", &m),
        ],
        &[],
    )
    .unwrap();
    refused(&bytes, |e| {
        matches!(e, CheckpointError::ShapeMismatch { name, expected, found }
            if name == "adam.m.fc.weight" && expected == &[2, 2, 3] && found == &[3, 2, 2])
    });
}

#[test]
fn wrong_dtype_changes_nothing() {
    // fc.weight F32 [3, 4], fc.bias F32 [4], adam.m.fc.weight I32 [2, 2, 3] (same byte size).
    let header = r#"{"fc.weight":{"dtype":"F32","shape":[3,4],"data_offsets":[0,48]},"fc.bias":{"dtype":"F32","shape":[4],"data_offsets":[48,64]},"adam.m.fc.weight":{"dtype":"I32","shape":[2,2,3],"data_offsets":[64,112]}}"#;
    let bytes = st_file(header, &[0x3f; 112]);
    refused(&bytes, |e| {
        matches!(e, CheckpointError::DTypeMismatch { name, expected, found }
            if name == "adam.m.fc.weight" && expected == "F32, F16 or BF16" && found == "I32")
    });
    let ctx = ExecContext::new();
    let err = checkpoint::read_from_bytes(&ctx, &bytes).unwrap_err();
    assert!(
        matches!(err, CheckpointError::DTypeMismatch { .. }),
        "{err:?}"
    );
}

#[test]
fn truncated_files_change_nothing() {
    let ctx = ExecContext::new();
    let bytes = save_set(&make_set(&ctx, 12));
    for cut in 0..bytes.len() {
        refused(&bytes[..cut], |e| {
            matches!(e, CheckpointError::Format { .. })
        });
        assert!(checkpoint::read_from_bytes(&ctx, &bytes[..cut]).is_err());
    }
    // One byte too many is refused as well.
    let mut longer = bytes.clone();
    longer.push(0);
    refused(&longer, |e| matches!(e, CheckpointError::Format { .. }));
}

#[test]
fn flipped_header_bytes_change_nothing() {
    let ctx = ExecContext::new();
    let s = make_set(&ctx, 13);
    // No metadata here: a flipped metadata value would still be a valid file.
    let bytes = checkpoint::save_to_bytes(
        &[
            ("fc.weight", &s.w),
            ("fc.bias", &s.b),
            ("adam.m.fc.weight", &s.m),
        ],
        &[],
    )
    .unwrap();
    let header_end = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut checked = 0;
    for i in 0..header_end {
        for mask in [0x01u8, 0x04, 0x80, 0xff] {
            let mut bad = bytes.clone();
            bad[i] ^= mask;
            refused(&bad, |_| true);
            checked += 1;
        }
    }
    assert!(checked > 400, "{checked}");
}

#[test]
fn not_a_safetensors_file() {
    let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x02\0\0\0";
    let inputs: [&[u8]; 6] = [
        b"",
        b"hello",
        b"Lorem ipsum dolor sit amet, consectetur adipiscing elit.",
        png,
        &[0xff; 64],
        &st_file("[1, 2, 3]", b""),
    ];
    let ctx = ExecContext::new();
    for input in inputs {
        refused(input, |e| matches!(e, CheckpointError::Format { .. }));
        let err = checkpoint::read_from_bytes(&ctx, input).unwrap_err();
        assert!(matches!(err, CheckpointError::Format { .. }), "{err:?}");
    }
}

#[test]
fn duplicate_names_are_refused() {
    let ctx = ExecContext::new();
    let s = make_set(&ctx, 14);
    // In the tensors to save.
    let err = checkpoint::save_to_bytes(&[("w", &s.w), ("w", &s.w)], &[]).unwrap_err();
    assert!(
        matches!(err, CheckpointError::DuplicateName { ref name } if name == "w"),
        "{err:?}"
    );
    // In the metadata to save.
    let err = checkpoint::save_to_bytes(&[("w", &s.w)], &[("k", "1"), ("k", "2")]).unwrap_err();
    assert!(matches!(err, CheckpointError::DuplicateMetadataKey { ref key } if key == "k"));
    // In the targets.
    let bytes = save_set(&s);
    let mut a = Tensor::zeros(&ctx, &[4]).unwrap();
    let mut b = Tensor::zeros(&ctx, &[4]).unwrap();
    let err =
        checkpoint::load_into_from_bytes(&bytes, &mut [("fc.bias", &mut a), ("fc.bias", &mut b)])
            .unwrap_err();
    assert!(matches!(err, CheckpointError::DuplicateName { ref name } if name == "fc.bias"));
    assert_eq!(a.to_vec(), [0.; 4]);
    // In the file's header (the JSON object repeats a key; the second entry would
    // silently shadow the first).
    let header = r#"{"fc.weight":{"dtype":"F32","shape":[3,4],"data_offsets":[0,48]},"fc.bias":{"dtype":"F32","shape":[4],"data_offsets":[48,64]},"adam.m.fc.weight":{"dtype":"F32","shape":[2,2,3],"data_offsets":[64,112]},"fc.bias":{"dtype":"F32","shape":[4],"data_offsets":[48,64]}}"#;
    let file = st_file(header, &[0x3f; 112]);
    refused(
        &file,
        |e| matches!(e, CheckpointError::DuplicateName { name } if name == "fc.bias"),
    );
    // Without the repeat, the same file loads.
    let header = r#"{"fc.weight":{"dtype":"F32","shape":[3,4],"data_offsets":[0,48]},"fc.bias":{"dtype":"F32","shape":[4],"data_offsets":[48,64]},"adam.m.fc.weight":{"dtype":"F32","shape":[2,2,3],"data_offsets":[64,112]}}"#;
    let mut dst = make_set(&ctx, 15);
    load_set(&st_file(header, &[0x3f; 112]), &mut dst).unwrap();
    assert_eq!(bits(&dst.b), [0x3f3f_3f3f; 4]);
    // A repeated metadata key in the file.
    let header = r#"{"__metadata__":{"step":"1","step":"2"},"fc.bias":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#;
    let err = checkpoint::read_from_bytes(&ctx, &st_file(header, &[0; 16])).unwrap_err();
    assert!(
        matches!(err, CheckpointError::DuplicateMetadataKey { ref key } if key == "step"),
        "{err:?}"
    );
    refused(
        &st_file(header, &[0; 16]),
        |e| matches!(e, CheckpointError::DuplicateMetadataKey { key } if key == "step"),
    );
}

#[test]
fn invalid_names_are_refused() {
    let ctx = ExecContext::new();
    let s = make_set(&ctx, 16);
    for name in ["", "__metadata__"] {
        let err = checkpoint::save_to_bytes(&[(name, &s.b)], &[]).unwrap_err();
        assert!(
            matches!(err, CheckpointError::InvalidName { .. }),
            "{err:?}"
        );
    }
}

#[test]
fn a_null_metadata_map_is_read_as_no_metadata() {
    let ctx = ExecContext::new();
    let header = r#"{"__metadata__":null,"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
    let (tensors, meta) = checkpoint::read_from_bytes(&ctx, &st_file(header, &[0; 4])).unwrap();
    assert_eq!(tensors.len(), 1);
    assert!(meta.is_empty());
}

#[test]
fn a_file_holding_an_empty_name_is_refused() {
    // What `save` refuses, `read` and `load_into` refuse too.
    let ctx = ExecContext::new();
    let header = r#"{"":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#;
    let file = st_file(header, &[0; 16]);
    let err = checkpoint::read_from_bytes(&ctx, &file).unwrap_err();
    assert!(
        matches!(err, CheckpointError::InvalidName { ref name, .. } if name.is_empty()),
        "{err:?}"
    );
    refused(&file, |e| matches!(e, CheckpointError::InvalidName { .. }));
}

#[test]
fn errors_name_the_same_tensor_on_every_run() {
    // Several faults in one header: the reported one does not depend on hash
    // order (each parse builds fresh hash maps with fresh random keys).
    let ctx = ExecContext::new();
    let headers = [
        // Three tensors claiming the same bytes.
        r#"{"c":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"d":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#,
        // Several tensors whose offsets do not match their shapes.
        r#"{"x":{"dtype":"F32","shape":[4],"data_offsets":[0,12]},"y":{"dtype":"F32","shape":[4],"data_offsets":[0,12]},"z":{"dtype":"F32","shape":[4],"data_offsets":[0,12]}}"#,
        // The same with a null metadata map (valid: no metadata).
        r#"{"__metadata__":null,"c":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#,
    ];
    for header in headers {
        let file = st_file(header, &[0; 64]);
        let first = checkpoint::read_from_bytes(&ctx, &file)
            .unwrap_err()
            .to_string();
        for _ in 0..64 {
            let again = checkpoint::read_from_bytes(&ctx, &file)
                .unwrap_err()
                .to_string();
            assert_eq!(again, first);
            let mut t = Tensor::zeros(&ctx, &[4]).unwrap();
            let load = checkpoint::load_into_from_bytes(&file, &mut [("a", &mut t)]);
            assert_eq!(load.unwrap_err().to_string(), first);
        }
    }
}

/// Runs the test `name` of this binary in a child process (with `FUCINA_CHILD`
/// set), killed after `secs` seconds; returns whether it ran and passed (a
/// name that matches no test runs nothing, which is not a pass).
fn child_passes(name: &str, secs: u64) -> bool {
    use std::io::Read;
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--test-threads=1"])
        .env("FUCINA_CHILD", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut out = String::new();
            child
                .stdout
                .take()
                .unwrap()
                .read_to_string(&mut out)
                .unwrap();
            return status.success() && out.contains("1 passed");
        }
        if std::time::Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Saving a huge zero-copy view (a broadcast of one element to 2^40 elements,
/// 4 TiB of file) is an error naming the tensor, not an abort. Run in a child
/// process: before the fix, the process died on the failed allocation.
#[test]
fn saving_a_huge_view_is_an_error_not_an_abort() {
    assert!(
        child_passes("huge_view_body", 120),
        "the child process aborted, failed or hung"
    );
}

#[test]
fn huge_view_body() {
    if std::env::var_os("FUCINA_CHILD").is_none() {
        return; // run only as the child of the test above
    }
    let ctx = ExecContext::new();
    let small = Tensor::ones(&ctx, &[4]).unwrap();
    let b = Tensor::ones(&ctx, &[1])
        .unwrap()
        .broadcast_to(&ctx, &[1 << 40])
        .unwrap();
    let err = checkpoint::save_to_bytes(&[("a", &small), ("b", &b)], &[]).unwrap_err();
    assert!(
        matches!(err, CheckpointError::OutOfMemory { ref name, ref shape, .. } if name == "b" && shape == &[1 << 40]),
        "{err:?}"
    );
    assert!(err.to_string().contains("out of memory"), "{err}");
    let dir = tmp_dir("huge_view");
    let path = dir.join("huge.safetensors");
    let err = checkpoint::save(&path, &[("b", &b)], &[]).unwrap_err();
    assert!(
        matches!(err, CheckpointError::OutOfMemory { .. }),
        "{err:?}"
    );
    assert!(!path.exists());
}

#[test]
fn a_view_whose_byte_size_overflows_is_an_error() {
    // 2^63 elements: the element count fits a usize, the byte count does not.
    let ctx = ExecContext::new();
    let v = Tensor::ones(&ctx, &[1])
        .unwrap()
        .broadcast_to(&ctx, &[1 << 31, 1 << 31, 2])
        .unwrap();
    let err = checkpoint::save_to_bytes(&[("v", &v)], &[]).unwrap_err();
    assert!(
        matches!(err, CheckpointError::OutOfMemory { ref name, .. } if name == "v"),
        "{err:?}"
    );
    // Two tensors whose offsets together overflow: the second is named.
    let h = Tensor::ones(&ctx, &[1])
        .unwrap()
        .broadcast_to(&ctx, &[1 << 31, 1 << 29, 2])
        .unwrap();
    let err = checkpoint::save_to_bytes(&[("h2", &h), ("h1", &h)], &[]).unwrap_err();
    assert!(
        matches!(err, CheckpointError::OutOfMemory { ref name, .. } if name == "h2"),
        "{err:?}"
    );
}

#[test]
fn strict_load_refuses_extra_tensors() {
    let ctx = ExecContext::new();
    let s = make_set(&ctx, 17);
    let bytes = save_set(&s);
    let mut b = Tensor::zeros(&ctx, &[4]).unwrap();
    let err = checkpoint::load_into_from_bytes_with_options(
        &bytes,
        &mut [("fc.bias", &mut b)],
        LoadOptions { strict: true },
    )
    .unwrap_err();
    assert!(
        matches!(err, CheckpointError::UnexpectedTensor { ref name } if name == "adam.m.fc.weight"),
        "{err:?}"
    );
    assert_eq!(b.to_vec(), [0.; 4]);
    // The default load ignores them.
    checkpoint::load_into_from_bytes(&bytes, &mut [("fc.bias", &mut b)]).unwrap();
    assert_eq!(bits(&b), bits(&s.b));
}

#[test]
fn read_refuses_shapes_a_tensor_cannot_have() {
    let ctx = ExecContext::new();
    for (shape, bytes) in [("[]", 4), ("[2,0]", 0), ("[1,1,1,1,1,1,1,1,1]", 4)] {
        let header =
            format!(r#"{{"x":{{"dtype":"F32","shape":{shape},"data_offsets":[0,{bytes}]}}}}"#);
        let err =
            checkpoint::read_from_bytes(&ctx, &st_file(&header, &vec![0; bytes])).unwrap_err();
        assert!(
            matches!(err, CheckpointError::UnsupportedShape { .. }),
            "{shape}: {err:?}"
        );
    }
}

#[test]
fn io_errors_name_the_path() {
    let ctx = ExecContext::new();
    let dir = tmp_dir("io_errors");
    let missing = dir.join("missing.safetensors");
    let mut b = Tensor::zeros(&ctx, &[4]).unwrap();
    let err = checkpoint::load_into(&missing, &mut [("fc.bias", &mut b)]).unwrap_err();
    assert!(
        matches!(err, CheckpointError::Io { ref path, .. } if path == &missing),
        "{err:?}"
    );
    assert!(err.to_string().contains("missing.safetensors"), "{err}");
    let err = checkpoint::read(&ctx, &missing).unwrap_err();
    assert!(matches!(err, CheckpointError::Io { .. }));

    // Saving into a directory that does not exist fails and creates nothing.
    let nowhere = dir.join("no-such-dir").join("model.safetensors");
    let err = checkpoint::save(&nowhere, &[("fc.bias", &b)], &[]).unwrap_err();
    assert!(
        matches!(err, CheckpointError::Io { ref path, .. } if path == &nowhere),
        "{err:?}"
    );
    // A refused save leaves the existing checkpoint untouched.
    let path = dir.join("model.safetensors");
    checkpoint::save(&path, &[("fc.bias", &b)], &[("v", "1")]).unwrap();
    let before = std::fs::read(&path).unwrap();
    let err = checkpoint::save(&path, &[("a", &b), ("a", &b)], &[]).unwrap_err();
    assert!(matches!(err, CheckpointError::DuplicateName { .. }));
    assert_eq!(std::fs::read(&path).unwrap(), before);
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn files_are_readable_by_the_safetensors_crate() {
    let ctx = ExecContext::new();
    let s = make_set(&ctx, 18);
    let bytes = save_set(&s);
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names = st.names();
    names.sort_unstable();
    assert_eq!(names, ["adam.m.fc.weight", "fc.bias", "fc.weight"]);
    let w = st.tensor("fc.weight").unwrap();
    assert_eq!(w.dtype(), safetensors::Dtype::F32);
    assert_eq!(w.shape(), [3, 4]);
    let le: Vec<u8> = s.w.to_vec().iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(w.data(), le.as_slice());
    let (n, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    assert!(
        n.is_multiple_of(8),
        "the data section starts 8-byte aligned"
    );
    let meta = header.metadata().as_ref().unwrap();
    assert_eq!(meta.get("step").map(String::as_str), Some("42"));
}

/// The value of the f16 bit pattern `bits` computed from its fields (in f64,
/// where it is exact), or `None` for a NaN.
fn f16_reference(bits: u16) -> Option<f32> {
    let sign = if bits & 0x8000 != 0 { -1.0f64 } else { 1.0 };
    let exp = i32::from((bits >> 10) & 0x1f);
    let man = f64::from(bits & 0x3ff);
    let v = match exp {
        0 => sign * man * 2f64.powi(-24),
        31 if man == 0.0 => sign * f64::INFINITY,
        31 => return None,
        e => sign * (1024.0 + man) * 2f64.powi(e - 25),
    };
    Some(v as f32)
}

/// A checkpoint holding every f16 and every bf16 bit pattern, and an f32 tensor.
fn half_file() -> Vec<u8> {
    let all: Vec<u8> = (0..=u16::MAX).flat_map(|b| b.to_le_bytes()).collect();
    let header = r#"{"b":{"dtype":"BF16","shape":[256,256],"data_offsets":[0,131072]},"f":{"dtype":"F32","shape":[2],"data_offsets":[131072,131080]},"h":{"dtype":"F16","shape":[65536],"data_offsets":[131080,262152]}}"#;
    let mut data = all.clone();
    data.extend_from_slice(&1.5f32.to_le_bytes());
    data.extend_from_slice(&f32::from_bits(0x7fa0_0001).to_le_bytes());
    data.extend_from_slice(&all);
    st_file(header, &data)
}

/// Checks the widened values of every f16 and bf16 pattern.
fn check_half_values(h: &[f32], b: &[f32]) {
    assert_eq!(h.len(), 65536);
    for (bits, &v) in (0..=u16::MAX).zip(h) {
        match f16_reference(bits) {
            Some(r) => assert_eq!(v.to_bits(), r.to_bits(), "f16 {bits:#06x}"),
            None => {
                // NaN: the sign and the payload kept, the quiet bit set.
                assert!(v.is_nan(), "f16 {bits:#06x}");
                let vb = v.to_bits();
                assert_eq!(vb >> 31, u32::from(bits >> 15), "f16 {bits:#06x} sign");
                assert_eq!(vb & 0x1fff, 0, "f16 {bits:#06x}");
                assert_eq!(
                    (vb >> 13) & 0x3ff,
                    u32::from(bits & 0x3ff) | 0x200,
                    "f16 {bits:#06x}"
                );
            }
        }
    }
    assert_eq!(b.len(), 65536);
    for (bits, &v) in (0..=u16::MAX).zip(b) {
        assert_eq!(v.to_bits(), u32::from(bits) << 16, "bf16 {bits:#06x}");
    }
}

#[test]
fn f16_and_bf16_tensors_load_as_exact_f32() -> Res {
    let ctx = ExecContext::new();
    let bytes = half_file();
    // read: every tensor as an f32 tensor.
    let (tensors, _) = checkpoint::read_from_bytes(&ctx, &bytes)?;
    let names: Vec<&str> = tensors.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["b", "f", "h"]);
    assert_eq!(tensors[0].1.shape(), [256, 256]);
    assert_eq!(tensors[2].1.shape(), [65536]);
    check_half_values(&tensors[2].1.to_vec(), &tensors[0].1.to_vec());
    assert_eq!(bits(&tensors[1].1), [1.5f32.to_bits(), 0x7fa0_0001]);
    // load_into: in place, the same values.
    let mut h = Tensor::variable_from_slice(&ctx, &[65536], &vec![0.0; 65536])?;
    let mut b = Tensor::variable_from_slice(&ctx, &[256, 256], &vec![0.0; 65536])?;
    checkpoint::load_into_from_bytes(&bytes, &mut [("h", &mut h), ("b", &mut b)])?;
    assert!(h.is_variable());
    check_half_values(&h.to_vec(), &b.to_vec());
    // Saving writes F32, and reading that back gives the same bits.
    let saved = checkpoint::save_to_bytes(&[("h", &h), ("b", &b)], &[])?;
    let st = safetensors::SafeTensors::deserialize(&saved)?;
    assert_eq!(st.tensor("h")?.dtype(), safetensors::Dtype::F32);
    assert_eq!(st.tensor("b")?.dtype(), safetensors::Dtype::F32);
    let (again, _) = checkpoint::read_from_bytes(&ctx, &saved)?;
    assert_eq!(bits(&again[0].1), bits(&b));
    assert_eq!(bits(&again[1].1), bits(&h));
    // From a file on disk too.
    let dir = tmp_dir("half");
    let path = dir.join("half.safetensors");
    std::fs::write(&path, &bytes)?;
    let (from_disk, _) = checkpoint::read(&ctx, &path)?;
    assert_eq!(bits(&from_disk[2].1), bits(&h));
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

#[test]
fn half_tensors_are_checked_like_f32_ones() {
    let ctx = ExecContext::new();
    let bytes = half_file();
    // A wrong shape is refused and nothing changes.
    let mut f = Tensor::variable_from_slice(&ctx, &[2], &[7.0, 7.0]).unwrap();
    let mut wrong = Tensor::variable_from_slice(&ctx, &[65535], &vec![3.0; 65535]).unwrap();
    let err = checkpoint::load_into_from_bytes(&bytes, &mut [("f", &mut f), ("h", &mut wrong)]);
    assert!(
        matches!(&err, Err(CheckpointError::ShapeMismatch { name, .. }) if name == "h"),
        "{err:?}"
    );
    assert_eq!(f.to_vec(), [7.0, 7.0]);
    // Offsets sized for f32 elements of an F16 tensor are refused.
    let header = r#"{"h":{"dtype":"F16","shape":[2],"data_offsets":[0,8]}}"#;
    let bad = st_file(header, &[0; 8]);
    let mut t = Tensor::variable_from_slice(&ctx, &[2], &[5.0, 5.0]).unwrap();
    let err = checkpoint::load_into_from_bytes(&bad, &mut [("h", &mut t)]);
    assert!(
        matches!(err, Err(CheckpointError::Format { .. })),
        "{err:?}"
    );
    assert_eq!(t.to_vec(), [5.0, 5.0]);
    assert!(checkpoint::read_from_bytes(&ctx, &bad).is_err());
    // Every truncation is an error.
    for cut in (0..bytes.len())
        .step_by(997)
        .chain(bytes.len() - 3..bytes.len())
    {
        assert!(
            checkpoint::read_from_bytes(&ctx, &bytes[..cut]).is_err(),
            "cut {cut}"
        );
    }
    // Other dtypes are still refused, naming the tensor.
    let header = r#"{"x":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}}"#;
    let err = checkpoint::read_from_bytes(&ctx, &st_file(header, &[0; 8])).unwrap_err();
    assert!(
        matches!(&err, CheckpointError::DTypeMismatch { name, found, .. } if name == "x" && found == "F64"),
        "{err:?}"
    );
}
