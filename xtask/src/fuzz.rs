//! `cargo xtask fuzz [TARGET] [SECONDS]`: the cargo-fuzz targets of `fuzz/`
//! under libFuzzer with AddressSanitizer, on the installed stable toolchain.
//!
//! Sanitizers and libFuzzer's coverage instrumentation take unstable compiler
//! flags; `RUSTC_BOOTSTRAP=1` lets the pinned stable toolchain accept them, so
//! no nightly is needed, and `CARGO_CACHE_RUSTC_INFO=0` keeps cargo from reusing
//! a compiler probe cached without that variable.
//!
//! Each target reads the committed seeds of `fuzz/seeds/<target>/` (when there
//! are any) and its dictionary `fuzz/<target>.dict` (when there is one), and
//! grows its own corpus in `fuzz/corpus/<target>/` (not committed). A crash
//! stops the run; libFuzzer writes the input to `fuzz/artifacts/<target>/` and
//! prints the command that replays it. Keep every crash as a regression test in
//! the crate that owned the bug.

use std::path::PathBuf;
use std::process::Command;

use crate::{cargo, has_cargo_subcommand, step, workspace_root};

/// Seconds per target when `cargo xtask fuzz` is given none.
const DEFAULT_SECONDS: u64 = 180;

/// Seconds per target in `cargo xtask ci` (only when cargo-fuzz is installed).
pub(crate) const CI_SECONDS: u64 = 20;

fn fuzz_dir() -> PathBuf {
    workspace_root().join("fuzz")
}

/// The target names: the stems of `fuzz/fuzz_targets/*.rs`, sorted.
pub(crate) fn targets() -> Result<Vec<String>, String> {
    let dir = fuzz_dir().join("fuzz_targets");
    let entries = std::fs::read_dir(&dir).map_err(|e| format!("reading {}: {e}", dir.display()))?;
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .filter_map(|p| Some(p.file_stem()?.to_string_lossy().into_owned()))
        .collect();
    names.sort();
    Ok(names)
}

/// Parses `[TARGET] [SECONDS]` (either may be left out; a lone number is the
/// seconds).
fn parse_args(args: &[String], known: &[String]) -> Result<(Vec<String>, u64), String> {
    let (target, seconds) = match args {
        [] => (None, None),
        [one] if one.parse::<u64>().is_ok() => (None, Some(one)),
        [one] => (Some(one), None),
        [t, s] => (Some(t), Some(s)),
        _ => return Err("usage: cargo xtask fuzz [TARGET] [SECONDS]".to_string()),
    };
    let seconds = match seconds {
        None => DEFAULT_SECONDS,
        Some(s) => match s.parse::<u64>() {
            Ok(n) if n > 0 => n,
            _ => {
                return Err(format!(
                    "fuzz: SECONDS must be a positive integer, not `{s}`"
                ));
            }
        },
    };
    let chosen = match target {
        None => known.to_vec(),
        Some(t) if known.contains(t) => vec![t.clone()],
        Some(t) => {
            return Err(format!(
                "fuzz: unknown target `{t}` (targets: {})",
                known.join(", ")
            ));
        }
    };
    Ok((chosen, seconds))
}

/// `cargo xtask fuzz [TARGET] [SECONDS]`: installs cargo-fuzz when it is
/// missing, then runs TARGET (or every target, one after the other) for
/// SECONDS each.
pub(crate) fn run(args: &[String]) -> Result<(), String> {
    let known = targets()?;
    let (chosen, seconds) = parse_args(args, &known)?;
    if !has_cargo_subcommand("fuzz") {
        step(
            "install cargo-fuzz",
            cargo().args(["install", "cargo-fuzz", "--locked"]),
        )?;
    }
    run_targets(&chosen, seconds)
}

/// Runs each of `targets` for `seconds` (cargo-fuzz must be installed).
pub(crate) fn run_targets(targets: &[String], seconds: u64) -> Result<(), String> {
    for target in targets {
        step(
            &format!("fuzz {target}"),
            &mut fuzz_command(target, seconds)?,
        )?;
    }
    Ok(())
}

fn fuzz_command(target: &str, seconds: u64) -> Result<Command, String> {
    let dir = fuzz_dir();
    let corpus = dir.join("corpus").join(target);
    std::fs::create_dir_all(&corpus).map_err(|e| format!("creating {}: {e}", corpus.display()))?;
    let mut cmd = cargo();
    cmd.env("RUSTC_BOOTSTRAP", "1")
        .env("CARGO_CACHE_RUSTC_INFO", "0")
        .args(["fuzz", "run", "--sanitizer", "address", "--fuzz-dir"])
        .arg(&dir)
        .arg(target)
        .arg(&corpus);
    let seeds = dir.join("seeds").join(target);
    if seeds.is_dir() {
        cmd.arg(&seeds);
    }
    cmd.arg("--").arg(format!("-max_total_time={seconds}"));
    let dict = dir.join(format!("{target}.dict"));
    if dict.is_file() {
        cmd.arg(format!("-dict={}", dict.display()));
    }
    Ok(cmd)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn arguments() {
        let known = s(&["checkpoint_load", "views"]);
        assert_eq!(
            parse_args(&[], &known),
            Ok((known.clone(), DEFAULT_SECONDS))
        );
        assert_eq!(parse_args(&s(&["30"]), &known), Ok((known.clone(), 30)));
        assert_eq!(
            parse_args(&s(&["views"]), &known),
            Ok((s(&["views"]), DEFAULT_SECONDS))
        );
        assert_eq!(
            parse_args(&s(&["views", "5"]), &known),
            Ok((s(&["views"]), 5))
        );
        assert!(
            parse_args(&s(&["nope"]), &known)
                .unwrap_err()
                .contains("unknown target")
        );
        assert!(parse_args(&s(&["views", "0"]), &known).is_err());
        assert!(parse_args(&s(&["views", "x"]), &known).is_err());
        assert!(parse_args(&s(&["views", "1", "2"]), &known).is_err());
    }

    #[test]
    fn the_targets_are_found() {
        let t = targets().unwrap();
        assert!(t.contains(&"checkpoint_load".to_string()), "{t:?}");
        assert!(t.contains(&"views".to_string()), "{t:?}");
        assert!(t.contains(&"autograd_graphs".to_string()), "{t:?}");
    }
}
