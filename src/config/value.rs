//! Parsers for the scalar value syntaxes nginx accepts in directive
//! arguments: plain numbers, sizes (`8k`, `1m`), offsets (`10g`) and time
//! intervals (`1h 30m`, `500ms`).
//!
//! The behaviour follows nginx's `ngx_atoi`, `ngx_parse_size`,
//! `ngx_parse_offset` and `ngx_parse_time` so that a config nginx accepts is
//! accepted here with the same meaning, and one nginx rejects is rejected.
//! Every function returns `None` where nginx would return `NGX_ERROR`;
//! callers turn that into nginx's `invalid value` style message.

/// Largest value nginx's signed integer types (`ngx_int_t`, `ssize_t`,
/// `off_t`) can hold on 64-bit; results above it are errors in nginx, so
/// they are here too, even though we return `u64`.
const MAX_SIGNED: u64 = i64::MAX as u64;

/// `ngx_parse_time` keeps every intermediate total within a signed 32-bit
/// range (it was designed for 32-bit `ngx_msec_t` timers).
const MAX_INT32: u64 = i32::MAX as u64;

/// A non-empty string of ASCII decimal digits (no sign, no spaces), at
/// most `i64::MAX`, like `ngx_atoi`.
pub fn number(s: &str) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    let mut value: u64 = 0;
    for b in s.bytes() {
        if !b.is_ascii_digit() {
            return None;
        }
        value = value.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
        if value > MAX_SIGNED {
            return None;
        }
    }
    Some(value)
}

/// Split an optional one-letter binary unit off the end of `s` and scale
/// the number before it; `units` maps a lowercase unit letter to its factor.
/// The number must not exceed `i64::MAX / factor`, mirroring nginx's
/// per-unit `max` check, so the product always fits.
fn scaled(s: &str, units: &[(u8, u64)]) -> Option<u64> {
    let last = s.bytes().last()?;
    let unit = units
        .iter()
        .find(|(letter, _)| last.to_ascii_lowercase() == *letter);
    let (digits, scale) = match unit {
        // The unit letter is ASCII, so slicing one byte off is on a char
        // boundary.
        Some((_, scale)) => (&s[..s.len() - 1], *scale),
        None => (s, 1),
    };
    let n = number(digits)?;
    if n > MAX_SIGNED / scale {
        return None;
    }
    Some(n * scale)
}

/// A size in bytes as `ngx_parse_size`: `N`, `Nk`/`NK` (KiB), `Nm`/`NM`
/// (MiB). Note there is no `g` unit for sizes (only for offsets).
pub fn size(s: &str) -> Option<u64> {
    scaled(s, &[(b'k', 1024), (b'm', 1024 * 1024)])
}

/// A file offset/length in bytes as `ngx_parse_offset`: like [`size`] but
/// also `Ng`/`NG` (GiB).
pub fn offset(s: &str) -> Option<u64> {
    scaled(
        s,
        &[
            (b'k', 1024),
            (b'm', 1024 * 1024),
            (b'g', 1024 * 1024 * 1024),
        ],
    )
}

/// The units of `ngx_parse_time` in the order they must appear. Each unit
/// may be used at most once and only after larger ones; the position in
/// this order is what the "step" comparisons below use.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    Start,
    Year,
    Month,
    Week,
    Day,
    Hour,
    Min,
    Sec,
    Msec,
    /// A bare number followed by a space: counts as seconds and ends the
    /// list of units (only more bare digits may follow).
    Last,
}

/// Shared implementation of `ngx_parse_time`; `is_sec` selects a result in
/// seconds (and forbids `ms`) rather than milliseconds.
fn parse_time(s: &str, is_sec: bool) -> Option<u64> {
    // In millisecond mode nginx starts at the "month" step, which makes
    // both `y` and `M` invalid there: they would not fit its 32-bit
    // millisecond totals anyway.
    let mut step = if is_sec { Step::Start } else { Step::Month };
    let unit_scale: u64 = if is_sec { 1 } else { 1000 };
    let mut valid = false;
    let mut value: u64 = 0;
    let mut total: u64 = 0;
    let bytes = s.as_bytes();
    let mut i = 0;

    while i < bytes.len() {
        let c = bytes[i];
        i += 1;
        if c.is_ascii_digit() {
            // nginx does not guard this accumulation; overflow can only
            // come from absurd inputs, which we reject instead.
            value = value.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
            valid = true;
            continue;
        }

        // (new step, seconds per unit); the step must come strictly after
        // the previous one, except `y` which only needs to be first.
        let (next, secs): (Step, u64) = match c {
            b'y' => {
                if step > Step::Start {
                    return None;
                }
                (Step::Year, 60 * 60 * 24 * 365)
            }
            b'M' => (Step::Month, 60 * 60 * 24 * 30),
            b'w' => (Step::Week, 60 * 60 * 24 * 7),
            b'd' => (Step::Day, 60 * 60 * 24),
            b'h' => (Step::Hour, 60 * 60),
            b'm' if bytes.get(i) == Some(&b's') => {
                if is_sec {
                    return None;
                }
                i += 1;
                (Step::Msec, 0)
            }
            b'm' => (Step::Min, 60),
            b's' => (Step::Sec, 1),
            b' ' => {
                // A bare number then a space means seconds, and nothing
                // with a unit may follow.
                if step >= Step::Sec {
                    return None;
                }
                (Step::Last, 1)
            }
            _ => return None,
        };
        if next != Step::Year && next != Step::Last && step >= next {
            return None;
        }
        step = next;

        // Milliseconds are counted as-is; everything else is converted to
        // the result unit. The per-unit maximum keeps each part within the
        // signed 32-bit range, as in nginx.
        let (scale, max) = if next == Step::Msec {
            (1, MAX_INT32)
        } else if is_sec {
            (secs, MAX_INT32 / secs)
        } else {
            (secs * 1000, MAX_INT32 / secs / 1000)
        };
        if value > max {
            return None;
        }
        total += value * scale;
        if total > MAX_INT32 {
            return None;
        }
        value = 0;

        // Spaces after a unit are separators ("1h 30m"); after a bare
        // number the space itself was the terminator handled above.
        while bytes.get(i) == Some(&b' ') {
            i += 1;
        }
    }

    if !valid {
        return None;
    }
    // A trailing bare number is seconds. nginx applies no 32-bit limit to
    // this last part, so neither do we (beyond u64 overflow).
    total.checked_add(value.checked_mul(unit_scale)?)
}

/// A time interval in milliseconds, as `ngx_parse_time(s, 0)` (used by
/// nginx's `ngx_conf_set_msec_slot`): e.g. `500ms`, `30s`, `1h 30m`,
/// `1h30m`, bare `30` (= 30 seconds). Units `w d h m s ms`, each at most
/// once, largest first; `y` and `M` are rejected in this mode, as in nginx.
pub fn time_ms(s: &str) -> Option<u64> {
    parse_time(s, false)
}

/// A time interval in seconds, as `ngx_parse_time(s, 1)` (nginx's
/// `ngx_conf_set_sec_slot`): units `y M w d h m s` (M = 30 days,
/// y = 365 days), `ms` is invalid.
pub fn time_secs(s: &str) -> Option<u64> {
    parse_time(s, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers() {
        assert_eq!(number("0"), Some(0));
        assert_eq!(number("0042"), Some(42));
        assert_eq!(number("9223372036854775807"), Some(i64::MAX as u64));
        assert_eq!(number("9223372036854775808"), None);
        assert_eq!(number("99999999999999999999999"), None);
        assert_eq!(number(""), None);
        assert_eq!(number("-1"), None);
        assert_eq!(number("+1"), None);
        assert_eq!(number(" 1"), None);
        assert_eq!(number("1k"), None);
        assert_eq!(number("١"), None); // non-ASCII digit
    }

    #[test]
    fn sizes() {
        assert_eq!(size("512"), Some(512));
        assert_eq!(size("8k"), Some(8192));
        assert_eq!(size("8K"), Some(8192));
        assert_eq!(size("1m"), Some(1 << 20));
        assert_eq!(size("2M"), Some(2 << 20));
        assert_eq!(size("0k"), Some(0));
        assert_eq!(size("1g"), None);
        assert_eq!(size("k"), None);
        assert_eq!(size(""), None);
        assert_eq!(size("1.5k"), None);
        assert_eq!(size("1 k"), None);
        assert_eq!(size("1kb"), None);
        // Limits: the number before the unit may be at most i64::MAX/scale.
        let max_k = (i64::MAX as u64) / 1024;
        assert_eq!(size(&format!("{max_k}k")), Some(max_k * 1024));
        assert_eq!(size(&format!("{}k", max_k + 1)), None);
        assert_eq!(size("99999999999999999999"), None);
        assert_eq!(size("é"), None);
    }

    #[test]
    fn offsets() {
        assert_eq!(offset("10"), Some(10));
        assert_eq!(offset("10k"), Some(10 * 1024));
        assert_eq!(offset("10M"), Some(10 << 20));
        assert_eq!(offset("10g"), Some(10 << 30));
        assert_eq!(offset("10G"), Some(10 << 30));
        assert_eq!(offset("10t"), None);
        assert_eq!(offset("g"), None);
        let max_g = (i64::MAX as u64) >> 30;
        assert_eq!(offset(&format!("{max_g}g")), Some(max_g << 30));
        assert_eq!(offset(&format!("{}g", max_g + 1)), None);
    }

    #[test]
    fn time_ms_values() {
        assert_eq!(time_ms("500ms"), Some(500));
        assert_eq!(time_ms("30s"), Some(30_000));
        assert_eq!(time_ms("30"), Some(30_000));
        assert_eq!(time_ms("0"), Some(0));
        assert_eq!(time_ms("1m"), Some(60_000));
        assert_eq!(time_ms("1h 30m"), Some(5_400_000));
        assert_eq!(time_ms("1h30m"), Some(5_400_000));
        assert_eq!(time_ms("1h  30m  "), Some(5_400_000));
        assert_eq!(time_ms("1d"), Some(86_400_000));
        assert_eq!(time_ms("1w"), Some(7 * 86_400_000));
        assert_eq!(time_ms("1s 500ms"), Some(1500));
        assert_eq!(time_ms("1m30"), Some(90_000)); // trailing bare = seconds
        assert_eq!(time_ms("1h 30"), Some(3_630_000));
        assert_eq!(time_ms("30 5"), Some(35_000)); // nginx quirk
    }

    #[test]
    fn time_ms_errors() {
        assert_eq!(time_ms(""), None);
        assert_eq!(time_ms("s"), None);
        assert_eq!(time_ms("ms"), None);
        assert_eq!(time_ms("1y"), None); // not allowed for msec values
        assert_eq!(time_ms("1M"), None);
        assert_eq!(time_ms("30m 1h"), None); // wrong order
        assert_eq!(time_ms("1h 1h"), None); // repeated unit
        assert_eq!(time_ms("1s1s"), None);
        assert_eq!(time_ms("500ms 1s"), None);
        assert_eq!(time_ms(" 30s"), None); // leading space
        assert_eq!(time_ms("30 s"), None); // unit after bare number
        assert_eq!(time_ms("30x"), None);
        assert_eq!(time_ms("-1s"), None);
        assert_eq!(time_ms("1.5s"), None);
        // Per-part 32-bit millisecond limits.
        assert_eq!(time_ms("24d"), Some(24 * 86_400_000));
        assert_eq!(time_ms("25d"), None);
        assert_eq!(time_ms("2147483s"), Some(2_147_483_000));
        assert_eq!(time_ms("2147484s"), None);
        assert_eq!(time_ms("2147483647ms"), Some(2_147_483_647));
        assert_eq!(time_ms("2147483648ms"), None);
        assert_eq!(time_ms("24d 1d"), None);
        assert_eq!(time_ms("99999999999999999999999"), None);
    }

    #[test]
    fn time_secs_values() {
        assert_eq!(time_secs("30"), Some(30));
        assert_eq!(time_secs("30s"), Some(30));
        assert_eq!(time_secs("5m"), Some(300));
        assert_eq!(time_secs("1h 30m"), Some(5400));
        assert_eq!(time_secs("1d"), Some(86_400));
        assert_eq!(time_secs("1M"), Some(30 * 86_400));
        assert_eq!(time_secs("1y"), Some(365 * 86_400));
        assert_eq!(
            time_secs("1y 1M 1w 1d 1h 1m 1s"),
            Some(365 * 86_400 + 30 * 86_400 + 7 * 86_400 + 86_400 + 3600 + 61)
        );
        assert_eq!(time_secs("500ms"), None);
        assert_eq!(time_secs("1M 1y"), None);
        assert_eq!(time_secs("1y1y"), None);
        assert_eq!(time_secs("68y"), Some(68 * 365 * 86_400));
        assert_eq!(time_secs("69y"), None);
        assert_eq!(time_secs("2147483647s"), Some(2_147_483_647));
        assert_eq!(time_secs("2147483648s"), None);
        assert_eq!(time_secs("x"), None);
    }
}
