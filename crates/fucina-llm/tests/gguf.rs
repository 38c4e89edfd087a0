//! The GGUF reader: a file written here field by field reads back with every
//! metadata type, the tensor directory and the data bytes; every corruption is an
//! error naming what was wrong (each prefix of a valid file, each bad field, and
//! random byte flips never panic).

use std::io::Write;

use fucina::exec::TensorFormat;
use fucina_llm::LlmError;
use fucina_llm::gguf::{GgmlType, GgufFile, GgufValue, parse_header};

mod gguf_support;
use gguf_support::{Writer, string};

fn sample() -> Writer {
    let mut w = Writer::default();
    let mut arr = 8u32.to_le_bytes().to_vec(); // array of strings
    arr.extend_from_slice(&2u64.to_le_bytes());
    string(&mut arr, "<s>");
    string(&mut arr, "hi");
    let mut ints = 5u32.to_le_bytes().to_vec(); // array of i32
    ints.extend_from_slice(&3u64.to_le_bytes());
    for v in [-1i32, 0, 7] {
        ints.extend_from_slice(&v.to_le_bytes());
    }
    let mut s = Vec::new();
    string(&mut s, "llama");
    w.kv("general.architecture", 8, &s)
        .kv("u8", 0, &[200])
        .kv("i8", 1, &[0xff])
        .kv("u16", 2, &500u16.to_le_bytes())
        .kv("i16", 3, &(-500i16).to_le_bytes())
        .kv("llama.block_count", 4, &2u32.to_le_bytes())
        .kv("i32", 5, &(-7i32).to_le_bytes())
        .kv("llama.rope.freq_base", 6, &10000.0f32.to_le_bytes())
        .kv("flag", 7, &[1])
        .kv("tokenizer.ggml.tokens", 9, &arr)
        .kv("ints", 9, &ints)
        .kv("u64", 10, &(1u64 << 40).to_le_bytes())
        .kv("i64", 11, &(-3i64).to_le_bytes())
        .kv("f64", 12, &0.25f64.to_le_bytes());
    let f32s: Vec<u8> = (0..6).flat_map(|i| (i as f32).to_le_bytes()).collect();
    w.tensor("token_embd.weight", &[3, 2], 0, &f32s);
    w.tensor("blk.0.attn_q.weight", &[32, 2], 8, &[7u8; 68]); // two Q8_0 blocks
    w.tensor("blk.0.ffn_up.weight", &[32], 2, &[9u8; 18]); // one Q4_0 block
    w.tensor("bf", &[4], 30, &[1, 2, 3, 4, 5, 6, 7, 8]);
    w.tensor("odd", &[4], 16, &[0u8; 64]); // IQ2_XXS: listed, refused on read
    w
}

fn write_temp(bytes: &[u8], name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("fucina-gguf-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("model.gguf");
    std::fs::File::create(&p).unwrap().write_all(bytes).unwrap();
    p
}

#[test]
fn a_written_file_reads_back() {
    let bytes = sample().bytes();
    let path = write_temp(&bytes, "ok");
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.file_bytes(), bytes.len());
    let m = f.metadata();
    assert_eq!(m["general.architecture"].as_str(), Some("llama"));
    assert_eq!(m["u8"], GgufValue::U8(200));
    assert_eq!(m["i8"], GgufValue::I8(-1));
    assert_eq!(m["u16"], GgufValue::U16(500));
    assert_eq!(m["i16"], GgufValue::I16(-500));
    assert_eq!(
        f.get("llama.block_count").and_then(GgufValue::as_u64),
        Some(2)
    );
    assert_eq!(m["i32"], GgufValue::I32(-7));
    assert_eq!(m["i32"].as_u64(), None);
    assert_eq!(m["llama.rope.freq_base"].as_f64(), Some(10000.0));
    assert_eq!(m["flag"], GgufValue::Bool(true));
    let toks = m["tokenizer.ggml.tokens"].as_array().unwrap();
    assert_eq!(
        toks,
        &[
            GgufValue::String("<s>".into()),
            GgufValue::String("hi".into())
        ]
    );
    assert_eq!(
        m["ints"],
        GgufValue::Array(vec![
            GgufValue::I32(-1),
            GgufValue::I32(0),
            GgufValue::I32(7)
        ])
    );
    assert_eq!(m["u64"].as_u64(), Some(1 << 40));
    assert_eq!(m["i64"], GgufValue::I64(-3));
    assert_eq!(m["f64"].as_f64(), Some(0.25));

    let names: Vec<&str> = f.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "token_embd.weight",
            "blk.0.attn_q.weight",
            "blk.0.ffn_up.weight",
            "bf",
            "odd"
        ]
    );
    let (info, data) = f.tensor("token_embd.weight").unwrap();
    assert_eq!(info.shape(), vec![2, 3]);
    assert_eq!(info.ggml_type, GgmlType::from(TensorFormat::F32));
    let vals: Vec<f32> = data
        .chunks(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(vals, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    let (info, data) = f.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!(
        (info.ggml_type, info.numel(), data),
        (GgmlType::from(TensorFormat::Q8_0), 64, &[7u8; 68][..])
    );
    assert_eq!(f.tensor("blk.0.ffn_up.weight").unwrap().1, &[9u8; 18]);
    assert_eq!(f.tensor("bf").unwrap().1, &[1, 2, 3, 4, 5, 6, 7, 8]);
    // The data is the mapped file, not a copy.
    let whole = std::fs::read(&path).unwrap();
    let at = whole.windows(18).position(|w| w == [9u8; 18]).unwrap();
    assert_eq!(
        &whole[at..at + 18],
        f.tensor("blk.0.ffn_up.weight").unwrap().1
    );

    let err = f.tensor("odd").unwrap_err();
    assert!(
        matches!(err, LlmError::BadTensor { ref name, .. } if name == "odd"),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("unsupported GGUF tensor type iq2_xxs"),
        "{err}"
    );
    let err = f.tensor("nope").unwrap_err().to_string();
    assert!(err.contains("nope") && err.contains("missing"), "{err}");
}

#[test]
fn every_prefix_of_a_valid_file_is_an_error_not_a_panic() {
    let bytes = sample().bytes();
    assert!(parse_header(&bytes).is_ok());
    let supported_end = bytes
        .windows(8)
        .rposition(|w| w == [1, 2, 3, 4, 5, 6, 7, 8])
        .unwrap()
        + 8;
    for n in 0..bytes.len() {
        // The bytes after the last supported tensor's data (padding and the data of
        // the unsupported one, whose length is unknown) are never read, so a cut
        // there still parses; every other cut is an error.
        let r = parse_header(&bytes[..n]);
        if n < supported_end {
            assert!(r.is_err(), "prefix of {n} bytes parsed");
        }
    }
}

fn err_of(bytes: &[u8]) -> String {
    parse_header(bytes).unwrap_err()
}

#[test]
fn bad_fields_are_errors_naming_them() {
    let good = sample().bytes();
    let mut b = good.clone();
    b[0] = b'X';
    assert!(err_of(&b).contains("not a GGUF file"));
    let mut b = good.clone();
    b[4] = 9;
    assert!(err_of(&b).contains("version 9"));
    // A tensor count far beyond the file.
    let mut b = good.clone();
    b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(err_of(&b).contains("the tensor count"), "{}", err_of(&b));
    let mut b = good.clone();
    b[16..24].copy_from_slice(&(1u64 << 50).to_le_bytes());
    assert!(err_of(&b).contains("the metadata count"));

    let one = |key: &str, ty: u32, v: &[u8]| {
        let mut w = Writer::default();
        w.kv(key, ty, v);
        err_of(&w.bytes())
    };
    assert!(one("b", 7, &[2]).contains("boolean byte 2"));
    assert!(one("t", 13, &[0; 8]).contains("unknown value type 13"));
    let mut arr = 13u32.to_le_bytes().to_vec();
    arr.extend_from_slice(&0u64.to_le_bytes());
    assert!(one("a", 9, &arr).contains("unknown array element type 13"));
    let mut huge = 4u32.to_le_bytes().to_vec();
    huge.extend_from_slice(&(1u64 << 60).to_le_bytes());
    assert!(one("h", 9, &huge).contains("cannot fit"));
    // Arrays nested five deep.
    let mut nested = Vec::new();
    for _ in 0..5 {
        nested.extend_from_slice(&9u32.to_le_bytes());
        nested.extend_from_slice(&1u64.to_le_bytes());
    }
    nested.extend_from_slice(&0u32.to_le_bytes());
    nested.extend_from_slice(&0u64.to_le_bytes());
    assert!(one("n", 9, &nested).contains("nested deeper"));
    let mut bad_utf8 = 2u64.to_le_bytes().to_vec();
    bad_utf8.extend_from_slice(&[0xff, 0xfe]);
    assert!(one("s", 8, &bad_utf8).contains("not UTF-8"));
    assert!(one("general.alignment", 4, &3u32.to_le_bytes()).contains("power-of-two"));
    let mut w = Writer::default();
    w.kv("k", 4, &[0; 4]).kv("k", 4, &[0; 4]);
    assert!(err_of(&w.bytes()).contains("appears twice"));

    let tensor = |dims: &[u64], code: u32, data: &[u8]| {
        let mut w = Writer::default();
        w.tensor("w", dims, code, data);
        w.bytes()
    };
    assert!(err_of(&tensor(&[0], 0, &[])).contains("tensor w: a dimension is zero"));
    assert!(err_of(&tensor(&[1, 1, 1, 1, 1], 0, &[0; 4])).contains("rank 5"));
    assert!(err_of(&tensor(&[16], 8, &[0; 34])).contains("multiple of the 32-element blocks"));
    assert!(err_of(&tensor(&[u64::MAX, 4], 0, &[])).contains("overflow"));
    // Data cut short: the directory says 8 floats, the file holds 4.
    let mut b = tensor(&[8], 0, &[0; 32]);
    b.truncate(b.len() - 16);
    assert!(err_of(&b).contains("tensor w: data") && err_of(&b).contains("past the end"));
    let mut w = Writer::default();
    w.tensor("w", &[1], 0, &[0; 4])
        .tensor("w", &[1], 0, &[0; 4]);
    assert!(err_of(&w.bytes()).contains("tensor w appears twice"));
    // A misaligned offset.
    let mut b = tensor(&[1], 0, &[0; 4]);
    let off_at = 24 + 8 + 1 + 4 + 8 + 4; // header, name, rank, one dim, type
    b[off_at] = 3;
    assert!(err_of(&b).contains("not a multiple of the alignment"));
}

#[test]
fn random_byte_flips_never_panic() {
    let good = sample().bytes();
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    for _ in 0..4000 {
        let mut b = good.clone();
        for _ in 0..1 + next() % 4 {
            let i = (next() % b.len() as u64) as usize;
            b[i] = next() as u8;
        }
        if let Ok(parsed) = parse_header(&b) {
            // Trailing data never changes what a valid header says.
            b.push(0);
            let again = parse_header(&b).expect("a trailing byte made a valid header invalid");
            assert_eq!(format!("{again:?}"), format!("{parsed:?}"));
        }
    }
}

#[test]
fn a_missing_file_is_an_io_error_naming_it() {
    let err = GgufFile::open("/nonexistent/model.gguf").unwrap_err();
    assert!(matches!(err, LlmError::Io { .. }));
    assert!(err.to_string().contains("/nonexistent/model.gguf"));
    let path = write_temp(b"GGUF\x03\0\0\0", "short");
    let err = GgufFile::open(&path).unwrap_err();
    assert!(matches!(err, LlmError::BadFile { .. }), "{err}");
    assert!(err.to_string().contains("model.gguf") && err.to_string().contains("truncated"));
}

#[test]
fn the_fuzz_seed_parses() {
    let seed = include_bytes!("../../../fuzz/seeds/gguf_header/llama_tiny.gguf");
    let (meta, tensors) = parse_header(seed).unwrap();
    assert_eq!(meta["general.architecture"].as_str(), Some("llama"));
    assert_eq!(tensors.len(), 3);
    assert_eq!(tensors[1].ggml_type, GgmlType::from(TensorFormat::Q8_0));
}

/// For every block format: a tensor whose rows are not whole blocks (also
/// when its element count is: two rows of half a block), or whose element
/// count is not, is refused naming the tensor, the block size and the type;
/// data one byte short of its blocks is refused naming the tensor; the exact
/// size reads back with its type.
#[test]
fn every_block_format_refuses_partial_blocks_and_short_data() {
    use fucina::exec::QuantFormat;
    for q in QuantFormat::ALL {
        let f = TensorFormat::from(q);
        let (e, b) = (q.block_elements() as u64, q.block_bytes());
        let code = f.ggml_code();
        let one = |dims: &[u64], len: usize| {
            let mut w = Writer::default();
            w.tensor("blk.3.ffn_down.weight", dims, code, &vec![0u8; len]);
            w.bytes()
        };
        let want = format!(
            "tensor blk.3.ffn_down.weight: {} innermost elements are not a multiple of the {e}-element blocks of {}",
            e / 2,
            f.name()
        );
        // Half a block per row: one row (not a whole number of blocks), and
        // two rows (a whole block in all, but no row is).
        for dims in [&[e / 2][..], &[e / 2, 2]] {
            let msg = err_of(&one(dims, 2 * b));
            assert!(msg.contains(&want), "{q:?} {dims:?}: {msg}");
        }
        // A block and a half per row.
        let msg = err_of(&one(&[e + e / 2, 2], 4 * b));
        assert!(msg.contains("not a multiple of the"), "{q:?}: {msg}");
        // Two rows of one block each, one byte short (the file ends there).
        let msg = err_of(&one(&[e, 2], 2 * b - 1));
        assert!(
            msg.contains("tensor blk.3.ffn_down.weight: data [0, +")
                && msg.contains(&format!("+{})", 2 * b))
                && msg.contains("past the end"),
            "{q:?}: {msg}"
        );
        let (_, tensors) = parse_header(&one(&[e, 2], 2 * b)).unwrap();
        assert_eq!(tensors[0].ggml_type.format(), Some(f), "{q:?}");
        assert_eq!(tensors[0].shape(), vec![2, e as usize]);
    }
}

/// A ggml type code this reader does not read (one ggml defines, one it does
/// not, the largest u32): the header parses, and reading the tensor is an
/// error naming it and its type.
#[test]
fn unknown_type_codes_are_named_when_the_tensor_is_read() {
    for (code, name, described) in [
        (
            9u32,
            "q8_1".to_string(),
            "type q8_1 (ggml type 9)".to_string(),
        ),
        (
            15,
            "q8_k".to_string(),
            "type q8_k (ggml type 15)".to_string(),
        ),
        (
            99,
            "type 99".to_string(),
            "ggml type 99, which ggml does not define,".to_string(),
        ),
        (
            u32::MAX,
            format!("type {}", u32::MAX),
            format!("ggml type {}, which ggml does not define,", u32::MAX),
        ),
    ] {
        let mut w = Writer::default();
        w.tensor("blk.0.attn_q.weight", &[256, 2], code, &[0u8; 64]);
        let bytes = w.bytes();
        let (_, tensors) = parse_header(&bytes).unwrap();
        assert_eq!(tensors[0].ggml_type.format(), None);
        assert_eq!(tensors[0].ggml_type.name(), name);
        let path = write_temp(&bytes, &format!("unknown-{code}"));
        let file = GgufFile::open(&path).unwrap();
        let e = file.tensor("blk.0.attn_q.weight").unwrap_err();
        assert!(
            matches!(e, LlmError::BadTensor { ref name, .. } if name == "blk.0.attn_q.weight"),
            "{e}"
        );
        assert!(
            e.to_string()
                .contains(&format!("unsupported GGUF tensor {described} in ")),
            "{e}"
        );
    }
}
