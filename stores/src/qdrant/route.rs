//! The Qdrant route: the I/O around the pure adapter in `crate::qdrant::adapter`; reads
//! (searches, scrolls, retrievals, counts, facets) in `read`, writes (upserts, deletes, edits and
//! batches) in `write`.

mod read;
mod write;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Response, StatusCode};
use serde_json::{Value, json};

use crate::auth::Role;
use crate::data::error::{DataError, json_response};
use crate::data::forward::Answer;
use crate::data::{RequestContext, Upstream};
use crate::error_shape::Code;
use crate::qdrant::adapter::edit;
use crate::qdrant::adapter::{self, Endpoint, PointId};

/// The payload keys a route reads: the one naming a point's subject, and those holding its text.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fields<'a> {
    pub subject: Option<&'a str>,
    pub text: &'a [String],
}

/// One Qdrant request, from classification to the checked answer.
pub(crate) async fn handle(
    upstream: &Upstream<'_>,
    ctx: &RequestContext,
    path: &str,
    body: Bytes,
    fields: Fields<'_>,
) -> Result<Response<Full<Bytes>>, DataError> {
    let parts = upstream.parts;
    let subject_field = fields.subject;
    match adapter::classify(&parts.method, path) {
        Endpoint::Refused => Err(DataError::unknown_endpoint()),
        Endpoint::NonCanonical => Err(DataError::new(
            StatusCode::BAD_REQUEST,
            Code::InvalidRequest,
            "collection names are letters, digits, '_', '-' and '.'; point ids are unsigned integers or lowercase, hyphenated UUIDs",
        )),
        Endpoint::Admin | Endpoint::CreateCollection { .. } if ctx.claims.role != Role::Admin => {
            Err(DataError::new(
                StatusCode::FORBIDDEN,
                Code::Forbidden,
                "managing collections, their indexes and aliases needs the admin role",
            ))
        }
        Endpoint::CreateCollection { collection } => {
            let answer = upstream.send(parts.method.clone(), path, body).await?;
            if answer.is_success() {
                index_stamp(upstream, &collection).await;
            }
            Ok(answer.passed_on())
        }
        Endpoint::PassThrough | Endpoint::Admin => {
            let answer = upstream.send(parts.method.clone(), path, body).await?;
            Ok(answer.passed_on())
        }
        Endpoint::Upsert { collection } => {
            write::upsert(upstream, ctx, path, &collection, body, fields).await
        }
        Endpoint::Search { collection, shape } => {
            read::search(upstream, ctx, path, &collection, (body, shape), fields).await
        }
        Endpoint::SearchBatch { collection, shape } => {
            read::search_batch(upstream, ctx, path, &collection, (body, shape), fields).await
        }
        Endpoint::Scroll { collection } => {
            let (body, mut plan) = adapter::narrow_scroll_body(
                &body,
                ctx.tenant(),
                ctx.subject.as_deref(),
                crate::now(),
            )?;
            plan.collection = collection;
            read::read(upstream, ctx, path, body, &plan, fields).await
        }
        Endpoint::Matrix { collection, .. } => {
            read::matrix(upstream, ctx, path, &collection, body).await
        }
        Endpoint::Facet { collection } => read::facet(upstream, ctx, &collection, body).await,
        Endpoint::Count { collection } => read::count(upstream, ctx, &collection, body).await,
        Endpoint::Retrieve { collection } => {
            read::retrieve(upstream, ctx, &collection, body, fields).await
        }
        Endpoint::GetPoint { collection, id } => {
            read::get_point(upstream, ctx, &collection, id, fields).await
        }
        Endpoint::Delete { collection } => write::delete(upstream, ctx, &collection, body).await,
        Endpoint::Edit { collection, kind } => {
            let op = edit::parse_edit(kind, &body, subject_field)?;
            write::batch(upstream, ctx, &collection, vec![op], true, fields).await
        }
        Endpoint::Batch { collection } => {
            let ops = edit::parse_batch(&body, &ctx.scope(), subject_field)?;
            write::batch(upstream, ctx, &collection, ops, false, fields).await
        }
    }
}

/// Indexes the stamp of a collection just created, so that narrowed reads stay cheap. Reads are
/// correct without the indexes, only slower: a failure is logged, not the client's.
async fn index_stamp(upstream: &Upstream<'_>, collection: &str) {
    for index in adapter::stamp_indexes() {
        let sent = upstream
            .send_query(
                Method::PUT,
                &format!("/collections/{collection}/index"),
                Some("wait=true"),
                Bytes::from(index.to_string()),
            )
            .await;
        if !sent.as_ref().is_ok_and(Answer::is_success) {
            tracing::warn!(route = %upstream.route.name, "a stamp index could not be created; narrowed reads of the collection will be slower");
        }
    }
}

/// Qdrant's answer shape for a result Lethe computed.
fn ok(result: Value) -> Response<Full<Bytes>> {
    json_response(
        StatusCode::OK,
        &json!({ "result": result, "status": "ok", "time": 0.0 }),
    )
}

fn points_path(collection: &str, op: &str) -> String {
    format!("/collections/{collection}/points/{op}")
}

/// Qdrant's answer to a request naming a point that does not exist, for one the caller may
/// not see as well: the two are not told apart.
fn no_point(id: &PointId) -> Response<Full<Bytes>> {
    json_response(
        StatusCode::NOT_FOUND,
        &json!({ "status": { "error": format!("Not found: No point with id {} found", id.key()) }, "time": 0.0 }),
    )
}
