use super::*;

use crate::testing::{AUDIT_KEY, fresh_sqlite_url, migrated};
use crate::testing::{ERASED_KEYS, erase_to_completion};

const TEXT: &str =
    "she told the assistant about the diagnosis before telling her family or her manager";

#[tokio::test]
async fn once_an_erasure_completes_the_memory_knows_its_subject_by_reference_only() {
    let store = migrated(&fresh_sqlite_url()).await;
    let derivation = Derivation::new(
        &LineageConfig::default(),
        Arc::clone(&store),
        Arc::from(AUDIT_KEY),
    );
    let [key, _] = ERASED_KEYS;
    let runs = QuoteKey::of_tenant(AUDIT_KEY, "acme")
        .fingerprints(TEXT, 12)
        .runs;
    let remembered = |owner: &str, id: String| {
        Arc::new(Remembered {
            tenant: "acme".into(),
            store: "chroma".into(),
            collection: "memories".into(),
            id,
            owner: owner.into(),
            answer: false,
        })
    };
    let memory = derivation.memory();
    memory.quotable(
        &remembered(key, format!("{key}/note")),
        &runs,
        Instant::now(),
    );
    memory.quotable(&remembered("u2", "u2/note".into()), &runs, Instant::now());
    erase_to_completion(&store).await;
    let name = forgotten(AUDIT_KEY, "acme", key);
    let owners = || {
        let mut found: Vec<(String, String)> = memory
            .quoted("acme", &runs, Instant::now())
            .iter()
            .map(|i| (i.owner.clone(), i.id.clone()))
            .collect();
        found.sort_unstable();
        found
    };
    let wanted = {
        let mut wanted = vec![
            (name.clone(), format!("{name}/note")),
            ("u2".to_owned(), "u2/note".to_owned()),
        ];
        wanted.sort_unstable();
        wanted
    };
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    while owners() != wanted {
        assert!(
            Instant::now() < deadline,
            "still remembered: {:?}",
            owners()
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    // By its reference the subject is still erased: what quotes it is still refused.
    let state = store.subject("acme", &name).await.unwrap();
    assert_eq!(state.map(|s| s.status), Some(SubjectStatus::Erased));
}
