//! `cargo xtask layering`: the layering rules that `docs/ARCHITECTURE.md`
//! states, checked against the tree (also part of `ci`).
//!
//! - **Kernels do not import ops.** No file under
//!   `crates/fucina-exec/src/kernels/` names the exec crate's `ops` module
//!   (`crate::ops`, `super::ops`, a bare `ops::` path or an `ops` inside a
//!   `use crate::{..}` group), in code or in a doc link: kernels sit below
//!   the ops, and what both use lives in a module below the kernels. Paths of
//!   the standard library's `ops` (`std::ops::Range`) are fine.
//! - **The dependency table is true.** The table of `docs/ARCHITECTURE.md`
//!   with a "depends on" column lists, for every workspace package, exactly
//!   the workspace packages (`fucina*`) of its `[dependencies]` sections
//!   (target-specific ones included, dev- and build-dependencies not).
//! - **Every source file is on a module map.** Under the heading
//!   `## Module maps` of `docs/ARCHITECTURE.md`, each workspace package has a
//!   `### ` heading naming it in backticks and a table whose first column
//!   names each file of its `src/` (relative to `src/`, in backticks, one
//!   file a row); a file missing from the map, or a row naming no file, is
//!   an error.
//!
//! The parsers are line based and dependency-free (no TOML or Markdown crate):
//! they read the few forms this repository writes, and the unit tests below
//! pin them.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The directory of the kernels, relative to the workspace root.
const KERNELS: &str = "crates/fucina-exec/src/kernels";

/// The document that holds the dependency table and the module maps.
const ARCHITECTURE: &str = "docs/ARCHITECTURE.md";

/// Runs the three checks, printing every problem; an error counts them.
pub(crate) fn run(root: &Path) -> Result<(), String> {
    let mut problems = Vec::new();
    problems.extend(check_kernels(root)?);
    let doc_path = root.join(ARCHITECTURE);
    let doc = fs::read_to_string(&doc_path)
        .map_err(|e| format!("reading {}: {e}", doc_path.display()))?;
    let packages = workspace_packages(root)?;
    problems.extend(check_dependency_table(&doc, &packages));
    problems.extend(check_module_maps(&doc, &packages)?);
    if problems.is_empty() {
        eprintln!(
            "==> [layering] ok: kernels name no ops path; {ARCHITECTURE}'s dependency table \
             and module maps match {} packages",
            packages.len()
        );
        return Ok(());
    }
    for p in &problems {
        eprintln!("layering: {p}");
    }
    Err(format!(
        "step `layering` FAILED: {} problem(s) (listed above)",
        problems.len()
    ))
}

/// A workspace package: its name, its directory and its `Cargo.toml` text.
pub(crate) struct Package {
    name: String,
    dir: PathBuf,
    manifest: String,
}

/// The packages of the root manifest's `members` (a trailing `/*` is every
/// directory below with a `Cargo.toml`), sorted by name.
fn workspace_packages(root: &Path) -> Result<Vec<Package>, String> {
    let root_toml = fs::read_to_string(root.join("Cargo.toml"))
        .map_err(|e| format!("reading the root Cargo.toml: {e}"))?;
    let mut dirs = Vec::new();
    for member in workspace_members(&root_toml) {
        if let Some(parent) = member.strip_suffix("/*") {
            let parent = root.join(parent);
            let entries =
                fs::read_dir(&parent).map_err(|e| format!("reading {}: {e}", parent.display()))?;
            for e in entries.filter_map(Result::ok) {
                if e.path().join("Cargo.toml").is_file() {
                    dirs.push(e.path());
                }
            }
        } else {
            dirs.push(root.join(member));
        }
    }
    let mut packages = Vec::new();
    for dir in dirs {
        let path = dir.join("Cargo.toml");
        let manifest =
            fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        let name = package_name(&manifest)
            .ok_or_else(|| format!("{}: no [package] name", path.display()))?;
        packages.push(Package {
            name,
            dir,
            manifest,
        });
    }
    packages.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(packages)
}

/// The strings of the root manifest's `members = [..]` (on one line or
/// several).
fn workspace_members(root_toml: &str) -> Vec<String> {
    let Some(start) = root_toml.find("members") else {
        return Vec::new();
    };
    let rest = &root_toml[start..];
    let (Some(open), Some(close)) = (rest.find('['), rest.find(']')) else {
        return Vec::new();
    };
    quoted_strings(&rest[open + 1..close])
}

/// Every `"..."` of `s`, in order.
fn quoted_strings(s: &str) -> Vec<String> {
    s.split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// The `name` of the `[package]` section.
fn package_name(manifest: &str) -> Option<String> {
    let mut in_package = false;
    for line in manifest.lines().map(strip_toml_comment) {
        let line = line.trim();
        if line.starts_with('[') {
            in_package = line == "[package]";
        } else if in_package
            && let Some((key, value)) = line.split_once('=')
            && key.trim() == "name"
        {
            return quoted_strings(value).into_iter().next();
        }
    }
    None
}

/// `line` without a `#` comment (a `#` inside a string is kept).
fn strip_toml_comment(line: &str) -> &str {
    let mut in_string = false;
    for (i, c) in line.char_indices() {
        match c {
            '"' => in_string = !in_string,
            '#' if !in_string => return &line[..i],
            _ => {}
        }
    }
    line
}

/// The workspace packages (`fucina*`) a manifest's `[dependencies]` sections
/// name: `[dependencies]`, `[target.'cfg(..)'.dependencies]` and the table
/// form `[dependencies.fucina-x]`; not dev- or build-dependencies.
pub(crate) fn manifest_workspace_deps(manifest: &str) -> BTreeSet<String> {
    let mut deps = BTreeSet::new();
    let mut in_deps = false;
    for line in manifest.lines().map(strip_toml_comment) {
        let line = line.trim();
        if let Some(header) = line.strip_prefix('[') {
            let header = header.trim_end_matches(']').trim();
            // The last dotted part outside quotes decides: `dependencies`
            // opens a section of dependencies, `dependencies.NAME` names one.
            let (base, named) = match header.rsplit_once("dependencies.") {
                Some((before, name)) if is_dependency_kind(before) => (before, Some(name)),
                _ => (header, None),
            };
            in_deps = named.is_none() && is_dependency_section(base);
            if let Some(name) = named {
                let name = name.trim_matches('"');
                if name.starts_with("fucina") {
                    deps.insert(name.to_string());
                }
            }
            continue;
        }
        if !in_deps {
            continue;
        }
        let Some((key, _)) = line.split_once('=') else {
            continue;
        };
        // `name = ..`, `name.workspace = true`, `"name" = ..`.
        let key = key.trim();
        let name = key
            .split('.')
            .next()
            .unwrap_or(key)
            .trim()
            .trim_matches('"');
        if name.starts_with("fucina") {
            deps.insert(name.to_string());
        }
    }
    deps
}

/// Whether a section header (without brackets) is one of normal
/// dependencies: `dependencies` or `target.<cfg>.dependencies`.
fn is_dependency_section(header: &str) -> bool {
    header == "dependencies" || (header.starts_with("target.") && header.ends_with(".dependencies"))
}

/// Whether `before` (what precedes `dependencies.NAME`) makes it a normal
/// dependency: nothing, or `target.<cfg>.`.
fn is_dependency_kind(before: &str) -> bool {
    before.is_empty() || (before.starts_with("target.") && before.ends_with('.'))
}

/// The cells of a Markdown table row (`| a | b |`), trimmed; `|` inside
/// backticks does not split. `None` for a line that is not a row.
fn table_cells(line: &str) -> Option<Vec<String>> {
    let line = line.trim();
    let inner = line.strip_prefix('|')?;
    let inner = inner.strip_suffix('|').unwrap_or(inner);
    let mut cells = Vec::new();
    let mut cell = String::new();
    let mut in_code = false;
    for c in inner.chars() {
        match c {
            '`' => {
                in_code = !in_code;
                cell.push(c);
            }
            '|' if !in_code => cells.push(std::mem::take(&mut cell).trim().to_string()),
            _ => cell.push(c),
        }
    }
    cells.push(cell.trim().to_string());
    Some(cells)
}

/// Whether a row is a table's separator (`| --- | :---: |`).
fn is_separator(cells: &[String]) -> bool {
    cells
        .iter()
        .all(|c| !c.is_empty() && c.chars().all(|ch| matches!(ch, '-' | ':' | ' ')))
}

/// The backticked spans of `s`, in order.
fn code_spans(s: &str) -> Vec<String> {
    s.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// The dependency table of `doc`: the table whose header has a cell
/// containing "depends on"; for each row, the package named in backticks in
/// its first cell and the `fucina*` packages named in backticks in the
/// "depends on" cell (`none` or `-` for no dependency).
pub(crate) fn parse_dependency_table(
    doc: &str,
) -> Result<BTreeMap<String, BTreeSet<String>>, String> {
    let mut lines = doc.lines().peekable();
    let column = loop {
        let Some(line) = lines.next() else {
            return Err(format!(
                "{ARCHITECTURE} has no dependency table (a table with a \"depends on\" column)"
            ));
        };
        // A header row: the next line is the table's separator.
        if let Some(cells) = table_cells(line)
            && let Some(i) = cells
                .iter()
                .position(|c| c.to_ascii_lowercase().contains("depends on"))
            && lines
                .peek()
                .and_then(|next| table_cells(next))
                .is_some_and(|next| is_separator(&next))
        {
            break i;
        }
    };
    let mut table = BTreeMap::new();
    for line in lines {
        let Some(cells) = table_cells(line) else {
            break;
        };
        if is_separator(&cells) {
            continue;
        }
        let Some(name) = code_spans(&cells[0]).into_iter().next() else {
            return Err(format!(
                "{ARCHITECTURE}: dependency table row without a package in backticks: {line}"
            ));
        };
        let deps = cells
            .get(column)
            .map(|c| code_spans(c))
            .unwrap_or_default()
            .into_iter()
            .filter(|d| d.starts_with("fucina"))
            .collect();
        if table.insert(name.clone(), deps).is_some() {
            return Err(format!(
                "{ARCHITECTURE}: the dependency table lists `{name}` twice"
            ));
        }
    }
    Ok(table)
}

/// The differences between the dependency table and the manifests, one
/// message each.
fn check_dependency_table(doc: &str, packages: &[Package]) -> Vec<String> {
    let table = match parse_dependency_table(doc) {
        Ok(t) => t,
        Err(e) => return vec![e],
    };
    let actual: BTreeMap<String, BTreeSet<String>> = packages
        .iter()
        .map(|p| (p.name.clone(), manifest_workspace_deps(&p.manifest)))
        .collect();
    compare_dependencies(&table, &actual)
}

/// `documented` against `actual` (package → workspace dependencies).
pub(crate) fn compare_dependencies(
    documented: &BTreeMap<String, BTreeSet<String>>,
    actual: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<String> {
    let mut out = Vec::new();
    let list = |s: &BTreeSet<String>| -> String {
        s.iter().map(String::as_str).collect::<Vec<_>>().join(", ")
    };
    for (name, deps) in actual {
        let Some(doc) = documented.get(name) else {
            out.push(format!(
                "{ARCHITECTURE}: the dependency table has no row for `{name}` (its Cargo.toml \
                 depends on: {})",
                if deps.is_empty() {
                    "none".to_string()
                } else {
                    list(deps)
                }
            ));
            continue;
        };
        let missing: BTreeSet<String> = deps.difference(doc).cloned().collect();
        let extra: BTreeSet<String> = doc.difference(deps).cloned().collect();
        if !missing.is_empty() {
            out.push(format!(
                "{ARCHITECTURE}: `{name}` depends on {} (its Cargo.toml), which the dependency \
                 table does not list",
                list(&missing)
            ));
        }
        if !extra.is_empty() {
            out.push(format!(
                "{ARCHITECTURE}: the dependency table says `{name}` depends on {}, which its \
                 Cargo.toml does not",
                list(&extra)
            ));
        }
    }
    for name in documented.keys().filter(|n| !actual.contains_key(*n)) {
        out.push(format!(
            "{ARCHITECTURE}: the dependency table lists `{name}`, which is not a workspace package"
        ));
    }
    out
}

/// The module maps of `doc`: for each `### ` heading under `## Module maps`
/// that names a package in backticks, the files the first column of its
/// tables names (in backticks), in order.
pub(crate) fn parse_module_maps(doc: &str) -> Option<BTreeMap<String, Vec<String>>> {
    let mut maps: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut in_section = false;
    let mut found = false;
    let mut current: Option<String> = None;
    let mut in_fence = false;
    for line in doc.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        if let Some(title) = line.strip_prefix("## ") {
            in_section = title.trim().eq_ignore_ascii_case("module maps");
            found |= in_section;
            current = None;
            continue;
        }
        if !in_section {
            continue;
        }
        if let Some(title) = line.strip_prefix("### ") {
            current = code_spans(title).into_iter().next();
            if let Some(name) = &current {
                maps.entry(name.clone()).or_default();
            }
            continue;
        }
        let (Some(name), Some(cells)) = (&current, table_cells(line)) else {
            continue;
        };
        if is_separator(&cells) {
            continue;
        }
        let files = maps.entry(name.clone()).or_default();
        files.extend(
            code_spans(&cells[0])
                .into_iter()
                .filter(|f| f.ends_with(".rs")),
        );
    }
    found.then_some(maps)
}

/// Every `.rs` file under `dir`, relative to it with `/` separators, sorted.
fn rust_files(dir: &Path) -> Result<Vec<String>, String> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) -> Result<(), String> {
        let entries = fs::read_dir(dir).map_err(|e| format!("reading {}: {e}", dir.display()))?;
        for e in entries.filter_map(Result::ok) {
            let path = e.path();
            if path.is_dir() {
                walk(base, &path, out)?;
            } else if path.extension().is_some_and(|x| x == "rs") {
                let rel = path.strip_prefix(base).unwrap_or(&path);
                let parts: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                out.push(parts.join("/"));
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    if dir.is_dir() {
        walk(dir, dir, &mut out)?;
    }
    out.sort();
    Ok(out)
}

/// The files of each package's `src/` against its module map.
fn check_module_maps(doc: &str, packages: &[Package]) -> Result<Vec<String>, String> {
    let Some(maps) = parse_module_maps(doc) else {
        return Ok(vec![format!(
            "{ARCHITECTURE} has no `## Module maps` section (one `### `package`` table per \
             workspace package, one row per file of its src/)"
        )]);
    };
    let mut out = Vec::new();
    for p in packages {
        let files = rust_files(&p.dir.join("src"))?;
        out.extend(compare_module_map(&p.name, &files, maps.get(&p.name)));
    }
    for name in maps.keys() {
        if !packages.iter().any(|p| &p.name == name) {
            out.push(format!(
                "{ARCHITECTURE}: the module maps have a table for `{name}`, which is not a \
                 workspace package"
            ));
        }
    }
    Ok(out)
}

/// One package's source files against its map (`None`: no map).
pub(crate) fn compare_module_map(
    name: &str,
    files: &[String],
    map: Option<&Vec<String>>,
) -> Vec<String> {
    let Some(map) = map else {
        if files.is_empty() {
            return Vec::new();
        }
        return vec![format!(
            "{ARCHITECTURE}: no module map for `{name}` ({} .rs files in its src/)",
            files.len()
        )];
    };
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for f in map {
        if !seen.insert(f) {
            out.push(format!(
                "{ARCHITECTURE}: `{name}`'s module map lists `{f}` twice"
            ));
        }
    }
    for f in files.iter().filter(|f| !seen.contains(f)) {
        out.push(format!(
            "{ARCHITECTURE}: `{name}`'s module map misses src/{f}"
        ));
    }
    for f in seen.iter().filter(|f| !files.contains(f)) {
        out.push(format!(
            "{ARCHITECTURE}: `{name}`'s module map lists src/{f}, which does not exist"
        ));
    }
    out
}

/// Every line of the kernels that names the ops module.
fn check_kernels(root: &Path) -> Result<Vec<String>, String> {
    let dir = root.join(KERNELS);
    let mut out = Vec::new();
    for rel in rust_files(&dir)? {
        let path = dir.join(&rel);
        let text =
            fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        for (n, line) in text.lines().enumerate() {
            if let Some(what) = ops_path_in(line) {
                out.push(format!(
                    "{KERNELS}/{rel}:{}: a kernel names the ops module (`{what}`): {}",
                    n + 1,
                    line.trim()
                ));
            }
        }
    }
    Ok(out)
}

/// The first path of `line` that names the exec crate's `ops` module, if
/// any: the word `ops` followed or preceded by `::`, unless what precedes is
/// `std::`, `core::` or `alloc::`; or the word `ops` inside the braces of a
/// `crate::{..}` / `super::{..}` group.
pub(crate) fn ops_path_in(line: &str) -> Option<String> {
    let bytes = line.as_bytes();
    let is_ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut from = 0;
    while let Some(i) = line[from..].find("ops").map(|i| i + from) {
        from = i + 3;
        let before_ok = i == 0 || !is_ident(bytes[i - 1]);
        let after_ok = i + 3 >= bytes.len() || !is_ident(bytes[i + 3]);
        if !(before_ok && after_ok) {
            continue;
        }
        let after_path = line[i + 3..].starts_with("::");
        let before = &line[..i];
        let before_path = before.ends_with("::");
        if before_path {
            // The segment before `::ops`.
            let head = &before[..before.len() - 2];
            let seg_start = head
                .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '$'))
                .map_or(0, |j| j + 1);
            let seg = &head[seg_start..];
            if matches!(seg, "std" | "core" | "alloc") {
                continue;
            }
            let end = i + 3 + if after_path { 2 } else { 0 };
            return Some(line[seg_start..end].to_string());
        }
        if after_path {
            return Some(line[i..i + 5].to_string());
        }
        // `use crate::{kernels, ops}`: a group opened after `crate::` or
        // `super::` and not closed before the word.
        for group in ["crate::{", "super::{"] {
            if let Some(g) = before.rfind(group)
                && !before[g..].contains('}')
            {
                return Some(format!("{group}.. ops"));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_paths_are_found_and_std_ops_is_not() {
        let found = |l: &str| ops_path_in(l);
        assert_eq!(
            found("use crate::ops::weight_matmul::{WeightFormat};").as_deref(),
            Some("crate::ops::")
        );
        assert_eq!(
            found("    use super::super::ops::quant;").as_deref(),
            Some("super::ops::")
        );
        assert_eq!(
            found("//! [`crate::ops`] validate").as_deref(),
            Some("crate::ops")
        );
        assert_eq!(
            found("/// see `ops::quant`'s docs").as_deref(),
            Some("ops::")
        );
        assert_eq!(found("$crate::ops::x()").as_deref(), Some("$crate::ops::"));
        assert_eq!(
            found("use crate::{kernels::simd, ops};").as_deref(),
            Some("crate::{.. ops")
        );
        assert_eq!(found("use std::ops::Range;"), None);
        assert_eq!(found("rows: core::ops::Range<usize>,"), None);
        assert_eq!(found("let std::ops::Range { start, end } = r;"), None);
        // Words that contain `ops`, prose and other groups.
        assert_eq!(found("let loops = ops_count; // the ops of a kernel"), None);
        assert_eq!(found("use crate::kernels::{gemm, prefetch};"), None);
        assert_eq!(found("use crate::{kernels::simd}; let ops = 1;"), None);
    }

    #[test]
    fn manifest_dependencies_of_every_form() {
        let manifest = r#"
[package]
name = "fucina-exec" # fucina-fake in a comment

[dependencies]
bytemuck.workspace = true
fucina-storage.workspace = true
fucina-thread = { workspace = true, features = ["x"] }
"fucina-rng" = "0.1"
# fucina-commented.workspace = true

[target.'cfg(target_os = "linux")'.dependencies]
libc.workspace = true
fucina-fpenv.workspace = true

[dependencies.fucina-tabled]
workspace = true

[dev-dependencies]
fucina-dev.workspace = true

[build-dependencies]
fucina-build.workspace = true

[target.'cfg(unix)'.dev-dependencies]
fucina-dev-unix.workspace = true
"#;
        let deps: Vec<String> = manifest_workspace_deps(manifest).into_iter().collect();
        assert_eq!(
            deps,
            [
                "fucina-fpenv",
                "fucina-rng",
                "fucina-storage",
                "fucina-tabled",
                "fucina-thread"
            ]
        );
        assert_eq!(package_name(manifest).as_deref(), Some("fucina-exec"));
        assert_eq!(
            workspace_members("[workspace]\nmembers = [\"crates/*\",\n \"xtask\"]\n"),
            ["crates/*", "xtask"]
        );
    }

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn dependency_table_rows_and_differences() {
        let doc = "\
intro

| crate | why it exists | depends on | status |
| --- | --- | --- | --- |
| `fucina-rng` | seeds `a|b` | none | done |
| `fucina-exec` | the layer | `fucina-storage`, `fucina-rng` | done |
| `fucina-llm` | models (`tokenizers`) | `fucina` | done |

after the table
| `not-a-row-of-it` | x | y | z |
";
        let table = parse_dependency_table(doc).unwrap();
        // A row (not a header) whose text says "depends on" starts no table.
        assert!(parse_dependency_table("| `a` | depends on nothing |\n| `b` | x |\n").is_err());
        assert_eq!(table.len(), 3);
        assert_eq!(table["fucina-rng"], set(&[]));
        assert_eq!(table["fucina-exec"], set(&["fucina-storage", "fucina-rng"]));
        assert_eq!(table["fucina-llm"], set(&["fucina"]));

        let actual: BTreeMap<String, BTreeSet<String>> = [
            ("fucina-rng", set(&[])),
            ("fucina-exec", set(&["fucina-storage", "fucina-thread"])),
            ("fucina-derive", set(&[])),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let diff = compare_dependencies(&table, &actual);
        assert_eq!(diff.len(), 4, "{diff:#?}");
        assert!(diff[0].contains("no row for `fucina-derive`"), "{diff:#?}");
        assert!(
            diff[1].contains("`fucina-exec` depends on fucina-thread (its Cargo.toml)"),
            "{diff:#?}"
        );
        assert!(
            diff[2].contains("says `fucina-exec` depends on fucina-rng"),
            "{diff:#?}"
        );
        assert!(
            diff[3].contains("lists `fucina-llm`, which is not a workspace package"),
            "{diff:#?}"
        );
        assert!(parse_dependency_table("| a | b |\n| - | - |\n").is_err());
    }

    #[test]
    fn module_maps_are_read_per_package() {
        let doc = "\
## Where things are

| `fucina-exec` | `ignored.rs` |

## Module maps

Intro with a table that belongs to no package:

| file | holds |
| --- | --- |
| `nowhere.rs` | x |

### `fucina-exec` (`crates/fucina-exec/src/`)

| file | holds |
| --- | --- |
| `lib.rs` | the crate root |
| `ops/join.rs` | `concat`, `stack` (see `ops/gather.rs`) |

```text
| `fenced.rs` | not a row |
```

### `xtask`

| `main.rs` | the commands |

## Next section

| `after.rs` | not a map |
";
        let maps = parse_module_maps(doc).unwrap();
        assert_eq!(maps.len(), 2);
        assert_eq!(maps["fucina-exec"], ["lib.rs", "ops/join.rs"]);
        assert_eq!(maps["xtask"], ["main.rs"]);
        assert!(parse_module_maps("## Other\n").is_none());

        let files: Vec<String> = ["lib.rs", "ops/gather.rs", "ops/join.rs"]
            .map(String::from)
            .to_vec();
        let map = vec!["lib.rs".to_string(), "ops/index.rs".into(), "lib.rs".into()];
        let diff = compare_module_map("fucina-exec", &files, Some(&map));
        assert_eq!(diff.len(), 4, "{diff:#?}");
        assert!(diff[0].contains("lists `lib.rs` twice"), "{diff:#?}");
        assert!(diff[1].ends_with("misses src/ops/gather.rs"), "{diff:#?}");
        assert!(diff[2].ends_with("misses src/ops/join.rs"), "{diff:#?}");
        assert!(
            diff[3].ends_with("lists src/ops/index.rs, which does not exist"),
            "{diff:#?}"
        );
        assert_eq!(
            compare_module_map("fucina-derive", &files[..1], None),
            ["docs/ARCHITECTURE.md: no module map for `fucina-derive` (1 .rs files in its src/)"]
        );
    }

    #[test]
    fn table_cells_keep_pipes_inside_code() {
        assert_eq!(
            table_cells("| `a|b` | c |").unwrap(),
            ["`a|b`".to_string(), "c".to_string()]
        );
        assert!(table_cells("not a row").is_none());
        assert!(is_separator(&table_cells("| --- | :-: |").unwrap()));
    }
}
