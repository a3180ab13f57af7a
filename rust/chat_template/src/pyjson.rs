//! `tojson` as Hugging Face transformers defines it for chat templates:
//! `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
//! Jinja2's own `tojson` HTML-escapes `<`, `>`, `&` and `'`; HF replaces it with
//! plain `json.dumps`, so this reproduces Python's output byte for byte
//! (separators, indentation, float repr, string escapes).

use minijinja::value::{Kwargs, Rest, ValueKind, ValueOrKwargs};
use minijinja::{Error, ErrorKind, Value};
use std::fmt::Write;

/// Formatting options of Python's `json.dumps`.
struct DumpOptions {
    ensure_ascii: bool,
    /// `None`: everything on one line; `Some(s)`: newline + `s` per level.
    indent: Option<String>,
    item_separator: String,
    key_separator: String,
    sort_keys: bool,
}

/// The filter. Positional arguments follow HF's signature
/// `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
/// (minijinja functions take at most five parameters, so the arguments arrive
/// as one list with the keyword arguments, if any, last.)
pub fn tojson_filter(value: &Value, args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
    let mut positional: Vec<Value> = args.0.into_iter().map(ValueOrKwargs::into_value).collect();
    let kwargs = match positional.last() {
        Some(last) if last.is_kwargs() => Kwargs::try_from(positional.pop().unwrap())?,
        _ => Kwargs::from_iter(std::iter::empty::<(&str, Value)>()),
    };
    if positional.len() > 4 {
        return Err(Error::new(ErrorKind::TooManyArguments, "tojson() takes at most 4 arguments"));
    }
    let mut positional = positional.into_iter();
    let (ensure_ascii, indent, separators, sort_keys) =
        (positional.next(), positional.next(), positional.next(), positional.next());
    let pick = |positional: Option<Value>, name: &str| -> Result<Option<Value>, Error> {
        let keyword: Option<Value> = kwargs.get(name)?;
        match (positional, keyword) {
            (Some(_), Some(_)) => Err(Error::new(
                ErrorKind::TooManyArguments,
                format!("tojson() got multiple values for argument '{name}'"),
            )),
            (p, k) => Ok(p.or(k).filter(|v| !v.is_none() && !v.is_undefined())),
        }
    };
    let ensure_ascii = pick(ensure_ascii, "ensure_ascii")?.is_some_and(|v| v.is_true());
    let indent = match pick(indent, "indent")? {
        None => None,
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or("").to_string()),
        // Python: ' ' * indent, so a negative indent means no indentation
        // (but still newlines).
        Some(v) if v.is_integer() => Some(" ".repeat(v.as_i64().unwrap_or(0).clamp(0, 64) as usize)),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: indent must be an integer or a string",
            ))
        }
    };
    let (item_separator, key_separator) = match pick(separators, "separators")? {
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
        Some(v) => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => {
                    (a.as_str().unwrap().to_string(), b.as_str().unwrap().to_string())
                }
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be a pair of strings",
                    ))
                }
            }
        }
    };
    let sort_keys = pick(sort_keys, "sort_keys")?.is_some_and(|v| v.is_true());
    kwargs.assert_all_used()?;

    let options = DumpOptions { ensure_ascii, indent, item_separator, key_separator, sort_keys };
    let mut out = String::new();
    dump(value, &options, 0, &mut out)?;
    Ok(Value::from(out))
}

/// Python's `json.dumps` of one value at nesting `level`.
fn dump(value: &Value, opts: &DumpOptions, level: usize, out: &mut String) -> Result<(), Error> {
    // Bound recursion: Python raises RecursionError long before this.
    if level > 512 {
        return Err(Error::new(ErrorKind::InvalidOperation, "tojson: value is nested too deeply"));
    }
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(value, out),
        ValueKind::String => write_string(value.as_str().unwrap_or(""), opts.ensure_ascii, out),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_separator);
                }
                newline_indent(opts, level + 1, out);
                dump(item, opts, level + 1, out)?;
            }
            newline_indent(opts, level, out);
            out.push(']');
        }
        ValueKind::Map => {
            let mut entries = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                entries.push((key_string(&key)?, item));
            }
            if opts.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            if entries.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, (key, item)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_separator);
                }
                newline_indent(opts, level + 1, out);
                write_string(key, opts.ensure_ascii, out);
                out.push_str(&opts.key_separator);
                dump(item, opts, level + 1, out)?;
            }
            newline_indent(opts, level, out);
            out.push('}');
        }
        // Python raises TypeError for these (Jinja2's Undefined included).
        kind => {
            let type_name = if kind == ValueKind::Undefined { "Undefined".to_string() } else { kind.to_string() };
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: object of type {type_name} is not JSON serializable"),
            ));
        }
    }
    Ok(())
}

fn newline_indent(opts: &DumpOptions, level: usize, out: &mut String) {
    if let Some(indent) = &opts.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(indent);
        }
    }
}

/// Python converts non-string dict keys: True -> "true", None -> "null",
/// numbers -> their repr.
fn key_string(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or("").to_string()),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.to_string()),
        ValueKind::None => Ok("null".to_string()),
        ValueKind::Number => {
            let mut s = String::new();
            write_number(key, &mut s);
            Ok(s)
        }
        kind => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: keys must be str, int, float, bool or None, not {kind}"),
        )),
    }
}

fn write_number(value: &Value, out: &mut String) {
    if value.is_integer() {
        let _ = write!(out, "{value}");
    } else {
        let f = f64::try_from(value.clone()).unwrap_or(f64::NAN);
        if f.is_nan() {
            out.push_str("NaN");
        } else if f.is_infinite() {
            out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
        } else {
            out.push_str(&python_float_repr(f));
        }
    }
}

/// Python's `repr(float)` for finite values: the shortest digits that round-trip,
/// in fixed notation when the decimal exponent is in [-4, 16), otherwise as
/// `d.ddde+XX` (at least two exponent digits).
pub fn python_float_repr(f: f64) -> String {
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0".into() } else { "0.0".into() };
    }
    // Rust's `{:e}` gives the shortest round-trip digits, e.g. "-1.25e-7".
    let sci = format!("{f:e}");
    let (mantissa, exponent) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let mut out = String::from(sign);
    if (-4..16).contains(&exponent) {
        if exponent >= 0 {
            let int_len = exponent as usize + 1;
            if digits.len() <= int_len {
                out.push_str(&digits);
                out.extend(std::iter::repeat('0').take(int_len - digits.len()));
                out.push_str(".0");
            } else {
                out.push_str(&digits[..int_len]);
                out.push('.');
                out.push_str(&digits[int_len..]);
            }
        } else {
            out.push_str("0.");
            out.extend(std::iter::repeat('0').take((-exponent - 1) as usize));
            out.push_str(&digits);
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(out, "e{}{:02}", if exponent < 0 { '-' } else { '+' }, exponent.abs());
    }
    out
}

/// A JSON string literal as Python writes it: `"`, `\` and control characters
/// escaped (\n \r \t \b \f by name, others as \u00XX); with `ensure_ascii`
/// everything outside printable ASCII becomes \uXXXX (UTF-16 surrogate pairs).
fn write_string(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && !(' '..='~').contains(&c) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{:04x}", unit);
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python() {
        let cases = [
            (1.0, "1.0"),
            (-2.5, "-2.5"),
            (0.1, "0.1"),
            (1e-4, "0.0001"),
            (1e-5, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (123456789012345680.0, "1.2345678901234568e+17"),
            (1e300, "1e+300"),
            (5e-324, "5e-324"),
            (0.30000000000000004, "0.30000000000000004"),
            (-0.0, "-0.0"),
        ];
        for (f, want) in cases {
            assert_eq!(python_float_repr(f), want, "repr({f:?})");
        }
    }

    #[test]
    fn strings_escape_like_python() {
        let mut s = String::new();
        write_string("a\"b\\c\n\u{1}é😀\u{7f}", false, &mut s);
        assert_eq!(s, "\"a\\\"b\\\\c\\n\\u0001é😀\u{7f}\"");
        s.clear();
        write_string("é😀\u{7f}", true, &mut s);
        assert_eq!(s, "\"\\u00e9\\ud83d\\ude00\\u007f\"");
    }
}
