//! Prefill and decode throughput of a model directory or a GGUF file, against
//! the memory-bandwidth limit measured in the same run.
//!
//! ```text
//! cargo run --release -p fucina-llm --example bench -- --model DIR --threads 1
//! cargo run --release -p fucina-llm --example bench -- --model model.gguf --threads 1
//! ```
//!
//! `--model` is a Hugging Face model directory (config.json + safetensors) or a
//! GGUF file (a path ending in `.gguf`, loaded through
//! `fucina_llm::arch::gguf::load_gguf`: float tensors and block-quantized
//! matrices kept in llama.cpp's blocks, the blocks of 32 (Q8_0, Q4_0, Q5_0,
//! Q4_1, Q5_1, IQ4_NL) and the Q4_K matrices of a multiple of eight rows then
//! repacked once for the kernels as `open_model` does, unless `--in-place`;
//! the other block formats are always read in place), so the
//! very files llama.cpp runs can be measured here
//! (`benches/llm/llamacpp_compare.py` does both).
//! `--dtype` converts the matrices at load as `generate --dtype` does. The
//! count of tensors per format, and the matrices that fell back, are printed
//! after loading (`--verbose`: every tensor).
//!
//! Measures, in this order and in one process:
//! - prefill tokens/s for each prompt length of `--prefill` (random ids, a fresh
//!   cache each time), median of `--reps`;
//! - decode tokens/s at each batch size of `--batch`: after a 16-token prompt per
//!   sequence, `--decode` steps of one token per sequence (greedy), tokens/s
//!   counting every sequence's token; at batch 1 the first 8 greedy ids of the
//!   first repetition are printed (a check that another engine runs the same
//!   model: `benches/llm/llamacpp_compare.py` prints the same line);
//! - the peak resident memory against the model's file size plus the KV caches
//!   it allocated (the caches come from the context's pool, which keeps a
//!   dropped cache for reuse: the pool is trimmed after each phase, so the peak
//!   is that of one phase);
//! - the streaming read bandwidth: a sum over a buffer larger than the caches
//!   (`--stream-mib`, default 1024 MiB) on `--threads` threads, median of 5, and
//!   decode at batch 1 as a fraction of the bandwidth limit (weight bytes read
//!   per decoded token ÷ that bandwidth).

use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use fucina::ExecContext;
use fucina_llm::arch::gguf::load_gguf;
use fucina_llm::{KvCache, LoadDtype, Model, ModelConfig, WeightStore};

#[derive(Parser)]
#[command(about = "fucina-llm prefill/decode throughput against the bandwidth limit")]
struct Args {
    /// The model: a directory (config.json + safetensors) or a `.gguf` file.
    #[arg(long)]
    model: PathBuf,
    /// Worker threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Prompt lengths to prefill, comma-separated.
    #[arg(long, default_value = "128,512")]
    prefill: String,
    /// Batch sizes to decode, comma-separated.
    #[arg(long, default_value = "1,8")]
    batch: String,
    /// Decode steps per measurement.
    #[arg(long, default_value_t = 32)]
    decode: usize,
    /// Repetitions (the median is reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Size of the streaming-read buffer in MiB.
    #[arg(long, default_value_t = 1024)]
    stream_mib: usize,
    /// Convert the matrices at load (`WeightStore::convert`, as `generate
    /// --dtype`): f32, f16, bf16 or a block format (default: the file's own
    /// formats).
    #[arg(long)]
    dtype: Option<LoadDtype>,
    /// Print every tensor's format at load, not only the count per format and
    /// the fallbacks.
    #[arg(long)]
    verbose: bool,
    /// Read the repackable matrices (the blocks of 32, Q4_K of whole strips) in place
    /// (`quant_matmul`) instead of from the kernels' repacked strips that
    /// `open_model` makes (`quant_matmul_packed`).
    #[arg(long)]
    in_place: bool,
    /// Run the projections as bf16 products with the AMX rule
    /// (`Model::use_bf16_products`; a bf16 model).
    #[arg(long)]
    bf16_products: bool,
    /// With `--bf16-products`: calls of fewer rows than this take the AVX-512
    /// emulation rather than the AMX tiles (the same bits; default: the
    /// library's threshold).
    #[arg(long)]
    amx_min_rows: Option<usize>,
}

fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// Streaming read bandwidth in bytes/s: `threads` threads each sum their share of
/// `buf` with sixteen independent accumulators.
fn stream_read(buf: &[f32], threads: usize) -> f64 {
    let t0 = Instant::now();
    let chunk = buf.len().div_ceil(threads);
    let total: f32 = std::thread::scope(|s| {
        let hs: Vec<_> = buf
            .chunks(chunk)
            .map(|part| {
                s.spawn(move || {
                    let mut acc = [0.0f32; 16];
                    for c in part.chunks_exact(16) {
                        for (a, v) in acc.iter_mut().zip(c) {
                            *a += v;
                        }
                    }
                    acc.iter().sum::<f32>()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    let dt = t0.elapsed().as_secs_f64();
    std::hint::black_box(total);
    std::mem::size_of_val(buf) as f64 / dt
}

/// Peak resident set size of this process in bytes (`VmHWM`), if readable.
fn peak_rss() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// `n` pseudo-random token ids below `vocab` (a fixed sequence).
fn ids(n: usize, vocab: usize, salt: u64) -> Vec<u32> {
    let mut s = 0x9E37_79B9_7F4A_7C15u64 ^ salt;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % vocab as u64) as u32
        })
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let parse =
        |s: &str| -> Vec<usize> { s.split(',').filter_map(|v| v.trim().parse().ok()).collect() };
    if args.threads == 0 {
        return Err("--threads must be at least 1".into());
    }
    let ctx = ExecContext::with_threads(args.threads);
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".to_string());
    println!("CPU: {cpu}; {} threads", args.threads);

    // 2. The model.
    let t0 = Instant::now();
    let is_gguf = args
        .model
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
    let (config, store, file_bytes) = if is_gguf {
        let (config, store, _file) = load_gguf(&args.model)?;
        // The GGUF file stays mapped through the weights that borrow it.
        let file_bytes = std::fs::metadata(&args.model)?.len() as usize;
        (config, store, file_bytes)
    } else {
        let store = WeightStore::open(&args.model)?;
        let file_bytes = store.file_bytes() as usize;
        let config = ModelConfig::from_file(args.model.join("config.json"))?;
        (config, store, file_bytes)
    };
    let mut store = match args.dtype {
        Some(d) => store.convert(&ctx, d, config.tie_word_embeddings)?,
        None => store,
    };
    if !args.in_place {
        let n = store.repack_quantized(&ctx)?;
        println!("repacked {n} quantized matrices for the kernels (--in-place: read in place)");
    }
    let mut model = Model::from_parts(config, store)?;
    println!("{}", model.formats());
    if args.verbose {
        print!("{}", model.formats().listing());
    }
    if args.bf16_products {
        if let Some(rows) = args.amx_min_rows {
            fucina::exec::set_amx_rule_min_rows(rows);
        }
        model.use_bf16_products()?;
        println!(
            "bf16 products with the AMX rule ({} path)",
            fucina::exec::amx_rule_path()
        );
    }
    let cfg = model.config().clone();
    let weight_bytes = model.weight_bytes_per_token();
    println!(
        "model: {} layers, hidden {}, vocab {}; loaded in {:.2} s; {:.1} MB of weights read per decoded token",
        cfg.num_hidden_layers,
        cfg.hidden_size,
        cfg.vocab_size,
        t0.elapsed().as_secs_f64(),
        weight_bytes as f64 / 1e6
    );
    let vocab = cfg.vocab_size;
    let mut last = vec![0.0f32; vocab];
    let mut cache_bytes = 0usize;
    let mut batch1_step = None;

    // 3. Prefill.
    for t in parse(&args.prefill) {
        let prompt = ids(t, vocab, t as u64);
        let mut times = Vec::new();
        for _ in 0..args.reps + 1 {
            let mut cache = model.new_cache(&ctx, t)?;
            let t0 = Instant::now();
            model.prefill(&ctx, &mut cache, &prompt, None, &mut last)?;
            times.push(t0.elapsed().as_secs_f64());
            cache_bytes = cache_bytes.max(cache.bytes());
        }
        times.remove(0); // warm-up
        // The dropped caches went back to the context's pool, which keeps them
        // for the next cache of their size; the next phase makes caches of
        // another size, so give them back to the system (as a server would
        // between sessions of different lengths) to measure the peak resident
        // memory of one phase, not of all of them.
        ctx.pool().trim();
        let (m, lo, hi) = median(times);
        println!(
            "prefill {t}: {:.1} tokens/s (median {:.1} ms, min {:.1}, max {:.1})",
            t as f64 / m,
            m * 1e3,
            lo * 1e3,
            hi * 1e3
        );
    }

    // 4. Decode.
    for b in parse(&args.batch) {
        let mut times = Vec::new();
        for rep in 0..args.reps + 1 {
            let mut caches: Vec<KvCache> = (0..b)
                .map(|_| model.new_cache(&ctx, 16 + args.decode))
                .collect::<Result<_, _>>()?;
            let mut next = vec![0u32; b];
            for (i, c) in caches.iter_mut().enumerate() {
                model.prefill(
                    &ctx,
                    c,
                    &ids(16, vocab, (rep * 64 + i) as u64),
                    None,
                    &mut last,
                )?;
                next[i] = argmax(&last);
            }
            cache_bytes = cache_bytes.max(caches.iter().map(KvCache::bytes).sum());
            let mut logits = vec![0.0f32; b * vocab];
            let mut greedy = Vec::with_capacity(args.decode + 1);
            greedy.push(next[0]);
            let t0 = Instant::now();
            for _ in 0..args.decode {
                let mut refs: Vec<&mut KvCache> = caches.iter_mut().collect();
                model.decode(&ctx, &mut refs, &next, &mut logits)?;
                for (i, n) in next.iter_mut().enumerate() {
                    *n = argmax(&logits[i * vocab..(i + 1) * vocab]);
                }
                greedy.push(next[0]);
            }
            times.push(t0.elapsed().as_secs_f64());
            if rep == 0 && b == 1 {
                // A check that two engines run the same model: the greedy ids
                // after the first prompt (llamacpp_compare.py prints the same).
                greedy.truncate(8);
                println!("greedy ids after prompt 0: {greedy:?}");
            }
        }
        times.remove(0);
        ctx.pool().trim(); // as after the prefills
        let (m, lo, hi) = median(times);
        let step = m / args.decode as f64;
        let line = format!(
            "decode batch {b}: {:.1} tokens/s (median {:.2} ms/step, min {:.2}, max {:.2})",
            (b * args.decode) as f64 / m,
            step * 1e3,
            lo / args.decode as f64 * 1e3,
            hi / args.decode as f64 * 1e3
        );
        if b == 1 {
            batch1_step = Some(step);
        }
        println!("{line}");
    }

    if let Some(rss) = peak_rss() {
        let file = file_bytes;
        println!(
            "peak RSS {:.1} MB; file {:.1} MB + largest KV cache set {:.1} MB = {:.1} MB; ratio {:.2}",
            rss as f64 / 1e6,
            file as f64 / 1e6,
            cache_bytes as f64 / 1e6,
            (file + cache_bytes) as f64 / 1e6,
            rss as f64 / (file + cache_bytes) as f64
        );
    }

    // 5. The bandwidth limit (after the peak RSS is read: the buffer is larger
    // than the model).
    let buf = vec![1.0f32; args.stream_mib << 18];
    stream_read(&buf, args.threads); // fault the pages in
    let (bw, bw_lo, bw_hi) = median((0..5).map(|_| stream_read(&buf, args.threads)).collect());
    drop(buf);
    println!(
        "stream read: {:.2} GB/s (min {:.2}, max {:.2})",
        bw / 1e9,
        bw_lo / 1e9,
        bw_hi / 1e9
    );

    if let Some(step) = batch1_step {
        let limit = bw / weight_bytes as f64;
        println!(
            "decode batch 1 against the bandwidth limit: {:.1} of {limit:.1} tokens/s = {:.2}",
            1.0 / step,
            (1.0 / step) / limit
        );
    }
    Ok(())
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}
