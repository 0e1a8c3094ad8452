//! Go-style durations (`1m30s`, `500ms`, `15s`), the syntax Consul uses everywhere.

use std::time::Duration;

/// Parses a Go duration such as `1h2m3.5s`, `500ms` or `0`. Negative durations are rejected.
pub fn parse(text: &str) -> Result<Duration, String> {
    let invalid = || format!("time: invalid duration \"{text}\"");
    let s = text.strip_prefix('+').unwrap_or(text);
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() || s.starts_with('-') {
        return Err(invalid());
    }
    let mut rest = s;
    let mut total_ns: f64 = 0.0;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("time: missing unit in duration \"{text}\""))?;
        if num_len == 0 {
            return Err(invalid());
        }
        let number: f64 = rest[..num_len].parse().map_err(|_| invalid())?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit_ns = match &rest[..unit_len] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            "" => return Err(format!("time: missing unit in duration \"{text}\"")),
            unit => {
                return Err(format!(
                    "time: unknown unit \"{unit}\" in duration \"{text}\""
                ))
            }
        };
        rest = &rest[unit_len..];
        total_ns += number * unit_ns;
    }
    if !total_ns.is_finite() || total_ns > u64::MAX as f64 {
        return Err(invalid());
    }
    Ok(Duration::from_nanos(total_ns.round() as u64))
}

/// Formats like Go's `time.Duration.String()`: `10s`, `24h0m0s`, `1.5s`, `500ms`.
pub fn format(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns == 0 {
        return "0s".into();
    }
    if ns < 1_000 {
        return format!("{ns}ns");
    }
    if ns < 1_000_000 {
        return format!("{}µs", trim_fraction(ns, 1_000));
    }
    if ns < 1_000_000_000 {
        return format!("{}ms", trim_fraction(ns, 1_000_000));
    }
    let total_secs = ns / 1_000_000_000;
    let frac_ns = ns % 1_000_000_000;
    let (h, m, s) = (total_secs / 3600, (total_secs / 60) % 60, total_secs % 60);
    let secs = trim_fraction(s * 1_000_000_000 + frac_ns, 1_000_000_000);
    if h > 0 {
        format!("{h}h{m}m{secs}s")
    } else if m > 0 {
        format!("{m}m{secs}s")
    } else {
        format!("{secs}s")
    }
}

fn trim_fraction(value: u128, unit: u128) -> String {
    let whole = value / unit;
    let frac = value % unit;
    if frac == 0 {
        return whole.to_string();
    }
    let width = unit.to_string().len() - 1;
    let digits = format!("{frac:0width$}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations() {
        assert_eq!(parse("15s").unwrap(), Duration::from_secs(15));
        assert_eq!(parse("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse("0").unwrap(), Duration::ZERO);
        assert_eq!(parse("2h").unwrap(), Duration::from_secs(7200));
        assert_eq!(parse("abc").unwrap_err(), "time: invalid duration \"abc\"");
        assert!(parse("10").is_err());
        assert!(parse("-1s").is_err());
        assert!(parse("").is_err());
        assert!(parse("5x").is_err());
    }

    #[test]
    fn formats_like_go() {
        assert_eq!(format(Duration::from_secs(10)), "10s");
        assert_eq!(format(Duration::from_secs(86400)), "24h0m0s");
        assert_eq!(format(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format(Duration::from_millis(500)), "500ms");
        assert_eq!(format(Duration::from_secs(90)), "1m30s");
        assert_eq!(format(Duration::ZERO), "0s");
    }
}
