//! One render of a chat template, configured like Hugging Face transformers'
//! `_compile_jinja_template`: trim_blocks + lstrip_blocks, keep_trailing_newline
//! off, Jinja2's default (lenient) undefined, loop controls, the
//! `{% generation %}` tag, and the globals `raise_exception` and `strftime_now`,
//! with `tojson` replaced by Python's `json.dumps`.

use crate::{clock, pyjson};
use minijinja::syntax::SyntaxConfig;
use minijinja::value::Value;
use minijinja::{AutoEscape, Environment, Error, ErrorKind, UndefinedBehavior};
use std::borrow::Cow;
use std::fmt;
use std::io;

/// Why a render failed; mirrored by the status codes in chat_template_ffi.h.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// Syntax error, unknown filter, type error, undefined attribute, ...
    Template,
    /// The template called raise_exception(message).
    Raised,
    /// The step limit was reached.
    OutOfFuel,
    /// The output grew past the limit.
    OutputTooLarge,
    /// The context was not a JSON object, or the template not UTF-8.
    BadInput,
}

#[derive(Debug)]
pub struct Failure {
    pub kind: FailureKind,
    pub message: String,
}

impl Failure {
    fn new(kind: FailureKind, message: impl Into<String>) -> Failure {
        Failure { kind, message: message.into() }
    }
}

pub struct Limits {
    /// Engine instructions one render may execute (minijinja "fuel") ...
    pub fuel: u64,
    /// ... plus this many for each entry of the context's `messages` list, so
    /// long conversations get a budget that grows with them.
    pub fuel_per_message: u64,
    /// Largest output in bytes.
    pub max_output_bytes: u64,
}

/// Attached as the source of the error raise_exception() returns, so the
/// failure can be told apart from engine errors without parsing messages.
#[derive(Debug)]
struct RaisedException(String);

impl fmt::Display for RaisedException {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RaisedException {}

fn raise_exception(message: Option<Value>) -> Result<Value, Error> {
    let message = message.map(|m| m.to_string()).unwrap_or_default();
    Err(Error::new(ErrorKind::InvalidOperation, message.clone()).with_source(RaisedException(message)))
}

/// Output sink that fails once the output passes the limit, so a template
/// cannot grow memory without bound.
struct CappedWriter {
    buf: Vec<u8>,
    limit: usize,
    overflowed: bool,
}

impl io::Write for CappedWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.buf.len() + data.len() > self.limit {
            self.overflowed = true;
            return Err(io::Error::other("output limit reached"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

const TEMPLATE_NAME: &str = "chat_template";

fn make_environment(fuel: u64) -> Result<Environment<'static>, Failure> {
    let mut env = Environment::new();
    let syntax = SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .keep_trailing_newline(false)
        .build()
        .map_err(|e| Failure::new(FailureKind::Template, e.to_string()))?;
    env.set_syntax(syntax);
    env.set_undefined_behavior(UndefinedBehavior::Lenient);
    // Jinja2's from_string() never auto-escapes.
    env.set_auto_escape_callback(|_| AutoEscape::None);
    // No loader: {% include %}/{% import %} of anything fail.
    env.set_fuel(Some(fuel));
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_filter("tojson", pyjson::tojson_filter);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", clock::strftime_now);
    // Jinja2 prints floats with Python's repr (1e-05, not 0.00001).
    env.set_formatter(|out, state, value| {
        if value.is_number() && !value.is_integer() {
            if let Ok(f) = f64::try_from(value.clone()) {
                if f.is_finite() {
                    return out.write_str(&pyjson::python_float_repr(f)).map_err(Error::from);
                }
            }
        }
        minijinja::escape_formatter(out, state, value)
    });
    Ok(env)
}

/// HF registers a `{% generation %}...{% endgeneration %}` tag that marks the
/// assistant's text (for training masks) and renders its body unchanged.
/// minijinja has no custom tags, so it becomes `{% if true %}...{% endif %}`,
/// keeping the whitespace-control markers (`-`, `+`) of the original tag.
fn rewrite_generation_tags(source: &str) -> Cow<'_, str> {
    if !source.contains("generation") {
        return Cow::Borrowed(source);
    }
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        match parse_generation_tag(tag) {
            Some((len, open_marker, is_end, close_marker)) => {
                let body = if is_end { "endif" } else { "if true" };
                out.push_str(&format!("{{%{open_marker} {body} {close_marker}%}}"));
                rest = &tag[len..];
            }
            None => {
                out.push_str("{%");
                rest = &tag[2..];
            }
        }
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// Parses `{%[-+]? (end)?generation [-+]?%}` at the start of `tag`; returns
/// (length, opening marker, is end tag, closing marker).
fn parse_generation_tag(tag: &str) -> Option<(usize, &str, bool, &str)> {
    let b = tag.as_bytes();
    let mut i = 2;
    let open_marker = match b.get(i) {
        Some(b'-') | Some(b'+') => {
            i += 1;
            &tag[2..3]
        }
        _ => "",
    };
    while b.get(i).is_some_and(|c| c.is_ascii_whitespace()) {
        i += 1;
    }
    let is_end = tag[i..].starts_with("endgeneration");
    if is_end {
        i += "endgeneration".len();
    } else if tag[i..].starts_with("generation") {
        i += "generation".len();
    } else {
        return None;
    }
    while b.get(i).is_some_and(|c| c.is_ascii_whitespace()) {
        i += 1;
    }
    let marker_start = i;
    if matches!(b.get(i), Some(b'-') | Some(b'+')) {
        i += 1;
    }
    let close_marker = &tag[marker_start..i];
    if tag[i..].starts_with("%}") {
        Some((i + 2, open_marker, is_end, close_marker))
    } else {
        None
    }
}

fn classify(err: &Error) -> FailureKind {
    if err.kind() == ErrorKind::OutOfFuel {
        return FailureKind::OutOfFuel;
    }
    // A raise_exception error may arrive wrapped (e.g. through a macro call).
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = current {
        if e.downcast_ref::<RaisedException>().is_some() {
            return FailureKind::Raised;
        }
        current = e.source();
    }
    FailureKind::Template
}

fn raised_message(err: &Error) -> Option<String> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = current {
        if let Some(raised) = e.downcast_ref::<RaisedException>() {
            return Some(raised.0.clone());
        }
        current = e.source();
    }
    None
}

/// Converts parsed JSON into template values; objects keep their key order
/// (preserve_order), as Python dicts do. serde_json caps nesting at 128 levels.
fn json_to_value(json: serde_json::Value) -> Value {
    use serde_json::Value as J;
    match json {
        J::Null => Value::from(()),
        J::Bool(b) => Value::from(b),
        J::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                Value::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        J::String(s) => Value::from(s),
        J::Array(items) => items.into_iter().map(json_to_value).collect(),
        J::Object(map) => Value::from_pairs(map.into_iter().map(|(k, v)| (k, json_to_value(v)))),
    }
}

/// Renders `source` with the variables of the JSON object `context_json`.
pub fn render(source: &[u8], context_json: &[u8], limits: &Limits) -> Result<Vec<u8>, Failure> {
    let source = std::str::from_utf8(source)
        .map_err(|e| Failure::new(FailureKind::BadInput, format!("template is not valid UTF-8: {e}")))?;
    let context: serde_json::Value = serde_json::from_slice(context_json)
        .map_err(|e| Failure::new(FailureKind::BadInput, format!("context is not valid JSON: {e}")))?;
    if !context.is_object() {
        return Err(Failure::new(FailureKind::BadInput, "context must be a JSON object"));
    }
    let messages = context.get("messages").and_then(|m| m.as_array()).map_or(0, |m| m.len() as u64);
    let fuel = limits.fuel.saturating_add(limits.fuel_per_message.saturating_mul(messages));
    let context = json_to_value(context);

    let env = make_environment(fuel)?;
    let source = rewrite_generation_tags(source);
    let template = env
        .template_from_named_str(TEMPLATE_NAME, &source)
        .map_err(|e| Failure::new(FailureKind::Template, e.to_string()))?;

    let limit = usize::try_from(limits.max_output_bytes).unwrap_or(usize::MAX);
    let mut writer = CappedWriter { buf: Vec::new(), limit, overflowed: false };
    let rendered = template.render_captured_to(context, &mut writer).map(|_| ());
    match rendered {
        Ok(()) => Ok(writer.buf),
        Err(_) if writer.overflowed => Err(Failure::new(
            FailureKind::OutputTooLarge,
            format!("output exceeds the limit of {} bytes", limits.max_output_bytes),
        )),
        Err(err) => {
            let kind = classify(&err);
            let message = match kind {
                FailureKind::Raised => raised_message(&err).unwrap_or_default(),
                FailureKind::OutOfFuel => format!("{err} (budget: {fuel} steps)"),
                _ => err.to_string(),
            };
            Err(Failure::new(kind, message))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits { fuel: 1_000_000, fuel_per_message: 0, max_output_bytes: 1 << 20 }
    }

    fn run(source: &str, ctx: &str) -> Result<String, Failure> {
        render(source.as_bytes(), ctx.as_bytes(), &limits()).map(|b| String::from_utf8(b).unwrap())
    }

    #[test]
    fn generation_tags_become_if_blocks() {
        assert_eq!(
            rewrite_generation_tags("a{%- generation +%}b{% endgeneration -%}c{% if x %}"),
            "a{%- if true +%}b{% endif -%}c{% if x %}"
        );
        assert_eq!(run("{% generation %}\nhi\n{% endgeneration %}\n!", "{}").unwrap(), "hi\n!");
    }

    #[test]
    fn whitespace_like_hf() {
        // trim_blocks drops the newline after a tag, lstrip_blocks the
        // indentation before it, and one trailing newline is removed.
        let src = "{% for m in messages %}\n  {% if true %}\n[{{ m }}]\n  {% endif %}\n{% endfor %}\n";
        assert_eq!(run(src, r#"{"messages": ["a", "b"]}"#).unwrap(), "[a]\n[b]\n");
    }

    #[test]
    fn python_methods_and_tojson() {
        let src = "{{ s.strip().upper() }}|{{ d|tojson }}|{{ d|tojson(indent=2) }}|{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}";
        assert_eq!(
            run(src, r#"{"s": "  hi ", "d": {"z": 1, "a": [1.5, null, true, "<&>"]}}"#).unwrap(),
            "HI|{\"z\": 1, \"a\": [1.5, null, true, \"<&>\"]}|{\n  \"z\": 1,\n  \"a\": [\n    1.5,\n    null,\n    true,\n    \"<&>\"\n  ]\n}|z=1;a=[1.5, None, True, '<&>'];"
        );
    }

    #[test]
    fn raise_exception_is_its_own_failure() {
        let err = run("{{ raise_exception('no system role') }}", "{}").unwrap_err();
        assert_eq!(err.kind, FailureKind::Raised);
        assert_eq!(err.message, "no system role");
        let err = run("{% macro m() %}{{ raise_exception('deep') }}{% endmacro %}{{ m() }}", "{}").unwrap_err();
        assert_eq!((err.kind, err.message.as_str()), (FailureKind::Raised, "deep"));
    }

    #[test]
    fn fuel_and_output_limits() {
        let err = run("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "{}")
            .unwrap_err();
        assert_eq!(err.kind, FailureKind::OutOfFuel);
        // The budget grows with the number of messages.
        let src = b"{% for i in range(3000) %}{% endfor %}";
        let per_message = Limits { fuel: 1000, fuel_per_message: 1000, max_output_bytes: 1 << 20 };
        assert_eq!(render(src, br#"{"messages": [1]}"#, &per_message).unwrap_err().kind, FailureKind::OutOfFuel);
        let twenty = format!("{{\"messages\": {:?}}}", [0; 20]);
        assert!(render(src, twenty.as_bytes(), &per_message).is_ok());
        let big = Limits { fuel: 1_000_000, fuel_per_message: 0, max_output_bytes: 1000 };
        let err = render(b"{% for i in range(2000) %}x{% endfor %}", b"{}", &big).unwrap_err();
        assert_eq!(err.kind, FailureKind::OutputTooLarge);
    }

    #[test]
    fn bad_inputs() {
        assert_eq!(run("x", "[1]").unwrap_err().kind, FailureKind::BadInput);
        assert_eq!(run("x", "{").unwrap_err().kind, FailureKind::BadInput);
        assert_eq!(run("{% if %}", "{}").unwrap_err().kind, FailureKind::Template);
        assert_eq!(run("{% include 'x' %}", "{}").unwrap_err().kind, FailureKind::Template);
    }

    #[test]
    fn undefined_is_lenient_like_jinja2() {
        assert_eq!(run("[{{ nope }}]{% if nope %}y{% endif %}{% for x in nope %}z{% endfor %}", "{}").unwrap(), "[]");
        assert_eq!(run("{{ nope.attr }}", "{}").unwrap_err().kind, FailureKind::Template);
    }
}
