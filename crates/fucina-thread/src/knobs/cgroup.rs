//! cgroup CPU-bandwidth budget, Linux only: a CPU quota lowers the default
//! team size.
//!
//! A bandwidth limit (`docker --cpus=2`, a Kubernetes CPU limit) is invisible
//! to the affinity mask: the process still sees every CPU, and a team sized to
//! the machine burns the quota faster than the scheduler refills it, stalling
//! every fork-join barrier until the next period. The pure parsers below are
//! tested on strings on every target.

use super::env::parse_zig_i64;

/// Whole CPUs a `quota`/`period` pair allows: `floor(quota / period)`, but
/// never below 1 (a fractional allowance still schedules one thread).
/// A non-positive quota (cgroup v1 spells "unlimited" as `-1`) or period
/// means no limit: `None`.
///
/// ```
/// use fucina_thread::knobs::cpu_budget_from_quota;
/// assert_eq!(cpu_budget_from_quota(150_000, 100_000), Some(1));
/// assert_eq!(cpu_budget_from_quota(-1, 100_000), None);
/// ```
pub fn cpu_budget_from_quota(quota: i64, period: i64) -> Option<usize> {
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
///
/// ```
/// use fucina_thread::knobs::parse_cpu_max;
/// assert_eq!(parse_cpu_max("200000 100000\n"), Some(2));
/// assert_eq!(parse_cpu_max("max 100000\n"), None);
/// ```
pub fn parse_cpu_max(text: &str) -> Option<usize> {
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
///
/// ```
/// use fucina_thread::knobs::parse_cfs_quota;
/// assert_eq!(parse_cfs_quota("400000\n", "100000\n"), Some(4));
/// assert_eq!(parse_cfs_quota("-1\n", "100000\n"), None);
/// ```
pub fn parse_cfs_quota(quota_text: &str, period_text: &str) -> Option<usize> {
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

/// The uncached probe: v2 over the process's cgroup and its ancestors, then
/// the v1 fallback; any failure is `None`.
pub(super) fn probe() -> Option<usize> {
    #[cfg(target_os = "linux")]
    {
        linux_probe()
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

#[cfg(target_os = "linux")]
fn linux_probe() -> Option<usize> {
    use super::cpus::read_small_file;
    let mut proc_buf = [0u8; 4096];
    let v2 = read_small_file("/proc/self/cgroup", &mut proc_buf)
        .and_then(cgroup_v2_path)
        .and_then(|path| {
            let mut buf = [0u8; 64];
            v2_budget(path, |level| {
                read_small_file(&format!("/sys/fs/cgroup{level}/cpu.max"), &mut buf)
                    .map(str::to_owned)
            })
        });
    if v2.is_some() {
        return v2;
    }
    let mut quota_buf = [0u8; 64];
    let mut period_buf = [0u8; 64];
    let quota = read_small_file("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", &mut quota_buf)?;
    let period = read_small_file("/sys/fs/cgroup/cpu/cpu.cfs_period_us", &mut period_buf)?;
    parse_cfs_quota(quota, period)
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
}
