//! Durations in Go's syntax (`1m30s`, `500ms`, `15s`), the syntax Consul uses everywhere.
//! Thin wrappers over the Go-exact parser and formatter in `gostd`.

use std::time::Duration;

use crate::gostd;

/// Parses a Go duration such as `1h2m3.5s`, `500ms` or `0`. Negative durations are rejected.
pub fn parse(text: &str) -> Result<Duration, String> {
    let ns = gostd::parse_duration(text)?;
    u64::try_from(ns)
        .map(Duration::from_nanos)
        .map_err(|_| format!("negative duration {text:?}"))
}

/// Formats like Go's `time.Duration.String()`: `10s`, `24h0m0s`, `1.5s`, `500ms`.
pub fn format(d: Duration) -> String {
    gostd::format_duration(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// As `format`, to the nearest millisecond: for messages, where a computed
/// 3.333333333s says nothing 3.333s does not.
pub fn format_ms(d: Duration) -> String {
    let ms = (d.as_nanos() + 500_000) / 1_000_000;
    format(Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_to_the_nearest_millisecond() {
        assert_eq!(format_ms(Duration::from_secs(10) / 3), "3.333s");
        assert_eq!(format_ms(Duration::from_secs(10) / 3 * 3 / 2), "5s");
        assert_eq!(format_ms(Duration::from_micros(750_400)), "750ms");
        assert_eq!(format_ms(Duration::ZERO), "0s");
    }

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
        assert!(parse("-1s").unwrap_err().contains("negative"));
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
