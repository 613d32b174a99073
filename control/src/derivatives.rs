//! What was derived from a subject's data: an erasure's derivatives (listed, erased or released
//! by a person) and an item's lineage (its parents and children). Content-free: items by where
//! they are kept, subjects by reference.

use axum::Json;
use axum::extract::{Path, State};
use chrono::{DateTime, Utc};
use lethe_policy::How;
use serde::{Deserialize, Serialize};

use super::erasures::{ErasureView, view, visible};
use super::error::ApiError;
use super::extract::{ApiJson, ApiQuery, Caller};
use super::{ControlState, Problems};
use crate::state::{Decision, Derivative, Edge, ItemKey};

/// An item where it is kept, with its reference.
#[derive(Debug, Serialize)]
pub struct ItemView {
    #[serde(rename = "ref")]
    reference: String,
    store: String,
    collection: String,
    item: String,
}

impl ItemView {
    fn of(item: &ItemKey, caller: &Caller) -> ItemView {
        ItemView {
            reference: caller.item_ref(item),
            store: item.store.clone(),
            collection: item.collection.clone(),
            item: item.item.clone(),
        }
    }
}

/// One derivative of an erasure, as compliance staff read it.
#[derive(Debug, Serialize)]
pub struct DerivativeView {
    #[serde(flatten)]
    item: ItemView,
    /// Whose it is (its stamp's subject, by reference); `null` when lineage keeps no row of it.
    subject_ref: Option<String>,
    /// Stamped to the erased subject: purged with its items.
    own: bool,
    how: Vec<How>,
    parents: Vec<ItemView>,
    decision: Decision,
    decided_by: Option<String>,
    decided_at: Option<DateTime<Utc>>,
    reason: Option<String>,
    /// When its store was verified not to hold it any more.
    erased_at: Option<DateTime<Utc>>,
}

impl DerivativeView {
    pub(crate) fn of(caller: &Caller, tenant: &str, d: &Derivative) -> DerivativeView {
        DerivativeView {
            // The reference it was decided by (its id may have been renamed since).
            item: ItemView {
                reference: d.reference.clone(),
                ..ItemView::of(&d.item, caller)
            },
            subject_ref: d.subject.as_ref().map(|s| caller.subject_ref(tenant, s)),
            own: d.own,
            how: d.how.clone(),
            parents: d.parents.iter().map(|p| ItemView::of(p, caller)).collect(),
            decision: d.decision,
            decided_by: d.decided_by.clone(),
            decided_at: d.decided_at,
            reason: d.reason.clone(),
            erased_at: d.erased_at,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct Derivatives {
    derivatives: Vec<DerivativeView>,
}

pub async fn list(
    State(state): State<ControlState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<Derivatives>, ApiError> {
    let record = visible(&state, &caller, &id).await?;
    let derivatives = state.store.derivatives(&id).await?;
    Ok(Json(Derivatives {
        derivatives: derivatives
            .iter()
            .map(|d| DerivativeView::of(&caller, &record.tenant, d))
            .collect(),
    }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecideRequest {
    pub(crate) refs: Vec<String>,
    pub(crate) decision: Decision,
    /// Why: for the record (never sent anywhere).
    pub(crate) reason: String,
}

pub async fn decide(
    State(state): State<ControlState>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<DecideRequest>,
) -> Result<Json<ErasureView>, ApiError> {
    let record = decide_as(&state, &caller, &id, req).await?;
    Ok(Json(view(&state, record).await?))
}

/// A person's decision on undecided derivatives of a request of its tenant (the API's and the
/// console's).
pub(crate) async fn decide_as(
    state: &ControlState,
    caller: &Caller,
    id: &str,
    req: DecideRequest,
) -> Result<crate::state::ErasureRecord, ApiError> {
    let record = visible(state, caller, id).await?;
    let mut problems = Problems::default();
    problems.check(!req.refs.is_empty() && req.refs.len() <= 1000, || {
        "refs: name 1 to 1000 derivatives".into()
    });
    let mut unique = req.refs.clone();
    unique.sort();
    unique.dedup();
    problems.check(unique.len() == req.refs.len(), || {
        "refs: each derivative once".into()
    });
    problems.check(
        matches!(req.decision, Decision::Erase | Decision::Release),
        || "decision: erase or release".into(),
    );
    problems.text("reason", &req.reason);
    problems.into_result()?;
    let audit = caller.erasure_audit(&record, "erasure.decide");
    Ok(state
        .store
        .decide_derivatives(
            id,
            &req.refs,
            req.decision,
            &req.reason,
            crate::now(),
            audit,
        )
        .await?)
}

/// One edge of an item's lineage, seen from the item.
#[derive(Debug, Serialize)]
pub struct EdgeView {
    #[serde(flatten)]
    item: ItemView,
    subject_ref: String,
    how: How,
    at: DateTime<Utc>,
}

#[derive(Debug, Serialize)]
pub struct Lineage {
    #[serde(flatten)]
    item: ItemView,
    /// What the item was derived from.
    parents: Vec<EdgeView>,
    /// What was derived from it.
    children: Vec<EdgeView>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LineageQuery {
    tenant: Option<String>,
}

/// `GET /v1/lineage/{route}/{collection}/{item}`: an item's parents and children in the
/// caller's tenant; an item the tenant has no lineage of is not found.
pub async fn lineage(
    State(state): State<ControlState>,
    caller: Caller,
    Path((store, collection, item)): Path<(String, String, String)>,
    ApiQuery(query): ApiQuery<LineageQuery>,
) -> Result<Json<Lineage>, ApiError> {
    let tenant = caller.tenant(query.tenant.as_deref())?.to_owned();
    let key = ItemKey {
        store,
        collection,
        item,
    };
    let (parents, children) = state.store.edges_of(&tenant, &key).await?;
    let known = !parents.is_empty() || !children.is_empty() || {
        let owners = state
            .store
            .item_owners(&key.store, &key.collection, std::slice::from_ref(&key.item))
            .await?;
        owners.get(&key.item).is_some_and(|(t, _)| *t == tenant)
    };
    if !known {
        return Err(ApiError::not_found("item"));
    }
    let side = |edges: &[Edge], other: fn(&Edge) -> (&ItemKey, &str)| -> Vec<EdgeView> {
        edges
            .iter()
            .map(|e| {
                let (item, owner) = other(e);
                EdgeView {
                    item: ItemView::of(item, &caller),
                    subject_ref: caller.subject_ref(&tenant, owner),
                    how: e.how,
                    at: e.at,
                }
            })
            .collect()
    };
    Ok(Json(Lineage {
        item: ItemView::of(&key, &caller),
        parents: side(&parents, |e| (&e.parent, &e.parent_owner)),
        children: side(&children, |e| (&e.child, &e.child_owner)),
    }))
}
