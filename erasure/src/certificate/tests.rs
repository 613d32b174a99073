use super::*;
use lethe_policy::ErasureState;

fn evidence_parts() -> (
    ErasureRecord,
    Vec<PurgeJob>,
    ChainHead,
    BTreeMap<String, MaxAge>,
) {
    let at = DateTime::parse_from_rfc3339("2026-11-29T10:00:00Z")
        .unwrap()
        .with_timezone(&Utc);
    let record = ErasureRecord {
        id: "er_1".into(),
        tenant: "acme".into(),
        subject: "u1".into(),
        aliases: vec!["u1-old".into()],
        ticket: "DSR-1".into(),
        reason: "art. 17".into(),
        state: ErasureState::Completed,
        requested_by: "dpo".into(),
        requested_at: at,
        deadline: at + chrono::Months::new(1),
        approvals: vec!["dpo".into(), "counsel".into()],
        suppressed_at: Some(at + chrono::TimeDelta::milliseconds(12)),
        completed_at: Some(at + chrono::TimeDelta::seconds(3)),
        updated_at: at,
        extension: None,
        rejection: None,
    };
    let job = PurgeJob {
        id: "pj".into(),
        request_id: "er_1".into(),
        target: "chroma:chroma".into(),
        state: "done".into(),
        attempts: 1,
        next_attempt_at: at,
        last_error: None,
        so_far: None,
        result: Some(
            json!({"before": 3, "deleted": 3, "remaining": 0, "physical": {
                "done": ["keys unlinked"],
                "remaining": [{"place": "pg_wal", "holds": "rows", "why": "recycled later",
                    "until": "2026-12-01T10:00:00Z", "unknown": null}],
            }}),
        ),
        updated_at: at,
    };
    let head = ChainHead {
        seq: 42,
        hash: "ab".repeat(32),
    };
    (
        record,
        vec![job],
        head,
        BTreeMap::from([("chroma:chroma".to_owned(), "35d".parse().unwrap())]),
    )
}

fn issued(signer: &Signer) -> Vec<u8> {
    let (_, jobs, _, _) = evidence_parts();
    issued_with(signer, jobs)
}

/// The fixture's certificate, with these jobs.
fn issued_with(signer: &Signer, jobs: Vec<PurgeJob>) -> Vec<u8> {
    let (record, _, head, backups) = evidence_parts();
    let evidence = Evidence {
        record: &record,
        jobs: &jobs,
        derivatives: &[],
        flips: &[],
        chain_head: &head,
        tenant_head: &head,
        backups: &backups,
        audit_key: b"k",
        issued_at: record.updated_at,
    };
    issue(&evidence, signer)
}

#[test]
fn a_certificate_verifies_with_its_key_and_says_when_backups_expire() {
    let signer = Signer::from_seed(&[7u8; 32]).unwrap();
    let document = issued(&signer);
    let certificate = verify(&document, &signer.public_key_hex()).unwrap();
    assert_eq!(
        certificate["final_backup_expiry"], "2027-01-03T10:00:03Z",
        "completion + 35 days"
    );
    assert_eq!(
        (
            certificate["online_latency_ms"].as_i64(),
            certificate["completion_latency_ms"].as_i64()
        ),
        (Some(12), Some(3000))
    );
    assert_eq!(certificate["stores"][0]["deleted"], 3);
    assert_eq!(certificate["audit_chain_head"]["seq"], 42);
    let text = String::from_utf8(document.clone()).unwrap();
    assert!(
        !text.contains("\"u1\"") && !text.contains("u1-old"),
        "subject keys appear only as HMAC references"
    );
    assert!(render_html(&document).contains("2027-01-03T10:00:03Z"));
}

#[test]
fn every_remaining_copy_is_named_with_its_date_and_an_undated_one_is_an_exception() {
    let signer = Signer::from_seed(&[7u8; 32]).unwrap();
    let certificate = verify(&issued(&signer), &signer.public_key_hex()).unwrap();
    assert_eq!(
        certificate["stores"][0]["physical"]["remaining"][0]["place"],
        "pg_wal"
    );
    assert_eq!(
        certificate["final_copy_expiry"], "2027-01-03T10:00:03Z",
        "the latest of the copies' dates and the backups'"
    );
    assert_eq!(certificate["exceptions"], json!([]));

    let (_, mut jobs, _, _) = evidence_parts();
    jobs[0].result = Some(
        json!({"before": 1, "deleted": 1, "remaining": 0, "physical": {
            "done": [], "remaining": [{"place": "data_level0.bin", "holds": "vectors",
                "why": "marked deleted", "until": null, "unknown": "rebuilt only with the collection"}],
            "verified": ["history.db: 4096 bytes searched, 0 found"],
        }}),
    );
    let document = issued_with(&signer, jobs);
    let certificate = verify(&document, &signer.public_key_hex()).unwrap();
    assert_eq!(certificate["final_copy_expiry"], Value::Null);
    assert_eq!(
        certificate["exceptions"],
        json!([
            "chroma:chroma: data_level0.bin still holds vectors, with no date: rebuilt only with the collection"
        ])
    );
    let page = render_html(&document);
    assert!(page.contains("unknown: rebuilt only with the collection"));
    assert!(page.contains("<td>history.db: 4096 bytes searched, 0 found</td>"));
}

#[test]
fn any_one_byte_edit_fails_verification() {
    let signer = Signer::from_seed(&[7u8; 32]).unwrap();
    let document = issued(&signer);
    let key = signer.public_key_hex();
    let mut failures = 0;
    for i in 0..document.len() {
        let mut edited = document.clone();
        edited[i] = if edited[i] == b'1' { b'2' } else { b'1' };
        if verify(&edited, &key).is_err() {
            failures += 1;
        }
    }
    assert_eq!(failures, document.len(), "every single-byte edit is caught");
    let other = Signer::from_seed(&[8u8; 32]).unwrap();
    assert_eq!(
        verify(&document, &other.public_key_hex()),
        Err(Invalid::OtherKey)
    );
}

#[test]
fn a_store_without_backup_retention_is_an_exception_not_a_silent_date() {
    let signer = Signer::from_seed(&[7u8; 32]).unwrap();
    let (record, jobs, head, _) = evidence_parts();
    let none = BTreeMap::new();
    let evidence = Evidence {
        record: &record,
        jobs: &jobs,
        derivatives: &[],
        flips: &[],
        chain_head: &head,
        tenant_head: &head,
        backups: &none,
        audit_key: b"k",
        issued_at: record.updated_at,
    };
    let certificate = verify(&issue(&evidence, &signer), &signer.public_key_hex()).unwrap();
    assert_eq!(certificate["final_backup_expiry"], Value::Null);
    assert!(
        certificate["exceptions"][0]
            .as_str()
            .unwrap()
            .contains("no backup retention")
    );
}

#[test]
fn the_derivatives_are_counted_per_store_and_what_remains_is_an_exception() {
    use crate::state::ItemKey;
    let signer = Signer::from_seed(&[7u8; 32]).unwrap();
    let (record, jobs, head, backups) = evidence_parts();
    let at = record.updated_at;
    let derivative =
        |store: &str, id: &str, own: bool, decision, erased: bool, reason: Option<&str>| {
            let item = ItemKey::new(store, "memories", id);
            Derivative {
                reference: item.reference(b"k"),
                item,
                subject: Some("bob".into()),
                own,
                how: vec![lethe_policy::How::Quote],
                parents: vec![],
                decision,
                decided_by: Some("dpo".into()),
                decided_at: Some(at),
                reason: reason.map(str::to_owned),
                erased_at: erased.then_some(at),
            }
        };
    let derivatives = [
        derivative("chroma", "own", true, Decision::Erase, true, None),
        derivative("chroma", "bobs", false, Decision::Erase, true, None),
        derivative("chroma", "kept", false, Decision::Release, false, None),
        derivative(
            "openai",
            "answer",
            false,
            Decision::Guard,
            false,
            Some("lineage keeps no live item"),
        ),
        // Another subject's where no purge reaches: it could only be released.
        derivative(
            "cache",
            "note",
            false,
            Decision::Release,
            false,
            Some("no purge of this request reaches store cache"),
        ),
    ];
    let evidence = Evidence {
        record: &record,
        jobs: &jobs,
        derivatives: &derivatives,
        flips: &[],
        chain_head: &head,
        tenant_head: &head,
        backups: &backups,
        audit_key: b"k",
        issued_at: at,
    };
    let document = issue(&evidence, &signer);
    let certificate = verify(&document, &signer.public_key_hex()).unwrap();
    assert_eq!(
        certificate["derivatives"],
        json!([
            {"store": "cache", "found": 1, "own_erased": 0, "erased": 0, "released": 0, "guarded": 0, "unreached": 1},
            {"store": "chroma", "found": 3, "own_erased": 1, "erased": 1, "released": 1, "guarded": 0, "unreached": 0},
            {"store": "openai", "found": 1, "own_erased": 0, "erased": 0, "released": 0, "guarded": 1, "unreached": 0},
        ])
    );
    let note = ItemKey::new("cache", "memories", "note").reference(b"k");
    assert_eq!(
        certificate["exceptions"],
        json!([format!(
            "cache: derivative {note} may remain: no purge of this request reaches its store"
        )])
    );
    assert!(
        render_html(&document).contains(
            "<td>chroma</td><td>3</td><td>1</td><td>1</td><td>1</td><td>0</td><td>0</td>"
        )
    );
}
