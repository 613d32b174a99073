//! Console sessions, on both backends: ended one by one, or every session of one person at once.

use super::*;

on_both_backends!(every_session_of_a_person_ends_together_and_no_one_elses);

fn session(id: &str, actor: &str) -> ConsoleSession {
    let now = crate::now();
    ConsoleSession {
        id_hash: id.to_owned(),
        actor: actor.to_owned(),
        claims: "{}".to_owned(),
        csrf: format!("csrf-{id}"),
        created_at: now,
        last_seen_at: now,
        expires_at: now + chrono::TimeDelta::hours(1),
    }
}

/// A person signed out at their provider: both their sessions end, another person's, an old
/// session without an actor, and one begun after the sign-out stay.
async fn every_session_of_a_person_ends_together_and_no_one_elses(store: &Arc<dyn Store>) {
    let alice = "https://idp.example#alice";
    for (id, actor) in [
        ("a1", alice),
        ("a2", alice),
        ("b1", "https://idp.example#bob"),
        ("old", ""),
    ] {
        store.create_session(&session(id, actor)).await.unwrap();
    }
    assert_eq!(store.session("a1").await.unwrap().unwrap().actor, alice);
    let signed_out = crate::now() + chrono::TimeDelta::seconds(1);
    let mut later = session("a3", alice);
    later.created_at = signed_out + chrono::TimeDelta::seconds(1);
    store.create_session(&later).await.unwrap();
    let keep = signed_out + chrono::TimeDelta::minutes(6);
    let out = |actor, jti| {
        let audit = crate::testing::audit("console.sign_out", None);
        store.signed_out_by_provider(actor, signed_out, jti, keep, audit)
    };
    assert_eq!(out(alice, "jti-1").await.unwrap(), Some(2));
    assert_eq!(out("", "jti-2").await.unwrap(), Some(0));
    for (id, kept) in [
        ("a1", false),
        ("a2", false),
        ("a3", true),
        ("b1", true),
        ("old", true),
    ] {
        assert_eq!(store.session(id).await.unwrap().is_some(), kept, "{id}");
    }
    // The same token again, after Alice signed in anew: taken already, it ends nothing.
    store.create_session(&session("a4", alice)).await.unwrap();
    assert_eq!(out(alice, "jti-1").await.unwrap(), None);
    assert!(store.session("a4").await.unwrap().is_some());
}
