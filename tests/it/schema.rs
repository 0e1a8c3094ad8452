//! A small JSON Schema validator for the subset docs/status.schema.json uses: $ref to
//! #/$defs, oneOf, type (one or a list), const, enum, required, properties,
//! additionalProperties: false, items, maxItems and minimum.

use serde_json::Value;

/// The errors of `value` against `schema` (empty when valid).
pub fn validate(root: &Value, schema: &Value, value: &Value, at: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        let name = r.strip_prefix("#/$defs/").expect("only #/$defs refs");
        let target = &root["$defs"][name];
        assert!(!target.is_null(), "unknown $ref {r}");
        return validate(root, target, value, at);
    }
    if let Some(alts) = schema.get("oneOf").and_then(Value::as_array) {
        let ok = alts
            .iter()
            .filter(|s| validate(root, s, value, at).is_empty())
            .count();
        if ok != 1 {
            errs.push(format!("{at}: matches {ok} of oneOf, not exactly 1"));
        }
    }
    if let Some(t) = schema.get("type") {
        let types: Vec<&str> = match t {
            Value::String(s) => vec![s.as_str()],
            Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
            _ => panic!("bad type {t}"),
        };
        if !types.iter().any(|t| is_type(value, t)) {
            errs.push(format!("{at}: {value} is not of type {types:?}"));
        }
    }
    if let Some(c) = schema.get("const") {
        if c != value {
            errs.push(format!("{at}: {value} is not {c}"));
        }
    }
    if let Some(e) = schema.get("enum").and_then(Value::as_array) {
        if !e.contains(value) {
            errs.push(format!("{at}: {value} is not one of {e:?}"));
        }
    }
    if let (Some(min), Some(n)) = (
        schema.get("minimum").and_then(Value::as_f64),
        value.as_f64(),
    ) {
        if n < min {
            errs.push(format!("{at}: {n} < {min}"));
        }
    }
    if let Some(obj) = value.as_object() {
        if let Some(req) = schema.get("required").and_then(Value::as_array) {
            for r in req.iter().filter_map(Value::as_str) {
                if !obj.contains_key(r) {
                    errs.push(format!("{at}: missing {r}"));
                }
            }
        }
        let props = schema.get("properties").and_then(Value::as_object);
        for (k, v) in obj {
            match props.and_then(|p| p.get(k)) {
                Some(s) => errs.extend(validate(root, s, v, &format!("{at}.{k}"))),
                None if schema.get("additionalProperties") == Some(&Value::Bool(false)) => {
                    errs.push(format!("{at}: unexpected property {k}"))
                }
                None => {}
            }
        }
    }
    if let Some(items) = value.as_array() {
        if let Some(max) = schema.get("maxItems").and_then(Value::as_u64) {
            if items.len() as u64 > max {
                errs.push(format!("{at}: more than {max} items"));
            }
        }
        if let Some(s) = schema.get("items") {
            for (i, v) in items.iter().enumerate() {
                errs.extend(validate(root, s, v, &format!("{at}[{i}]")));
            }
        }
    }
    errs
}

fn is_type(v: &Value, t: &str) -> bool {
    match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        "integer" => v.is_u64() || v.is_i64(),
        "number" => v.is_number(),
        _ => panic!("unknown type {t}"),
    }
}

/// The schema shipped in docs/.
pub fn status_schema() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/status.schema.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Panics with every error when `value` does not match the status schema.
pub fn assert_status_valid(value: &Value) {
    let schema = status_schema();
    let errs = validate(&schema, &schema, value, "$");
    assert!(
        errs.is_empty(),
        "{value:#}\ndoes not match docs/status.schema.json:\n{}",
        errs.join("\n")
    );
}

#[test]
fn the_validator_rejects_what_it_should() {
    let schema = status_schema();
    let good = serde_json::json!({"kind": "semaphore", "prefix": "p", "state": "free", "limit": null,
        "held": false, "holders": [], "waiting": 0, "modify_index": 0});
    assert!(validate(&schema, &schema, &good, "$").is_empty());
    let mut bad = good.clone();
    bad["holders"] = Value::Null;
    assert!(!validate(&schema, &schema, &bad, "$").is_empty());
    let mut bad = good.clone();
    bad["kind"] = "lock".into();
    assert!(!validate(&schema, &schema, &bad, "$").is_empty());
    let mut bad = good;
    bad["extra"] = 1.into();
    assert!(!validate(&schema, &schema, &bad, "$").is_empty());
}
