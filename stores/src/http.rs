//! The HTTP side every connector to an HTTP store shares: its route's upstream (with the route's
//! credential and timeout), JSON in and out, and failures sorted into what a retry may mend and
//! what it cannot.

use std::sync::Arc;

use bytes::Bytes;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{HeaderMap, Method, StatusCode};
use serde_json::Value;

use crate::data::forward::{Answer, Route, Upstreams};
use crate::purge::ConnectorError;

pub struct StoreHttp {
    route: Route,
    upstreams: Arc<Upstreams>,
}

impl StoreHttp {
    pub fn new(route: Route, upstreams: Arc<Upstreams>) -> Self {
        StoreHttp { route, upstreams }
    }

    pub fn route(&self) -> &Route {
        &self.route
    }

    /// One call: the status and the JSON body (`null` when empty, and for a 404, which means
    /// "not there" to every caller). Any other failure is an error.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        query: Option<&str>,
        body: Option<Value>,
    ) -> Result<(StatusCode, Value), ConnectorError> {
        let name = &self.route.name;
        let body = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
        let answer = self
            .answered(method, path, query, &HeaderMap::new(), body)
            .await?;
        if answer.status == StatusCode::NOT_FOUND {
            return Ok((answer.status, Value::Null));
        }
        if answer.body.is_empty() {
            return Ok((answer.status, Value::Null));
        }
        let value = serde_json::from_slice(&answer.body).map_err(|_| {
            ConnectorError::Unavailable(format!("{name} answered something other than JSON"))
        })?;
        Ok((answer.status, value))
    }

    /// A POST of `body`, in `content_type`, that must succeed; what it answers is not read.
    pub async fn post(
        &self,
        path: &str,
        content_type: &'static str,
        body: Bytes,
    ) -> Result<(), ConnectorError> {
        let headers =
            HeaderMap::from_iter([(CONTENT_TYPE, HeaderValue::from_static(content_type))]);
        match self
            .answered(Method::POST, path, None, &headers, body)
            .await?
        {
            answer if answer.status == StatusCode::NOT_FOUND => Err(ConnectorError::from_status(
                &format!("{} ({path})", self.route.name),
                answer.status,
            )),
            _ => Ok(()),
        }
    }

    /// The store's answer: a success or a 404; any other failure is an error.
    async fn answered(
        &self,
        method: Method,
        path: &str,
        query: Option<&str>,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Answer, ConnectorError> {
        let name = &self.route.name;
        let answer = self
            .upstreams
            .send(&self.route, method, path, query, headers, body)
            .await
            .map_err(|e| ConnectorError::Unavailable(format!("{name}: {}", e.message)))?;
        if answer.status != StatusCode::NOT_FOUND && !answer.is_success() {
            return Err(ConnectorError::from_status(
                &format!("{name} ({path})"),
                answer.status,
            ));
        }
        Ok(answer)
    }

    /// A call that must succeed: its JSON body (a 404 is an error here).
    pub async fn json(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, ConnectorError> {
        match self.call(method, path, None, body).await? {
            (StatusCode::NOT_FOUND, _) => Err(ConnectorError::from_status(
                &format!("{} ({path})", self.route.name),
                StatusCode::NOT_FOUND,
            )),
            (_, value) => Ok(value),
        }
    }
}
