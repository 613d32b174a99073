//! The LangGraph server's HTTP API: threads (and the runs and state inside them) and the store.
//!
//! Threads are decided by the thread registry (lineage rows recorded when a thread is created
//! through Lethe): a thread Lethe did not register is never served. Their metadata carries the
//! stamp too, so that searches can be narrowed upstream. Store items live under a subject's
//! namespace (a configured template such as `[tenant, subject, ...]`) and carry the stamp in their
//! value; reads are narrowed with a value filter and every item returned is decided again.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use hyper::Method;
use lethe_policy::{
    Action, Held, Layer, Overwrite, PolicyView, ReadContext, Refusal, Stamp, WriteFacts,
    decide_read_item, decide_write, decide_write_over,
};
use serde_json::{Map, Value, json};

use crate::data::records::{AdapterError, RecordRefusal, Scope};
use crate::kit::stamp::{
    CATEGORY, PURPOSE, SUBJECT, TENANT, agree, parse_object, read_stamp, requested_expiry,
    string_field, write_stamp,
};
use crate::kit::text::text_of;

mod threads;

pub use threads::{
    check_thread_write, created_thread_id, decide_thread_write, filter_threads,
    narrow_thread_search, restamp_patch, thread_ids,
};

/// Lineage collections of a LangGraph route: the thread registry, and store items.
pub const THREADS: &str = "threads";
pub const STORE: &str = "store";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// Service information and assistant reads: no subject's data.
    PassThrough,
    /// Creating, changing or deleting assistants.
    Admin,
    CreateThread,
    SearchThreads,
    CountThreads,
    /// Reading a thread, its state, history or runs.
    ThreadRead {
        thread: String,
    },
    /// Changing a thread: its metadata (`patch`), its state, or a run that writes into it.
    ThreadWrite {
        thread: String,
        patch: bool,
    },
    DeleteThread {
        thread: String,
    },
    PutItem,
    GetItem,
    SearchItems,
    DeleteItem,
    ListNamespaces,
    /// A thread id written other than the canonical way: the server reads many spellings of a
    /// UUID as the same thread (and keeps a checkpoint history per spelling).
    NonCanonical,
    /// Stateless runs and crons (no thread holds what they keep), copies, prunes, live streams
    /// that never end, and anything unknown.
    Refused,
}

/// A thread id as the server stores it: a lowercase, hyphenated UUID.
pub fn canonical_thread_id(id: &str) -> bool {
    uuid::Uuid::parse_str(id).is_ok_and(|u| u.hyphenated().to_string() == id)
}

/// Which endpoint a request is; `path` is the part after the route prefix.
pub fn classify(method: &Method, path: &str) -> Endpoint {
    let endpoint = classify_path(method, path);
    let thread = match &endpoint {
        Endpoint::ThreadRead { thread }
        | Endpoint::ThreadWrite { thread, .. }
        | Endpoint::DeleteThread { thread } => thread,
        _ => return endpoint,
    };
    if canonical_thread_id(thread) {
        endpoint
    } else {
        Endpoint::NonCanonical
    }
}

fn classify_path(method: &Method, path: &str) -> Endpoint {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let thread = |id: &str| id.to_owned();
    match (segments.as_slice(), method.as_str()) {
        (["ok" | "info"], "GET") => Endpoint::PassThrough,
        (["assistants", "search" | "count"], "POST") => Endpoint::PassThrough,
        (["assistants", _], "GET")
        | (["assistants", _, "graph" | "schemas" | "subgraphs"], "GET")
        | (["assistants", _, "subgraphs", _], "GET") => Endpoint::PassThrough,
        (["assistants"], "POST") | (["assistants", _], "PATCH" | "DELETE") => Endpoint::Admin,
        (["assistants", _, "latest" | "versions"], "POST") => Endpoint::Admin,
        (["threads"], "POST") => Endpoint::CreateThread,
        (["threads", "search"], "POST") => Endpoint::SearchThreads,
        (["threads", "count"], "POST") => Endpoint::CountThreads,
        (["threads", "prune"], _) => Endpoint::Refused,
        (["threads", id], "GET") => Endpoint::ThreadRead { thread: thread(id) },
        (["threads", id], "PATCH") => Endpoint::ThreadWrite {
            thread: thread(id),
            patch: true,
        },
        (["threads", id], "DELETE") => Endpoint::DeleteThread { thread: thread(id) },
        (["threads", id, "state"], "GET")
        | (["threads", id, "state", _], "GET")
        | (["threads", id, "state", "checkpoint"], "POST")
        | (["threads", id, "history"], "GET" | "POST")
        | (["threads", id, "runs"], "GET")
        | (["threads", id, "runs", _], "GET")
        | (["threads", id, "runs", _, "join"], "GET") => {
            Endpoint::ThreadRead { thread: thread(id) }
        }
        (["threads", id, "state"], "POST")
        | (["threads", id, "runs"], "POST")
        | (["threads", id, "runs", "wait" | "stream"], "POST")
        | (["threads", id, "runs", _, "cancel"], "POST")
        | (["threads", id, "runs", _], "DELETE") => Endpoint::ThreadWrite {
            thread: thread(id),
            patch: false,
        },
        (["store", "items"], "PUT") => Endpoint::PutItem,
        (["store", "items"], "GET") => Endpoint::GetItem,
        (["store", "items"], "DELETE") => Endpoint::DeleteItem,
        (["store", "items", "search"], "POST") => Endpoint::SearchItems,
        (["store", "namespaces"], "POST") => Endpoint::ListNamespaces,
        _ => Endpoint::Refused,
    }
}

/// One element of the namespace template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Element {
    Literal(String),
    Tenant,
    Subject,
}

/// The namespace a subject's store items live under, e.g. `[{tenant}, {subject}]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespace(Vec<Element>);

/// Where a namespace stands against the template, for a caller's tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// It is (under) this subject's namespace.
    Subject(String),
    /// It stops before the subject's element and agrees with the template so far.
    Above,
    /// It is outside the template or the caller's tenant.
    Outside,
}

impl Default for Namespace {
    fn default() -> Self {
        Namespace(vec![Element::Tenant, Element::Subject])
    }
}

impl Namespace {
    /// The template from configuration (validated there: `{subject}` appears exactly once).
    pub fn from_template(template: &[String]) -> Namespace {
        Namespace(
            template
                .iter()
                .map(|e| match e.as_str() {
                    "{tenant}" => Element::Tenant,
                    "{subject}" => Element::Subject,
                    other => Element::Literal(other.to_owned()),
                })
                .collect(),
        )
    }

    /// The namespace prefix of one subject.
    pub fn render(&self, tenant: &str, subject: &str) -> Vec<String> {
        self.0
            .iter()
            .map(|e| match e {
                Element::Literal(l) => l.clone(),
                Element::Tenant => tenant.to_owned(),
                Element::Subject => subject.to_owned(),
            })
            .collect()
    }

    /// The labels before the subject's in a tenant (a prefix every subject's namespace has), and
    /// the depth of the subject's label.
    pub fn above_subject(&self, tenant: &str) -> (Vec<String>, usize) {
        let lead: Vec<String> = self
            .0
            .iter()
            .take_while(|e| !matches!(e, Element::Subject))
            .map(|e| match e {
                Element::Literal(l) => l.clone(),
                Element::Tenant | Element::Subject => tenant.to_owned(),
            })
            .collect();
        let depth = lead.len() + 1;
        (lead, depth)
    }

    pub fn place(&self, tenant: &str, namespace: &[String]) -> Placement {
        let mut subject = None;
        for (element, label) in self.0.iter().zip(namespace) {
            match element {
                Element::Literal(l) if l != label => return Placement::Outside,
                Element::Tenant if label != tenant => return Placement::Outside,
                Element::Subject => subject = Some(label.clone()),
                _ => {}
            }
        }
        if namespace.len() < self.0.len() {
            return Placement::Above;
        }
        subject.map_or(Placement::Outside, Placement::Subject)
    }

    fn describe(&self) -> String {
        let names: Vec<&str> = self
            .0
            .iter()
            .map(|e| match e {
                Element::Literal(l) => l.as_str(),
                Element::Tenant => "{tenant}",
                Element::Subject => "{subject}",
            })
            .collect();
        format!("[{}]", names.join(", "))
    }

    /// The subject whose namespace this is, checked against the caller's scope.
    pub fn subject_of(
        &self,
        namespace: &[String],
        scope: &Scope<'_>,
    ) -> Result<String, AdapterError> {
        match self.place(scope.tenant, namespace) {
            Placement::Subject(subject) => {
                if scope.subject.is_some_and(|s| s != subject) {
                    return Err(refused(Refusal::ScopeViolation));
                }
                Ok(subject)
            }
            Placement::Above | Placement::Outside => Err(AdapterError::Invalid(format!(
                "store items must live under the subject's namespace {} (tenant {})",
                self.describe(),
                scope.tenant
            ))),
        }
    }
}

fn refused(refusal: Refusal) -> AdapterError {
    AdapterError::Refused(vec![RecordRefusal { index: 0, refusal }])
}

/// The lineage id of a store item: its namespace and key as a JSON array, unambiguous whatever
/// the labels contain.
pub fn item_id(namespace: &[String], key: &str) -> String {
    let mut parts: Vec<&str> = namespace.iter().map(String::as_str).collect();
    parts.push(key);
    json!(parts).to_string()
}

/// The namespace and key of a store item's lineage id.
pub fn parse_item_id(id: &str) -> Option<(Vec<String>, String)> {
    let mut parts: Vec<String> = serde_json::from_str(id).ok()?;
    let key = parts.pop()?;
    Some((parts, key))
}

fn namespace_field(map: &Map<String, Value>, field: &str) -> Result<Vec<String>, AdapterError> {
    map.get(field)
        .and_then(Value::as_array)
        .and_then(|a| {
            a.iter()
                .map(|v| v.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
        })
        .ok_or_else(|| AdapterError::Invalid(format!("{field} must be an array of strings")))
}

fn key_field(map: &Map<String, Value>) -> Result<String, AdapterError> {
    map.get("key")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| AdapterError::Invalid("key must be a string".into()))
}

/// A write of one item (a new thread, or a store item) waiting for its subject's policy.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedItem {
    body: Map<String, Value>,
    /// The thread id the client chose, or the store item's lineage id.
    pub id: Option<String>,
    pub subject: String,
    purpose: String,
    category: String,
    requested_expires_at: Option<DateTime<Utc>>,
    /// `derived` once the item is found to be made from other items.
    pub layer: Layer,
}

impl PlannedItem {
    /// The text the item carries (a store item's value, a thread's metadata).
    pub fn text(&self, field: &str) -> String {
        self.body.get(field).map(text_of).unwrap_or_default()
    }
}

/// Finds subject, purpose and category of an item from the request and the item's `lethe_*`
/// fields (thread metadata or store value).
fn plan_item(
    body: Map<String, Value>,
    fields: Option<&Map<String, Value>>,
    scope: &Scope<'_>,
    subject: Option<&str>,
    id: Option<String>,
) -> Result<PlannedItem, AdapterError> {
    let record_subject = string_field(fields, SUBJECT, 0)?;
    let missing = |what, header| AdapterError::MissingScope {
        index: 0,
        what,
        header,
    };
    let subject = agree(0, subject.or(scope.subject), record_subject)?
        .ok_or_else(|| missing("subject", "Subject"))?;
    if scope.subject.is_some_and(|s| s != subject) {
        return Err(refused(Refusal::ScopeViolation));
    }
    let purpose = agree(0, scope.purpose, string_field(fields, PURPOSE, 0)?)?
        .ok_or_else(|| missing("purpose", "Purpose"))?;
    let category = agree(0, scope.category, string_field(fields, CATEGORY, 0)?)?
        .ok_or_else(|| missing("category", "Category"))?;
    Ok(PlannedItem {
        requested_expires_at: requested_expiry(fields, 0)?,
        body,
        id,
        subject,
        purpose,
        category,
        layer: Layer::Raw,
    })
}

/// `POST /threads`: the thread's subject, purpose and category.
pub fn plan_thread(body: &[u8], scope: &Scope<'_>) -> Result<PlannedItem, AdapterError> {
    let map = parse_object(body)?;
    let metadata = match map.get("metadata") {
        None | Some(Value::Null) => None,
        Some(Value::Object(m)) => Some(m.clone()),
        Some(_) => return Err(AdapterError::Invalid("metadata must be an object".into())),
    };
    // A thread id the client chooses must be written the one way the server stores it, so that
    // the owner lookup cannot be dodged by writing another subject's id differently.
    let id = match map.get("thread_id") {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) if canonical_thread_id(id) => Some(id.clone()),
        Some(_) => {
            return Err(AdapterError::Invalid(
                "thread_id must be a lowercase, hyphenated UUID".into(),
            ));
        }
    };
    // `if_exists: do_nothing` would hand out an existing thread Lethe may never have registered.
    match map.get("if_exists") {
        None | Some(Value::Null) => {}
        Some(Value::String(mode)) if mode == "raise" => {}
        Some(_) => {
            return Err(AdapterError::Invalid(
                "if_exists may only be \"raise\": an existing thread is never handed out".into(),
            ));
        }
    }
    plan_item(map, metadata.as_ref(), scope, None, id)
}

/// `PUT /store/items`: the item's subject comes from its namespace.
pub fn plan_put(
    body: &[u8],
    scope: &Scope<'_>,
    template: &Namespace,
) -> Result<PlannedItem, AdapterError> {
    let map = parse_object(body)?;
    let namespace = namespace_field(&map, "namespace")?;
    let key = key_field(&map)?;
    let subject = template.subject_of(&namespace, scope)?;
    let value = match map.get("value") {
        Some(Value::Object(v)) => v.clone(),
        _ => return Err(AdapterError::Invalid("value must be an object".into())),
    };
    let id = Some(item_id(&namespace, &key));
    plan_item(map, Some(&value), scope, Some(&subject), id)
}

/// Decides a planned write over what the server holds under its id (`held`: a store item's
/// stamp, read just before; nothing for a new thread) and writes the stamp into `field`
/// (`metadata` of a thread, `value` of a store item).
pub fn stamp_item(
    planned: PlannedItem,
    field: &str,
    tenant: &str,
    view: &impl PolicyView,
    held: Held<'_>,
    now: DateTime<Utc>,
) -> Result<(Vec<u8>, Stamp), AdapterError> {
    // A write that may create always has something to write.
    let Some(stamp) = decide_item(&planned, tenant, view, held, now)? else {
        return Err(AdapterError::Invalid("nothing to write".into()));
    };
    let PlannedItem { mut body, .. } = planned;
    let target = body.entry(field).or_insert(Value::Null);
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(m) = target {
        write_stamp(m, &stamp);
    }
    let bytes = serde_json::to_vec(&body).map_err(|e| AdapterError::Invalid(e.to_string()))?;
    Ok((bytes, stamp))
}

fn decide_item(
    planned: &PlannedItem,
    tenant: &str,
    view: &impl PolicyView,
    held: Held<'_>,
    now: DateTime<Utc>,
) -> Result<Option<Stamp>, AdapterError> {
    let facts = WriteFacts {
        tenant,
        subject: &planned.subject,
        purpose: &planned.purpose,
        category: &planned.category,
        layer: planned.layer,
        action: Action::Store,
        authorised_epoch: None,
        requested_expires_at: planned.requested_expires_at,
    };
    decide_write_over(view, &facts, held, Overwrite::Allowed, now).map_err(refused)
}

/// Whether the item could be written at all (an active subject, consent, a retention rule),
/// before the server is asked what it holds: a refused write never reaches it.
pub fn check_item(
    planned: &PlannedItem,
    tenant: &str,
    view: &impl PolicyView,
    now: DateTime<Utc>,
) -> Result<(), AdapterError> {
    decide_item(planned, tenant, view, Held::Nothing, now).map(|_| ())
}

/// What the server answered for one store item: `None` for no item, else the stamp its value
/// carries if it has a whole one (see [`Held::of`]).
pub fn held_item(answer: &Value) -> Result<Option<Option<Stamp>>, AdapterError> {
    match answer {
        Value::Null => Ok(None),
        Value::Object(item) => Ok(Some(item.get("value").and_then(read_stamp))),
        _ => Err(AdapterError::UpstreamInvalid(
            "a store item must be an object or null".into(),
        )),
    }
}

/// `GET /store/items?namespace=a.b.c&key=k[&refresh_ttl=...]`: the namespace and key asked for,
/// and the query Lethe sends the server in place of the client's, so that the server reads
/// exactly what was decided on. A parameter given twice (the server would take the last) or one
/// Lethe does not know is refused.
pub fn parse_item_query(
    query: Option<&str>,
) -> Result<(Vec<String>, String, String), AdapterError> {
    let mut namespace = None;
    let mut key = None;
    let mut refresh_ttl = None;
    for (name, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        let slot = match name.as_ref() {
            "namespace" => &mut namespace,
            "key" => &mut key,
            "refresh_ttl" => &mut refresh_ttl,
            other => {
                return Err(AdapterError::Invalid(format!(
                    "unknown query parameter {other:?}"
                )));
            }
        };
        if slot.replace(value.into_owned()).is_some() {
            return Err(AdapterError::Invalid(format!(
                "the query parameter {name} is given more than once"
            )));
        }
    }
    let (Some(namespace), Some(key)) = (namespace, key) else {
        return Err(AdapterError::Invalid(
            "namespace and key are required query parameters".into(),
        ));
    };
    let labels: Vec<String> = namespace.split('.').map(str::to_owned).collect();
    let canonical = item_query(&labels, &key, refresh_ttl.as_deref());
    Ok((labels, key, canonical))
}

/// The query string of `GET /store/items` for one item.
pub fn item_query(namespace: &[String], key: &str, refresh_ttl: Option<&str>) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    query.append_pair("namespace", &namespace.join("."));
    query.append_pair("key", key);
    if let Some(refresh) = refresh_ttl {
        query.append_pair("refresh_ttl", refresh);
    }
    query.finish()
}

/// `DELETE /store/items`: the namespace and key to delete.
pub fn parse_item_delete(body: &[u8]) -> Result<(Vec<String>, String), AdapterError> {
    let map = parse_object(body)?;
    Ok((namespace_field(&map, "namespace")?, key_field(&map)?))
}

fn item_readable(
    item: &Value,
    view: &impl PolicyView,
    ctx: &ReadContext<'_>,
    now: DateTime<Utc>,
) -> bool {
    let stamp = item.get("value").and_then(read_stamp);
    let id = served_id(item).unwrap_or_default();
    decide_read_item(view, ctx, STORE, &id, stamp.as_ref(), now).is_ok()
}

/// The lineage id of a store item of an answer (`{namespace, key, value}`).
fn served_id(item: &Value) -> Option<String> {
    let namespace: Vec<String> = item
        .get("namespace")?
        .as_array()?
        .iter()
        .map(|l| l.as_str().map(str::to_owned))
        .collect::<Option<_>>()?;
    Some(item_id(&namespace, item.get("key")?.as_str()?))
}

/// The store items an answer (one item, or a search's) serves: (lineage id, whose it is, its
/// value's text).
pub fn served_items(answer: &Value) -> Vec<(String, String, String)> {
    let single = std::slice::from_ref(answer);
    let items = answer
        .get("items")
        .and_then(Value::as_array)
        .map_or(single, Vec::as_slice);
    items
        .iter()
        .filter_map(|item| {
            let owner = item.get("value").and_then(read_stamp)?.subject;
            let text = item.get("value").map(text_of).unwrap_or_default();
            Some((served_id(item)?, owner, text))
        })
        .collect()
}

/// A single item answer (`null` when missing): an item the caller may not read is answered as
/// missing.
pub fn filter_item(
    answer: Value,
    view: &impl PolicyView,
    ctx: &ReadContext<'_>,
    now: DateTime<Utc>,
) -> Value {
    if answer.is_null() || !item_readable(&answer, view, ctx, now) {
        Value::Null
    } else {
        answer
    }
}

/// `POST /store/items/search`: the value filter gains the caller's tenant and subject, which
/// the store evaluates. Expiry is left to the filter on the answer: the in-memory server fails
/// a range condition on any item that lacks the field (one unstamped item would break every
/// search).
pub fn narrow_item_search(
    body: &[u8],
    tenant: &str,
    subject: Option<&str>,
) -> Result<Vec<u8>, AdapterError> {
    let mut map = parse_object(body)?;
    let f = object_at(&mut map, "filter")?;
    narrow(f, tenant, subject);
    serde_json::to_vec(&map).map_err(|e| AdapterError::Invalid(e.to_string()))
}

/// The object under `key` in a request's body, made when absent or null; anything else there
/// is refused, not narrowed or stamped over.
fn object_at<'m>(
    map: &'m mut Map<String, Value>,
    key: &str,
) -> Result<&'m mut Map<String, Value>, AdapterError> {
    let value = map.entry(key).or_insert(Value::Null);
    if value.is_null() {
        *value = Value::Object(Map::new());
    }
    match value {
        Value::Object(object) => Ok(object),
        _ => Err(AdapterError::Invalid(format!("{key} must be an object"))),
    }
}

/// A filter narrowed to the caller's tenant and, for a caller bound to one, subject.
fn narrow(filter: &mut Map<String, Value>, tenant: &str, subject: Option<&str>) {
    filter.insert(TENANT.into(), json!(tenant));
    if let Some(subject) = subject {
        filter.insert(SUBJECT.into(), json!(subject));
    }
}

fn items_of(answer: &Value) -> Result<&Vec<Value>, AdapterError> {
    answer
        .get("items")
        .and_then(Value::as_array)
        .ok_or_else(|| AdapterError::UpstreamInvalid("a store search must answer items".into()))
}

/// The subjects named by the stamps of a single item or a search answer.
pub fn item_subjects(answer: &Value) -> BTreeSet<String> {
    let single = std::slice::from_ref(answer);
    let items = answer
        .get("items")
        .and_then(Value::as_array)
        .map_or(single, Vec::as_slice);
    items
        .iter()
        .filter_map(|i| i.get("value")?.get(SUBJECT)?.as_str().map(str::to_owned))
        .collect()
}

/// Keeps the items of a search answer the caller may read.
pub fn filter_items(
    answer: Value,
    view: &impl PolicyView,
    ctx: &ReadContext<'_>,
    now: DateTime<Utc>,
) -> Result<Value, AdapterError> {
    items_of(&answer)?;
    let Value::Object(mut map) = answer else {
        return Err(AdapterError::UpstreamInvalid("not an object".into()));
    };
    if let Some(Value::Array(items)) = map.remove("items") {
        let kept: Vec<Value> = items
            .into_iter()
            .filter(|i| item_readable(i, view, ctx, now))
            .collect();
        map.insert("items".into(), Value::Array(kept));
    }
    Ok(Value::Object(map))
}

/// The namespaces of a `POST /store/namespaces` answer, each with where it stands.
pub fn namespaces_of(
    answer: &Value,
    template: &Namespace,
    tenant: &str,
) -> Result<Vec<(Vec<String>, Placement)>, AdapterError> {
    let invalid = || AdapterError::UpstreamInvalid("namespaces must be arrays of strings".into());
    answer
        .get("namespaces")
        .and_then(Value::as_array)
        .ok_or_else(invalid)?
        .iter()
        .map(|ns| {
            let labels: Vec<String> = ns
                .as_array()
                .and_then(|a| a.iter().map(|l| l.as_str().map(str::to_owned)).collect())
                .ok_or_else(invalid)?;
            let placement = template.place(tenant, &labels);
            Ok((labels, placement))
        })
        .collect()
}

/// Whether a subject's namespace may be read at all: not while the subject is suppressed or
/// erased.
pub fn namespace_open(view: &impl PolicyView, tenant: &str, subject: &str) -> Result<(), Refusal> {
    match view.subject(tenant, subject) {
        Some(policy) if !policy.state.is_active() => Err(Refusal::SubjectSuppressed),
        _ => Ok(()),
    }
}

/// Keeps the namespaces the caller may know of: above the subject level within its tenant, or a
/// subject's that is in scope and readable (an erased subject's namespace names stay listed
/// upstream after their items are gone).
pub fn filter_namespaces(
    placed: Vec<(Vec<String>, Placement)>,
    bound_subject: Option<&str>,
    readable: impl Fn(&str) -> bool,
) -> Value {
    let kept: Vec<Vec<String>> = placed
        .into_iter()
        .filter(|(_, placement)| match placement {
            Placement::Outside => false,
            Placement::Above => bound_subject.is_none(),
            Placement::Subject(s) => bound_subject.is_none_or(|b| b == s) && readable(s),
        })
        .map(|(labels, _)| labels)
        .collect();
    json!({ "namespaces": kept })
}

#[cfg(test)]
mod tests;
