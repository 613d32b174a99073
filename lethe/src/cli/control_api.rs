//! The CLI's client of the control API: the verbs that act through the control plane (so that a
//! running gateway sees every change, and every change is audited under the caller's name).

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode, header};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// Sends one request and returns the status and the JSON body.
pub async fn call(
    method: Method,
    url: &str,
    token: &str,
    body: Option<&serde_json::Value>,
) -> Result<(StatusCode, serde_json::Value), String> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let payload = body.map(|b| b.to_string()).unwrap_or_default();
    let mut request = Request::builder()
        .method(method)
        .uri(url)
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::ACCEPT, "application/json");
    if body.is_some() {
        request = request.header(header::CONTENT_TYPE, "application/json");
    }
    let request = request
        .body(Full::new(Bytes::from(payload)))
        .map_err(|e| format!("bad request URL {url}: {e}"))?;
    let response = client
        .request(request)
        .await
        .map_err(|e| format!("cannot reach the control plane at {url}: {e}"))?;
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("reading the response: {e}"))?
        .to_bytes();
    let value = serde_json::from_slice(&bytes).unwrap_or_else(|_| {
        serde_json::Value::String(String::from_utf8_lossy(&bytes).into_owned())
    });
    Ok((status, value))
}
