//! `lethe audit` and `lethe replay`: the audit chain verified, signed and keyed, and the purge
//! replayed, read from the state store directly.

use std::sync::Arc;

use super::{Failure, open, purge_sources};
use crate::config::Config;
use crate::state::{self, ChainReport, Store};

/// A chain whose links are not keyed, or keyed with another key, takes no event: Lethe does not
/// serve on it. Keying a chain is the operator's, once (`lethe audit key-chain`), never Lethe's
/// on its own: whoever can write the state store could otherwise have a forged history sealed.
pub(super) async fn keyed_chain(store: &dyn Store, key: &[u8]) -> Result<(), Failure> {
    let (keyed, check) = store.audit_keying().await?;
    if !keyed {
        return Err(Failure(
            "the audit chain's links are not keyed (a chain from before they were, or one marked so since): run `lethe audit key-chain` once, then start again".into(),
            2,
        ));
    }
    if check.is_some_and(|c| c != lethe_policy::audit::key_check(key)) {
        return Err(Failure(
            "the audit chain was keyed with another audit key than the one configured here".into(),
            2,
        ));
    }
    Ok(())
}

pub(super) async fn key_chain(config: &Config) -> Result<(), Failure> {
    let store = open(config).await?;
    match store.key_audit_chain(crate::now()).await? {
        Some(old) => println!(
            "audit chain verified as written ({} events, head {}) and sealed again with the audit key",
            old.seq, old.hash
        ),
        None => println!("the audit chain is keyed already"),
    }
    Ok(())
}

pub(super) async fn replay(config: &Config, since: &str) -> Result<(), Failure> {
    let since = chrono::DateTime::parse_from_rfc3339(since)
        .map_err(|e| Failure(format!("--since: not an RFC 3339 time: {e}"), 2))?
        .with_timezone(&chrono::Utc);
    let store = open(config).await?;
    let audit_key = Arc::from(crate::keys::audit_key(config, store.as_ref()).await?);
    let (routes, governed) = purge_sources(config)?;
    let worker = crate::erasure::Worker::from_config(
        config,
        &routes,
        &governed,
        crate::stores::TARGET_KINDS,
        Arc::clone(&store),
        audit_key,
    )
    .map_err(|e| Failure(e, 2))?;
    let replayed = worker.replay(since).await?;
    let mut clean = true;
    for r in &replayed {
        match &r.report {
            Ok(report) => {
                clean &= report.remaining == 0;
                println!(
                    "{} {}: found {}, deleted {}, remaining {}",
                    r.request_id, r.target, report.before, report.deleted, report.remaining
                );
            }
            Err(e) => {
                clean = false;
                println!("{} {}: FAILED: {e}", r.request_id, r.target);
            }
        }
    }
    println!(
        "{} erasure(s) since {since} replayed",
        replayed
            .iter()
            .map(|r| &r.request_id)
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    );
    if clean {
        Ok(())
    } else {
        Err(Failure(
            "some stores are not clean; run replay again".into(),
            1,
        ))
    }
}

pub(super) async fn audit_verify(
    config: &Config,
    tenant: Option<&str>,
    saved: Option<&std::path::Path>,
) -> Result<(), Failure> {
    if let Some(tenant) = tenant
        && lethe_policy::names::canonical_key(tenant, false).as_deref() != Ok(tenant)
    {
        return Err(Failure(
            format!("--tenant {tenant:?}: not a tenant's name"),
            2,
        ));
    }
    let store = open(config).await?;
    let key = crate::keys::audit_key(config, store.as_ref()).await?;
    let public_key = crate::keys::certificate_signer(config, store.as_ref())
        .await?
        .public_key_hex();
    let saved = match saved {
        Some(path) => Some(saved_head(&public_key, path, tenant)?),
        None => None,
    };
    let genuine =
        |h: &state::SignedHead| crate::erasure::certificate::verify_head(h, &public_key).is_ok();
    let chain = tenant.map_or_else(
        || "audit chain".to_owned(),
        |t| format!("audit chain of tenant {t}"),
    );
    match state::verify_audit(store.as_ref(), &key, Some(&genuine), tenant, saved.as_ref()).await? {
        ChainReport::Intact { head, .. } => {
            let holding = saved.map_or(String::new(), |s| {
                format!(", holding the saved head at row {}", s.seq)
            });
            println!(
                "{chain} intact: {} events, head {}{holding}",
                head.seq, head.hash
            );
            Ok(())
        }
        ChainReport::Broken {
            first_bad_seq,
            message,
            ..
        } => Err(Failure(
            format!("{chain} broken at row {first_bad_seq}: {message}"),
            1,
        )),
    }
}

/// The head a file saved: one printed by `lethe audit head`, checked against this deployment's
/// signing key, or a certificate (checked the same way), whose chain head it carries (its
/// tenant's, with `--tenant`).
pub(super) fn saved_head(
    public_key: &str,
    path: &std::path::Path,
    tenant: Option<&str>,
) -> Result<lethe_policy::audit::ChainHead, Failure> {
    use crate::erasure::certificate;
    let bytes = std::fs::read(path).map_err(|e| Failure(format!("{}: {e}", path.display()), 2))?;
    let refused = |why: String| Failure(format!("{}: {why}", path.display()), 1);
    if let Ok(head) = serde_json::from_slice::<state::SignedHead>(&bytes) {
        certificate::verify_head(&head, public_key).map_err(|e| refused(e.to_string()))?;
        if head.tenant.as_deref() != tenant {
            return Err(refused(format!(
                "a head of {}, not of {}",
                head.tenant
                    .as_deref()
                    .map_or("the whole chain".to_owned(), |t| format!("tenant {t}")),
                tenant.map_or("the whole chain".to_owned(), |t| format!("tenant {t}"))
            )));
        }
        return Ok(head.anchor());
    }
    let certified = certificate::verify(&bytes, public_key).map_err(|e| {
        refused(format!(
            "neither a signed head nor a valid certificate: {e}"
        ))
    })?;
    let (field, owner) = match tenant {
        None => ("audit_chain_head", None),
        Some(t) => ("audit_tenant_head", Some(t)),
    };
    if owner.is_some() && certified["tenant"].as_str() != owner {
        return Err(refused("the certificate is of another tenant".into()));
    }
    serde_json::from_value(certified[field].clone())
        .map_err(|_| refused(format!("the certificate carries no {field}")))
}

pub(super) async fn audit_head(config: &Config, tenant: Option<&str>) -> Result<(), Failure> {
    let store = open(config).await?;
    keyed_chain(
        store.as_ref(),
        &crate::keys::audit_key(config, store.as_ref()).await?,
    )
    .await?;
    let signer = crate::keys::certificate_signer(config, store.as_ref()).await?;
    let head = store.audit_head(tenant).await?;
    let signed = signer.sign_head(tenant, &head, crate::now());
    store.keep_signed_head(&signed).await?;
    println!(
        "{}",
        serde_json::to_string_pretty(&signed).map_err(|e| Failure(e.to_string(), 2))?
    );
    Ok(())
}
