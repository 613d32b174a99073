use super::*;

const URL: &str = "redis://127.0.0.1:6379";

fn tls() -> Arc<rustls::ClientConfig> {
    crate::data::forward::tls_client(None).unwrap()
}

fn connector(url: &str, patterns: &[&str]) -> RedisConnector {
    let server = Server::of_url(url, None).unwrap();
    let texts: Vec<String> = patterns.iter().map(|p| p.to_string()).collect();
    RedisConnector::new("cache", vec![server], key_patterns(&texts).unwrap(), tls())
}

async fn connection(url: &str) -> Result<Client, ClientError> {
    let server = Server::of_url(url, None).unwrap();
    Client::connect(&server, &tls(), Proto::Resp2, TIMEOUT).await
}

/// Sets every key to `value` in one round trip.
async fn set(con: &mut Client, keys: impl IntoIterator<Item = String>, value: &str) {
    let commands: Vec<Vec<Vec<u8>>> = keys
        .into_iter()
        .map(|k| vec![b"SET".to_vec(), k.into_bytes(), value.as_bytes().to_vec()])
        .collect();
    for reply in con.call(&commands).await.unwrap() {
        assert_eq!(reply, Reply::ok());
    }
}

async fn unlink(con: &mut Client, keys: &[String]) {
    let mut args: Vec<&[u8]> = vec![b"UNLINK"];
    args.extend(keys.iter().map(|k| k.as_bytes()));
    con.one(&args).await.unwrap();
}

#[test]
fn glob_characters_in_names_match_only_themselves() {
    let patterns = key_patterns(&["{tenant}:{subject}:*".into()]).unwrap();
    assert_eq!(globs(&patterns, "acme", Some("u*")), ["acme:u\\*:*"]);
    assert_eq!(globs(&patterns, "acme", Some("a[1]")), ["acme:a\\[1\\]:*"]);
    assert_eq!(globs(&patterns, "a?", None), ["a\\?:*:*"]);
}

#[test]
fn erasure_patterns_are_read_as_a_routes_are() {
    assert!(key_patterns(&["{tenant}:{subject}:*".into()]).is_ok());
    let bad = key_patterns(&["{subject}:*".into(), "{tenant}:*:{subject}".into()]);
    assert_eq!(bad.map_err(|bad| bad.len()).err(), Some(2));
}

/// A colon is allowed in a subject key: erasing `frank:notes` must not take frank's keys
/// `frank:notes:1` (the pattern says they are frank's), and a subject's keys in every
/// database go (a `COPY ... DB` made around Lethe, an app on another database).
#[tokio::test]
async fn the_purge_takes_only_what_the_patterns_say_is_the_subjects_in_every_database() {
    let mut con = connection(URL).await.expect("Redis on 127.0.0.1:6379");
    let tenant = format!("t{}", uuid::Uuid::new_v4().simple());
    let franks = [
        format!("{tenant}:frank:notes:1"),
        format!("{tenant}:frank:notes:history"),
    ];
    set(&mut con, franks.clone(), "frank's").await;
    let carols = format!("{tenant}:carol:k");
    for db in ["0", "1", "2"] {
        con.one(&[b"SELECT", db.as_bytes()]).await.unwrap();
        set(&mut con, [carols.clone()], "carol's").await;
    }
    con.one(&[b"SELECT", b"0"]).await.unwrap();
    let purge = async |subject: &str| {
        connector(URL, &["{tenant}:{subject}:*"])
            .purge(&crate::testing::subjects(&tenant, &[subject]), &[])
            .await
            .unwrap()
    };
    let notes = purge("frank:notes").await;
    assert_eq!((notes.before, notes.deleted, notes.remaining), (0, 0, 0));
    let exists = |key: &String| [b"EXISTS".to_vec(), key.clone().into_bytes()];
    let held = con
        .call(&franks.iter().map(exists).map(Vec::from).collect::<Vec<_>>())
        .await
        .unwrap();
    assert_eq!(held, [Reply::Int(1), Reply::Int(1)], "frank's keys are his");
    let carol = purge("carol").await;
    assert_eq!((carol.before, carol.deleted, carol.remaining), (3, 3, 0));
    for db in ["0", "1", "2"] {
        con.one(&[b"SELECT", db.as_bytes()]).await.unwrap();
        let left = con.one(&[b"EXISTS", carols.as_bytes()]).await.unwrap();
        assert_eq!(left, Reply::Int(0), "carol's copy in database {db}");
    }
    con.one(&[b"SELECT", b"0"]).await.unwrap();
    unlink(&mut con, &franks).await;
}

/// Lineage is only an index: a row naming a key the patterns say is someone else's (a
/// colon in a subject key, a row written wrong) unlinks nothing.
#[tokio::test]
async fn the_sweeper_unlinks_only_keys_the_patterns_say_are_the_rows_subjects() {
    let mut con = connection(URL).await.expect("Redis on 127.0.0.1:6379");
    let tenant = format!("t{}", uuid::Uuid::new_v4().simple());
    let (franks, notes) = (
        format!("{tenant}:frank:notes:1"),
        format!("{tenant}:notes:1"),
    );
    set(&mut con, [franks.clone(), notes.clone()], "v").await;
    let item = |key: &str, subject: &str| ExpiredItem {
        store: "cache".into(),
        collection: "keys".into(),
        item_id: key.into(),
        tenant: tenant.clone(),
        subject: subject.into(),
    };
    let purger = connector(URL, &["{tenant}:{subject}:*"]);
    let rows = [item(&franks, "frank:notes"), item(&notes, "notes")];
    assert_eq!(purger.held_items("keys", &rows).await.unwrap(), 1);
    assert_eq!(purger.delete_items("keys", &rows).await.unwrap(), 1);
    let left = con
        .one(&[b"EXISTS", franks.as_bytes(), notes.as_bytes()])
        .await
        .unwrap();
    assert_eq!(left, Reply::Int(1), "frank's key stays");
    unlink(&mut con, &[franks]).await;
}

/// After a restore, a replay knows the subject only by reference: its keys are found again
/// among those the patterns could hold, and no one else's go.
#[tokio::test]
async fn a_subject_known_only_by_reference_is_found_again_and_purged() {
    let mut con = connection(URL).await.expect("Redis on 127.0.0.1:6379");
    let tenant = format!("t{}", uuid::Uuid::new_v4().simple());
    let keys = ["u1:a", "u1:b", "u2:a", "u10:a"].map(|key| format!("{tenant}:{key}"));
    set(
        &mut con,
        keys.into_iter().chain([format!("cache:{tenant}:u1")]),
        "v",
    )
    .await;
    let forgotten = lethe_policy::audit::forgotten(crate::testing::AUDIT_KEY, &tenant, "u1");
    let report = connector(URL, &["cache:{tenant}:{subject}", "{tenant}:{subject}:*"])
        .purge(&crate::testing::subjects(&tenant, &[&forgotten]), &[])
        .await
        .unwrap();
    assert_eq!(
        (report.before, report.deleted, report.remaining),
        (3, 3, 0),
        "{report:?}"
    );
    let mut left = scan(&mut con, &format!("{tenant}:*")).await.unwrap();
    left.sort();
    assert_eq!(left, [format!("{tenant}:u10:a"), format!("{tenant}:u2:a")]);
    unlink(&mut con, &left).await;
}

#[tokio::test]
async fn a_subjects_keys_go_on_every_pattern_and_no_other_key_does() {
    let mut con = connection(URL).await.expect("Redis on 127.0.0.1:6379");
    let tenant = format!("t{}", uuid::Uuid::new_v4().simple());
    let keys = (0..1500)
        .map(|i| format!("{tenant}:u1:session:{i}"))
        .chain((0..40).map(|i| format!("{tenant}:u2:session:{i}")))
        .chain([
            format!("{tenant}:u*:x"),
            format!("cache:{tenant}:u1"),
            format!("{tenant}:u1-old:profile"),
        ]);
    set(&mut con, keys, "v").await;

    let patterns = ["cache:{tenant}:{subject}", "{tenant}:{subject}:*"];
    let purger = connector(URL, &patterns);
    let subjects = crate::testing::subjects(&tenant, &["u1", "u1-old"]);
    assert_eq!(
        purger.count(&subjects, &[]).await.unwrap(),
        1502,
        "the dry run counts what the purge will find"
    );
    let report = purger.purge(&subjects, &[]).await.unwrap();
    assert_eq!(
        (report.before, report.deleted, report.remaining),
        (1502, 1502, 0),
        "{report:?}"
    );
    assert_eq!(purger.count(&subjects, &[]).await.unwrap(), 0);
    assert_eq!(
        report.physical.done,
        [
            "redis://127.0.0.1:6379: keys unlinked",
            "redis://127.0.0.1:6379: the server keeps nothing on disk"
        ],
        "the test server persists nothing (scripts/test starts it so)"
    );
    assert!(report.physical.remaining.is_empty());
    assert_eq!(
        scan(&mut con, &format!("{tenant}:u2:*"))
            .await
            .unwrap()
            .len(),
        40,
        "another subject keeps every key"
    );
    assert_eq!(
        scan(&mut con, &format!("{tenant}:u\\**"))
            .await
            .unwrap()
            .len(),
        1,
        "a key with a glob character in it stays"
    );

    let starred = connector(URL, &patterns)
        .purge(&crate::testing::subjects(&tenant, &["u*"]), &[])
        .await
        .unwrap();
    assert_eq!(
        starred.deleted, 1,
        "a subject named u* removes only its own key"
    );
    assert_eq!(
        scan(&mut con, &format!("{tenant}:u2:*"))
            .await
            .unwrap()
            .len(),
        40
    );
    let leftovers = scan(&mut con, &format!("{tenant}:*")).await.unwrap();
    unlink(&mut con, &leftovers).await;
}

/// A Redis of the test's own that persists (AOF and RDB) into a fresh directory; stopped
/// when dropped.
struct Persisting {
    process: std::process::Child,
    dir: std::path::PathBuf,
    url: String,
}

impl Drop for Persisting {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn persisting() -> Persisting {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = std::env::temp_dir().join(format!("lethe-redis-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let process = std::process::Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--appendonly",
            "yes",
            "--save",
            "3600 1",
        ])
        .arg("--dir")
        .arg(&dir)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("redis-server (scripts/test installs it)");
    let url = format!("redis://127.0.0.1:{port}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if connection(&url).await.is_ok() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "redis-server did not start"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Persisting { process, dir, url }
}

/// Every byte the server keeps on disk, file by file.
fn files_holding(dir: &std::path::Path, needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(path) = todo.pop() {
        if path.is_dir() {
            todo.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        } else if std::fs::read(&path)
            .unwrap()
            .windows(needle.len())
            .any(|w| w == needle.as_bytes())
        {
            found.push(path.display().to_string());
        }
    }
    found
}

#[tokio::test]
async fn with_persistence_on_the_purge_rewrites_the_files_without_the_subject() {
    let server = persisting().await;
    let mut con = connection(&server.url).await.unwrap();
    for (subject, secret) in [("u1", "u1-secret-value"), ("u2", "u2-kept-value")] {
        set(
            &mut con,
            (0..20).map(|i| format!("acme:{subject}:{i}")),
            secret,
        )
        .await;
    }
    con.one(&[b"BGSAVE"]).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while files_holding(&server.dir, "u1-secret-value").len() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the AOF and the snapshot hold the subject before the purge"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let report = connector(&server.url, &["{tenant}:{subject}:*"])
        .purge(&crate::testing::subjects("acme", &["u1"]), &[])
        .await
        .unwrap();
    assert_eq!(
        (report.before, report.deleted, report.remaining),
        (20, 20, 0)
    );
    let done = report.physical.done.join("; ");
    assert!(
        done.contains("append-only file rewritten") && done.contains("RDB snapshot taken"),
        "{done}"
    );
    assert!(
        report.physical.remaining.is_empty(),
        "{:?}",
        report.physical.remaining
    );
    assert_eq!(
        files_holding(&server.dir, "u1-secret-value"),
        Vec::<String>::new(),
        "nothing of u1 on disk"
    );
    assert!(
        !files_holding(&server.dir, "u2-kept-value").is_empty(),
        "u2 is still persisted"
    );
}
