//! Go's duration syntax (`time.ParseDuration`), as the Prometheus ecosystem writes durations in
//! flags (`--web.read-timeout`) and files (`rate_limit.interval` in exporter-toolkit's web
//! config): a sequence of decimal numbers, each with an optional fraction and a unit, such as
//! `300ms`, `1.5s`, `1h30m` or `500us`. Units: `ns`, `us` (`µs`, `μs`), `ms`, `s`, `m`, `h`.
//! A bare `0` is zero; any other number needs a unit. Negative durations are refused (nothing
//! here can wait a negative time), and so are durations longer than Go's `time.Duration` holds
//! ([`MAX`], about 292 years), as Go refuses them.

use std::time::Duration;

/// The longest Go duration: `time.Duration` is an `int64` count of nanoseconds
/// (`2562047h47m16.854775807s`, about 292 years).
pub const MAX: Duration = Duration::new(9_223_372_036, 854_775_807);

/// Parses a Go duration. The error says what is wrong with `s`, for the caller to prefix with
/// the flag or key it came from.
///
/// # Errors
/// A message naming `s` and what was expected.
pub fn parse(s: &str) -> Result<Duration, String> {
    let text = s.trim();
    let expected = || format!("{text:?} is not a duration like 30s, 1m30s, 1.5s or 500ms");
    let mut rest = text.strip_prefix('+').unwrap_or(text);
    if rest.starts_with('-') {
        return Err(format!("{text:?}: a duration cannot be negative"));
    }
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(expected());
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let int_len = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (int, after) = rest.split_at(int_len);
        let (frac, after) = match after.strip_prefix('.') {
            Some(a) => {
                let n = a.find(|c: char| !c.is_ascii_digit()).unwrap_or(a.len());
                a.split_at(n)
            }
            None => ("", after),
        };
        if int.is_empty() && frac.is_empty() {
            return Err(expected());
        }
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let nanos: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err(format!("{text:?} has no unit (use ns, us, ms, s, m or h)")),
            other => {
                return Err(format!(
                    "{text:?}: unknown unit {other:?} (use ns, us, ms, s, m or h)"
                ))
            }
        };
        let too_long = || format!("{text:?} is too long a duration");
        let whole: u128 = if int.is_empty() {
            0
        } else {
            int.parse().map_err(|_| too_long())?
        };
        let mut part = whole.checked_mul(nanos).ok_or_else(too_long)?;
        // The fraction, digit by digit, exact to the nanosecond (extra digits are dropped, as
        // Go does).
        let mut scale = nanos;
        for d in frac.bytes() {
            scale /= 10;
            if scale == 0 {
                break;
            }
            part += u128::from(d - b'0') * scale;
        }
        total = total.checked_add(part).ok_or_else(too_long)?;
        rest = after;
    }
    if total > MAX.as_nanos() {
        return Err(format!(
            "{text:?} is too long a duration (at most 2562047h47m16.854775807s, as in Go)"
        ));
    }
    let secs = u64::try_from(total / 1_000_000_000)
        .map_err(|_| format!("{text:?} is too long a duration"))?;
    // Lossless: the remainder is below 10^9.
    Ok(Duration::new(secs, (total % 1_000_000_000) as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_parse_as_go_parses_them() {
        for (s, want) in [
            ("0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("100ms", Duration::from_millis(100)),
            ("1.5s", Duration::from_millis(1500)),
            ("1h30m", Duration::from_secs(5400)),
            ("500us", Duration::from_micros(500)),
            ("500µs", Duration::from_micros(500)),
            ("500μs", Duration::from_micros(500)),
            ("250ns", Duration::from_nanos(250)),
            ("2m3.25s", Duration::from_millis(123_250)),
            (".5s", Duration::from_millis(500)),
            ("1.s", Duration::from_secs(1)),
            ("+30s", Duration::from_secs(30)),
            (" 5m ", Duration::from_secs(300)),
            ("1.0000000001s", Duration::from_secs(1)),
            ("2562047h47m16.854775807s", MAX),
            ("9223372036854775807ns", MAX),
        ] {
            assert_eq!(parse(s), Ok(want), "{s}");
        }
    }

    #[test]
    fn malformed_durations_say_what_is_wrong() {
        for (s, says) in [
            ("", "is not a duration"),
            ("s", "is not a duration"),
            (".s", "is not a duration"),
            ("10", "has no unit"),
            ("1h30", "has no unit"),
            ("5 m", "unknown unit"),
            ("3d", "unknown unit \"d\""),
            ("fast", "is not a duration"),
            ("-1s", "cannot be negative"),
            ("99999999999999999999999h", "too long"),
            // Past Go's int64 nanoseconds, as Go refuses them (it overflowed `Instant` later).
            (
                "5124095576030431h",
                "too long a duration (at most 2562047h47m16.854775807s",
            ),
            ("2562047h47m16.854775808s", "too long"),
            ("9223372036854775808ns", "too long"),
            ("2562048h", "too long"),
        ] {
            let e = parse(s).unwrap_err();
            assert!(e.contains(says), "{s:?}: {e}");
        }
    }
}
