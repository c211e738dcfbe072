//! JSON values as the generated pages print them.

use serde_json::Value;

/// A value as a table cell shows it: a string bare, an integer as it is, a float in the
/// shortest digits that read back (a whole one with ".0", the exponent of a very small or
/// large one with a sign and two digits at least), null as None.
pub fn show(v: &Value) -> String {
    match v {
        Value::Null => "None".into(),
        Value::Bool(b) => if *b { "True" } else { "False" }.into(),
        Value::String(s) => s.clone(),
        Value::Number(n) => match (n.is_f64(), n.as_f64()) {
            (true, Some(f)) => float(f),
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

fn float(f: f64) -> String {
    if !f.is_finite() {
        return format!("{f}").to_lowercase();
    }
    if f != 0.0 && (f.abs() < 1e-4 || f.abs() >= 1e16) {
        let s = format!("{f:e}");
        let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let (sign, digits) = exp.strip_prefix('-').map_or(("+", exp), |d| ("-", d));
        return format!("{mantissa}e{sign}{digits:0>2}");
    }
    let s = format!("{f}");
    if s.contains('.') {
        s
    } else {
        s + ".0"
    }
}

/// Whether a value counts as given: not null, false, 0 or empty.
pub fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}
