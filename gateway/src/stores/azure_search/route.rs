//! The Azure AI Search route: the I/O around the pure adapter in
//! `crate::stores::azure_search::adapter`.

use std::collections::BTreeMap;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Response, StatusCode};
use serde_json::{Value, json};

use super::odata::Literal;

use crate::auth::Role;
use crate::data::derivation::{Derivations, Served, derived_before};
use crate::data::error::{DataError, json_response};
use crate::data::forward::Answer;
use crate::data::overtaken::{Recording, keep_unless_overtaken};
use crate::data::records::{AdapterError, RecordRefusal};
use crate::data::{RequestContext, Upstream};
use crate::error_shape::Code;
use crate::state::ItemRecord;
use crate::stores::azure_search::adapter::endpoint::{API_VERSIONS, Docs, Endpoint, classify};
use crate::stores::azure_search::adapter::read::{self, Kind, Read};
use crate::stores::azure_search::adapter::readable;
use crate::stores::azure_search::adapter::{
    self, IndexInfo, Reader, index_info, keys_filter, stamp_select, with_stamp_fields,
    without_stamp_fields, write,
};
use crate::stores::kit::stamp::parse_object;
use crate::stores::kit::text::text_of_fields;

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

    async fn docs(
        &self,
        index: &str,
        info: &IndexInfo,
        op: Docs,
        body: Bytes,
    ) -> Result<Response<Full<Bytes>>, DataError> {
        let query = self.upstream.parts.uri.query().unwrap_or_default();
        let request = |kind: Kind, get: bool| {
            if get {
                read::body_of_query(kind, query)
            } else {
                parse_object(&body)
            }
        };
        match op {
            Docs::Index => self.batch(index, info, &body).await,
            Docs::Search { get } => {
                let client = request(Kind::Search, get)?;
                self.read(index, info, Kind::Search, client).await
            }
            Docs::Suggest { get } => {
                let client = request(Kind::Suggest, get)?;
                self.read(index, info, Kind::Suggest, client).await
            }
            Docs::Autocomplete { get } => {
                let client = request(Kind::Autocomplete, get)?;
                self.read(index, info, Kind::Autocomplete, client).await
            }
            Docs::Count => self.count(index, info).await,
            Docs::Lookup(key) => self.lookup(index, info, &key).await,
        }
    }

    fn reader(&self) -> Reader<'_> {
        Reader {
            tenant: self.ctx.tenant(),
            subject: self.ctx.subject.as_deref(),
            purpose: self.ctx.purpose.as_deref(),
        }
    }

    /// Azure's answer as JSON, with the policy of the caller's tenant's subjects in it.
    async fn answer_and_view(
        &self,
        answer: &Answer,
    ) -> Result<(Value, crate::data::policy_cache::View), DataError> {
        let value: Value = serde_json::from_slice(&answer.body).map_err(|_| not_json())?;
        let view = self
            .upstream
            .state
            .policy
            .view_of_owners(self.ctx.tenant(), &read::owners(&value))
            .await?;
        Ok((value, view))
    }

    /// What the caller may read in `scope` (the narrowed filter), as a filter Azure computes
    /// over: the policy of the subjects in the scope (the bound one, or those a facet of the
    /// scope names), and the keys an erasure's closure hides. One search at most before the
    /// read; Azure's answer when it refuses it.
    async fn readable_filter(
        &self,
        index: &str,
        info: &IndexInfo,
        scope: &str,
    ) -> Result<Result<String, Answer>, DataError> {
        let subjects = match self.ctx.subject.as_deref() {
            Some(subject) => vec![subject.to_owned()],
            None => match self.subjects_in(index, info, scope).await? {
                Ok(subjects) => subjects,
                Err(refused) => return Ok(Err(refused)),
            },
        };
        let tenant = self.ctx.tenant();
        let view = self
            .upstream
            .state
            .policy
            .view(tenant, subjects.iter().map(String::as_str))
            .await?;
        let hidden = view.hidden_ids(&self.ctx.store, index);
        let readable =
            readable::readable(tenant, &subjects, &view, &info.key, &hidden, crate::now());
        Ok(Ok(format!("({scope}) and ({readable})")))
    }

    /// The subjects whose documents are in `scope`, from a facet of Azure's on the stamp's
    /// subject; refused past [`readable::MAX_SUBJECTS`].
    async fn subjects_in(
        &self,
        index: &str,
        info: &IndexInfo,
        scope: &str,
    ) -> Result<Result<Vec<String>, Answer>, DataError> {
        if !info.subjects_facetable {
            return Err(invalid(
                "this index was created before Lethe counted by subject: counts, facets and autocomplete need a caller bound to one subject; recreate the index through Lethe to serve them to others",
            ));
        }
        let query = json!({
            "search": "*",
            "filter": scope,
            "top": 0,
            "facets": [readable::subjects_facet()],
        });
        let value = match self.own_search(index, query).await? {
            Ok(value) => value,
            Err(refused) => return Ok(Err(refused)),
        };
        let facets = value
            .pointer(&format!("/@search.facets/{}", adapter::SUBJECT))
            .and_then(Value::as_array)
            .ok_or_else(not_json)?;
        if facets.len() > readable::MAX_SUBJECTS {
            return Err(invalid(format!(
                "the caller's scope holds documents of more than {} subjects: bind the token to one, or narrow the filter",
                readable::MAX_SUBJECTS
            )));
        }
        facets
            .iter()
            .map(|f| f.get("value").and_then(Value::as_str).map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .map(Ok)
            .ok_or_else(not_json)
    }

    /// A search, suggest or autocomplete: narrowed, and its answer decided again.
    async fn read(
        &self,
        index: &str,
        info: &IndexInfo,
        kind: Kind,
        client: serde_json::Map<String, Value>,
    ) -> Result<Response<Full<Bytes>>, DataError> {
        let plan: Read = read::plan_read(kind, client, self.reader(), crate::now())?;
        let filter = match plan.computes_over_documents() {
            true => match self.readable_filter(index, info, plan.filter()).await? {
                Ok(filter) => filter,
                Err(refused) => return Ok(refused.passed_on()),
            },
            false => plan.filter().to_owned(),
        };
        let op = match kind {
            Kind::Search => "/search.post.search",
            Kind::Suggest => "/search.post.suggest",
            Kind::Autocomplete => "/search.post.autocomplete",
        };
        let answer = self
            .send(
                Method::POST,
                &Self::docs_path(index, op),
                None,
                plan.body(&info.key, &filter),
            )
            .await?;
        if !answer.is_success() {
            return Ok(answer.passed_on());
        }
        let (value, view) = self.answer_and_view(&answer).await?;
        let (ctx, now) = (self.ctx.read_context(), crate::now());
        // Whose each served document is, read before the answer is cut to what the client
        // asked for; only when lineage remembers what is served (autocomplete serves terms).
        let remembered = self.upstream.state.derivation.enabled() && kind != Kind::Autocomplete;
        let owners: Vec<Option<(String, String)>> = match remembered {
            true => value["value"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|doc| read::readable(doc, index, &info.key, &view, &ctx, now))
                .map(|doc| owner(doc, &info.key))
                .collect(),
            false => Vec::new(),
        };
        let decided = plan.decide(value, index, &info.key, &view, &ctx, now)?;
        if remembered {
            let reached = decided["value"].as_array().map_or(&[][..], Vec::as_slice);
            self.remember_served(index, owners, reached).await?;
        }
        Ok(json_response(answer.status, &decided))
    }

    /// Remembers the documents an answer serves (each one's key and owner, and the document as
    /// it reached the client, in the same order), for what the caller derives from them.
    async fn remember_served(
        &self,
        index: &str,
        owners: Vec<Option<(String, String)>>,
        reached: &[Value],
    ) -> Result<(), DataError> {
        let served = owners
            .into_iter()
            .zip(reached)
            .filter_map(|(owner, reached)| {
                let (id, owner) = owner?;
                Some(Served {
                    collection: index.to_owned(),
                    id,
                    owner,
                    text: text_of_fields(reached.as_object(), self.fields.text),
                    answer: false,
                })
            })
            .collect();
        self.upstream
            .state
            .derivation
            .served(self.ctx, served)
            .await
    }

    /// `$count`: how many documents the caller may see, never how many the index holds.
    async fn count(
        &self,
        index: &str,
        info: &IndexInfo,
    ) -> Result<Response<Full<Bytes>>, DataError> {
        let scope =
            adapter::narrowed(None, self.reader(), crate::now()).map_err(|e| invalid(e.0))?;
        let filter = match self.readable_filter(index, info, &scope).await? {
            Ok(filter) => filter,
            Err(refused) => return Ok(refused.passed_on()),
        };
        let visible = match self.counted(index, &filter).await? {
            Ok(visible) => visible,
            Err(refused) => return Ok(refused.passed_on()),
        };
        let mut response = Response::new(Full::new(Bytes::from(visible.to_string())));
        response.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("text/plain"),
        );
        Ok(response)
    }

    /// `docs('key')`: the document, when the caller may see it; otherwise Azure's answer for a
    /// key it does not hold.
    async fn lookup(
        &self,
        index: &str,
        info: &IndexInfo,
        key: &str,
    ) -> Result<Response<Full<Bytes>>, DataError> {
        let (sent, select) = read::lookup_select(self.upstream.parts.uri.query(), &info.key)?;
        let extra = sent.map(|s| {
            form_urlencoded::Serializer::new(String::new())
                .append_pair("$select", &s)
                .finish()
        });
        let answer = self
            .send(
                Method::GET,
                &Self::docs_path(index, &format!("('{key}')")),
                extra.as_deref(),
                Vec::new(),
            )
            .await?;
        if answer.status == StatusCode::NOT_FOUND {
            return Ok(no_document());
        }
        if !answer.is_success() {
            return Ok(answer.passed_on());
        }
        let (doc, view) = self.answer_and_view(&answer).await?;
        let (ctx, now) = (self.ctx.read_context(), crate::now());
        if !read::readable(&doc, index, &info.key, &view, &ctx, now) {
            return Ok(no_document());
        }
        let owners = vec![owner(&doc, &info.key)];
        let reached = read::cut_document(doc, select.as_deref());
        self.remember_served(index, owners, std::slice::from_ref(&reached))
            .await?;
        Ok(json_response(StatusCode::OK, &reached))
    }

    /// What Azure holds under `keys`: each one's stamp (`None`: held, unstamped), whoever's.
    async fn held(
        &self,
        index: &str,
        info: &IndexInfo,
        keys: &[String],
    ) -> Result<Result<BTreeMap<String, Option<lethe_policy::Stamp>>, Answer>, DataError> {
        let body = json!({
            "search": "*",
            "filter": keys_filter(&info.key, keys),
            "select": stamp_select(&info.key).join(","),
            "top": keys.len(),
        });
        let value = match self.own_search(index, body).await? {
            Ok(value) => value,
            Err(refused) => return Ok(Err(refused)),
        };
        let docs = value["value"].as_array().ok_or_else(not_json)?;
        Ok(Ok(docs
            .iter()
            .filter_map(|doc| {
                let key = doc[&info.key].as_str()?.to_owned();
                Some((key, adapter::read_stamp(doc)))
            })
            .collect()))
    }

    /// An indexing batch: decided whole on the stamps Azure holds under its keys, then sent;
    /// lineage follows what Azure says it did, action by action.
    async fn batch(
        &self,
        index: &str,
        info: &IndexInfo,
        body: &[u8],
    ) -> Result<Response<Full<Bytes>>, DataError> {
        let state = self.upstream.state;
        let tenant = self.ctx.tenant();
        let scope = self.ctx.scope();
        let mut planned = write::plan_batch(body, &info.key, &scope, self.fields.subject)?;
        let keys = planned.keys();
        if !planned.refused.is_empty() {
            return Ok(refused_batch(&keys, &planned.refused));
        }
        let texts = planned.texts(self.fields.text);
        let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
        let derivations = state
            .derivation
            .derive(self.ctx, index, &mut planned.facts, String::clone, &texts)
            .await?;
        let subjects: Vec<&str> = planned
            .subjects()
            .into_iter()
            .chain(derivations.owners())
            .collect();
        let view = state.policy.view(tenant, subjects).await?;
        if let Err(AdapterError::Refused(refused)) = derivations.check(&view, tenant) {
            // A derivation's refusal names its record; the client's batch names its action.
            let refused: Vec<RecordRefusal> = refused
                .into_iter()
                .map(|r| RecordRefusal {
                    index: planned.facts.get(r.index).map_or(r.index, |f| f.index),
                    ..r
                })
                .collect();
            return Ok(refused_batch(&keys, &refused));
        }
        // The stamps Azure holds under these keys decide who owns them, not lineage.
        let held = match self.held(index, info, &keys).await? {
            Ok(held) => held,
            Err(refused) => return Ok(refused.passed_on()),
        };
        let now = crate::now();
        let decided = match write::decide_batch(planned, &scope, &view, &held, now) {
            Err(AdapterError::Refused(refused)) => return Ok(refused_batch(&keys, &refused)),
            decided => decided?,
        };
        let rewritten = derived_before(&held, String::clone);
        let written: Vec<String> = decided.stamps.iter().map(|(k, _)| k.clone()).collect();
        state
            .derivation
            .record(self.ctx, &derivations, &written)
            .await?;
        let azure = match decided.body {
            Some(sent) => {
                let answer = self
                    .send(
                        Method::POST,
                        &Self::docs_path(index, "/search.index"),
                        None,
                        sent,
                    )
                    .await?;
                // 200 or 207 (per item); anything else (a batch too large, say) is Azure's
                // refusal of the whole batch, the client's to hear.
                if !matches!(answer.status.as_u16(), 200 | 207) {
                    return Ok(answer.passed_on());
                }
                Some(serde_json::from_slice::<Value>(&answer.body).map_err(|_| not_json())?)
            }
            None => None,
        };
        let (status, answer) = write::batch_answer(&decided.order, azure.as_ref())?;
        let done = |key: &str| {
            answer["value"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|r| r["key"] == key && r["status"] == true)
        };
        let stamps: Vec<(String, lethe_policy::Stamp)> = decided
            .stamps
            .into_iter()
            .filter(|(key, _)| done(key))
            .collect();
        let kept: Vec<String> = stamps.iter().map(|(k, _)| k.clone()).collect();
        let deleted: Vec<String> = decided.deleted.into_iter().filter(|k| done(k)).collect();
        if !deleted.is_empty() {
            state
                .store
                .mark_items_deleted(&self.upstream.route.name, index, &deleted, now)
                .await?;
        }
        let recorded = self
            .record_written(index, info, stamps, now, Some(&derivations))
            .await;
        let (status, answer, kept) = match recorded {
            Ok(()) => (status, answer, kept),
            // A flip overtook the batch in flight and what it wrote of the subject was deleted
            // again: those actions are answered as refused, the others as Azure did them.
            Err(e) if e.status.is_client_error() => {
                let Ok(held) = self.held(index, info, &kept).await? else {
                    return Err(e);
                };
                let gone: Vec<String> = kept
                    .iter()
                    .filter(|k| !held.contains_key(*k))
                    .cloned()
                    .collect();
                let kept = kept.into_iter().filter(|k| held.contains_key(k)).collect();
                let (status, answer) = write::overtaken(answer, &gone, e.code.as_str(), &e.message);
                (status, answer, kept)
            }
            Err(e) => return Err(e),
        };
        state
            .derivation
            .accepted(self.ctx, derivations, &kept, &rewritten)
            .await?;
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::MULTI_STATUS);
        Ok(json_response(status, &answer))
    }

    /// Lineage of the documents a batch wrote. A document written after a flip of its subject,
    /// or of a subject it derives from (the policy changed while the batch was in flight), is
    /// deleted again.
    async fn record_written(
        &self,
        index: &str,
        info: &IndexInfo,
        stamps: Vec<(String, lethe_policy::Stamp)>,
        now: chrono::DateTime<chrono::Utc>,
        derived: Option<&Derivations>,
    ) -> Result<(), DataError> {
        let rows = stamps
            .into_iter()
            .map(|(key, stamp)| {
                ItemRecord::stamped(
                    &self.upstream.route.name,
                    index,
                    key,
                    stamp,
                    now,
                    self.ctx.source.clone(),
                )
            })
            .collect();
        let undo = |overtaken: Vec<ItemRecord>| async move {
            let deletes: Vec<Value> = overtaken
                .iter()
                .map(|r| json!({ "@search.action": "delete", info.key.as_str(): r.item_id }))
                .collect();
            let undone = self
                .send(
                    Method::POST,
                    &Self::docs_path(index, "/search.index"),
                    None,
                    serde_json::to_vec(&json!({ "value": deletes })).unwrap_or_default(),
                )
                .await;
            // Left to the purge, which finds them by stamp and by lineage.
            if undone.is_ok_and(|a| a.status == StatusCode::OK) {
                Vec::new()
            } else {
                overtaken
            }
        };
        keep_unless_overtaken(
            self.upstream.state,
            self.ctx.tenant(),
            rows,
            Recording::Batched,
            derived,
            undo,
        )
        .await
    }
}

/// A refused batch, answered in Azure's per-item shape: nothing of it was sent.
fn refused_batch(keys: &[String], refused: &[RecordRefusal]) -> Response<Full<Bytes>> {
    json_response(
        StatusCode::MULTI_STATUS,
        &write::refused_answer(keys, refused),
    )
}
