//! JSON as Consul (Go's `encoding/json`) writes and reads it: an ordered
//! output value written like `json.MarshalIndent(v, "", "    ")` (Consul's dev
//! mode always pretty-prints), and the first-value syntax check of
//! `json.Decoder.Decode` with Go's error texts.

use crate::gostd::json_quote_char;

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
}

type R = Result<(), DecodeError>;

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

    fn peek(&self) -> Result<u8, DecodeError> {
        self.d
            .get(self.i)
            .copied()
            .ok_or(DecodeError::UnexpectedEof)
    }

    fn value(&mut self, depth: usize) -> R {
        // Go allows 10000 levels; connection threads have small stacks and
        // serde_json stops at 128, so nesting is capped lower here.
        if depth >= MAX_DEPTH {
            return Err(DecodeError::Syntax("exceeded max depth".to_string()));
        }
        self.skip_ws();
        let c = self.peek()?;
        match c {
            b'{' => self.object(depth),
            b'[' => self.array(depth),
            b'"' => self.string(),
            b'-' | b'0'..=b'9' => self.number(),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            _ => Err(syntax(c, "looking for beginning of value")),
        }
    }

    fn object(&mut self, depth: usize) -> R {
        self.i += 1;
        self.skip_ws();
        if self.peek()? == b'}' {
            self.i += 1;
            return Ok(());
        }
        loop {
            let c = self.peek()?;
            if c != b'"' {
                return Err(syntax(c, "looking for beginning of object key string"));
            }
            self.string()?;
            self.skip_ws();
            let c = self.peek()?;
            if c != b':' {
                return Err(syntax(c, "after object key"));
            }
            self.i += 1;
            self.value(depth + 1)?;
            self.skip_ws();
            match self.peek()? {
                b',' => {
                    self.i += 1;
                    self.skip_ws();
                }
                b'}' => {
                    self.i += 1;
                    return Ok(());
                }
                c => return Err(syntax(c, "after object key:value pair")),
            }
        }
    }

    fn array(&mut self, depth: usize) -> R {
        self.i += 1;
        self.skip_ws();
        if self.peek()? == b']' {
            self.i += 1;
            return Ok(());
        }
        loop {
            self.value(depth + 1)?;
            self.skip_ws();
            match self.peek()? {
                b',' => self.i += 1,
                b']' => {
                    self.i += 1;
                    return Ok(());
                }
                c => return Err(syntax(c, "after array element")),
            }
        }
    }

    fn string(&mut self) -> R {
        self.i += 1;
        loop {
            let c = self.peek()?;
            match c {
                b'"' => {
                    self.i += 1;
                    return Ok(());
                }
                b'\\' => {
                    self.i += 1;
                    let e = self.peek()?;
                    match e {
                        b'b' | b'f' | b'n' | b'r' | b't' | b'\\' | b'/' | b'"' => self.i += 1,
                        b'u' => {
                            self.i += 1;
                            for _ in 0..4 {
                                let h = self.peek()?;
                                if !h.is_ascii_hexdigit() {
                                    return Err(syntax(h, "in \\u hexadecimal character escape"));
                                }
                                self.i += 1;
                            }
                        }
                        _ => return Err(syntax(e, "in string escape code")),
                    }
                }
                c if c < 0x20 => return Err(syntax(c, "in string literal")),
                _ => self.i += 1,
            }
        }
    }

    fn digits(&mut self) {
        while self.i < self.d.len() && self.d[self.i].is_ascii_digit() {
            self.i += 1;
        }
    }

    fn number(&mut self) -> R {
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
        Ok(())
    }

    fn literal(&mut self, word: &[u8]) -> R {
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
/// into an `interface{}` would (trailing data is ignored; invalid UTF-8 in
/// strings is replaced), returning Go's error text on failure.
pub fn go_decode_first(body: &[u8]) -> Result<serde_json::Value, String> {
    let mut sc = Scanner { d: body, i: 0 };
    sc.skip_ws();
    if sc.i >= body.len() {
        return Err(DecodeError::Eof.to_string());
    }
    let start = sc.i;
    sc.value(0).map_err(|e| e.to_string())?;
    let span = String::from_utf8_lossy(&body[start..sc.i]);
    serde_json::from_str::<serde_json::Value>(&span).map_err(|e| {
        if e.to_string().contains("number out of range") {
            "json: cannot unmarshal number into Go value of type float64".to_string()
        } else {
            e.to_string()
        }
    })
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
