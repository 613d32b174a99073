//! Threads: a created thread's id, writes into a registered thread, and searches narrowed
//! upstream and decided on the registry.

use super::*;

/// The id of the thread the upstream created: the one asked for (if the client chose it), and
/// carrying the stamp Lethe just wrote, or it is not the new thread and is not passed on.
pub fn created_thread_id(
    answer: &[u8],
    requested: Option<&str>,
    stamp: &Stamp,
) -> Result<String, AdapterError> {
    let value: Value = serde_json::from_slice(answer)
        .map_err(|_| AdapterError::UpstreamInvalid("a created thread that is not JSON".into()))?;
    let id = value
        .get("thread_id")
        .and_then(Value::as_str)
        .ok_or_else(|| {
            AdapterError::UpstreamInvalid("a created thread without thread_id".into())
        })?;
    let carried = value.get("metadata").and_then(read_stamp);
    let ours = carried.is_some_and(|c| {
        c.tenant == stamp.tenant && c.subject == stamp.subject && c.epoch == stamp.epoch
    });
    if requested.is_some_and(|r| r != id) || !ours {
        return Err(refused(Refusal::ScopeViolation));
    }
    Ok(id.to_owned())
}

/// A run or state update must not send the thread's content elsewhere: webhooks are not
/// governed by Lethe. Answers the text the write carries.
pub fn check_thread_write(body: &[u8]) -> Result<String, AdapterError> {
    let map = parse_object(body)?;
    match map.get("webhook") {
        None | Some(Value::Null) => Ok(text_of(&Value::Object(map))),
        Some(_) => Err(AdapterError::Invalid(
            "webhook is not allowed: a run's output may only go back to the caller".into(),
        )),
    }
}

/// A write into an existing thread (a run, a state update, new metadata): allowed when its
/// registered owner is in the caller's scope, may still be written to under the epoch the thread
/// was created in, and the thread has not expired. A request naming another purpose or category
/// than the thread's is out of scope.
pub fn decide_thread_write(
    registered: Option<&Stamp>,
    scope: &Scope<'_>,
    view: &impl PolicyView,
    now: DateTime<Utc>,
) -> Result<Stamp, Refusal> {
    let stamp = registered.ok_or(Refusal::UnstampedItem)?;
    let in_scope = stamp.tenant == scope.tenant
        && scope.subject.is_none_or(|s| s == stamp.subject)
        && scope.purpose.is_none_or(|p| p == stamp.purpose)
        && scope.category.is_none_or(|c| c == stamp.category);
    if !in_scope {
        return Err(Refusal::ScopeViolation);
    }
    if stamp.expires_at <= now {
        return Err(Refusal::Expired);
    }
    let facts = WriteFacts {
        tenant: &stamp.tenant,
        subject: &stamp.subject,
        purpose: &stamp.purpose,
        category: &stamp.category,
        layer: stamp.layer,
        action: Action::Store,
        authorised_epoch: Some(stamp.epoch),
        requested_expires_at: None,
    };
    decide_write(view, &facts, now)?;
    Ok(stamp.clone())
}

/// `PATCH /threads/{id}`: the new metadata keeps the registered stamp, whatever it says.
pub fn restamp_patch(body: &[u8], registered: &Stamp) -> Result<Vec<u8>, AdapterError> {
    let mut map = parse_object(body)?;
    let m = object_at(&mut map, "metadata")?;
    write_stamp(m, registered);
    serde_json::to_vec(&map).map_err(|e| AdapterError::Invalid(e.to_string()))
}

/// `POST /threads/search` (and the pages Lethe reads to count): the metadata filter gains the
/// caller's tenant and subject, and `select`, when given, keeps `thread_id`.
pub fn narrow_thread_search(
    body: &[u8],
    tenant: &str,
    subject: Option<&str>,
) -> Result<Map<String, Value>, AdapterError> {
    let mut map = parse_object(body)?;
    let m = object_at(&mut map, "metadata")?;
    narrow(m, tenant, subject);
    match map.get_mut("select") {
        None | Some(Value::Null) => {}
        Some(Value::Array(select)) => {
            if !select.iter().any(|v| v == "thread_id") {
                select.push(json!("thread_id"));
            }
        }
        Some(_) => return Err(AdapterError::Invalid("select must be an array".into())),
    }
    Ok(map)
}

pub(super) fn threads_of(answer: &Value) -> Result<&Vec<Value>, AdapterError> {
    answer
        .as_array()
        .ok_or_else(|| AdapterError::UpstreamInvalid("a thread search must answer an array".into()))
}

/// The thread ids of a search answer.
pub fn thread_ids(answer: &Value) -> Result<Vec<String>, AdapterError> {
    threads_of(answer)?
        .iter()
        .map(|t| {
            t.get("thread_id")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| AdapterError::UpstreamInvalid("a thread without thread_id".into()))
        })
        .collect()
}

/// Keeps the threads of a search answer the caller may read, judged by their registered stamps
/// (a thread the registry does not know is never served).
pub fn filter_threads(
    answer: Value,
    registered: &BTreeMap<String, Stamp>,
    view: &impl PolicyView,
    ctx: &ReadContext<'_>,
    now: DateTime<Utc>,
) -> Result<Value, AdapterError> {
    thread_ids(&answer)?;
    let Value::Array(threads) = answer else {
        return Err(AdapterError::UpstreamInvalid("not an array".into()));
    };
    Ok(Value::Array(
        threads
            .into_iter()
            .filter(|t| {
                let id = t.get("thread_id").and_then(Value::as_str);
                let stamp = id.and_then(|id| registered.get(id));
                let id = id.unwrap_or_default();
                decide_read_item(view, ctx, THREADS, id, stamp, now).is_ok()
            })
            .collect(),
    ))
}
