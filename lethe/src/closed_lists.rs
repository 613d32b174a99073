//! The consent actions as the CLI names them, compared with their one source, the policy crate
//! (the control plane's and the governed SQL's lists are checked beside them).

use std::collections::BTreeSet;

use clap::builder::TypedValueParser;
use lethe_policy::Action;

#[test]
fn lethe_consent_grant_offers_the_policy_crates_actions() {
    let cli: BTreeSet<String> = crate::cli::action_parser()
        .possible_values()
        .expect("the CLI lists its values")
        .map(|v| v.get_name().to_owned())
        .collect();
    let actions: BTreeSet<String> = Action::ALL.iter().map(|a| a.as_str().to_owned()).collect();
    assert_eq!(cli, actions);
}
