//! Small re-implementations of the Go standard library behaviour that Consul's
//! HTTP API leaks into its answers: `time.ParseDuration` / `Duration.String()`,
//! `strconv` quoting and `ParseUint` errors, `net/url` query parsing and
//! escaping, `path.Clean`, `http.DetectContentType`, go-memdb's UUID index
//! parsing, `base64.StdEncoding` decoding, and float64 conversion and printing.

const NS: u64 = 1;
const US: u64 = 1_000;
const MS: u64 = 1_000_000;
const SEC: u64 = 1_000_000_000;
const MIN: u64 = 60 * SEC;
const HOUR: u64 = 60 * MIN;

/// Go's `time.ParseDuration`, returning nanoseconds or Go's error text.
pub fn parse_duration(orig: &str) -> Result<i64, String> {
    let invalid = || format!("time: invalid duration {}", time_quote(orig));
    let mut s = orig.as_bytes();
    let mut neg = false;
    if let Some(&c) = s.first() {
        if c == b'-' || c == b'+' {
            neg = c == b'-';
            s = &s[1..];
        }
    }
    if s == b"0" {
        return Ok(0);
    }
    if s.is_empty() {
        return Err(invalid());
    }
    let mut d: u64 = 0;
    while !s.is_empty() {
        if !(s[0] == b'.' || s[0].is_ascii_digit()) {
            return Err(invalid());
        }
        // leading int
        let before = s.len();
        let mut v: u64 = 0;
        let mut i = 0;
        while i < s.len() && s[i].is_ascii_digit() {
            if v > (1u64 << 63) / 10 {
                return Err(invalid());
            }
            v = v * 10 + u64::from(s[i] - b'0');
            if v > 1u64 << 63 {
                return Err(invalid());
            }
            i += 1;
        }
        s = &s[i..];
        let pre = before != s.len();
        // fraction
        let mut f: u64 = 0;
        let mut scale: f64 = 1.0;
        let mut post = false;
        if !s.is_empty() && s[0] == b'.' {
            s = &s[1..];
            let before = s.len();
            let mut overflow = false;
            let mut i = 0;
            while i < s.len() && s[i].is_ascii_digit() {
                if !overflow {
                    if f > ((1u64 << 63) - 1) / 10 {
                        overflow = true;
                    } else {
                        let y = f * 10 + u64::from(s[i] - b'0');
                        if y > 1u64 << 63 {
                            overflow = true;
                        } else {
                            f = y;
                            scale *= 10.0;
                        }
                    }
                }
                i += 1;
            }
            s = &s[i..];
            post = before != s.len();
        }
        if !pre && !post {
            return Err(invalid());
        }
        // unit
        let mut i = 0;
        while i < s.len() && !(s[i] == b'.' || s[i].is_ascii_digit()) {
            i += 1;
        }
        if i == 0 {
            return Err(format!(
                "time: missing unit in duration {}",
                time_quote(orig)
            ));
        }
        let u = &s[..i];
        s = &s[i..];
        let unit = match u {
            b"ns" => NS,
            b"us" | b"\xc2\xb5s" | b"\xce\xbcs" => US,
            b"ms" => MS,
            b"s" => SEC,
            b"m" => MIN,
            b"h" => HOUR,
            _ => {
                return Err(format!(
                    "time: unknown unit {} in duration {}",
                    time_quote(&String::from_utf8_lossy(u)),
                    time_quote(orig)
                ))
            }
        };
        if v > (1u64 << 63) / unit {
            return Err(invalid());
        }
        v *= unit;
        if f > 0 {
            v += (f as f64 * (unit as f64 / scale)) as u64;
            if v > 1u64 << 63 {
                return Err(invalid());
            }
        }
        d += v;
        if d > 1u64 << 63 {
            return Err(invalid());
        }
    }
    if neg {
        return Ok((d as i64).wrapping_neg());
    }
    if d > (1u64 << 63) - 1 {
        return Err(invalid());
    }
    Ok(d as i64)
}

/// Go's `time.Duration.String()`.
pub fn format_duration(d: i64) -> String {
    let neg = d < 0;
    let mut u = d.unsigned_abs();
    let mut out = String::new();
    if u < SEC {
        if u == 0 {
            return "0s".to_string();
        }
        let (prec, unit) = if u < US {
            (0, "ns")
        } else if u < MS {
            (3, "\u{b5}s")
        } else {
            (6, "ms")
        };
        let (frac, int) = fmt_frac(u, prec);
        out.push_str(&int.to_string());
        out.push_str(&frac);
        out.push_str(unit);
    } else {
        let (frac, secs) = fmt_frac(u, 9);
        u = secs;
        let s = u % 60;
        u /= 60;
        let mut tail = format!("{s}{frac}s");
        if u > 0 {
            let m = u % 60;
            u /= 60;
            tail = format!("{m}m{tail}");
            if u > 0 {
                tail = format!("{u}h{tail}");
            }
        }
        out.push_str(&tail);
    }
    if neg {
        out.insert(0, '-');
    }
    out
}

/// Formats the fraction of v/10**prec (".123", trailing zeros dropped,
/// nothing at all when the fraction is zero) and returns it with v/10**prec.
fn fmt_frac(mut v: u64, prec: u32) -> (String, u64) {
    let mut digits = Vec::new();
    let mut print = false;
    for _ in 0..prec {
        let digit = v % 10;
        print = print || digit != 0;
        if print {
            digits.push(b'0' + digit as u8);
        }
        v /= 10;
    }
    if print {
        digits.push(b'.');
    }
    digits.reverse();
    (String::from_utf8(digits).unwrap_or_default(), v)
}

/// The quoting used by Go's `time` package in its error texts.
pub fn time_quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        if (c as u32) >= 0x80 || (c as u32) < 0x20 {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("\\x{b:02x}"));
            }
        } else {
            if c == '"' || c == '\\' {
                out.push('\\');
            }
            out.push(c);
        }
    }
    out.push('"');
    out
}

/// An approximation of Go's `unicode.IsPrint`.
pub fn is_print(c: char) -> bool {
    if c == ' ' {
        return true;
    }
    if c.is_control() || c.is_whitespace() {
        return false;
    }
    !matches!(c as u32,
        0xad | 0x600..=0x605 | 0x61c | 0x6dd | 0x70f | 0x180e | 0x200b..=0x200f
        | 0x2028..=0x202e | 0x2060..=0x206f | 0xfeff | 0xfff9..=0xfffb
        | 0xd800..=0xdfff | 0xe000..=0xf8ff | 0xf0000..=0x10ffff)
}

/// Go's `strconv.Quote`.
pub fn strconv_quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        push_quoted_rune(&mut out, c, '"');
    }
    out.push('"');
    out
}

fn push_quoted_rune(out: &mut String, c: char, quote: char) {
    if c == quote || c == '\\' {
        out.push('\\');
        out.push(c);
        return;
    }
    if is_print(c) {
        out.push(c);
        return;
    }
    match c {
        '\u{7}' => out.push_str("\\a"),
        '\u{8}' => out.push_str("\\b"),
        '\u{c}' => out.push_str("\\f"),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        '\u{b}' => out.push_str("\\v"),
        _ => {
            let n = c as u32;
            if n < 0x20 || n == 0x7f {
                out.push_str(&format!("\\x{n:02x}"));
            } else if n < 0x10000 {
                out.push_str(&format!("\\u{n:04x}"));
            } else {
                out.push_str(&format!("\\U{n:08x}"));
            }
        }
    }
}

/// Go's `encoding/json` `quoteChar` for a single input byte.
pub fn json_quote_char(b: u8) -> String {
    match b {
        b'\'' => "'\\''".to_string(),
        b'"' => "'\"'".to_string(),
        _ => {
            let mut out = String::from("'");
            push_quoted_rune(&mut out, char::from(b), '"');
            out.push('\'');
            out
        }
    }
}

/// Go's `strconv.ParseUint(s, 10, 64)`, with Go's error text.
pub fn parse_uint(s: &str) -> Result<u64, String> {
    let syntax = || {
        format!(
            "strconv.ParseUint: parsing {}: invalid syntax",
            strconv_quote(s)
        )
    };
    if s.is_empty() {
        return Err(syntax());
    }
    let mut n: u64 = 0;
    for b in s.bytes() {
        if !b.is_ascii_digit() {
            return Err(syntax());
        }
        let d = u64::from(b - b'0');
        match n.checked_mul(10).and_then(|m| m.checked_add(d)) {
            Some(v) => n = v,
            None => {
                return Err(format!(
                    "strconv.ParseUint: parsing {}: value out of range",
                    strconv_quote(s)
                ))
            }
        }
    }
    Ok(n)
}

fn unhex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Percent-decoding as Go's `url.unescape`; `plus_is_space` for query
/// components. `None` on an invalid escape.
pub fn unescape(s: &str, plus_is_space: bool) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hi = unhex(*b.get(i + 1)?)?;
                let lo = unhex(*b.get(i + 2)?)?;
                out.push(hi << 4 | lo);
                i += 3;
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    Some(out)
}

/// Go's `url.QueryEscape`.
pub fn query_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else if b == b' ' {
            out.push('+');
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Go's path escaping (`url.URL.EscapedPath` for a fresh path).
pub fn path_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        if b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'-' | b'_'
                    | b'.'
                    | b'~'
                    | b'$'
                    | b'&'
                    | b'+'
                    | b','
                    | b'/'
                    | b':'
                    | b';'
                    | b'='
                    | b'@'
            )
        {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A parsed query string, keeping Go's `url.Values` semantics.
#[derive(Debug, Default, Clone)]
pub struct Query {
    pairs: Vec<(String, String)>,
}

impl Query {
    /// Go 1.10's `url.ParseQuery`: pairs split on `&` and `;`; pairs with a bad
    /// escape are skipped and reported by the returned flag.
    pub fn parse(raw: &str) -> (Query, bool) {
        let mut pairs = Vec::new();
        let mut bad = false;
        for piece in raw.split(['&', ';']) {
            if piece.is_empty() {
                continue;
            }
            let (k, v) = match piece.find('=') {
                Some(i) => (&piece[..i], &piece[i + 1..]),
                None => (piece, ""),
            };
            match (unescape(k, true), unescape(v, true)) {
                (Some(k), Some(v)) => pairs.push((
                    String::from_utf8_lossy(&k).into_owned(),
                    String::from_utf8_lossy(&v).into_owned(),
                )),
                _ => bad = true,
            }
        }
        (Query { pairs }, bad)
    }

    pub fn has(&self, key: &str) -> bool {
        self.pairs.iter().any(|(k, _)| k == key)
    }

    /// First value, or "" (Go's `Values.Get`).
    pub fn get(&self, key: &str) -> &str {
        self.pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .unwrap_or("")
    }

    /// Go's `url.Values.Encode`: sorted by key, values in order.
    pub fn encode(&self) -> String {
        let mut keys: Vec<&str> = self.pairs.iter().map(|(k, _)| k.as_str()).collect();
        keys.sort_unstable();
        keys.dedup();
        let mut out = String::new();
        for k in keys {
            let ke = query_escape(k);
            for (_, v) in self.pairs.iter().filter(|(pk, _)| pk == k) {
                if !out.is_empty() {
                    out.push('&');
                }
                out.push_str(&ke);
                out.push('=');
                out.push_str(&query_escape(v));
            }
        }
        out
    }
}

/// Go's `path.Clean`.
pub fn path_clean(p: &str) -> String {
    if p.is_empty() {
        return ".".to_string();
    }
    let rooted = p.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for seg in p.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                if matches!(parts.last(), Some(&l) if l != "..") {
                    parts.pop();
                } else if !rooted {
                    parts.push("..");
                }
            }
            s => parts.push(s),
        }
    }
    let joined = parts.join("/");
    if rooted {
        format!("/{joined}")
    } else if joined.is_empty() {
        ".".to_string()
    } else {
        joined
    }
}

/// net/http's `cleanPath` (ServeMux).
pub fn clean_request_path(p: &str) -> String {
    if p.is_empty() {
        return "/".to_string();
    }
    let p = if p.starts_with('/') {
        p.to_string()
    } else {
        format!("/{p}")
    };
    let mut np = path_clean(&p);
    if p.ends_with('/') && np != "/" {
        np.push('/');
    }
    np
}

/// go-memdb's UUID index parsing (as Consul's session lookups see it). On
/// success returns the canonical lowercase form when the bytes are 16 long,
/// `None` when the ID is well-formed for the index but can match nothing.
pub fn uuid_index_parse(s: &str) -> Result<Option<String>, String> {
    if s.len() != 36 {
        return Err("UUID must be 36 characters".to_string());
    }
    let hyphens = s.bytes().filter(|&b| b == b'-').count();
    if hyphens > 4 {
        return Err(format!(
            "UUID should have maximum of 4 \"-\"; got {hyphens}"
        ));
    }
    let sanitized: Vec<u8> = s.bytes().filter(|&b| b != b'-').collect();
    if sanitized.len() % 2 != 0 {
        return Err("Input (without hyphens) must be even length".to_string());
    }
    let mut bytes = Vec::with_capacity(sanitized.len() / 2);
    for pair in sanitized.chunks(2) {
        let mut v = 0u8;
        for &b in pair {
            match unhex(b) {
                Some(h) => v = v << 4 | h,
                None => {
                    let c = char::from(b);
                    let shown = if is_print(c) {
                        format!("U+{:04X} '{}'", b, c)
                    } else {
                        format!("U+{b:04X}")
                    };
                    return Err(format!("Invalid UUID: encoding/hex: invalid byte: {shown}"));
                }
            }
        }
        bytes.push(v);
    }
    if bytes.len() != 16 {
        return Ok(None);
    }
    Ok(Some(format_uuid(&bytes)))
}

pub fn format_uuid(b: &[u8]) -> String {
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// A faithful subset of Go's `http.DetectContentType`.
pub fn detect_content_type(data: &[u8]) -> &'static str {
    let data = &data[..data.len().min(512)];
    let ws = |b: u8| matches!(b, b'\t' | b'\n' | b'\x0c' | b'\r' | b' ');
    let first_non_ws = data.iter().position(|&b| !ws(b)).unwrap_or(data.len());
    let trimmed = &data[first_non_ws..];
    const HTML: [&[u8]; 17] = [
        b"<!DOCTYPE HTML",
        b"<HTML",
        b"<HEAD",
        b"<SCRIPT",
        b"<IFRAME",
        b"<H1",
        b"<DIV",
        b"<FONT",
        b"<TABLE",
        b"<A",
        b"<STYLE",
        b"<TITLE",
        b"<B",
        b"<BODY",
        b"<BR",
        b"<P",
        b"<!--",
    ];
    for sig in HTML {
        if trimmed.len() > sig.len() {
            let ok = sig.iter().zip(trimmed).all(|(&s, &d)| {
                if s.is_ascii_uppercase() {
                    d & 0xDF == s
                } else {
                    d == s
                }
            });
            if ok && matches!(trimmed[sig.len()], b' ' | b'>') {
                return "text/html; charset=utf-8";
            }
        }
    }
    if trimmed.starts_with(b"<?xml") {
        return "text/xml; charset=utf-8";
    }
    let exact: [(&[u8], &'static str); 17] = [
        (b"%PDF-", "application/pdf"),
        (b"%!PS-Adobe-", "application/postscript"),
        (b"\xFE\xFF", "text/plain; charset=utf-16be"),
        (b"\xFF\xFE", "text/plain; charset=utf-16le"),
        (b"\xEF\xBB\xBF", "text/plain; charset=utf-8"),
        (b"GIF87a", "image/gif"),
        (b"GIF89a", "image/gif"),
        (b"\x89PNG\x0D\x0A\x1A\x0A", "image/png"),
        (b"\xFF\xD8\xFF", "image/jpeg"),
        (b"BM", "image/bmp"),
        (b"\x00\x00\x01\x00", "image/x-icon"),
        (b"\x00\x00\x02\x00", "image/x-icon"),
        (b"OggS\x00", "application/ogg"),
        (b"\x1A\x45\xDF\xA3", "video/webm"),
        (b"\x1F\x8B\x08", "application/x-gzip"),
        (b"PK\x03\x04", "application/zip"),
        (b"Rar!\x1A\x07\x00", "application/x-rar-compressed"),
    ];
    for (sig, ct) in exact {
        if data.starts_with(sig) {
            return ct;
        }
    }
    if data.len() >= 12 && &data[0..4] == b"RIFF" {
        match &data[8..12] {
            b"WEBP" if data.len() >= 14 && &data[12..14] == b"VP" => return "image/webp",
            b"WAVE" => return "audio/wave",
            b"AVI " => return "video/avi",
            _ => {}
        }
    }
    if data.starts_with(b"ID3") {
        return "audio/mpeg";
    }
    let binary = |b: u8| matches!(b, 0x00..=0x08 | 0x0B | 0x0E..=0x1A | 0x1C..=0x1F);
    if !data.iter().any(|&b| binary(b)) {
        return "text/plain; charset=utf-8";
    }
    "application/octet-stream"
}

/// Go's `uint64(f)` for a float64 on amd64 (what Consul's agent binaries run): an
/// exact truncation below 2^64, and 2^63 at or above it (observed on Consul 1.0.8:
/// Flags 1e30 is stored as 9223372036854775808).
pub fn float64_to_uint64(f: f64) -> u64 {
    const TWO63: f64 = 9_223_372_036_854_775_808.0;
    // CVTTSD2SQ: out of range gives the "integer indefinite" i64::MIN.
    let cvtt = |x: f64| {
        if x.is_nan() || !(-TWO63..TWO63).contains(&x) {
            i64::MIN
        } else {
            x as i64
        }
    };
    if f < TWO63 {
        cvtt(f) as u64
    } else {
        (cvtt(f - TWO63) as u64) | (1 << 63)
    }
}

/// `fmt.Sprint(f)` (`%v`) of a float64: the shortest digits, with an exponent
/// when it is below -4 or at least 6 (`1e+06`, `123456.5`, `1e-05`).
pub fn format_float_v(f: f64) -> String {
    if f.is_nan() {
        return "NaN".to_string();
    }
    if f.is_infinite() {
        return if f > 0.0 { "+Inf" } else { "-Inf" }.to_string();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0" } else { "0" }.to_string();
    }
    let e = format!("{f:e}");
    let (mant, exp) = e.split_once('e').unwrap_or((&e, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mant}e{sign}{:02}", exp.abs())
    } else {
        format!("{f}")
    }
}

/// Go's `base64.StdEncoding.DecodeString`: padding required, `\r` and `\n`
/// skipped, unused trailing bits ignored, and Go's `CorruptInputError` text.
pub fn base64_std_decode(src: &str) -> Result<Vec<u8>, String> {
    let src = src.as_bytes();
    let err = |at: usize| Err(format!("illegal base64 data at input byte {at}"));
    let sextet = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let newline = |c: u8| c == b'\n' || c == b'\r';
    let mut out = Vec::with_capacity(src.len() / 4 * 3);
    let mut si = 0;
    loop {
        // One quantum (Go's decodeQuantum).
        let mut dbuf = [0u8; 4];
        let mut dlen = 4;
        let mut j = 0;
        let mut trailing = None;
        while j < 4 {
            if si == src.len() {
                if j == 0 {
                    return Ok(out);
                }
                return err(si - j);
            }
            let c = src[si];
            si += 1;
            if let Some(v) = sextet(c) {
                dbuf[j] = v;
                j += 1;
                continue;
            }
            if newline(c) {
                continue;
            }
            if c != b'=' || j < 2 {
                return err(si - 1);
            }
            if j == 2 {
                // "==" expected; the first is consumed.
                while si < src.len() && newline(src[si]) {
                    si += 1;
                }
                if si == src.len() {
                    return err(src.len());
                }
                if src[si] != b'=' {
                    return err(si - 1);
                }
                si += 1;
            }
            while si < src.len() && newline(src[si]) {
                si += 1;
            }
            if si < src.len() {
                trailing = Some(si);
            }
            dlen = j;
            break;
        }
        let val = u32::from(dbuf[0]) << 18
            | u32::from(dbuf[1]) << 12
            | u32::from(dbuf[2]) << 6
            | u32::from(dbuf[3]);
        out.extend_from_slice(&[(val >> 16) as u8, (val >> 8) as u8, val as u8][..dlen - 1]);
        if let Some(at) = trailing {
            return err(at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float64_to_uint64_like_go_on_amd64() {
        assert_eq!(float64_to_uint64(1.9), 1);
        assert_eq!(float64_to_uint64(-0.0), 0);
        assert_eq!(
            float64_to_uint64(3_304_740_253_564_472_344u64 as f64),
            3_304_740_253_564_472_320
        );
        assert_eq!(
            float64_to_uint64(16_210_313_421_097_356_768u64 as f64),
            16_210_313_421_097_357_312
        );
        assert_eq!(float64_to_uint64(u64::MAX as f64), 1 << 63);
        assert_eq!(float64_to_uint64(1e30), 1 << 63);
    }

    #[test]
    fn floats_print_like_fmt_v() {
        let cases = [
            (1.0, "1"),
            (2.5, "2.5"),
            (123456.0, "123456"),
            (123456.5, "123456.5"),
            (1e6, "1e+06"),
            (1e21, "1e+21"),
            (1e100, "1e+100"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (-2.5e-7, "-2.5e-07"),
            (12345678901234567890.0, "1.2345678901234567e+19"),
            (-0.0, "-0"),
        ];
        for (f, want) in cases {
            assert_eq!(format_float_v(f), want, "{f}");
        }
    }

    #[test]
    fn base64_decodes_like_go() {
        // Observed on Consul 1.0.8 (a txn op's Value).
        let ok = [
            ("eA==", "x"),
            ("eB==", "x"),
            ("eA\r\n==", "x"),
            ("eA=\n=", "x"),
            ("eA==\n", "x"),
            ("Zm9vYmFy", "foobar"),
            ("", ""),
        ];
        for (s, want) in ok {
            assert_eq!(base64_std_decode(s), Ok(want.as_bytes().to_vec()), "{s:?}");
        }
        let bad = [
            ("eA", 0),
            ("eA=", 3),
            ("e", 0),
            ("eA==x", 4),
            ("  eA==", 0),
            ("Zm9v YmFy", 4),
            ("Zm9vYmFy=", 8),
            ("Zm9vYmE", 4),
            ("Zm9vY", 4),
            ("=", 0),
            ("==", 0),
            ("Zg=a", 2),
            ("Zm9=v", 4),
            ("%%%", 0),
        ];
        for (s, at) in bad {
            assert_eq!(
                base64_std_decode(s),
                Err(format!("illegal base64 data at input byte {at}")),
                "{s:?}"
            );
        }
    }

    #[test]
    fn durations_parse_like_go() {
        assert_eq!(parse_duration("1h2m3.5s"), Ok(3_723_500_000_000));
        assert_eq!(parse_duration("500ms"), Ok(500_000_000));
        assert_eq!(parse_duration("1us"), Ok(1_000));
        assert_eq!(parse_duration("1\u{b5}s"), Ok(1_000));
        assert_eq!(parse_duration("1\u{3bc}s"), Ok(1_000));
        assert_eq!(parse_duration("-1.5h"), Ok(-5_400_000_000_000));
        assert_eq!(parse_duration("0"), Ok(0));
        assert_eq!(parse_duration("+0"), Ok(0));
        assert_eq!(parse_duration(".5s"), Ok(500_000_000));
        assert_eq!(parse_duration("1.s"), Ok(1_000_000_000));
        assert_eq!(parse_duration("10s"), Ok(10_000_000_000));
        assert_eq!(parse_duration("2562047h47m16.854775807s"), Ok(i64::MAX));
        assert_eq!(
            parse_duration("abc"),
            Err("time: invalid duration \"abc\"".to_string())
        );
        assert_eq!(
            parse_duration("5"),
            Err("time: missing unit in duration \"5\"".to_string())
        );
        assert_eq!(
            parse_duration("5x"),
            Err("time: unknown unit \"x\" in duration \"5x\"".to_string())
        );
        assert_eq!(
            parse_duration(""),
            Err("time: invalid duration \"\"".to_string())
        );
        assert_eq!(
            parse_duration(".s"),
            Err("time: invalid duration \".s\"".to_string())
        );
        assert!(parse_duration("9223372036854775808ns").is_err());
        assert_eq!(parse_duration("-9223372036854775808ns"), Ok(i64::MIN));
        assert_eq!(
            parse_duration("1\u{e9}"),
            Err("time: unknown unit \"\\xc3\\xa9\" in duration \"1\\xc3\\xa9\"".to_string())
        );
    }

    #[test]
    fn durations_format_like_go() {
        assert_eq!(format_duration(0), "0s");
        assert_eq!(format_duration(1), "1ns");
        assert_eq!(format_duration(1_100), "1.1\u{b5}s");
        assert_eq!(format_duration(2_200_000), "2.2ms");
        assert_eq!(format_duration(10_000_000_000), "10s");
        assert_eq!(format_duration(86_400_000_000_000), "24h0m0s");
        assert_eq!(format_duration(3_723_500_000_000), "1h2m3.5s");
        assert_eq!(format_duration(-1_500_000_000), "-1.5s");
        assert_eq!(format_duration(60_000_000_000), "1m0s");
        assert_eq!(format_duration(i64::MAX), "2562047h47m16.854775807s");
        assert_eq!(format_duration(i64::MIN), "-2562047h47m16.854775808s");
        for s in ["1h2m3.5s", "500ms", "1s", "24h0m0s", "1.5\u{b5}s", "7ns"] {
            assert_eq!(format_duration(parse_duration(s).unwrap()), s);
        }
    }

    #[test]
    fn strconv_errors() {
        assert_eq!(parse_uint("42"), Ok(42));
        assert_eq!(
            parse_uint("notanumber"),
            Err("strconv.ParseUint: parsing \"notanumber\": invalid syntax".to_string())
        );
        assert_eq!(
            parse_uint("18446744073709551616"),
            Err(
                "strconv.ParseUint: parsing \"18446744073709551616\": value out of range"
                    .to_string()
            )
        );
        assert_eq!(parse_uint("18446744073709551615"), Ok(u64::MAX));
        assert!(parse_uint("").is_err());
        assert!(parse_uint("+1").is_err());
        assert_eq!(strconv_quote("a\"b\n\u{1}"), "\"a\\\"b\\n\\x01\"");
    }

    #[test]
    fn queries() {
        let (q, bad) = Query::parse("acquire=A&release=B&flags");
        assert!(!bad);
        assert!(q.has("flags"));
        assert_eq!(q.get("acquire"), "A");
        assert_eq!(q.encode(), "acquire=A&flags=&release=B");
        let (q, bad) = Query::parse("a=%zz&b=1+2%2F");
        assert!(bad);
        assert!(!q.has("a"));
        assert_eq!(q.get("b"), "1 2/");
        assert_eq!(q.encode(), "b=1+2%2F");
        assert_eq!(unescape("a%2", false), None);
        assert_eq!(unescape("a%", false), None);
        assert_eq!(unescape("a%41+", false), Some(b"aA+".to_vec()));
    }

    #[test]
    fn paths() {
        assert_eq!(clean_request_path("/v1/kv/a//b"), "/v1/kv/a/b");
        assert_eq!(clean_request_path("/v1/kv/a/"), "/v1/kv/a/");
        assert_eq!(clean_request_path("/v1/kv/a/../b"), "/v1/kv/b");
        assert_eq!(clean_request_path("/v1/kv/.lock"), "/v1/kv/.lock");
        assert_eq!(clean_request_path("/../x"), "/x");
        assert_eq!(clean_request_path("/"), "/");
    }

    #[test]
    fn uuids() {
        assert_eq!(
            uuid_index_parse("not-a-uuid"),
            Err("UUID must be 36 characters".to_string())
        );
        assert_eq!(
            uuid_index_parse("0000000A-0000-0000-0000-000000000000"),
            Ok(Some("0000000a-0000-0000-0000-000000000000".to_string()))
        );
        assert!(uuid_index_parse("x0000000-0000-0000-0000-000000000000")
            .unwrap_err()
            .contains("U+0078 'x'"));
    }

    #[test]
    fn sniffing() {
        assert_eq!(detect_content_type(b"hello"), "text/plain; charset=utf-8");
        assert_eq!(
            detect_content_type(b"{\"a\":1}"),
            "text/plain; charset=utf-8"
        );
        assert_eq!(detect_content_type(b"\x00\x01"), "application/octet-stream");
        assert_eq!(detect_content_type(b"  <html>"), "text/html; charset=utf-8");
    }
}
