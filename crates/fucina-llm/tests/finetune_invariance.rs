//! A LoRA fine-tune gives the same bits — every loss, the evaluation loss and
//! every adapter value — for 1, 2 and 4 threads and at every vector level the
//! CPU has, with the adapters' dropout on, on f32 and bf16 base weights (the
//! bf16 job with packed rows), and on the bf16 base with bf16 products on
//! the AMX rule (`TrainableDecoder::use_bf16_products`: the `vdpbf16ps`
//! kernel where the CPU has AVX512_BF16, the portable emulation at the
//! other levels).
//! (One test binary of its own: it switches the process's vector level.)

mod model_support;

use fucina::exec::{SimdLevel, WeightFormat, detected_simd_level, force_simd_level};
use fucina_llm::finetune::data::Example;
use fucina_llm::finetune::{LoraConfig, Target, TrainOptions, TrainableDecoder, Trainer};
use fucina_llm::fucina::ExecContext;
use fucina_llm::{ModelConfig, WeightStore};

/// Eight examples of 16 to 30 tokens with prompts of 0 to 6.
fn examples(vocab: usize) -> Vec<Example> {
    (0..8)
        .map(|k| {
            let len = 16 + 2 * k;
            Example {
                ids: (0..len)
                    .map(|i| ((i * 31 + k * 7 + 3) % vocab) as u32)
                    .collect(),
                prompt_len: k % 7,
            }
        })
        .collect()
}

/// Losses, evaluation loss and adapter values (as bits) of two steps of
/// batch 4.
fn run(
    c: &ModelConfig,
    store: &WeightStore,
    pack: Option<usize>,
    bf16_products: bool,
    threads: usize,
) -> (Vec<u32>, u32, Vec<u32>) {
    let ctx = ExecContext::with_threads(threads);
    let lora = LoraConfig {
        r: 8,
        alpha: 16.0,
        dropout: 0.1,
        targets: Target::ALL.to_vec(),
        seed: 3,
    };
    let mut model = TrainableDecoder::from_parts(&ctx, c.clone(), store, &lora).unwrap();
    if bf16_products {
        model.use_bf16_products().unwrap();
    }
    let opts = TrainOptions {
        lr: 1e-2,
        warmup_steps: 1,
        batch: 4,
        pack,
        ..TrainOptions::default()
    };
    let ex = examples(c.vocab_size);
    let mut trainer = Trainer::new(model, opts, 2).unwrap();
    let mut losses = Vec::new();
    for batch in trainer.epoch_batches(&ex, 0) {
        losses.push(trainer.step(&ctx, &batch).unwrap().to_bits());
    }
    let eval = trainer.eval(&ctx, &ex).unwrap().to_bits();
    let bits = trainer
        .model()
        .parameters()
        .iter()
        .flat_map(|p| p.to_vec())
        .map(f32::to_bits)
        .collect();
    (losses, eval, bits)
}

#[test]
fn a_fine_tune_is_the_same_bits_for_every_thread_count_and_vector_level() {
    let mut c = model_support::llama(64);
    c.head_dim = 32;
    let best = detected_simd_level();
    let levels: Vec<SimdLevel> = SimdLevel::available().collect();
    eprintln!("levels compared: {levels:?}");
    // The f32 base one example per row, the bf16 base packed (six rows of
    // one or two examples), and the bf16 base on bf16 products both ways.
    let jobs = [
        (WeightFormat::F32, None, false),
        (WeightFormat::BF16, Some(48), false),
        (WeightFormat::BF16, None, true),
        (WeightFormat::BF16, Some(48), true),
    ];
    let mut exact_bf16 = None;
    for (format, pack, bf16) in jobs {
        let store = WeightStore::from_tensors(model_support::random_weights(&c, format, 11));
        let reference = run(&c, &store, pack, bf16, 1);
        // bf16 products change the losses (the inputs are rounded), a little.
        if format == WeightFormat::BF16 && pack.is_some() {
            match exact_bf16.take() {
                None => exact_bf16 = Some(reference.0.clone()),
                Some(exact) => {
                    assert_ne!(exact, reference.0, "bf16 products changed nothing");
                    for (&a, &b) in exact.iter().zip(&reference.0) {
                        let (a, b) = (f32::from_bits(a), f32::from_bits(b));
                        assert!((a - b).abs() <= 1e-2 * a.abs(), "loss {a} against {b}");
                    }
                }
            }
        }
        assert_eq!(reference.0.len(), 2);
        for &level in &levels {
            assert!(force_simd_level(level));
            for threads in [1, 2, 4] {
                assert_eq!(
                    run(&c, &store, pack, bf16, threads),
                    reference,
                    "{format:?} (bf16 products: {bf16}) at {level:?} on {threads} threads"
                );
            }
        }
        assert!(force_simd_level(best));
    }
}
