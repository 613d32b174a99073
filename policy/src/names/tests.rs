use proptest::prelude::*;

use super::*;

/// Each spelling, and what it is once canonical (`Err`: refused), as a subject key of a tenant
/// whose keys are case-sensitive, and of one whose keys are not.
#[test]
fn every_spelling_has_one_canonical_form_or_is_refused() {
    type Case = (
        &'static str,
        Result<&'static str, NameError>,
        Result<&'static str, NameError>,
    );
    let cases: &[Case] = &[
        ("carol", Ok("carol"), Ok("carol")),
        ("Carol", Ok("Carol"), Ok("carol")),
        (
            "CAROL@Example.COM",
            Ok("CAROL@Example.COM"),
            Ok("carol@example.com"),
        ),
        // Decomposed (e + combining acute) and precomposed é are one name.
        ("care\u{301}", Ok("car\u{e9}"), Ok("car\u{e9}")),
        ("CARE\u{301}", Ok("CAR\u{c9}"), Ok("car\u{e9}")),
        ("Mary Smith", Ok("Mary Smith"), Ok("mary smith")),
        (
            "carol ",
            Err(NameError::EdgeWhitespace),
            Err(NameError::EdgeWhitespace),
        ),
        (
            " carol",
            Err(NameError::EdgeWhitespace),
            Err(NameError::EdgeWhitespace),
        ),
        (
            "carol\u{a0}",
            Err(NameError::EdgeWhitespace),
            Err(NameError::EdgeWhitespace),
        ),
        (
            "carol\u{3000}",
            Err(NameError::EdgeWhitespace),
            Err(NameError::EdgeWhitespace),
        ),
        (
            "car\u{200b}ol",
            Err(NameError::Invisible),
            Err(NameError::Invisible),
        ),
        (
            "\u{202e}lorac",
            Err(NameError::Invisible),
            Err(NameError::Invisible),
        ),
        (
            "carol\u{2066}",
            Err(NameError::Invisible),
            Err(NameError::Invisible),
        ),
        (
            "ca\u{ad}rol",
            Err(NameError::Invisible),
            Err(NameError::Invisible),
        ),
        (
            "car\u{feff}ol",
            Err(NameError::Invisible),
            Err(NameError::Invisible),
        ),
        (
            "carol\u{e0041}",
            Err(NameError::Invisible),
            Err(NameError::Invisible),
        ),
        (
            "carol\u{fe0f}",
            Err(NameError::Invisible),
            Err(NameError::Invisible),
        ),
        (
            "car\u{115f}ol",
            Err(NameError::Invisible),
            Err(NameError::Invisible),
        ),
        (
            "car\nol",
            Err(NameError::Invisible),
            Err(NameError::Invisible),
        ),
        (
            "carol\u{2028}",
            Err(NameError::Invisible),
            Err(NameError::Invisible),
        ),
        ("", Err(NameError::Empty), Err(NameError::Empty)),
    ];
    for (name, sensitive, insensitive) in cases {
        assert_eq!(
            canonical(name, false).as_deref(),
            sensitive.as_deref(),
            "{name:?}"
        );
        assert_eq!(
            canonical(name, true).as_deref(),
            insensitive.as_deref(),
            "{name:?} folded"
        );
    }
    assert_eq!(canonical(&"a".repeat(200), false).map(|n| n.len()), Ok(200));
    assert_eq!(canonical(&"a".repeat(201), false), Err(NameError::TooLong));
    assert_eq!(canonical_key("acme/u1", false), Err(NameError::Slash));
    assert_eq!(canonical("acme/u1", false).as_deref(), Ok("acme/u1"));
    assert!(matches!(canonical("carol", false), Ok(Cow::Borrowed(_))));
}

#[test]
fn confusable_names_differ_only_in_case_or_whitespace() {
    for (a, b, alike) in [
        ("dpo-a", "DPO-A", true),
        ("dpo-a", "dpo -a", true),
        ("Mary Smith", "marysmith", true),
        ("dpo-a", "dpo-b", false),
        ("dpo-a", "dpo_a", false),
        ("dpo-a", "\u{ff44}\u{ff50}\u{ff4f}-a", true),
        ("office", "o\u{fb03}ce", true),
    ] {
        assert_eq!(confusable(a, b), alike, "{a:?} {b:?}");
    }
}

proptest! {
    /// Whatever the text: no panic, and a canonical name is its own canonical form, carries
    /// nothing invisible and no edge whitespace.
    #[test]
    fn canonical_names_are_fixed_points(text in "\\PC{0,24}|[a-zA-Z\u{300}-\u{36f}\u{200b}-\u{200f} ]{0,12}", fold in any::<bool>()) {
        if let Ok(name) = canonical(&text, fold) {
            let again = canonical(&name, fold);
            prop_assert_eq!(again.as_deref(), Ok(name.as_ref()));
            prop_assert!(!name.chars().any(invisible));
            prop_assert!(!name.starts_with(char::is_whitespace) && !name.ends_with(char::is_whitespace));
            prop_assert!(!name.is_empty() && name.len() <= MAX_NAME_BYTES);
        }
    }
}

/// The ranges the governed databases' check is built from say what the functions above do.
#[test]
fn the_listed_ranges_are_what_the_checks_find() {
    let within =
        |ranges: &[(char, char)], c: char| ranges.iter().any(|&(lo, hi)| (lo..=hi).contains(&c));
    for c in (0..=0x10FFFF).filter_map(char::from_u32) {
        assert_eq!(within(CONTROL, c), c.is_control(), "{c:?}");
        assert_eq!(within(WHITESPACE, c), c.is_whitespace(), "{c:?}");
        assert_eq!(
            within(INVISIBLE, c) || within(CONTROL, c),
            invisible(c),
            "{c:?}"
        );
    }
}
