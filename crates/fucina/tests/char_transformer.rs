//! The `char_transformer` job: a seeded run is bit-identical (losses and sample)
//! across runs and thread counts, the loss falls over a short run, and bad input
//! (a missing or corrupt text, an unknown flag, a prompt outside the vocabulary)
//! is an error.

#[allow(dead_code)]
#[path = "../examples/char_transformer/job.rs"]
mod job;

use std::path::Path;

use clap::Parser;
use fucina::nn::Module;
use fucina::{Error, ExecContext};
use job::{Args, Corpus, TrainConfig};

/// A model and run small enough for a debug build: two blocks of width 16 with
/// four heads, windows of 16 characters.
fn tiny(steps: usize, seed: u64) -> TrainConfig {
    TrainConfig {
        d_model: 16,
        heads: 4,
        layers: 2,
        context: 16,
        batch: 8,
        steps,
        lr: 1e-2,
        warmup: 5,
        seed,
        ..TrainConfig::default()
    }
}

/// The first 64 KiB of the shipped text (enough for the tiny runs).
fn corpus() -> Corpus {
    let text = job::load_text(Path::new(job::default_data_path()), 1).unwrap();
    Corpus::new(&text[..64 * 1024])
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn the_shipped_text_loads() {
    let text = job::load_text(Path::new(job::default_data_path()), 1).unwrap();
    assert_eq!(text.len(), 684_768, "the size the data README states");
    let c = Corpus::new(&text);
    assert_eq!(c.vocab.len(), 75);
    assert_eq!(c.ids.len(), text.len());
    assert_eq!(c.decode(&c.ids[..200]).as_bytes(), &text[..200]);
    assert_eq!(c.decode(&c.encode("Elizabeth").unwrap()), "Elizabeth");
}

#[test]
fn a_seeded_run_is_bit_identical_and_the_loss_falls() {
    let c = corpus();
    let cfg = tiny(20, 7);
    let run = |threads: usize| {
        let ctx = ExecContext::with_threads(threads);
        let (report, model) = job::train(&ctx, &c, &cfg, &mut |_| {}).unwrap();
        let prompt = c.encode("The ").unwrap();
        let s = job::sample(&ctx, &model, &prompt, 40, 0.8, 3).unwrap();
        (report, s)
    };
    let (a, sa) = run(1);
    let (b, sb) = run(1);
    let (c2, sc) = run(2);
    assert_eq!(a.losses.len(), 20);
    assert_eq!(bits(&a.losses), bits(&b.losses), "same seed, same losses");
    assert_eq!(bits(&a.losses), bits(&c2.losses), "one thread and two");
    assert_eq!(a.val_loss.to_bits(), c2.val_loss.to_bits());
    assert_eq!(sa, sb, "same seed, same sample");
    assert_eq!(sa, sc);
    assert_eq!(sa.len(), 40);
    assert!(sa.iter().all(|&i| (0..c.vocab.len() as i64).contains(&i)));
    // The loss starts near ln(vocabulary) and falls.
    let mean = |v: &[f32]| v.iter().sum::<f32>() / v.len() as f32;
    let (first, last) = (mean(&a.losses[..5]), mean(&a.losses[15..]));
    let uniform = (c.vocab.len() as f32).ln();
    assert!(
        (first - uniform).abs() < 1.0,
        "first losses {first}, ln(vocab) {uniform}"
    );
    assert!(last < first - 0.7, "loss {first} -> {last}");
    assert!(
        a.val_loss < first,
        "held-out loss {} vs {first}",
        a.val_loss
    );
    // Another seed, another run.
    let ctx = ExecContext::with_threads(1);
    let (d, _) = job::train(&ctx, &c, &tiny(3, 8), &mut |_| {}).unwrap();
    assert_ne!(bits(&a.losses[..3]), bits(&d.losses));
}

#[test]
fn the_model_names_its_parameters_and_checks_its_input() {
    let ctx = ExecContext::new();
    let cfg = tiny(1, 0);
    let m = job::CharModel::new(&ctx, 30, &cfg).unwrap();
    let names: Vec<String> = m.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names[..2], ["tok_emb.weight", "pos_emb.weight"]);
    assert!(
        names.contains(&"blocks.1.attn.qkv.weight".to_string()),
        "{names:?}"
    );
    assert_eq!(names[names.len() - 2..], ["head.weight", "head.bias"]);
    // 2 blocks of 12 d^2 + 13 d, embeddings, final norm, head.
    let d = 16;
    assert_eq!(
        m.num_parameters(),
        2 * (12 * d * d + 13 * d) + 30 * d + 16 * d + 2 * d + d * 30 + 30
    );
    let ids = ctx.from_slice_typed::<i64>(&[2, 16], &[1; 32]).unwrap();
    assert_eq!(m.forward(&ctx, &ids).unwrap().shape(), [2, 16, 30]);
    let long = ctx.from_slice_typed::<i64>(&[1, 17], &[1; 17]).unwrap();
    assert!(matches!(
        m.forward(&ctx, &long),
        Err(Error::ShapeMismatch { .. })
    ));
    let out_of_vocab = ctx.from_slice_typed::<i64>(&[1, 2], &[1, 30]).unwrap();
    assert!(m.forward(&ctx, &out_of_vocab).is_err());
    // Greedy sampling needs no noise and is a pure function of the model.
    let g1 = job::sample(&ctx, &m, &[1, 2, 3], 20, 0.0, 1).unwrap();
    let g2 = job::sample(&ctx, &m, &[1, 2, 3], 20, 0.0, 99).unwrap();
    assert_eq!(g1, g2);
    assert!(job::sample(&ctx, &m, &[], 5, 1.0, 1).is_err());
}

#[test]
fn bad_input_is_an_error() {
    let parse = |a: &[&str]| {
        Args::try_parse_from(std::iter::once("char_transformer").chain(a.iter().copied()))
    };
    assert!(parse(&["--bogus"]).is_err());
    assert!(parse(&["--steps", "many"]).is_err());
    let a = parse(&["--steps", "12", "--seed", "5", "--threads", "2"]).unwrap();
    a.validate().unwrap();
    assert_eq!(
        a.config(),
        TrainConfig {
            steps: 12,
            seed: 5,
            ..TrainConfig::default()
        }
    );
    for (flags, what) in [
        (&["--steps", "0"][..], "--steps"),
        (&["--threads", "0"], "--threads"),
        (&["--log-every", "0"], "--log-every"),
        (&["--lr", "0"], "--lr"),
        (&["--lr", "inf"], "--lr"),
        (&["--temperature", "-1"], "--temperature"),
        (&["--temperature", "NaN"], "--temperature"),
        (&["--prompt", ""], "--prompt"),
    ] {
        let e = parse(flags).unwrap().validate().unwrap_err();
        assert!(e.to_string().starts_with(what), "{flags:?}: {e}");
    }
    // Data files.
    let data_error = |path: &Path, min: usize| match job::load_text(path, min) {
        Err(e @ Error::Data { .. }) => e.to_string(),
        other => panic!("expected a data error, got {:?}", other.map(|t| t.len())),
    };
    let e = data_error(Path::new("/nonexistent/text.txt.gz"), 1);
    assert!(
        e.contains("/nonexistent/text.txt.gz") && e.contains("cannot open"),
        "{e}"
    );
    let raw = std::env::temp_dir().join(format!("fucina-text-{}-raw.gz", std::process::id()));
    std::fs::write(&raw, "plain text, not gzip").unwrap();
    assert!(data_error(&raw, 1).contains("gzip"));
    let full = std::fs::read(job::default_data_path()).unwrap();
    std::fs::write(&raw, &full[..1000]).unwrap();
    assert!(data_error(&raw, 1).contains("gzip"), "a truncated file");
    let _ = std::fs::remove_file(&raw);
    let e = data_error(Path::new(job::default_data_path()), 10_000_000);
    assert!(e.contains("684768 bytes of text"), "{e}");
    // A text too short for the windows; a prompt outside the vocabulary.
    let short = Corpus::new(b"abcabcabcabcabcabcabcabcabcabc");
    let ctx = ExecContext::new();
    let e = job::train(&ctx, &short, &tiny(1, 0), &mut |_| {})
        .map(|_| ())
        .unwrap_err();
    assert!(e.to_string().contains("too short"), "{e}");
    let e = corpus().encode("Élise").unwrap_err();
    assert!(e.to_string().contains("--prompt"), "{e}");
}

#[test]
fn held_out_loss_with_quantized_linear_weights() {
    use fucina::exec::QuantFormat;
    let c = corpus();
    let ctx = ExecContext::with_threads(1);
    // width 32: every linear weight's input dimension is a multiple of 32
    let cfg = TrainConfig {
        d_model: 32,
        ..tiny(10, 3)
    };
    let (report, model) = job::train(&ctx, &c, &cfg, &mut |_| {}).unwrap();
    let before: Vec<Vec<u32>> = model
        .parameters()
        .iter()
        .map(|p| bits(&p.to_vec()))
        .collect();
    let f32_loss = job::held_out_loss(&ctx, &model, &c, &cfg).unwrap();
    assert_eq!(f32_loss.to_bits(), report.val_loss.to_bits());
    let q8 = job::quantized_held_out_loss(&ctx, &model, &c, &cfg, QuantFormat::Q8_0).unwrap();
    let q4 = job::quantized_held_out_loss(&ctx, &model, &c, &cfg, QuantFormat::Q4_0).unwrap();
    // the rounding changed the loss, Q4_0 more than Q8_0, and not by much
    assert_ne!(q8.to_bits(), f32_loss.to_bits());
    assert!(
        (q8 - f32_loss).abs() < (q4 - f32_loss).abs(),
        "{f32_loss} {q8} {q4}"
    );
    assert!((q4 / f32_loss - 1.0).abs() < 0.1, "{f32_loss} {q4}");
    // the weights are restored: the f32 loss again, bit for bit
    let after: Vec<Vec<u32>> = model
        .parameters()
        .iter()
        .map(|p| bits(&p.to_vec()))
        .collect();
    assert_eq!(before, after);
    let again = job::held_out_loss(&ctx, &model, &c, &cfg).unwrap();
    assert_eq!(again.to_bits(), f32_loss.to_bits());
    // width 16 cannot be cut into blocks of 32: an error naming a weight, and
    // nothing changed
    let cfg16 = tiny(1, 3);
    let (_, m16) = job::train(&ctx, &c, &cfg16, &mut |_| {}).unwrap();
    let before: Vec<Vec<u32>> = m16.parameters().iter().map(|p| bits(&p.to_vec())).collect();
    let e = job::quantized_held_out_loss(&ctx, &m16, &c, &cfg16, QuantFormat::Q8_0).unwrap_err();
    assert!(
        e.to_string().contains(".weight [") && e.to_string().contains("32"),
        "{e}"
    );
    let after: Vec<Vec<u32>> = m16.parameters().iter().map(|p| bits(&p.to_vec())).collect();
    assert_eq!(before, after);
}
