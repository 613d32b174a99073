use super::*;

/// Filters as clients write them, and as Lethe writes them again.
#[test]
fn the_documented_forms_parse_and_are_written_again_unambiguously() {
    let cases: &[(&str, &str)] = &[
        ("rating gt 4", "rating gt 4"),
        ("Rating ge 3.5e1", "Rating ge 3.5e1"),
        ("category eq 'travel'", "category eq 'travel'"),
        ("name eq 'O''Brien'", "name eq 'O''Brien'"),
        ("4 lt rating", "4 lt rating"),
        (
            "lastRenovationDate lt 2024-01-01T00:00:00Z",
            "lastRenovationDate lt 2024-01-01T00:00:00Z",
        ),
        (
            "ts ge 2024-01-01T00:00:00.123+02:00",
            "ts ge 2024-01-01T00:00:00.123+02:00",
        ),
        (
            "score ne NaN and score lt INF and score gt -INF",
            "((score ne NaN) and (score lt INF)) and (score gt -INF)",
        ),
        ("parking eq true", "parking eq true"),
        ("parking", "parking"),
        ("not parking", "not (parking)"),
        (
            "a eq 1 or b eq 2 and c eq 3",
            "(a eq 1) or ((b eq 2) and (c eq 3))",
        ),
        (
            "(a eq 1 or b eq 2) and c eq 3",
            "((a eq 1) or (b eq 2)) and (c eq 3)",
        ),
        (
            "not (a eq 1) and b eq null",
            "(not (a eq 1)) and (b eq null)",
        ),
        ("address/city eq 'Lyon'", "address/city eq 'Lyon'"),
        ("tags/any()", "tags/any()"),
        ("tags/any(t: t eq 'wifi')", "tags/any(t: t eq 'wifi')"),
        (
            "rooms/all(r: r/price lt 100 and r/smoking eq false)",
            "rooms/all(r: (r/price lt 100) and (r/smoking eq false))",
        ),
        (
            "search.in(category, 'a,b,c')",
            "search.in(category, 'a,b,c')",
        ),
        (
            "search.in(category, 'a|b', '|')",
            "search.in(category, 'a|b', '|')",
        ),
        ("search.ismatch('wifi')", "search.ismatch('wifi')"),
        (
            "search.ismatchscoring('wifi', 'description', 'full', 'any')",
            "search.ismatchscoring('wifi', 'description', 'full', 'any')",
        ),
        (
            "geo.distance(location, geography'POINT(-122.1 47.6)') le 10",
            "geo.distance(location, geography'POINT(-122.1 47.6)') le 10",
        ),
        (
            "geo.intersects(location, geography'POLYGON((0 0, 1 0, 1 1, 0 0))')",
            "geo.intersects(location, geography'POLYGON((0 0, 1 0, 1 1, 0 0))')",
        ),
    ];
    for (written, expected) in cases {
        let parsed = parse(written).unwrap_or_else(|e| panic!("{written}: {e}"));
        let again = parsed.to_string();
        assert_eq!(again, *expected, "{written}");
        assert_eq!(
            parse(&again).as_ref(),
            Ok(&parsed),
            "{written}: written again, read the same"
        );
    }
}

#[test]
fn what_does_not_parse_is_refused() {
    for refused in [
        "",
        "rating gt",
        "(rating gt 4",
        "rating gt 4)",
        "rating gt 4) or (true",
        "category eq 'travel",
        "category eq 'it''s",
        "category eq \"travel\"",
        "rating gt 4 or",
        "rating gt 4 xor b eq 1",
        "1 eq 1",
        "'a' eq 'a'",
        "true or",
        "search.ismatch()",
        "search.in('a', 'b')",
        "search.in(category)",
        "search.nope('x')",
        "geo.distance(location, 'POINT(0 0)') le 1",
        "tags/any(t t eq 'x')",
        "tags/all()",
        "rating gt 4; drop",
        "rating gt 12abc",
        "rating gt 2024-13-01T00:00:00Z",
        "a eq 1 and",
        "eq eq 1",
        "rating gt 4 $and",
        "not rating gt 5",
        "rating gt null",
    ] {
        assert!(parse(refused).is_err(), "{refused:?} was taken");
    }
    let deep = format!(
        "{}a eq 1{}",
        "(".repeat(MAX_DEPTH + 1),
        ")".repeat(MAX_DEPTH + 1)
    );
    assert!(parse(&deep).is_err(), "nested too deep");
    let nots = format!("{}a", "not ".repeat(MAX_DEPTH + 1));
    assert!(parse(&nots).is_err());
    assert!(
        parse(&"a eq 1 or ".repeat(MAX_LEN / 8)).is_err(),
        "too long"
    );
}

#[test]
fn every_field_a_filter_reads_is_named_lambda_variables_resolved() {
    let cases: &[(&str, &[&str])] = &[
        ("rating gt 4 and not parking", &["parking", "rating"]),
        ("rooms/any(r: r/price lt 100)", &["rooms", "rooms/price"]),
        ("tags/all(t: search.in(t, 'a,b'))", &["tags"]),
        (
            "search.ismatch('acme', 'lethe_tenant, description')",
            &["description", "lethe_tenant"],
        ),
        ("search.ismatch('x')", &[]),
        (
            "geo.distance(location, geography'POINT(0 0)') le 5",
            &["location"],
        ),
        ("address/city eq 'Lyon'", &["address/city"]),
    ];
    for (written, fields) in cases {
        assert_eq!(parse(written).unwrap().fields(), *fields, "{written}");
    }
}

proptest::proptest! {
    /// Whatever a client sends: it is refused, or what Lethe writes again reads back the same,
    /// so Lethe and the service agree on its meaning (and nothing panics).
    #[test]
    fn anything_parsed_is_written_again_to_the_same_filter(
        parts in proptest::collection::vec(proptest::sample::select(vec![
            "a", "b/c", "eq", "ne", "lt", "and", "or", "not", "(", ")", "'x'", "'it''s'", "'", "1",
            "-2.5", "true", "null", "tags/any(t: t eq 'x')", "search.in(a, 'x,y')", ",", ":", "/",
            "search.ismatch('q', 'a')", "geography'POINT(0 0)'", "geo.distance(l, geography'POINT(0 0)')",
        ]), 1..12),
    ) {
        let text = parts.join(" ");
        if let Ok(parsed) = parse(&text) {
            let again = parsed.to_string();
            proptest::prop_assert_eq!(parse(&again), Ok(parsed), "{} -> {}", text, again);
        }
    }
}
