//! The erasure progression rules, as readable cases (`erasure_progress.toml`).

use std::collections::BTreeSet;

use lethe_policy::erasure::{ErasureEvent, ErasureState};
use lethe_policy::progress::{JobState, Verification, progress};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    rule: String,
    state: ErasureState,
    jobs: std::collections::BTreeMap<String, JobState>,
    unverified: BTreeSet<String>,
    #[serde(default)]
    undecided: usize,
    events: Vec<ErasureEvent>,
    then: ErasureState,
    #[serde(default)]
    audit: Vec<String>,
    #[serde(default)]
    rerun: Vec<String>,
}

#[derive(Deserialize)]
struct Cases {
    case: Vec<Case>,
}

#[test]
fn every_case_of_the_rules_holds() {
    let text = include_str!("erasure_progress.toml");
    let cases: Cases = toml::from_str(text).unwrap();
    assert!(cases.case.len() >= 9);
    for case in cases.case {
        let jobs: Vec<(String, JobState)> = case.jobs.into_iter().collect();
        let found = Verification {
            unverified: case.unverified,
            undecided: case.undecided,
        };
        let next =
            progress(case.state, &jobs, &found).unwrap_or_else(|e| panic!("{}: {e}", case.rule));
        assert_eq!(next.events, case.events, "{}", case.rule);
        assert_eq!(next.state, case.then, "{}", case.rule);
        assert_eq!(next.audit, case.audit, "{}", case.rule);
        assert_eq!(next.rerun, case.rerun, "{}", case.rule);
    }
}
