//! The Azure AI Search route: the I/O around the pure adapter in
//! `crate::azure_search::adapter`.

mod reads;
mod writes;

use std::collections::BTreeMap;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Response, StatusCode};
use serde_json::{Value, json};

use super::odata::Literal;

use crate::auth::Role;
use crate::azure_search::adapter::endpoint::{API_VERSIONS, Docs, Endpoint, classify};
use crate::azure_search::adapter::read::{self, Kind, Read};
use crate::azure_search::adapter::readable;
use crate::azure_search::adapter::{
    self, IndexInfo, Reader, index_info, keys_filter, stamp_select, with_stamp_fields,
    without_stamp_fields, write,
};
use crate::data::derivation::{Derivations, Served, derived_before};
use crate::data::error::{DataError, json_response};
use crate::data::forward::Answer;
use crate::data::overtaken::{Recording, keep_unless_overtaken};
use crate::data::records::{AdapterError, RecordRefusal};
use crate::data::{RequestContext, Upstream};
use crate::error_shape::Code;
use crate::kit::stamp::parse_object;
use crate::kit::text::text_of_fields;
use crate::state::ItemRecord;

/// The fields a route reads: the one naming a document's subject, and those holding its text.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fields<'a> {
    pub subject: Option<&'a str>,
    pub text: &'a [String],
}

/// One request: the index it names (read once a minute), and its endpoint's handling.
struct Call<'a, 'u> {
    upstream: &'a Upstream<'u>,
    ctx: &'a RequestContext,
    /// `api-version=...`: what Lethe's own requests to Azure carry.
    version: String,
    fields: Fields<'a>,
}

fn invalid(message: impl Into<String>) -> DataError {
    DataError::new(StatusCode::BAD_REQUEST, Code::InvalidRequest, message)
}

fn not_json() -> DataError {
    AdapterError::UpstreamInvalid("not JSON".into()).into()
}

/// The request's `api-version`, which must be one the adapter knows.
fn api_version(query: Option<&str>) -> Result<String, DataError> {
    let version = form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .find(|(name, _)| name == "api-version")
        .map(|(_, v)| v.into_owned())
        .ok_or_else(|| invalid("api-version is required"))?;
    if !API_VERSIONS.contains(&version.as_str()) {
        return Err(invalid(format!(
            "api-version {version:?} is not one Lethe's adapter knows ({})",
            API_VERSIONS.join(", ")
        )));
    }
    Ok(format!("api-version={version}"))
}

pub(crate) async fn handle(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    path: &str,
    body: Bytes,
    fields: Fields<'_>,
    indexes: &moka::sync::Cache<String, IndexInfo>,
) -> Result<Response<Full<Bytes>>, DataError> {
    let parts = upstream.parts;
    let endpoint = classify(&parts.method, path);
    let version = api_version(parts.uri.query())?;
    let call = Call {
        upstream,
        ctx,
        version,
        fields,
    };
    let admin = ctx.claims.role == Role::Admin;
    match endpoint {
        Endpoint::Refused => Err(DataError::unknown_endpoint()),
        Endpoint::NonCanonical => Err(invalid(
            "index names are lowercase letters, digits and '-'; document keys letters, digits, '_', '-' and '='",
        )),
        Endpoint::DeleteIndex => Err(DataError::new(
            StatusCode::FORBIDDEN,
            Code::Forbidden,
            "deleting an index deletes every tenant's documents: it is not done through Lethe",
        )),
        Endpoint::ListIndexes
        | Endpoint::CreateIndex
        | Endpoint::GetIndex(_)
        | Endpoint::PutIndex(_)
            if !admin =>
        {
            Err(DataError::new(
                StatusCode::FORBIDDEN,
                Code::Forbidden,
                "managing indexes needs the admin role",
            ))
        }
        Endpoint::ListIndexes => {
            let answer = upstream.send(Method::GET, path, body).await?;
            definitions(answer, |mut listed| {
                if let Some(Value::Array(indexes)) = listed.get_mut("value") {
                    for index in indexes.iter_mut() {
                        *index = without_stamp_fields(index.take());
                    }
                }
                listed
            })
        }
        // An index is named to Azure in one spelling, whatever the client's.
        Endpoint::GetIndex(index) => {
            let answer = upstream
                .send(Method::GET, &format!("/indexes('{index}')"), body)
                .await?;
            definitions(answer, without_stamp_fields)
        }
        Endpoint::CreateIndex => define(upstream, "/indexes", &body).await,
        Endpoint::PutIndex(index) => {
            if let Some(refusal) = call.others_documents(&index).await? {
                return Ok(refusal);
            }
            indexes.invalidate(&index);
            define(upstream, &format!("/indexes('{index}')"), &body).await
        }
        Endpoint::Docs(index, op) => {
            let info = match call.index(&index, indexes).await? {
                Ok(info) => info,
                Err(answer) => return Ok(answer.passed_on()),
            };
            call.docs(&index, &info, op, body).await
        }
    }
}

/// Creates or updates an index (the client's method, to `path`) with the stamp fields added.
async fn define(
    upstream: &Upstream<'_>,
    path: &str,
    body: &[u8],
) -> Result<Response<Full<Bytes>>, DataError> {
    let stamped = with_stamp_fields(Value::Object(parse_object(body)?))?;
    let answer = upstream
        .send(
            upstream.parts.method.clone(),
            path,
            Bytes::from(serde_json::to_vec(&stamped).unwrap_or_default()),
        )
        .await?;
    definitions(answer, without_stamp_fields)
}

/// An answer holding index definitions, as the client sees them (`rewrite`: the stamp fields
/// left out); Azure's refusals as they are.
fn definitions(
    answer: Answer,
    rewrite: impl FnOnce(Value) -> Value,
) -> Result<Response<Full<Bytes>>, DataError> {
    if !answer.is_success() || answer.body.is_empty() {
        return Ok(answer.passed_on());
    }
    let value: Value = serde_json::from_slice(&answer.body).map_err(|_| not_json())?;
    let body = serde_json::to_vec(&rewrite(value)).unwrap_or_default();
    Ok(answer.into_response(Bytes::from(body)))
}

/// A document's key and the subject its stamp names.
fn owner(doc: &Value, key_field: &str) -> Option<(String, String)> {
    Some((
        doc[key_field].as_str()?.to_owned(),
        adapter::read_stamp(doc)?.subject,
    ))
}

/// Azure's answer to a lookup of a key it does not hold, for one the caller may not see too:
/// the two are not told apart.
fn no_document() -> Response<Full<Bytes>> {
    json_response(
        StatusCode::NOT_FOUND,
        &json!({ "error": { "code": "", "message": "Document not found." } }),
    )
}

impl Call<'_, '_> {
    /// Refused when `index` holds documents that are not the caller's tenant's (another
    /// tenant's, or unstamped): an index is shared by tenants, and a definition changed by one
    /// admin (its fields, analyzers, scoring) is every tenant's. An index Azure does not have
    /// yet is the caller's to create.
    async fn others_documents(
        &self,
        index: &str,
    ) -> Result<Option<Response<Full<Bytes>>>, DataError> {
        let tenant = Literal::Str(self.ctx.tenant().to_owned()).to_string();
        let others = format!("{} ne {tenant}", adapter::TENANT);
        match self.counted(index, &others).await? {
            Err(refused) if refused.status == StatusCode::NOT_FOUND => Ok(None),
            Err(refused) => Ok(Some(refused.passed_on())),
            Ok(0) => Ok(None),
            Ok(_) => Err(DataError::new(
                StatusCode::FORBIDDEN,
                Code::Forbidden,
                "the index holds other tenants' documents: its definition is theirs too, and is not changed through Lethe",
            )),
        }
    }

    fn docs_path(index: &str, rest: &str) -> String {
        format!("/indexes('{index}')/docs{rest}")
    }

    /// A search of Lethe's own making on `index` (`query`, Azure's body): its answer as JSON,
    /// or Azure's answer when it refuses it.
    async fn own_search(
        &self,
        index: &str,
        query: Value,
    ) -> Result<Result<Value, Answer>, DataError> {
        let answer = self
            .send(
                Method::POST,
                &Self::docs_path(index, "/search.post.search"),
                None,
                serde_json::to_vec(&query).unwrap_or_default(),
            )
            .await?;
        if !answer.is_success() {
            return Ok(Err(answer));
        }
        serde_json::from_slice(&answer.body)
            .map(Ok)
            .map_err(|_| not_json())
    }

    /// How many documents of `index` `filter` selects, as Azure counts them; Azure's answer
    /// when it refuses the search.
    async fn counted(&self, index: &str, filter: &str) -> Result<Result<u64, Answer>, DataError> {
        let query = json!({"search": "*", "filter": filter, "top": 0, "count": true});
        Ok(match self.own_search(index, query).await? {
            Ok(counted) => Ok(counted
                .get("@odata.count")
                .and_then(Value::as_u64)
                .ok_or_else(not_json)?),
            Err(refused) => Err(refused),
        })
    }

    /// Sends a request of Lethe's own making (its query: the api-version and `extra`).
    async fn send(
        &self,
        method: Method,
        path: &str,
        extra: Option<&str>,
        body: Vec<u8>,
    ) -> Result<Answer, DataError> {
        let query = match extra {
            Some(extra) => format!("{}&{extra}", self.version),
            None => self.version.clone(),
        };
        self.upstream
            .send_query(method, path, Some(&query), Bytes::from(body))
            .await
    }

    /// What Lethe needs of an index (read from Azure at most once a minute); Azure's answer
    /// when it has no such index.
    async fn index(
        &self,
        index: &str,
        cache: &moka::sync::Cache<String, IndexInfo>,
    ) -> Result<Result<IndexInfo, Answer>, DataError> {
        let info = match cache.get(index) {
            Some(info) => info,
            None => {
                let answer = self
                    .send(
                        Method::GET,
                        &format!("/indexes('{index}')"),
                        None,
                        Vec::new(),
                    )
                    .await?;
                if !answer.is_success() {
                    return Ok(Err(answer));
                }
                let definition: Value =
                    serde_json::from_slice(&answer.body).map_err(|_| not_json())?;
                let info = index_info(&definition)?;
                cache.insert(index.to_owned(), info.clone());
                info
            }
        };
        if !info.stamped {
            return Err(invalid(format!(
                "index {index} was not made through Lethe (no lethe_* fields, or a key that is not filterable): Lethe cannot govern it"
            )));
        }
        Ok(Ok(info))
    }
}
