//! cgroup CPU-bandwidth budget, Linux only: a CPU quota lowers the default
//! team size.
//!
//! A bandwidth limit (`docker --cpus=2`, a Kubernetes CPU limit) is invisible
//! to the affinity mask: the process still sees every CPU, and a team sized to
//! the machine burns the quota faster than the scheduler refills it, stalling
//! every fork-join barrier until the next period. The pure parsers below are
//! tested on strings on every target.

use super::cpus::read_small_file;
use super::env::parse_zig_i64;

/// Whole CPUs a `quota`/`period` pair allows: `floor(quota / period)`, but
/// never below 1 (a fractional allowance still schedules one thread).
/// A non-positive quota (cgroup v1 spells "unlimited" as `-1`) or period
/// means no limit: `None`.
pub(crate) fn cpu_budget_from_quota(quota: i64, period: i64) -> Option<usize> {
    if quota <= 0 || period <= 0 {
        return None;
    }
    // Both positive, so the quotient is in 0..=i64::MAX and fits a u64.
    let whole = u64::try_from(quota / period).ok()?;
    Some(usize::try_from(whole).unwrap_or(usize::MAX).max(1))
}

/// Parses a cgroup v2 `cpu.max` file: after trimming spaces, tabs, CR and LF
/// at both ends, exactly two tokens separated by spaces/tabs, `"quota
/// period"`. A `max` quota (unlimited), one or three tokens, a non-integer,
/// or a non-positive quota or period is `None`; otherwise
/// [`cpu_budget_from_quota`].
pub(crate) fn parse_cpu_max(text: &str) -> Option<usize> {
    let mut tokens = text
        .trim_matches([' ', '\t', '\r', '\n'])
        .split([' ', '\t'])
        .filter(|t| !t.is_empty());
    let quota = tokens.next()?;
    let period = tokens.next()?;
    if tokens.next().is_some() || quota == "max" {
        return None;
    }
    cpu_budget_from_quota(parse_zig_i64(quota)?, parse_zig_i64(period)?)
}

/// The cgroup v1 rule: `cpu.cfs_quota_us` and `cpu.cfs_period_us` texts,
/// each an integer after trimming spaces, tabs, CR and LF, combined by
/// [`cpu_budget_from_quota`]. Either unparsable is `None`.
pub(crate) fn parse_cfs_quota(quota_text: &str, period_text: &str) -> Option<usize> {
    let trim = |t: &str| parse_zig_i64(t.trim_matches([' ', '\t', '\r', '\n']));
    cpu_budget_from_quota(trim(quota_text)?, trim(period_text)?)
}

/// Finds this process's cgroup v2 path in the text of `/proc/self/cgroup`:
/// the first line starting with `0::`, its remainder trimmed of spaces, tabs
/// and CR. `None` when there is no such line (v1 only) or when that first
/// `0::` line's path does not start with `/`.
///
/// ```
/// use fucina_thread::knobs::cgroup_v2_path;
/// assert_eq!(cgroup_v2_path("1:cpu:/\n0::/user.slice/app\n"), Some("/user.slice/app"));
/// assert_eq!(cgroup_v2_path("1:cpu:/\n"), None);
/// ```
pub fn cgroup_v2_path(proc_self_cgroup: &str) -> Option<&str> {
    let line = proc_self_cgroup
        .split('\n')
        .find(|l| l.starts_with("0::"))?;
    let path = line[3..].trim_matches([' ', '\t', '\r']);
    path.starts_with('/').then_some(path)
}

/// The levels whose `cpu.max` bind a process in cgroup v2 `path`: the path
/// itself, then each ancestor, ending with `""` (the mount root). Each level
/// is read as `/sys/fs/cgroup<level>/cpu.max`.
///
/// ```
/// use fucina_thread::knobs::cgroup_v2_levels;
/// let levels: Vec<&str> = cgroup_v2_levels("/a/b").collect();
/// assert_eq!(levels, ["/a/b", "/a", ""]);
/// ```
pub fn cgroup_v2_levels(path: &str) -> impl Iterator<Item = &str> {
    let mut end = Some(path.len());
    std::iter::from_fn(move || {
        let e = end?;
        let level = &path[..e];
        end = if e == 0 {
            None
        } else {
            Some(level.rfind('/').unwrap_or(0))
        };
        Some(level)
    })
}

/// The tightest budget over the v2 levels, given a reader for each level's
/// `cpu.max` text. Unreadable or unlimited levels are skipped.
fn v2_budget<T: AsRef<str>>(
    path: &str,
    mut read_cpu_max: impl FnMut(&str) -> Option<T>,
) -> Option<usize> {
    cgroup_v2_levels(path)
        .filter_map(|level| parse_cpu_max(read_cpu_max(level)?.as_ref()))
        .min()
}

/// Finds this process's cgroup v1 `cpu` controller path in the text of
/// `/proc/self/cgroup`: the path of the first `id:controllers:path` line
/// whose comma-separated controllers include `cpu`, trimmed of spaces, tabs
/// and CR. `None` when there is no such line or its path does not start
/// with `/`.
///
/// ```
/// use fucina_thread::knobs::cgroup_v1_cpu_path;
/// assert_eq!(cgroup_v1_cpu_path("3:cpuset:/\n2:cpu,cpuacct:/job/7\n"), Some("/job/7"));
/// assert_eq!(cgroup_v1_cpu_path("0::/a\n"), None);
/// ```
pub fn cgroup_v1_cpu_path(proc_self_cgroup: &str) -> Option<&str> {
    proc_self_cgroup
        .split('\n')
        .find_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            controllers
                .split(',')
                .any(|c| c == "cpu")
                .then(|| path.trim_matches([' ', '\t', '\r']))
        })
        .filter(|p| p.starts_with('/'))
}

/// The cgroup CPU budget of a process whose `/proc/self/cgroup` text is
/// `proc_self_cgroup`, with the cgroup file systems mounted under `root`
/// (`/sys/fs/cgroup` on a real host; a test passes a fake tree).
///
/// - cgroup v2: `<root><level>/cpu.max` for the `0::` path and every ancestor
///   ([`cgroup_v2_levels`]); the tightest limit wins.
/// - Without a v2 limit, cgroup v1: `<root>/cpu<level>/cpu.cfs_quota_us` and
///   `cpu.cfs_period_us` for the `cpu` controller's path and every ancestor
///   ([`cgroup_v1_cpu_path`]), the tightest limit wins;
///   the mount root itself (level `""`) is always read, which is the
///   container's own cgroup when the runtime mounts it there.
///
/// Unreadable, oversized (4 KiB or more) or unlimited files are skipped; no
/// limit at all is `None`.
pub fn cgroup_cpu_budget_at(proc_self_cgroup: &str, root: &std::path::Path) -> Option<usize> {
    let mut buf = [0u8; 4096];
    let mut read = |path: std::path::PathBuf| read_small_file(path, &mut buf).map(str::to_owned);
    let under = |base: &std::path::Path, level: &str| base.join(level.trim_start_matches('/'));
    let v2 = cgroup_v2_path(proc_self_cgroup)
        .and_then(|path| v2_budget(path, |level| read(under(root, level).join("cpu.max"))));
    if v2.is_some() {
        return v2;
    }
    let v1_root = root.join("cpu");
    let path = cgroup_v1_cpu_path(proc_self_cgroup).unwrap_or("");
    cgroup_v2_levels(path)
        .filter_map(|level| {
            let dir = under(&v1_root, level);
            parse_cfs_quota(
                &read(dir.join("cpu.cfs_quota_us"))?,
                &read(dir.join("cpu.cfs_period_us"))?,
            )
        })
        .min()
}

/// The uncached probe: [`cgroup_cpu_budget_at`] for this process under
/// `/sys/fs/cgroup`; any failure is `None`.
pub(super) fn probe() -> Option<usize> {
    #[cfg(target_os = "linux")]
    {
        let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        cgroup_cpu_budget_at(&text, std::path::Path::new("/sys/fs/cgroup"))
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_rule() {
        assert_eq!(cpu_budget_from_quota(200_000, 100_000), Some(2));
        assert_eq!(cpu_budget_from_quota(800_000, 100_000), Some(8));
        assert_eq!(cpu_budget_from_quota(150_000, 100_000), Some(1));
        assert_eq!(cpu_budget_from_quota(50_000, 100_000), Some(1));
        assert_eq!(cpu_budget_from_quota(-1, 100_000), None);
        assert_eq!(cpu_budget_from_quota(0, 100_000), None);
        assert_eq!(cpu_budget_from_quota(200_000, 0), None);
        assert_eq!(cpu_budget_from_quota(200_000, -5), None);
        assert_eq!(
            cpu_budget_from_quota(i64::MAX, 1),
            usize::try_from(i64::MAX).ok()
        );
    }

    #[test]
    fn cpu_max_examples() {
        assert_eq!(parse_cpu_max("200000 100000"), Some(2));
        assert_eq!(parse_cpu_max("200000 100000\n"), Some(2));
        assert_eq!(parse_cpu_max("  200000\t100000 \r\n"), Some(2));
        assert_eq!(parse_cpu_max("200000   100000"), Some(2));
        assert_eq!(parse_cpu_max("150000 100000"), Some(1));
        assert_eq!(parse_cpu_max("50000 100000"), Some(1));
        assert_eq!(parse_cpu_max("-1 100000"), None);
        assert_eq!(parse_cpu_max("0 100000"), None);
        assert_eq!(parse_cpu_max("200000 0"), None);
        assert_eq!(parse_cpu_max("max 100000"), None);
        assert_eq!(parse_cpu_max("max 100000\n"), None);
        assert_eq!(parse_cpu_max("200000"), None);
        assert_eq!(parse_cpu_max("200000 100000 1"), None);
        assert_eq!(parse_cpu_max(""), None);
        assert_eq!(parse_cpu_max("200000\n100000"), None);
        assert_eq!(parse_cpu_max("2e5 100000"), None);
    }

    #[test]
    fn cfs_v1_examples() {
        assert_eq!(parse_cfs_quota("200000\n", "100000\n"), Some(2));
        assert_eq!(parse_cfs_quota("150000", "100000"), Some(1));
        assert_eq!(parse_cfs_quota("50000", "100000"), Some(1));
        assert_eq!(parse_cfs_quota("-1\n", "100000\n"), None);
        assert_eq!(parse_cfs_quota("0", "100000"), None);
        assert_eq!(parse_cfs_quota("200000", "0"), None);
        assert_eq!(parse_cfs_quota("max", "100000"), None);
        assert_eq!(parse_cfs_quota("", "100000"), None);
    }

    #[test]
    fn proc_self_cgroup_lines() {
        assert_eq!(cgroup_v2_path("0::/\n"), Some("/"));
        assert_eq!(cgroup_v2_path("0::/a/b \r\n"), Some("/a/b"));
        let hybrid = "12:cpu,cpuacct:/docker/x\n1:name=systemd:/x\n0::/x.slice\n";
        assert_eq!(cgroup_v2_path(hybrid), Some("/x.slice"));
        assert_eq!(cgroup_v2_path("4:memory:/a\n1:cpu:/\n"), None);
        assert_eq!(cgroup_v2_path(""), None);
        assert_eq!(cgroup_v2_path("0::\n"), None);
        assert_eq!(cgroup_v2_path("0::relative\n0::/later\n"), None);
        assert_eq!(cgroup_v2_path(" 0::/a\n"), None);
    }

    #[test]
    fn v2_levels_walk_to_the_root() {
        let levels = |p| cgroup_v2_levels(p).collect::<Vec<_>>();
        assert_eq!(levels("/a/b/c"), ["/a/b/c", "/a/b", "/a", ""]);
        assert_eq!(levels("/a"), ["/a", ""]);
        assert_eq!(levels("/"), ["/", ""]);
    }

    #[test]
    fn v2_budget_takes_the_tightest_level() {
        let files = |level: &str| match level {
            "/a/b" => Some("max 100000\n"),
            "/a" => Some("300000 100000\n"),
            "" => Some("200000 100000\n"),
            _ => None,
        };
        assert_eq!(v2_budget("/a/b", files), Some(2));
        let only_leaf = |level: &str| (level == "/a/b").then_some("150000 100000");
        assert_eq!(v2_budget("/a/b", only_leaf), Some(1));
        let none = |_: &str| None::<&str>;
        assert_eq!(v2_budget("/a/b", none), None);
        let unlimited = |_: &str| Some("max 100000");
        assert_eq!(v2_budget("/a/b", unlimited), None);
    }

    /// A fake cgroup tree in a fresh temporary directory, removed on drop.
    struct FakeRoot(std::path::PathBuf);

    impl FakeRoot {
        fn new(name: &str) -> Self {
            let dir =
                std::env::temp_dir().join(format!("fucina-cgroup-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            FakeRoot(dir)
        }
        fn write(&self, rel: &str, text: &str) {
            let path = self.0.join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
    }

    impl Drop for FakeRoot {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn v1_cpu_controller_lines() {
        assert_eq!(cgroup_v1_cpu_path("4:cpu,cpuacct:/a/b\n"), Some("/a/b"));
        assert_eq!(cgroup_v1_cpu_path("4:cpuacct,cpu:/x \r\n"), Some("/x"));
        assert_eq!(cgroup_v1_cpu_path("4:cpuacct:/a\n3:cpuset:/b\n"), None);
        assert_eq!(cgroup_v1_cpu_path("1:cpu:relative\n"), None);
        assert_eq!(cgroup_v1_cpu_path(""), None);
    }

    #[test]
    fn a_fake_v2_tree_gives_the_tightest_cpu_max() {
        let root = FakeRoot::new("v2");
        root.write("cpu.max", "max 100000\n");
        root.write("kubepods/cpu.max", "300000 100000\n");
        root.write("kubepods/pod7/cpu.max", "150000 100000\n");
        let proc = "0::/kubepods/pod7\n";
        assert_eq!(cgroup_cpu_budget_at(proc, &root.0), Some(1));
        root.write("kubepods/pod7/cpu.max", "max 100000\n");
        assert_eq!(cgroup_cpu_budget_at(proc, &root.0), Some(3));
        // A level that cannot be read is skipped; no limit at all is None.
        std::fs::remove_file(root.0.join("kubepods/cpu.max")).unwrap();
        assert_eq!(cgroup_cpu_budget_at(proc, &root.0), None);
    }

    #[test]
    fn a_fake_v1_tree_is_read_along_the_cpu_path_and_at_the_mount_root() {
        let root = FakeRoot::new("v1");
        root.write("cpu/cpu.cfs_quota_us", "-1\n");
        root.write("cpu/cpu.cfs_period_us", "100000\n");
        root.write("cpu/job/cpu.cfs_quota_us", "250000\n");
        root.write("cpu/job/cpu.cfs_period_us", "100000\n");
        let proc = "5:cpuset:/\n4:cpu,cpuacct:/job\n0::/\n";
        assert_eq!(cgroup_cpu_budget_at(proc, &root.0), Some(2));
        // A container runtime that mounts the container's own cgroup at the
        // root: the path in /proc/self/cgroup does not exist below the mount.
        let proc = "4:cpu,cpuacct:/docker/abc\n";
        root.write("cpu/cpu.cfs_quota_us", "100000\n");
        assert_eq!(cgroup_cpu_budget_at(proc, &root.0), Some(1));
        // v2 wins when it has a limit.
        root.write("cpu.max", "400000 100000\n");
        assert_eq!(cgroup_cpu_budget_at("0::/\n4:cpu:/job\n", &root.0), Some(4));
    }
}

#[cfg(test)]
mod doc_examples {
    use super::*;

    #[test]
    fn parse_cfs_quota_examples() {
        assert_eq!(parse_cfs_quota("400000\n", "100000\n"), Some(4));
        assert_eq!(parse_cfs_quota("-1\n", "100000\n"), None);
    }

    #[test]
    fn parse_cpu_max_examples() {
        assert_eq!(parse_cpu_max("200000 100000\n"), Some(2));
        assert_eq!(parse_cpu_max("max 100000\n"), None);
    }

    #[test]
    fn cpu_budget_from_quota_examples() {
        assert_eq!(cpu_budget_from_quota(150_000, 100_000), Some(1));
        assert_eq!(cpu_budget_from_quota(-1, 100_000), None);
    }
}
