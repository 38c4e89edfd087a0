//! The README's commands as a newcomer runs them: one build that every command
//! shares.
//!
//! - `cargo xtask build-sharing` (part of `cargo xtask ci`, seconds): asks cargo
//!   for the unit graph of each README build (`--unit-graph`, no compilation)
//!   and fails when a workspace crate would be compiled differently by two of
//!   them — a feature of a shared dependency that one command's dependency
//!   graph turns on and another's does not recompiles every crate above it. It
//!   also checks that each command is still the one README.md gives.
//! - `cargo xtask first-hour [--ci]` (not in CI: a release build from
//!   nothing, many minutes): clones the repository into a temporary
//!   directory and runs the README's commands in order, timing each one's
//!   build and run, and fails when a workspace crate is compiled twice (a
//!   dependency that a later command needs in another configuration is
//!   listed); `--ci` adds `cargo xtask ci` at the end.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::json::Json;
use crate::{cargo, workspace_root};

/// One README command: its example, the cargo arguments that build it, the
/// arguments it runs with, whether it runs under `mpirun`, and what it needs.
struct ReadmeCommand {
    example: &'static str,
    package: &'static str,
    run_args: &'static [&'static str],
    /// How README.md spells the command (checked to be there).
    readme: &'static str,
    needs: Need,
}

#[derive(Clone, Copy, PartialEq)]
enum Need {
    Nothing,
    /// Debian's dataset-fashion-mnist.
    FashionMnist,
    /// Open MPI (`mpirun`, `mpicc`) and libclang.
    Mpi,
}

/// The README's commands, in the order it gives them.
const README_COMMANDS: &[ReadmeCommand] = &[
    ReadmeCommand {
        example: "train_digits",
        package: "fucina",
        run_args: &[],
        readme: "cargo run --release -p fucina --example train_digits",
        needs: Need::Nothing,
    },
    ReadmeCommand {
        example: "char_transformer",
        package: "fucina",
        run_args: &[],
        readme: "cargo run --release -p fucina --example char_transformer",
        needs: Need::Nothing,
    },
    ReadmeCommand {
        example: "train_fashion",
        package: "fucina",
        run_args: &[],
        readme: "cargo run --release -p fucina --example train_fashion",
        needs: Need::FashionMnist,
    },
    ReadmeCommand {
        example: "generate",
        package: "fucina-llm",
        run_args: &[
            "--model",
            "crates/fucina-llm/tests/fixtures/llama_f32",
            "--prompt",
            "The quick brown fox;the cat",
            "--max-new-tokens",
            "16",
        ],
        readme: "cargo run --release -p fucina-llm --example generate",
        needs: Need::Nothing,
    },
    ReadmeCommand {
        example: "train_digits_dist",
        package: "fucina-dist",
        run_args: &["--epochs", "3", "--seed", "1"],
        readme: "cargo build --release -p fucina-dist --example train_digits_dist",
        needs: Need::Mpi,
    },
];

impl ReadmeCommand {
    fn build_args(&self) -> [&'static str; 5] {
        ["--release", "-p", self.package, "--example", self.example]
    }
}

/// `cargo xtask build-sharing`.
pub(crate) fn build_sharing() -> Result<(), String> {
    let readme = std::fs::read_to_string(workspace_root().join("README.md"))
        .map_err(|e| format!("README.md: {e}"))?;
    // Workspace lib name -> signature -> the commands that build it so.
    let mut seen: BTreeMap<String, BTreeMap<u64, Vec<&str>>> = BTreeMap::new();
    let mut features: Vec<(&str, BTreeMap<String, BTreeSet<String>>)> = Vec::new();
    for c in README_COMMANDS {
        if !readme.contains(c.readme) {
            return Err(format!(
                "README.md no longer gives `{}`: update README_COMMANDS in xtask/src/first_hour.rs",
                c.readme
            ));
        }
        let graph = unit_graph(&c.build_args())?;
        for (name, sig) in workspace_libs(&graph)? {
            seen.entry(name)
                .or_default()
                .entry(sig)
                .or_default()
                .push(c.example);
        }
        features.push((c.example, dependency_features(&graph)));
    }
    let split: Vec<String> = seen
        .iter()
        .filter(|(_, sigs)| sigs.len() > 1)
        .map(|(name, sigs)| {
            let groups: Vec<String> = sigs.values().map(|v| v.join(" + ")).collect();
            format!("{name} ({})", groups.join(" | "))
        })
        .collect();
    if split.is_empty() {
        eprintln!(
            "build-sharing: the {} README builds compile each of the {} workspace crates they share the same way",
            README_COMMANDS.len(),
            seen.len()
        );
        return Ok(());
    }
    Err(format!(
        "README builds compile these workspace crates differently, so each command \
         recompiles them: {}\ndependency features that differ: {}\n(request the union of the \
         features in the lowest workspace crate that depends on the package; see \
         crates/fucina-derive/Cargo.toml)",
        split.join("; "),
        feature_differences(&features).join("; ")
    ))
}

/// `cargo build --unit-graph` for `args` (no compilation).
fn unit_graph(args: &[&str]) -> Result<Json, String> {
    let out = cargo()
        .args(["build", "--unit-graph", "-Z", "unstable-options"])
        .args(args)
        // The unit graph is an unstable cargo flag; the pinned stable cargo
        // prints it with this variable (it changes nothing else here).
        .env("RUSTC_BOOTSTRAP", "1")
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cargo build --unit-graph: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo build --unit-graph {} failed ({})",
            args.join(" "),
            out.status
        ));
    }
    Json::parse(&String::from_utf8_lossy(&out.stdout))
}

/// `name@version` of a unit's package id (`path+file:///..#fucina@0.1.0`,
/// `registry+https://..#syn@2.0.1`), and whether it is a workspace path.
fn package(unit: &Json) -> (String, bool) {
    let id = unit.get("pkg_id").str();
    let local = id.starts_with("path+file://");
    let tail = id.rsplit('#').next().unwrap_or(id);
    // A path package named like its directory is spelled `#0.1.0`.
    let name = if tail.contains('@') {
        tail.to_string()
    } else {
        let dir = id.split('#').next().unwrap_or(id);
        format!("{}@{tail}", dir.rsplit('/').next().unwrap_or(dir))
    };
    (name, local)
}

/// The signature of every workspace library unit: a hash of everything that
/// decides its compilation (package, target, mode, features, profile,
/// platform) and, recursively, of its dependencies'.
fn workspace_libs(graph: &Json) -> Result<Vec<(String, u64)>, String> {
    let units = graph.get("units").items();
    let mut memo: HashMap<usize, u64> = HashMap::new();
    fn sig(i: usize, units: &[Json], memo: &mut HashMap<usize, u64>) -> Result<u64, String> {
        if let Some(&s) = memo.get(&i) {
            return Ok(s);
        }
        let u = units
            .get(i)
            .ok_or_else(|| format!("unit graph: no unit {i}"))?;
        let mut deps = Vec::new();
        for d in u.get("dependencies").items() {
            let j = d
                .get("index")
                .index()
                .ok_or("unit graph: a dependency without an index")?;
            deps.push(sig(j, units, memo)?);
        }
        deps.sort_unstable();
        let mut h = std::collections::hash_map::DefaultHasher::new();
        package(u).0.hash(&mut h);
        for key in ["target", "mode", "features", "profile", "platform"] {
            u.get(key).canonical().hash(&mut h);
        }
        deps.hash(&mut h);
        let s = h.finish();
        memo.insert(i, s);
        Ok(s)
    }
    let mut out = Vec::new();
    for (i, u) in units.iter().enumerate() {
        let (name, local) = package(u);
        let kinds = u.get("target").get("kind").items();
        let is_lib = kinds
            .iter()
            .any(|k| matches!(k.str(), "lib" | "rlib" | "proc-macro"));
        if local && is_lib && u.get("mode").str() == "build" {
            out.push((name, sig(i, units, &mut memo)?));
        }
    }
    Ok(out)
}

/// Each dependency package's feature sets (one per unit: host and target
/// units may differ).
fn dependency_features(graph: &Json) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for u in graph.get("units").items() {
        let (name, local) = package(u);
        if !local && u.get("mode").str() == "build" {
            out.entry(name)
                .or_default()
                .insert(u.get("features").canonical());
        }
    }
    out
}

/// The packages whose feature sets differ between the first command and
/// another one that builds them too.
fn feature_differences(all: &[(&str, BTreeMap<String, BTreeSet<String>>)]) -> Vec<String> {
    let Some((first, base)) = all.first() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (other, feats) in &all[1..] {
        for (name, sets) in feats {
            if let Some(b) = base.get(name)
                && b != sets
            {
                out.push(format!("{name}: {first} {b:?}, {other} {sets:?}"));
            }
        }
    }
    out
}

/// `cargo xtask first-hour [--ci]`.
pub(crate) fn first_hour(args: &[String]) -> Result<(), String> {
    let with_ci = match args {
        [] => false,
        [a] if a == "--ci" => true,
        _ => return Err("usage: cargo xtask first-hour [--ci]".to_string()),
    };
    let root = workspace_root();
    let dir = std::env::temp_dir().join(format!("fucina-first-hour-{}", std::process::id()));
    let clone_start = Instant::now();
    let status = Command::new("git")
        .args(["clone", "--quiet"])
        .arg(&root)
        .arg(&dir)
        .status()
        .map_err(|e| format!("git clone: {e}"))?;
    if !status.success() {
        return Err(format!("git clone {} failed", root.display()));
    }
    eprintln!(
        "first-hour: cloned HEAD into {} ({:.1} s); each command builds in that clone's own target/",
        dir.display(),
        clone_start.elapsed().as_secs_f64()
    );
    let mut rows = Vec::new();
    // (a workspace crate?, "package target (kinds)") -> the commands that
    // compiled it.
    let mut compiled: BTreeMap<(bool, String), Vec<&str>> = BTreeMap::new();
    for c in README_COMMANDS {
        if let Some(why) = unavailable(c.needs) {
            eprintln!("first-hour: skipping {} ({why})", c.example);
            rows.push(format!("| `{}` | skipped: {why} | | |", c.example));
            continue;
        }
        eprintln!(
            "\n==> [first-hour] cargo build {}",
            c.build_args().join(" ")
        );
        let start = Instant::now();
        let out = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
            .arg("build")
            .args(c.build_args())
            .args(["--message-format", "json-render-diagnostics"])
            .current_dir(&dir)
            .env_remove("CARGO_TARGET_DIR")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| format!("cargo build: {e}"))?;
        let build_secs = start.elapsed().as_secs_f64();
        if !out.status.success() {
            return Err(format!("building {} failed", c.example));
        }
        // One `compiler-artifact` message per unit; `fresh: false` when this
        // command compiled it.
        let mut units = 0;
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let Ok(msg) = Json::parse(line) else {
                continue;
            };
            if msg.get("reason").str() != "compiler-artifact"
                || msg.get("fresh") != &Json::Bool(false)
            {
                continue;
            }
            let target = msg.get("target");
            let kinds: Vec<&str> = target.get("kind").items().iter().map(Json::str).collect();
            let id = msg.get("package_id").str();
            let name = id.rsplit('#').next().unwrap_or(id);
            let key = format!("{name} {} ({})", target.get("name").str(), kinds.join(","));
            compiled
                .entry((id.starts_with("path+file://"), key))
                .or_default()
                .push(c.example);
            units += 1;
        }
        let start = Instant::now();
        run_example(&dir, c)?;
        let run_secs = start.elapsed().as_secs_f64();
        rows.push(format!(
            "| `{}` | {build_secs:.0} s ({units} units) | {run_secs:.1} s |",
            c.example
        ));
    }
    if with_ci {
        let start = Instant::now();
        let status = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
            .args(["xtask", "ci"])
            .current_dir(&dir)
            .env_remove("CARGO_TARGET_DIR")
            .status()
            .map_err(|e| format!("cargo xtask ci: {e}"))?;
        rows.push(format!(
            "| `cargo xtask ci` | {:.0} s in all ({status}) | |",
            start.elapsed().as_secs_f64()
        ));
    }
    let twice = |workspace: bool| -> Vec<String> {
        compiled
            .iter()
            .filter(|((w, _), by)| *w == workspace && by.len() > 1)
            .map(|((_, k), by)| format!("{k}: {}", by.join(", ")))
            .collect()
    };
    let (ours, theirs) = (twice(true), twice(false));
    println!("\n| command | build (units compiled) | run |\n| --- | --- | --- |");
    for r in &rows {
        println!("{r}");
    }
    println!("\nCPU: {}; {} threads", cpu_model(), num_threads());
    let _ = std::fs::remove_dir_all(&dir);
    if !theirs.is_empty() {
        // A later command's dependency graph asks other features of these (or
        // needs them for build scripts, compiled apart): nothing the first
        // command built is rebuilt, but it is compile time all the same.
        println!(
            "Dependencies compiled in another configuration by a later command: {}",
            theirs.join("; ")
        );
    }
    if ours.is_empty() {
        println!("No workspace crate was compiled twice.");
        Ok(())
    } else {
        Err(format!(
            "workspace crates compiled more than once: {}",
            ours.join("; ")
        ))
    }
}

/// Why a command cannot run here, if it cannot.
fn unavailable(need: Need) -> Option<&'static str> {
    match need {
        Need::Nothing => None,
        Need::FashionMnist => {
            (!Path::new("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz").exists())
                .then_some("Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)")
        }
        Need::Mpi => (!crate::missing_mpi_packages().is_empty())
            .then_some("Open MPI or libclang is not installed"),
    }
}

fn run_example(dir: &Path, c: &ReadmeCommand) -> Result<(), String> {
    let exe = dir.join("target/release/examples").join(c.example);
    let mut cmd = if c.needs == Need::Mpi {
        let mut m = Command::new("mpirun");
        m.args(["-np", "4", "--oversubscribe"])
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .arg(&exe);
        m
    } else {
        Command::new(&exe)
    };
    let status = cmd
        .args(c.run_args)
        .current_dir(dir)
        .status()
        .map_err(|e| format!("{}: {e}", exe.display()))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{} failed ({status})", c.example))
    }
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".to_string())
}

fn num_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
