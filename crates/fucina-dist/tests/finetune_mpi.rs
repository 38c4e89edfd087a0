//! LoRA fine-tuning (`fucina-llm`) under `mpirun` with 1, 2 and 4 ranks gives
//! the loss and adapter bits of the one-process run (the `finetune_dist`
//! example on `fucina-llm`'s fixture model). Skipped, saying so, when
//! `mpirun` is not on the PATH (a failure when `FUCINA_REQUIRE_MPI` is set).
//! Built with the `finetune` feature (`cargo test -p fucina-dist --features
//! finetune`; the workspace's `--all-features` runs include it).

mod common;

use std::process::{Command, Output};
use std::time::Duration;

use common::{example, have_mpirun, lines_starting, mpirun, run, temp_dir};

/// The `step`, `eval loss` and `adapter` lines of a run (it must succeed and
/// end with an `adapter` line).
fn job_lines(out: &Output, what: &str) -> Vec<String> {
    lines_starting(out, what, &["step ", "eval loss ", "adapter "], "adapter ")
}

#[test]
fn finetune_is_bit_identical_for_1_2_4_ranks_and_one_process() {
    if !have_mpirun() {
        return;
    }
    let exe = example("finetune_dist");
    let dir = temp_dir("finetune");
    let data = dir.join("data.jsonl");
    let mut lines = String::new();
    for i in 0..22 {
        lines += &format!(
            "{{\"prompt\": \"Q{i}: next?\", \"completion\": \" {}\"}}\n",
            i + 1
        );
    }
    std::fs::write(&data, lines).expect("the data file");
    let model = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fucina-llm/tests/fixtures/llama_f32"
    );
    let data = data.to_str().expect("a UTF-8 path");
    // 20 training rows, 2 a micro-batch, 4 micro-batches a step: 3 steps an
    // epoch (the last one has 2 micro-batches and 2 empty ones), 2 epochs;
    // dropout on, so each micro-batch's seed matters too.
    let base = [
        "--model",
        model,
        "--data",
        data,
        "--lora-r",
        "4",
        "--lora-alpha",
        "8",
        "--lora-dropout",
        "0.1",
        "--target",
        "q_proj,v_proj,down_proj",
        "--seq-len",
        "24",
        "--batch",
        "2",
        "--grad-accum",
        "4",
        "--epochs",
        "2",
        "--lr",
        "1e-2",
        "--eval-fraction",
        "0.1",
        "--seed",
        "5",
        "--threads",
        "1",
    ];
    let mut local = Command::new(&exe);
    local.arg("--local").args(base);
    let want = job_lines(&run(local, Duration::from_secs(120)), "--local");
    assert_eq!(
        want.iter().filter(|l| l.starts_with("step ")).count(),
        6,
        "{want:?}"
    );
    for np in [1, 2, 4] {
        let got = job_lines(&mpirun(np, &exe, &base), &format!("-np {np}"));
        assert_eq!(
            got, want,
            "mpirun -np {np} differs from the one-process run"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
