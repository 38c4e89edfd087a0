//! Physical- and performance-core detection: the inputs that keep the default
//! team off SMT siblings and, on Apple Silicon, off the efficiency cores.
//!
//! The pure parts (the sysfs cpu-list grammar and the sibling count over an
//! affinity mask) are separated from the I/O so they are tested on strings on
//! every target.

use std::ops::RangeInclusive;

/// Parses a Linux sysfs cpu list (`"0-3,8-11\n"`, `"0,16"`, `"5-5"`).
///
/// Grammar: entries separated by `,` or newline (runs of separators, and
/// leading/trailing ones, are skipped); an entry is a decimal number or an
/// inclusive range `a-b` with `b >= a`. Empty text is an empty list. Any
/// other character (including spaces), a missing number (`"1-"`, `"-3"`),
/// a non-digit (`"1-a"`), a descending range (`"3-1"`) or an integer
/// overflow makes the whole list `None`.
pub(crate) fn parse_cpu_list(text: &str) -> Option<Vec<RangeInclusive<usize>>> {
    let bytes = text.as_bytes();
    let mut i = 0;
    let mut out = Vec::new();
    let number = |i: &mut usize| -> Option<usize> {
        let start = *i;
        while *i < bytes.len() && bytes[*i].is_ascii_digit() {
            *i += 1;
        }
        if *i == start {
            return None;
        }
        // Digits only, so the only possible parse error is overflow.
        text[start..*i].parse().ok()
    };
    loop {
        while i < bytes.len() && matches!(bytes[i], b',' | b'\n') {
            i += 1;
        }
        if i >= bytes.len() {
            return Some(out);
        }
        let first = number(&mut i)?;
        let last = if bytes.get(i) == Some(&b'-') {
            i += 1;
            let last = number(&mut i)?;
            if last < first {
                return None;
            }
            last
        } else {
            first
        };
        out.push(first..=last);
        // The entry must end at a separator or the end of the text.
        if i < bytes.len() && !matches!(bytes[i], b',' | b'\n') {
            return None;
        }
    }
}

/// Counts physical cores over an affinity mask.
///
/// `mask` lists the CPUs the process may run on, sorted ascending without
/// duplicates. `siblings(cpu)` returns that CPU's `thread_siblings_list`
/// text (the hardware threads sharing its core), or `None` when it cannot be
/// read. A CPU is counted iff it is the lowest sibling of its core that is
/// also in the mask, so every core with at least one schedulable hardware
/// thread counts exactly once.
///
/// Returns `None` (unknown) when any lookup fails, any list fails to parse
/// (a CPU list such as `0-3,8`), a list names no CPU of the mask, or nothing was
/// counted (an empty mask).
///
/// ```
/// use fucina_thread::knobs::count_physical_cores;
/// // 8 hyperthreaded cores: cpu i and i + 8 share a core.
/// let mask: Vec<usize> = (0..16).collect();
/// let count = count_physical_cores(&mask, |cpu| Some(format!("{},{}\n", cpu % 8, cpu % 8 + 8)));
/// assert_eq!(count, Some(8));
/// ```
pub fn count_physical_cores<T: AsRef<str>>(
    mask: &[usize],
    mut siblings: impl FnMut(usize) -> Option<T>,
) -> Option<usize> {
    debug_assert!(
        mask.windows(2).all(|w| w[0] < w[1]),
        "mask must be sorted and unique"
    );
    let mut count = 0usize;
    for &cpu in mask {
        let text = siblings(cpu)?;
        let list = parse_cpu_list(text.as_ref())?;
        let lowest_masked = list
            .iter()
            .filter_map(|range| {
                let at = mask.partition_point(|&m| m < *range.start());
                mask.get(at).copied().filter(|m| m <= range.end())
            })
            .min()?;
        if lowest_masked == cpu {
            count += 1;
        }
    }
    (count > 0).then_some(count)
}

/// The uncached physical-core probe (Linux sysfs over the affinity mask,
/// macOS `hw.physicalcpu`, `None` elsewhere).
pub(super) fn probe_physical() -> Option<usize> {
    #[cfg(target_os = "linux")]
    {
        linux::physical()
    }
    #[cfg(target_os = "macos")]
    {
        macos::sysctl_count(c"hw.physicalcpu")
    }
    #[cfg(not(any(target_os = "linux", target_os = "macos")))]
    {
        None
    }
}

/// The uncached performance-core probe (Apple Silicon
/// `hw.perflevel0.physicalcpu`, `None` elsewhere).
pub(super) fn probe_performance() -> Option<usize> {
    #[cfg(all(target_os = "macos", target_arch = "aarch64"))]
    {
        macos::sysctl_count(c"hw.perflevel0.physicalcpu")
    }
    #[cfg(not(all(target_os = "macos", target_arch = "aarch64")))]
    {
        None
    }
}

/// Reads a small file whole into `buf`: `None` on any error, or when the file
/// fills the buffer (implausibly large: unknown rather than truncated).
pub(super) fn read_small_file(path: impl AsRef<std::path::Path>, buf: &mut [u8]) -> Option<&str> {
    use std::io::Read;
    let mut file = std::fs::File::open(path).ok()?;
    let mut filled = 0;
    while filled < buf.len() {
        match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    if filled == buf.len() {
        return None;
    }
    std::str::from_utf8(&buf[..filled]).ok()
}

#[cfg(target_os = "linux")]
mod linux {
    /// The calling thread's affinity mask, ascending.
    fn affinity_mask() -> Option<Vec<usize>> {
        // SAFETY: `cpu_set_t` is a plain bit array; all-zero is the empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::cpu_set_t>();
        // SAFETY: `set` is a valid, writable `cpu_set_t` of exactly `size`
        // bytes; pid 0 means the calling thread.
        let rc = unsafe { libc::sched_getaffinity(0, size, &mut set) };
        if rc != 0 {
            return None;
        }
        let bits = 8 * size;
        // SAFETY: every `cpu < bits` indexes inside the set.
        Some(
            (0..bits)
                .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
                .collect(),
        )
    }

    pub(super) fn physical() -> Option<usize> {
        let mask = affinity_mask()?;
        let mut buf = [0u8; 4096];
        super::count_physical_cores(&mask, |cpu| {
            let path = format!("/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list");
            super::read_small_file(&path, &mut buf).map(str::to_owned)
        })
    }
}

#[cfg(target_os = "macos")]
mod macos {
    use std::ffi::CStr;

    /// A positive `c_int` sysctl by name; `None` on error or a value < 1.
    pub(super) fn sysctl_count(name: &CStr) -> Option<usize> {
        let mut value: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>();
        // SAFETY: `name` is NUL-terminated; `value`/`len` describe a writable
        // `c_int`; no new value is set (null pointer, length 0).
        let rc = unsafe {
            libc::sysctlbyname(
                name.as_ptr(),
                (&raw mut value).cast(),
                &mut len,
                std::ptr::null_mut(),
                0,
            )
        };
        if rc != 0 || value < 1 {
            return None;
        }
        usize::try_from(value).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpus(text: &str) -> Option<Vec<usize>> {
        parse_cpu_list(text).map(|l| l.into_iter().flatten().collect())
    }

    #[test]
    fn cpu_list_accepts_the_grammar() {
        assert_eq!(cpus("3"), Some(vec![3]));
        assert_eq!(cpus("3\n"), Some(vec![3]));
        assert_eq!(cpus("0,16"), Some(vec![0, 16]));
        assert_eq!(cpus("0-1"), Some(vec![0, 1]));
        assert_eq!(cpus("0-1,8-9\n"), Some(vec![0, 1, 8, 9]));
        assert_eq!(cpus("5-5"), Some(vec![5]));
        assert_eq!(cpus("0\n1\n"), Some(vec![0, 1]));
        assert_eq!(cpus(",0,,1\n\n"), Some(vec![0, 1]));
        assert_eq!(cpus(""), Some(vec![]));
        assert_eq!(cpus("\n"), Some(vec![]));
    }

    #[test]
    fn cpu_list_rejects_malformed_text() {
        for text in [
            "a",
            "1-",
            "-3",
            "1-a",
            "3-1",
            "0, 1",
            " 0",
            "0 ",
            "0\r\n",
            "1-2-3",
            "+1",
            "99999999999999999999999",
            "0-99999999999999999999999",
        ] {
            assert_eq!(parse_cpu_list(text), None, "{text:?}");
        }
    }

    fn ht8(cpu: usize) -> Option<String> {
        Some(format!("{},{}\n", cpu % 8, cpu % 8 + 8))
    }

    #[test]
    fn physical_count_over_masks() {
        let all: Vec<usize> = (0..16).collect();
        assert_eq!(count_physical_cores(&all, ht8), Some(8));
        // Only the first hyperthread of each core.
        let firsts: Vec<usize> = (0..8).collect();
        assert_eq!(count_physical_cores(&firsts, ht8), Some(8));
        // Only the second hyperthread of each core: counted via cpu 8..16.
        let seconds: Vec<usize> = (8..16).collect();
        assert_eq!(count_physical_cores(&seconds, ht8), Some(8));
        // taskset -c 0,8 is one core; 0-3,8-11 is four.
        assert_eq!(count_physical_cores(&[0, 8], ht8), Some(1));
        let half: Vec<usize> = (0..4).chain(8..12).collect();
        assert_eq!(count_physical_cores(&half, ht8), Some(4));
        // Range-form sibling lists ("0-1" style SMT pairs).
        let pairs = |cpu: usize| Some(format!("{}-{}", cpu & !1, cpu | 1));
        assert_eq!(count_physical_cores(&all, pairs), Some(8));
        // No SMT: every CPU is its own core.
        let single = |cpu: usize| Some(cpu.to_string());
        assert_eq!(count_physical_cores(&[0, 2, 5], single), Some(3));
    }

    #[test]
    fn physical_count_failures_are_unknown() {
        assert_eq!(count_physical_cores(&[], ht8), None);
        let missing = |cpu: usize| (cpu != 3).then(|| cpu.to_string());
        assert_eq!(count_physical_cores(&[0, 1, 2, 3], missing), None);
        let bad = |_cpu: usize| Some("0-x".to_owned());
        assert_eq!(count_physical_cores(&[0], bad), None);
        // A list that names no CPU of the mask is inconsistent topology.
        let elsewhere = |_cpu: usize| Some("40-41".to_owned());
        assert_eq!(count_physical_cores(&[0, 1], elsewhere), None);
        let empty = |_cpu: usize| Some(String::new());
        assert_eq!(count_physical_cores(&[0], empty), None);
    }
}

#[cfg(test)]
mod doc_examples {
    use super::*;

    #[test]
    fn parse_cpu_list_examples() {
        assert_eq!(parse_cpu_list("0-1,8\n"), Some(vec![0..=1, 8..=8]));
        assert_eq!(parse_cpu_list("3-1"), None);
    }
}
