//! Embedded migrations, applied in order, each in its own transaction with its bookkeeping row.

pub struct Migration {
    pub version: i64,
    pub name: &'static str,
    pub sql: &'static str,
}

pub const SQLITE: &[Migration] = &[
    Migration {
        version: 1,
        name: "init",
        sql: include_str!("../../migrations/sqlite/0001_init.sql"),
    },
    Migration {
        version: 2,
        name: "processors",
        sql: include_str!("../../migrations/sqlite/0002_processors.sql"),
    },
    Migration {
        version: 3,
        name: "audit_tenants",
        sql: include_str!("../../migrations/sqlite/0003_audit_tenants.sql"),
    },
    Migration {
        version: 4,
        name: "certificates",
        sql: include_str!("../../migrations/sqlite/0004_certificates.sql"),
    },
    Migration {
        version: 5,
        name: "erasure_list",
        sql: include_str!("../../migrations/sqlite/0005_erasure_list.sql"),
    },
    Migration {
        version: 6,
        name: "deadlines_and_rejections",
        sql: include_str!("../../migrations/sqlite/0006_deadlines_and_rejections.sql"),
    },
    Migration {
        version: 7,
        name: "derivatives",
        sql: include_str!("../../migrations/sqlite/0007_derivatives.sql"),
    },
    Migration {
        version: 8,
        name: "governed_flips",
        sql: include_str!("../../migrations/sqlite/0008_governed_flips.sql"),
    },
    Migration {
        version: 9,
        name: "keyed_audit",
        sql: include_str!("../../migrations/sqlite/0009_keyed_audit.sql"),
    },
    Migration {
        version: 10,
        name: "sessions_and_revocations",
        sql: include_str!("../../migrations/sqlite/0010_sessions_and_revocations.sql"),
    },
    Migration {
        version: 11,
        name: "provider_sign_outs",
        sql: include_str!("../../migrations/sqlite/0011_provider_sign_outs.sql"),
    },
];

pub const POSTGRES: &[Migration] = &[
    Migration {
        version: 1,
        name: "init",
        sql: include_str!("../../migrations/postgres/0001_init.sql"),
    },
    Migration {
        version: 2,
        name: "processors",
        sql: include_str!("../../migrations/postgres/0002_processors.sql"),
    },
    Migration {
        version: 3,
        name: "audit_tenants",
        sql: include_str!("../../migrations/postgres/0003_audit_tenants.sql"),
    },
    Migration {
        version: 4,
        name: "certificates",
        sql: include_str!("../../migrations/postgres/0004_certificates.sql"),
    },
    Migration {
        version: 5,
        name: "erasure_list",
        sql: include_str!("../../migrations/postgres/0005_erasure_list.sql"),
    },
    Migration {
        version: 6,
        name: "deadlines_and_rejections",
        sql: include_str!("../../migrations/postgres/0006_deadlines_and_rejections.sql"),
    },
    Migration {
        version: 7,
        name: "derivatives",
        sql: include_str!("../../migrations/postgres/0007_derivatives.sql"),
    },
    Migration {
        version: 8,
        name: "governed_flips",
        sql: include_str!("../../migrations/postgres/0008_governed_flips.sql"),
    },
    Migration {
        version: 9,
        name: "keyed_audit",
        sql: include_str!("../../migrations/postgres/0009_keyed_audit.sql"),
    },
    Migration {
        version: 10,
        name: "sessions_and_revocations",
        sql: include_str!("../../migrations/postgres/0010_sessions_and_revocations.sql"),
    },
    Migration {
        version: 11,
        name: "provider_sign_outs",
        sql: include_str!("../../migrations/postgres/0011_provider_sign_outs.sql"),
    },
];

pub const BOOKKEEPING: &str = "CREATE TABLE IF NOT EXISTS lethe_migrations (
    version    BIGINT PRIMARY KEY,
    name       TEXT   NOT NULL,
    applied_at TEXT   NOT NULL
)";

/// Runs each migration of `$list` not yet recorded, each in a transaction opened by `$begin`
/// after `$lock` (which serialises concurrent migrators on PostgreSQL).
macro_rules! run_migrations {
    ($begin:expr, $lock:expr, $list:expr) => {{
        let mut applied = Vec::new();
        for m in $list {
            let mut tx = $begin.await?;
            sqlx::raw_sql($lock).execute(&mut *tx).await?;
            // Inside the lock: concurrent CREATE TABLE IF NOT EXISTS can collide on PostgreSQL.
            sqlx::query(crate::migrate::BOOKKEEPING)
                .execute(&mut *tx)
                .await?;
            let done: Option<i64> =
                sqlx::query_scalar("SELECT version FROM lethe_migrations WHERE version = $1")
                    .bind(m.version)
                    .fetch_optional(&mut *tx)
                    .await?;
            if done.is_some() {
                continue;
            }
            sqlx::raw_sql(m.sql).execute(&mut *tx).await?;
            sqlx::query(
                "INSERT INTO lethe_migrations (version, name, applied_at) VALUES ($1, $2, $3)",
            )
            .bind(m.version)
            .bind(m.name)
            .bind(chrono::Utc::now().to_rfc3339())
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            applied.push(m.version);
        }
        Ok(applied)
    }};
}
pub(crate) use run_migrations;
