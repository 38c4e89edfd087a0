//! `fucina::safetensors_header::parse`, the validator shared by checkpoints
//! and fucina-llm's loader: a good file's tensors and metadata, and one typed
//! error per fault, naming the tensor at fault.

use fucina::safetensors_header::{Dtype, HeaderError, parse};

/// A file from a header string and a data section of `len` zero bytes.
fn file(header: &str, len: usize) -> Vec<u8> {
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header.as_bytes());
    v.extend(std::iter::repeat_n(0u8, len));
    v
}

fn err(header: &str, len: usize) -> HeaderError {
    parse(&file(header, len), &Dtype::ALL).unwrap_err()
}

#[test]
fn a_good_file_gives_its_tensors_in_data_order_and_its_metadata() {
    let h = r#"{"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[3],"data_offsets":[8,14]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"z":{"dtype":"I64","shape":[0,2],"data_offsets":[14,14]}}"#;
    let p = parse(&file(h, 14), &Dtype::ALL).unwrap();
    let names: Vec<&str> = p.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "z"]);
    assert_eq!(p.tensors[1].dtype, Dtype::BF16);
    assert_eq!(p.tensors[1].shape, [3]);
    assert_eq!(p.tensors[1].range, 8..14);
    assert_eq!(p.data_start, 8 + h.len());
    assert_eq!(p.metadata.get("format").map(String::as_str), Some("pt"));
    // Every dtype name reads back.
    for d in Dtype::ALL {
        assert_eq!(Dtype::from_name(d.name()), Some(d));
    }
    assert_eq!(Dtype::from_name("Q4"), None);
}

#[test]
fn every_fault_is_its_own_typed_error_naming_the_tensor() {
    use HeaderError as E;
    assert!(matches!(
        parse(&[1, 2, 3], &Dtype::ALL),
        Err(E::TooShort { len: 3 })
    ));
    let mut long = file("{}", 0);
    long[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        parse(&long, &Dtype::ALL),
        Err(E::HeaderTooLong { .. })
    ));
    long[..8].copy_from_slice(&100u64.to_le_bytes());
    assert!(matches!(
        parse(&long, &Dtype::ALL),
        Err(E::HeaderPastEnd { header: 100, .. })
    ));
    assert!(matches!(err("[1]", 0), E::NotJson { .. }));
    assert!(matches!(
        err(r#"{"__metadata__":{},"__metadata__":{}}"#, 0),
        E::MetadataTwice
    ));
    assert!(matches!(
        err(r#"{"__metadata__":{"a":1}}"#, 0),
        E::BadMetadata { .. }
    ));
    assert!(matches!(
        err(r#"{"__metadata__":{"k":"1","k":"2"}}"#, 0),
        E::DuplicateMetadataKey { key } if key == "k"
    ));
    let cases: [(&str, usize, &str, &str); 10] = [
        (
            r#"{"":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
            4,
            "",
            "empty",
        ),
        (
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#,
            8,
            "a",
            "twice",
        ),
        (
            r#"{"a":{"dtype":"F32","data_offsets":[0,4]}}"#,
            4,
            "a",
            "malformed",
        ),
        (
            r#"{"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,4]}}"#,
            4,
            "a",
            "Q4 is not supported",
        ),
        (
            r#"{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}}"#,
            8,
            "a",
            "u64",
        ),
        (
            r#"{"a":{"dtype":"BF16","shape":[3],"data_offsets":[0,8]}}"#,
            8,
            "a",
            "6 bytes",
        ),
        (
            r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#,
            12,
            "b",
            "overlap the data of tensor `a`",
        ),
        (
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#,
            8,
            "a",
            "gap after the start of the data section",
        ),
        (
            r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
            7,
            "a",
            "past the end",
        ),
        (
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
            6,
            "",
            "2 bytes follow",
        ),
    ];
    for (h, len, name, says) in cases {
        let e = err(h, len);
        let msg = e.to_string();
        assert!(msg.contains(says), "{h}: {msg}");
        if name.is_empty() && says != "empty" {
            assert_eq!(e.tensor(), None, "{h}: {e:?}");
        } else {
            assert_eq!(e.tensor(), Some(name), "{h}: {e:?}");
        }
    }
    // A dtype of the format that the caller does not accept.
    let e = parse(
        &file(
            r#"{"a":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}}"#,
            4,
        ),
        &[Dtype::F32, Dtype::F16],
    )
    .unwrap_err();
    assert!(
        matches!(&e, E::UnsupportedDtype { name, dtype, accepted } if name == "a" && dtype == "I32" && accepted == "F32, F16"),
        "{e:?}"
    );
}

#[test]
fn every_truncation_and_flipped_header_byte_is_an_error_or_a_file_never_a_panic() {
    let h = r#"{"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F16","shape":[2],"data_offsets":[8,12]}}"#;
    let good = file(h, 12);
    assert!(parse(&good, &Dtype::ALL).is_ok());
    for cut in 0..good.len() {
        assert!(parse(&good[..cut], &Dtype::ALL).is_err(), "cut {cut}");
    }
    for i in 0..8 + h.len() {
        for mask in [0x01u8, 0x20, 0x80] {
            let mut b = good.clone();
            b[i] ^= mask;
            let _ = parse(&b, &Dtype::ALL);
        }
    }
}
