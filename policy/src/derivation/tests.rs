use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;
use crate::decision::{PolicySnapshot, SubjectPolicy};
use crate::subject::{SubjectState, SubjectStatus};

const SECRET: &[u8] = b"audit-key";

fn words_of(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    words(text, |w| {
        found.push(String::from_utf8_lossy(w).into_owned())
    });
    found
}

#[test]
fn traceparents_are_read_the_w3c_way() {
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let valid = [
        format!("00-{trace}-00f067aa0ba902b7-01"),
        format!("00-{trace}-00f067aa0ba902b7-00"),
        format!("  00-{trace}-00f067aa0ba902b7-01 "),
        // A later version may carry more fields after a dash.
        format!("cc-{trace}-00f067aa0ba902b7-01-what-the-future-adds"),
        format!("01-{trace}-00f067aa0ba902b7-09"),
    ];
    for value in &valid {
        let id = TraceId::from_traceparent(value).unwrap_or_else(|| panic!("{value}"));
        assert_eq!(id.to_hex(), trace, "{value}");
    }
    let invalid = [
        String::new(),
        "garbage".to_owned(),
        format!("ff-{trace}-00f067aa0ba902b7-01"),
        format!("00-{}-00f067aa0ba902b7-01", "0".repeat(32)),
        format!("00-{trace}-0000000000000000-01"),
        format!("00-{}-00f067aa0ba902b7-01", trace.to_uppercase()),
        format!("00-{trace}-00f067aa0ba902b7-01-extra"),
        format!("00-{trace}-00f067aa0ba902b7-0"),
        format!("00_{trace}-00f067aa0ba902b7-01"),
        format!("0g-{trace}-00f067aa0ba902b7-01"),
        format!("00-{}-00f067aa0ba902b7-01", &trace[..31]),
        format!("cc-{trace}-00f067aa0ba902b7-01x"),
    ];
    for value in &invalid {
        assert_eq!(TraceId::from_traceparent(value), None, "{value:?}");
    }
}

#[test]
fn words_are_case_folded_composed_and_cut_at_everything_else() {
    let cases: &[(&str, &[&str])] = &[
        (
            "Hello, WORLD!  it's 2026",
            &["hello", "world", "it", "s", "2026"],
        ),
        ("  \n\t ", &[]),
        ("a--b__c", &["a", "b", "c"]),
        // Composed and decomposed accents, ligatures and full-width letters are one spelling.
        ("Café", &["café"]),
        ("Cafe\u{301}", &["café"]),
        ("ﬁne", &["fine"]),
        ("ＨＥＬＬＯ wörld", &["hello", "wörld"]),
        ("ΣΊΣΥΦΟΣ", &["σίσυφοσ"]),
    ];
    for (text, expected) in cases {
        assert_eq!(words_of(text), *expected, "{text:?}");
    }
}

#[test]
fn a_text_has_one_run_per_window_of_words_and_none_below_the_length() {
    let key = QuoteKey::of_tenant(SECRET, "acme");
    let text = |n: usize| {
        (0..n)
            .map(|i| format!("w{i}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert!(key.fingerprints(&text(11), 12).runs.is_empty());
    assert_eq!(key.fingerprints(&text(12), 12).runs.len(), 1);
    assert_eq!(key.fingerprints(&text(20), 12).runs.len(), 9);
    // The same words, however written, have the same fingerprints.
    let a = key.fingerprints("The Quick brown fox, jumps over the lazy dog!", 4);
    let b = key.fingerprints("the quick  BROWN fox jumps... over the lazy dog", 4);
    assert_eq!(a, b);
    assert_ne!(a.digest, key.fingerprints("the quick brown fox", 4).digest);
}

#[test]
fn another_tenant_fingerprints_the_same_text_otherwise() {
    let text = "alice told the assistant she is allergic to peanuts and prefers green tea";
    let acme = QuoteKey::of_tenant(SECRET, "acme").fingerprints(text, 12);
    let globex = QuoteKey::of_tenant(SECRET, "globex").fingerprints(text, 12);
    let rekeyed = QuoteKey::of_tenant(b"other-key", "acme").fingerprints(text, 12);
    assert_eq!(acme.runs.len(), 2);
    for other in [&globex, &rekeyed] {
        assert!(acme.runs.iter().all(|r| !other.runs.contains(r)));
        assert_ne!(acme.digest, other.digest);
    }
}

fn vocabulary(prefix: &'static str) -> impl Strategy<Value = Vec<String>> {
    proptest::collection::vec(0u32..5000, 0..60)
        .prop_map(move |ids| ids.into_iter().map(|i| format!("{prefix}{i}")).collect())
}

fn shares_a_run(a: &Fingerprints, b: &Fingerprints) -> bool {
    let a: BTreeSet<_> = a.runs.iter().collect();
    b.runs.iter().any(|r| a.contains(r))
}

proptest! {
    /// A text that contains `quote_words` of another's consecutive words, however cased and
    /// punctuated, shares a fingerprint with it; one that shares fewer never does.
    #[test]
    fn a_run_of_enough_words_is_found_and_a_shorter_one_never(
        source in vocabulary("s"),
        before in vocabulary("b"),
        after in vocabulary("a"),
        start in 0usize..60,
        len in 1usize..30,
        quote_words in 4usize..16,
    ) {
        let key = QuoteKey::of_tenant(SECRET, "acme");
        let start = start.min(source.len());
        let end = (start + len).min(source.len());
        let quoted = &source[start..end];
        let written = before
            .iter()
            .map(String::as_str)
            .chain(quoted.iter().map(|w| w.as_str()))
            .chain(after.iter().map(String::as_str))
            .map(|w| if w.len() % 2 == 0 { w.to_uppercase() } else { w.to_owned() })
            .collect::<Vec<_>>()
            .join(", ");
        let source_fp = key.fingerprints(&source.join(" "), quote_words);
        let written_fp = key.fingerprints(&written, quote_words);
        prop_assert_eq!(shares_a_run(&source_fp, &written_fp), quoted.len() >= quote_words);
    }

    /// Any text at all is fingerprinted without a panic, and the same text the same way.
    #[test]
    fn any_text_is_fingerprinted_the_same_way_twice(text in any::<String>(), quote_words in 0usize..80) {
        let key = QuoteKey::of_tenant(SECRET, "acme");
        prop_assert_eq!(key.fingerprints(&text, quote_words), key.fingerprints(&text, quote_words));
    }

    /// Whatever follows the first 55 characters of a version-00 header, and whatever the
    /// header, parsing never panics.
    #[test]
    fn any_header_is_parsed_without_a_panic(value in any::<String>()) {
        let _ = TraceId::from_traceparent(&value);
    }
}

fn item<'a>(store: &'a str, id: &'a str) -> ItemRef<'a> {
    ItemRef {
        store,
        collection: "memories",
        id,
    }
}

#[test]
fn something_derived_from_data_under_erasure_is_refused() {
    let state = |status| SubjectPolicy {
        state: SubjectState { status, epoch: 1 },
        grants: vec![],
    };
    let mut view = PolicySnapshot::default();
    view.subjects.insert(
        "acme".into(),
        BTreeMap::from([
            ("alice".to_owned(), state(SubjectStatus::Suppressed)),
            ("bob".to_owned(), state(SubjectStatus::Active)),
            ("carol".to_owned(), state(SubjectStatus::Erased)),
        ]),
    );
    view.hidden.insert((
        "acme".into(),
        "chroma".into(),
        "memories".into(),
        "bob-summary".into(),
    ));
    let parent = |owner, id, how| Parent {
        item: item("chroma", id),
        owner,
        how,
    };
    let cases = [
        ("nothing to derive from", vec![], Ok(())),
        (
            "an active subject's item",
            vec![parent("bob", "b1", How::Quote)],
            Ok(()),
        ),
        (
            "a subject Lethe never heard of",
            vec![parent("dave", "d1", How::Trace)],
            Ok(()),
        ),
        (
            "a suppressed subject's item, among others",
            vec![
                parent("bob", "b1", How::Quote),
                parent("alice", "a1", How::Trace),
            ],
            Err(Refusal::DerivedFromErased),
        ),
        (
            "an erased subject's item",
            vec![parent("carol", "c1", How::Quote)],
            Err(Refusal::DerivedFromErased),
        ),
        (
            "an active subject's item hidden by a closure",
            vec![parent("bob", "bob-summary", How::Provider)],
            Err(Refusal::DerivedFromErased),
        ),
    ];
    for (case, parents, expected) in cases {
        assert_eq!(
            decide_derivation(&view, "acme", &parents),
            expected,
            "{case}"
        );
        // The same subjects of another tenant are other people.
        assert_eq!(
            decide_derivation(&view, "globex", &parents),
            Ok(()),
            "{case}"
        );
    }
}

#[test]
fn hows_round_trip() {
    for how in How::ALL {
        assert_eq!(How::parse(how.as_str()), Some(how));
    }
    assert_eq!(How::parse("copy"), None);
}
