//! The SQL Lethe installs in a governed database: pure text from the configuration.
//!
//! Schema `lethe` holds the policy the rules read (subject states, consent coverage, retention
//! rules; fed by Lethe, readable by no app role) and the functions that decide: a write is
//! stamped by a trigger (`lethe_expires_at`, `lethe_epoch`) or refused with SQLSTATE `LTH01`
//! and `lethe: <code>`; a row is visible to the app roles only while `lethe.readable` says so.
//! Row-level security is forced on every governed table, so that its owner is bound too; the
//! role Lethe connects as keeps a policy of its own that sees every row (purges), and
//! superusers bypass row security as always.

use lethe_policy::names::Folding;

use crate::PostgresTarget;
use crate::config::{GovernedDatabase, GovernedTable};

/// The version of what [`plan`] installs; bumped with every change to it.
pub const VERSION: i32 = 3;

/// The SQLSTATE of every refusal; the message names Lethe's refusal code.
pub const REFUSED: &str = "LTH01";

/// The statements, in order. Each is idempotent: run again, they leave the same objects.
/// `folding`: the tenants whose subject keys are case-insensitive.
pub fn plan(db: &GovernedDatabase, folding: &Folding) -> Vec<String> {
    // Names are compared in their NFC form, which only a UTF8 database can tell.
    let mut sql = vec!["DO $lethe$ BEGIN IF (SELECT pg_catalog.pg_encoding_to_char(encoding) FROM pg_catalog.pg_database WHERE datname = current_database()) <> 'UTF8' THEN RAISE EXCEPTION 'lethe: a governed database must be encoded in UTF8'; END IF; END $lethe$".to_owned()];
    sql.extend(schema());
    sql.push("DELETE FROM lethe.folded_tenants".into());
    for tenant in folding.tenants() {
        sql.push(format!(
            "INSERT INTO lethe.folded_tenants (tenant) VALUES ({})",
            literal(tenant)
        ));
    }
    let roles = std::iter::once((None, db.app_role.as_str())).chain(
        db.tenant_roles
            .iter()
            .map(|(t, r)| (Some(t.as_str()), r.as_str())),
    );
    let roles: Vec<(Option<&str>, &str)> = roles.collect();
    // Which tenants each app role may hear about: its own, or (the app role) every one.
    sql.push("DELETE FROM lethe.roles".into());
    for (tenant, role) in &roles {
        let tenant = tenant.map_or("NULL".to_owned(), literal);
        sql.push(format!(
            "INSERT INTO lethe.roles (role, tenant) VALUES ('{role}', {tenant})"
        ));
    }
    for (_, role) in &roles {
        sql.push(format!(
            "DO $lethe$ BEGIN IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = '{role}') THEN CREATE ROLE {role} LOGIN NOBYPASSRLS; END IF; END $lethe$"
        ));
        sql.push(format!("ALTER ROLE {role} NOBYPASSRLS"));
        // Row security filters what a vector index finds: pgvector's iterative scans keep
        // searching until the LIMIT is met by readable rows (HNSW in exact distance order).
        sql.push(format!(
            "DO $lethe$ BEGIN EXECUTE format('ALTER ROLE {role} IN DATABASE %I SET hnsw.iterative_scan = strict_order', current_database()); EXECUTE format('ALTER ROLE {role} IN DATABASE %I SET ivfflat.iterative_scan = relaxed_order', current_database()); END $lethe$"
        ));
        sql.push(format!("GRANT USAGE ON SCHEMA lethe TO {role}"));
        sql.push(format!(
            "GRANT EXECUTE ON FUNCTION lethe.readable(text, text, text, text, timestamptz, bigint), lethe.unstored(tid) TO {role}"
        ));
    }
    for table in &db.tables {
        match db.owner_of(table) {
            Some(owner) => sql.extend(linked_plan(table, owner, &roles)),
            None => sql.extend(table_plan(table, &roles)),
        }
    }
    // Large objects live outside every table, so outside the rules: no app role makes one (only
    // a superuser may take the right away from PUBLIC; otherwise the operator must, see
    // docs/threat-model.md).
    sql.push("DO $lethe$ BEGIN IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN REVOKE EXECUTE ON FUNCTION pg_catalog.lo_create(oid), pg_catalog.lo_creat(integer), pg_catalog.lo_from_bytea(oid, bytea), pg_catalog.lo_import(text), pg_catalog.lo_import(text, oid) FROM PUBLIC; END IF; END $lethe$".into());
    // Nothing in schema lethe is PUBLIC's: functions are executable by their owner and by
    // what is granted above (the app roles: `readable`, which their row security calls), and
    // every function made later starts that way too.
    // Grants of earlier installs to roles no longer configured go too.
    let kept: Vec<String> = roles.iter().map(|(_, role)| literal(role)).collect();
    sql.push(format!(
        "DO $lethe$ DECLARE g record; BEGIN FOR g IN SELECT DISTINCT p.oid::regprocedure AS fn, r.rolname FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace CROSS JOIN LATERAL aclexplode(p.proacl) a JOIN pg_catalog.pg_roles r ON r.oid = a.grantee WHERE n.nspname = 'lethe' AND a.grantee <> p.proowner AND r.rolname NOT IN ({}) LOOP EXECUTE format('REVOKE ALL ON FUNCTION %s FROM %I', g.fn, g.rolname); END LOOP; END $lethe$",
        kept.join(", ")
    ));
    sql.push("REVOKE ALL ON ALL FUNCTIONS IN SCHEMA lethe FROM PUBLIC".into());
    sql.push("ALTER DEFAULT PRIVILEGES IN SCHEMA lethe REVOKE ALL ON FUNCTIONS FROM PUBLIC".into());
    sql.push(format!(
        "INSERT INTO lethe.version (version, installed_at) VALUES ({VERSION}, now()) ON CONFLICT (version) DO NOTHING"
    ));
    sql
}

/// A text as an SQL string literal.
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// A regular expression class (PostgreSQL's) of these characters; NUL, which no text holds, is
/// left out.
fn sql_class(ranges: &[&[(char, char)]]) -> String {
    let escape = |c: char| match u32::from(c) {
        n if n <= 0xFFFF => format!("\\u{n:04X}"),
        n => format!("\\U{n:08X}"),
    };
    let mut class = String::from("[");
    for &(lo, hi) in ranges.iter().flat_map(|r| r.iter()) {
        let lo = if lo == '\0' { '\u{1}' } else { lo };
        class.push_str(&escape(lo));
        if hi != lo {
            class.push('-');
            class.push_str(&escape(hi));
        }
    }
    class.push(']');
    class
}

/// The erasure target `postgres:<name>` that purges the governed tables: every row whose
/// tenant and subject expressions name the subject, then the tables' vector indexes rebuilt
/// and the tables vacuumed.
pub fn erasure_target(db: &GovernedDatabase) -> PostgresTarget {
    let owned =
        |t: &GovernedTable| format!("({})::text = $1 AND ({})::text = $2", t.tenant, t.subject);
    // A linked table's rows are the subject's where an owner row of the subject's owns them
    // (inside the subquery, the owner's expressions name the owner's columns).
    let selected = |t: &GovernedTable| match db.owner_of(t) {
        Some(owner) => format!(
            "EXISTS (SELECT 1 FROM {} lethe_owner WHERE {} AND {})",
            owner.table,
            joined(t),
            owned(owner)
        ),
        None => owned(t),
    };
    let count = db
        .tables
        .iter()
        .map(|t| format!("(SELECT count(*) FROM {} WHERE {})", t.table, selected(t)))
        .collect::<Vec<_>>()
        .join(" + ");
    let subjects = db
        .tables
        .iter()
        .filter(|t| t.owner.is_none())
        .map(|t| {
            format!(
                "SELECT ({})::text FROM {} WHERE ({})::text = $1",
                t.subject, t.table, t.tenant
            )
        })
        .collect::<Vec<_>>()
        .join(" UNION ");
    let tables: Vec<String> = db.tables.iter().map(|t| t.table.clone()).collect();
    // Linked rows first: once their owners are gone, nothing says whose they were.
    let mut ordered: Vec<&GovernedTable> = db.tables.iter().filter(|t| t.owner.is_some()).collect();
    ordered.extend(db.tables.iter().filter(|t| t.owner.is_none()));
    PostgresTarget {
        name: db.name.clone(),
        url: db.url.clone(),
        count: format!("SELECT {count}"),
        delete: ordered
            .iter()
            .map(|t| format!("DELETE FROM {} WHERE {}", t.table, selected(t)))
            .collect(),
        subjects: Some(subjects),
        reindex: Vec::new(),
        vacuum: tables.clone(),
        vector_tables: tables,
    }
}

/// `lethe.decide_write`: a write's deadline and epoch, or its refusal. The subject's state is
/// read, not locked: a flip never waits behind the writes
/// deciding on it (a steady stream of them would hold it off). Those that decided before
/// it are waited for, then ended, before the flip is said to hold (`governed::flips`).
const DECIDE_WRITE: &str = "CREATE OR REPLACE FUNCTION lethe.decide_write(p_tenant text, p_subject text, p_purpose text, p_category text, p_requested timestamptz, OUT expires_at timestamptz, OUT epoch bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $lethe$
DECLARE
  s lethe.subjects;
  covered boolean;
  consent_end timestamptz;
  r lethe.rules;
  purpose_end timestamptz;
BEGIN
  IF p_tenant IS NULL OR p_subject IS NULL OR p_purpose IS NULL OR p_category IS NULL THEN
    PERFORM lethe.refuse('missing_scope');
  END IF;
  -- Before anything about the subject is looked at: another tenant's role learns nothing.
  IF NOT lethe.serves(p_tenant) THEN
    PERFORM lethe.refuse('scope_violation');
  END IF;
  -- Every name in its one spelling (as Lethe keeps it): no second subject behind a lookalike.
  IF NOT (lethe.canonical_name(p_tenant) AND lethe.canonical_name(p_subject)
          AND lethe.canonical_name(p_purpose) AND lethe.canonical_name(p_category))
     OR (p_subject <> lower(p_subject) AND EXISTS (SELECT 1 FROM lethe.folded_tenants f WHERE f.tenant = p_tenant)) THEN
    PERFORM lethe.refuse('invalid_name');
  END IF;
  SELECT * INTO s FROM lethe.subjects WHERE tenant = p_tenant AND subject = p_subject;
  IF FOUND AND NOT s.active THEN
    PERFORM lethe.refuse('subject_suppressed');
  END IF;
  SELECT bool_or(true), max(coalesce(c.ends_at, 'infinity')) INTO covered, consent_end
    FROM lethe.consents c
   WHERE c.tenant = p_tenant AND c.subject = p_subject AND c.purpose = p_purpose
     AND c.category = p_category AND c.action = 'store' AND (c.ends_at IS NULL OR c.ends_at > now());
  IF covered IS NULL THEN
    PERFORM lethe.refuse('consent_required');
  END IF;
  SELECT * INTO r FROM lethe.rules WHERE tenant = p_tenant AND purpose = p_purpose AND category = p_category;
  IF NOT FOUND THEN
    PERFORM lethe.refuse('no_retention_rule');
  END IF;
  SELECT e.ends_at INTO purpose_end FROM lethe.purpose_ends e WHERE e.tenant = p_tenant AND e.purpose = p_purpose;
  expires_at := least(now() + make_interval(secs => r.max_age_seconds), nullif(consent_end, 'infinity'),
                      purpose_end, r.legal_end, p_requested);
  IF expires_at <= now() THEN
    PERFORM lethe.refuse('expired');
  END IF;
  epoch := coalesce(s.epoch, 0);
END $lethe$";

/// Whether a stamped row may be read now: its subject active in the epoch it was written in,
/// with `retrieve` consent, before its deadline, by a role serving its tenant.
const READABLE: &str = "CREATE OR REPLACE FUNCTION lethe.readable(p_tenant text, p_subject text, p_purpose text, p_category text, p_expires_at timestamptz, p_epoch bigint)
RETURNS boolean LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $lethe$
  SELECT p_expires_at IS NOT NULL AND p_epoch IS NOT NULL AND p_expires_at > now()
     AND lethe.serves(p_tenant)
     AND EXISTS (SELECT 1 FROM lethe.subjects s
                  WHERE s.tenant = p_tenant AND s.subject = p_subject AND s.active AND s.epoch = p_epoch)
     AND EXISTS (SELECT 1 FROM lethe.consents c
                  WHERE c.tenant = p_tenant AND c.subject = p_subject AND c.purpose = p_purpose
                    AND c.category = p_category AND c.action = 'retrieve'
                    AND (c.ends_at IS NULL OR c.ends_at > now()))
$lethe$";

/// What the sweep deletes: a stamped row past its deadline, or whose `store` consent is
/// gone (as a revocation expires what was kept for it), unless a hold keeps it.
const SWEEPABLE: &str = "CREATE OR REPLACE FUNCTION lethe.sweepable(p_tenant text, p_subject text, p_purpose text, p_category text, p_expires_at timestamptz)
RETURNS boolean LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $lethe$
  SELECT p_expires_at IS NOT NULL
     AND (p_expires_at <= now()
          OR NOT EXISTS (SELECT 1 FROM lethe.consents c
                          WHERE c.tenant = p_tenant AND c.subject = p_subject AND c.purpose = p_purpose
                            AND c.category = p_category AND c.action = 'store'
                            AND (c.ends_at IS NULL OR c.ends_at > now())))
     AND NOT EXISTS (SELECT 1 FROM lethe.holds h
                      WHERE h.tenant = p_tenant AND (h.subject IS NULL OR h.subject = p_subject))
$lethe$";

/// The policy tables and the deciding functions.
pub(crate) fn schema() -> Vec<String> {
    use lethe_policy::names::{CONTROL, INVISIBLE, WHITESPACE};
    let invisible = sql_class(&[CONTROL, INVISIBLE]);
    let whitespace = sql_class(&[WHITESPACE]);
    vec![
        "CREATE SCHEMA IF NOT EXISTS lethe".into(),
        "REVOKE ALL ON SCHEMA lethe FROM PUBLIC".into(),
        "CREATE TABLE IF NOT EXISTS lethe.version (version integer PRIMARY KEY, installed_at timestamptz NOT NULL)".into(),
        "CREATE TABLE IF NOT EXISTS lethe.subjects (tenant text NOT NULL, subject text NOT NULL, active boolean NOT NULL, epoch bigint NOT NULL, PRIMARY KEY (tenant, subject))".into(),
        "CREATE TABLE IF NOT EXISTS lethe.consents (tenant text NOT NULL, subject text NOT NULL, purpose text NOT NULL, category text NOT NULL, action text NOT NULL, ends_at timestamptz)".into(),
        "CREATE INDEX IF NOT EXISTS consents_scope ON lethe.consents (tenant, subject, purpose, category, action)".into(),
        "CREATE TABLE IF NOT EXISTS lethe.rules (tenant text NOT NULL, purpose text NOT NULL, category text NOT NULL, max_age_seconds bigint NOT NULL, legal_end timestamptz, PRIMARY KEY (tenant, purpose, category))".into(),
        "CREATE TABLE IF NOT EXISTS lethe.purpose_ends (tenant text NOT NULL, purpose text NOT NULL, ends_at timestamptz NOT NULL, PRIMARY KEY (tenant, purpose))".into(),
        // Active legal holds: a subject's, or (subject NULL) the whole tenant's.
        "CREATE TABLE IF NOT EXISTS lethe.holds (tenant text NOT NULL, subject text)".into(),
        "CREATE INDEX IF NOT EXISTS holds_scope ON lethe.holds (tenant, subject)".into(),
        // The app roles and the tenant each serves (NULL: every tenant).
        "CREATE TABLE IF NOT EXISTS lethe.roles (role text PRIMARY KEY, tenant text)".into(),
        // Whether the session's role may hear about a tenant: a role that acts as app roles (is
        // one, is a member of one, may SET ROLE to one) only of the tenants they serve; any
        // other role (the tables' owner, Lethe) is not an app role and is not scoped. The
        // session's role, not the definer's: every caller is a SECURITY DEFINER.
        "CREATE OR REPLACE FUNCTION lethe.serves(p_tenant text) RETURNS boolean LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $lethe$
  SELECT NOT EXISTS (SELECT 1 FROM lethe.roles r WHERE pg_has_role(session_user, r.role, 'MEMBER'))
      OR EXISTS (SELECT 1 FROM lethe.roles r WHERE pg_has_role(session_user, r.role, 'MEMBER') AND (r.tenant IS NULL OR r.tenant = p_tenant))
$lethe$".into(),
        // Tenants whose subject keys are case-insensitive: kept in lower case.
        "CREATE TABLE IF NOT EXISTS lethe.folded_tenants (tenant text PRIMARY KEY)".into(),
        // The same rule as `lethe_policy::names::canonical_key`, over a name as the row holds it:
        // NFC, nothing invisible, no whitespace at its edges, no '/', 1 to 200 bytes.
        format!(
            "CREATE OR REPLACE FUNCTION lethe.canonical_name(p text) RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $lethe$
  SELECT p IS NOT NULL AND p <> '' AND octet_length(p) <= 200 AND p IS NFC NORMALIZED
     AND p !~ '{invisible}' AND p !~ '^{whitespace}|{whitespace}$' AND strpos(p, '/') = 0
$lethe$"
        ),
        format!(
            "CREATE OR REPLACE FUNCTION lethe.refuse(code text) RETURNS void LANGUAGE plpgsql AS $lethe$
BEGIN
  RAISE EXCEPTION USING ERRCODE = '{REFUSED}', MESSAGE = 'lethe: ' || code,
    HINT = 'refused by the policy Lethe installed; see the subject''s consent, state and retention rules';
END $lethe$"
        ),
        DECIDE_WRITE.into(),
        READABLE.into(),
        SWEEPABLE.into(),
        // Whether a row is one being written and not stored yet: an INSERT ... ON CONFLICT
        // checks the row it would store as a read, before it has a place. It says nothing of any
        // stored row, anyone's.
        "CREATE OR REPLACE FUNCTION lethe.unstored(p_ctid tid) RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog, pg_temp AS $lethe$
  SELECT p_ctid = '(4294967295,0)'::tid
$lethe$".into(),
        "REVOKE ALL ON ALL TABLES IN SCHEMA lethe FROM PUBLIC".into(),
    ]
}

/// Drops the table's `lethe_*` policies of roles no longer configured (an earlier install's): a
/// role Lethe no longer scopes must not keep what it was given.
fn stale_policies(table: &GovernedTable, roles: &[(Option<&str>, &str)]) -> String {
    let kept: Vec<String> = std::iter::once("'lethe_itself'".to_owned())
        .chain(roles.iter().map(|(_, role)| format!("'lethe_{role}'")))
        .collect();
    format!(
        "DO $lethe$ DECLARE p record; BEGIN FOR p IN SELECT policyname FROM pg_catalog.pg_policies WHERE schemaname = {} AND tablename = {} AND policyname LIKE 'lethe\\_%' AND policyname NOT IN ({}) LOOP EXECUTE format('DROP POLICY %I ON {}', p.policyname); END LOOP; END $lethe$",
        literal(schema_of(table)),
        literal(bare(table)),
        kept.join(", "),
        table.table
    )
}

/// The name of a table's objects in schema lethe: `public.memories` -> `public_memories`.
fn object_name(table: &GovernedTable) -> String {
    table.table.replace('.', "_")
}

/// The schema a table's sequences are in.
fn schema_of(table: &GovernedTable) -> &str {
    table
        .table
        .split_once('.')
        .map_or("public", |(schema, _)| schema)
}

/// The four expressions over the row, as text, in order tenant, subject, purpose, category.
fn scope_of(table: &GovernedTable) -> String {
    format!(
        "({})::text, ({})::text, ({})::text, ({})::text",
        table.tenant, table.subject, table.purpose, table.category
    )
}

/// The statement the retention sweep runs on a governed table: rows past their deadline (or
/// whose consent is gone), and rows of a linked table whose owner is gone.
pub fn sweep(table: &GovernedTable, owner: Option<&GovernedTable>) -> String {
    match owner {
        Some(owner) => format!(
            "DELETE FROM {} WHERE NOT EXISTS (SELECT 1 FROM {} lethe_owner WHERE {})",
            table.table,
            owner.table,
            joined(table)
        ),
        None => format!(
            "DELETE FROM {} WHERE lethe.sweepable(({})::text, ({})::text, ({})::text, ({})::text, lethe_expires_at)",
            table.table, table.tenant, table.subject, table.purpose, table.category
        ),
    }
}

/// The last part of a table's name, which qualifies its columns.
fn bare(table: &GovernedTable) -> &str {
    table.table.rsplit('.').next().unwrap_or(&table.table)
}

/// The condition that a row of the owner (`lethe_owner`) owns the linked table's row.
pub fn joined(table: &GovernedTable) -> String {
    let name = bare(table);
    table
        .key
        .iter()
        .map(|k| format!("lethe_owner.{k} = {name}.{k}"))
        .collect::<Vec<_>>()
        .join(" AND ")
}

/// A table whose rows take their scope from their owner's row: readable while an owner row the
/// reader may read exists (the owner's own row security applies), written only when, at commit,
/// a stamped owner row exists whose subject may still store (a deferred check, since apps write
/// such rows before their owner's, as LangGraph's checkpointer does).
fn linked_plan(
    table: &GovernedTable,
    owner: &GovernedTable,
    roles: &[(Option<&str>, &str)],
) -> Vec<String> {
    let t = &table.table;
    let name = object_name(table);
    let join = joined(table).replace(&format!("{}.", bare(table)), "NEW.");
    let scope = scope_of(owner);
    let mut sql = vec![
        stale_policies(table, roles),
        format!(
            "CREATE OR REPLACE FUNCTION lethe.owned_{name}() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $lethe$
DECLARE
  lethe_scope text[];
BEGIN
  -- Another tenant's owner looks absent: a write says nothing of whether it exists.
  SELECT ARRAY[{scope}] INTO lethe_scope FROM {o} lethe_owner WHERE {join} AND lethe_owner.lethe_epoch IS NOT NULL
     AND lethe.serves(({owner_tenant})::text) LIMIT 1;
  IF lethe_scope IS NULL THEN
    PERFORM lethe.refuse('owner_required');
  END IF;
  PERFORM lethe.decide_write(lethe_scope[1], lethe_scope[2], lethe_scope[3], lethe_scope[4], NULL);
  RETURN NULL;
END $lethe$",
            o = owner.table,
            owner_tenant = owner.tenant
        ),
        format!("DROP TRIGGER IF EXISTS lethe_owned ON {t}"),
        format!(
            "CREATE CONSTRAINT TRIGGER lethe_owned AFTER INSERT OR UPDATE ON {t} DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION lethe.owned_{name}()"
        ),
        format!("ALTER TABLE {t} ENABLE ROW LEVEL SECURITY"),
        format!("ALTER TABLE {t} FORCE ROW LEVEL SECURITY"),
        format!("DROP POLICY IF EXISTS lethe_itself ON {t}"),
        format!("CREATE POLICY lethe_itself ON {t} TO CURRENT_USER USING (true) WITH CHECK (true)"),
    ];
    // Readable under an owner row the reader may read; or, not stored yet, as the row an
    // INSERT ... ON CONFLICT checks (apps write such rows before their owner's): the deferred
    // check decides it at commit. Nothing here says whether another tenant's owner exists.
    let owned = format!(
        "EXISTS (SELECT 1 FROM {} lethe_owner WHERE {}) OR lethe.unstored({name}.ctid)",
        owner.table,
        joined(table),
        name = bare(table)
    );
    let params: Vec<String> = table.key.iter().map(|_| "text".to_owned()).collect();
    let gone: Vec<String> = table
        .key
        .iter()
        .map(|k| format!("lethe_gone.{k} = {}.{k}", bare(table)))
        .collect();
    let still: Vec<String> = table
        .key
        .iter()
        .map(|k| format!("lethe_owner.{k} = {}.{k}", bare(table)))
        .collect();
    sql.extend([
        // When an owner's last row for a key goes (a purge, a sweep, the app's own delete), its
        // linked rows go with it: no committed row is left without an owner.
        format!(
            "CREATE OR REPLACE FUNCTION lethe.cascade_{name}() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $lethe$
BEGIN
  DELETE FROM {t} WHERE EXISTS (SELECT 1 FROM lethe_gone WHERE {})
    AND NOT EXISTS (SELECT 1 FROM {o} lethe_owner WHERE {});
  RETURN NULL;
END $lethe$",
            gone.join(" AND "),
            still.join(" AND "),
            o = owner.table
        ),
        format!("DROP TRIGGER IF EXISTS lethe_cascade_{name} ON {}", owner.table),
        format!(
            "CREATE TRIGGER lethe_cascade_{name} AFTER DELETE ON {} REFERENCING OLD TABLE AS lethe_gone FOR EACH STATEMENT EXECUTE FUNCTION lethe.cascade_{name}()",
            owner.table
        ),
    ]);
    for (_, role) in roles {
        let policy = format!("lethe_{role}");
        sql.extend([
            format!("GRANT SELECT, INSERT, UPDATE, DELETE ON {t} TO {role}"),
            format!("GRANT USAGE ON SCHEMA {} TO {role}", schema_of(table)),
            format!("DROP POLICY IF EXISTS {policy} ON {t}"),
            // The owner's row security decides what the role may read of it, tenant included.
            format!("CREATE POLICY {policy} ON {t} TO {role} USING ({owned}) WITH CHECK (true)"),
        ]);
    }
    // Installed by earlier versions: it answered whether any tenant's owner row exists.
    sql.push(format!(
        "DROP FUNCTION IF EXISTS lethe.has_owner_{name}({})",
        params.join(", ")
    ));
    sql
}

fn table_plan(table: &GovernedTable, roles: &[(Option<&str>, &str)]) -> Vec<String> {
    let t = &table.table;
    let name = object_name(table);
    let scope = scope_of(table);
    let readable = format!("lethe.readable({scope}, lethe_expires_at, lethe_epoch)");
    let mut sql = vec![
        stale_policies(table, roles),
        format!("ALTER TABLE {t} ADD COLUMN IF NOT EXISTS lethe_expires_at timestamptz"),
        format!("ALTER TABLE {t} ADD COLUMN IF NOT EXISTS lethe_epoch bigint"),
        // Decides every written row: the row's own scope, the subject's current state; an
        // update keeps the row's owner and use, and its earlier deadline.
        format!(
            "CREATE OR REPLACE FUNCTION lethe.stamp_{name}() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $lethe$
DECLARE
  lethe_scope text[];
  lethe_was text[];
  lethe_decided record;
  lethe_requested timestamptz := NEW.lethe_expires_at;
BEGIN
  SELECT ARRAY[{scope}] INTO lethe_scope FROM (SELECT (NEW).*) AS lethe_row;
  IF TG_OP = 'UPDATE' THEN
    SELECT ARRAY[{scope}] INTO lethe_was FROM (SELECT (OLD).*) AS lethe_row;
    IF lethe_scope IS DISTINCT FROM lethe_was THEN
      PERFORM lethe.refuse('scope_violation');
    END IF;
    IF OLD.lethe_expires_at IS NULL OR OLD.lethe_epoch IS NULL THEN
      PERFORM lethe.refuse('unstamped_item');
    END IF;
    lethe_requested := least(lethe_requested, OLD.lethe_expires_at);
  END IF;
  lethe_decided := lethe.decide_write(lethe_scope[1], lethe_scope[2], lethe_scope[3], lethe_scope[4], lethe_requested);
  IF TG_OP = 'UPDATE' AND OLD.lethe_epoch IS DISTINCT FROM lethe_decided.epoch THEN
    PERFORM lethe.refuse('stale_epoch');
  END IF;
  NEW.lethe_expires_at := lethe_decided.expires_at;
  NEW.lethe_epoch := lethe_decided.epoch;
  RETURN NEW;
END $lethe$"
        ),
        format!("DROP TRIGGER IF EXISTS lethe_stamp ON {t}"),
        format!(
            "CREATE TRIGGER lethe_stamp BEFORE INSERT OR UPDATE ON {t} FOR EACH ROW EXECUTE FUNCTION lethe.stamp_{name}()"
        ),
        format!("ALTER TABLE {t} ENABLE ROW LEVEL SECURITY"),
        format!("ALTER TABLE {t} FORCE ROW LEVEL SECURITY"),
        // Lethe's own connection sees and deletes every row (purges, sweeps).
        format!("DROP POLICY IF EXISTS lethe_itself ON {t}"),
        format!("CREATE POLICY lethe_itself ON {t} TO CURRENT_USER USING (true) WITH CHECK (true)"),
    ];
    for (tenant, role) in roles {
        let only = match tenant {
            Some(tenant) => format!(" AND ({}) = '{tenant}'", table.tenant),
            None => String::new(),
        };
        let policy = format!("lethe_{role}");
        sql.extend([
            format!("GRANT SELECT, INSERT, UPDATE, DELETE ON {t} TO {role}"),
            format!("GRANT USAGE ON SCHEMA {} TO {role}", schema_of(table)),
            format!(
                "GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {} TO {role}",
                schema_of(table)
            ),
            format!("DROP POLICY IF EXISTS {policy} ON {t}"),
            // What the trigger stamped may be written; what is readable may be read, changed
            // and deleted.
            format!(
                "CREATE POLICY {policy} ON {t} TO {role} USING ({readable}{only}) WITH CHECK (lethe_expires_at IS NOT NULL AND lethe_epoch IS NOT NULL{only})"
            ),
        ]);
    }
    sql
}

#[cfg(test)]
mod tests;
