//! Environment-variable parsing for the `FUCINA_*` knobs.
//!
//! The string parsers are pure and public so their exact grammar can be
//! tested (and reused) without touching the process environment; the `env_*`
//! readers feed them `std::env::var_os` values (raw bytes, so a non-UTF-8
//! value is judged by the same byte grammar instead of being rejected early).
//!
//! The reference also has a libc-free `/proc/self/environ` scanner for static
//! builds without libc. It is deliberately omitted here: Rust's `std` always
//! reads the real process environment on every target it supports, so the
//! scanner would be dead code.

use std::ffi::OsString;

/// Splits an optional leading sign off, returning `(negative, digits)`.
fn split_sign(text: &[u8]) -> (bool, &[u8]) {
    match text.first() {
        Some(b'+') => (false, &text[1..]),
        Some(b'-') => (true, &text[1..]),
        _ => (false, text),
    }
}

/// Calls `step(digit)` for every digit of a Zig-style base-10 digit string
/// (underscores allowed between digits, never first or last; no other
/// character, no whitespace). Returns `None` on a grammar error or when
/// `step` reports overflow.
fn for_each_digit(digits: &[u8], mut step: impl FnMut(u8) -> Option<()>) -> Option<()> {
    match (digits.first(), digits.last()) {
        (None, _) | (Some(b'_'), _) | (_, Some(b'_')) => return None,
        _ => {}
    }
    for &c in digits {
        if c == b'_' {
            continue;
        }
        if !c.is_ascii_digit() {
            return None;
        }
        step(c - b'0')?;
    }
    Some(())
}

/// Parses a base-10 `usize` with the exact quirks of Zig's
/// `std.fmt.parseInt(usize, text, 10)`, which the reference's knobs use:
///
/// - a leading `+` is accepted (`"+6"` is 6);
/// - underscores between digits are accepted (`"1_2"` is 12), but not as the
///   first or last character (`"_1"`, `"1_"` are invalid);
/// - no whitespace trimming (`"6\n"` and `" 6"` are invalid);
/// - leading zeros are fine (`"0008"` is 8);
/// - overflow is invalid (`"18446744073709551616"` on 64-bit targets);
/// - a leading `-` is accepted but only a zero value survives it (`"-0"` and
///   `"-0_0"` are 0, `"-4"` is invalid).
///
/// Returns `None` for every invalid input, including the empty string.
pub(crate) fn parse_zig_usize(text: impl AsRef<[u8]>) -> Option<usize> {
    let (negative, digits) = split_sign(text.as_ref());
    let mut acc: usize = 0;
    for_each_digit(digits, |d| {
        let d = usize::from(d);
        acc = acc.checked_mul(10)?;
        acc = if negative {
            acc.checked_sub(d)?
        } else {
            acc.checked_add(d)?
        };
        Some(())
    })?;
    Some(acc)
}

/// Parses a base-10 `i64` with the same Zig quirks as [`parse_zig_usize`]
/// (leading `+`/`-`, inner underscores, no whitespace, overflow invalid;
/// `i64::MIN` is representable). Used for cgroup quota files.
pub(crate) fn parse_zig_i64(text: impl AsRef<[u8]>) -> Option<i64> {
    let (negative, digits) = split_sign(text.as_ref());
    let mut acc: i64 = 0;
    for_each_digit(digits, |d| {
        let d = i64::from(d);
        acc = acc.checked_mul(10)?;
        acc = if negative {
            acc.checked_sub(d)?
        } else {
            acc.checked_add(d)?
        };
        Some(())
    })?;
    Some(acc)
}

/// The positive-integer knob contract (`FUCINA_MAX_THREADS`): the
/// [`parse_zig_usize`] value when it is valid and non-zero, else `None`
/// ("no override"). So `"0"`, `"-0"`, `"-4"`, `""` and `"6\n"` are all `None`.
pub(crate) fn parse_positive_usize(text: impl AsRef<[u8]>) -> Option<usize> {
    parse_zig_usize(text).filter(|&v| v > 0)
}

/// The non-negative knob contract (`FUCINA_SPIN_BUDGET`): the empty string or
/// any leading `-` is `None` (so `"-0"` is rejected, unlike the raw parser);
/// otherwise the [`parse_zig_usize`] value, where `0` is a valid value.
pub(crate) fn parse_spin_budget(text: impl AsRef<[u8]>) -> Option<usize> {
    let text = text.as_ref();
    match text.first() {
        None | Some(b'-') => None,
        Some(_) => parse_zig_usize(text),
    }
}

/// The flag contract (`FUCINA_POOL_PROFILE`) applied to a value that is set:
/// true iff it is non-empty and its first byte is not `'0'`. (`"false"` is
/// therefore true; `"0"`, `"00"` and `""` are false.)
pub(crate) fn parse_flag(value: impl AsRef<[u8]>) -> bool {
    value.as_ref().first().is_some_and(|&c| c != b'0')
}

/// Reads an environment variable as raw bytes. A name that the OS cannot
/// hold (empty, containing `=` or NUL) is "unset" rather than a panic.
fn env_bytes(name: &str) -> Option<Vec<u8>> {
    if name.is_empty() || name.contains(['=', '\0']) {
        return None;
    }
    std::env::var_os(name).map(OsString::into_encoded_bytes)
}

/// Reads the positive-integer knob `name` (a positive base-10 integer): `None`
/// when unset, invalid or 0. Reads the environment on every call; the thread
/// count caches its `FUCINA_MAX_THREADS` read (see [`crate::knobs`]).
pub fn env_positive_usize(name: &str) -> Option<usize> {
    parse_positive_usize(env_bytes(name)?)
}

/// Reads `FUCINA_SPIN_BUDGET` (a non-negative base-10 integer): `None` when unset,
/// empty, negative-looking or invalid; `0` is a valid value (park at once).
/// Teams read it once at creation.
pub fn env_spin_budget() -> Option<usize> {
    parse_spin_budget(env_bytes(super::SPIN_BUDGET_ENV)?)
}

/// Reads the flag `name`: set, non-empty, and the first
/// character is not `'0'`.
pub fn env_flag(name: &str) -> bool {
    env_bytes(name).is_some_and(parse_flag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_parser_quirks() {
        assert_eq!(parse_zig_usize("6"), Some(6));
        assert_eq!(parse_zig_usize("+6"), Some(6));
        assert_eq!(parse_zig_usize("1_2"), Some(12));
        assert_eq!(parse_zig_usize("1__2"), Some(12));
        assert_eq!(parse_zig_usize("0008"), Some(8));
        assert_eq!(parse_zig_usize("0"), Some(0));
        assert_eq!(parse_zig_usize("-0"), Some(0));
        assert_eq!(parse_zig_usize("-0_0"), Some(0));
        assert_eq!(parse_zig_usize("-4"), None);
        assert_eq!(parse_zig_usize("_1"), None);
        assert_eq!(parse_zig_usize("1_"), None);
        assert_eq!(parse_zig_usize("+_1"), None);
        assert_eq!(parse_zig_usize("6\n"), None);
        assert_eq!(parse_zig_usize(" 6"), None);
        assert_eq!(parse_zig_usize(""), None);
        assert_eq!(parse_zig_usize("+"), None);
        assert_eq!(parse_zig_usize("-"), None);
        assert_eq!(parse_zig_usize("+-1"), None);
        assert_eq!(parse_zig_usize("0x10"), None);
        assert_eq!(parse_zig_usize("1e3"), None);
        assert_eq!(parse_zig_usize("١"), None); // non-ASCII digit
        assert_eq!(parse_zig_usize(usize::MAX.to_string()), Some(usize::MAX));
        // usize::MAX + 1 overflows.
        let over = (u128::try_from(usize::MAX).unwrap() + 1).to_string();
        assert_eq!(parse_zig_usize(&over), None);
        // 21 digits overflow on every target.
        assert_eq!(parse_zig_usize("100000000000000000000"), None);
    }

    #[test]
    fn i64_parser() {
        assert_eq!(parse_zig_i64("-1"), Some(-1));
        assert_eq!(parse_zig_i64("+200_000"), Some(200_000));
        assert_eq!(parse_zig_i64("-9223372036854775808"), Some(i64::MIN));
        assert_eq!(parse_zig_i64("9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_zig_i64("9223372036854775808"), None);
        assert_eq!(parse_zig_i64("-9223372036854775809"), None);
        assert_eq!(parse_zig_i64("max"), None);
        assert_eq!(parse_zig_i64(""), None);
    }

    #[test]
    fn positive_knob() {
        assert_eq!(parse_positive_usize("+6"), Some(6));
        assert_eq!(parse_positive_usize("1_2"), Some(12));
        assert_eq!(parse_positive_usize("0008"), Some(8));
        assert_eq!(parse_positive_usize("0"), None);
        assert_eq!(parse_positive_usize("-0"), None);
        assert_eq!(parse_positive_usize("-4"), None);
        assert_eq!(parse_positive_usize("6\n"), None);
        assert_eq!(parse_positive_usize(""), None);
        assert_eq!(parse_positive_usize("100000000000000000000"), None);
        assert_eq!(parse_positive_usize(b"\xff"), None);
    }

    #[test]
    fn spin_knob() {
        assert_eq!(parse_spin_budget("0"), Some(0));
        assert_eq!(parse_spin_budget("512"), Some(512));
        assert_eq!(parse_spin_budget("+512"), Some(512));
        assert_eq!(parse_spin_budget("5_12"), Some(512));
        assert_eq!(parse_spin_budget(""), None);
        assert_eq!(parse_spin_budget("-0"), None);
        assert_eq!(parse_spin_budget("-5"), None);
        assert_eq!(parse_spin_budget(" 5"), None);
        assert_eq!(parse_spin_budget("5 "), None);
        assert_eq!(parse_spin_budget("1099511627776"), Some(1 << 40));
        assert_eq!(parse_spin_budget("100000000000000000000"), None);
    }

    #[test]
    fn flag() {
        assert!(parse_flag("1"));
        assert!(parse_flag("yes"));
        assert!(parse_flag("false"));
        assert!(parse_flag(" 0"));
        assert!(parse_flag(b"\xff"));
        assert!(!parse_flag(""));
        assert!(!parse_flag("0"));
        assert!(!parse_flag("0yes"));
    }

    #[test]
    fn unholdable_names_read_as_unset() {
        assert_eq!(env_positive_usize(""), None);
        assert_eq!(env_positive_usize("A=B"), None);
        assert_eq!(env_positive_usize("A\0B"), None);
        assert!(!env_flag("A=B"));
    }
}

#[cfg(test)]
mod doc_examples {
    use super::*;

    #[test]
    fn parse_zig_usize_examples() {
        assert_eq!(parse_zig_usize("+1_2"), Some(12));
        assert_eq!(parse_zig_usize("-0"), Some(0));
        assert_eq!(parse_zig_usize("6\n"), None);
    }

    #[test]
    fn parse_positive_usize_examples() {
        assert_eq!(parse_positive_usize("0008"), Some(8));
        assert_eq!(parse_positive_usize("0"), None);
    }

    #[test]
    fn parse_spin_budget_examples() {
        assert_eq!(parse_spin_budget("0"), Some(0));
        assert_eq!(parse_spin_budget("-0"), None);
    }

    #[test]
    fn parse_flag_examples() {
        assert!(parse_flag("1"));
        assert!(!parse_flag("0"));
    }
}
