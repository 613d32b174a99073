//! The text a JSON value carries, as derivative lineage reads it: every string in it, one per
//! line, Lethe's stamp left out.

use serde_json::Value;

/// Every string of `value` (object keys aside), depth first, one per line; the `lethe_*` keys of
/// objects are skipped.
pub fn text_of(value: &Value) -> String {
    let mut text = String::new();
    push_text(value, &mut text);
    text
}

fn push_text(value: &Value, text: &mut String) {
    match value {
        Value::String(s) => {
            if !text.is_empty() {
                text.push('\n');
            }
            text.push_str(s);
        }
        Value::Array(items) => items.iter().for_each(|v| push_text(v, text)),
        Value::Object(map) => push_fields(map, text),
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

fn push_fields(map: &serde_json::Map<String, Value>, text: &mut String) {
    map.iter()
        .filter(|(k, _)| !k.starts_with("lethe_"))
        .for_each(|(_, v)| push_text(v, text));
}

/// The text of the named fields of an object (all of it when none is named).
pub fn text_of_fields(
    object: Option<&serde_json::Map<String, Value>>,
    fields: &[String],
) -> String {
    let Some(object) = object else {
        return String::new();
    };
    let mut text = String::new();
    if fields.is_empty() {
        push_fields(object, &mut text);
    }
    for field in fields {
        if let Some(value) = object.get(field) {
            push_text(value, &mut text);
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_string_but_the_stamp_is_text() {
        let value = json!({"data": "likes tea", "lethe_subject": "alice", "tags": ["a", {"x": "b"}], "n": 3, "ok": true});
        assert_eq!(text_of(&value), "likes tea\na\nb");
        let payload = value.as_object();
        assert_eq!(
            text_of_fields(payload, &["data".into(), "n".into()]),
            "likes tea"
        );
        assert_eq!(text_of_fields(payload, &[]), "likes tea\na\nb");
        assert_eq!(text_of_fields(None, &[]), "");
    }
}
