//! A minimal, fast Chroma stand-in for load tests: it answers every record operation at once with
//! a canned answer, so that a load test through Lethe shows Lethe's own overhead.
//!
//! `cargo run --release --example fast_upstream -- PORT SUBJECT` (records are stamped for tenant
//! `acme` and SUBJECT, so that Lethe serves them).

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::json;

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let port: u16 = args.next().and_then(|p| p.parse().ok()).unwrap_or(18080);
    let subject = args.next().unwrap_or_else(|| "load-user".to_owned());
    let stamp = json!({"lethe_subject": subject, "lethe_tenant": "acme", "lethe_purpose": "personalization",
        "lethe_category": "preference", "lethe_expires_at": 4_102_444_800i64, "lethe_epoch": 0, "n": 1});
    let ids: Vec<String> = (0..5).map(|i| format!("m{i}")).collect();
    let docs: Vec<String> = (0..5).map(|_| "x".repeat(400)).collect();
    let query = Bytes::from(
        json!({"ids": [ids], "documents": [docs], "metadatas": [vec![stamp.clone(); 5]],
            "distances": [[0.1, 0.2, 0.3, 0.4, 0.5]], "embeddings": null, "uris": null, "data": null,
            "include": ["documents", "metadatas", "distances"]})
        .to_string(),
    );
    let get = Bytes::from(
        json!({"ids": ids, "documents": docs, "metadatas": vec![stamp; 5], "embeddings": null, "uris": null,
            "data": null, "include": ["documents", "metadatas"]})
        .to_string(),
    );
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let (query, get) = (query.clone(), get.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let (query, get) = (query.clone(), get.clone());
                async move {
                    let path = request.uri().path().to_owned();
                    let _ = request.into_body().collect().await;
                    let (status, body) = if path.ends_with("/query") {
                        (StatusCode::OK, query)
                    } else if path.ends_with("/get") {
                        (StatusCode::OK, get)
                    } else if path.ends_with("/add") || path.ends_with("/upsert") {
                        (StatusCode::CREATED, Bytes::from_static(b"{}"))
                    } else {
                        (StatusCode::OK, Bytes::from_static(b"{}"))
                    };
                    let mut response = Response::new(Full::new(body));
                    *response.status_mut() = status;
                    response
                        .headers_mut()
                        .insert("content-type", "application/json".parse().expect("static"));
                    Ok::<_, Infallible>(response)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
