//! `isolation = "collection_per_tenant"` on the Chroma route: each Lethe tenant's databases are
//! Chroma databases of its namespace (`default_database` becomes `lethe_<hash>__default_database`,
//! made on first use), in the route's home Chroma tenant. Chroma keeps collection names per
//! database, so names, lists and counts are the tenant's own. Chroma does not check that a
//! collection named by id in a path is in the path's database (an id is a global capability
//! there), so every request naming a collection id is checked first against the database's own
//! `collections/by-id`. Answers name the client's tenant and databases, never the physical ones.

use hyper::Method;
use serde_json::{Value, json};

use crate::data::records::AdapterError;
use crate::namespace::Namespace;

/// The database made on first use; other databases exist once an admin creates them.
pub const DEFAULT_DATABASE: &str = "default_database";
/// The Chroma tenant clients name by default.
const DEFAULT_TENANT: &str = "default_tenant";

/// What an answer of Chroma's must have changed before the client sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    AsIs,
    /// A Chroma tenant: `name`.
    Tenant,
    /// A database: `name`, `tenant`.
    Database,
    /// Every database of the home tenant: the caller's only, paged as the client asked.
    Databases,
    /// A collection: `tenant`, `database`.
    Collection,
    /// A list of collections.
    Collections,
    /// Who the caller is (`auth/identity`): the tenant and database a client uses by default.
    Identity,
}

/// A request as Chroma must see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Isolated {
    pub path: String,
    /// A body with the database it creates named physically.
    pub body: Option<Vec<u8>>,
    /// The Chroma tenant the client named, for the answers.
    pub tenant: String,
    /// The database the request is in: the client's name, and Chroma's.
    pub database: Option<(String, String)>,
    /// A collection id that must be one of the database's before the request is sent.
    pub check_id: Option<String>,
    /// The request deletes the database.
    pub drops_database: bool,
    pub shape: Shape,
}

fn invalid(message: impl Into<String>) -> AdapterError {
    AdapterError::Invalid(message.into())
}

/// A database name as Lethe lets it through (Chroma's own rule, without `+`, which it reads as a
/// topology): 3 to 200 letters, digits, `_`, `-` and `.`, not `..`.
fn database_name(name: &str) -> bool {
    (3..=200).contains(&name.len())
        && !name.contains("..")
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// A collection id as Chroma reads it from a path: a UUID, written canonically (the adapter
/// refuses other spellings of it).
fn collection_id(segment: &str) -> Option<String> {
    uuid::Uuid::parse_str(segment)
        .ok()
        .map(|u| u.hyphenated().to_string())
        .filter(|canonical| canonical == segment)
}

/// The request in the caller's namespace; `home` is the Chroma tenant its databases live in.
pub fn request(
    method: &Method,
    path: &str,
    body: &[u8],
    ns: &Namespace,
    home: &str,
) -> Result<Isolated, AdapterError> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let as_is = Isolated {
        path: path.to_owned(),
        body: None,
        tenant: String::new(),
        database: None,
        check_id: None,
        drops_database: false,
        shape: Shape::AsIs,
    };
    let rest = match segments.as_slice() {
        ["api", "v2", "tenants", rest @ ..] => rest,
        ["api", "v2", "auth", "identity"] => {
            return Ok(Isolated {
                shape: Shape::Identity,
                ..as_is
            });
        }
        _ => return Ok(as_is),
    };
    let Some((tenant, rest)) = rest.split_first() else {
        return Err(invalid(
            "Chroma tenants are Lethe's here: each Lethe tenant has its own databases",
        ));
    };
    if *tenant != DEFAULT_TENANT && *tenant != home {
        return Err(invalid(format!(
            "the Chroma tenant is {DEFAULT_TENANT} (or {home}) here"
        )));
    }
    let mut isolated = Isolated {
        tenant: (*tenant).to_owned(),
        ..as_is
    };
    let mut physical: Vec<String> = vec!["api".into(), "v2".into(), "tenants".into(), home.into()];
    match rest {
        [] if *method == Method::GET => isolated.shape = Shape::Tenant,
        [] => {
            return Err(invalid(
                "Chroma tenants are Lethe's here: each Lethe tenant has its own databases",
            ));
        }
        ["databases"] if *method == Method::GET => {
            physical.push("databases".into());
            isolated.shape = Shape::Databases;
        }
        ["databases"] => {
            physical.push("databases".into());
            isolated.body = Some(database_body(body, ns)?);
        }
        ["databases", database, rest @ ..] => {
            if !database_name(database) {
                return Err(invalid(
                    "database names are 3 to 200 letters, digits, '_', '-' and '.'",
                ));
            }
            let mapped = ns
                .physical(database)
                .ok_or_else(|| invalid("database names are at most 200 bytes here"))?;
            physical.push("databases".into());
            physical.push(mapped.clone());
            physical.extend(rest.iter().map(|s| (*s).to_owned()));
            isolated.database = Some(((*database).to_owned(), mapped));
            isolated.shape = database_shape(method, rest, &mut isolated)?;
        }
        _ => return Err(invalid("no such Chroma endpoint")),
    }
    isolated.path = format!("/{}", physical.join("/"));
    Ok(isolated)
}

/// What a request inside a database (`rest` after its name) answers; a collection it names by
/// id is checked to be the database's, and a database deleted is dropped from lineage.
fn database_shape(
    method: &Method,
    rest: &[&str],
    isolated: &mut Isolated,
) -> Result<Shape, AdapterError> {
    Ok(match rest {
        [] if *method == Method::GET => Shape::Database,
        [] => {
            isolated.drops_database = *method == Method::DELETE;
            Shape::AsIs
        }
        ["collections"] if *method == Method::GET => Shape::Collections,
        ["collections"] => Shape::Collection,
        // By name (GET, DELETE), which Chroma looks up in the path's database only.
        ["collections", _] if *method == Method::GET => Shape::Collection,
        ["collections", _] if *method == Method::DELETE => Shape::AsIs,
        // By id (PUT renames it or changes its metadata; record operations; fork).
        ["collections", id, op @ ..] => {
            let id = collection_id(id).ok_or_else(|| {
                invalid("collection ids are written as lowercase, hyphenated UUIDs")
            })?;
            isolated.check_id = Some(id);
            if op == ["fork"] {
                Shape::Collection
            } else {
                Shape::AsIs
            }
        }
        _ => Shape::AsIs,
    })
}

/// A database created: its name in the caller's namespace.
fn database_body(body: &[u8], ns: &Namespace) -> Result<Vec<u8>, AdapterError> {
    let mut value: Value =
        serde_json::from_slice(body).map_err(|_| invalid("the body must be JSON"))?;
    let name = value
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| database_name(n))
        .ok_or_else(|| invalid("name: 3 to 200 letters, digits, '_', '-' and '.'"))?;
    let mapped = ns
        .physical(name)
        .ok_or_else(|| invalid("database names are at most 200 bytes here"))?;
    value["name"] = Value::String(mapped);
    serde_json::to_vec(&value).map_err(|e| invalid(e.to_string()))
}

/// What Chroma answered, as the client may see it (`query`: the client's, for a list of
/// databases it pages itself). `None`: it stands as it is. An answer that cannot be read as its
/// shape is not shown: an empty list, or an error.
pub fn answer(
    isolated: &Isolated,
    success: bool,
    body: &[u8],
    ns: &Namespace,
    query: Option<&str>,
) -> Option<Vec<u8>> {
    if !success {
        return Some(ns.scrub(&String::from_utf8_lossy(body)).into_bytes());
    }
    if isolated.shape == Shape::AsIs {
        return None;
    }
    let value = serde_json::from_slice(body)
        .ok()
        .and_then(|value| reshaped(isolated, value, ns, query))
        .unwrap_or_else(|| match isolated.shape {
            Shape::Databases | Shape::Collections => Value::Array(Vec::new()),
            _ => json!({
                "error": "LetheUnreadableAnswer",
                "message": "Chroma's answer could not be read as the caller's",
            }),
        });
    serde_json::to_vec(&value).ok()
}

fn reshaped(
    isolated: &Isolated,
    mut value: Value,
    ns: &Namespace,
    query: Option<&str>,
) -> Option<Value> {
    let tenant = Value::String(isolated.tenant.clone());
    let logical = isolated
        .database
        .as_ref()
        .map(|(l, _)| Value::String(l.clone()));
    let collection = |c: &mut Value| -> Option<()> {
        let model = c.as_object_mut()?;
        model.insert("tenant".into(), tenant.clone());
        if let Some(logical) = &logical {
            model.insert("database".into(), logical.clone());
        }
        Some(())
    };
    match isolated.shape {
        Shape::AsIs => {}
        Shape::Tenant => *value.as_object_mut()?.get_mut("name")? = tenant.clone(),
        Shape::Database => {
            let name = value
                .get("name")
                .and_then(Value::as_str)
                .and_then(|n| ns.logical(n))?
                .to_owned();
            let model = value.as_object_mut()?;
            model.insert("name".into(), Value::String(name));
            model.insert("tenant".into(), tenant.clone());
        }
        Shape::Databases => {
            let (offset, limit) = paging(query);
            let own: Vec<Value> = value
                .as_array()?
                .iter()
                .filter_map(|d| {
                    let name = ns.logical(d.get("name")?.as_str()?)?.to_owned();
                    let mut d = d.clone();
                    d["name"] = Value::String(name);
                    d["tenant"] = tenant.clone();
                    Some(d)
                })
                .skip(offset)
                .take(limit)
                .collect();
            value = Value::Array(own);
        }
        Shape::Collection => collection(&mut value)?,
        Shape::Collections => {
            for model in value.as_array_mut()? {
                collection(model)?;
            }
        }
        // Whatever Chroma's own auth says, the caller's tenant and database are these.
        Shape::Identity => {
            let identity = value.as_object_mut()?;
            identity.insert("tenant".into(), json!(DEFAULT_TENANT));
            identity.insert("databases".into(), json!([DEFAULT_DATABASE]));
        }
    }
    Some(value)
}

/// The client's `offset` and `limit` of a list (Chroma's defaults: from the first, all).
fn paging(query: Option<&str>) -> (usize, usize) {
    let mut paging = (0, usize::MAX);
    for (name, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match (name.as_ref(), value.parse::<usize>()) {
            ("offset", Ok(n)) => paging.0 = n,
            ("limit", Ok(n)) => paging.1 = n,
            _ => {}
        }
    }
    paging
}

#[cfg(test)]
mod tests;
