//! JSON as Consul (Go's `encoding/json`) writes and reads it: an ordered
//! output value written like `json.MarshalIndent(v, "", "    ")` (Consul's dev
//! mode always pretty-prints), and `json.Decoder.Decode` into an `interface{}`
//! (every number a float64) with Go's error texts.

use serde_json::Value;

use crate::gostd::{format_float_v, json_quote_char};

/// An ordered JSON value for responses (field order matters to match Consul).
#[derive(Debug, Clone, PartialEq)]
pub enum J {
    Null,
    Bool(bool),
    U(u64),
    I(i64),
    S(String),
    A(Vec<J>),
    O(Vec<(String, J)>),
}

impl J {
    pub fn obj<const N: usize>(fields: [(&str, J); N]) -> J {
        J::O(
            fields
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
        )
    }

    pub fn s(v: impl Into<String>) -> J {
        J::S(v.into())
    }

    /// `json.MarshalIndent(v, "", "    ")` plus the trailing newline Consul adds.
    pub fn to_go_pretty(&self) -> Vec<u8> {
        let mut out = String::new();
        write_value(self, 0, &mut out);
        out.push('\n');
        out.into_bytes()
    }
}

fn indent(level: usize, out: &mut String) {
    for _ in 0..level {
        out.push_str("    ");
    }
}

fn write_value(v: &J, level: usize, out: &mut String) {
    match v {
        J::Null => out.push_str("null"),
        J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        J::U(n) => out.push_str(&n.to_string()),
        J::I(n) => out.push_str(&n.to_string()),
        J::S(s) => write_string(s, out),
        J::A(items) => {
            if items.is_empty() {
                out.push_str("[]");
                return;
            }
            out.push_str("[\n");
            for (i, item) in items.iter().enumerate() {
                indent(level + 1, out);
                write_value(item, level + 1, out);
                if i + 1 < items.len() {
                    out.push(',');
                }
                out.push('\n');
            }
            indent(level, out);
            out.push(']');
        }
        J::O(fields) => {
            if fields.is_empty() {
                out.push_str("{}");
                return;
            }
            out.push_str("{\n");
            for (i, (k, item)) in fields.iter().enumerate() {
                indent(level + 1, out);
                write_string(k, out);
                out.push_str(": ");
                write_value(item, level + 1, out);
                if i + 1 < fields.len() {
                    out.push(',');
                }
                out.push('\n');
            }
            indent(level, out);
            out.push('}');
        }
    }
}

/// Go's string encoding, including its HTML-safe escapes.
fn write_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Why `json.Decoder.Decode` rejected the input.
#[derive(Debug, PartialEq)]
pub enum DecodeError {
    /// Nothing but whitespace: Go's `io.EOF` ("EOF").
    Eof,
    /// Go's `io.ErrUnexpectedEOF`.
    UnexpectedEof,
    /// Go's `*json.SyntaxError` text.
    Syntax(String),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Eof => f.write_str("EOF"),
            DecodeError::UnexpectedEof => f.write_str("unexpected EOF"),
            DecodeError::Syntax(s) => f.write_str(s),
        }
    }
}

const MAX_DEPTH: usize = 120;

struct Scanner<'a> {
    d: &'a [u8],
    i: usize,
    /// The first number that does not fit a float64 (Go reports it only when the
    /// syntax of the whole value is fine).
    range_error: Option<String>,
}

type R<T> = Result<T, DecodeError>;

fn syntax(c: u8, context: &str) -> DecodeError {
    DecodeError::Syntax(format!(
        "invalid character {} {}",
        json_quote_char(c),
        context
    ))
}

impl Scanner<'_> {
    fn skip_ws(&mut self) {
        while self.i < self.d.len() && matches!(self.d[self.i], b' ' | b'\t' | b'\r' | b'\n') {
            self.i += 1;
        }
    }

    fn peek(&self) -> R<u8> {
        self.d
            .get(self.i)
            .copied()
            .ok_or(DecodeError::UnexpectedEof)
    }

    fn value(&mut self, depth: usize) -> R<Value> {
        // Go allows 10000 levels; connection threads have small stacks, so
        // nesting is capped lower here.
        if depth >= MAX_DEPTH {
            return Err(DecodeError::Syntax("exceeded max depth".to_string()));
        }
        self.skip_ws();
        let c = self.peek()?;
        match c {
            b'{' => self.object(depth),
            b'[' => self.array(depth),
            b'"' => self.string().map(Value::String),
            b'-' | b'0'..=b'9' => self.number(),
            b't' => self.literal(b"true").map(|_| Value::Bool(true)),
            b'f' => self.literal(b"false").map(|_| Value::Bool(false)),
            b'n' => self.literal(b"null").map(|_| Value::Null),
            _ => Err(syntax(c, "looking for beginning of value")),
        }
    }

    fn object(&mut self, depth: usize) -> R<Value> {
        let mut map = serde_json::Map::new();
        self.i += 1;
        self.skip_ws();
        if self.peek()? == b'}' {
            self.i += 1;
            return Ok(Value::Object(map));
        }
        loop {
            let c = self.peek()?;
            if c != b'"' {
                return Err(syntax(c, "looking for beginning of object key string"));
            }
            let key = self.string()?;
            self.skip_ws();
            let c = self.peek()?;
            if c != b':' {
                return Err(syntax(c, "after object key"));
            }
            self.i += 1;
            // A repeated key: the last one wins, as in a Go map.
            map.insert(key, self.value(depth + 1)?);
            self.skip_ws();
            match self.peek()? {
                b',' => {
                    self.i += 1;
                    self.skip_ws();
                }
                b'}' => {
                    self.i += 1;
                    return Ok(Value::Object(map));
                }
                c => return Err(syntax(c, "after object key:value pair")),
            }
        }
    }

    fn array(&mut self, depth: usize) -> R<Value> {
        let mut items = Vec::new();
        self.i += 1;
        self.skip_ws();
        if self.peek()? == b']' {
            self.i += 1;
            return Ok(Value::Array(items));
        }
        loop {
            items.push(self.value(depth + 1)?);
            self.skip_ws();
            match self.peek()? {
                b',' => self.i += 1,
                b']' => {
                    self.i += 1;
                    return Ok(Value::Array(items));
                }
                c => return Err(syntax(c, "after array element")),
            }
        }
    }

    fn hex4(&mut self) -> R<u32> {
        let mut v = 0;
        for _ in 0..4 {
            let h = self.peek()?;
            let d = (h as char)
                .to_digit(16)
                .ok_or_else(|| syntax(h, "in \\u hexadecimal character escape"))?;
            v = v * 16 + d;
            self.i += 1;
        }
        Ok(v)
    }

    /// A string as Go's `unquote` gives it: a bad surrogate or an invalid UTF-8
    /// byte becomes U+FFFD (one per byte).
    fn string(&mut self) -> R<String> {
        let mut out = String::new();
        self.i += 1;
        loop {
            let c = self.peek()?;
            match c {
                b'"' => {
                    self.i += 1;
                    return Ok(out);
                }
                b'\\' => {
                    self.i += 1;
                    let e = self.peek()?;
                    self.i += 1;
                    match e {
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'\\' | b'/' | b'"' => out.push(e as char),
                        b'u' => {
                            let r = self.hex4()?;
                            if (0xD800..0xDC00).contains(&r) && self.d[self.i..].starts_with(b"\\u")
                            {
                                // A pair only when the next escape is a low surrogate.
                                let save = self.i;
                                self.i += 2;
                                let r2 = self.hex4()?;
                                if (0xDC00..0xE000).contains(&r2) {
                                    let cp = 0x10000 + ((r - 0xD800) << 10) + (r2 - 0xDC00);
                                    out.push(char::from_u32(cp).unwrap_or('\u{FFFD}'));
                                    continue;
                                }
                                self.i = save;
                            }
                            out.push(char::from_u32(r).unwrap_or('\u{FFFD}'));
                        }
                        _ => {
                            self.i -= 1;
                            return Err(syntax(e, "in string escape code"));
                        }
                    }
                }
                c if c < 0x20 => return Err(syntax(c, "in string literal")),
                c if c < 0x80 => {
                    out.push(c as char);
                    self.i += 1;
                }
                c => {
                    let len = match c {
                        0xC0..=0xDF => 2,
                        0xE0..=0xEF => 3,
                        0xF0..=0xF7 => 4,
                        _ => 1,
                    };
                    let end = (self.i + len).min(self.d.len());
                    match std::str::from_utf8(&self.d[self.i..end]) {
                        Ok(ch) if end - self.i == len => {
                            out.push_str(ch);
                            self.i = end;
                        }
                        _ => {
                            out.push('\u{FFFD}');
                            self.i += 1;
                        }
                    }
                }
            }
        }
    }

    fn digits(&mut self) {
        while self.i < self.d.len() && self.d[self.i].is_ascii_digit() {
            self.i += 1;
        }
    }

    /// Every number becomes a float64 (Go's `strconv.ParseFloat`, correctly rounded),
    /// as Go decodes into an `interface{}`.
    fn number(&mut self) -> R<Value> {
        let start = self.i;
        if self.d[self.i] == b'-' {
            self.i += 1;
            let c = self.peek()?;
            if !c.is_ascii_digit() {
                return Err(syntax(c, "in numeric literal"));
            }
        }
        if self.d[self.i] == b'0' {
            self.i += 1;
        } else {
            self.digits();
        }
        if self.i < self.d.len() && self.d[self.i] == b'.' {
            self.i += 1;
            let c = self.peek()?;
            if !c.is_ascii_digit() {
                return Err(syntax(c, "after decimal point in numeric literal"));
            }
            self.digits();
        }
        if self.i < self.d.len() && matches!(self.d[self.i], b'e' | b'E') {
            self.i += 1;
            let mut c = self.peek()?;
            if c == b'+' || c == b'-' {
                self.i += 1;
                c = self.peek()?;
            }
            if !c.is_ascii_digit() {
                return Err(syntax(c, "in exponent of numeric literal"));
            }
            self.digits();
        }
        // ASCII digits, sign, '.', 'e' only.
        let lit = std::str::from_utf8(&self.d[start..self.i]).unwrap_or("0");
        let f: f64 = lit.parse().unwrap_or(f64::INFINITY);
        match serde_json::Number::from_f64(f) {
            Some(n) => Ok(Value::Number(n)),
            None => {
                if self.range_error.is_none() {
                    self.range_error = Some(format!(
                        "json: cannot unmarshal number {lit} into Go value of type float64"
                    ));
                }
                Ok(Value::Null)
            }
        }
    }

    fn literal(&mut self, word: &[u8]) -> R<()> {
        let name = std::str::from_utf8(word).unwrap_or("");
        self.i += 1;
        for &want in &word[1..] {
            let c = self.peek()?;
            if c != want {
                return Err(syntax(
                    c,
                    &format!("in literal {name} (expecting '{}')", char::from(want)),
                ));
            }
            self.i += 1;
        }
        Ok(())
    }
}

/// Decodes the first JSON value of `body` the way Go's `json.Decoder.Decode`
/// into an `interface{}` does: every number is a float64 (so integers above
/// 2^53 are rounded), trailing data is ignored, and a failure gives Go's error
/// text.
pub fn go_decode_first(body: &[u8]) -> Result<Value, String> {
    let mut sc = Scanner {
        d: body,
        i: 0,
        range_error: None,
    };
    sc.skip_ws();
    if sc.i >= body.len() {
        return Err(DecodeError::Eof.to_string());
    }
    let v = sc.value(0).map_err(|e| e.to_string())?;
    match sc.range_error {
        Some(e) => Err(e),
        None => Ok(v),
    }
}

/// Go's type name of a decoded `interface{}` value (`%T`).
pub fn go_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "<nil>",
        Value::Bool(_) => "bool",
        Value::Number(_) => "float64",
        Value::String(_) => "string",
        Value::Array(_) => "[]interface {}",
        Value::Object(_) => "map[string]interface {}",
    }
}

/// `fmt.Sprintf("%t", v)` of a decoded `interface{}` value: only booleans suit the
/// verb; the rest print as `%!t(type=value)` inside Go's map and slice syntax.
pub fn go_fmt_t(v: &Value) -> String {
    fn inner(v: &Value, top: bool) -> String {
        match v {
            Value::Null if top => "%!t(<nil>)".to_string(),
            Value::Null => "<nil>".to_string(),
            Value::Bool(b) => b.to_string(),
            Value::Number(n) => {
                format!("%!t(float64={})", format_float_v(n.as_f64().unwrap_or(0.0)))
            }
            Value::String(s) => format!("%!t(string={s})"),
            Value::Array(items) => {
                let parts: Vec<String> = items.iter().map(|x| inner(x, false)).collect();
                format!("[{}]", parts.join(" "))
            }
            // fmt prints map keys sorted; serde's map is sorted already.
            Value::Object(m) => {
                let parts: Vec<String> = m
                    .iter()
                    .map(|(k, x)| format!("%!t(string={k}):{}", inner(x, false)))
                    .collect();
                format!("map[{}]", parts.join(" "))
            }
        }
    }
    inner(v, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_error_texts() {
        let e = |s: &str| go_decode_first(s.as_bytes()).unwrap_err();
        assert_eq!(
            e("{not json"),
            "invalid character 'n' looking for beginning of object key string"
        );
        assert_eq!(e(""), "EOF");
        assert_eq!(e("  \n"), "EOF");
        assert_eq!(e("{\"a\":"), "unexpected EOF");
        assert_eq!(e("{\"a\" 1}"), "invalid character '1' after object key");
        assert_eq!(
            e("{\"a\":1 2}"),
            "invalid character '2' after object key:value pair"
        );
        assert_eq!(e("[1 2]"), "invalid character '2' after array element");
        assert_eq!(
            e("tru e"),
            "invalid character ' ' in literal true (expecting 'e')"
        );
        assert_eq!(
            e("x"),
            "invalid character 'x' looking for beginning of value"
        );
        assert_eq!(
            e("'a'"),
            "invalid character '\\'' looking for beginning of value"
        );
        assert_eq!(e("-x"), "invalid character 'x' in numeric literal");
        assert_eq!(e("\"\\q\""), "invalid character 'q' in string escape code");
        assert_eq!(e("\"a\nb\""), "invalid character '\\n' in string literal");
        assert!(go_decode_first(b"{\"a\":1} trailing").is_ok());
        assert_eq!(e(&"[".repeat(100_000)), "exceeded max depth");
        let nested = format!("{}{}", "[".repeat(100), "]".repeat(100));
        assert!(go_decode_first(nested.as_bytes()).is_ok());
        assert!(go_decode_first(b"12x").is_ok());
        assert_eq!(go_decode_first(b"null").unwrap(), serde_json::Value::Null);
    }

    #[test]
    fn numbers_are_float64_and_strings_as_go_unquotes_them() {
        let v = go_decode_first(b"[9007199254740993, 3304740253564472344, -0, 1.9]").unwrap();
        let f: Vec<f64> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_f64().unwrap())
            .collect();
        assert_eq!(
            f,
            [
                9_007_199_254_740_992.0,
                3_304_740_253_564_472_320.0,
                -0.0,
                1.9
            ]
        );
        assert_eq!(v[0].as_u64(), None, "a float, not an integer");
        assert_eq!(
            go_decode_first(b"[1e400, 2e400]").unwrap_err(),
            "json: cannot unmarshal number 1e400 into Go value of type float64"
        );
        // A syntax error anywhere wins over a number out of range.
        assert_eq!(
            go_decode_first(b"[1e400 x]").unwrap_err(),
            "invalid character 'x' after array element"
        );
        let s = |b: &[u8]| go_decode_first(b).unwrap().as_str().unwrap().to_string();
        assert_eq!(s(br#""x\u00e9\ud800y""#), "x\u{e9}\u{FFFD}y");
        assert_eq!(s(br#""\ud83d\ude00\udc00""#), "\u{1F600}\u{FFFD}");
        assert_eq!(s(br#""\ud800\u0041""#), "\u{FFFD}A");
        assert_eq!(s(b"\"a\xe2\x82b\xff\""), "a\u{FFFD}\u{FFFD}b\u{FFFD}");
        assert_eq!(s("\"\u{20ac}\\n\\/\"".as_bytes()), "\u{20ac}\n/");
        let v = go_decode_first(br#"{"a": 1, "a": 2}"#).unwrap();
        assert_eq!(v["a"].as_f64(), Some(2.0), "the last repeated key wins");
    }

    #[test]
    fn percent_t_formatting() {
        let t = |b: &[u8]| go_fmt_t(&go_decode_first(b).unwrap());
        assert_eq!(t(b"null"), "%!t(<nil>)");
        assert_eq!(t(b"true"), "true");
        assert_eq!(t(b"\"x\""), "%!t(string=x)");
        assert_eq!(t(b"5"), "%!t(float64=5)");
        assert_eq!(
            t(br#"{"b": [1, 2.5, true, null, "s"], "a": {"x": 1e21}, "c": {}}"#),
            "map[%!t(string=a):map[%!t(string=x):%!t(float64=1e+21)] \
             %!t(string=b):[%!t(float64=1) %!t(float64=2.5) true <nil> %!t(string=s)] \
             %!t(string=c):map[]]"
        );
    }

    #[test]
    fn pretty_output() {
        let v = J::obj([
            ("A", J::U(1)),
            ("B", J::A(vec![])),
            ("C", J::A(vec![J::s("<x&y>")])),
        ]);
        assert_eq!(
            String::from_utf8(v.to_go_pretty()).unwrap(),
            "{\n    \"A\": 1,\n    \"B\": [],\n    \"C\": [\n        \"\\u003cx\\u0026y\\u003e\"\n    ]\n}\n"
        );
    }
}
