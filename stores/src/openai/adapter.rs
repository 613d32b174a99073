//! An OpenAI-compatible provider's HTTP API (`/v1/...`).
//!
//! Every request is about one subject and is decided before it leaves: an active subject,
//! `send_to_provider` consent for the request's purpose, and for what the provider would keep
//! (stored responses, conversations, stored chat completions) `provider_retention` consent, or the
//! request is rewritten not to be stored. Objects the provider keeps (responses, conversations,
//! their items, files) are recorded as the subject's, and any later request naming one is decided
//! on that record.

use chrono::{DateTime, Utc};
use hyper::Method;
use lethe_policy::{ProviderGrant, Refusal, Stamp, SubjectState};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::data::records::AdapterError;
use crate::kit::stamp::parse_object;
use crate::kit::text::text_of;

/// Lineage collections of a provider route.
pub const RESPONSES: &str = "responses";
pub const CONVERSATIONS: &str = "conversations";
/// Conversation items, recorded as `conversation_id/item_id`.
pub const ITEMS: &str = "conversation_items";
pub const FILES: &str = "files";
/// Stored chat completions (`store: true` with consent).
pub const CHAT: &str = "chat_completions";
/// SHA-256 of each embeddings input: the text never, its fingerprint so derived caches can be
/// traced.
pub const EMBEDDED: &str = "embedded_inputs";

/// What a request sends to the provider for the first time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Generate {
    Chat,
    Responses,
    Embeddings,
}

/// What a request does to an object the provider keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    /// Adds to it (new conversation items, a metadata update, a cancel).
    Write,
    Delete,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// The model list: no subject's data.
    Models,
    Generate(Generate),
    CreateConversation,
    UploadFile,
    ListFiles,
    /// `collection` is `RESPONSES`, `CONVERSATIONS` or `FILES`; `item` a conversation item.
    Object {
        collection: &'static str,
        id: String,
        item: Option<String>,
        access: Access,
    },
    Refused,
}

/// Which endpoint a request is; `path` is the part after the route prefix.
pub fn classify(method: &Method, path: &str) -> Endpoint {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let object = |collection, id: &str, item: Option<&str>, access| Endpoint::Object {
        collection,
        id: id.to_owned(),
        item: item.map(str::to_owned),
        access,
    };
    use Access::{Delete, Read, Write};
    match (segments.as_slice(), method.as_str()) {
        (["v1", "models"] | ["v1", "models", _], "GET") => Endpoint::Models,
        (["v1", "chat", "completions"], "POST") => Endpoint::Generate(Generate::Chat),
        (["v1", "embeddings"], "POST") => Endpoint::Generate(Generate::Embeddings),
        (["v1", "responses"], "POST") => Endpoint::Generate(Generate::Responses),
        (["v1", "responses", id], "GET") | (["v1", "responses", id, "input_items"], "GET") => {
            object(RESPONSES, id, None, Read)
        }
        (["v1", "responses", id], "DELETE") => object(RESPONSES, id, None, Delete),
        (["v1", "responses", id, "cancel"], "POST") => object(RESPONSES, id, None, Write),
        (["v1", "conversations"], "POST") => Endpoint::CreateConversation,
        (["v1", "conversations", id], "GET") | (["v1", "conversations", id, "items"], "GET") => {
            object(CONVERSATIONS, id, None, Read)
        }
        (["v1", "conversations", id], "POST") | (["v1", "conversations", id, "items"], "POST") => {
            object(CONVERSATIONS, id, None, Write)
        }
        (["v1", "conversations", id], "DELETE") => object(CONVERSATIONS, id, None, Delete),
        (["v1", "conversations", id, "items", item], "GET") => {
            object(CONVERSATIONS, id, Some(item), Read)
        }
        (["v1", "conversations", id, "items", item], "DELETE") => {
            object(CONVERSATIONS, id, Some(item), Delete)
        }
        (["v1", "files"], "POST") => Endpoint::UploadFile,
        (["v1", "files"], "GET") => Endpoint::ListFiles,
        (["v1", "files", id] | ["v1", "files", id, "content"], "GET") => {
            object(FILES, id, None, Read)
        }
        (["v1", "files", id], "DELETE") => object(FILES, id, None, Delete),
        _ => Endpoint::Refused,
    }
}

/// A request that sends new data, as Lethe forwards it.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    pub body: Vec<u8>,
    /// The client asked for server-sent events.
    pub stream: bool,
    /// Whether the provider will keep what it is sent (after the rewrite).
    pub stored: bool,
    /// Objects the request builds on, which must be the subject's: (collection, id).
    pub builds_on: Vec<(&'static str, String)>,
    /// Fingerprints of embeddings inputs.
    pub fingerprints: Vec<String>,
    /// The text the request sends (messages, input, instructions).
    pub prompt: String,
}

fn id_field(value: Option<&Value>, what: &str) -> Result<Option<String>, AdapterError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(id)) => Ok(Some(id.clone())),
        Some(Value::Object(o)) => match o.get("id") {
            Some(Value::String(id)) => Ok(Some(id.clone())),
            _ => Err(AdapterError::Invalid(format!("{what}.id must be a string"))),
        },
        Some(_) => Err(AdapterError::Invalid(format!("{what} must be an id"))),
    }
}

/// Rewrites a chat completion, response or embeddings request to what `grant` allows: a request
/// the provider would store (`store: true`, or a response relying on the provider's default of
/// storing) is rewritten to `store: false` unless consent covers `provider_retention`; a response
/// added to a conversation is stored by definition and needs that consent.
pub fn plan(kind: Generate, body: &[u8], grant: &ProviderGrant) -> Result<Planned, AdapterError> {
    let mut map = parse_object(body)?;
    let stream = match map.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(AdapterError::Invalid("stream must be a boolean".into())),
    };
    let asked_store = match map.get("store") {
        None | Some(Value::Null) => kind == Generate::Responses,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(AdapterError::Invalid("store must be a boolean".into())),
    };
    let mut builds_on = Vec::new();
    let mut fingerprints = Vec::new();
    if asked_store && !grant.retention {
        map.insert("store".into(), Value::Bool(false));
    }
    let mut stored = asked_store && grant.retention && kind != Generate::Embeddings;
    if kind == Generate::Embeddings {
        if stream {
            return Err(AdapterError::Invalid("embeddings are not streamed".into()));
        }
        fingerprints = embedding_fingerprints(&map)?;
    }
    for value in map.values() {
        references(value, &mut builds_on)?;
    }
    if kind == Generate::Responses {
        if let Some(id) = id_field(map.get("previous_response_id"), "previous_response_id")? {
            builds_on.push((RESPONSES, id));
        }
        if let Some(id) = id_field(map.get("conversation"), "conversation")? {
            if !grant.retention {
                return Err(refused(Refusal::ConsentRequired));
            }
            stored = true;
            builds_on.push((CONVERSATIONS, id));
        }
    }
    let body = serde_json::to_vec(&map).map_err(|e| AdapterError::Invalid(e.to_string()))?;
    Ok(Planned {
        body,
        stream,
        stored,
        builds_on,
        fingerprints,
        prompt: text_of(&Value::Object(map)),
    })
}

/// Provider objects a request's content names: files (`file_id`, `file_ids`) must be the
/// subject's, like everything else; objects Lethe does not track (vector stores, existing
/// containers, references to earlier items) cannot be named at all.
fn references(value: &Value, found: &mut Vec<(&'static str, String)>) -> Result<(), AdapterError> {
    let untracked = |what: &str| {
        AdapterError::Invalid(format!(
            "{what}: provider objects Lethe does not track cannot be used"
        ))
    };
    match value {
        Value::Object(object) => {
            if object.get("type").and_then(Value::as_str) == Some("item_reference") {
                return Err(untracked("item_reference"));
            }
            for (key, inner) in object {
                match (key.as_str(), inner) {
                    ("file_id", Value::String(id)) => found.push((FILES, id.clone())),
                    ("file_ids", Value::Array(ids)) => {
                        for id in ids {
                            let id = id.as_str().ok_or_else(|| {
                                AdapterError::Invalid("file_ids must be strings".into())
                            })?;
                            found.push((FILES, id.to_owned()));
                        }
                    }
                    ("vector_store_ids", _) => return Err(untracked("vector_store_ids")),
                    ("container", Value::String(_)) => return Err(untracked("container")),
                    _ => references(inner, found)?,
                }
            }
            Ok(())
        }
        Value::Array(items) => items.iter().try_for_each(|v| references(v, found)),
        _ => Ok(()),
    }
}

fn refused(refusal: Refusal) -> AdapterError {
    AdapterError::Refused(vec![crate::data::records::RecordRefusal {
        index: 0,
        refusal,
    }])
}

/// SHA-256 (hex) of each input: a string, an array of strings, or token arrays (hashed as JSON).
fn embedding_fingerprints(map: &Map<String, Value>) -> Result<Vec<String>, AdapterError> {
    let hash = |bytes: &[u8]| hex::encode(Sha256::digest(bytes));
    match map.get("input") {
        Some(Value::String(text)) => Ok(vec![hash(text.as_bytes())]),
        Some(Value::Array(inputs)) if !inputs.is_empty() => Ok(inputs
            .iter()
            .map(|input| match input {
                Value::String(text) => hash(text.as_bytes()),
                other => hash(other.to_string().as_bytes()),
            })
            .collect()),
        _ => Err(AdapterError::Invalid(
            "input must be a string or a non-empty array".into(),
        )),
    }
}

/// A request about an object the provider keeps: allowed when lineage records it as the
/// caller's subject's (same tenant, same subject) and, except for a delete, kept for the
/// request's purpose, with the subject active and still in the epoch the object was made in.
/// `registered` is lineage's stamp of the object; `owner` the subject's state now.
pub fn decide_object(
    registered: Option<&Stamp>,
    tenant: &str,
    subject: &str,
    purpose: &str,
    access: Access,
    owner: SubjectState,
) -> Result<(), Refusal> {
    let stamp = registered.ok_or(Refusal::UnstampedItem)?;
    if stamp.tenant != tenant || stamp.subject != subject {
        return Err(Refusal::ScopeViolation);
    }
    if access == Access::Delete {
        return Ok(());
    }
    if stamp.purpose != purpose {
        return Err(Refusal::ScopeViolation);
    }
    if !owner.is_active() {
        return Err(Refusal::SubjectSuppressed);
    }
    if owner.epoch != stamp.epoch {
        return Err(Refusal::StaleEpoch);
    }
    Ok(())
}

/// Upload purposes the provider keeps without training on them.
const KEPT_PURPOSES: [&str; 5] = ["assistants", "batch", "user_data", "vision", "evals"];

/// `POST /v1/files`: whatever is uploaded is kept by the provider and needs `provider_retention`;
/// a fine-tuning upload needs `train` too. The upload must name exactly one known purpose.
pub fn decide_upload(purposes: &[String], grant: &ProviderGrant) -> Result<(), AdapterError> {
    let [purpose] = purposes else {
        return Err(AdapterError::Invalid(
            "an upload names exactly one purpose".into(),
        ));
    };
    let training = purpose == "fine-tune";
    if !training && !KEPT_PURPOSES.contains(&purpose.as_str()) {
        return Err(AdapterError::Invalid(format!(
            "purpose must be fine-tune or one of {}",
            KEPT_PURPOSES.join(", ")
        )));
    }
    if !grant.retention || (training && !grant.train) {
        return Err(refused(Refusal::ConsentRequired));
    }
    Ok(())
}

/// Every value of a text field of a `multipart/form-data` body (the `purpose` of an upload).
pub fn multipart_fields(content_type: &str, body: &[u8], name: &str) -> Vec<String> {
    let param = |part: &str, key: &str| {
        let (k, v) = part.split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case(key)
            .then(|| v.trim().trim_matches('"').to_owned())
    };
    let Some(boundary) = content_type
        .split(';')
        .find_map(|p| param(p, "boundary"))
        .filter(|b| !b.is_empty())
    else {
        return Vec::new();
    };
    let delimiter = format!("--{boundary}");
    let text = String::from_utf8_lossy(body);
    text.split(delimiter.as_str())
        .filter_map(|part| {
            let (head, value) = part.split_once("\r\n\r\n")?;
            let disposition = head.lines().find(|l| {
                l.split_once(':')
                    .is_some_and(|(h, _)| h.trim().eq_ignore_ascii_case("content-disposition"))
            })?;
            let named = disposition
                .split(';')
                .any(|p| param(p, "name").is_some_and(|n| n == name));
            named.then(|| value.trim_end_matches("\r\n").to_owned())
        })
        .collect()
}

/// The id of an object the provider answered with (`id` at the top).
pub fn answered_id(answer: &Value) -> Result<String, AdapterError> {
    answer
        .get("id")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| AdapterError::UpstreamInvalid("an object without id".into()))
}

/// The text of a model's answer: its choices' messages (a chat completion), or its output (a
/// response).
pub fn answer_text(answer: &Value) -> String {
    answer
        .get("choices")
        .or_else(|| answer.get("output"))
        .map(text_of)
        .unwrap_or_default()
}

/// Whether the provider says it stored a response (`store` in the answer; absent means stored).
pub fn answer_stored(answer: &Value) -> bool {
    answer.get("store").and_then(Value::as_bool).unwrap_or(true)
}

/// The ids of the items of a list answer (`{"data": [{"id": ...}]}`).
pub fn listed_ids(answer: &Value) -> Result<Vec<String>, AdapterError> {
    answer
        .get("data")
        .and_then(Value::as_array)
        .ok_or_else(|| AdapterError::UpstreamInvalid("a list without data".into()))?
        .iter()
        .map(answered_id)
        .collect()
}

/// Keeps the entries of a list answer whose id `keep` allows.
pub fn filter_list(answer: Value, keep: impl Fn(&str) -> bool) -> Result<Value, AdapterError> {
    listed_ids(&answer)?;
    let Value::Object(mut map) = answer else {
        return Err(AdapterError::UpstreamInvalid("not an object".into()));
    };
    if let Some(Value::Array(data)) = map.remove("data") {
        let kept: Vec<Value> = data
            .into_iter()
            .filter(|entry| entry.get("id").and_then(Value::as_str).is_some_and(&keep))
            .collect();
        // The page's bounds name ids too: only kept ones may show.
        let bound = |entry: Option<&Value>| entry.and_then(|e| e.get("id")).cloned();
        for (key, value) in [
            ("first_id", bound(kept.first())),
            ("last_id", bound(kept.last())),
        ] {
            if map.contains_key(key) {
                map.insert(key.into(), value.unwrap_or(Value::Null));
            }
        }
        map.insert("data".into(), Value::Array(kept));
    }
    Ok(Value::Object(map))
}

/// The provider's path of a recorded object; `None` for what the provider does not keep
/// (embeddings inputs are recorded by fingerprint only).
pub fn object_path(collection: &str, id: &str) -> Option<String> {
    match collection {
        RESPONSES => Some(format!("/v1/responses/{id}")),
        CHAT => Some(format!("/v1/chat/completions/{id}")),
        CONVERSATIONS => Some(format!("/v1/conversations/{id}")),
        ITEMS => {
            let (conversation, item) = id.split_once('/')?;
            Some(format!("/v1/conversations/{conversation}/items/{item}"))
        }
        FILES => Some(format!("/v1/files/{id}")),
        _ => None,
    }
}

/// The lineage id of a conversation item.
pub fn item_key(conversation: &str, item: &str) -> String {
    format!("{conversation}/{item}")
}

/// The stamp of what the provider keeps for a subject: until the provider's retention window ends.
pub fn provider_stamp(
    tenant: &str,
    subject: &str,
    purpose: &str,
    category: &str,
    grant: &ProviderGrant,
    expires_at: DateTime<Utc>,
) -> Stamp {
    Stamp {
        tenant: tenant.to_owned(),
        subject: subject.to_owned(),
        purpose: purpose.to_owned(),
        category: category.to_owned(),
        layer: lethe_policy::Layer::Derived,
        expires_at,
        epoch: grant.epoch,
    }
}

/// A streamed answer, read event by event: its id and its text so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamedAnswer {
    pub id: Option<String>,
    pub text: String,
}

impl StreamedAnswer {
    /// Takes in complete events: a chat completion's chunks (`id`, `choices[].delta.content`)
    /// or a response's (`response.id`, `response.output_text.delta`).
    pub fn read(&mut self, events: &[u8]) {
        let Ok(text) = std::str::from_utf8(events) else {
            return;
        };
        for event in text.split("\n\n") {
            let data: String = event
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(str::trim)
                .collect();
            let Ok(value) = serde_json::from_str::<Value>(&data) else {
                continue;
            };
            if self.id.is_none() {
                let id = value
                    .get("response")
                    .and_then(|r| r.get("id"))
                    .or_else(|| value.get("id"));
                self.id = id.and_then(Value::as_str).map(str::to_owned);
            }
            let deltas = value
                .get("choices")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|c| c.get("delta")?.get("content")?.as_str());
            let response_delta = (value.get("type").and_then(Value::as_str)
                == Some("response.output_text.delta"))
            .then(|| value.get("delta").and_then(Value::as_str))
            .flatten();
            for delta in deltas.chain(response_delta) {
                self.text.push_str(delta);
            }
        }
    }
}

/// The id of the object a stream is about, from its first events: `response.id` of a response's
/// events, or the `id` of a chat completion's chunks.
pub fn streamed_object_id(events: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(events).ok()?;
    text.split("\n\n").find_map(|event| {
        let data: String = event
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(str::trim)
            .collect();
        let value: Value = serde_json::from_str(&data).ok()?;
        let id = value
            .get("response")
            .and_then(|r| r.get("id"))
            .or_else(|| value.get("id"))?;
        id.as_str().map(str::to_owned)
    })
}

#[cfg(test)]
mod tests;
