use std::collections::BTreeSet;

use super::*;
use crate::consent::ConsentGrant;
use crate::retention::{PurposeEnd, RetentionRule};
use crate::subject::SubjectStatus;
use chrono::{TimeDelta, TimeZone};
use proptest::prelude::*;

fn day(d: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, d, 0, 0, 0).unwrap()
}

fn grant(
    subject: &str,
    purpose: &str,
    actions: &[Action],
    expires: Option<u32>,
    revoked: Option<u32>,
) -> ConsentGrant {
    ConsentGrant {
        id: format!("{subject}-{purpose}"),
        tenant: "acme".into(),
        subject: subject.into(),
        purpose: purpose.into(),
        category: "preference".into(),
        actions: actions.iter().copied().collect(),
        granted_at: day(1),
        expires_at: expires.map(day),
        revoked_at: revoked.map(day),
        policy_version: 1,
        source: "test".into(),
    }
}

fn rule(purpose: &str, layer: Option<Layer>, age: &str) -> RetentionRule {
    RetentionRule {
        purpose: purpose.into(),
        category: "preference".into(),
        layer,
        max_age: age.parse().unwrap(),
        legal_end: None,
    }
}

/// alice: active, full consent. bob: suppressed. carol: active in epoch 2, consent ends on day 10.
/// dave: consent revoked on day 2. erin: may store but not retrieve.
fn fixture() -> PolicySnapshot {
    use Action::*;
    let subject = |status, epoch, grants| SubjectPolicy {
        state: SubjectState { status, epoch },
        grants,
    };
    let subjects = BTreeMap::from([
        (
            "alice".to_owned(),
            subject(
                SubjectStatus::Active,
                0,
                vec![
                    grant("alice", "personalization", &[Store, Retrieve], None, None),
                    grant("alice", "campaign", &[Store, Retrieve], None, None),
                ],
            ),
        ),
        (
            "bob".to_owned(),
            subject(
                SubjectStatus::Suppressed,
                1,
                vec![grant(
                    "bob",
                    "personalization",
                    &[Store, Retrieve],
                    None,
                    None,
                )],
            ),
        ),
        (
            "carol".to_owned(),
            subject(
                SubjectStatus::Active,
                2,
                vec![grant(
                    "carol",
                    "personalization",
                    &[Store, Retrieve],
                    Some(10),
                    None,
                )],
            ),
        ),
        (
            "dave".to_owned(),
            subject(
                SubjectStatus::Active,
                0,
                vec![grant(
                    "dave",
                    "personalization",
                    &[Store, Retrieve],
                    None,
                    Some(2),
                )],
            ),
        ),
        (
            "erin".to_owned(),
            subject(
                SubjectStatus::Active,
                0,
                vec![grant("erin", "personalization", &[Store], None, None)],
            ),
        ),
    ]);
    let retention = RetentionPolicy {
        rules: vec![
            rule("personalization", None, "30d"),
            rule("personalization", Some(Layer::Cache), "1d"),
            rule("campaign", None, "30d"),
        ],
        purpose_ends: vec![PurposeEnd {
            purpose: "campaign".into(),
            ends_at: day(5),
        }],
    };
    PolicySnapshot {
        subjects: BTreeMap::from([("acme".to_owned(), subjects)]),
        retention: BTreeMap::from([("acme".to_owned(), retention)]),
        hidden: BTreeSet::new(),
    }
}

fn write(
    tenant: &'static str,
    subject: &'static str,
    purpose: &'static str,
    layer: Layer,
) -> WriteFacts<'static> {
    WriteFacts {
        tenant,
        subject,
        purpose,
        category: "preference",
        layer,
        action: Action::Store,
        authorised_epoch: None,
        requested_expires_at: None,
    }
}

#[test]
fn write_decisions() {
    use Layer::*;
    let now = day(3);
    let plus = |d: i64| Ok(now + TimeDelta::days(d));
    // (case, facts, expected expiry or refusal)
    type Case = (
        &'static str,
        WriteFacts<'static>,
        Result<DateTime<Utc>, Refusal>,
    );
    let cases: Vec<Case> = vec![
        (
            "consented raw write lives 30 days",
            write("acme", "alice", "personalization", Raw),
            plus(30),
        ),
        (
            "cache layer has its own rule",
            write("acme", "alice", "personalization", Cache),
            plus(1),
        ),
        (
            "purpose end caps retention",
            write("acme", "alice", "campaign", Raw),
            Ok(day(5)),
        ),
        (
            "consent end caps retention",
            write("acme", "carol", "personalization", Raw),
            Ok(day(10)),
        ),
        (
            "client may shorten",
            WriteFacts {
                requested_expires_at: Some(day(4)),
                ..write("acme", "alice", "personalization", Raw)
            },
            Ok(day(4)),
        ),
        (
            "client may not lengthen",
            WriteFacts {
                requested_expires_at: Some(now + TimeDelta::days(40)),
                ..write("acme", "alice", "personalization", Raw)
            },
            plus(30),
        ),
        (
            "client asking for the past gets nothing",
            WriteFacts {
                requested_expires_at: Some(day(2)),
                ..write("acme", "alice", "personalization", Raw)
            },
            Err(Refusal::Expired),
        ),
        (
            "suppressed subject",
            write("acme", "bob", "personalization", Raw),
            Err(Refusal::SubjectSuppressed),
        ),
        (
            "revoked consent",
            write("acme", "dave", "personalization", Raw),
            Err(Refusal::ConsentRequired),
        ),
        (
            "unknown subject has no consent",
            write("acme", "zed", "personalization", Raw),
            Err(Refusal::ConsentRequired),
        ),
        (
            "other purpose",
            write("acme", "alice", "training", Raw),
            Err(Refusal::ConsentRequired),
        ),
        (
            "other tenant knows nobody",
            write("globex", "alice", "personalization", Raw),
            Err(Refusal::ConsentRequired),
        ),
        (
            "wrong action",
            WriteFacts {
                action: Action::Train,
                ..write("acme", "alice", "personalization", Raw)
            },
            Err(Refusal::ConsentRequired),
        ),
        (
            "stale epoch",
            WriteFacts {
                authorised_epoch: Some(1),
                ..write("acme", "carol", "personalization", Raw)
            },
            Err(Refusal::StaleEpoch),
        ),
        (
            "current epoch",
            WriteFacts {
                authorised_epoch: Some(2),
                ..write("acme", "carol", "personalization", Raw)
            },
            Ok(day(10)),
        ),
    ];
    let view = fixture();
    for (case, facts, expected) in cases {
        let decided = decide_write(&view, &facts, now).map(|stamp| stamp.expires_at);
        assert_eq!(decided, expected, "{case}");
    }
}

#[test]
fn a_write_without_a_retention_rule_is_refused() {
    let mut view = fixture();
    view.retention.clear();
    let decided = decide_write(
        &view,
        &write("acme", "alice", "personalization", Layer::Raw),
        day(3),
    );
    assert_eq!(decided, Err(Refusal::NoRetentionRule));
}

#[test]
fn the_stamp_names_everything_a_purge_needs() {
    let stamp = decide_write(
        &fixture(),
        &write("acme", "carol", "personalization", Layer::Derived),
        day(3),
    )
    .unwrap();
    assert_eq!(
        stamp,
        Stamp {
            tenant: "acme".into(),
            subject: "carol".into(),
            purpose: "personalization".into(),
            category: "preference".into(),
            layer: Layer::Derived,
            expires_at: day(10),
            epoch: 2,
        }
    );
}

fn stamp(subject: &str, purpose: &str, expires: u32, epoch: i64) -> Stamp {
    Stamp {
        tenant: "acme".into(),
        subject: subject.into(),
        purpose: purpose.into(),
        category: "preference".into(),
        layer: Layer::Raw,
        expires_at: day(expires),
        epoch,
    }
}

#[test]
fn provider_decisions() {
    use Action::*;
    let mut view = fixture();
    let grant_of = |actions: &[Action]| grant("carol", "support", actions, None, None);
    let subjects = view.subjects.get_mut("acme").unwrap();
    for (who, actions) in [
        ("carol", vec![SendToProvider]),
        ("dan", vec![SendToProvider, ProviderRetention, Train]),
        ("erin", vec![Store, Retrieve]),
    ] {
        let mut g = grant_of(&actions);
        g.subject = who.into();
        subjects.insert(
            who.into(),
            SubjectPolicy {
                state: SubjectState::default(),
                grants: vec![g],
            },
        );
    }
    let decide =
        |s: &str, purpose: &str| decide_provider(&view, "acme", s, purpose, "preference", day(5));
    let no_keeping = ProviderGrant {
        epoch: 0,
        retention: false,
        train: false,
    };
    assert_eq!(decide("carol", "support"), Ok(no_keeping));
    assert_eq!(
        decide("dan", "support"),
        Ok(ProviderGrant {
            epoch: 0,
            retention: true,
            train: true
        })
    );
    assert_eq!(decide("carol", "marketing"), Err(Refusal::ConsentRequired));
    assert_eq!(decide("erin", "support"), Err(Refusal::ConsentRequired));
    assert_eq!(decide("nobody", "support"), Err(Refusal::ConsentRequired));
    assert_eq!(
        decide("bob", "personalization"),
        Err(Refusal::SubjectSuppressed)
    );
}

#[test]
fn a_write_stays_current_only_while_its_subject_and_epoch_do() {
    let view = fixture();
    let cases = [
        (stamp("alice", "personalization", 9, 0), Ok(())),
        (
            stamp("alice", "personalization", 9, 1),
            Err(Refusal::StaleEpoch),
        ),
        (
            stamp("bob", "personalization", 9, 1),
            Err(Refusal::SubjectSuppressed),
        ),
        // A subject Lethe never heard of is active in epoch 0.
        (stamp("nobody", "personalization", 9, 0), Ok(())),
    ];
    for (stamp, want) in cases {
        assert_eq!(still_current(&view, &stamp), want, "{}", stamp.subject);
    }
}

#[test]
fn an_item_a_closure_hides_is_not_read_in_that_store_only() {
    let mut view = fixture();
    view.hidden.insert((
        "acme".into(),
        "chroma".into(),
        "memories".into(),
        "m1".into(),
    ));
    let ctx = ReadContext {
        tenant: "acme",
        store: "chroma",
        bound_subject: None,
        purpose: None,
    };
    let alice = stamp("alice", "personalization", 20, 0);
    let read = |ctx: &ReadContext<'_>, collection, id, stamp: Option<&Stamp>| {
        decide_read_item(&view, ctx, collection, id, stamp, day(3))
    };
    assert_eq!(
        read(&ctx, "memories", "m1", Some(&alice)),
        Err(Refusal::SubjectSuppressed)
    );
    assert_eq!(read(&ctx, "memories", "m2", Some(&alice)), Ok(()));
    assert_eq!(read(&ctx, "notes", "m1", Some(&alice)), Ok(()));
    let qdrant = ReadContext {
        store: "qdrant",
        ..ctx
    };
    assert_eq!(read(&qdrant, "memories", "m1", Some(&alice)), Ok(()));
    // The stamp decides first: an unstamped item stays unstamped.
    assert_eq!(
        read(&ctx, "memories", "m1", None),
        Err(Refusal::UnstampedItem)
    );
}

#[test]
fn read_decisions() {
    let all = ReadContext {
        tenant: "acme",
        store: "chroma",
        bound_subject: None,
        purpose: None,
    };
    let now = day(3);
    // (case, reader, stamp, expected)
    type Case = (
        &'static str,
        ReadContext<'static>,
        Option<Stamp>,
        Result<(), Refusal>,
    );
    let cases: Vec<Case> = vec![
        (
            "consented, current, unexpired",
            all,
            Some(stamp("alice", "personalization", 20, 0)),
            Ok(()),
        ),
        ("unstamped", all, None, Err(Refusal::UnstampedItem)),
        (
            "suppressed subject",
            all,
            Some(stamp("bob", "personalization", 20, 1)),
            Err(Refusal::SubjectSuppressed),
        ),
        (
            "suppressed subject, old epoch",
            all,
            Some(stamp("bob", "personalization", 20, 0)),
            Err(Refusal::SubjectSuppressed),
        ),
        (
            "written before the last suppression",
            all,
            Some(stamp("carol", "personalization", 9, 1)),
            Err(Refusal::StaleEpoch),
        ),
        (
            "expired",
            all,
            Some(stamp("alice", "personalization", 3, 0)),
            Err(Refusal::Expired),
        ),
        (
            "consent revoked since",
            all,
            Some(stamp("dave", "personalization", 20, 0)),
            Err(Refusal::ConsentRequired),
        ),
        (
            "may store but not retrieve",
            all,
            Some(stamp("erin", "personalization", 20, 0)),
            Err(Refusal::ConsentRequired),
        ),
        (
            "other tenant",
            ReadContext {
                tenant: "globex",
                ..all
            },
            Some(stamp("alice", "personalization", 20, 0)),
            Err(Refusal::ScopeViolation),
        ),
        (
            "token bound to someone else",
            ReadContext {
                bound_subject: Some("carol"),
                ..all
            },
            Some(stamp("alice", "personalization", 20, 0)),
            Err(Refusal::ScopeViolation),
        ),
        (
            "token bound to this subject",
            ReadContext {
                bound_subject: Some("alice"),
                ..all
            },
            Some(stamp("alice", "personalization", 20, 0)),
            Ok(()),
        ),
        (
            "declared another purpose",
            ReadContext {
                purpose: Some("campaign"),
                ..all
            },
            Some(stamp("alice", "personalization", 20, 0)),
            Err(Refusal::ScopeViolation),
        ),
    ];
    let view = fixture();
    for (case, ctx, stamp, expected) in cases {
        assert_eq!(
            decide_read(&view, &ctx, stamp.as_ref(), now),
            expected,
            "{case}"
        );
    }
}

#[test]
fn refusal_codes_are_stable() {
    let codes = [
        (Refusal::ScopeViolation, "scope_violation"),
        (Refusal::SubjectSuppressed, "subject_suppressed"),
        (Refusal::StaleEpoch, "stale_epoch"),
        (Refusal::ConsentRequired, "consent_required"),
        (Refusal::NoRetentionRule, "no_retention_rule"),
        (Refusal::Expired, "expired"),
        (Refusal::UnstampedItem, "unstamped_item"),
    ];
    for (refusal, code) in codes {
        assert_eq!(refusal.code(), code);
    }
}

// ---- properties over arbitrary policies ----

fn any_status() -> impl Strategy<Value = SubjectStatus> {
    prop_oneof![
        Just(SubjectStatus::Active),
        Just(SubjectStatus::Suppressed),
        Just(SubjectStatus::Erased)
    ]
}

fn any_action() -> impl Strategy<Value = Action> {
    proptest::sample::select(Action::ALL.to_vec())
}

const SUBJECTS: [&str; 3] = ["s1", "s2", "s3"];
const PURPOSES: [&str; 2] = ["personalization", "training"];

fn any_grant() -> impl Strategy<Value = ConsentGrant> {
    (
        proptest::sample::select(PURPOSES.to_vec()),
        proptest::collection::btree_set(any_action(), 0..4),
        0u32..20,
        proptest::option::of(1u32..28),
        proptest::option::of(1u32..28),
    )
        .prop_map(
            |(purpose, actions, granted, expires, revoked)| ConsentGrant {
                id: "g".into(),
                tenant: "acme".into(),
                subject: "any".into(),
                purpose: purpose.into(),
                category: "preference".into(),
                actions,
                granted_at: day(1) + TimeDelta::hours(granted.into()),
                expires_at: expires.map(day),
                revoked_at: revoked.map(day),
                policy_version: 1,
                source: "prop".into(),
            },
        )
}

fn any_snapshot() -> impl Strategy<Value = PolicySnapshot> {
    let subject = (
        any_status(),
        0i64..3,
        proptest::collection::vec(any_grant(), 0..4),
    )
        .prop_map(|(status, epoch, grants)| SubjectPolicy {
            state: SubjectState { status, epoch },
            grants,
        });
    (
        proptest::collection::vec(subject, 3),
        1i64..40 * 86_400,
        proptest::option::of(1u32..28),
    )
        .prop_map(|(policies, age, purpose_end)| {
            let retention = RetentionPolicy {
                rules: PURPOSES
                    .iter()
                    .map(|p| RetentionRule {
                        purpose: (*p).into(),
                        category: "preference".into(),
                        layer: None,
                        max_age: crate::retention::MaxAge::from_seconds(age).unwrap(),
                        legal_end: None,
                    })
                    .collect(),
                purpose_ends: purpose_end
                    .map(|d| PurposeEnd {
                        purpose: "personalization".into(),
                        ends_at: day(d),
                    })
                    .into_iter()
                    .collect(),
            };
            PolicySnapshot {
                subjects: BTreeMap::from([(
                    "acme".to_owned(),
                    SUBJECTS
                        .iter()
                        .map(|s| (*s).to_owned())
                        .zip(policies)
                        .collect(),
                )]),
                retention: BTreeMap::from([("acme".to_owned(), retention)]),
                hidden: BTreeSet::new(),
            }
        })
}

fn any_stamp() -> impl Strategy<Value = Stamp> {
    (
        proptest::sample::select(SUBJECTS.to_vec()),
        proptest::sample::select(PURPOSES.to_vec()),
        1u32..28,
        0i64..3,
    )
        .prop_map(|(subject, purpose, expires, epoch)| stamp(subject, purpose, expires, epoch))
}

proptest! {
    #[test]
    fn a_suppressed_or_erased_subject_is_never_read(
        view in any_snapshot(),
        stamp in any_stamp(),
        now_day in 1u32..28,
        bound in proptest::option::of(proptest::sample::select(SUBJECTS.to_vec())),
    ) {
        let ctx = ReadContext { tenant: "acme", store: "chroma", bound_subject: bound, purpose: None };
        let decided = decide_read(&view, &ctx, Some(&stamp), day(now_day));
        let policy = view.subject("acme", &stamp.subject).unwrap();
        if !policy.state.is_active() {
            prop_assert!(decided.is_err());
        }
        if decided.is_ok() {
            prop_assert!(policy.state.is_active());
            prop_assert_eq!(stamp.epoch, policy.state.epoch);
            prop_assert!(stamp.expires_at > day(now_day));
            prop_assert!(policy.grants.iter().any(|g| g.covers(&stamp.purpose, &stamp.category, Action::Retrieve, day(now_day))));
            prop_assert!(bound.is_none_or(|b| b == stamp.subject));
        }
    }

    #[test]
    fn an_allowed_write_is_consented_current_and_bounded(
        view in any_snapshot(),
        subject in proptest::sample::select(SUBJECTS.to_vec()),
        purpose in proptest::sample::select(PURPOSES.to_vec()),
        action in any_action(),
        now_day in 1u32..28,
        requested in proptest::option::of(1u32..28),
    ) {
        let now = day(now_day);
        let facts = WriteFacts {
            tenant: "acme", subject, purpose, category: "preference", layer: Layer::Raw, action,
            authorised_epoch: None, requested_expires_at: requested.map(day),
        };
        let policy = view.subject("acme", subject).unwrap();
        match decide_write(&view, &facts, now) {
            Ok(stamp) => {
                prop_assert!(policy.state.is_active());
                prop_assert_eq!(stamp.epoch, policy.state.epoch);
                prop_assert!(stamp.expires_at > now);
                let rule = view.retention("acme").unwrap().rule_for(purpose, "preference", Layer::Raw).unwrap();
                prop_assert!(stamp.expires_at <= now + rule.max_age.as_delta());
                prop_assert!(requested.is_none_or(|r| stamp.expires_at <= day(r)));
                let covering: Vec<_> = policy.grants.iter().filter(|g| g.covers(purpose, "preference", action, now)).collect();
                prop_assert!(!covering.is_empty());
                if covering.iter().all(|g| g.expires_at.is_some()) {
                    prop_assert!(covering.iter().any(|g| g.expires_at.is_some_and(|e| stamp.expires_at <= e)));
                }
            }
            Err(_) if !policy.state.is_active() => {}
            Err(refusal) => prop_assert_ne!(refusal, Refusal::SubjectSuppressed),
        }
    }

    #[test]
    fn a_suppressed_subject_never_gets_a_write(
        view in any_snapshot(),
        subject in proptest::sample::select(SUBJECTS.to_vec()),
        now_day in 1u32..28,
    ) {
        let facts = WriteFacts { subject, ..write("acme", "s1", "personalization", Layer::Raw) };
        if !view.subject("acme", subject).unwrap().state.is_active() {
            prop_assert_eq!(decide_write(&view, &facts, day(now_day)), Err(Refusal::SubjectSuppressed));
        }
    }
}

#[test]
fn writes_over_what_the_store_holds() {
    use Overwrite::*;
    let now = day(3);
    let alice = write("acme", "alice", "personalization", Layer::Raw);
    let own = stamp("alice", "personalization", 20, 0);
    let own_soon = stamp("alice", "personalization", 5, 0);
    let own_expired = stamp("alice", "personalization", 3, 0);
    let own_old_epoch = stamp("alice", "personalization", 20, 1);
    let own_other_purpose = stamp("alice", "campaign", 20, 0);
    let carols = stamp("carol", "personalization", 20, 2);
    let globex = Stamp {
        tenant: "globex".into(),
        ..own.clone()
    };
    // (case, what the store holds, how the write treats it, the stamp's expiry or refusal;
    // Ok(None): nothing is written)
    type Case<'a> = (
        &'static str,
        Held<'a>,
        Overwrite,
        Result<Option<DateTime<Utc>>, Refusal>,
    );
    let cases: Vec<Case<'_>> = vec![
        (
            "add of a free id",
            Held::Nothing,
            Never,
            Ok(Some(day(3) + TimeDelta::days(30))),
        ),
        (
            "upsert of a free id creates it",
            Held::Nothing,
            Allowed,
            Ok(Some(day(3) + TimeDelta::days(30))),
        ),
        (
            "update of a free id claims nothing",
            Held::Nothing,
            Only,
            Ok(None),
        ),
        (
            "add never overwrites its own item",
            Held::Stamped(&own),
            Never,
            Err(Refusal::AlreadyExists),
        ),
        (
            "add over another tenant's item",
            Held::Stamped(&globex),
            Never,
            Err(Refusal::AlreadyExists),
        ),
        (
            "add over an unstamped item",
            Held::Unstamped,
            Never,
            Err(Refusal::AlreadyExists),
        ),
        (
            "update of an unstamped item claims nothing",
            Held::Unstamped,
            Only,
            Err(Refusal::UnstampedItem),
        ),
        (
            "upsert of an unstamped item claims nothing",
            Held::Unstamped,
            Allowed,
            Err(Refusal::UnstampedItem),
        ),
        (
            "update of another subject's item",
            Held::Stamped(&carols),
            Only,
            Err(Refusal::ScopeViolation),
        ),
        (
            "upsert of another tenant's item",
            Held::Stamped(&globex),
            Allowed,
            Err(Refusal::ScopeViolation),
        ),
        (
            "update may not move an item to another purpose",
            Held::Stamped(&own_other_purpose),
            Only,
            Err(Refusal::ScopeViolation),
        ),
        (
            "update keeps the first write's deadline",
            Held::Stamped(&own),
            Only,
            Ok(Some(day(20))),
        ),
        (
            "upsert keeps the first write's deadline",
            Held::Stamped(&own_soon),
            Allowed,
            Ok(Some(day(5))),
        ),
        (
            "an expired item is not revived by an update",
            Held::Stamped(&own_expired),
            Only,
            Err(Refusal::Expired),
        ),
        (
            "an expired item is not revived by an upsert",
            Held::Stamped(&own_expired),
            Allowed,
            Err(Refusal::Expired),
        ),
        (
            "an item of an earlier epoch stays dead",
            Held::Stamped(&own_old_epoch),
            Allowed,
            Err(Refusal::StaleEpoch),
        ),
    ];
    let view = fixture();
    for (case, held, overwrite, expected) in cases {
        let decided = decide_write_over(&view, &alice, held, overwrite, now)
            .map(|stamp| stamp.map(|s| s.expires_at));
        assert_eq!(decided, expected, "{case}");
    }
}

#[test]
fn a_write_over_an_item_is_decided_like_any_write() {
    let held = stamp("bob", "personalization", 20, 1);
    let bob = write("acme", "bob", "personalization", Layer::Raw);
    for overwrite in [Overwrite::Allowed, Overwrite::Only] {
        assert_eq!(
            decide_write_over(&fixture(), &bob, Held::Stamped(&held), overwrite, day(3)),
            Err(Refusal::SubjectSuppressed)
        );
        assert_eq!(
            decide_write_over(&fixture(), &bob, Held::Nothing, overwrite, day(3)),
            Err(Refusal::SubjectSuppressed),
            "even a write that would write nothing is refused"
        );
    }
}

proptest! {
    #[test]
    fn a_write_over_an_item_never_extends_it_nor_takes_it(
        view in any_snapshot(),
        held in any_stamp(),
        subject in proptest::sample::select(SUBJECTS.to_vec()),
        purpose in proptest::sample::select(PURPOSES.to_vec()),
        overwrite in proptest::sample::select(vec![Overwrite::Never, Overwrite::Allowed, Overwrite::Only]),
        now_day in 1u32..28,
        requested in proptest::option::of(1u32..28),
    ) {
        let facts = WriteFacts {
            tenant: "acme", subject, purpose, category: "preference", layer: Layer::Raw,
            action: Action::Store, authorised_epoch: None, requested_expires_at: requested.map(day),
        };
        let now = day(now_day);
        if let Ok(Some(stamp)) = decide_write_over(&view, &facts, Held::Stamped(&held), overwrite, now) {
            prop_assert!(overwrite != Overwrite::Never);
            prop_assert_eq!((&stamp.subject, &stamp.purpose), (&held.subject, &held.purpose));
            prop_assert!(stamp.expires_at <= held.expires_at);
            prop_assert!(held.expires_at > now);
            prop_assert_eq!(stamp.epoch, held.epoch);
        }
        prop_assert!(decide_write_over(&view, &facts, Held::Unstamped, overwrite, now).is_err());
    }
}
