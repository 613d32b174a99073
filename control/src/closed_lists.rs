//! The closed lists the control plane names: its error codes (in its OpenAPI document, compared
//! with the one enum of codes) and the consent actions (its OpenAPI document and the console's
//! grant form, compared with the policy crate). The CLI's and the governed SQL's lists are
//! checked beside them.

use std::collections::BTreeSet;

use askama::Template;
use lethe_policy::Action;

use crate::error_shape::{Code, Plane};

fn actions() -> BTreeSet<String> {
    Action::ALL.iter().map(|a| a.as_str().to_owned()).collect()
}

#[test]
fn the_openapi_document_names_the_policy_crates_actions() {
    let served: serde_json::Value =
        serde_json::from_str(&crate::ops::SERVED).expect("the served OpenAPI document");
    let openapi: BTreeSet<String> = served["components"]["schemas"]["Action"]["enum"]
        .as_array()
        .expect("an enum of actions")
        .iter()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    assert_eq!(openapi, actions());
}

#[test]
fn the_consoles_grant_form_offers_the_policy_crates_actions() {
    let form = crate::console::ActionBoxes::default()
        .render()
        .expect("the console's action boxes render")
        .replace('"', "'");
    let offered: BTreeSet<String> = form
        .split("value='")
        .skip(1)
        .filter_map(|rest| rest.split('\'').next())
        .map(str::to_owned)
        .collect();
    assert_eq!(offered, actions());
}

#[test]
fn the_openapi_document_names_every_control_plane_code() {
    let doc: serde_json::Value = serde_json::from_str(crate::ops::OPENAPI).unwrap();
    // Lists, not sets: a code named twice, or a value that is no code, fails too.
    let mut named: Vec<&str> =
        doc["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["code"]["enum"]
            .as_array()
            .expect("an enum of codes")
            .iter()
            .map(|c| c.as_str().expect("a code is a string"))
            .collect();
    named.sort_unstable();
    let mut answered: Vec<&str> = Code::ALL
        .iter()
        .filter(|c| c.answered_by(Plane::Control))
        .map(|c| c.as_str())
        .collect();
    answered.sort_unstable();
    assert_eq!(named, answered);
}
