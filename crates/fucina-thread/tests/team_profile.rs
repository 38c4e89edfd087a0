//! `FUCINA_POOL_PROFILE=1`: one trace line per barrier dispatch, in the exact
//! format the `profile` module documents. A process-level test: the parent re-runs this
//! binary as a child with the variable set and parses the child's stderr.

use fucina_thread::{Team, TeamOptions};
use std::process::Command;

const CHILD_ENV: &str = "FUCINA_THREAD_PROFILE_CHILD";

/// The child: 3 barrier dispatches (2 chunks, 1 chained), plus calls that must
/// not print (single task, serial nested call).
#[test]
fn profile_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let team = Team::new(TeamOptions { max_workers: 1 }).unwrap();
    team.parallel_chunks(&[0u8; 5], |_| {});
    team.parallel_chunks(&[0u8; 1], |_| {});
    team.parallel_chunks(&[0u8; 40], |_| {
        // Nested: runs inline, no trace line.
        team.parallel_chunks(&[0u8; 3], |_| {});
    });
    assert!(team.parallel_chained(&mut [0u8; 3], 3, |_, _| {}));
}

fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split(' ')
        .find_map(|kv| kv.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
        .unwrap_or_else(|| panic!("no {key} in {line}"))
}

#[test]
fn profile_lines_have_the_reference_format() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let team_size = Team::new(TeamOptions { max_workers: 1 })
        .unwrap()
        .participants();
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "profile_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .env("FUCINA_POOL_PROFILE", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "child failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8(out.stderr).unwrap();
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("[pool-trace] "))
        .collect();
    if team_size == 1 {
        assert!(lines.is_empty(), "a team without workers never traces");
        return;
    }
    assert_eq!(lines.len(), 3, "one line per barrier dispatch:\n{stderr}");
    let expect = [
        ("1", "chunks", "5", "1"),
        ("2", "chunks", "40", "4"),
        ("3", "chained", "3", "1"),
    ];
    for (line, (d, mode, jobs, chunk)) in lines.iter().zip(expect) {
        assert_eq!(field(line, "dispatch"), d, "{line}");
        assert_eq!(field(line, "mode"), mode, "{line}");
        assert_eq!(field(line, "jobs"), jobs, "{line}");
        assert_eq!(field(line, "participants"), "2", "{line}");
        assert_eq!(field(line, "chunk"), chunk, "{line}");
        let span: u64 = field(line, "span_ns").parse().unwrap();
        let mut tasks = 0;
        for w in 0..2 {
            // w<i>=claim+<ns>,complete+<ns>,tasks:<n>
            let v = field(line, &format!("w{w}"));
            let rest = v.strip_prefix("claim+").unwrap_or_else(|| panic!("{line}"));
            let (claim, rest) = rest.split_once(",complete+").unwrap();
            let (complete, n) = rest.split_once(",tasks:").unwrap();
            let (claim, complete): (u64, u64) = (claim.parse().unwrap(), complete.parse().unwrap());
            assert!(claim <= complete && complete <= span, "{line}");
            tasks += n.parse::<u64>().unwrap();
        }
        assert_eq!(tasks.to_string(), jobs, "{line}");
        // Exactly the header fields and one field per participant.
        assert_eq!(line.split(' ').count(), 1 + 6 + 2, "{line}");
    }
}
