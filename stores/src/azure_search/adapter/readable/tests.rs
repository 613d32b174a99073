//! The filter against the decision it stands for: for random subjects' policies (states, epochs,
//! grants revoked, expired or for other actions) and random documents of the scope (any
//! subject, purpose, category, epoch, layer; hidden by a closure or not), a document passes the
//! filter exactly when `decide_read_item` serves it. The filter is read by a small evaluator of
//! the parts it uses, after a round trip through its text (what Azure is sent).

use std::collections::BTreeSet;

use chrono::TimeDelta;
use lethe_policy::{
    ConsentGrant, PolicySnapshot, ReadContext, SubjectPolicy, SubjectState, SubjectStatus,
    decide_read_item,
};
use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::azure_search::adapter::{EXPIRES_AT, TENANT};
use crate::azure_search::odata::{self, Expr};
use crate::kit::fixtures::now;

const SUBJECTS: [&str; 5] = ["alice", "bob", "carol,jr", " dave", "erin"];
const PURPOSES: [&str; 2] = ["personalization", "support"];
const CATEGORIES: [&str; 2] = ["preference", "episode"];

/// The value `operand` names in `doc` (a field) or is (a literal), as JSON.
fn value(operand: &Operand, doc: &Value) -> Value {
    match operand {
        Operand::Field(Path(path)) => doc.get(&path[0]).cloned().unwrap_or(Value::Null),
        Operand::Literal(Literal::Str(s)) => json!(s),
        Operand::Literal(Literal::Number(n)) => json!(n.parse::<i64>().unwrap()),
        Operand::Literal(Literal::Bool(b)) => json!(b),
        Operand::Literal(Literal::Null) => Value::Null,
        other => panic!("not used by the filter: {other:?}"),
    }
}

fn holds(expr: &Expr, doc: &Value) -> bool {
    match expr {
        Expr::Or(a, b) => holds(a, doc) || holds(b, doc),
        Expr::And(a, b) => holds(a, doc) && holds(b, doc),
        Expr::Not(a) => !holds(a, doc),
        Expr::Compare(a, Op::Eq, b) => value(a, doc) == value(b, doc),
        Expr::Call(Function::SearchIn, args) => {
            let (Value::String(held), Value::String(list), Value::String(by)) = (
                value(&args[0], doc),
                value(&args[1], doc),
                value(&args[2], doc),
            ) else {
                return false;
            };
            list.split(by.as_str()).any(|v| v == held)
        }
        Expr::Operand(operand) => value(operand, doc) == json!(true),
        other => panic!("not used by the filter: {other:?}"),
    }
}

fn grant(
    subject: &str,
    purpose: &str,
    category: &str,
    actions: &[Action],
    ended: u8,
) -> ConsentGrant {
    let at = |hours: i64| Some(now() + TimeDelta::hours(hours));
    ConsentGrant {
        id: format!("{subject}-{purpose}-{category}"),
        tenant: "acme".into(),
        subject: subject.into(),
        purpose: purpose.into(),
        category: category.into(),
        actions: actions.iter().copied().collect(),
        granted_at: now() - TimeDelta::days(1),
        expires_at: match ended {
            1 => at(-1),
            2 => at(1),
            _ => None,
        },
        revoked_at: if ended == 3 { at(-2) } else { None },
        policy_version: 1,
        source: "test".into(),
    }
}

fn arb_policy(subject: &'static str) -> impl Strategy<Value = Option<SubjectPolicy>> {
    let grants = proptest::collection::vec((0..2usize, 0..2usize, any::<bool>(), 0..4u8), 0..4);
    let status = prop_oneof![
        4 => Just(SubjectStatus::Active),
        1 => Just(SubjectStatus::Suppressed),
        1 => Just(SubjectStatus::Erased),
    ];
    proptest::option::weighted(0.9, (status, 0..3i64, grants)).prop_map(move |p| {
        let (status, epoch, grants) = p?;
        Some(SubjectPolicy {
            state: SubjectState { status, epoch },
            grants: grants
                .into_iter()
                .map(|(p, c, retrieve, ended)| {
                    let actions = match retrieve {
                        true => &[Action::Store, Action::Retrieve][..],
                        false => &[Action::Store][..],
                    };
                    grant(subject, PURPOSES[p], CATEGORIES[c], actions, ended)
                })
                .collect(),
        })
    })
}

/// A document of the caller's scope (acme's, not past its deadline): key, subject, purpose,
/// category, epoch, layer (`None`: not written).
fn arb_doc() -> impl Strategy<Value = (String, Value)> {
    let layer = prop_oneof![
        Just(None),
        Just(Some("raw")),
        Just(Some("derived")),
        Just(Some("cache")),
        Just(Some("bogus")),
    ];
    (0..1000u32, 0..5usize, 0..2usize, 0..2usize, 0..3i64, layer).prop_map(
        |(key, s, p, c, epoch, layer)| {
            let key = format!("k{key}");
            let mut doc = json!({
                "id": key, TENANT: "acme", SUBJECT: SUBJECTS[s], PURPOSE: PURPOSES[p],
                CATEGORY: CATEGORIES[c], EPOCH: epoch,
                EXPIRES_AT: (now() + TimeDelta::days(1)).to_rfc3339(),
            });
            if let Some(layer) = layer {
                doc[LAYER] = json!(layer);
            }
            (key, doc)
        },
    )
}

fn snapshot(policies: Vec<Option<SubjectPolicy>>, hidden: &BTreeSet<String>) -> PolicySnapshot {
    let mut view = PolicySnapshot::default();
    for (subject, policy) in SUBJECTS.iter().zip(policies) {
        if let Some(policy) = policy {
            view.subjects
                .entry("acme".into())
                .or_default()
                .insert((*subject).into(), policy);
        }
    }
    view.hidden = hidden
        .iter()
        .map(|id| ("acme".into(), "azure".into(), "episodes".into(), id.clone()))
        .collect();
    view
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn a_document_passes_the_filter_exactly_when_the_decision_serves_it(
        policies in (arb_policy(SUBJECTS[0]), arb_policy(SUBJECTS[1]), arb_policy(SUBJECTS[2]),
                     arb_policy(SUBJECTS[3]), arb_policy(SUBJECTS[4])),
        docs in proptest::collection::vec(arb_doc(), 1..40),
        hidden in proptest::collection::btree_set((0..1000u32).prop_map(|k| format!("k{k}")), 0..20),
    ) {
        let (a, b, c, d, e) = policies;
        let view = snapshot(vec![a, b, c, d, e], &hidden);
        let subjects: Vec<String> = SUBJECTS.iter().map(|s| (*s).to_owned()).collect();
        let hidden: Vec<String> = hidden.into_iter().collect();
        let built = readable("acme", &subjects, &view, "id", &hidden, now());
        // What Azure is sent is the text: read back, it is the same filter.
        let sent = odata::parse(&built.to_string()).unwrap();
        prop_assert_eq!(&sent, &built);
        let ctx = ReadContext { tenant: "acme", store: "azure", bound_subject: None, purpose: None };
        for (key, doc) in &docs {
            let stamp = super::super::read_stamp(doc);
            let decided = decide_read_item(&view, &ctx, "episodes", key, stamp.as_ref(), now());
            prop_assert_eq!(holds(&sent, doc), decided.is_ok(), "{} {:?}", doc, decided);
        }
    }
}

#[test]
fn no_subject_with_consent_is_a_filter_nothing_passes() {
    let built = readable("acme", &[], &PolicySnapshot::default(), "id", &[], now());
    assert!(!holds(&built, &json!({"id": "k1"})));
    assert_eq!(odata::parse(&built.to_string()).unwrap(), built);
}

#[test]
fn many_subjects_make_a_shallow_filter_that_writes_and_reads_back() {
    let subjects: Vec<String> = (0..MAX_SUBJECTS).map(|i| format!("s{i}")).collect();
    let mut view = PolicySnapshot::default();
    for (i, subject) in subjects.iter().enumerate() {
        // Every subject with a grant of its own: one clause each, the worst case.
        let policy = SubjectPolicy {
            state: SubjectState::default(),
            grants: vec![grant(
                subject,
                &format!("p{i}"),
                "preference",
                &[Action::Retrieve],
                0,
            )],
        };
        view.subjects
            .entry("acme".into())
            .or_default()
            .insert(subject.clone(), policy);
    }
    let built = readable("acme", &subjects, &view, "id", &[], now());
    assert!(depth(&built) <= 40, "{}", depth(&built));
    assert!(built.to_string().contains("'p9999'"));
    let doc = json!({"id": "k", TENANT: "acme", SUBJECT: "s9999", PURPOSE: "p9999",
                     CATEGORY: "preference", EPOCH: 0});
    assert!(holds(&built, &doc));
    assert!(!holds(
        &built,
        &json!({SUBJECT: "s9999", PURPOSE: "p1", CATEGORY: "preference", EPOCH: 0})
    ));
}

fn depth(expr: &Expr) -> usize {
    match expr {
        Expr::Or(a, b) | Expr::And(a, b) => 1 + depth(a).max(depth(b)),
        Expr::Not(a) => 1 + depth(a),
        _ => 1,
    }
}
