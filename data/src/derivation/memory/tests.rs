use super::*;

use lethe_policy::derivation::QuoteKey;

const WINDOW: Duration = Duration::from_secs(15 * 60);

fn limits() -> Limits {
    Limits {
        window: WINDOW,
        max_traces: 100_000,
        max_fingerprints: 1_000_000,
        max_bytes: 64 * 1024 * 1024,
    }
}

fn item(tenant: &str, id: &str, owner: &str) -> Arc<Remembered> {
    Arc::new(Remembered {
        tenant: tenant.into(),
        store: "chroma".into(),
        collection: "memories".into(),
        id: id.into(),
        owner: owner.into(),
        answer: false,
    })
}

fn trace(n: u128) -> TraceId {
    TraceId((n + 1).to_le_bytes())
}

fn ids(found: &[Arc<Remembered>]) -> Vec<&str> {
    let mut ids: Vec<&str> = found.iter().map(|i| i.id.as_str()).collect();
    ids.sort_unstable();
    ids
}

const ALICE: &str = "alice has a peanut allergy and carries an epipen wherever she goes, she said";

#[test]
fn a_trace_remembers_what_it_read_for_a_window_in_its_tenant_only() {
    let t0 = Instant::now();
    let memory = Memory::new(limits(), t0);
    let (a1, a2) = (item("acme", "a1", "alice"), item("acme", "a2", "alice"));
    memory.traced_item(&a1, trace(1), t0);
    memory.traced_item(&a2, trace(1), t0);
    memory.traced_item(&a1, trace(1), t0 + Duration::from_secs(1));
    memory.traced_item(&item("globex", "g1", "gina"), trace(1), t0);
    assert_eq!(ids(&memory.traced("acme", trace(1), t0)), ["a1", "a2"]);
    assert_eq!(ids(&memory.traced("globex", trace(1), t0)), ["g1"]);
    assert!(memory.traced("acme", trace(2), t0).is_empty());
    // Still there a whole window later, gone once a window and a half has passed.
    assert_eq!(memory.traced("acme", trace(1), t0 + WINDOW).len(), 2);
    assert!(
        memory
            .traced("acme", trace(1), t0 + WINDOW * 3 / 2)
            .is_empty()
    );
    assert_eq!(memory.stats().evicted_traces, 0, "aging is not eviction");
}

#[test]
fn a_quote_is_found_in_its_tenant_for_a_window() {
    let t0 = Instant::now();
    let memory = Memory::new(limits(), t0);
    let acme = QuoteKey::of_tenant(b"k", "acme");
    let runs = acme.fingerprints(ALICE, 12).runs;
    memory.quotable(&item("acme", "a1", "alice"), &runs, t0);
    let quote = acme
        .fingerprints(&format!("bob wrote: {}", &ALICE[..70]), 12)
        .runs;
    assert_eq!(ids(&memory.quoted("acme", &quote, t0)), ["a1"]);
    assert_eq!(
        ids(&memory.quoted("acme", &quote, t0 + WINDOW + WINDOW / 4)),
        ["a1"]
    );
    assert!(memory.quoted("acme", &quote, t0 + WINDOW * 2).is_empty());
    // The same words in another tenant are other fingerprints, and a stray equal number is
    // still not another tenant's.
    let globex = QuoteKey::of_tenant(b"k", "globex");
    assert!(
        memory
            .quoted("globex", &globex.fingerprints(ALICE, 12).runs, t0)
            .is_empty()
    );
    assert!(memory.quoted("globex", &runs, t0).is_empty());
}

#[test]
fn every_item_sharing_a_run_is_found_up_to_the_bound() {
    let t0 = Instant::now();
    let memory = Memory::new(limits(), t0);
    let runs = QuoteKey::of_tenant(b"k", "acme")
        .fingerprints(ALICE, 12)
        .runs;
    for i in 0..(MOST_PER_KEY + 10) {
        memory.quotable(&item("acme", &format!("copy{i:03}"), "bob"), &runs, t0);
    }
    let found = memory.quoted("acme", &runs[..1], t0);
    assert_eq!(found.len(), MOST_PER_KEY);
    assert!(ids(&found).contains(&"copy000"));
}

#[test]
fn a_text_is_new_once_per_generation() {
    let t0 = Instant::now();
    let memory = Memory::new(limits(), t0);
    assert!(memory.first_sight(42, t0));
    assert!(!memory.first_sight(42, t0 + Duration::from_secs(1)));
    assert!(memory.first_sight(43, t0));
    assert!(memory.first_sight(42, t0 + WINDOW / 4));
}

#[test]
fn a_hundred_thousand_traces_and_fifty_megabytes_of_text_stay_within_the_bounds() {
    let cap = Limits {
        window: WINDOW,
        max_traces: 20_000,
        max_fingerprints: 400_000,
        max_bytes: 8 * 1024 * 1024,
    };
    let t0 = Instant::now();
    let memory = Memory::new(cap, t0);
    for n in 0..100_000u32 {
        let it = item("acme", &format!("item-{n}"), &format!("user-{}", n % 977));
        memory.traced_item(&it, trace(u128::from(n)), t0);
    }
    let stats = memory.stats();
    assert!(stats.traces <= cap.max_traces, "{stats:?}");
    assert!(stats.bytes as u64 <= cap.max_bytes, "{stats:?}");
    assert!(stats.evicted_traces >= 80_000, "{stats:?}");
    // The newest traces are the ones kept.
    assert_eq!(memory.traced("acme", trace(99_999), t0).len(), 1);

    let key = QuoteKey::of_tenant(b"k", "acme");
    let mut served = 0usize;
    let mut n = 0u64;
    while served < 50 * 1024 * 1024 {
        // 2 KB of words no other text has.
        let text: String = (0..300).map(|i| format!("w{}x{i} ", n)).collect::<String>();
        served += text.len();
        let it = item("acme", &format!("doc-{n}"), "bob");
        memory.quotable(&it, &key.fingerprints(&text, 12).runs, t0);
        n += 1;
    }
    let stats = memory.stats();
    assert!(stats.fingerprints <= cap.max_fingerprints, "{stats:?}");
    assert!(stats.bytes as u64 <= cap.max_bytes, "{stats:?}");
    assert!(stats.evicted_fingerprints > 0, "{stats:?}");
    // The last text is still quotable.
    let last = (0..300)
        .map(|i| format!("w{}x{i} ", n - 1))
        .collect::<String>();
    assert_eq!(
        ids(&memory.quoted("acme", &key.fingerprints(&last, 12).runs, t0)),
        [format!("doc-{}", n - 1).as_str()]
    );
}

#[test]
fn a_forgotten_subject_is_remembered_by_its_reference_only_and_still_found() {
    let t0 = Instant::now();
    let memory = Memory::new(limits(), t0);
    let acme = QuoteKey::of_tenant(b"k", "acme");
    let runs = acme.fingerprints(ALICE, 12).runs;
    let (a1, b1) = (item("acme", "alice/a1", "alice"), item("acme", "b1", "bob"));
    let elsewhere = item("globex", "alice/g1", "alice");
    for remembered in [&a1, &b1, &elsewhere] {
        memory.quotable(remembered, &runs, t0);
        memory.traced_item(remembered, trace(1), t0);
    }
    memory.forget("acme", "alice", "forgotten:ref");
    let owners = |found: Vec<Arc<Remembered>>| {
        let mut owned: Vec<(String, String)> = found
            .iter()
            .map(|i| (i.id.clone(), i.owner.clone()))
            .collect();
        owned.sort_unstable();
        owned
    };
    let acme_now = vec![
        ("b1".to_owned(), "bob".to_owned()),
        ("forgotten:ref/a1".to_owned(), "forgotten:ref".to_owned()),
    ];
    assert_eq!(owners(memory.quoted("acme", &runs, t0)), acme_now);
    assert_eq!(owners(memory.traced("acme", trace(1), t0)), acme_now);
    // Another tenant's subject of the same name is not that one.
    let globex = vec![("alice/g1".to_owned(), "alice".to_owned())];
    assert_eq!(owners(memory.quoted("globex", &runs, t0)), globex);
}

#[test]
fn a_trace_remembers_every_item_it_read_however_many_came_first() {
    let t0 = Instant::now();
    let memory = Memory::new(limits(), t0);
    for n in 0..500 {
        memory.traced_item(&item("acme", &format!("filler-{n}"), "bob"), trace(1), t0);
    }
    let secret = item("acme", "a1", "alice");
    memory.traced_item(&secret, trace(1), t0);
    memory.traced_item(&secret, trace(1), t0);
    let read = memory.traced("acme", trace(1), t0);
    assert_eq!(read.len(), 501, "each read once");
    assert!(read.iter().any(|i| i.id == "a1" && i.owner == "alice"));
}
