//! The closed lists Lethe names in more than one place, each compared with its one source.

use lethe_policy::Action;
use std::collections::BTreeSet;

fn actions() -> BTreeSet<String> {
    Action::ALL.iter().map(|a| a.as_str().to_owned()).collect()
}

/// Every quoted word that follows `marker` in `text`.
fn quoted_after(text: &str, marker: &str) -> BTreeSet<String> {
    text.split(marker)
        .skip(1)
        .filter_map(|rest| rest.split('\'').next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn consent_actions_are_the_policy_crates_everywhere_they_are_named() {
    let served: serde_json::Value =
        serde_json::from_str(&crate::control::ops::SERVED).expect("the served OpenAPI document");
    let openapi: BTreeSet<String> = served["components"]["schemas"]["Action"]["enum"]
        .as_array()
        .expect("an enum of actions")
        .iter()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    assert_eq!(openapi, actions(), "the OpenAPI document");

    use askama::Template;
    let form = crate::control::console::ActionBoxes::default()
        .render()
        .expect("the console's action boxes render");
    assert_eq!(
        quoted_after(&form.replace('"', "'"), "value='"),
        actions(),
        "the console's grant form"
    );

    use clap::builder::TypedValueParser;
    let cli: BTreeSet<String> = crate::cli::action_parser()
        .possible_values()
        .expect("the CLI lists its values")
        .map(|v| v.get_name().to_owned())
        .collect();
    assert_eq!(cli, actions(), "lethe consent grant --actions");

    let sql = crate::governed::plan::schema().join("\n");
    let named = quoted_after(&sql, "c.action = '");
    assert!(
        !named.is_empty(),
        "the governed SQL decides on consent actions"
    );
    assert!(
        named.is_subset(&actions()),
        "the governed SQL names {:?}, not all of them actions",
        named.difference(&actions()).collect::<Vec<_>>()
    );
}
