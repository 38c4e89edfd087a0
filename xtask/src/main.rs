//! Project automation for fucina-rs, run as `cargo xtask <command>`.
//!
//! - `cargo xtask ci`: every check CI runs, in order, failing on the first
//!   failing step and naming it.
//! - `cargo xtask doctest`: compiles and runs every ```` ```rust ```` block of
//!   `docs/*.md` against the workspace crates.
//! - `cargo xtask docs`: the facade's documentation as a user builds it
//!   (`cargo doc -p fucina --no-deps`) with every warning and broken
//!   intra-doc link an error, then every relative link of the generated pages
//!   checked (also part of `ci`).
//! - `cargo xtask loom`: the loom model checks (also part of `ci`).
//! - `cargo xtask miri`: the small soundness tests under Miri when
//!   `cargo +nightly miri` is installed (also part of `ci`, which skips it,
//!   saying so, when Miri is missing).
//! - `cargo xtask bench [ARGS]`: every crate's criterion benchmarks with the
//!   settings `docs/BENCHMARKS.md` was measured with (extra ARGS, e.g. a
//!   filter, go to criterion).
//! - `cargo xtask fuzz [TARGET] [SECONDS]`: the cargo-fuzz targets of `fuzz/`
//!   with AddressSanitizer on the stable toolchain, installing cargo-fuzz when
//!   it is missing (`ci` runs each target briefly, only when it is installed).
//!
//! - `cargo xtask build-sharing`: checks that the README's commands share one
//!   build (no workspace crate compiled differently by two of them; also part
//!   of `ci`).
//! - `cargo xtask layering`: the layering rules of `docs/ARCHITECTURE.md`
//!   checked against the tree: no kernel of fucina-exec names its `ops`
//!   module, the crate dependency table matches the manifests, and every
//!   source file is on its package's module map (also part of `ci`).
//! - `cargo xtask first-hour [--ci]`: the README's commands on a fresh clone,
//!   each build and run timed, failing when a workspace crate is compiled
//!   twice.
//!
//! Deliberately dependency-free so that it builds in seconds on a fresh clone.

mod doctest;
mod first_hour;
mod fuzz;
mod json;
mod layering;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  ci        fmt check, layering, clippy, rustdoc, tests, fucina-rng no_std, loom models, Miri
            (if installed), doc examples, fuzz targets for 20 s each (if cargo-fuzz
            is installed), cargo-deny's bans, licenses and sources (if installed; .ci/run installs it)
  doctest   compile and run every ```rust block of README.md and docs/*.md
  docs      build the facade's docs alone (cargo doc -p fucina --no-deps) with warnings
            and broken intra-doc links as errors, and check every link of the pages
  loom      run the loom model checks (RUSTFLAGS=--cfg loom)
  miri      run the Miri soundness tests (needs `cargo +nightly miri`; skipped without it)
  bench     run every crate's criterion benchmarks as docs/BENCHMARKS.md did
            (extra arguments, e.g. a name filter, are passed to criterion)
  fuzz [TARGET] [SECONDS]
            run a fuzz target (default: each in turn) for SECONDS (default 180)
            with AddressSanitizer; installs cargo-fuzz when it is missing
  build-sharing
            check (from cargo's unit graphs, compiling nothing) that the README's
            commands compile every workspace crate the same way, so they share one build
  layering  check docs/ARCHITECTURE.md's layering against the tree: no fucina-exec kernel
            names the ops module, the crate dependency table matches the Cargo.toml files,
            every src/**/*.rs file is on its package's module map
  first-hour [--ci]
            clone the repository to a temporary directory and run the README's
            commands in order, timing each build and run (and `cargo xtask ci`
            with --ci); fails when a workspace crate is compiled twice
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("ci") => ci(),
        Some("doctest") => doctest::run(&workspace_root()),
        Some("docs") => facade_docs(),
        Some("loom") => loom(),
        Some("miri") => miri(),
        Some("bench") => bench(&args[1..]),
        Some("fuzz") => fuzz::run(&args[1..]),
        Some("build-sharing") => first_hour::build_sharing(),
        Some("first-hour") => first_hour::first_hour(&args[1..]),
        Some("layering") => layering::run(&workspace_root()),
        Some("-h" | "--help" | "help") => {
            print!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(format!("unknown command `{other}`\n{USAGE}")),
        None => Err(USAGE.to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask: {message}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace root (the parent of this crate's manifest directory).
pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

/// `cargo`, as the one that runs us (falls back to `cargo` on the PATH).
pub(crate) fn cargo() -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(workspace_root());
    cmd
}

/// Runs one named step; an error names the step and how to reproduce it.
pub(crate) fn step(name: &str, cmd: &mut Command) -> Result<(), String> {
    eprintln!("\n==> [{name}] {}", show(cmd));
    let start = Instant::now();
    let status = cmd
        .status()
        .map_err(|e| format!("step `{name}` could not start: {e}"))?;
    let secs = start.elapsed().as_secs_f64();
    if status.success() {
        eprintln!("==> [{name}] ok ({secs:.1} s)");
        Ok(())
    } else {
        Err(format!(
            "step `{name}` FAILED ({status}) after {secs:.1} s; reproduce with: {}",
            show(cmd)
        ))
    }
}

fn show(cmd: &Command) -> String {
    let mut out = String::new();
    for (key, value) in cmd.get_envs() {
        if let Some(value) = value {
            out.push_str(&format!(
                "{}={} ",
                key.to_string_lossy(),
                value.to_string_lossy()
            ));
        }
    }
    out.push_str(&cmd.get_program().to_string_lossy());
    for arg in cmd.get_args() {
        out.push(' ');
        out.push_str(&arg.to_string_lossy());
    }
    out
}

/// Whether `cargo <sub>` is installed (e.g. `nextest`, `deny`).
pub(crate) fn has_cargo_subcommand(sub: &str) -> bool {
    cargo()
        .args([sub, "--version"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn ci() -> Result<(), String> {
    let start = Instant::now();
    let exclude = mpi_exclusion()?;
    step("fmt", cargo().args(["fmt", "--all", "--", "--check"]))?;
    eprintln!("\n==> [layering] kernels below ops, the dependency table, the module maps");
    layering::run(&workspace_root())?;
    eprintln!("\n==> [build-sharing] the README's commands share one build");
    first_hour::build_sharing().map_err(|e| format!("step `build-sharing` FAILED: {e}"))?;
    step(
        "clippy",
        cargo()
            .args(["clippy", "--workspace"])
            .args(&exclude)
            .args(["--all-targets", "--all-features", "--", "-D", "warnings"]),
    )?;
    step(
        "rustdoc",
        cargo()
            .env("RUSTDOCFLAGS", "-D warnings")
            .args(["doc", "--workspace"])
            .args(&exclude)
            .args(["--no-deps", "--all-features"]),
    )?;
    facade_docs()?;
    if has_cargo_subcommand("nextest") {
        step(
            "test",
            cargo()
                .args(["nextest", "run", "--workspace"])
                .args(&exclude)
                .args(["--all-features", "--no-fail-fast"]),
        )?;
        // nextest does not run rustdoc examples; run them separately.
        step(
            "rustdoc examples",
            cargo()
                .args(["test", "--workspace"])
                .args(&exclude)
                .args(["--all-features", "--doc"]),
        )?;
    } else {
        eprintln!("xtask: cargo-nextest is not installed; running the tests with `cargo test`");
        step(
            "test",
            cargo()
                .args(["test", "--workspace"])
                .args(&exclude)
                .args(["--all-features", "--no-fail-fast"]),
        )?;
    }
    // fucina-rng without its default `std` feature is `no_std`: it must build
    // and reproduce the goldens there too (scalar paths unless the build
    // enables AVX2/AVX-512).
    step(
        "fucina-rng without std",
        cargo().args(["test", "-p", "fucina-rng", "--no-default-features"]),
    )?;
    loom()?;
    miri()?;
    eprintln!("\n==> [doctest] compile and run the examples of README.md and docs/*.md");
    doctest::run(&workspace_root()).map_err(|e| format!("step `doctest` FAILED: {e}"))?;
    // Fuzzing is never installed by CI: it runs only where cargo-fuzz already is.
    if has_cargo_subcommand("fuzz") {
        fuzz::run_targets(&fuzz::targets()?, fuzz::CI_SECONDS)?;
    } else {
        eprintln!(
            "\n==> [fuzz] SKIPPED: cargo-fuzz is not installed \
             (install it with `cargo install cargo-fuzz --locked`, or run `cargo xtask fuzz`)"
        );
    }
    if has_cargo_subcommand("deny") {
        // Licenses, bans and sources need nothing but the lock file. The
        // advisory check clones the RustSec database from GitHub, which CI's
        // machines cannot reach: it is left to `cargo deny check advisories`
        // where the network allows.
        step(
            "deny",
            cargo().args(["deny", "check", "bans", "licenses", "sources"]),
        )?;
        eprintln!(
            "==> [deny] advisories SKIPPED: the RustSec database is fetched from GitHub, \
             which CI cannot reach (run `cargo deny check advisories` where it can)"
        );
    } else {
        eprintln!(
            "\n==> [deny] SKIPPED: cargo-deny is not installed \
             (install it with `cargo install cargo-deny --locked` to run `cargo deny check`)"
        );
    }
    eprintln!(
        "\nxtask ci: all steps passed in {:.0} s",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The Debian packages that building and running `fucina-dist` (MPI) needs
/// and this machine lacks: `openmpi-bin` (`mpirun`), `libopenmpi-dev`
/// (`mpicc`, headers), `libclang-dev` (the `mpi` crate's bindgen). Empty when
/// MPI is usable. `.ci/run` installs them where it can.
pub(crate) fn missing_mpi_packages() -> Vec<&'static str> {
    let runs = |prog: &str, args: &[&str]| {
        Command::new(prog)
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let libclang = std::env::var_os("LIBCLANG_PATH").is_some()
        || Command::new("ldconfig")
            .arg("-p")
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("libclang"))
        || std::fs::read_dir("/usr/lib").is_ok_and(|d| {
            d.filter_map(|e| e.ok()).any(|e| {
                e.file_name().to_string_lossy().starts_with("llvm-")
                    && e.path().join("lib").join("libclang.so").exists()
            })
        });
    let mut missing = Vec::new();
    if !runs("mpirun", &["--version"]) {
        missing.push("openmpi-bin");
    }
    if !(runs("mpicc", &["--showme:version"]) || runs("mpicc", &["-show"])) {
        missing.push("libopenmpi-dev");
    }
    if !libclang {
        missing.push("libclang-dev");
    }
    missing
}

/// The variable that makes MPI mandatory: `.ci/run` sets it where it has Open
/// MPI (installed or found), and then a missing MPI fails `cargo xtask ci`
/// (and fucina-dist's multi-rank tests) instead of skipping fucina-dist.
pub(crate) const REQUIRE_MPI_VAR: &str = "FUCINA_REQUIRE_MPI";

/// Whether [`REQUIRE_MPI_VAR`] is set to anything but empty or `0`.
fn mpi_required() -> bool {
    std::env::var_os(REQUIRE_MPI_VAR).is_some_and(|v| !v.is_empty() && v != "0")
}

/// The `--exclude fucina-dist` arguments of the workspace steps when MPI is
/// missing (saying so), none when it is there (then the test step runs
/// fucina-dist's multi-rank tests under `mpirun` with 1, 2 and 4 ranks).
///
/// # Errors
/// When MPI is missing and [`REQUIRE_MPI_VAR`] is set.
pub(crate) fn mpi_exclusion() -> Result<Vec<&'static str>, String> {
    mpi_decision(&missing_mpi_packages(), mpi_required())
}

/// [`mpi_exclusion`] for the `missing` packages, `required` or not.
fn mpi_decision(missing: &[&str], required: bool) -> Result<Vec<&'static str>, String> {
    if missing.is_empty() {
        eprintln!(
            "\n==> [mpi] MPI found: the test step runs fucina-dist's multi-rank tests \
             (mpirun -np 1, 2, 4)"
        );
        Ok(Vec::new())
    } else if required {
        Err(format!(
            "{REQUIRE_MPI_VAR} is set but MPI is not usable here: the Debian packages {} are \
             missing (`apt-get install -y {}`), so fucina-dist's tests cannot run; install them \
             or unset {REQUIRE_MPI_VAR}",
            missing.join(", "),
            missing.join(" ")
        ))
    } else {
        eprintln!(
            "\n==> [mpi] SKIPPED: fucina-dist (clippy, rustdoc, tests, doc examples) needs \
             the Debian packages {} (`apt-get install -y {}`; `.ci/run` installs them as root)",
            missing.join(", "),
            missing.join(" ")
        );
        Ok(vec!["--exclude", "fucina-dist"])
    }
}

/// `(crate, file stem)` of every `crates/<crate>/<dir>/*.rs` whose stem starts
/// with `prefix`, sorted (the crate directory is named after its package).
fn crate_files(dir: &str, prefix: &str) -> Result<Vec<(String, String)>, String> {
    let crates = std::fs::read_dir(workspace_root().join("crates"))
        .map_err(|e| format!("reading crates/: {e}"))?;
    let mut found = Vec::new();
    for krate in crates.filter_map(|e| e.ok()) {
        let Ok(files) = std::fs::read_dir(krate.path().join(dir)) else {
            continue;
        };
        for file in files.filter_map(|e| e.ok()).map(|e| e.path()) {
            let stem = file.file_stem().unwrap_or_default().to_string_lossy();
            if file.extension().is_some_and(|x| x == "rs") && stem.starts_with(prefix) {
                let krate = krate.file_name().to_string_lossy().into_owned();
                found.push((krate, stem.into_owned()));
            }
        }
    }
    found.sort();
    Ok(found)
}

/// The loom models: every `crates/*/tests/loom*.rs` (each gated by
/// `#![cfg(loom)]`), one `cargo test` per crate, in their own target dir.
fn loom() -> Result<(), String> {
    let models = crate_files("tests", "loom")?;
    if models.is_empty() {
        eprintln!("\n==> [loom] no loom models (crates/*/tests/loom*.rs)");
        return Ok(());
    }
    let mut crates: Vec<&str> = models.iter().map(|(k, _)| k.as_str()).collect();
    crates.dedup();
    for krate in crates {
        let mut cmd = cargo();
        cmd.env("RUSTFLAGS", "--cfg loom")
            .env("LOOM_MAX_PREEMPTIONS", "2")
            .env(
                "CARGO_TARGET_DIR",
                workspace_root().join("target").join("loom"),
            )
            .args(["test", "--release", "-p", krate]);
        for (_, test) in models.iter().filter(|(k, _)| k == krate) {
            cmd.args(["--test", test]);
        }
        step(&format!("loom {krate}"), &mut cmd)?;
    }
    Ok(())
}

/// The tests run under Miri, `(crate, integration test)`: small on purpose
/// (Miri interprets every operation, ~1000x slower), each a few seconds.
///
/// - `fucina-storage/soundness`: the pool's and buffers' unsafe paths (a
///   release racing the last handle, the unique-drop shortcut on another
///   thread, zero-copy writes, recycled `bool` memory, mixed arena slices).
/// - `fucina-rng/scalar_small`: every fill on its portable path (Miri
///   detects no vector extension), at sizes that cross one exact-Gaussian
///   block.
const MIRI_TESTS: &[(&str, &str)] = &[
    ("fucina-storage", "soundness"),
    ("fucina-rng", "scalar_small"),
];

/// The toolchain Miri runs on: `nightly`, or `XTASK_MIRI_TOOLCHAIN`.
fn miri_toolchain() -> String {
    std::env::var("XTASK_MIRI_TOOLCHAIN").unwrap_or_else(|_| "nightly".to_string())
}

/// `cargo +<toolchain>` through the rustup proxy on the PATH (the `cargo`
/// that runs us belongs to one fixed toolchain).
fn cargo_on(toolchain: &str) -> Command {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(workspace_root())
        .arg(format!("+{toolchain}"));
    cmd
}

/// [`MIRI_TESTS`] under `cargo +nightly miri test`, one test thread, in
/// `target/miri`; skipped, with a message saying how to enable it, when that
/// toolchain or its Miri component is missing.
fn miri() -> Result<(), String> {
    let toolchain = miri_toolchain();
    let available = cargo_on(&toolchain)
        .args(["miri", "--version"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !available {
        eprintln!(
            "\n==> [miri] SKIPPED: `cargo +{toolchain} miri` is not available \
             (install it with `rustup +{toolchain} component add miri`)"
        );
        return Ok(());
    }
    for (krate, test) in MIRI_TESTS {
        step(
            &format!("miri {krate}/{test}"),
            cargo_on(&toolchain)
                .env(
                    "CARGO_TARGET_DIR",
                    workspace_root().join("target").join("miri"),
                )
                .args([
                    "miri",
                    "test",
                    "-p",
                    krate,
                    "--test",
                    test,
                    "--",
                    "--test-threads=1",
                ]),
        )?;
    }
    Ok(())
}

/// Criterion settings every figure in `docs/BENCHMARKS.md` was measured with.
const BENCH_ARGS: &[&str] = &["--warm-up-time", "1", "--measurement-time", "3"];

/// `cargo bench` of every bench target (`crates/*/benches/*.rs`), one after
/// the other (never in parallel: the figures are timings).
fn bench(extra: &[String]) -> Result<(), String> {
    let targets = crate_files("benches", "")?;
    for (krate, name) in targets {
        step(
            &format!("bench {krate}/{name}"),
            cargo()
                .args(["bench", "-p", &krate, "--bench", &name, "--"])
                .args(BENCH_ARGS)
                .args(extra),
        )?;
    }
    Ok(())
}

/// The facade's documentation, built alone as a user builds it: every item a
/// user meets must have its page under `target/doc/fucina` (the layers'
/// items are inlined there), so a warning, a broken intra-doc link, a relative
/// link to a missing page or one into another crate's pages (absent from a
/// `--no-deps` build) fails the step.
fn facade_docs() -> Result<(), String> {
    step(
        "facade docs",
        cargo()
            .env(
                "RUSTDOCFLAGS",
                "-D warnings -D rustdoc::broken_intra_doc_links",
            )
            .args(["doc", "-p", "fucina", "--no-deps"]),
    )?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    let target = if target.is_absolute() {
        target
    } else {
        workspace_root().join(target)
    };
    let broken = broken_doc_links(&target.join("doc"), "fucina")?;
    let unresolved = unresolved_doc_links(&target.join("doc"), "fucina")?;
    if broken.is_empty() && unresolved.is_empty() {
        eprintln!("==> [facade docs] every link of target/doc/fucina resolves");
        return Ok(());
    }
    let mut report = Vec::new();
    if !broken.is_empty() {
        report.push(format!(
            "{} broken link(s) in target/doc/fucina:\n  {}",
            broken.len(),
            broken.join("\n  ")
        ));
    }
    if !unresolved.is_empty() {
        report.push(format!(
            "{} unresolved intra-doc link(s) in target/doc/fucina (rendered as text: \
             rustdoc does not check the docs it inlines from other crates; link an \
             item that is documented, by a path that resolves where the docs are written):\n  {}",
            unresolved.len(),
            unresolved.join("\n  ")
        ));
    }
    Err(format!("step `facade docs` FAILED: {}", report.join("\n")))
}

/// The HTML pages under `doc/krate`, sorted.
fn doc_pages(doc: &Path, krate: &str) -> Result<Vec<PathBuf>, String> {
    let mut pages = Vec::new();
    let mut dirs = vec![doc.join(krate)];
    while let Some(dir) = dirs.pop() {
        let entries =
            std::fs::read_dir(&dir).map_err(|e| format!("reading {}: {e}", dir.display()))?;
        for entry in entries {
            let path = entry.map_err(|e| format!("{}: {e}", dir.display()))?.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "html") {
                pages.push(path);
            }
        }
    }
    pages.sort();
    Ok(pages)
}

/// The intra-doc links of the pages under `doc/krate` that rustdoc left
/// unresolved, as `page: text` lines. `-D rustdoc::broken_intra_doc_links`
/// checks the crate's own docs, not those it inlines from other crates
/// (`#[doc(inline)] pub use fucina_exec::*`): there rustdoc renders an
/// unresolved ``[`item`]`` as the literal text `[<code>item</code>]` and an
/// unresolved `[item]` as `[item]`, silently.
fn unresolved_doc_links(doc: &Path, krate: &str) -> Result<Vec<String>, String> {
    let mut found = Vec::new();
    for page in doc_pages(doc, krate)? {
        let html = std::fs::read_to_string(&page)
            .map_err(|e| format!("reading {}: {e}", page.display()))?;
        let shown = page
            .strip_prefix(doc)
            .unwrap_or(&page)
            .display()
            .to_string();
        for text in unresolved_links_in(&html) {
            found.push(format!("{shown}: {text}"));
        }
    }
    Ok(found)
}

/// The unresolved intra-doc links of one rendered page, in page order: in its
/// documentation blocks (`<div class="docblock">` and the one-line summaries
/// `<dd>` of a module's item list), every `[<code>item</code>]`, and every
/// `[path]` of plain text (outside code, examples and links) that reads as
/// an item path (`Team`, `Team::new`, `simd_level()`) and is not part of an
/// expression (`x[i]`, `U[lo, hi)`, `[a](b)`). Signatures are not docblocks,
/// so their `&[usize]` never count.
fn unresolved_links_in(html: &str) -> Vec<String> {
    let mut found = Vec::new();
    for block in doc_blocks(html) {
        // `[<code>item</code>]`, the form of ``[`item`]``.
        let mut rest = block;
        while let Some(at) = rest.find("[<code>") {
            rest = &rest[at + 7..];
            if let Some(end) = rest.find("</code>")
                && !rest[..end].contains('<')
                && rest[end + 7..].starts_with(']')
            {
                found.push(format!("[`{}`]", &rest[..end]));
            }
        }
        // `[item]` in the prose.
        let mut text = block.to_string();
        for (open, close) in [("<pre", "</pre>"), ("<a ", "</a>"), ("<code", "</code>")] {
            text = strip_elements(&text, open, close);
        }
        let text = strip_elements(&text, "<", ">");
        let bytes = text.as_bytes();
        let mut i = 0;
        while let Some(at) = text[i..].find('[') {
            let start = i + at;
            i = start + 1;
            let Some(len) = text[start + 1..].find(']') else {
                break;
            };
            let inner = &text[start + 1..start + 1 + len];
            let before = start.checked_sub(1).map(|b| bytes[b]);
            let after = bytes.get(start + len + 2).copied();
            let in_expression = before
                .is_some_and(|b| b.is_ascii_alphanumeric() || b"_])".contains(&b))
                || after.is_some_and(|a| b"([:".contains(&a));
            if !in_expression && looks_like_a_path(inner) {
                found.push(format!("[{inner}]"));
            }
        }
    }
    found
}

/// Whether `s` reads as an item path an intra-doc link would name: `Item`,
/// `module::Item`, `Type::method`, optionally with `()` or a macro's `!`.
fn looks_like_a_path(s: &str) -> bool {
    let s = s
        .strip_suffix("()")
        .or_else(|| s.strip_suffix('!'))
        .unwrap_or(s);
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
        && !s.ends_with(':')
}

/// The documentation blocks of a rendered page: each `<div class="docblock...">`
/// with everything nested in it, and each `<dd>` summary.
fn doc_blocks(html: &str) -> Vec<&str> {
    let mut blocks = Vec::new();
    let mut from = 0;
    while let Some(at) = html[from..].find("<div class=\"docblock") {
        let start = from + at;
        // Walk to the `</div>` that closes it.
        let (mut depth, mut pos) = (0usize, start);
        let end = loop {
            let open = html[pos..].find("<div").map(|o| pos + o);
            let Some(close) = html[pos..].find("</div>").map(|c| pos + c) else {
                break html.len();
            };
            match open {
                Some(o) if o < close => {
                    depth += 1;
                    pos = o + 4;
                }
                _ => {
                    depth -= 1;
                    pos = close + 6;
                    if depth == 0 {
                        break pos;
                    }
                }
            }
        };
        blocks.push(&html[start..end]);
        from = end;
    }
    let mut rest = html;
    while let Some(at) = rest.find("<dd>") {
        rest = &rest[at + 4..];
        let end = rest.find("</dd>").unwrap_or(rest.len());
        blocks.push(&rest[..end]);
        rest = &rest[end..];
    }
    blocks
}

/// `s` without the elements that start with `open` and end at the next
/// `close` (their content included; not nested).
fn strip_elements(s: &str, open: &str, close: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find(open) {
        out.push_str(&rest[..at]);
        match rest[at..].find(close) {
            Some(end) => rest = &rest[at + end + close.len()..],
            None => {
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

/// The relative links of the pages under `doc/krate` that point to a missing
/// file, or into the pages of another crate of the workspace (`doc/fucina_*`),
/// as `page: link` lines. Links to the shared rustdoc files (`static.files`,
/// `src`, `trait.impl`, `type.impl`, ...) only have to exist.
fn broken_doc_links(doc: &Path, krate: &str) -> Result<Vec<String>, String> {
    let pages = doc_pages(doc, krate)?;
    let mut broken = Vec::new();
    for page in &pages {
        let html = std::fs::read_to_string(page)
            .map_err(|e| format!("reading {}: {e}", page.display()))?;
        let shown = page.strip_prefix(doc).unwrap_or(page).display().to_string();
        let mut rest = html.as_str();
        while let Some(at) = rest.find("href=\"") {
            rest = &rest[at + 6..];
            let Some(end) = rest.find('"') else { break };
            let link = &rest[..end];
            rest = &rest[end..];
            let path = link.split(['#', '?']).next().unwrap_or_default();
            if path.is_empty()
                || path.contains("://")
                || path.contains("${")
                || path.starts_with("javascript:")
                || path.starts_with("mailto:")
            {
                continue;
            }
            let Some(resolved) = resolve_link(doc, page, path) else {
                broken.push(format!("{shown}: {link} (leaves the doc directory)"));
                continue;
            };
            let top = resolved
                .strip_prefix(doc)
                .ok()
                .and_then(|r| r.components().next())
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .unwrap_or_default();
            if top != krate && top.starts_with("fucina") {
                broken.push(format!("{shown}: {link} (another crate's pages)"));
            } else if !resolved.exists() {
                broken.push(format!("{shown}: {link} (missing)"));
            }
        }
    }
    Ok(broken)
}

/// `link` relative to `page`'s directory, normalized without touching the file
/// system; `None` if it climbs above `doc`.
fn resolve_link(doc: &Path, page: &Path, link: &str) -> Option<PathBuf> {
    let base = page.parent()?.strip_prefix(doc).ok()?;
    let mut parts: Vec<String> = base
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    for seg in link.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            s => parts.push(s.to_string()),
        }
    }
    Some(parts.iter().fold(doc.to_path_buf(), |p, s| p.join(s)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doc_links_are_checked_for_missing_pages_and_other_crates() {
        let doc = std::env::temp_dir().join(format!("xtask-doclinks-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&doc);
        for dir in ["fucina/rng", "fucina_rng", "static.files"] {
            std::fs::create_dir_all(doc.join(dir)).unwrap();
        }
        std::fs::write(doc.join("static.files/main.js"), "").unwrap();
        std::fs::write(doc.join("fucina_rng/fn.at.html"), "").unwrap();
        std::fs::write(doc.join("fucina/rng/fn.at.html"), "").unwrap();
        std::fs::write(
            doc.join("fucina/index.html"),
            concat!(
                r#"<a href="rng/fn.at.html#x">ok</a> <a href="../static.files/main.js">ok</a> "#,
                r##"<a href="https://docs.rs/x">ok</a> <a href="#here">ok</a> "##,
                r#"<a href="rng/fn.gone.html">missing</a> <a href="../fucina_rng/fn.at.html">other</a> "#,
                r#"<a href="../../up.html">up</a>"#,
            ),
        )
        .unwrap();
        let broken = broken_doc_links(&doc, "fucina").unwrap();
        let _ = std::fs::remove_dir_all(&doc);
        assert_eq!(broken.len(), 3, "{broken:#?}");
        assert!(
            broken[0].contains("rng/fn.gone.html (missing)"),
            "{broken:#?}"
        );
        assert!(
            broken[1].contains("fucina_rng/fn.at.html (another crate's pages)"),
            "{broken:#?}"
        );
        assert!(
            broken[2].contains("up.html (leaves the doc directory)"),
            "{broken:#?}"
        );
    }

    #[test]
    fn unresolved_intra_doc_links_are_found_in_inlined_docs() {
        let doc = std::env::temp_dir().join(format!("xtask-unresolved-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&doc);
        std::fs::create_dir_all(doc.join("fucina/exec")).unwrap();
        // What rustdoc made of `fucina_exec::simd_level`'s docs, inlined into
        // `fucina::exec`, while `force_simd_level` was hidden.
        std::fs::write(
            doc.join("fucina/exec/fn.simd_level.html"),
            concat!(
                r#"<pre class="rust item-decl"><code>pub fn simd_level(x: &amp;[usize]) -&gt; [Level]</code></pre>"#,
                r#"<details><div class="docblock"><p>Lowered by the <code>FUCINA_SIMD</code> variable or by"#,
                "\n[<code>force_simd_level</code>]. See [Team] and <a href=\"struct.Team.html\">[Team]</a>.</p>",
                r#"<div class="example-wrap"><pre class="rust"><code>let y = x[i] + v[Team];</code></pre></div>"#,
                r#"<p>Also [`Team::new`] and [simd_level()].</p></div></details>"#,
            ),
        )
        .unwrap();
        // Brackets that are not links: intervals, indexing, citations, code,
        // arrays of code, and signatures outside the docblocks.
        std::fs::write(
            doc.join("fucina/exec/index.html"),
            concat!(
                r#"<dl class="item-table"><dt><a href="fn.uniform.html">uniform</a></dt>"#,
                r#"<dd>U[<code>lo</code>, <code>hi</code>) values, x[i], v[0], [1], [a b],"#,
                r#" [<code>a</code>, <code>b</code>], <code>[Team]</code>, f(a)[k], [x](y)</dd></dl>"#,
                r#"<div class="docblock"><p>Written as <code>[T]</code>, a slice of <a href="t">[Team]</a>.</p></div>"#,
                r#"<h4 class="code-header">pub fn f(&amp;self) -&gt; &amp;[Team]</h4>"#,
            ),
        )
        .unwrap();
        let found = unresolved_doc_links(&doc, "fucina").unwrap();
        let _ = std::fs::remove_dir_all(&doc);
        assert_eq!(
            found,
            [
                "fucina/exec/fn.simd_level.html: [`force_simd_level`]",
                "fucina/exec/fn.simd_level.html: [Team]",
                "fucina/exec/fn.simd_level.html: [simd_level()]",
            ],
            "{found:#?}"
        );
        // The form of [`Team::new`] that rustdoc leaves is `[<code>Team::new</code>]`.
        assert_eq!(
            unresolved_links_in(r#"<div class="docblock">[<code>Team::new</code>]</div>"#),
            ["[`Team::new`]"]
        );
    }

    #[test]
    fn missing_mpi_is_a_skip_unless_required() {
        assert_eq!(mpi_decision(&[], false), Ok(Vec::new()));
        assert_eq!(mpi_decision(&[], true), Ok(Vec::new()));
        assert_eq!(
            mpi_decision(&["openmpi-bin"], false),
            Ok(vec!["--exclude", "fucina-dist"])
        );
        let err = mpi_decision(&["openmpi-bin", "libclang-dev"], true).unwrap_err();
        assert!(err.contains("FUCINA_REQUIRE_MPI is set"), "{err}");
        assert!(err.contains("openmpi-bin, libclang-dev"), "{err}");
    }
}
