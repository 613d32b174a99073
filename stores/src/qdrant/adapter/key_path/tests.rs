use proptest::prelude::*;
use serde_json::json;

use super::*;
use Item::{Index, Key, Wildcard};

/// Each text, and the top-level key and steps Qdrant reads in it, or the byte where Qdrant stops
/// reading it (and refuses it).
#[allow(clippy::type_complexity)]
fn cases() -> Vec<(
    &'static str,
    Result<(&'static str, Vec<Item<'static>>), usize>,
)> {
    vec![
        // Plain, nested, quoted.
        ("data", Ok(("data", vec![]))),
        ("a.b", Ok(("a", vec![Key("b")]))),
        ("a[0].b", Ok(("a", vec![Index(0), Key("b")]))),
        ("a[].b", Ok(("a", vec![Wildcard, Key("b")]))),
        ("a[01]", Ok(("a", vec![Index(1)]))),
        ("\"a.b\"", Ok(("a.b", vec![]))),
        ("\"a.b\".c", Ok(("a.b", vec![Key("c")]))),
        ("a.\"b.c\"[2]", Ok(("a", vec![Key("b.c"), Index(2)]))),
        (
            "foo[1][50].bar-baz[].\"qux[.]quux\"",
            Ok((
                "foo",
                vec![
                    Index(1),
                    Index(50),
                    Key("bar-baz"),
                    Wildcard,
                    Key("qux[.]quux"),
                ],
            )),
        ),
        ("\"\"", Ok(("", vec![]))),
        ("a.\"\"", Ok(("a", vec![Key("")]))),
        ("\"a b\"", Ok(("a b", vec![]))),
        ("\"[0]\"", Ok(("[0]", vec![]))),
        ("\"'\"", Ok(("'", vec![]))),
        ("123", Ok(("123", vec![]))),
        ("-", Ok(("-", vec![]))),
        ("données.clé", Ok(("données", vec![Key("clé")]))),
        // The stamp, in every spelling Qdrant reads as it.
        ("lethe_subject", Ok(("lethe_subject", vec![]))),
        ("\"lethe_subject\"", Ok(("lethe_subject", vec![]))),
        ("\"lethe_subject\".x", Ok(("lethe_subject", vec![Key("x")]))),
        ("\"lethe_subject\"[]", Ok(("lethe_subject", vec![Wildcard]))),
        (
            "\"lethe_subject\"[0]",
            Ok(("lethe_subject", vec![Index(0)])),
        ),
        ("lethe_subject[]", Ok(("lethe_subject", vec![Wildcard]))),
        (
            "lethe_tenant[0].x",
            Ok(("lethe_tenant", vec![Index(0), Key("x")])),
        ),
        (
            "\"lethe_epoch\".\"a.b\"",
            Ok(("lethe_epoch", vec![Key("a.b")])),
        ),
        ("\"lethe_expires_at\"", Ok(("lethe_expires_at", vec![]))),
        ("\"lethe_\"", Ok(("lethe_", vec![]))),
        // The stamp's names below the top are other keys.
        (
            "meta.lethe_subject",
            Ok(("meta", vec![Key("lethe_subject")])),
        ),
        (
            "meta.\"lethe_subject\"",
            Ok(("meta", vec![Key("lethe_subject")])),
        ),
        ("\"meta.lethe_subject\"", Ok(("meta.lethe_subject", vec![]))),
        ("\" lethe_subject\"", Ok((" lethe_subject", vec![]))),
        // What Qdrant refuses.
        ("", Err(0)),
        ("\"lethe_subject", Err(0)),
        ("\"lethe\\_subject\"", Err(0)),
        ("\"lethe_subject\\\"\"", Err(0)),
        (" lethe_subject", Err(0)),
        ("lethe_subject ", Err(13)),
        ("'lethe_subject'", Err(0)),
        (".lethe_subject", Err(0)),
        ("[0]", Err(0)),
        ("[]", Err(0)),
        ("[0].lethe_subject", Err(0)),
        ("a.", Err(1)),
        ("a..b", Err(1)),
        ("a[", Err(1)),
        ("a[-1]", Err(1)),
        ("a[ 0]", Err(1)),
        ("a[0 ]", Err(1)),
        ("a[x]", Err(1)),
        ("a[99999999999999999999999]", Err(1)),
        ("a]", Err(1)),
        ("a\"b\"", Err(1)),
        ("\"a\"\"b\"", Err(3)),
        ("\"a\"b", Err(3)),
        ("a.\"b", Err(1)),
        ("a.b.\"c\\d\"", Err(3)),
        ("lethe_subject\u{0}", Err(13)),
        ("lethe_subject\n", Err(13)),
        ("a/b", Err(1)),
        ("$score", Err(0)),
    ]
}

#[test]
fn paths_are_read_as_qdrant_reads_them() {
    for (text, expected) in cases() {
        let read = parse(text).map(|p| (p.first, p.rest)).map_err(|e| e.at);
        assert_eq!(read, expected, "{text:?}");
        assert_eq!(
            first_segment(text).map_err(|e| e.at),
            expected.map(|(first, _)| first),
            "{text:?}"
        );
    }
}

#[test]
fn plain_keys_are_their_own_paths() {
    for key in ["data", "user_id", "lethe_subject", "a-b_9", "données"] {
        assert!(is_plain_key(key), "{key}");
        assert_eq!(
            parse(key),
            Ok(Path {
                first: key,
                rest: vec![]
            })
        );
    }
    for key in ["", "a.b", "a b", "\"a\"", "a[0]", "a[]", "$a"] {
        assert!(!is_plain_key(key), "{key:?}");
    }
}

fn cut(payload: &Value, paths: &[&str]) -> Value {
    let paths: Vec<Path<'_>> = paths.iter().map(|p| parse(p).unwrap()).collect();
    Value::Object(include(payload.as_object().unwrap(), &paths))
}

/// Qdrant's own cases (`test_payload_selector_*` in `lib/segment/src/types.rs`), and keys only
/// a quoted path names.
#[test]
fn with_payload_keeps_what_qdrant_keeps() {
    let payload = json!({ "a": 1, "b": { "c": 123, "e": {
        "f": [1, 2, 3], "g": 7, "h": "text", "i": [{ "j": 1, "k": 2 }, { "j": 3, "k": 4 }],
    } } });
    let cases = [
        (
            vec!["a", "b.e.f"],
            json!({ "a": 1, "b": { "e": { "f": [1, 2, 3] } } }),
        ),
        (vec!["a", "a"], json!({ "a": 1 })),
        (
            vec!["b.e.i[].j"],
            json!({ "b": { "e": { "i": [{ "j": 1 }, { "j": 3 }] } } }),
        ),
        (vec!["b.e.i.j"], json!({ "b": { "e": { "i": [] } } })),
        (vec!["b.e.f[0]"], json!({ "b": { "e": { "f": [] } } })),
        (vec![], json!({})),
    ];
    for (paths, expected) in cases {
        assert_eq!(cut(&payload, &paths), expected, "{paths:?}");
    }
    let odd = json!({ "a.b": 1, "a": { "b": 2 }, "lethe_subject": "alice" });
    assert_eq!(cut(&odd, &["\"a.b\""]), json!({ "a.b": 1 }));
    assert_eq!(cut(&odd, &["a.b"]), json!({ "a": { "b": 2 } }));
    assert_eq!(
        cut(&odd, &["\"lethe_subject\""]),
        json!({ "lethe_subject": "alice" })
    );
}

#[test]
fn values_are_found_where_qdrant_finds_them() {
    let payload = json!({
        "a.b": "quoted",
        "a": { "b": "nested", "c": [{ "d": 1 }, { "d": 2 }, { "e": 3 }] },
        "t": ["x", "y"],
    });
    let map = payload.as_object().unwrap();
    let at = |p: &str| -> Vec<Value> {
        values_at(map, &parse(p).unwrap())
            .into_iter()
            .cloned()
            .collect()
    };
    assert_eq!(at("\"a.b\""), [json!("quoted")]);
    assert_eq!(at("a.b"), [json!("nested")]);
    assert_eq!(at("a.c[].d"), [json!(1), json!(2)]);
    assert_eq!(at("a.c[1].d"), [json!(2)]);
    assert_eq!(at("a.c.d"), Vec::<Value>::new());
    assert_eq!(at("t"), [json!(["x", "y"])]);
    assert_eq!(at("t[]"), [json!("x"), json!("y")]);
    assert_eq!(at("t[5]"), Vec::<Value>::new());
    assert_eq!(at("missing"), Vec::<Value>::new());
}

#[derive(Debug, Clone)]
enum Step {
    Key(String),
    Index(usize),
    Wildcard,
}

fn arb_key() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-zA-Z0-9_-]{1,8}",
        "lethe_[a-z_]{0,8}",
        // Anything but a quote or a backslash, written quoted.
        r#"[^"\\]{0,8}"#,
    ]
}

fn arb_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        arb_key().prop_map(Step::Key),
        (0usize..1000).prop_map(Step::Index),
        Just(Step::Wildcard),
    ]
}

/// A key as Qdrant writes it in a path: bare when it can be, quoted otherwise.
fn spelled(key: &str) -> String {
    if is_plain_key(key) {
        key.to_owned()
    } else {
        format!("\"{key}\"")
    }
}

proptest! {
    #[test]
    fn any_text_is_read_or_refused_without_panicking(
        text in prop_oneof!["\\PC{0,40}", r#"[a-z_.\[\]"\\0-9 ]{0,40}"#]
    ) {
        match parse(&text) {
            Ok(path) => prop_assert_eq!(first_segment(&text), Ok(path.first)),
            Err(e) => prop_assert!(text.is_char_boundary(e.at) && e.at < text.len().max(1)),
        }
    }

    #[test]
    fn a_path_written_as_qdrant_writes_it_is_read_back(
        first in arb_key(),
        quoted in any::<bool>(),
        steps in proptest::collection::vec(arb_step(), 0..5),
    ) {
        let mut text = if quoted { format!("\"{first}\"") } else { spelled(&first) };
        for step in &steps {
            match step {
                Step::Key(k) => {
                    text.push('.');
                    text.push_str(&spelled(k));
                }
                Step::Index(i) => text.push_str(&format!("[{i}]")),
                Step::Wildcard => text.push_str("[]"),
            }
        }
        let rest: Vec<Item<'_>> = steps
            .iter()
            .map(|s| match s {
                Step::Key(k) => Item::Key(k.as_str()),
                Step::Index(i) => Item::Index(*i),
                Step::Wildcard => Item::Wildcard,
            })
            .collect();
        prop_assert_eq!(parse(&text), Ok(Path { first: first.as_str(), rest }));
    }
}
