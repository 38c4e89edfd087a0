//! Arbitrary bytes as a checkpoint: `load_into_from_bytes` and `read_from_bytes`
//! return `Ok` or `Err`, never panic, and agree with each other; a refused load
//! changes no target; a loaded checkpoint saves back to bytes that load the same.
#![no_main]

use fucina::checkpoint::{self, CheckpointError, LoadOptions};
use fucina_autograd::Tensor;
use fucina_exec::ExecContext;
use libfuzzer_sys::fuzz_target;

thread_local! {
    static CTX: ExecContext = ExecContext::new();
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec().iter().map(|v| v.to_bits()).collect()
}

fuzz_target!(|data: &[u8]| {
    CTX.with(|ctx| {
        let read = checkpoint::read_from_bytes(ctx, data);

        // Targets named like the seeds' tensors; the first byte picks strictness.
        let mut a = Tensor::variable_from_slice(ctx, &[2, 3], &[-1.0; 6]).unwrap();
        let mut b = Tensor::from_slice(ctx, &[4], &[-2.0; 4]).unwrap();
        let before = (bits(&a), bits(&b));
        let strict = data.first().is_some_and(|&x| x & 1 == 1);
        let loaded = checkpoint::load_into_from_bytes_with_options(
            data,
            &mut [("a", &mut a), ("b", &mut b)],
            LoadOptions { strict },
        );
        match (&loaded, &read) {
            (Err(_), _) => assert_eq!(
                (bits(&a), bits(&b)),
                before,
                "a refused load wrote a target"
            ),
            (Ok(meta), Ok((tensors, read_meta))) => {
                // Both accepted the file: they agree.
                assert_eq!(meta, read_meta);
                for (name, t) in [("a", &a), ("b", &b)] {
                    let (_, r) = tensors
                        .iter()
                        .find(|(n, _)| n == name)
                        .expect("read lists it");
                    assert_eq!(bits(r), bits(t), "{name}");
                }
                assert!(a.is_variable());
            }
            (Ok(_), Err(e)) => {
                // `read` refuses a tensor that no target named and so the load
                // ignored: one it cannot represent.
                let name = match e {
                    CheckpointError::DTypeMismatch { name, .. }
                    | CheckpointError::UnsupportedShape { name, .. } => name,
                    other => panic!("load_into accepted what read refused: {other}"),
                };
                assert!(name != "a" && name != "b", "{e}");
            }
        }
        if let Ok((tensors, meta)) = &read {
            // Whatever was read saves back and reads the same.
            let named: Vec<(&str, &Tensor)> =
                tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
            let pairs: Vec<(&str, &str)> = meta.iter().collect();
            let bytes = checkpoint::save_to_bytes(&named, &pairs);
            if let Err(e) = &bytes {
                // The writer refuses empty names, which a foreign file may hold.
                assert!(
                    matches!(e, CheckpointError::InvalidName { name, .. } if name.is_empty()),
                    "{e}"
                );
            }
            if let Ok(bytes) = bytes {
                let (again, meta2) = checkpoint::read_from_bytes(ctx, &bytes).expect("re-read");
                assert_eq!(&meta2, meta);
                assert_eq!(again.len(), tensors.len());
                for ((n1, t1), (n2, t2)) in tensors.iter().zip(&again) {
                    assert_eq!(n1, n2);
                    assert_eq!(t1.shape(), t2.shape());
                    assert_eq!(bits(t1), bits(t2));
                }
            }
        }
    });
});
