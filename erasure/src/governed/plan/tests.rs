use super::*;
use crate::config::GovernedDatabase;

fn db() -> GovernedDatabase {
    GovernedDatabase {
        name: "app".into(),
        url: crate::config::Secret::Value("postgres://x".into()),
        app_role: "lethe_app".into(),
        tenant_roles: [("acme".to_owned(), "acme_app".to_owned())].into(),
        tables: vec![GovernedTable {
            table: "public.memories".into(),
            tenant: "tenant_id".into(),
            subject: "user_id".into(),
            purpose: "'personalization'".into(),
            category: "category".into(),
            owner: None,
            key: vec![],
        }],
        flip_grace: crate::config::ConfigDuration(std::time::Duration::from_secs(1)),
    }
}

fn with(sql: &[String], needle: &str) -> Vec<String> {
    sql.iter().filter(|s| s.contains(needle)).cloned().collect()
}

#[test]
fn every_table_is_stamped_by_a_trigger_and_read_through_forced_row_security() {
    let sql = plan(&db(), &Folding::default());
    for needle in [
        "ALTER TABLE public.memories ADD COLUMN IF NOT EXISTS lethe_expires_at timestamptz",
        "ALTER TABLE public.memories ADD COLUMN IF NOT EXISTS lethe_epoch bigint",
        "CREATE TRIGGER lethe_stamp BEFORE INSERT OR UPDATE ON public.memories FOR EACH ROW EXECUTE FUNCTION lethe.stamp_public_memories()",
        "ALTER TABLE public.memories ENABLE ROW LEVEL SECURITY",
        "ALTER TABLE public.memories FORCE ROW LEVEL SECURITY",
        "CREATE POLICY lethe_itself ON public.memories TO CURRENT_USER USING (true) WITH CHECK (true)",
    ] {
        assert_eq!(with(&sql, needle).len(), 1, "{needle}");
    }
    let scope = "(tenant_id)::text, (user_id)::text, ('personalization')::text, (category)::text";
    let app = with(
        &sql,
        "CREATE POLICY lethe_lethe_app ON public.memories TO lethe_app",
    );
    assert_eq!(app.len(), 1);
    assert!(
        app[0].contains(&format!(
            "USING (lethe.readable({scope}, lethe_expires_at, lethe_epoch))"
        )),
        "{}",
        app[0]
    );
    // The tenant's role sees and writes its tenant's rows only.
    let acme = with(
        &sql,
        "CREATE POLICY lethe_acme_app ON public.memories TO acme_app",
    );
    assert_eq!(acme.len(), 1);
    assert_eq!(
        acme[0].matches("AND (tenant_id) = 'acme'").count(),
        2,
        "{}",
        acme[0]
    );
    // The trigger evaluates the same expressions over the new row (and the old one).
    let trigger = with(
        &sql,
        "CREATE OR REPLACE FUNCTION lethe.stamp_public_memories()",
    );
    assert_eq!(trigger[0].matches(&format!("ARRAY[{scope}]")).count(), 2);
}

#[test]
fn the_plan_can_run_again_and_never_lets_a_role_bypass_it() {
    let sql = plan(&db(), &Folding::default());
    for statement in &sql {
        let creates =
            statement.starts_with("CREATE ") && !statement.starts_with("CREATE OR REPLACE");
        let guarded = statement.contains("IF NOT EXISTS")
            || statement.starts_with("CREATE POLICY")
            || statement.starts_with("CREATE TRIGGER");
        assert!(!creates || guarded, "not idempotent: {statement}");
        assert!(!statement.contains(" BYPASSRLS"), "{statement}");
    }
    // Each policy and trigger is dropped right before it is created again.
    for (i, statement) in sql.iter().enumerate() {
        if let Some(rest) = statement
            .strip_prefix("CREATE POLICY ")
            .or(statement.strip_prefix("CREATE TRIGGER "))
        {
            let name = rest.split_whitespace().next().unwrap();
            assert!(
                sql[i - 1].starts_with("DROP ") && sql[i - 1].contains(name),
                "{statement}"
            );
        }
    }
    for role in ["lethe_app", "acme_app"] {
        assert_eq!(
            with(&sql, &format!("ALTER ROLE {role} NOBYPASSRLS")).len(),
            1
        );
    }
    // The app roles may call the read check, never the write decision or the policy tables.
    assert!(with(&sql, "GRANT EXECUTE ON FUNCTION lethe.decide_write").is_empty());
    assert!(with(&sql, "GRANT SELECT ON lethe.").is_empty());
    assert_eq!(
        sql.last().unwrap(),
        &format!(
            "INSERT INTO lethe.version (version, installed_at) VALUES ({VERSION}, now()) ON CONFLICT (version) DO NOTHING"
        )
    );
}

#[test]
fn a_governed_database_is_an_erasure_target_and_swept_by_its_own_expressions() {
    let target = erasure_target(&db());
    let owned = "(tenant_id)::text = $1 AND (user_id)::text = $2";
    assert_eq!(target.name, "app");
    assert_eq!(
        target.count,
        format!("SELECT (SELECT count(*) FROM public.memories WHERE {owned})")
    );
    assert_eq!(
        target.delete,
        vec![format!("DELETE FROM public.memories WHERE {owned}")]
    );
    assert_eq!(
        target.subjects.as_deref(),
        Some("SELECT (user_id)::text FROM public.memories WHERE (tenant_id)::text = $1")
    );
    assert_eq!(
        (target.vacuum.clone(), target.vector_tables.clone()),
        (
            vec!["public.memories".to_owned()],
            vec!["public.memories".to_owned()]
        )
    );
    assert_eq!(
        sweep(&db().tables[0], None),
        "DELETE FROM public.memories WHERE lethe.sweepable((tenant_id)::text, (user_id)::text, ('personalization')::text, (category)::text, lethe_expires_at)"
    );
}

fn langgraph() -> GovernedDatabase {
    let owned = |table: &str| GovernedTable {
        table: table.into(),
        tenant: String::new(),
        subject: String::new(),
        purpose: String::new(),
        category: String::new(),
        owner: Some("checkpoints".into()),
        key: vec!["thread_id".into()],
    };
    GovernedDatabase {
        tables: vec![
            GovernedTable {
                table: "checkpoints".into(),
                tenant: "metadata->>'tenant_id'".into(),
                subject: "metadata->>'user_id'".into(),
                purpose: "'continuity'".into(),
                category: "'conversation'".into(),
                owner: None,
                key: vec![],
            },
            owned("checkpoint_blobs"),
        ],
        ..db()
    }
}

#[test]
fn a_linked_table_follows_its_owner_and_goes_with_it() {
    let db = langgraph();
    let sql = plan(&db, &Folding::default());
    assert!(
        with(&sql, "ALTER TABLE checkpoint_blobs ADD COLUMN").is_empty(),
        "no stamp of its own"
    );
    assert_eq!(
        with(&sql, "CREATE CONSTRAINT TRIGGER lethe_owned AFTER INSERT OR UPDATE ON checkpoint_blobs DEFERRABLE INITIALLY DEFERRED").len(),
        1
    );
    let check = with(
        &sql,
        "CREATE OR REPLACE FUNCTION lethe.owned_checkpoint_blobs()",
    );
    assert!(
        check[0].contains(
            "WHERE lethe_owner.thread_id = NEW.thread_id AND lethe_owner.lethe_epoch IS NOT NULL"
        ),
        "{}",
        check[0]
    );
    // The owner's scope is decided like any write, the caller's tenant first.
    assert!(
        check[0].contains("PERFORM lethe.decide_write(lethe_scope[1], lethe_scope[2], lethe_scope[3], lethe_scope[4], NULL)"),
        "{}",
        check[0]
    );
    let policy = with(&sql, "CREATE POLICY lethe_lethe_app ON checkpoint_blobs");
    assert!(policy[0].contains("USING (EXISTS (SELECT 1 FROM checkpoints lethe_owner WHERE lethe_owner.thread_id = checkpoint_blobs.thread_id) OR lethe.unstored(checkpoint_blobs.ctid))"), "{}", policy[0]);
    assert!(
        !sql.iter()
            .any(|s| s.contains("lethe.has_owner_") && !s.starts_with("DROP FUNCTION IF EXISTS")),
        "no function says whether another tenant's owner exists"
    );
    assert_eq!(
        with(
            &sql,
            "CREATE TRIGGER lethe_cascade_checkpoint_blobs AFTER DELETE ON checkpoints"
        )
        .len(),
        1
    );
    // Purged before its owner, by its owner's scope; swept when its owner is gone.
    let target = erasure_target(&db);
    assert_eq!(
        target.delete[0],
        "DELETE FROM checkpoint_blobs WHERE EXISTS (SELECT 1 FROM checkpoints lethe_owner WHERE lethe_owner.thread_id = checkpoint_blobs.thread_id AND (metadata->>'tenant_id')::text = $1 AND (metadata->>'user_id')::text = $2)"
    );
    assert!(target.delete[1].starts_with("DELETE FROM checkpoints WHERE"));
    assert_eq!(
        sweep(&db.tables[1], db.owner_of(&db.tables[1])),
        "DELETE FROM checkpoint_blobs WHERE NOT EXISTS (SELECT 1 FROM checkpoints lethe_owner WHERE lethe_owner.thread_id = checkpoint_blobs.thread_id)"
    );
}

#[test]
fn a_write_reads_the_subject_state_without_locking_it() {
    // A lock taken by every deciding write would let a stream of writes hold off a flip.
    let sql = plan(&db(), &Folding::default()).join("\n");
    let decide = sql
        .split("CREATE OR REPLACE FUNCTION lethe.decide_write")
        .nth(1)
        .and_then(|rest| rest.split("$lethe$;").next())
        .unwrap_or_default();
    assert!(decide.contains("FROM lethe.subjects"), "{decide}");
    for lock in [
        "FOR SHARE",
        "FOR UPDATE",
        "FOR KEY SHARE",
        "FOR NO KEY UPDATE",
        "LOCK ",
    ] {
        assert!(!sql.contains(lock), "the installed SQL takes {lock}");
    }
}

#[test]
fn every_answer_is_for_the_callers_tenant_and_nothing_is_public() {
    let sql = plan(&db(), &Folding::default());
    let joined = sql.join("\n");
    // Which tenant each app role serves, written afresh at every install.
    let roles = [
        "DELETE FROM lethe.roles",
        "INSERT INTO lethe.roles (role, tenant) VALUES ('lethe_app', NULL)",
        "INSERT INTO lethe.roles (role, tenant) VALUES ('acme_app', 'acme')",
    ];
    let at = |needle: &str| sql.iter().position(|s| s == needle).expect(needle);
    assert!(at(roles[0]) < at(roles[1]) && at(roles[0]) < at(roles[2]));
    // The write decision asks about the tenant before it looks at the subject.
    let decide = joined
        .split("CREATE OR REPLACE FUNCTION lethe.decide_write")
        .nth(1)
        .unwrap();
    let serves = decide.find("IF NOT lethe.serves(p_tenant) THEN").unwrap();
    assert!(serves < decide.find("FROM lethe.subjects").unwrap());
    let readable = joined
        .split("CREATE OR REPLACE FUNCTION lethe.readable")
        .nth(1)
        .unwrap();
    assert!(
        readable
            .split("$lethe$")
            .nth(1)
            .unwrap()
            .contains("AND lethe.serves(p_tenant)")
    );
    // Nothing in schema lethe is PUBLIC's, now or later; the app roles get the read check and
    // the own-row check only.
    let revoke = at("REVOKE ALL ON ALL FUNCTIONS IN SCHEMA lethe FROM PUBLIC");
    let last_function = sql
        .iter()
        .rposition(|s| s.starts_with("CREATE OR REPLACE FUNCTION"))
        .unwrap();
    assert!(revoke > last_function);
    at("ALTER DEFAULT PRIVILEGES IN SCHEMA lethe REVOKE ALL ON FUNCTIONS FROM PUBLIC");
    let granted: Vec<&String> = sql
        .iter()
        .filter(|s| s.starts_with("GRANT EXECUTE"))
        .collect();
    assert_eq!(granted.len(), 2, "{granted:?}");
    for grant in granted {
        assert!(grant.starts_with("GRANT EXECUTE ON FUNCTION lethe.readable(text, text, text, text, timestamptz, bigint), lethe.unstored(tid) TO "), "{grant}");
    }
}

/// The database's check of a name agrees with Lethe's own (`lethe_policy::names`): a name the
/// database takes is one Lethe keeps as it is, and the other way round.
#[tokio::test]
async fn the_databases_name_check_is_lethes() {
    use lethe_policy::names::canonical_key;
    use sqlx::Connection as _;
    let url = crate::testing::fresh_postgres_database()
        .await
        .expect("a PostgreSQL test database");
    let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
    for statement in schema() {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&mut conn)
            .await
            .unwrap();
    }
    let mut names: Vec<String> = [
        "carol",
        "Carol",
        "car\u{e9}",
        "care\u{301}",
        "carol ",
        " carol",
        "carol\u{a0}",
        "carol\u{3000}",
        "car\u{200b}ol",
        "\u{202e}lorac",
        "ca\u{ad}rol",
        "car\u{feff}ol",
        "carol\u{e0041}",
        "car\nol",
        "carol\u{2028}",
        "acme/u1",
        "Mary Smith",
        "\u{1f600}",
        "a\u{85}",
        "\u{85}a",
        "x\u{1680}",
        "\u{110bd}x",
        "",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    names.push("a".repeat(200));
    names.push("a".repeat(201));
    // Every character of the ranges the check is built from, inside a name and at its edges.
    use lethe_policy::names::{CONTROL, INVISIBLE, WHITESPACE};
    for &(lo, hi) in [CONTROL, INVISIBLE, WHITESPACE]
        .iter()
        .flat_map(|r| r.iter())
    {
        for c in [lo, hi].into_iter().filter(|c| *c != '\0') {
            names.extend([format!("a{c}b"), format!("{c}ab"), format!("ab{c}")]);
        }
    }
    for name in &names {
        let lethe = canonical_key(name, false).as_deref() == Ok(name.as_str());
        let database: bool = sqlx::query_scalar("SELECT lethe.canonical_name($1)")
            .bind(name)
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(database, lethe, "{name:?}");
    }
}

/// The SQL decides on consent actions of the policy crate only (one of the closed lists Lethe
/// names in more than one place; the others are checked beside the control plane and the CLI).
#[test]
fn the_sql_names_only_consent_actions_of_the_policy_crate() {
    let actions: std::collections::BTreeSet<&str> = lethe_policy::Action::ALL
        .iter()
        .map(|a| a.as_str())
        .collect();
    let sql = schema().join("\n");
    let named: std::collections::BTreeSet<&str> = sql
        .split("c.action = '")
        .skip(1)
        .filter_map(|rest| rest.split('\'').next())
        .collect();
    assert!(
        !named.is_empty(),
        "the governed SQL decides on consent actions"
    );
    assert!(
        named.is_subset(&actions),
        "the governed SQL names {:?}, not all of them actions",
        named.difference(&actions).collect::<Vec<_>>()
    );
}
