//! Checkpoints under `mpirun`: a run stopped and saved at one rank count goes
//! on at another (or in one process) with the same bits as the run that was
//! never stopped, and a rank killed mid-step ends the job within a bounded
//! time, leaving the last checkpoint whole. Skipped, saying so, without
//! `mpirun` (a failure with `FUCINA_REQUIRE_MPI` set), like `tests/mpi.rs`.

mod common;

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{example, have_mpirun, mpirun, mpirun_command, result_lines, run, temp_dir};

const LIMIT: Duration = Duration::from_secs(60);

fn local(exe: &Path, args: &[&str]) -> Vec<String> {
    let mut cmd = Command::new(exe);
    cmd.arg("--local").args(args);
    result_lines(&run(cmd, LIMIT), &format!("--local {args:?}"))
}

fn with<'a>(base: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
    base.iter().chain(extra).copied().collect()
}

#[test]
fn a_run_resumed_on_another_rank_count_goes_on_with_the_same_bits() {
    if !have_mpirun() {
        return;
    }
    let exe = example("train_digits_dist");
    let dir = temp_dir("resume");
    let ckpt = dir.join("run4.safetensors");
    let ckpt_s = ckpt.to_str().expect("a UTF-8 path");
    let base = [
        "--epochs",
        "3",
        "--steps",
        "3",
        "--seed",
        "5",
        "--threads",
        "1",
    ];

    // The uninterrupted run, at 4 ranks and in one process.
    let want = result_lines(&mpirun(4, &exe, &base), "-np 4");
    assert_eq!(want.len(), 4, "{want:?}");
    assert_eq!(local(&exe, &base), want, "--local differs from -np 4");

    // Stopped after epoch 1 at 4 ranks, saving: the first two epochs' lines.
    let stop = with(&base, &["--save", ckpt_s, "--stop-after-epoch", "1"]);
    let first = result_lines(&mpirun(4, &exe, &stop), "-np 4 --stop-after-epoch 1");
    assert_eq!(first[..first.len() - 1], want[..2], "{first:?}");
    let meta = fucina::checkpoint::read_metadata(&ckpt).expect("the checkpoint reads");
    assert_eq!(meta.get("fucina_dist.epoch"), Some("2"));
    assert_eq!(meta.get("fucina_dist.ranks"), Some("4"));
    assert_eq!(meta.get("fucina.optimizer"), Some("1"));

    // Resumed at 2 ranks, 1 rank and in one process: epoch 2 and the final
    // parameters of the uninterrupted run.
    let resume = with(&base, &["--resume", ckpt_s]);
    for np in [2, 1] {
        let got = result_lines(&mpirun(np, &exe, &resume), &format!("-np {np} --resume"));
        assert_eq!(got, want[2..], "resumed at -np {np}");
    }
    assert_eq!(local(&exe, &resume), want[2..], "resumed with --local");

    // The other way: saved by one process after epoch 0, resumed at 4 ranks.
    let ckpt1 = dir.join("run1.safetensors");
    let ckpt1_s = ckpt1.to_str().expect("a UTF-8 path");
    local(
        &exe,
        &with(&base, &["--save", ckpt1_s, "--stop-after-epoch", "0"]),
    );
    let got = result_lines(
        &mpirun(4, &exe, &with(&base, &["--resume", ckpt1_s])),
        "-np 4 --resume of a --local checkpoint",
    );
    assert_eq!(got, want[1..]);

    // A resumed run whose arguments differ from the saved run's is refused on
    // every rank, naming the file.
    let out = mpirun(2, &exe, &with(&resume, &["--lr", "0.02"]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("checkpoint {ckpt_s}: saved with --lr 0.01")),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sgd_runs_resume_too() {
    // One process only (no mpirun needed): the old optimizer's momentum-free
    // state round-trips as well.
    let exe = example("train_digits_dist");
    let dir = temp_dir("resume-sgd");
    let ckpt = dir.join("sgd.safetensors");
    let ckpt_s = ckpt.to_str().expect("a UTF-8 path");
    let base = [
        "--optim",
        "sgd",
        "--epochs",
        "3",
        "--steps",
        "2",
        "--seed",
        "2",
        "--threads",
        "1",
    ];
    let want = local(&exe, &base);
    local(
        &exe,
        &with(&base, &["--save", ckpt_s, "--stop-after-epoch", "0"]),
    );
    assert_eq!(local(&exe, &with(&base, &["--resume", ckpt_s])), want[1..]);
    // An AdamW run cannot resume an SGD checkpoint.
    let mut cmd = Command::new(&exe);
    cmd.arg("--local")
        .args(&base[2..])
        .args(["--resume", ckpt_s]);
    let out = run(cmd, LIMIT);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("saved with --optim sgd"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every process's parent (from `/proc/<pid>/stat`).
fn parents() -> HashMap<u32, u32> {
    let mut map = HashMap::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ...: the command may hold spaces and parentheses.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        if let Some(ppid) = rest.split_whitespace().nth(1).and_then(|s| s.parse().ok()) {
            map.insert(pid, ppid);
        }
    }
    map
}

/// The pid of the process of MPI rank `rank` started under `mpirun` `root`
/// (a descendant whose environment says `OMPI_COMM_WORLD_RANK={rank}`).
fn rank_pid(root: u32, rank: usize) -> Option<u32> {
    let parents = parents();
    let descends = |mut pid: u32| {
        while let Some(&p) = parents.get(&pid) {
            if p == root {
                return true;
            }
            if p <= 1 {
                return false;
            }
            pid = p;
        }
        false
    };
    let want = format!("OMPI_COMM_WORLD_RANK={rank}");
    parents.keys().copied().find(|&pid| {
        descends(pid)
            && std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|&b| b == 0).any(|v| v == want.as_bytes()))
    })
}

/// Reads a child's pipe to its end on a thread (so a chatty child never blocks).
fn drain(pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut pipe = pipe;
        let mut s = String::new();
        let _ = pipe.read_to_string(&mut s);
        s
    })
}

/// Waits for `child` at most `limit`; `None` on a timeout.
fn wait_for(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        if start.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_killed_rank_ends_the_job_and_leaves_the_last_checkpoint_whole() {
    if !have_mpirun() {
        return;
    }
    let exe = example("train_digits_dist");
    let dir = temp_dir("kill");
    let ckpt = dir.join("run.safetensors");
    let ckpt_s = ckpt.to_str().expect("a UTF-8 path");
    let base = ["--steps", "2", "--seed", "4", "--threads", "1"];
    // Practically endless: a checkpoint after every epoch, until the kill.
    let args = with(&base, &["--epochs", "1000000", "--save", ckpt_s]);
    let mut child = mpirun_command(2, &exe, &args, &dir.join("session"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mpirun starts");
    let stdout = drain(child.stdout.take().expect("stdout"));
    let stderr = drain(child.stderr.take().expect("stderr"));
    let root = child.id();
    let kill_all = |child: &mut Child| {
        if let Some(pid) = rank_pid(root, 0) {
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
        }
        let _ = child.kill();
        let _ = child.wait();
    };

    // The first checkpoint, then a few more epochs: the kill lands mid-training.
    let start = Instant::now();
    while !ckpt.exists() {
        if let Some(status) = child.try_wait().expect("try_wait") {
            panic!(
                "mpirun ended ({status}) before the first checkpoint:\n{}\n{}",
                stdout.join().unwrap(),
                stderr.join().unwrap()
            );
        }
        if start.elapsed() > LIMIT {
            kill_all(&mut child);
            panic!("no checkpoint within {LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(200));
    let Some(victim) = rank_pid(root, 1) else {
        kill_all(&mut child);
        panic!("rank 1 of mpirun {root} not found under /proc");
    };
    let status = Command::new("kill")
        .arg("-9")
        .arg(victim.to_string())
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -9 {victim} failed");
    let killed_at = Instant::now();
    let bound = Duration::from_secs(30);
    let Some(status) = wait_for(&mut child, bound) else {
        kill_all(&mut child);
        panic!("mpirun still runs {bound:?} after rank 1 (pid {victim}) was killed");
    };
    let took = killed_at.elapsed();
    let (stdout, stderr) = (stdout.join().unwrap(), stderr.join().unwrap());
    assert!(
        !status.success(),
        "mpirun succeeded after a rank was killed\n{stderr}"
    );
    // Open MPI says which rank died, and how.
    assert!(
        stderr.contains("rank 1") && stderr.contains("signal 9"),
        "mpirun's message does not name the killed rank:\n{stderr}"
    );
    eprintln!("mpirun ended {took:?} after the kill ({status})");
    assert!(stdout.lines().any(|l| l.starts_with("epoch ")), "{stdout}");

    // The last checkpoint is whole: it loads, and a one-process run resumed
    // from it goes on as the uninterrupted run does.
    let meta = fucina::checkpoint::read_metadata(&ckpt).expect("the checkpoint is whole");
    let epoch: u64 = meta
        .get("fucina_dist.epoch")
        .and_then(|e| e.parse().ok())
        .expect("an epoch entry");
    assert!(epoch >= 1, "{meta:?}");
    let epochs = (epoch + 1).to_string();
    let want = local(&exe, &with(&base, &["--epochs", &epochs]));
    let got = local(
        &exe,
        &with(&base, &["--epochs", &epochs, "--resume", ckpt_s]),
    );
    assert_eq!(got[..], want[want.len() - 2..], "resumed after the kill");
    // And no temporary file of an interrupted save is mistaken for it.
    assert!(ckpt.is_file());
    let _ = std::fs::remove_dir_all(&dir);
}
