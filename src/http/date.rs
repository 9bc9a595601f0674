//! Time formatting for headers and logs, and HTTP date parsing.
//!
//! Like nginx's `ngx_time_update`, the strings for "now" are formatted once
//! per wall-clock second and then copied: every response carries a `Date`
//! header and every log line a timestamp, so formatting per use would be
//! pure waste. nginx shares one cache per worker; tern keeps one per thread
//! (a `thread_local`), which needs no locking and is refreshed lazily by the
//! first caller in a new second.
//!
//! Formats (all fixed width for years 0..=9999, which "now" always is):
//! * [`http_date`]: `Sun, 06 Nov 1994 08:49:37 GMT` (`Date`, `Expires`);
//! * [`err_log_time`]: `1994/11/06 08:49:37`, local time (error log);
//! * [`time_local`]: `06/Nov/1994:08:49:37 +0000`, local time (`$time_local`);
//! * [`time_iso8601`]: `1994-11-06T08:49:37+00:00`, local time
//!   (`$time_iso8601`).
//!
//! [`parse_http_date`] accepts the three formats nginx's
//! `ngx_parse_http_time` does (RFC 1123, RFC 850, asctime).

use std::cell::Cell;
use std::time::{SystemTime, UNIX_EPOCH};

const DAYS: [&[u8; 3]; 7] = [b"Sun", b"Mon", b"Tue", b"Wed", b"Thu", b"Fri", b"Sat"];
const MONTHS: [&[u8; 3]; 12] = [
    b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov", b"Dec",
];

/// 9999-12-31T23:59:59Z: the last instant whose year has four digits.
const MAX_FIXED: i64 = 253_402_300_799;

/// Broken-down time, in whichever zone the caller converted to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tm {
    year: i64,
    /// 1..=12
    mon: u32,
    /// 1..=31
    mday: u32,
    hour: u32,
    min: u32,
    sec: u32,
    /// 0 = Sunday
    wday: u32,
    /// Seconds east of UTC.
    gmtoff: i64,
}

/// Civil date from days since 1970-01-01 (proleptic Gregorian), using the
/// 400-year era decomposition so it is exact for any `i64` day count we can
/// produce from seconds.
pub(crate) fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468; // shift epoch to 0000-03-01
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11], March-based
    let d = doy - (153 * mp + 2) / 5 + 1; // [1, 31]
    let m = if mp < 10 { mp + 3 } else { mp - 9 }; // [1, 12]
    let y = yoe + era * 400 + i64::from(m <= 2);
    // d and m are small and positive by construction.
    (y, m as u32, d as u32)
}

/// Days since 1970-01-01 for a civil date (inverse of `civil_from_days`).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn gmtime(t: i64) -> Tm {
    let days = t.div_euclid(86_400);
    let secs = t.rem_euclid(86_400);
    let (year, mon, mday) = civil_from_days(days);
    Tm {
        year,
        mon,
        mday,
        hour: (secs / 3600) as u32,
        min: (secs / 60 % 60) as u32,
        sec: (secs % 60) as u32,
        wday: (days + 4).rem_euclid(7) as u32, // 1970-01-01 was a Thursday
        gmtoff: 0,
    }
}

/// Local time via `localtime_r`; falls back to UTC if the C library cannot
/// convert (e.g. `time_t` out of its range).
fn localtime(t: i64) -> Tm {
    // time_t is narrower than i64 on some 32-bit targets.
    let Some(tt) = libc::time_t::try_from(t).ok() else {
        return gmtime(t);
    };
    // SAFETY: `tm` is plain old data, so all-zero is a valid value;
    // localtime_r only writes into the struct we pass and reads `tt`.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::localtime_r(&tt, &mut tm) };
    if r.is_null() {
        return gmtime(t);
    }
    let field = |v: libc::c_int| u32::try_from(v).unwrap_or(0);
    Tm {
        year: i64::from(tm.tm_year) + 1900,
        mon: field(tm.tm_mon) + 1,
        mday: field(tm.tm_mday),
        hour: field(tm.tm_hour),
        min: field(tm.tm_min),
        // A leap second (60) is folded into 59 as nginx's formats can't show it.
        sec: field(tm.tm_sec).min(59),
        wday: field(tm.tm_wday),
        #[allow(clippy::useless_conversion)] // c_long is i64 on LP64 only
        gmtoff: i64::from(tm.tm_gmtoff),
    }
}

/// Write `v` as exactly `width` zero-padded decimal digits (truncating on
/// the left if it is wider; callers keep values in range).
fn put_num(out: &mut [u8], v: u64, width: usize) {
    let mut v = v;
    for slot in out[..width].iter_mut().rev() {
        *slot = b'0' + (v % 10) as u8;
        v /= 10;
    }
}

fn fmt_http(tm: &Tm) -> [u8; 29] {
    let mut b = *b"Sun, 00 Jan 0000 00:00:00 GMT";
    b[0..3].copy_from_slice(DAYS[tm.wday as usize % 7]);
    put_num(&mut b[5..], u64::from(tm.mday), 2);
    b[8..11].copy_from_slice(MONTHS[(tm.mon as usize + 11) % 12]);
    put_num(&mut b[12..], tm.year.clamp(0, 9999) as u64, 4);
    put_num(&mut b[17..], u64::from(tm.hour), 2);
    put_num(&mut b[20..], u64::from(tm.min), 2);
    put_num(&mut b[23..], u64::from(tm.sec), 2);
    b
}

fn fmt_err_log(tm: &Tm) -> [u8; 19] {
    let mut b = *b"0000/00/00 00:00:00";
    put_num(&mut b[0..], tm.year.clamp(0, 9999) as u64, 4);
    put_num(&mut b[5..], u64::from(tm.mon), 2);
    put_num(&mut b[8..], u64::from(tm.mday), 2);
    put_num(&mut b[11..], u64::from(tm.hour), 2);
    put_num(&mut b[14..], u64::from(tm.min), 2);
    put_num(&mut b[17..], u64::from(tm.sec), 2);
    b
}

/// nginx's syslog time: `Nov  6 08:49:37` (the day padded with a space).
fn fmt_syslog(tm: &Tm) -> [u8; 15] {
    let mut b = *b"Jan 00 00:00:00";
    b[0..3].copy_from_slice(MONTHS[(tm.mon as usize + 11) % 12]);
    put_num(&mut b[4..], u64::from(tm.mday), 2);
    if b[4] == b'0' {
        b[4] = b' ';
    }
    put_num(&mut b[7..], u64::from(tm.hour), 2);
    put_num(&mut b[10..], u64::from(tm.min), 2);
    put_num(&mut b[13..], u64::from(tm.sec), 2);
    b
}

/// Sign and |offset| in hours and minutes, as nginx prints `gmtoff`.
fn offset_parts(gmtoff: i64) -> (u8, u64, u64) {
    let sign = if gmtoff < 0 { b'-' } else { b'+' };
    let mins = gmtoff.unsigned_abs() / 60;
    (sign, (mins / 60) % 100, mins % 60)
}

fn fmt_time_local(tm: &Tm) -> [u8; 26] {
    let mut b = *b"00/Jan/0000:00:00:00 +0000";
    put_num(&mut b[0..], u64::from(tm.mday), 2);
    b[3..6].copy_from_slice(MONTHS[(tm.mon as usize + 11) % 12]);
    put_num(&mut b[7..], tm.year.clamp(0, 9999) as u64, 4);
    put_num(&mut b[12..], u64::from(tm.hour), 2);
    put_num(&mut b[15..], u64::from(tm.min), 2);
    put_num(&mut b[18..], u64::from(tm.sec), 2);
    let (sign, h, m) = offset_parts(tm.gmtoff);
    b[21] = sign;
    put_num(&mut b[22..], h, 2);
    put_num(&mut b[24..], m, 2);
    b
}

fn fmt_iso8601(tm: &Tm) -> [u8; 25] {
    let mut b = *b"0000-00-00T00:00:00+00:00";
    put_num(&mut b[0..], tm.year.clamp(0, 9999) as u64, 4);
    put_num(&mut b[5..], u64::from(tm.mon), 2);
    put_num(&mut b[8..], u64::from(tm.mday), 2);
    put_num(&mut b[11..], u64::from(tm.hour), 2);
    put_num(&mut b[14..], u64::from(tm.min), 2);
    put_num(&mut b[17..], u64::from(tm.sec), 2);
    let (sign, h, m) = offset_parts(tm.gmtoff);
    b[19] = sign;
    put_num(&mut b[20..], h, 2);
    put_num(&mut b[23..], m, 2);
    b
}

/// Seconds since the Unix epoch (negative before 1970; floor semantics).
fn secs_of(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => {
            let d = e.duration();
            let s = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
            // -1.5 s is second -2, so that formatting rounds toward the past.
            if d.subsec_nanos() > 0 {
                -s - 1
            } else {
                -s
            }
        }
    }
}

/// Current Unix time in whole seconds.
pub fn now_secs() -> i64 {
    secs_of(SystemTime::now())
}

/// Format `t` (Unix seconds) as an HTTP date into a fixed buffer. Times
/// outside years 0..=9999 are clamped to that range.
pub fn http_date_at(t: i64) -> [u8; 29] {
    fmt_http(&gmtime(t.clamp(-62_167_219_200, MAX_FIXED)))
}

/// Format a time as an HTTP date, e.g. for `Last-Modified`. Years past 9999
/// are written in full, as nginx's `%4d` would.
pub fn format_http_date(t: SystemTime) -> String {
    let tm = gmtime(secs_of(t));
    if (0..=9999).contains(&tm.year) {
        return String::from_utf8_lossy(&fmt_http(&tm)).into_owned();
    }
    format!(
        "{}, {:02} {} {:04} {:02}:{:02}:{:02} GMT",
        String::from_utf8_lossy(DAYS[tm.wday as usize % 7]),
        tm.mday,
        String::from_utf8_lossy(MONTHS[(tm.mon as usize + 11) % 12]),
        tm.year,
        tm.hour,
        tm.min,
        tm.sec
    )
}

/// One per-second cache slot: the second it was formatted for and the bytes.
struct Slot<const N: usize>(Cell<(i64, [u8; N])>);

impl<const N: usize> Slot<N> {
    const fn new() -> Self {
        Slot(Cell::new((i64::MIN, [0; N])))
    }

    fn get(&self, now: i64, fmt: impl FnOnce(i64) -> [u8; N]) -> [u8; N] {
        let (at, bytes) = self.0.get();
        if at == now {
            return bytes;
        }
        let bytes = fmt(now);
        self.0.set((now, bytes));
        bytes
    }
}

thread_local! {
    static HTTP: Slot<29> = const { Slot::new() };
    static ERR_LOG: Slot<19> = const { Slot::new() };
    static TIME_LOCAL: Slot<26> = const { Slot::new() };
    static ISO8601: Slot<25> = const { Slot::new() };
    static SYSLOG: Slot<15> = const { Slot::new() };
    static LAST_MODIFIED: Slot<29> = const { Slot::new() };
}

/// [`http_date_at`] for a file's mtime (`Last-Modified`), keeping the last
/// one formatted per thread: a hot file is answered with the same value
/// request after request.
pub fn http_date_of(t: i64) -> [u8; 29] {
    // Clamped first, so the slot's empty marker (i64::MIN) never matches.
    let t = t.clamp(-62_167_219_200, MAX_FIXED);
    LAST_MODIFIED.with(|s| s.get(t, http_date_at))
}

/// `Date` header value for now, e.g. `Sun, 06 Nov 1994 08:49:37 GMT`;
/// formatted at most once per second per thread.
pub fn http_date() -> [u8; 29] {
    let now = now_secs();
    HTTP.with(|s| s.get(now, http_date_at))
}

/// Error-log timestamp for now, local time: `1994/11/06 08:49:37`.
pub fn err_log_time() -> [u8; 19] {
    let now = now_secs();
    ERR_LOG.with(|s| s.get(now, |t| fmt_err_log(&localtime(t))))
}

/// The time of a syslog message, local: `Nov  6 08:49:37`.
pub fn syslog_time() -> [u8; 15] {
    let now = now_secs();
    SYSLOG.with(|s| s.get(now, |t| fmt_syslog(&localtime(t))))
}

/// `$time_local` for now: `06/Nov/1994:08:49:37 +0000`.
pub fn time_local() -> [u8; 26] {
    let now = now_secs();
    TIME_LOCAL.with(|s| s.get(now, |t| fmt_time_local(&localtime(t))))
}

/// `$time_iso8601` for now: `1994-11-06T08:49:37+00:00`.
pub fn time_iso8601() -> [u8; 25] {
    let now = now_secs();
    ISO8601.with(|s| s.get(now, |t| fmt_iso8601(&localtime(t))))
}

/// Days in each month of a non-leap year; February 29 is checked apart.
const MDAYS: [u32; 12] = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];

/// Parse an HTTP date into Unix seconds. Accepts the three formats nginx's
/// `ngx_parse_http_time` accepts:
///
/// * RFC 1123: `Sun, 06 Nov 1994 08:49:37 GMT`
/// * RFC 850:  `Sunday, 06-Nov-94 08:49:37 GMT` (two-digit years below 70
///   are 20xx, others 19xx)
/// * asctime:  `Sun Nov  6 08:49:37 1994`
///
/// Like nginx it ignores the weekday's value and anything after the time
/// (or after the year for asctime), so the zone name is not checked; it
/// validates ranges of hour/minute/second and the day against the month
/// (including leap years). Unlike nginx, month names must be spelled
/// exactly (nginx looks at only some of their letters).
pub fn parse_http_date(s: &[u8]) -> Option<i64> {
    #[derive(PartialEq)]
    enum Fmt {
        Rfc1123,
        Rfc850,
        Asctime,
    }

    // A missing byte reads as 0, which fails every check below, so short
    // input is refused without any indexing panic.
    let at = |i: usize| s.get(i).copied().unwrap_or(0);
    let digit = |i: usize| -> Option<u32> {
        let c = at(i);
        c.is_ascii_digit().then(|| u32::from(c - b'0'))
    };
    let two = |i: usize| -> Option<u32> { Some(digit(i)? * 10 + digit(i + 1)?) };
    let four = |i: usize| -> Option<u32> { Some(two(i)? * 100 + two(i + 2)?) };

    // The weekday ends at ',' (RFC 1123/850) or ' ' (asctime).
    let sep = s.iter().position(|&c| c == b',' || c == b' ')?;
    let mut fmt = if s[sep] == b' ' {
        Fmt::Asctime
    } else {
        Fmt::Rfc1123
    };
    let mut p = sep + 1;
    while at(p) == b' ' {
        p += 1;
    }

    let mut day = 0;
    if fmt != Fmt::Asctime {
        day = two(p)?;
        p += 2;
        fmt = match at(p) {
            b' ' => Fmt::Rfc1123,
            b'-' => Fmt::Rfc850,
            _ => return None,
        };
        p += 1;
    }

    let mon = MONTHS
        .iter()
        .position(|m| s.get(p..p + 3) == Some(&m[..]))?;
    p += 3;
    let want = match fmt {
        Fmt::Rfc850 => b'-',
        _ => b' ',
    };
    if at(p) != want {
        return None;
    }
    p += 1;

    let mut year = 0;
    match fmt {
        Fmt::Rfc1123 => {
            year = four(p)?;
            p += 4;
        }
        Fmt::Rfc850 => {
            let y = two(p)?;
            year = if y < 70 { 2000 + y } else { 1900 + y };
            p += 2;
        }
        Fmt::Asctime => {
            // Day is " 6" or "06" or "6", after the single space above.
            if at(p) == b' ' {
                p += 1;
            }
            day = digit(p)?;
            p += 1;
            if at(p) != b' ' {
                day = day * 10 + digit(p)?;
                p += 1;
            }
        }
    }

    if at(p) != b' ' {
        return None;
    }
    p += 1;
    let hour = two(p)?;
    if at(p + 2) != b':' {
        return None;
    }
    let min = two(p + 3)?;
    if at(p + 5) != b':' {
        return None;
    }
    let sec = two(p + 6)?;
    p += 8;

    if fmt == Fmt::Asctime {
        if at(p) != b' ' {
            return None;
        }
        year = four(p + 1)?;
    }

    if hour > 23 || min > 59 || sec > 59 {
        return None;
    }
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let max_day = if mon == 1 && leap { 29 } else { MDAYS[mon] };
    // nginx accepts day 0 (it only checks the upper bound); it then means
    // the last day of the previous month, which days_from_civil reproduces.
    if day > max_day {
        return None;
    }

    let days = days_from_civil(i64::from(year), mon as u32 + 1, 1) + i64::from(day) - 1;
    Some(days * 86_400 + i64::from(hour * 3600 + min * 60 + sec))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_last_modified_matches_uncached() {
        for t in [0, 784_111_777, 784_111_777, 1, -1, i64::MIN, i64::MAX, 0] {
            assert_eq!(http_date_of(t), http_date_at(t), "t = {t}");
        }
    }
    use std::time::Duration;

    const T: i64 = 784_111_777; // Sun, 06 Nov 1994 08:49:37 GMT

    #[test]
    fn civil_roundtrip() {
        for days in (-800_000..800_000).step_by(997) {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }

    #[test]
    fn http_date_format() {
        assert_eq!(&http_date_at(T), b"Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(&http_date_at(0), b"Thu, 01 Jan 1970 00:00:00 GMT");
        assert_eq!(&http_date_at(-1), b"Wed, 31 Dec 1969 23:59:59 GMT");
        assert_eq!(&http_date_at(951_782_400), b"Tue, 29 Feb 2000 00:00:00 GMT");
        assert_eq!(&http_date_at(i64::MAX), b"Fri, 31 Dec 9999 23:59:59 GMT");
        assert_eq!(&http_date_at(i64::MIN), b"Sat, 01 Jan 0000 00:00:00 GMT");
    }

    #[test]
    fn format_system_time_matches_httpdate() {
        for t in [0u64, 1, T as u64, 951_782_400, 1_700_000_000, 4_102_444_800] {
            let st = UNIX_EPOCH + Duration::from_secs(t);
            assert_eq!(format_http_date(st), httpdate::fmt_http_date(st));
        }
        let st = UNIX_EPOCH + Duration::from_millis(T as u64 * 1000 + 999);
        assert_eq!(format_http_date(st), "Sun, 06 Nov 1994 08:49:37 GMT");
        let before = UNIX_EPOCH - Duration::from_millis(500);
        assert_eq!(format_http_date(before), "Wed, 31 Dec 1969 23:59:59 GMT");
        let far = UNIX_EPOCH + Duration::from_secs(MAX_FIXED as u64 + 1);
        assert_eq!(format_http_date(far), "Sat, 01 Jan 10000 00:00:00 GMT");
    }

    #[test]
    fn fixed_formats() {
        let tm = Tm {
            gmtoff: 0,
            ..gmtime(T)
        };
        assert_eq!(&fmt_err_log(&tm), b"1994/11/06 08:49:37");
        assert_eq!(&fmt_time_local(&tm), b"06/Nov/1994:08:49:37 +0000");
        assert_eq!(&fmt_iso8601(&tm), b"1994-11-06T08:49:37+00:00");
        assert_eq!(&fmt_syslog(&tm), b"Nov  6 08:49:37");
        assert_eq!(&fmt_syslog(&Tm { mday: 16, ..tm }), b"Nov 16 08:49:37");
        let east = Tm {
            gmtoff: 5 * 3600 + 30 * 60,
            ..tm
        };
        assert_eq!(&fmt_time_local(&east), b"06/Nov/1994:08:49:37 +0530");
        assert_eq!(&fmt_iso8601(&east), b"1994-11-06T08:49:37+05:30");
        let west = Tm {
            gmtoff: -(3 * 3600 + 30 * 60),
            ..tm
        };
        assert_eq!(&fmt_time_local(&west), b"06/Nov/1994:08:49:37 -0330");
        assert_eq!(&fmt_iso8601(&west), b"1994-11-06T08:49:37-03:30");
    }

    #[test]
    fn localtime_is_consistent() {
        // Whatever the zone, local time minus its offset is UTC.
        for t in [0, T, 1_700_000_000] {
            let l = localtime(t);
            let days = days_from_civil(l.year, l.mon, l.mday);
            let local_secs =
                days * 86_400 + i64::from(l.hour * 3600 + l.min * 60 + l.sec) - l.gmtoff;
            assert_eq!(local_secs, t);
        }
    }

    #[test]
    fn cached_now() {
        let a = http_date();
        let parsed = parse_http_date(&a).unwrap();
        assert!((parsed - now_secs()).abs() <= 1);
        // Cached value is stable within a second (allow a tick between).
        let b = http_date();
        let pb = parse_http_date(&b).unwrap();
        assert!(pb - parsed <= 1);
        let e = err_log_time();
        assert_eq!(e[4], b'/');
        assert_eq!(e[10], b' ');
        let l = time_local();
        assert_eq!(l[2], b'/');
        assert!(l[21] == b'+' || l[21] == b'-');
        let i = time_iso8601();
        assert_eq!(i[10], b'T');
        assert!(i[19] == b'+' || i[19] == b'-');
    }

    #[test]
    fn slot_reformats_only_on_new_second() {
        let slot: Slot<1> = Slot::new();
        let calls = Cell::new(0);
        let f = |t: i64| {
            calls.set(calls.get() + 1);
            [t as u8]
        };
        assert_eq!(slot.get(5, f), [5]);
        assert_eq!(slot.get(5, f), [5]);
        assert_eq!(calls.get(), 1);
        assert_eq!(slot.get(6, f), [6]);
        assert_eq!(calls.get(), 2);
    }

    #[test]
    fn parse_three_formats() {
        assert_eq!(parse_http_date(b"Sun, 06 Nov 1994 08:49:37 GMT"), Some(T));
        assert_eq!(parse_http_date(b"Sunday, 06-Nov-94 08:49:37 GMT"), Some(T));
        assert_eq!(parse_http_date(b"Sun Nov  6 08:49:37 1994"), Some(T));
        assert_eq!(parse_http_date(b"Sun Nov 06 08:49:37 1994"), Some(T));
        assert_eq!(parse_http_date(b"Sun Nov 6 08:49:37 1994"), Some(T));
        // RFC 850 two-digit year pivot at 70.
        assert_eq!(
            parse_http_date(b"Thursday, 01-Jan-70 00:00:00 GMT"),
            Some(0)
        );
        assert_eq!(
            parse_http_date(b"Saturday, 01-Jan-00 00:00:00 GMT"),
            Some(946_684_800)
        );
        assert_eq!(
            parse_http_date(b"Wednesday, 31-Dec-69 00:00:00 GMT"),
            Some(3_155_673_600)
        );
    }

    #[test]
    fn parse_leniencies_like_nginx() {
        // Weekday value and zone are not checked; trailing text is ignored.
        assert_eq!(parse_http_date(b"Xyz, 06 Nov 1994 08:49:37 GMT"), Some(T));
        assert_eq!(parse_http_date(b"Sun, 06 Nov 1994 08:49:37"), Some(T));
        assert_eq!(parse_http_date(b"Sun, 06 Nov 1994 08:49:37 UTC"), Some(T));
        assert_eq!(parse_http_date(b"Sun,   06 Nov 1994 08:49:37 GMT"), Some(T));
        assert_eq!(parse_http_date(b"Sun Nov  6 08:49:37 1994 junk"), Some(T));
        // Day 0 is the day before the 1st.
        assert_eq!(
            parse_http_date(b"Sun, 00 Nov 1994 00:00:00 GMT"),
            parse_http_date(b"Mon, 31 Oct 1994 00:00:00 GMT")
        );
        // Leap days.
        assert_eq!(
            parse_http_date(b"Tue, 29 Feb 2000 00:00:00 GMT"),
            Some(951_782_400)
        );
        assert!(parse_http_date(b"Thu, 29 Feb 2024 00:00:00 GMT").is_some());
        // Before 1970 is negative, as nginx's arithmetic yields.
        assert_eq!(parse_http_date(b"Wed, 31 Dec 1969 23:59:59 GMT"), Some(-1));
    }

    #[test]
    fn parse_roundtrip() {
        for t in (0..4_102_444_800i64).step_by(86_399 * 37 + 17) {
            assert_eq!(parse_http_date(&http_date_at(t)), Some(t));
        }
    }

    #[test]
    fn parse_errors() {
        for bad in [
            &b""[..],
            b"Sun",
            b"Sun,",
            b"Sun, 06 Nov 1994",
            b"Sun, 06 Nov 1994 08:49",
            b"Sun, 06 Nov 1994 08:49:3",
            b"Sun, 6 Nov 1994 08:49:37 GMT",
            b"Sun, 06 nov 1994 08:49:37 GMT",
            b"Sun, 06 Nox 1994 08:49:37 GMT",
            b"Sun, 06-Nov 1994 08:49:37 GMT",
            b"Sun, 06 Nov-1994 08:49:37 GMT",
            b"Sun, 06 Nov 94 08:49:37 GMT",
            b"Sunday, 06-Nov-1994 08:49:37 GMT",
            b"Sun, 06 Nov 1994 24:00:00 GMT",
            b"Sun, 06 Nov 1994 23:60:00 GMT",
            b"Sun, 06 Nov 1994 23:59:60 GMT",
            b"Sun, 06 Nov 1994 08.49.37 GMT",
            b"Sun, 06 Nov 1994  08:49:37 GMT",
            b"Sun, 31 Nov 1994 08:49:37 GMT",
            b"Sun, 32 Jan 1994 08:49:37 GMT",
            b"Mon, 29 Feb 1900 00:00:00 GMT",
            b"Sat, 29 Feb 2023 00:00:00 GMT",
            b"Sun Nov  6 08:49:37",
            b"Sun Nov  6 08:49:37 94",
            b"Sun Nov 6x 08:49:37 1994",
            b"Sun Nov   6 08:49:37 1994",
            b"Sun Nov  6 08:49:37  1994",
            b"1994-11-06T08:49:37Z",
            b"784111777",
        ] {
            assert_eq!(
                parse_http_date(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn parse_never_panics_on_prefixes() {
        let full = b"Sunday, 06-Nov-94 08:49:37 GMT Sun Nov  6 08:49:37 1994";
        for i in 0..=full.len() {
            let _ = parse_http_date(&full[..i]);
            let _ = parse_http_date(&full[i..]);
        }
        for b in 0..=255u8 {
            let _ = parse_http_date(&[b; 40]);
        }
    }
}
