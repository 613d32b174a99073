//! `isolation = "collection_per_tenant"` on the Qdrant route: every collection and alias a
//! request names (in its path, in a search's `lookup_from` and `with_lookup`, in alias actions)
//! is sent as the caller's physical name, and what Qdrant answers names only the caller's, as
//! the client named them. The rest of the route sees physical names only, so lineage, stamps
//! and purges are per physical collection.

use hyper::Method;
use serde_json::{Map, Value, json};

use super::canonical_collection;
use crate::data::records::AdapterError;
use crate::namespace::Namespace;

fn invalid(message: impl Into<String>) -> AdapterError {
    AdapterError::Invalid(message.into())
}

/// A collection or alias name in the caller's namespace; one Lethe would not pass (not
/// canonical, or too long once namespaced) is refused.
fn physical(ns: &Namespace, name: &str) -> Result<String, AdapterError> {
    if !canonical_collection(name) {
        return Err(invalid(
            "collection names are letters, digits, '_', '-' and '.'",
        ));
    }
    ns.physical(name)
        .ok_or_else(|| invalid("collection names are at most 215 bytes here"))
}

/// A request as Qdrant must see it: its path, and its body when that names collections.
pub fn request(
    method: &Method,
    path: &str,
    body: &[u8],
    ns: &Namespace,
) -> Result<(String, Option<Vec<u8>>), AdapterError> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segments.as_slice() {
        // Only a POST there changes aliases; other methods name a collection called `aliases`.
        ["collections", "aliases"] if method == Method::POST => {
            let body = alias_actions(body, ns)?;
            Ok((path.to_owned(), Some(body)))
        }
        ["collections", collection, rest @ ..] => {
            let mapped = physical(ns, collection)?;
            let path = std::iter::once("collections")
                .chain(std::iter::once(mapped.as_str()))
                .chain(rest.iter().copied())
                .collect::<Vec<_>>()
                .join("/");
            if rest.is_empty() && method == Method::PUT && copies_another(body) {
                return Err(invalid(
                    "init_from is not taken here: copy points through Lethe instead",
                ));
            }
            let searches = matches!(
                rest,
                ["points", "query" | "search" | "recommend" | "discover", ..]
            );
            let body = if searches && !body.is_empty() {
                let mut value: Value =
                    serde_json::from_slice(body).map_err(|_| invalid("the body must be JSON"))?;
                lookups(&mut value, ns)?;
                Some(serde_json::to_vec(&value).map_err(|e| invalid(e.to_string()))?)
            } else {
                None
            };
            Ok((format!("/{path}"), body))
        }
        _ => Ok((path.to_owned(), None)),
    }
}

/// Whether a collection's creation would copy another collection's points (`init_from`), which
/// may be another tenant's and would not be stamped, counted or seen by Lethe. A body that is
/// not JSON is Qdrant's to refuse.
fn copies_another(body: &[u8]) -> bool {
    serde_json::from_slice::<Map<String, Value>>(body)
        .is_ok_and(|create| create.get("init_from").is_some_and(|v| !v.is_null()))
}

/// Maps every `lookup_from.collection` and `with_lookup` (a name, or `{collection}`) in a
/// search body, at any depth (prefetches, batches).
fn lookups(value: &mut Value, ns: &Namespace) -> Result<(), AdapterError> {
    match value {
        Value::Object(map) => {
            for (key, inner) in map.iter_mut() {
                match (key.as_str(), &mut *inner) {
                    ("lookup_from", Value::Object(from)) | ("with_lookup", Value::Object(from)) => {
                        if let Some(Value::String(name)) = from.get_mut("collection") {
                            *name = physical(ns, name)?;
                        }
                    }
                    ("with_lookup", Value::String(name)) => *name = physical(ns, name)?,
                    _ => lookups(inner, ns)?,
                }
            }
            Ok(())
        }
        Value::Array(items) => items.iter_mut().try_for_each(|v| lookups(v, ns)),
        _ => Ok(()),
    }
}

/// Alias actions, each rebuilt from the fields Qdrant reads, every name in the namespace (Qdrant
/// reads an action by its one key and ignores others, so nothing else is passed on).
fn alias_actions(body: &[u8], ns: &Namespace) -> Result<Vec<u8>, AdapterError> {
    let map: Map<String, Value> =
        serde_json::from_slice(body).map_err(|_| invalid("the body must be a JSON object"))?;
    if map.keys().any(|k| k != "actions") {
        return Err(invalid("alias changes: only actions"));
    }
    let Some(Value::Array(actions)) = map.get("actions") else {
        return Err(invalid("alias changes: actions must be a list"));
    };
    let fields_of = |kind: &str| -> Option<&'static [&'static str]> {
        match kind {
            "create_alias" => Some(&["collection_name", "alias_name"]),
            "delete_alias" => Some(&["alias_name"]),
            "rename_alias" => Some(&["old_alias_name", "new_alias_name"]),
            _ => None,
        }
    };
    let mut rebuilt = Vec::with_capacity(actions.len());
    for (i, action) in actions.iter().enumerate() {
        let at = format!("actions[{i}]");
        let Some((kind, Value::Object(inner))) = action
            .as_object()
            .filter(|a| a.len() == 1)
            .and_then(|a| a.iter().next())
        else {
            return Err(invalid(format!("{at}: one action, an object")));
        };
        let fields =
            fields_of(kind).ok_or_else(|| invalid(format!("{at}: unknown action {kind}")))?;
        if inner.keys().any(|k| !fields.contains(&k.as_str())) || inner.len() != fields.len() {
            return Err(invalid(format!("{at}: {kind} takes {}", fields.join(", "))));
        }
        let mut mapped = Map::new();
        for field in fields {
            let name = inner
                .get(*field)
                .and_then(Value::as_str)
                .ok_or_else(|| invalid(format!("{at}.{field}: a name")))?;
            mapped.insert((*field).to_owned(), Value::String(physical(ns, name)?));
        }
        rebuilt.push(json!({ kind: mapped }));
    }
    serde_json::to_vec(&json!({ "actions": rebuilt })).map_err(|e| invalid(e.to_string()))
}

/// What Qdrant answered, as the client may see it: lists of collections and aliases keep only
/// the caller's, by the names the client gave them; an error names the client's names. `None`:
/// the answer stands as it is. A list in an unexpected shape is answered empty: what cannot be
/// read cannot be shown to be the caller's.
pub fn answer(
    method: &Method,
    path: &str,
    success: bool,
    body: &[u8],
    ns: &Namespace,
) -> Option<Vec<u8>> {
    if !success {
        return Some(ns.scrub(&String::from_utf8_lossy(body)).into_bytes());
    }
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let list = match segments.as_slice() {
        ["collections"] | ["aliases"] | ["collections", _, "aliases"] if method != Method::GET => {
            return None;
        }
        ["collections"] => "collections",
        ["aliases"] | ["collections", _, "aliases"] => "aliases",
        _ => return None,
    };
    let own = |item: &mut Value, field: &str| -> bool {
        let logical = item
            .get(field)
            .and_then(Value::as_str)
            .and_then(|name| ns.logical(name))
            .map(str::to_owned);
        match (logical, item.get_mut(field)) {
            (Some(logical), Some(slot)) => {
                *slot = Value::String(logical);
                true
            }
            _ => false,
        }
    };
    let mut value: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    match value.pointer_mut(&format!("/result/{list}")) {
        Some(Value::Array(items)) => items.retain_mut(|item| match list {
            "collections" => own(item, "name"),
            _ => own(item, "alias_name") && own(item, "collection_name"),
        }),
        _ => value = json!({ "result": { list: [] }, "status": "ok" }),
    }
    serde_json::to_vec(&value).ok()
}

#[cfg(test)]
mod tests;
